// Runs the stage programs of the simulated ranks on the event engine (see executor.hpp).
#include "orrery/sim/executor.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "orrery/common/error.hpp"
#include "orrery/model/moe.hpp"
#include "orrery/sim/core_sharing.hpp"
#include "orrery/sim/engine.hpp"

namespace orrery::sim {

std::vector<int32_t> representative_ranks(const Layout& l, bool all_ranks) {
  std::vector<int32_t> r;
  if (all_ranks) {
    for (int i = 0; i < l.world(); ++i) r.push_back(i);
  } else {
    for (int s = 0; s < l.pp; ++s) r.push_back(l.rank_of(0, 0, s));
    std::sort(r.begin(), r.end());
  }
  return r;
}

bool rail_symmetry_applies(const Layout& l, const Cluster& c) {
  if (l.tp < 2 || c.gpus_per_node != l.tp || !c.topology || !c.topology->rails_are_copies())
    return false;
  for (int r = 0; r < l.world(); ++r) {
    const auto k = l.coord(r);
    if (c.local_of(r) != k.tp || c.node_of(r) != c.node_of(l.rank_of(k.dp, 0, k.pp))) return false;
  }
  return true;
}

bool rail_copies_apply(const Layout& l, const Cluster& c, const ExecutorOptions& opt) {
  const bool sharing = opt.core_sharing && opt.core_sharing->cores > 0;
  return opt.ranks.empty() && opt.all_ranks && opt.rail_symmetry && !sharing &&
         opt.rank_jitter == 0 && opt.op_jitter == 0 && rail_symmetry_applies(l, c);
}

int pp_peer(const Layout& l, int stage, GroupRole role) {
  // Modulo pp: the interleaved schedule sends from the last stage's chunk c to stage 0's chunk c+1.
  return (stage + (role == GroupRole::PPNext ? 1 : -1) + l.pp) % l.pp;
}

std::vector<int32_t> group_members(const Layout& l, int rank, GroupRole role, int ep) {
  const auto c = l.coord(rank);
  std::vector<int32_t> m;
  ep = std::max(1, ep);
  switch (role) {
    case GroupRole::EP:
      for (int d = c.dp - c.dp % ep; d < c.dp - c.dp % ep + ep; ++d)
        m.push_back(l.rank_of(d, c.tp, c.pp));
      break;
    case GroupRole::EDP:
      for (int d = c.dp % ep; d < l.dp; d += ep) m.push_back(l.rank_of(d, c.tp, c.pp));
      break;
    case GroupRole::TP:
      for (int t = 0; t < l.tp; ++t) m.push_back(l.rank_of(c.dp, t, c.pp));
      break;
    case GroupRole::DP:
      for (int d = 0; d < l.dp; ++d) m.push_back(l.rank_of(d, c.tp, c.pp));
      break;
    case GroupRole::PPNext:
    case GroupRole::PPPrev:
      for (int p = 0; p < l.pp; ++p) m.push_back(l.rank_of(c.dp, c.tp, p));
      break;
    case GroupRole::Embedding:
      m.push_back(l.rank_of(c.dp, c.tp, 0));
      if (l.pp > 1) m.push_back(l.rank_of(c.dp, c.tp, l.pp - 1));
      break;
    case GroupRole::None:
      m.push_back(rank);
      break;
  }
  return m;
}

namespace {

// A queue's name in messages: the trace stream's, the I/O queue's "offload.io".
std::string queue_name(int queue) {
  return queue == kStreamOffloadIo ? std::string("offload.io") : std::string(stream_name(queue));
}

class Executor {
 public:
  Executor(const Workload& w, const Cluster& c, const ExecutorOptions& opt)
      : w_(w), c_(c), opt_(opt) {
    const Layout& l = w.layout;
    if (c.num_gpus() < l.world())
      throw InputError("cluster '" + c.name + "' has " + std::to_string(c.num_gpus()) +
                       " GPUs; the layout dp=" + std::to_string(l.dp) +
                       " tp=" + std::to_string(l.tp) + " pp=" + std::to_string(l.pp) + " needs " +
                       std::to_string(l.world()));
    sharing_ = opt.core_sharing && opt.core_sharing->cores > 0;
    gpu_share_ = !sharing_ && opt.comm_compute_share > 0;
    std::vector<int32_t> ranks =
        opt.ranks.empty() ? representative_ranks(l, opt.all_ranks || sharing_) : opt.ranks;
    // Rail symmetry (executor.hpp): tp rank 0 of every group stands for its peers.
    rail_copies_ = rail_copies_apply(l, c, opt);
    if (rail_copies_)
      ranks.erase(std::remove_if(ranks.begin(), ranks.end(),
                                 [&l](int32_t r) { return l.coord(r).tp != 0; }),
                  ranks.end());
    if (sharing_) cpus_.resize(c.nodes > 0 ? c.nodes : 1);
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    sim_index_.assign(l.world(), -1);
    for (int32_t r : ranks) {
      if (r < 0 || r >= l.world())
        throw InputError("simulated rank " + std::to_string(r) + " is not in the layout");
      sim_index_[r] = static_cast<int32_t>(runs_.size());
      RankRun run;
      run.rank = r;
      run.coord = l.coord(r);
      run.program = &w.stages[run.coord.pp];
      run.ops.assign(run.program->ops.size(), OpTiming{});
      runs_.push_back(std::move(run));
    }
    // Reverse dependencies per stage program (CSR).
    dependents_.resize(w.stages.size());
    for (size_t s = 0; s < w.stages.size(); ++s) {
      const auto& p = w.stages[s];
      auto& d = dependents_[s];
      d.begin.assign(p.ops.size() + 1, 0);
      for (const auto& op : p.ops)
        for (uint32_t k = 0; k < op.dep_count; ++k) ++d.begin[p.deps[op.dep_begin + k] + 1];
      for (size_t i = 1; i < d.begin.size(); ++i) d.begin[i] += d.begin[i - 1];
      d.list.resize(d.begin.back());
      std::vector<uint32_t> fill(d.begin.begin(), d.begin.end() - 1);
      for (uint32_t i = 0; i < p.ops.size(); ++i) {
        const auto& op = p.ops[i];
        for (uint32_t k = 0; k < op.dep_count; ++k) d.list[fill[p.deps[op.dep_begin + k]]++] = i;
      }
    }
    // Every rank simulated: the rank spread applies (with representatives it would have no meaning).
    every_rank_ = static_cast<int64_t>(runs_.size()) == int64_t(l.world()) && l.world() > 1;
    if (opt.rank_jitter > 0 && every_rank_)
      jitter_q_ = expected_normal_order_statistics(static_cast<int>(runs_.size()));
    state_.resize(runs_.size());
    group_of_.assign(runs_.size() * kRoles, -1);
    if (gpu_share_) gpus_.resize(runs_.size());
    for (size_t i = 0; i < runs_.size(); ++i) {
      const auto& p = *runs_[i].program;
      state_[i].pending.resize(p.ops.size());
      for (size_t k = 0; k < p.ops.size(); ++k) state_[i].pending[k] = p.ops[k].dep_count;
    }
    if (!opt.comm_time) net_ = make_network(opt.network, c, engine_, opt.flow_whole_components);
  }

  ExecResult run() {
    for (size_t i = 0; i < runs_.size(); ++i)
      for (int s = 0; s < kSimStreams; ++s) try_start(static_cast<int32_t>(i), s);
    engine_.run();
    // Every op must have run; anything left is a cycle in the programs (a bug, not bad input).
    const std::string stuck = stuck_report();
    if (!stuck.empty()) throw InternalError("simulation deadlock: " + stuck);
    ExecResult r;
    r.events = engine_.events_processed();
    if (net_) r.network = net_->stats();
    for (const auto& run : runs_)
      for (const auto& t : run.ops) r.makespan_ns = std::max(r.makespan_ns, t.end_ns);
    if (rail_copies_) {
      const Layout& l = w_.layout;
      for (int32_t k = 0; k < l.world(); ++k) {
        const auto c = l.coord(k);
        if (c.tp != 0) r.copies.emplace_back(k, sim_index_[l.rank_of(c.dp, 0, c.pp)]);
      }
    }
    r.ranks = std::move(runs_);
    return r;
  }

 private:
  // Every stream with ops left: its rank, the op at its head and what it waits for (its first
  // unfinished dependency, or the peers of a collective / the other end of a transfer).
  std::string stuck_report() const {
    std::ostringstream o;
    int listed = 0;
    for (size_t i = 0; i < runs_.size(); ++i) {
      const auto& p = *runs_[i].program;
      for (int s = 0; s < kSimStreams; ++s) {
        if (state_[i].cursor[s] >= p.stream_ops[s].size()) continue;
        const uint32_t id = p.stream_ops[s][state_[i].cursor[s]];
        if (listed++ > 0) o << "; ";
        o << "rank " << runs_[i].rank << " stream " << queue_name(s) << " stuck at "
          << describe(p, id);
        if (state_[i].pending[id] > 0) {
          for (uint32_t k = 0; k < p.ops[id].dep_count; ++k) {
            const uint32_t dep = p.deps[p.ops[id].dep_begin + k];
            if (runs_[i].ops[dep].end_ns >= 0) continue;  // done
            o << " waiting for " << describe(p, dep) << " on stream "
              << queue_name(p.ops[dep].stream);
            break;
          }
        } else {
          o << " waiting for its peers";
        }
      }
    }
    for (size_t i = 0; i < runs_.size(); ++i) {
      const auto& p = *runs_[i].program;
      for (uint32_t id = 0; id < p.ops.size(); ++id) {
        if (!posted_send(p.ops[id]) || runs_[i].ops[id].start_ns < 0 ||
            runs_[i].ops[id].end_ns >= 0)
          continue;
        if (listed++ > 0) o << "; ";
        o << "rank " << runs_[i].rank << " posted " << describe(p, id)
          << ", never received by its peer";
      }
    }
    return o.str();
  }
  static bool posted_send(const Op& op) {
    return op.kind == traces::SpanKind::P2P && op.coll == traces::CollOp::Send;
  }
  std::string describe(const StageProgram& p, uint32_t id) const {
    const Op& op = p.ops[id];
    std::ostringstream o;
    o << "op '" << w_.names[op.name] << "' (step " << op.step << ", micro-batch " << op.micro_batch
      << ", layer " << op.layer << ")";
    return o.str();
  }
  struct RankState {
    double jitter_var = 0;  // ns², op_jitter variance of the compute since its last collective
    std::vector<uint32_t> pending;  // deps not yet done, per op
    std::array<uint32_t, kSimStreams> cursor{};
    std::array<bool, kSimStreams> busy{};
  };
  struct Dependents {
    std::vector<uint32_t> begin, list;
  };
  using Member = std::pair<int32_t, uint32_t>;  // (simulated rank index, op)
  // A communicator: its request (members in communicator order; op and bytes set at each launch),
  // and the simulated members that reached its next collective so far.
  struct GroupInfo {
    CollectiveRequest req;
    int simulated = 0;  // members that are simulated
    bool intra_node = true;
    int arrived = 0;
    std::vector<Member> waiting;
  };
  // Posted sends and receives of one direction, matched in issue order (the runtime's rule).
  struct Channel {
    std::deque<Member> sends, recvs;
  };

  // The group of `role` of simulated rank ri, created on first use (one per communicator, found
  // through a flat table per (simulated rank, role)).
  GroupInfo& group(int32_t ri, GroupRole role) {
    const size_t slot = size_t(ri) * kRoles + size_t(role);
    if (group_of_[slot] >= 0) return groups_[size_t(group_of_[slot])];
    std::vector<int32_t> members =
        group_members(w_.layout, runs_[ri].rank, role, w_.scenario.parallel.ep);
    const uint64_t key = (uint64_t(role) << 32) | uint32_t(members[0]);
    auto [it, inserted] = group_ids_.try_emplace(key, static_cast<int32_t>(groups_.size()));
    group_of_[slot] = it->second;
    if (!inserted) return groups_[size_t(it->second)];
    GroupInfo& g = groups_.emplace_back();
    for (int32_t m : members) {
      if (sim_index_[m] >= 0) ++g.simulated;
      if (c_.node_of(m) != c_.node_of(members[0])) g.intra_node = false;
    }
    g.req.members = std::move(members);
    return g;
  }

  // Member lists of collectives in flight, reused (a completion captures only its slot).
  uint32_t member_slot() {
    if (free_member_lists_.empty()) {
      member_lists_.emplace_back();
      return static_cast<uint32_t>(member_lists_.size() - 1);
    }
    const uint32_t slot = free_member_lists_.back();
    free_member_lists_.pop_back();
    return slot;
  }
  // Completes the members of a finished collective in arrival order and frees their list. By
  // index: a completion may launch collectives that add lists.
  void complete_members(uint32_t slot) {
    for (size_t i = 0; i < member_lists_[slot].size(); ++i) {
      const Member m = member_lists_[slot][i];
      complete(m.first, m.second);
    }
    member_lists_[slot].clear();
    free_member_lists_.push_back(slot);
  }

  void try_start(int32_t ri, int stream) {
    RankState& st = state_[ri];
    const StageProgram& p = *runs_[ri].program;
    if (st.busy[stream] || st.cursor[stream] >= p.stream_ops[stream].size()) return;
    const uint32_t id = p.stream_ops[stream][st.cursor[stream]];
    if (st.pending[id] > 0) return;
    st.busy[stream] = true;
    const Op& op = p.ops[id];
    OpTiming& t = runs_[ri].ops[id];
    t.start_ns = engine_.now();
    switch (op.kind) {
      case traces::SpanKind::Collective:
        arrive_collective(ri, id, op);
        break;
      case traces::SpanKind::P2P:
        if (op.coll == traces::CollOp::Send) {
          // The runtime posts a send (MPI_Isend) and goes on: the next send of the stream does not
          // wait for this one to be matched (a send to the next stage may wait for a receiver
          // while the gradient to the previous stage is what unblocks it).
          st.busy[stream] = false;
          ++st.cursor[stream];
          post_p2p(ri, id, op);
          try_start(ri, stream);
        } else {
          post_p2p(ri, id, op);
        }
        break;
      default: {
        t.active_ns = t.start_ns;
        if (trace_stream(op.stream) == names::kStreamOffload) {
          // Offload's I/O and copies (workload.hpp): the disk's or the link's time, off the cores
          // and the GPU.
          engine_.schedule_at(engine_.now() + op.duration_ns, [this, ri, id] { complete(ri, id); });
          break;
        }
        const int64_t dur = jittered(ri, op);
        if (every_rank_ && opt_.op_jitter > 0)
          st.jitter_var += std::pow(opt_.op_jitter * double(dur), 2);
        if (sharing_) {
          start_shared(ri, id, dur);
        } else if (gpu_share_) {
          start_gpu(ri, id, dur);
        } else {
          engine_.schedule_at(engine_.now() + dur, [this, ri, id] { complete(ri, id); });
        }
        break;
      }
    }
  }

  // A compute op's time with the rank's spread for its step (ExecutorOptions::rank_jitter).
  int64_t jittered(int32_t ri, const Op& op) const {
    if (jitter_q_.empty() || op.step < 0) return op.duration_ns;
    const size_t n = jitter_q_.size();
    const double q = jitter_q_[(static_cast<size_t>(ri) + static_cast<size_t>(op.step)) % n];
    return static_cast<int64_t>(
        std::llround(double(op.duration_ns) * std::max(0.1, 1.0 + opt_.rank_jitter * q)));
  }

  void complete(int32_t ri, uint32_t id) {
    RankState& st = state_[ri];
    const StageProgram& p = *runs_[ri].program;
    runs_[ri].ops[id].end_ns = engine_.now();
    const int stream = p.ops[id].stream;
    if (!posted_send(p.ops[id])) {  // a send released its stream when posted
      st.busy[stream] = false;
      ++st.cursor[stream];
    }
    const Dependents& d = dependents_[p.stage];
    for (uint32_t k = d.begin[id]; k < d.begin[id + 1]; ++k) {
      const uint32_t dep = d.list[k];
      if (--st.pending[dep] == 0) try_start(ri, p.ops[dep].stream);
    }
    try_start(ri, stream);
  }

  // ---- ops progressing together at a rate that changes while they run (processor sharing): a
  // node's cores shared by its ranks, a GPU shared with its own NCCL kernels. The owner brings the
  // work done up to now at the old rate (progress) before anything changes the rate.
  struct Running {
    int32_t ri;
    uint32_t id;
    double remaining_ns;  // of work at the full rate
  };
  struct RatePool {
    std::vector<Running> running;
    int64_t updated_ns = 0;
    uint64_t generation = 0;  // a scheduled completion with an older generation is stale
    void progress(int64_t now, double rate) {
      const double done = double(now - updated_ns) * rate;
      for (auto& r : running) r.remaining_ns -= done;
      updated_ns = now;
    }
    // When the first op in flight finishes at `rate` (running not empty).
    int64_t next_completion(int64_t now, double rate) const {
      double least = running.front().remaining_ns;
      for (const auto& r : running) least = std::min(least, r.remaining_ns);
      return now + static_cast<int64_t>(std::ceil(std::max(0.0, least) / rate));
    }
  };
  // Completes the pool's finished ops (after its progress); true when none of those completions
  // scheduled the pool again, so the caller must.
  bool complete_finished(RatePool& m, uint64_t gen) {
    std::vector<Running> finished;
    for (size_t i = 0; i < m.running.size();) {
      if (m.running[i].remaining_ns <= 0.5) {
        finished.push_back(m.running[i]);
        m.running.erase(m.running.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    ++m.generation;  // completions below may start ops in this pool, which reschedule it
    for (const auto& f : finished) complete(f.ri, f.id);
    return m.generation == gen + 1;
  }

  // A node's cores (ExecutorOptions::core_sharing).
  struct NodeCpu : RatePool {
    double comm_threads = 0;  // comm_thread_weight per member of each collective in flight
  };
  // The rate of each computing rank: the law for its compute threads plus the progress threads of
  // the collectives in flight (CoreSharing::comm_thread_weight).
  double shared_rate(const NodeCpu& n) const {
    if (n.running.empty()) return 1.0;
    const double busy =
        double(n.running.size()) * std::max(1, opt_.core_sharing->threads_per_rank) +
        n.comm_threads;
    return 1.0 / busy_slowdown(*opt_.core_sharing, busy);
  }
  // Work done since the last update, at the rate of the ranks that were busy meanwhile.
  void progress_node(NodeCpu& n) { n.progress(engine_.now(), shared_rate(n)); }
  void start_shared(int32_t ri, uint32_t id, int64_t work_ns) {
    const int node = std::max(0, c_.node_of(runs_[ri].rank));
    NodeCpu& n = cpus_[node];
    progress_node(n);
    n.running.push_back({ri, id, double(work_ns)});
    reschedule_node(node);
  }
  // Schedules the node's next completion; earlier schedules become stale (generation).
  void reschedule_node(int node) {
    NodeCpu& n = cpus_[node];
    if (n.running.empty()) return;
    const int64_t at = n.next_completion(engine_.now(), shared_rate(n));
    const uint64_t gen = ++n.generation;
    engine_.schedule_at(at, [this, node, gen] {
      NodeCpu& m = cpus_[node];
      if (m.generation != gen) return;
      progress_node(m);
      if (complete_finished(m, gen)) reschedule_node(node);
    });
  }

  // A GPU's compute shared with its own NCCL kernels (ExecutorOptions::comm_compute_share).
  struct GpuRank : RatePool {
    int comm_in_flight = 0;  // collectives and transfers of the rank on the network
  };
  double gpu_rate(const GpuRank& g) const {
    return g.comm_in_flight > 0 ? 1.0 - opt_.comm_compute_share : 1.0;
  }
  void progress_gpu(GpuRank& g) { g.progress(engine_.now(), gpu_rate(g)); }
  void start_gpu(int32_t ri, uint32_t id, int64_t work_ns) {
    GpuRank& g = gpus_[size_t(ri)];
    progress_gpu(g);
    g.running.push_back({ri, id, double(work_ns)});
    reschedule_gpu(ri);
  }
  // Schedules the rank's next compute completion; earlier schedules become stale (generation).
  void reschedule_gpu(int32_t ri) {
    GpuRank& g = gpus_[size_t(ri)];
    const uint64_t gen = ++g.generation;
    if (g.running.empty()) return;
    engine_.schedule_at(g.next_completion(engine_.now(), gpu_rate(g)), [this, ri, gen] {
      GpuRank& m = gpus_[size_t(ri)];
      if (m.generation != gen) return;
      progress_gpu(m);
      if (complete_finished(m, gen)) reschedule_gpu(ri);
    });
  }
  // A collective or transfer of these simulated members starts (+1) or ends (-1) on the network.
  void gpu_comm(const std::vector<int32_t>& ranks, int sign) {
    for (int32_t ri : ranks) {
      GpuRank& g = gpus_[size_t(ri)];
      progress_gpu(g);
      g.comm_in_flight = std::max(0, g.comm_in_flight + sign);
      reschedule_gpu(ri);
    }
  }

  void arrive_collective(int32_t ri, uint32_t id, const Op& op) {
    GroupInfo& g = group(ri, op.group);
    g.waiting.emplace_back(ri, id);
    if (++g.arrived < g.simulated) return;
    const uint32_t slot = member_slot();
    member_lists_[slot].swap(g.waiting);  // the group keeps the free list's old capacity
    g.arrived = 0;
    g.req.op = op.coll;
    g.req.bytes = op.bytes;
    launch(g.req, g.intra_node, slot);
  }

  void post_p2p(int32_t ri, uint32_t id, const Op& op) {
    const auto& run = runs_[ri];
    const Layout& l = w_.layout;
    const int32_t peer = l.rank_of(run.coord.dp, run.coord.tp, pp_peer(l, run.coord.pp, op.group));
    const bool is_send = op.coll == traces::CollOp::Send;
    const int32_t src = is_send ? run.rank : peer, dst = is_send ? peer : run.rank;
    // Activations (even seq) and gradients (odd seq) match on channels of their own: with the
    // interleaved schedule on pp = 2 both flow from stage 0 to stage 1, in orders that differ.
    Channel& ch = channels_[op.seq & 1][(uint64_t(uint32_t(src)) << 32) | uint32_t(dst)];
    const uint32_t slot = member_slot();
    std::vector<Member>& members = member_lists_[slot];
    if (sim_index_[peer] < 0) {
      members.push_back(Member{ri, id});
    } else {
      (is_send ? ch.sends : ch.recvs).push_back(Member{ri, id});
      if (ch.sends.empty() || ch.recvs.empty()) {
        free_member_lists_.push_back(slot);
        return;
      }
      members.push_back(ch.sends.front());
      members.push_back(ch.recvs.front());
      ch.sends.pop_front();
      ch.recvs.pop_front();
    }
    p2p_req_.op = traces::CollOp::Send;
    p2p_req_.members.assign({src, dst});
    p2p_req_.bytes = op.bytes;
    launch(p2p_req_, c_.node_of(src) == c_.node_of(dst), slot);
  }

  // A collective's progress threads join (sign +1) or leave (-1) the cores of its members' nodes.
  void comm_threads(const CollectiveRequest& req, double sign) {
    const double w = opt_.core_sharing->comm_thread_weight;
    std::vector<int> nodes;
    for (int32_t m : req.members) nodes.push_back(std::max(0, c_.node_of(m)));
    std::sort(nodes.begin(), nodes.end());
    for (size_t i = 0; i < nodes.size();) {
      size_t j = i;
      while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
      NodeCpu& n = cpus_[nodes[i]];
      progress_node(n);
      n.comm_threads = std::max(0.0, n.comm_threads + sign * w * double(j - i));
      reschedule_node(nodes[i]);
      i = j;
    }
  }

  // Members of `req` computing right now (a running op on their node's processor-sharing server).
  int members_computing(const CollectiveRequest& req) const {
    int k = 0;
    for (int32_t m : req.members) {
      const int32_t ri = sim_index_[m];
      if (ri < 0) continue;
      const NodeCpu& n = cpus_[std::max(0, c_.node_of(m))];
      for (const auto& r : n.running) k += r.ri == ri;
    }
    return k;
  }

  // E[max of n standard normals], cached per n.
  double expected_max(int n) {
    if (n < 2) return 0.0;
    if (static_cast<size_t>(n) >= max_cache_.size())
      max_cache_.resize(static_cast<size_t>(n) + 1, -1.0);
    double& v = max_cache_[static_cast<size_t>(n)];
    if (v < 0) v = expected_normal_order_statistics(n).back();
    return v;
  }

  // Starts a collective or transfer whose simulated members (member_lists_[slot]) have all arrived.
  void launch(const CollectiveRequest& req, bool intra_node, uint32_t slot) {
    const int64_t now = engine_.now();
    const std::vector<Member>& members = member_lists_[slot];
    for (const auto& [ri, id] : members) runs_[ri].ops[id].active_ns = now;
    // op_jitter: a collective waits, on average, for the last of its members' independently late
    // arrivals: σ · E[max of n], σ² the members' mean variance since their previous collective.
    int64_t jitter_wait = 0;
    if (every_rank_ && opt_.op_jitter > 0 && req.op != traces::CollOp::Send &&
        members.size() >= 2) {
      double var = 0;
      for (const auto& [ri, id] : members) var += state_[ri].jitter_var, state_[ri].jitter_var = 0;
      const int n = static_cast<int>(members.size());
      jitter_wait = static_cast<int64_t>(std::llround(std::sqrt(var / n) * expected_max(n)));
    }
    // The progress threads join the cores now and leave them when it completes (the request is kept
    // only then: every other completion carries just its slot).
    std::function<void()> done;
    if (sharing_ && opt_.core_sharing->comm_thread_weight > 0) {
      comm_threads(req, +1.0);
      done = [this, slot, req] {
        comm_threads(req, -1.0);
        complete_members(slot);
      };
    } else {
      done = [this, slot] { complete_members(slot); };
    }
    // The members' compute shares their GPUs with this communication until it ends.
    if (gpu_share_) {
      std::vector<int32_t> ranks;
      for (const auto& [ri, id] : members) ranks.push_back(ri);
      std::sort(ranks.begin(), ranks.end());
      ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
      gpu_comm(ranks, +1);
      done = [this, ranks, inner = std::move(done)] {
        gpu_comm(ranks, -1);
        inner();
      };
    }
    // The time from the test hook or the profile's override; otherwise the network model times it.
    int64_t base_ns = -1;
    if (opt_.comm_time) {
      base_ns = opt_.comm_time(req);
    } else if (opt_.profile) {
      // A send/recv override is stored under `send`.
      if (const CollectiveOverride* o =
              opt_.profile->find_override(req.op, intra_node, static_cast<int>(req.members.size())))
        base_ns = o->time_ns(req.bytes, static_cast<int>(req.members.size()));
    }
    if (base_ns < 0) {
      net_->start(req, std::move(done));
      return;
    }
    // Core sharing: while k of its members compute (their progress threads compete with their own
    // compute threads) it takes (1 + w k / cores) x its time (CoreSharing::comm_compute_weight; k at
    // the start, not re-rated). Other ranks' compute is not counted: the measured tables of the run's
    // own crowding (profile_for_ranks) hold what it costs. k is read in an event at this same instant,
    // queued after the current one, so that the compute a member starts together with it (its next
    // backward op, when a bucket is issued) counts.
    if (sharing_ && opt_.core_sharing->comm_compute_weight > 0) {
      engine_.schedule_at(now, [this, req, base_ns, jitter_wait, done = std::move(done)]() mutable {
        const double stretch = 1.0 + opt_.core_sharing->comm_compute_weight *
                                         double(members_computing(req)) /
                                         double(opt_.core_sharing->cores);
        engine_.schedule_at(engine_.now() + jitter_wait +
                                static_cast<int64_t>(std::llround(double(base_ns) * stretch)),
                            std::move(done));
      });
      return;
    }
    engine_.schedule_at(now + jitter_wait + base_ns, std::move(done));
  }

  const Workload& w_;
  const Cluster& c_;
  const ExecutorOptions& opt_;
  Engine engine_;
  std::unique_ptr<NetworkSim> net_;
  std::vector<int32_t> sim_index_;
  std::vector<RankRun> runs_;
  std::vector<RankState> state_;
  std::vector<Dependents> dependents_;
  static constexpr size_t kRoles = size_t(GroupRole::EDP) + 1;
  std::vector<int32_t> group_of_;  // per (simulated rank, role): index into groups_, -1 unused
  std::vector<GroupInfo> groups_;
  std::unordered_map<uint64_t, int32_t> group_ids_;  // (role, first member) -> groups_ index
  std::vector<std::vector<Member>> member_lists_;    // of collectives in flight (member_slot)
  std::vector<uint32_t> free_member_lists_;
  CollectiveRequest p2p_req_;  // reused for every transfer (start() does not keep it)
  std::unordered_map<uint64_t, Channel> channels_[2];  // activations, gradients
  bool sharing_ = false;
  bool gpu_share_ = false;         // ExecutorOptions::comm_compute_share > 0
  std::vector<GpuRank> gpus_;      // per simulated rank, with gpu_share_
  std::vector<NodeCpu> cpus_;      // per node, with core sharing
  std::vector<double> jitter_q_;   // per simulated rank slot (rotated by step); empty: no spread
  bool every_rank_ = false;        // every rank of the layout is simulated
  bool rail_copies_ = false;       // tp rank 0 stands for its peers (rail symmetry)
  std::vector<double> max_cache_;  // expected_max per n (-1: not computed)
};

}  // namespace

std::vector<double> expected_normal_order_statistics(int n) {
  if (n <= 1) return {0.0};
  // E[Z_(i:n)] = n! / ((i-1)! (n-i)!) ∫ z φ(z) Φ(z)^(i-1) (1 - Φ(z))^(n-i) dz, Simpson's rule on
  // [-12, 12] (the integrand is negligible beyond), coefficients through lgamma.
  constexpr int kSteps = 4800;
  constexpr double kLo = -12.0, kHi = 12.0;
  const double h = (kHi - kLo) / kSteps;
  std::vector<double> q(static_cast<size_t>(n), 0.0), log_coef(static_cast<size_t>(n));
  for (int i = 1; i <= n; ++i)
    log_coef[static_cast<size_t>(i - 1)] =
        std::lgamma(n + 1.0) - std::lgamma(double(i)) - std::lgamma(double(n - i + 1));
  for (int k = 0; k <= kSteps; ++k) {
    const double z = kLo + h * k;
    const double phi = std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI);
    const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
    const double w = (k == 0 || k == kSteps) ? 1.0 : (k % 2 ? 4.0 : 2.0);
    for (int i = 1; i <= n; ++i) {
      const double a = cdf > 0 ? (i - 1) * std::log(cdf) : (i == 1 ? 0.0 : -INFINITY);
      const double b = cdf < 1 ? (n - i) * std::log1p(-cdf) : (i == n ? 0.0 : -INFINITY);
      q[static_cast<size_t>(i - 1)] +=
          w * z * phi * std::exp(log_coef[static_cast<size_t>(i - 1)] + a + b);
    }
  }
  for (auto& v : q) v *= h / 3.0;
  return q;
}

ExecResult execute(const Workload& w, const Cluster& cluster, const ExecutorOptions& opt) {
  Executor e(w, cluster, opt);
  return e.run();
}

namespace {
// The kind and name of the communicator of `role` of `rank` (model/names.hpp's group names).
void name_communicator(const Workload& w, int32_t rank, GroupRole role,
                       traces::CommunicatorInfo& ci) {
  const Layout& l = w.layout;
  const GroupRole key_role = role;
  const auto c = l.coord(rank);
  switch (key_role) {
    case GroupRole::TP:
      ci.kind = traces::CommKind::TP;
      ci.name = names::tp_group(c.dp, c.pp);
      break;
    case GroupRole::DP:
      ci.kind = traces::CommKind::DP;
      ci.name = names::dp_group(c.tp, c.pp);
      break;
    case GroupRole::Embedding:
      ci.kind = traces::CommKind::Other;
      ci.name = names::embed_group(c.dp, c.tp);
      break;
    case GroupRole::EP:
      ci.kind = traces::CommKind::Other;
      ci.name =
          names::ep_group(model::moe::ep_group_index(c.dp, w.scenario.parallel.ep), c.tp, c.pp);
      break;
    case GroupRole::EDP:
      ci.kind = traces::CommKind::Other;
      ci.name = names::edp_group(model::moe::ep_rank(c.dp, w.scenario.parallel.ep), c.tp, c.pp);
      break;
    default:
      ci.kind = traces::CommKind::PP;
      ci.name = names::pp_group(c.dp, c.tp);
      break;
  }
}
}  // namespace

traces::Trace make_trace(const Workload& w, const ExecResult& r, const Cluster& cluster,
                         double peak_flops_per_rank) {
  traces::Trace t;
  const Layout& l = w.layout;
  t.meta.source = traces::TraceSource::Sim;
  t.meta.origin = traces::TraceOrigin::Sim;
  t.meta.layout.zero = w.scenario.parallel.zero;
  t.meta.layout.micro_batches = w.micro_batches;
  t.meta.layout.schedule = w.scenario.parallel.schedule;
  t.meta.layout.placement = w.scenario.parallel.placement;
  t.meta.layout.recompute = w.scenario.training.recompute;
  t.meta.layout.device = cluster.device.name;
  t.meta.layout.precision = w.precision.name;
  t.meta.scenario_text = w.scenario.text.empty() ? to_yaml(w.scenario) : w.scenario.text;
  t.meta.scenario_name = w.scenario.name;
  t.meta.host = cluster.name;
  t.meta.world_size = l.world();
  t.meta.dp = l.dp, t.meta.tp = l.tp, t.meta.pp = l.pp;
  t.meta.tokens_per_step = w.tokens_per_step;
  t.meta.model_flops_per_step = w.model_flops_per_step;
  t.meta.peak_flops_per_rank = peak_flops_per_rank;
  t.meta.extra_json = nlohmann::json{{"cluster", cluster.name},
                                     {"simulated_ranks", r.ranks.size()},
                                     {"precision", w.precision.name},
                                     {"steps", w.steps},
                                     {"warmup_steps", w.steps > 1 ? 1 : 0}}
                          .dump();  // as simulate() counts them

  // Communicators of the simulated ranks, ids in order of first use (deterministic).
  std::unordered_map<uint64_t, int32_t> comm_ids;
  auto comm_of = [&](int32_t rank, GroupRole role) -> int32_t {
    const auto members = group_members(l, rank, role, w.scenario.parallel.ep);
    const GroupRole key_role = role == GroupRole::PPPrev ? GroupRole::PPNext : role;
    const uint64_t key = (uint64_t(key_role) << 32) | uint32_t(members[0]);
    auto it = comm_ids.find(key);
    if (it != comm_ids.end()) return it->second;
    traces::CommunicatorInfo ci;
    ci.id = static_cast<int32_t>(t.comms.size());
    ci.ranks = members;
    name_communicator(w, rank, key_role, ci);
    t.comms.push_back(ci);
    comm_ids.emplace(key, ci.id);
    return ci.id;
  };

  std::vector<traces::NameId> name_ids(w.names.size());
  for (size_t i = 0; i < w.names.size(); ++i) name_ids[i] = t.strings.intern(w.names[i]);
  const traces::NameId step_name = t.strings.intern(names::kStep),
                       fwd_name = t.strings.intern(names::kForward),
                       bwd_name = t.strings.intern(names::kBackward),
                       opt_name = t.strings.intern(names::kOptimizer);

  // Every rank whose timeline is known, in rank order: the simulated ones and their copies (the
  // rail symmetry, executor.hpp).
  std::vector<std::pair<int32_t, const RankRun*>> timelines;
  for (const auto& run : r.ranks) timelines.emplace_back(run.rank, &run);
  for (const auto& [rank, k] : r.copies) timelines.emplace_back(rank, &r.ranks[size_t(k)]);
  std::sort(timelines.begin(), timelines.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t total = 0;
  for (const auto& tl : timelines) total += tl.second->ops.size();
  t.spans.reserve(total + total / 8);
  for (const auto& [rank, run_ptr] : timelines) {
    const RankRun& run = *run_ptr;
    const Layout::Coord coord = l.coord(rank);
    const auto& p = *run.program;
    traces::RankInfo ri;
    ri.rank = rank;
    ri.host = "node" + std::to_string(cluster.node_of(rank));
    ri.device = cluster.device.name + ":" + std::to_string(cluster.local_of(rank));
    ri.dp = coord.dp, ri.tp = coord.tp, ri.pp = coord.pp;
    t.ranks.push_back(ri);
    // The trace's streams: the I/O queue's ops are on "offload" (workload.hpp kStreamOffloadIo).
    for (int s = 0; s < kStreamCount; ++s) {
      const bool io = s == names::kStreamOffload && !p.stream_ops[kStreamOffloadIo].empty();
      if (!p.stream_ops[s].empty() || io)
        t.streams.push_back({rank, s, std::string(stream_name(s))});
    }
    // Phase extents: step per step; forward/backward per (step, micro-batch); optimizer per step.
    struct Extent {
      int64_t start = INT64_MAX, end = INT64_MIN;
      void add(const OpTiming& x) {
        start = std::min(start, x.start_ns);
        end = std::max(end, x.end_ns);
      }
    };
    std::vector<Extent> step_ext(w.steps), opt_ext(w.steps);
    std::vector<Extent> fwd_ext(size_t(w.steps) * w.micro_batches),
        bwd_ext(size_t(w.steps) * w.micro_batches);
    for (size_t i = 0; i < p.ops.size(); ++i) {
      const Op& op = p.ops[i];
      const OpTiming& tm = run.ops[i];
      traces::Span sp;
      sp.rank = rank;
      sp.stream = trace_stream(op.stream);
      sp.kind = op.kind;
      sp.name = name_ids[op.name];
      sp.start_ns = tm.start_ns;
      sp.end_ns = tm.end_ns;
      sp.step = op.step;
      sp.micro_batch = op.micro_batch;
      sp.layer = op.layer;
      sp.bytes = op.bytes;
      sp.flops = op.flops;
      sp.op = op.coll;
      if (op.group != GroupRole::None) {
        sp.comm = comm_of(rank, op.group);
        sp.seq = op.seq;
        if (op.kind == traces::SpanKind::P2P &&
            (op.group == GroupRole::PPNext || op.group == GroupRole::PPPrev))
          sp.peer = l.rank_of(coord.dp, coord.tp, pp_peer(l, coord.pp, op.group));
      }
      t.spans.push_back(sp);
      if (op.step >= 0) step_ext[op.step].add(tm);
      const size_t k = size_t(op.step) * w.micro_batches + op.micro_batch;
      if (op.phase == PhaseKind::Forward && op.micro_batch >= 0) fwd_ext[k].add(tm);
      if (op.phase == PhaseKind::Backward && op.micro_batch >= 0) bwd_ext[k].add(tm);
      if (op.phase == PhaseKind::Optimizer) opt_ext[op.step].add(tm);
    }
    auto phase = [&](traces::NameId name, const Extent& e, int step, int mb) {
      if (e.start > e.end) return;
      traces::Span sp;
      sp.rank = rank;
      sp.stream = kStreamCompute;
      sp.kind = traces::SpanKind::Phase;
      sp.name = name;
      sp.start_ns = e.start;
      sp.end_ns = e.end;
      sp.step = step;
      sp.micro_batch = mb;
      t.spans.push_back(sp);
    };
    for (int s = 0; s < w.steps; ++s) {
      phase(step_name, step_ext[s], s, -1);
      for (int mb = 0; mb < w.micro_batches; ++mb) {
        phase(fwd_name, fwd_ext[size_t(s) * w.micro_batches + mb], s, mb);
        phase(bwd_name, bwd_ext[size_t(s) * w.micro_batches + mb], s, mb);
      }
      phase(opt_name, opt_ext[s], s, -1);
    }
  }
  t.sort_spans();
  return t;
}

}  // namespace orrery::sim
