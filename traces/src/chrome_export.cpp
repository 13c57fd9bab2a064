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
#include "orrery/traces/stream_chunks.hpp"

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

namespace {

// What the export needs besides the spans: the header, the track names, the communicator names.
struct ExportContext {
  const RunMeta& meta;
  const std::vector<RankInfo>& rank_infos;
  const std::vector<StreamInfo>& stream_infos;
  const StringTable& strings;
  std::map<int32_t, const CommunicatorInfo*> comms;
};

class ChromeWriter {
 public:
  ChromeWriter(std::ostream& out, ExportContext c) : j_(out), c_(std::move(c)) {}

  // The header and one name per rank and stream: those the trace describes, plus `span_tracks`
  // (every (rank, stream) with spans) and `counter_ranks`, so that Perfetto's tracks are labelled.
  void begin(const std::vector<std::pair<int32_t, int32_t>>& span_tracks,
             const std::vector<int32_t>& counter_ranks) {
    j_.raw("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":")
        .str(to_string(c_.meta.source))
        .raw(",\"scenario\":")
        .str(c_.meta.scenario_name)
        .raw(",\"world_size\":")
        .num(int64_t{c_.meta.world_size})
        .raw("},\n\"traceEvents\":[");
    std::map<int32_t, const RankInfo*> ranks;
    for (const auto& r : c_.rank_infos) ranks[r.rank] = &r;
    std::map<std::pair<int32_t, int32_t>, std::string> streams;
    for (const auto& s : c_.stream_infos) streams[{s.rank, s.stream}] = s.name;
    for (const auto& [rank, stream] : span_tracks) {
      ranks.try_emplace(rank, nullptr);
      streams.try_emplace({rank, stream}, "stream " + std::to_string(stream));
    }
    for (int32_t r : counter_ranks) ranks.try_emplace(r, nullptr);
    for (const auto& [rank, info] : ranks) {
      begin_event();
      j_.raw("\"name\":\"process_name\",\"ph\":\"M\",\"pid\":").num(int64_t{rank});
      j_.raw(",\"tid\":0,\"args\":{\"name\":").str(process_label(rank, info)).raw("}}");
    }
    for (const auto& [key, name] : streams) {
      begin_event();
      j_.raw("\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":").num(int64_t{key.first});
      j_.raw(",\"tid\":").num(int64_t{key.second});
      j_.raw(",\"args\":{\"name\":").str(name).raw("}}");
    }
  }

  void span(const Span& s) {
    begin_event();
    j_.raw("\"name\":").str(c_.strings.str(s.name));
    j_.raw(",\"cat\":").str(to_string(s.kind));
    j_.raw(",\"ph\":\"X\",\"pid\":").num(int64_t{s.rank});
    j_.raw(",\"tid\":").num(int64_t{s.stream});
    j_.raw(",\"ts\":").us(s.start_ns);
    j_.raw(",\"dur\":").us(s.end_ns - s.start_ns);
    // Only the attributes a span has, to keep 5M-span files reasonable.
    j_.raw(",\"args\":{");
    bool first_arg = true;
    auto arg = [&](const char* key) {
      j_.raw(first_arg ? "\"" : ",\"").raw(key).raw("\":");
      first_arg = false;
    };
    if (s.step >= 0) arg("step"), j_.num(int64_t{s.step});
    if (s.micro_batch >= 0) arg("micro_batch"), j_.num(int64_t{s.micro_batch});
    if (s.layer >= 0) arg("layer"), j_.num(int64_t{s.layer});
    if (s.bytes != 0) arg("bytes"), j_.num(s.bytes);
    if (s.flops != 0) arg("flops"), j_.num(s.flops);
    if (s.comm >= 0) {
      arg("comm"), j_.num(int64_t{s.comm});
      const auto it = c_.comms.find(s.comm);
      if (it != c_.comms.end()) arg("comm_name"), j_.str(it->second->name);
    }
    if (s.peer >= 0) arg("peer"), j_.num(int64_t{s.peer});
    if (s.seq >= 0) arg("seq"), j_.num(s.seq);
    if (s.op != CollOp::None) arg("op"), j_.str(to_string(s.op));
    j_.raw("}}");
  }

  void counter(const CounterSample& c) {
    begin_event();
    j_.raw("\"name\":").str(c_.strings.str(c.name));
    j_.raw(",\"ph\":\"C\",\"pid\":").num(int64_t{c.rank});
    j_.raw(",\"ts\":").us(c.ts_ns);
    j_.raw(",\"args\":{\"value\":").num(c.value).raw("}}");
  }

  void end(std::ostream& out) {
    j_.raw("\n]}\n");
    j_.flush();
    if (!out) throw InternalError("chrome trace export: write failed");
  }

 private:
  void begin_event() {
    j_.raw(first_ ? "\n{" : ",\n{");
    first_ = false;
  }
  JsonOut j_;
  ExportContext c_;
  bool first_ = true;
};

std::map<int32_t, const CommunicatorInfo*> comm_index(const std::vector<CommunicatorInfo>& cs) {
  std::map<int32_t, const CommunicatorInfo*> m;
  for (const auto& c : cs) m.emplace(c.id, &c);
  return m;
}

template <typename Write>
void to_file(const std::string& path, Write&& write) {
  AtomicFile f(path);  // a failure leaves no file that looks whole
  try {
    write(f.stream());
  } catch (const InternalError&) {
    f.throw_if_failed();  // a write error, with its reason (disk full?)
    throw;
  }
  f.commit();
}

}  // namespace

void export_chrome_json(const Trace& t, std::ostream& out) {
  ChromeWriter w(out, {t.meta, t.ranks, t.streams, t.strings, comm_index(t.comms)});
  std::vector<std::pair<int32_t, int32_t>> tracks;
  for (const auto& s : t.spans) tracks.emplace_back(s.rank, s.stream);
  std::vector<int32_t> counter_ranks;
  for (const auto& c : t.counters) counter_ranks.push_back(c.rank);
  w.begin(tracks, counter_ranks);
  for (const auto& s : t.spans) w.span(s);
  for (const auto& c : t.counters) w.counter(c);
  w.end(out);
}

void export_chrome_json(const TraceReader& r, std::ostream& out) {
  const RunMeta meta = r.meta();
  const std::vector<RankInfo> ranks = r.ranks();
  const std::vector<StreamInfo> streams = r.streams();
  const StringTable strings = r.strings();
  const std::vector<CommunicatorInfo> comms = r.communicators();
  ChromeWriter w(out, {meta, ranks, streams, strings, comm_index(comms)});
  std::vector<std::pair<int32_t, int32_t>> tracks;
  for (const auto& b : r.stream_bounds())
    if (b.count > 0) tracks.emplace_back(b.rank, b.stream);
  // Counters are written a rank at a time, after the spans; their ranks label tracks first.
  w.begin(tracks, counter_ranks(r));
  for_each_span_chunk(r, [&](std::vector<Span>& spans) {
    for (const auto& s : spans) {
      if (s.name >= strings.size())
        throw InputError(r.path() + ": corrupt trace (span name " + std::to_string(s.name) +
                         " beyond the string table)");
      w.span(s);
    }
  });
  for_each_counter_rank(r, [&](std::vector<CounterSample>& samples) {
    for (const auto& c : samples) {
      if (c.name >= strings.size())
        throw InputError(r.path() + ": corrupt trace (counter name " + std::to_string(c.name) +
                         " beyond the string table)");
      w.counter(c);
    }
  });
  w.end(out);
}

void export_chrome_json_file(const TraceReader& r, const std::string& path) {
  to_file(path, [&](std::ostream& out) { export_chrome_json(r, out); });
}

void export_chrome_json_file(const Trace& t, const std::string& path) {
  to_file(path, [&](std::ostream& out) { export_chrome_json(t, out); });
}

}  // namespace orrery::traces
