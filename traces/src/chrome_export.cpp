// Chrome trace JSON (Trace Event Format) export, for Perfetto UI and chrome://tracing.
// The JSON is written as it goes into a buffer flushed in large chunks: a 5M-span trace never
// becomes a JSON document in memory.
#include "orrery/traces/chrome_export.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "orrery/common/atomic_file.hpp"
#include "orrery/common/error.hpp"

namespace orrery::traces {
namespace {

class JsonOut {
 public:
  explicit JsonOut(std::ostream& out) : out_(out) { buf_.reserve(kChunk + 4096); }
  ~JsonOut() { flush(); }
  JsonOut(const JsonOut&) = delete;
  JsonOut& operator=(const JsonOut&) = delete;

  JsonOut& raw(std::string_view s) {
    buf_.append(s);
    if (buf_.size() >= kChunk) flush();
    return *this;
  }
  JsonOut& str(std::string_view s) {
    buf_.push_back('"');
    for (const char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"':
          buf_.append("\\\"");
          break;
        case '\\':
          buf_.append("\\\\");
          break;
        case '\n':
          buf_.append("\\n");
          break;
        case '\r':
          buf_.append("\\r");
          break;
        case '\t':
          buf_.append("\\t");
          break;
        default:
          if (c < 0x20) {
            char u[8];
            std::snprintf(u, sizeof u, "\\u%04x", c);
            buf_.append(u);
          } else {
            buf_.push_back(ch);
          }
      }
    }
    buf_.push_back('"');
    return *this;
  }
  JsonOut& num(int64_t v) {
    char tmp[24];
    auto [end, ec] = std::to_chars(tmp, tmp + sizeof tmp, v);
    buf_.append(tmp, end);
    return *this;
  }
  JsonOut& num(double v) {
    if (!std::isfinite(v)) return raw("null");  // JSON has no NaN or infinity
    char tmp[32];
    auto [end, ec] = std::to_chars(tmp, tmp + sizeof tmp, v);  // shortest round-trip form
    buf_.append(tmp, end);
    return *this;
  }
  // Nanoseconds as microseconds with exactly the nanosecond digits: 1234567 -> 1234.567.
  JsonOut& us(int64_t ns) {
    if (ns < 0) {
      buf_.push_back('-');
      // Negate in unsigned arithmetic so INT64_MIN does not overflow.
      const uint64_t m = 0 - static_cast<uint64_t>(ns);
      return us_unsigned(m);
    }
    return us_unsigned(static_cast<uint64_t>(ns));
  }
  void flush() {
    out_.write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
    buf_.clear();
  }

 private:
  JsonOut& us_unsigned(uint64_t ns) {
    char tmp[24];
    auto [end, ec] = std::to_chars(tmp, tmp + sizeof tmp, ns / 1000);
    buf_.append(tmp, end);
    const auto frac = static_cast<unsigned>(ns % 1000);
    if (frac != 0) {
      const char digits[4] = {'.', static_cast<char>('0' + frac / 100),
                              static_cast<char>('0' + frac / 10 % 10),
                              static_cast<char>('0' + frac % 10)};
      buf_.append(digits, 4);
    }
    return *this;
  }
  static constexpr size_t kChunk = 1 << 20;
  std::ostream& out_;
  std::string buf_;
};

std::string process_label(int32_t rank, const RankInfo* info) {
  std::string s = "rank " + std::to_string(rank);
  if (info) {
    s += " (dp=" + std::to_string(info->dp) + ",tp=" + std::to_string(info->tp) +
         ",pp=" + std::to_string(info->pp) + ")";
  }
  return s;
}

}  // namespace

void export_chrome_json(const Trace& t, std::ostream& out) {
  JsonOut j(out);
  j.raw("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":")
      .str(to_string(t.meta.source))
      .raw(",\"scenario\":")
      .str(t.meta.scenario_name)
      .raw(",\"world_size\":")
      .num(int64_t{t.meta.world_size})
      .raw("},\n\"traceEvents\":[");
  bool first = true;
  auto begin_event = [&] {
    j.raw(first ? "\n{" : ",\n{");
    first = false;
  };

  // Every rank and stream that has a name or a span gets a name, so Perfetto's tracks are labelled.
  std::map<int32_t, const RankInfo*> ranks;
  for (const auto& r : t.ranks) ranks[r.rank] = &r;
  std::map<std::pair<int32_t, int32_t>, std::string> streams;
  for (const auto& s : t.streams) streams[{s.rank, s.stream}] = s.name;
  for (const auto& s : t.spans) {
    ranks.try_emplace(s.rank, nullptr);
    streams.try_emplace({s.rank, s.stream}, "stream " + std::to_string(s.stream));
  }
  for (const auto& c : t.counters) ranks.try_emplace(c.rank, nullptr);
  for (const auto& [rank, info] : ranks) {
    begin_event();
    j.raw("\"name\":\"process_name\",\"ph\":\"M\",\"pid\":").num(int64_t{rank});
    j.raw(",\"tid\":0,\"args\":{\"name\":").str(process_label(rank, info)).raw("}}");
  }
  for (const auto& [key, name] : streams) {
    begin_event();
    j.raw("\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":").num(int64_t{key.first});
    j.raw(",\"tid\":").num(int64_t{key.second});
    j.raw(",\"args\":{\"name\":").str(name).raw("}}");
  }

  for (const auto& s : t.spans) {
    begin_event();
    j.raw("\"name\":").str(t.strings.str(s.name));
    j.raw(",\"cat\":").str(to_string(s.kind));
    j.raw(",\"ph\":\"X\",\"pid\":").num(int64_t{s.rank});
    j.raw(",\"tid\":").num(int64_t{s.stream});
    j.raw(",\"ts\":").us(s.start_ns);
    j.raw(",\"dur\":").us(s.end_ns - s.start_ns);
    // Only the attributes a span has, to keep 5M-span files reasonable.
    j.raw(",\"args\":{");
    bool first_arg = true;
    auto arg = [&](const char* key) {
      j.raw(first_arg ? "\"" : ",\"").raw(key).raw("\":");
      first_arg = false;
    };
    if (s.step >= 0) arg("step"), j.num(int64_t{s.step});
    if (s.micro_batch >= 0) arg("micro_batch"), j.num(int64_t{s.micro_batch});
    if (s.layer >= 0) arg("layer"), j.num(int64_t{s.layer});
    if (s.bytes != 0) arg("bytes"), j.num(s.bytes);
    if (s.flops != 0) arg("flops"), j.num(s.flops);
    if (s.comm >= 0) {
      arg("comm"), j.num(int64_t{s.comm});
      if (const auto* c = t.comm(s.comm)) arg("comm_name"), j.str(c->name);
    }
    if (s.peer >= 0) arg("peer"), j.num(int64_t{s.peer});
    if (s.seq >= 0) arg("seq"), j.num(s.seq);
    if (s.op != CollOp::None) arg("op"), j.str(to_string(s.op));
    j.raw("}}");
  }

  for (const auto& c : t.counters) {
    begin_event();
    j.raw("\"name\":").str(t.strings.str(c.name));
    j.raw(",\"ph\":\"C\",\"pid\":").num(int64_t{c.rank});
    j.raw(",\"ts\":").us(c.ts_ns);
    j.raw(",\"args\":{\"value\":").num(c.value).raw("}}");
  }
  j.raw("\n]}\n");
  j.flush();
  if (!out) throw InternalError("chrome trace export: write failed");
}

void export_chrome_json_file(const Trace& t, const std::string& path) {
  AtomicFile f(path);  // a failure leaves no file that looks whole
  try {
    export_chrome_json(t, f.stream());
  } catch (const InternalError&) {
    f.throw_if_failed();  // a write error, with its reason (disk full?)
    throw;
  }
  f.commit();
}

}  // namespace orrery::traces
