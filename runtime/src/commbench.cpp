// `orrery commbench`: the collective sweep on the real communicator, its trace and its table
// (everything is described in runtime/include/orrery/runtime/commbench.hpp).
#include "orrery/runtime/commbench.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/common/stats.hpp"
#include "orrery/profiler/flight_recorder.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/launch.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/collective_instances.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {

namespace {

// The data pattern of element i (small integers: every sum below is exact in float32).
inline float pattern(size_t i) { return static_cast<float>(i % 13); }
constexpr float kBroadcastBase = 7.0f;
constexpr float kPoison = -1.0f;

std::string comm_name(int g, int first) {
  return "bench.g" + std::to_string(g) + "[" + std::to_string(first) + "-" +
         std::to_string(first + g - 1) + "]";
}

// One (group, op, size) point's iterations on this rank.
class PointRunner {
 public:
  PointRunner(Communicator& comm, BenchOp op, int64_t bytes, std::vector<float>& a,
              std::vector<float>& b, CommBenchSweepStats& stats, bool corrupt,
              std::function<void()> align)
      : comm_(comm),
        op_(op),
        bytes_(bytes),
        a_(a),
        b_(b),
        stats_(stats),
        r_(comm.rank()),
        g_(comm.size()),
        corrupt_(corrupt),
        align_(std::move(align)) {}

  // Iteration `it` (0-based over warm-up and timed); `full` checks every element of the result.
  // The data is prepared first, then align_() (a world barrier), then the operation is issued.
  void iteration(int it, const OpLabel& label, bool full) {
    const size_t n = static_cast<size_t>(bytes_ / 4);  // whole buffer, float32
    const size_t c =
        static_cast<size_t>(bytes_ / (4 * g_));  // per-rank block (reduce_scatter, all_gather)
    const size_t r = static_cast<size_t>(r_);
    const float tri = static_cast<float>(g_) * static_cast<float>(g_ + 1) / 2.0f;
    const float gf = static_cast<float>(g_);
    switch (op_) {
      case BenchOp::AllReduce: {
        for (size_t i = 0; i < n; ++i)
          a_[i] = static_cast<float>(r_ + 1) + pattern(i);  // in place: every time
        if (corrupt_ && full) a_[n - 1] += 1.0f;
        align_();
        comm_.all_reduce(a_.data(), n, DType::F32, ReduceOp::Sum, label).wait();
        ++stats_.ops_issued;
        check(it, a_.data(), n, full, [&](size_t i) { return tri + gf * pattern(i); });
        break;
      }
      case BenchOp::ReduceScatter: {
        if (it == 0) {
          for (size_t i = 0; i < c * g_; ++i) a_[i] = static_cast<float>(r_ + 1) + pattern(i);
        }
        if (full || it == 0) std::fill(b_.begin(), b_.begin() + static_cast<ptrdiff_t>(c), kPoison);
        align_();
        comm_.reduce_scatter(a_.data(), b_.data(), c, DType::F32, ReduceOp::Sum, label).wait();
        ++stats_.ops_issued;
        check(it, b_.data(), c, full, [&](size_t i) { return tri + gf * pattern(r * c + i); });
        break;
      }
      case BenchOp::AllGather: {
        if (it == 0) {
          for (size_t i = 0; i < c; ++i) a_[i] = static_cast<float>(r_ + 1) + pattern(i);
        }
        if (full || it == 0)
          std::fill(b_.begin(), b_.begin() + static_cast<ptrdiff_t>(c * g_), kPoison);
        align_();
        comm_.all_gather(a_.data(), b_.data(), c, DType::F32, label).wait();
        ++stats_.ops_issued;
        check(it, b_.data(), c * g_, full,
              [&](size_t i) { return static_cast<float>(i / c + 1) + pattern(i % c); });
        break;
      }
      case BenchOp::Broadcast: {
        if (r_ == 0) {
          if (it == 0) {
            for (size_t i = 0; i < n; ++i) a_[i] = kBroadcastBase + pattern(i);
          }
        } else if (full || it == 0) {
          std::fill(a_.begin(), a_.begin() + static_cast<ptrdiff_t>(n), kPoison);
        }
        align_();
        comm_.broadcast(a_.data(), n, DType::F32, 0, label).wait();
        ++stats_.ops_issued;
        check(it, a_.data(), n, full, [&](size_t i) { return kBroadcastBase + pattern(i); });
        break;
      }
      case BenchOp::SendRecv: {
        const int partner = r_ ^ 1;
        if (partner >= g_) {  // an odd group's last rank: in the barrier, not in the exchange
          align_();
          return;
        }
        if (it == 0) {
          for (size_t i = 0; i < n; ++i) a_[i] = static_cast<float>(r_ + 1) + pattern(i);
        }
        if (full || it == 0) std::fill(b_.begin(), b_.begin() + static_cast<ptrdiff_t>(n), kPoison);
        align_();
        Handle hs = comm_.send(a_.data(), n, DType::F32, partner, label);
        Handle hr = comm_.recv(b_.data(), n, DType::F32, partner, label);
        hs.wait();
        hr.wait();
        stats_.ops_issued += 2;
        check(it, b_.data(), n, full,
              [&](size_t i) { return static_cast<float>(partner + 1) + pattern(i); });
        break;
      }
    }
  }

 private:
  template <typename Expected>
  void check(int it, const float* out, size_t count, bool full, Expected expected) {
    if (count == 0) return;
    auto one = [&](size_t i) {
      const float want = expected(i);
      if (out[i] != want) {
        char buf[160];
        std::snprintf(buf, sizeof buf, ", iteration %d: element %zu is %.9g, expected %.9g", it, i,
                      static_cast<double>(out[i]), static_cast<double>(want));
        throw InternalError("commbench: wrong data after " + std::string(to_string(op_)) + " on " +
                            comm_.info().name + " (group rank " + std::to_string(r_) + " of " +
                            std::to_string(g_) + "), " + std::to_string(bytes_) + " bytes" + buf);
      }
    };
    if (full) {
      for (size_t i = 0; i < count; ++i) one(i);
      stats_.elements_checked += static_cast<int64_t>(count);
    } else {
      one(0);
      one(count / 2);
      one(count - 1);
      stats_.elements_checked += 3;
    }
  }

  Communicator& comm_;
  BenchOp op_;
  int64_t bytes_;
  std::vector<float>& a_;
  std::vector<float>& b_;
  CommBenchSweepStats& stats_;
  int r_, g_;
  bool corrupt_;
  std::function<void()> align_;
};

// A world barrier that is not recorded, before every operation: the members of a group (and the
// groups) issue each operation together, whatever their data preparation took, and the trace holds
// only the bench's own operations. (The previous operation was waited for, so its span is
// recorded.)
void aligned_start(Communicator& world, profiler::Recorder* rec) {
  if (rec) world.set_recorder(nullptr);
  world.barrier().wait();
  if (rec) world.set_recorder(rec);
}

traces::CollOp coll_op_of(BenchOp op) {
  switch (op) {
    case BenchOp::AllReduce:
      return traces::CollOp::AllReduce;
    case BenchOp::ReduceScatter:
      return traces::CollOp::ReduceScatter;
    case BenchOp::AllGather:
      return traces::CollOp::AllGather;
    case BenchOp::Broadcast:
      return traces::CollOp::Broadcast;
    case BenchOp::SendRecv:
      return traces::CollOp::Send;
  }
  return traces::CollOp::None;
}

}  // namespace

std::string_view to_string(BenchOp op) {
  switch (op) {
    case BenchOp::AllReduce:
      return "all_reduce";
    case BenchOp::ReduceScatter:
      return "reduce_scatter";
    case BenchOp::AllGather:
      return "all_gather";
    case BenchOp::Broadcast:
      return "broadcast";
    case BenchOp::SendRecv:
      return "send_recv";
  }
  return "?";
}

std::optional<BenchOp> bench_op_from_string(std::string_view s) {
  std::string k;
  for (char ch : s) {
    if (ch == '-' || ch == '_') continue;
    k += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  if (k == "allreduce") return BenchOp::AllReduce;
  if (k == "reducescatter") return BenchOp::ReduceScatter;
  if (k == "allgather") return BenchOp::AllGather;
  if (k == "broadcast" || k == "bcast") return BenchOp::Broadcast;
  if (k == "sendrecv") return BenchOp::SendRecv;
  return std::nullopt;
}

std::string bench_span_name(BenchOp op) { return "bench." + std::string(to_string(op)); }

std::vector<int> default_bench_groups(int nproc) {
  std::vector<int> g;
  for (int x : {2, 4, 8}) {
    if (x <= nproc && nproc % x == 0) g.push_back(x);
  }
  if (nproc >= 2 && std::find(g.begin(), g.end(), nproc) == g.end()) g.push_back(nproc);
  return g;
}

CommBenchOptions checked_bench_options(CommBenchOptions opt, int nproc) {
  if (nproc < 2) {
    throw InputError("--nproc " + std::to_string(nproc) +
                     ": commbench needs at least 2 ranks (it measures collectives between ranks)");
  }
  if (opt.groups.empty()) opt.groups = default_bench_groups(nproc);
  std::set<int> seen_groups;
  for (int g : opt.groups) {
    if (g < 2) throw InputError("--groups: group size " + std::to_string(g) + " is below 2");
    if (g > nproc) {
      throw InputError("--groups: group size " + std::to_string(g) + " exceeds the " +
                       std::to_string(nproc) + " ranks of --nproc");
    }
    if (nproc % g != 0) {
      throw InputError("--groups: group size " + std::to_string(g) + " does not divide the " +
                       std::to_string(nproc) +
                       " ranks of --nproc (the world is split into nproc/g groups)");
    }
    if (!seen_groups.insert(g).second)
      throw InputError("--groups: group size " + std::to_string(g) + " given twice");
  }
  if (opt.min_bytes > opt.max_bytes) {
    throw InputError("--min-bytes " + std::to_string(opt.min_bytes) +
                     " is larger than --max-bytes " + std::to_string(opt.max_bytes));
  }
  if (opt.min_bytes % 4 != 0) {
    throw InputError("--min-bytes " + std::to_string(opt.min_bytes) +
                     ": not a multiple of 4 (the data is float32; sizes are min-bytes * 2^k)");
  }
  const int max_group = *std::max_element(opt.groups.begin(), opt.groups.end());
  if (opt.min_bytes < 4 * int64_t{max_group}) {
    throw InputError("--min-bytes " + std::to_string(opt.min_bytes) +
                     ": must be at least 4 x the largest group (" + std::to_string(4 * max_group) +
                     " bytes: one float32 per rank for reduce_scatter and all_gather)");
  }
  if (opt.max_bytes > kBenchMaxBytes) {
    throw InputError("--max-bytes " + std::to_string(opt.max_bytes) + ": at most 1G (" +
                     std::to_string(kBenchMaxBytes) + " bytes) per buffer");
  }
  if (opt.iters < 1)
    throw InputError("--iters " + std::to_string(opt.iters) + ": at least 1 timed iteration");
  if (opt.warmup < 0) throw InputError("--warmup " + std::to_string(opt.warmup) + ": must be >= 0");
  if (opt.ops.empty()) throw InputError("--ops: no operation given");
  std::set<BenchOp> seen_ops;
  for (BenchOp op : opt.ops) {
    if (!seen_ops.insert(op).second)
      throw InputError("--ops: " + std::string(to_string(op)) + " given twice");
  }
  // send_recv last: an odd group's last rank sits it out, and the communicator's sequence numbers
  // count point-to-point operations, so a collective after it would not line up across the members.
  std::stable_partition(opt.ops.begin(), opt.ops.end(),
                        [](BenchOp op) { return op != BenchOp::SendRecv; });
  if (!(opt.watchdog_s > 0)) throw InputError("commbench: the watchdog must be positive");
  return opt;
}

std::vector<int64_t> bench_sizes(const CommBenchOptions& opt) {
  std::vector<int64_t> s;
  for (int64_t b = opt.min_bytes; b > 0 && b <= opt.max_bytes; b *= 2) s.push_back(b);
  return s;
}

Scenario commbench_scenario(int nproc, const CommBenchOptions& opt) {
  Scenario s;
  s.name = "commbench";
  s.parallel.dp = nproc;
  s.training.global_batch = nproc;
  s.training.micro_batch = 1;
  s.training.steps = opt.iters;
  s.training.warmup_steps = 0;
  s.runtime.threads = 1;
  s.runtime.watchdog_s = opt.watchdog_s;
  s.text =
      "# orrery commbench: not a training run (meta origin \"commbench\"); only "
      "parallel.dp\n"
      "# (the world size) and runtime.threads describe the run, the model and batch keys mean "
      "nothing.\n" +
      to_yaml(s);
  return s;
}

std::string commbench_extra_json(int nproc, const CommBenchOptions& opt) {
  nlohmann::json c;
  c["nproc"] = nproc;
  c["min_bytes"] = opt.min_bytes;
  c["max_bytes"] = opt.max_bytes;
  c["sizes"] = bench_sizes(opt);
  c["iters"] = opt.iters;
  c["warmup"] = opt.warmup;
  c["groups"] = opt.groups;
  nlohmann::json ops = nlohmann::json::array(), names = nlohmann::json::object();
  for (BenchOp op : opt.ops) {
    ops.push_back(std::string(to_string(op)));
    names[std::string(to_string(op))] = bench_span_name(op);
  }
  c["ops"] = ops;
  c["span_names"] = names;
  c["warmup_name"] = std::string(kBenchWarmupName);
  c["warmup_step"] = kBenchWarmupStep;
  c["timed_steps"] = {0, opt.iters - 1};
  c["dtype"] = "float32";
  c["comm_kind"] = "tp";
  c["blocking"] = true;
  c["align_each_op"] = opt.align_each_op;
  nlohmann::json j;
  j["kind"] = "commbench";
  j["threads"] = 1;
  j["commbench"] = c;
  return j.dump();
}

bool is_commbench_trace(const traces::Trace& t) { return traces::is_commbench(t.meta); }

CommBenchSweepStats run_commbench_sweep(Communicator& world, const CommBenchOptions& opt_in,
                                        profiler::Recorder* rec) {
  const CommBenchOptions opt = checked_bench_options(opt_in, world.size());
  const std::vector<int64_t> sizes = bench_sizes(opt);
  CommBenchSweepStats stats;
  std::vector<float> a(static_cast<size_t>(opt.max_bytes / 4)), b(a.size());
  const int me = world.rank();
  for (int g : opt.groups) {
    const int color = me / g;
    std::unique_ptr<Communicator> comm =
        world.split(color, me, traces::CommKind::TP, comm_name(g, color * g));
    if (!comm || comm->size() != g)
      throw InternalError("commbench: split into groups of " + std::to_string(g) + " failed");
    for (BenchOp op : opt.ops) {
      const std::string timed_name = bench_span_name(op);
      for (int64_t bytes : sizes) {
        bool first = true;
        PointRunner point(*comm, op, bytes, a, b, stats, me == opt.corrupt_rank, [&] {
          if (opt.align_each_op || first) aligned_start(world, rec);
          first = false;
        });
        const int total = opt.warmup + opt.iters;
        for (int it = 0; it < total; ++it) {
          const bool timed = it >= opt.warmup;
          OpLabel label;
          label.name = timed ? std::string_view(timed_name) : kBenchWarmupName;
          label.step = timed ? it - opt.warmup : kBenchWarmupStep;
          point.iteration(it, label, it == total - 1);
        }
      }
    }
    world.synchronize();
  }
  return stats;
}

CommBenchRankResult run_commbench_rank(Communicator& world, const CommBenchOptions& opt_in,
                                       const std::string& out_in) {
  const CommBenchOptions opt = checked_bench_options(opt_in, world.size());
  const Scenario s = commbench_scenario(world.size(), opt);
  CommBenchRankResult result;
  const std::string out = agree_on_trace_path(world, s, out_in);

  std::unique_ptr<traces::TraceWriter> writer = open_rank_trace(out, world.rank());
  profiler::Recorder rec(writer.get(), world.rank());
  rec.start_periodic_flush(std::chrono::milliseconds(500));  // bounds what a SIGKILL loses
  profiler::Recorder::set_current(&rec);
  world.set_recorder(&rec);
  struct Detach {
    Communicator& w;
    profiler::Recorder& r;
    ~Detach() {
      w.set_recorder(nullptr);
      profiler::Recorder::set_current(nullptr);
      r.start_periodic_flush(std::chrono::milliseconds(0));
    }
  } detach{world, rec};

  const Layout lay = Layout::of(s, world.rank());
  traces::RunMeta meta = real_run_meta(s, lay, world.size());
  meta.origin = traces::TraceOrigin::Commbench;
  meta.layout = {};          // not a training run
  meta.tokens_per_step = 0;  // no training
  meta.model_flops_per_step = 0;
  meta.extra_json = commbench_extra_json(world.size(), opt);
  {
    std::lock_guard file(profiler::trace_file_mutex());  // the flight recorder writes too
    writer->set_meta(meta);
    writer->add_rank(real_rank_info(lay, world.rank(), meta.host, "cpu"));
  }
  rec.add_stream(profiler::kCommStream, "comm");
  auto& fr = profiler::FlightRecorder::instance();
  fr.set_status(profiler::RankState::Running, 0);
  fr.save();

  const int64_t t0 = profiler::steady_now_ns();
  result.stats = run_commbench_sweep(world, opt, &rec);
  result.sweep_ns = profiler::steady_now_ns() - t0;

  world.set_recorder(nullptr);
  world.synchronize();
  rec.start_periodic_flush(std::chrono::milliseconds(0));
  fr.set_dump_path("");  // last write, before close()
  rec.flush();
  writer->close();
  result.trace_path = merge_rank_traces(world, out);
  return result;
}

namespace {

using TableKey = std::tuple<int, int, int64_t>;  // op, group size, bytes
struct TableAcc {
  std::vector<double> times, spans;
  std::set<int32_t> comms;
  int skipped = 0;
};
using Table = std::map<TableKey, TableAcc>;

// The bench operation of a span: a collective or transfer named "bench.<op>" (not the warm-up),
// inside a step, on a communicator of 2 ranks or more. Names are parsed once each.
class BenchSpans {
 public:
  explicit BenchSpans(const traces::Trace& t) : t_(t) {}

  std::optional<BenchOp> op(const traces::Span& sp) const {
    if (sp.kind != traces::SpanKind::Collective && sp.kind != traces::SpanKind::P2P) return {};
    if (sp.step < 0 || sp.comm < 0) return {};
    auto it = op_of_name_.find(sp.name);
    if (it == op_of_name_.end()) {
      const std::string& name = t_.name_of(sp);
      std::optional<BenchOp> op;
      if (name.rfind("bench.", 0) == 0 && name != kBenchWarmupName)
        op = bench_op_from_string(name.substr(6));
      it = op_of_name_.emplace(sp.name, op).first;
    }
    if (!it->second || group_size(sp.comm) < 2) return {};
    return it->second;
  }
  int group_size(int32_t comm) const {
    const traces::CommunicatorInfo* c = t_.comm(comm);
    return c ? static_cast<int>(c->ranks.size()) : 0;
  }
  TableKey key(BenchOp op, const traces::Span& sp) const {
    return {static_cast<int>(op), group_size(sp.comm), sp.bytes};
  }

 private:
  const traces::Trace& t_;
  mutable std::map<traces::NameId, std::optional<BenchOp>> op_of_name_;
};

// Collectives (every member recorded): the time from the last arrival to the first member done.
void add_collective_times(const traces::Trace& t, const BenchSpans& bench, Table& acc) {
  traces::CollectiveOptions opt;
  opt.keep = [&](const traces::Span& sp) {
    const auto op = bench.op(sp);
    return op && *op != BenchOp::SendRecv;
  };
  for (const auto& ci : traces::collective_instances(t.spans, opt)) {
    if (static_cast<int>(ci.members.size()) != bench.group_size(ci.comm))
      continue;  // an incomplete collective
    int64_t max_start = INT64_MIN, min_end = INT64_MAX;
    for (uint32_t k : ci.members) {
      max_start = std::max(max_start, t.spans[k].start_ns);
      min_end = std::min(min_end, t.spans[k].end_ns);
    }
    // The row of the member seen last in the trace (they normally all agree).
    const traces::Span& last = t.spans[*std::max_element(ci.members.begin(), ci.members.end())];
    TableAcc& a = acc[bench.key(*bench.op(last), last)];
    if (min_end > max_start) {
      a.times.push_back(static_cast<double>(min_end - max_start));
    } else {
      a.skipped++;
    }
  }
}

// send_recv: the k-th send of (comm, from, to, bytes) by issue order (seq) with the k-th receive;
// from the later of the two posts to the receive's end.
void add_send_recv_times(const traces::Trace& t, const BenchSpans& bench, Table& acc) {
  traces::P2pOptions opt;
  opt.keep = [&](const traces::Span& sp) { return bench.op(sp) == BenchOp::SendRecv; };
  opt.by_bytes = true;
  opt.order = traces::P2pOrder::Seq;
  for (const auto& m : traces::match_p2p(t.spans, opt)) {
    const traces::Span& snd = t.spans[m.send];
    const traces::Span& rcv = t.spans[m.recv];
    TableAcc& a = acc[bench.key(BenchOp::SendRecv, snd)];
    const int64_t start = std::max(snd.start_ns, rcv.start_ns);
    const int64_t end = rcv.end_ns;
    if (end > start) {
      a.times.push_back(static_cast<double>(end - start));
    } else {
      a.skipped++;
    }
  }
}

std::vector<CommBenchRow> table_rows(const Table& acc) {
  std::vector<CommBenchRow> rows;
  for (const auto& [k, a] : acc) {
    CommBenchRow r;
    r.op = static_cast<BenchOp>(std::get<0>(k));
    r.group_size = std::get<1>(k);
    r.bytes = std::get<2>(k);
    r.count = r.bytes / 4;
    r.groups = static_cast<int>(a.comms.size());
    r.instances = static_cast<int>(a.times.size());
    r.skipped = a.skipped;
    r.spans = static_cast<int64_t>(a.spans.size());
    r.time_ns = median(a.times);
    r.span_median_ns = median(a.spans);
    if (r.time_ns > 0) {
      r.algbw_gb_per_s = static_cast<double>(r.bytes) / r.time_ns;  // bytes/ns = GB/s
      r.busbw_gb_per_s = r.algbw_gb_per_s * traces::busbw_factor(coll_op_of(r.op), r.group_size);
    }
    rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end(), [](const CommBenchRow& x, const CommBenchRow& y) {
    return std::make_tuple(static_cast<int>(x.op), x.group_size, x.bytes) <
           std::make_tuple(static_cast<int>(y.op), y.group_size, y.bytes);
  });
  return rows;
}

}  // namespace

std::vector<CommBenchRow> commbench_table(const traces::Trace& t) {
  const BenchSpans bench(t);
  Table acc;
  for (const auto& sp : t.spans) {  // every bench span: its duration and communicator
    const auto op = bench.op(sp);
    if (!op) continue;
    TableAcc& a = acc[bench.key(*op, sp)];
    a.spans.push_back(static_cast<double>(sp.duration_ns()));
    a.comms.insert(sp.comm);
  }
  add_collective_times(t, bench, acc);
  add_send_recv_times(t, bench, acc);
  return table_rows(acc);
}

}  // namespace orrery::runtime
