// The predicted nccl-tests table (see nccl_table.hpp).
#include "orrery/sim/nccl_table.hpp"

#include <cstdio>
#include <numeric>

#include "orrery/common/error.hpp"

namespace orrery::sim {

using traces::CollOp;

std::vector<NcclRow> predict_nccl_table(const Cluster& cluster, const NcclSweep& s) {
  if (s.ranks < 1 || s.ranks > cluster.num_gpus()) {
    throw InputError("--ranks " + std::to_string(s.ranks) + " is outside the cluster '" +
                     cluster.name + "' (" + std::to_string(cluster.num_gpus()) + " GPUs)");
  }
  if (s.factor < 2) throw InputError("-f (size factor) must be >= 2");
  if (s.min_bytes < 0 || s.min_bytes > s.max_bytes) throw InputError("-b must be >= 0 and <= -e");
  if ((s.op == CollOp::Send || s.op == CollOp::Recv) && s.ranks != 2) {
    throw InputError("send/recv is between two ranks: use --ranks 2");
  }
  constexpr int64_t kType = 4;  // float
  const bool per_rank_chunks =
      s.op == CollOp::AllGather || s.op == CollOp::ReduceScatter || s.op == CollOp::AllToAll;
  CollectiveRequest req;
  req.op = s.op;
  req.members.resize(s.ranks);
  std::iota(req.members.begin(), req.members.end(), 0);
  if (s.op == CollOp::Send || s.op == CollOp::Recv) req.members = {0, 1};
  req.algo = s.algo;
  req.protocol = s.protocol;
  req.channels = s.channels;
  std::vector<NcclRow> rows;
  for (int64_t size = std::max<int64_t>(s.min_bytes, 0);; size *= s.factor) {
    NcclRow r;
    const int64_t unit = per_rank_chunks ? kType * s.ranks : kType;
    r.count = size / unit * (unit / kType);
    r.bytes = r.count * kType;
    req.bytes = r.bytes;
    const CollectiveChoice ch = resolve_collective(cluster, req);
    r.algo = ch.algo;
    r.protocol = ch.protocol;
    r.channels = ch.channels;
    CollectiveRequest fixed = req;
    fixed.algo = r.algo;
    fixed.protocol = r.protocol;
    r.time_ns = collective_time_ns(cluster, fixed, s.model);
    if (r.time_ns > 0) {
      r.algbw_gb_per_s =
          static_cast<double>(r.bytes) / static_cast<double>(r.time_ns);  // bytes/ns == GB/s
      r.busbw_gb_per_s = r.algbw_gb_per_s * traces::busbw_factor(s.op, s.ranks);
    }
    rows.push_back(r);
    if (size == 0 || size > s.max_bytes / s.factor) break;
  }
  return rows;
}

namespace {
// nccl-tests' time column: fewer decimals as the time grows.
std::string time_str(double us) {
  char b[32];
  if (us >= 10000.0)
    std::snprintf(b, sizeof b, "%7.0f", us);
  else if (us >= 100.0)
    std::snprintf(b, sizeof b, "%7.1f", us);
  else
    std::snprintf(b, sizeof b, "%7.2f", us);
  return b;
}
}  // namespace

std::string format_nccl_table(const Cluster& cluster, const NcclSweep& s,
                              const std::vector<NcclRow>& rows) {
  // The layout of nccl-tests' output (out-of-place and in-place columns; the simulator predicts the
  // same time for both, and checks no data: #wrong is N/A), plus the algorithm used.
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "# orrery sim-collective (predicted): %s, %d ranks on %s (%s), %s model\n#\n",
                std::string(traces::to_string(s.op)).c_str(), s.ranks, cluster.name.c_str(),
                cluster.topology->describe().c_str(), std::string(to_string(s.model)).c_str());
  out += line;
  std::snprintf(line, sizeof line, "#%52s  %-29s  %-29s\n", "", "           out-of-place",
                "           in-place");
  out += line;
  std::snprintf(line, sizeof line,
                "#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s  %s\n", "size",
                "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                "algbw", "busbw", "#wrong", "algo/proto/channels");
  out += line;
  std::snprintf(line, sizeof line,
                "#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)",
                "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                "(GB/s)", "");
  out += line;
  const bool reduces =
      s.op == CollOp::AllReduce || s.op == CollOp::ReduceScatter || s.op == CollOp::Reduce;
  const bool rooted = s.op == CollOp::Broadcast || s.op == CollOp::Reduce;
  double sum_busbw = 0;
  for (const NcclRow& r : rows) {
    const std::string t = time_str(static_cast<double>(r.time_ns) / 1000.0);
    std::snprintf(
        line, sizeof line,
        "%12lld  %12lld  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %6s  %7s  %6.2f  %6.2f  %6s  %s/%s/%d\n",
        static_cast<long long>(r.bytes), static_cast<long long>(r.count), "float",
        reduces ? "sum" : "none", rooted ? 0 : -1, t.c_str(), r.algbw_gb_per_s, r.busbw_gb_per_s,
        "N/A", t.c_str(), r.algbw_gb_per_s, r.busbw_gb_per_s, "N/A",
        std::string(to_string(r.algo)).c_str(), std::string(to_string(r.protocol)).c_str(),
        r.channels);
    out += line;
    sum_busbw += r.busbw_gb_per_s;
  }
  std::snprintf(line, sizeof line,
                "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : %g \n#\n",
                rows.empty() ? 0.0 : sum_busbw / static_cast<double>(rows.size()));
  out += line;
  return out;
}

}  // namespace orrery::sim
