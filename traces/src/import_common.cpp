// The rules the Kineto and nsys importers share (see import.hpp): step tagging, communicators,
// collective sequence numbers, rebasing and metadata; the summary, and writing an imported trace.
#include "import_common.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <unordered_map>

#include "orrery/common/atomic_file.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/chakra.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::traces {

namespace fs = std::filesystem;

std::string_view to_string(ImportFormat f) {
  switch (f) {
    case ImportFormat::Kineto:
      return "kineto";
    case ImportFormat::Nsys:
      return "nsys";
    case ImportFormat::Chakra:
      return "chakra";
  }
  return "unknown";
}

ImportFormat import_format_from_string(std::string_view s) {
  if (s == "kineto") return ImportFormat::Kineto;
  if (s == "nsys") return ImportFormat::Nsys;
  if (s == "chakra") return ImportFormat::Chakra;
  throw InputError("import format '" + std::string(s) + "': expected kineto, nsys or chakra");
}

namespace detail {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Digits only, 1 to 9 of them (fits int32).
std::optional<int32_t> small_number(std::string_view s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  int32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace

int32_t Draft::comm(const std::string& key) {
  auto [it, inserted] = comm_index.try_emplace(key, static_cast<int32_t>(comms.size()));
  if (inserted) {
    DraftComm c;
    c.key = key;
    c.name = key.empty() ? "world" : "pg " + key;
    comms.push_back(std::move(c));
  }
  return it->second;
}

std::optional<int32_t> parse_step_name(std::string_view name) {
  if (starts_with(name, "ProfilerStep#")) return small_number(name.substr(13));
  const std::string l = lower(name);
  if (l == "step") return -1;
  if (l.size() > 5 && starts_with(l, "step") &&
      (l[4] == ' ' || l[4] == '#' || l[4] == '_' || l[4] == ':')) {
    return small_number(std::string_view(l).substr(5));
  }
  return std::nullopt;
}

std::optional<CollOp> nccl_kernel_op(std::string_view name) {
  if (starts_with(name, "void ")) name.remove_prefix(5);
  if (starts_with(name, "ncclKernel_")) {
    name.remove_prefix(11);
  } else if (starts_with(name, "ncclDevKernel_")) {
    name.remove_prefix(14);
  } else {
    return std::nullopt;
  }
  const std::string_view token = name.substr(0, name.find_first_of("_(<"));
  if (token == "AllReduce") return CollOp::AllReduce;
  if (token == "ReduceScatter") return CollOp::ReduceScatter;
  if (token == "AllGather") return CollOp::AllGather;
  if (token == "Broadcast") return CollOp::Broadcast;
  if (token == "Reduce") return CollOp::Reduce;
  if (token == "AllToAll") return CollOp::AllToAll;
  if (token == "SendRecv" || token == "Send") return CollOp::Send;
  if (token == "Recv") return CollOp::Recv;
  return CollOp::None;
}

CollOp torch_collective_op(std::string_view name) {
  const size_t colon = name.rfind(':');
  if (colon != std::string_view::npos) name.remove_prefix(colon + 1);
  std::string s;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c)))
      s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (s.find("allreduce") != std::string::npos) return CollOp::AllReduce;
  if (s.find("reducescatter") != std::string::npos) return CollOp::ReduceScatter;
  if (s.find("allgather") != std::string::npos) return CollOp::AllGather;
  if (s.find("alltoall") != std::string::npos) return CollOp::AllToAll;
  if (starts_with(s, "broadcast")) return CollOp::Broadcast;
  if (starts_with(s, "reduce")) return CollOp::Reduce;
  if (starts_with(s, "send")) return CollOp::Send;
  if (starts_with(s, "recv")) return CollOp::Recv;
  if (starts_with(s, "barrier")) return CollOp::Barrier;
  return CollOp::None;
}

int64_t dtype_bytes(std::string_view dtype) {
  static const std::unordered_map<std::string, int64_t> kSizes = {
      {"byte", 1},   {"uint8", 1},       {"char", 1},         {"int8", 1},
      {"short", 2},  {"int16", 2},       {"int", 4},          {"int32", 4},
      {"long", 8},   {"int64", 8},       {"half", 2},         {"float16", 2},
      {"fp16", 2},   {"float", 4},       {"float32", 4},      {"fp32", 4},
      {"double", 8}, {"float64", 8},     {"bfloat16", 2},     {"bf16", 2},
      {"bool", 1},   {"complexhalf", 4}, {"complexfloat", 8}, {"complexdouble", 16},
      {"uint16", 2}, {"uint32", 4},      {"uint64", 8},       {"qint8", 1},
      {"quint8", 1}, {"qint32", 4},      {"quint4x2", 1},     {"quint2x4", 1}};
  const std::string l = lower(dtype);
  if (auto it = kSizes.find(l); it != kSizes.end()) return it->second;
  if (starts_with(l, "float8")) return 1;
  return 0;
}

SpanKind kind_of_op(CollOp op) {
  return op == CollOp::Send || op == CollOp::Recv ? SpanKind::P2P : SpanKind::Collective;
}

Trace finish_import(Draft&& d) {
  Trace t = std::move(d.trace);
  std::vector<int32_t> ranks;
  for (const auto& r : t.ranks) ranks.push_back(r.rank);
  std::sort(ranks.begin(), ranks.end());
  const int32_t world = std::max(
      {d.world_size, static_cast<int32_t>(ranks.size()), ranks.empty() ? 0 : ranks.back() + 1});

  // Steps: per rank, the "step" phases sorted by start; a bare "step" is numbered by its ordinal.
  const NameId step_name = t.strings.intern("step");
  struct StepRange {
    int64_t start, end;
    int32_t step;
  };
  std::map<int32_t, std::vector<StepRange>> steps;
  {
    std::map<int32_t, std::vector<DraftSpan*>> by_rank;
    for (auto& s : d.spans) {
      if (s.span.kind == SpanKind::Phase && s.span.name == step_name)
        by_rank[s.span.rank].push_back(&s);
    }
    for (auto& [rank, v] : by_rank) {
      std::stable_sort(v.begin(), v.end(), [](const DraftSpan* a, const DraftSpan* b) {
        return a->span.start_ns < b->span.start_ns;
      });
      int32_t ordinal = 0;
      for (auto* s : v) {
        if (s->span.step < 0) s->span.step = ordinal;
        ++ordinal;
        steps[rank].push_back({s->span.start_ns, s->span.end_ns, s->span.step});
      }
    }
  }
  for (auto& s : d.spans) {
    if (s.span.step >= 0) continue;
    auto it = steps.find(s.span.rank);
    if (it == steps.end()) continue;
    const auto& v = it->second;
    // The latest step starting at or before the issue time, if the issue time is inside it.
    auto ub = std::upper_bound(v.begin(), v.end(), s.issue_ns,
                               [](int64_t t0, const StepRange& r) { return t0 < r.start; });
    if (ub == v.begin()) continue;
    --ub;
    if (s.issue_ns < ub->end || (ub->start == ub->end && s.issue_ns == ub->start))
      s.span.step = ub->step;
  }

  // Communicators: ids in order of first appearance, the default "world" last when used.
  int32_t world_comm = -1;
  for (auto& s : d.spans) {
    if (s.span.kind != SpanKind::Collective && s.span.kind != SpanKind::P2P) continue;
    if (s.comm_key < 0) {
      if (world_comm < 0) world_comm = d.comm("");
      s.comm_key = world_comm;
    }
  }
  std::vector<std::set<int32_t>> users(d.comms.size());
  for (const auto& s : d.spans) {
    if (s.comm_key >= 0) users[static_cast<size_t>(s.comm_key)].insert(s.span.rank);
  }
  for (size_t i = 0; i < d.comms.size(); ++i) {
    const DraftComm& dc = d.comms[i];
    CommunicatorInfo c;
    c.id = static_cast<int32_t>(i);
    c.name = dc.name;
    if (!dc.ranks.empty()) {
      c.ranks = dc.ranks;
    } else if (dc.key.empty() || (dc.size > 0 && dc.size == world)) {
      for (int32_t r = 0; r < world; ++r) c.ranks.push_back(r);
    } else {
      c.ranks.assign(users[i].begin(), users[i].end());
    }
    c.kind = static_cast<int32_t>(c.ranks.size()) == world ? CommKind::World : CommKind::Other;
    t.comms.push_back(std::move(c));
  }

  // Sequence numbers per (communicator, rank) in start order.
  {
    std::map<std::pair<int32_t, int32_t>, std::vector<DraftSpan*>> groups;
    for (auto& s : d.spans) {
      if (s.comm_key >= 0) {
        s.span.comm = s.comm_key;
        groups[{s.comm_key, s.span.rank}].push_back(&s);
      }
    }
    for (auto& [key, v] : groups) {
      std::stable_sort(v.begin(), v.end(), [](const DraftSpan* a, const DraftSpan* b) {
        return a->span.start_ns < b->span.start_ns;
      });
      int64_t seq = 0;
      for (auto* s : v) s->span.seq = seq++;
    }
  }

  // Rebase to the earliest span or counter sample.
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const auto& s : d.spans) origin = std::min(origin, s.span.start_ns);
  for (const auto& c : t.counters) origin = std::min(origin, c.ts_ns);
  if (origin == std::numeric_limits<int64_t>::max()) origin = 0;
  auto rebase = [&](int64_t& ts) {
    if (__builtin_sub_overflow(ts, origin, &ts)) {
      throw InputError((d.files.empty() ? std::string("import") : d.files.front()) +
                       (d.files.size() > 1 ? " (and the other files)" : "") +
                       ": the events' times span more than 2^63 ns");
    }
  };
  t.spans.reserve(d.spans.size());
  for (auto& s : d.spans) {
    Span sp = s.span;
    rebase(sp.start_ns);
    rebase(sp.end_ns);
    t.spans.push_back(sp);
    if (s.work >= 0 && static_cast<size_t>(s.work) < d.works.size()) {
      KernelWork& w = d.works[static_cast<size_t>(s.work)];
      w.rank = sp.rank, w.stream = sp.stream, w.start_ns = sp.start_ns, w.end_ns = sp.end_ns;
    }
  }
  for (auto& c : t.counters) rebase(c.ts_ns);
  t.sort_spans();
  std::sort(t.counters.begin(), t.counters.end(),
            [](const CounterSample& a, const CounterSample& b) {
              return a.rank != b.rank ? a.rank < b.rank : a.ts_ns < b.ts_ns;
            });

  t.meta.source = TraceSource::Import;
  t.meta.origin = TraceOrigin::Import;
  t.meta.world_size = world;
  if (d.unix_origin_ns) t.meta.start_time_unix_ns = *d.unix_origin_ns + origin;
  nlohmann::json extra;
  extra["import"] = {{"format", std::string(to_string(d.format))},
                     {"files", d.files},
                     {"skipped_events", d.skipped_events}};
  if (!d.devices.empty()) extra["import"]["devices"] = d.devices;
  // Names from the file (its devices) may hold bytes that are not UTF-8: replaced (U+FFFD), as
  // JSON cannot carry them, rather than thrown out of the importer as a JSON error.
  t.meta.extra_json = extra.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (!d.works.empty()) {
    std::sort(d.works.begin(), d.works.end(), [](const KernelWork& a, const KernelWork& b) {
      return std::tie(a.rank, a.stream, a.start_ns) < std::tie(b.rank, b.stream, b.start_ns);
    });
    write_kernel_work(t, d.works);
  }
  std::sort(t.ranks.begin(), t.ranks.end(),
            [](const RankInfo& a, const RankInfo& b) { return a.rank < b.rank; });
  return t;
}

}  // namespace detail

ImportSummary summarize_import(const Trace& t, ImportFormat format,
                               const std::vector<std::string>& files) {
  ImportSummary s;
  s.format = format;
  s.files = files;
  s.ranks = static_cast<int32_t>(t.ranks.size());
  s.spans = static_cast<int64_t>(t.spans.size());
  s.counters = static_cast<int64_t>(t.counters.size());
  s.communicators = static_cast<int32_t>(t.comms.size());
  const NameId step_name = t.strings.find("step");
  std::set<int32_t> steps;
  for (const auto& sp : t.spans) {
    const auto k = static_cast<size_t>(sp.kind);
    if (k < s.spans_by_kind.size()) s.spans_by_kind[k] += 1;
    if (sp.kind == SpanKind::Collective || sp.kind == SpanKind::P2P) s.collectives += 1;
    if (sp.kind == SpanKind::Phase && sp.name == step_name && sp.step >= 0) steps.insert(sp.step);
  }
  s.steps.assign(steps.begin(), steps.end());
  try {
    const auto extra = nlohmann::json::parse(t.meta.extra_json);
    s.skipped_events = extra.at("import").at("skipped_events").get<int64_t>();
  } catch (const nlohmann::json::exception&) {
    s.skipped_events = 0;
  }
  return s;
}

void write_to(const Trace& t, TraceWriter& out) {
  out.set_meta(t.meta);
  for (const auto& r : t.ranks) out.add_rank(r);
  for (const auto& s : t.streams) out.add_stream(s);
  for (const auto& c : t.comms) out.add_communicator(c);
  // Interning in table order keeps every NameId of `t` valid in the file.
  for (const auto& s : t.strings.all()) out.intern(s);
  out.add_spans(t.spans);
  for (const auto& c : t.counters) out.add_counter(c);
}

ImportSummary import_to_file(ImportFormat format, const std::vector<std::string>& files,
                             const std::string& out_path) {
  if (files.empty()) throw InputError("import: no input files");
  // Chakra inputs may be prefixes (P for P.0.et, P.1.et, ...): the files they name.
  const std::vector<std::string> inputs =
      format == ImportFormat::Chakra ? chakra_input_files(files) : files;
  std::error_code ec;
  for (const auto& f : inputs) {
    if (fs::exists(out_path, ec) && fs::equivalent(f, out_path, ec)) {
      throw InputError(out_path + ": the output is also one of the inputs");
    }
  }
  const Trace t = format == ImportFormat::Kineto ? import_kineto(inputs)
                  : format == ImportFormat::Nsys ? import_nsys(inputs)
                                                 : import_chakra(inputs);
  // Written next to the output, synced and renamed (common's AtomicFile), so a failed import leaves
  // no file that looks whole.
  AtomicFile f(out_path, AtomicFile::ByName{{"-wal", "-shm", "-journal"}});
  {
    TraceWriter w(f.temp_path());
    write_to(t, w);
    w.close();
  }
  f.commit();
  return summarize_import(t, format, inputs);
}

}  // namespace orrery::traces
