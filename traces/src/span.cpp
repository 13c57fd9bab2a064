// Names of the trace model's enums (as stored in tools' output and parsed from the command line) and
// the nccl-tests bus-bandwidth factors.
#include "orrery/traces/span.hpp"

#include <array>
#include <nlohmann/json.hpp>

namespace orrery::traces {
namespace {

constexpr std::array<std::string_view, kSpanKindCount> kSpanKindNames = {
    "compute", "collective", "p2p", "memcpy", "phase", "data", "optimizer", "other"};
constexpr std::array<std::string_view, 10> kCollOpNames = {
    "none",   "all_reduce", "reduce_scatter", "all_gather", "broadcast",
    "reduce", "all_to_all", "send",           "recv",       "barrier"};
constexpr std::array<std::string_view, 5> kCommKindNames = {"world", "dp", "tp", "pp", "other"};
constexpr std::array<std::string_view, 4> kSourceNames = {"real", "sim", "import", "synth"};
constexpr std::array<std::string_view, 7> kOriginNames = {"unknown", "run",   "commbench", "sim",
                                                          "replay",  "synth", "import"};

template <typename E, size_t N>
std::string_view name_of(const std::array<std::string_view, N>& names, E e) {
  const auto i = static_cast<size_t>(e);
  return i < N ? names[i] : std::string_view("unknown");
}

template <typename E, size_t N>
std::optional<E> parse(const std::array<std::string_view, N>& names, std::string_view s) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == s) return static_cast<E>(i);
  }
  return std::nullopt;
}

}  // namespace

std::string_view to_string(SpanKind k) { return name_of(kSpanKindNames, k); }
std::optional<SpanKind> span_kind_from_string(std::string_view s) {
  return parse<SpanKind>(kSpanKindNames, s);
}

std::string_view to_string(CollOp op) { return name_of(kCollOpNames, op); }
std::optional<CollOp> coll_op_from_string(std::string_view s) {
  return parse<CollOp>(kCollOpNames, s);
}

double busbw_factor(CollOp op, int n) {
  if (n <= 0) return 0;
  const double nn = n;
  switch (op) {
    case CollOp::AllReduce:
      return 2.0 * (nn - 1) / nn;
    case CollOp::ReduceScatter:
    case CollOp::AllGather:
    case CollOp::AllToAll:
      return (nn - 1) / nn;
    case CollOp::Broadcast:
    case CollOp::Reduce:
    case CollOp::Send:
    case CollOp::Recv:
      return 1.0;
    case CollOp::Barrier:
    case CollOp::None:
      return 0.0;
  }
  return 0.0;
}

std::string_view to_string(CommKind k) { return name_of(kCommKindNames, k); }
std::optional<CommKind> comm_kind_from_string(std::string_view s) {
  return parse<CommKind>(kCommKindNames, s);
}

std::string_view to_string(TraceSource s) { return name_of(kSourceNames, s); }
std::optional<TraceSource> trace_source_from_string(std::string_view s) {
  return parse<TraceSource>(kSourceNames, s);
}

std::string_view to_string(TraceOrigin o) { return name_of(kOriginNames, o); }
std::optional<TraceOrigin> trace_origin_from_string(std::string_view s) {
  return parse<TraceOrigin>(kOriginNames, s);
}

std::string describe(const RunLayout& l) {
  std::vector<std::string> parts;
  if (l.schedule.empty() && l.micro_batches == 0 && l.device.empty()) return "";
  parts.push_back("zero " + std::to_string(l.zero));
  if (!l.schedule.empty()) parts.push_back(l.schedule);
  if (l.micro_batches > 0)
    parts.push_back(std::to_string(l.micro_batches) +
                    (l.micro_batches == 1 ? " micro-batch" : " micro-batches"));
  if (!l.recompute.empty()) parts.push_back("recompute " + l.recompute);
  if (!l.placement.empty()) parts.push_back("placement " + l.placement);
  if (!l.device.empty() || !l.precision.empty())
    parts.push_back(l.device + (l.device.empty() || l.precision.empty() ? "" : " ") + l.precision);
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

bool is_commbench(const RunMeta& m) {
  if (m.origin == TraceOrigin::Commbench) return true;
  if (m.origin != TraceOrigin::Unknown) return false;
  try {
    const auto j = nlohmann::json::parse(m.extra_json.empty() ? "{}" : m.extra_json);
    return j.is_object() && j.value("kind", std::string()) == "commbench";
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

}  // namespace orrery::traces
