// The core-sharing law: how much slower a rank computes, and its collectives run, when the ranks
// of a CPU node (their compute threads and their communication progress threads) share its cores.
// With CoreSharing s (hardware.hpp, a profile's `sharing:` section), c = contention_at_full,
// e = oversubscription_exponent, b the busy threads on the node and u = b / cores:
//    u <= 1:  f(b) = 1 + (c − 1) · (b − 1) / (cores − 1)     (memory and polling contention)
//    u >  1:  f(b) = c · u^e                                  (time slicing of the cores)
// and f = 1 without a sharing model (cores == 0), with nothing busy or on one core within it.
// R ranks computing give b = R · threads_per_rank (compute_slowdown); each collective member in
// flight adds comm_thread_weight busy threads (its MPI progress thread polls and copies on the
// same cores), so b need not be whole (busy_slowdown). Collectives slow down by u^comm_exponent
// beyond the cores, u = R · threads_per_rank / cores (comm_slowdown); one started while k of its
// members compute takes (1 + comm_compute_weight · k / cores) x its time (in the executor).
//
// Fitted by `orrery calibrate` (calibrate.cpp; calibrate.hpp's steps 1, 3 and 3b): c and e from
// each run's slowdown against the lone-rank run, comm_exponent from the collectives of
// oversubscribed runs, comm_thread_weight from compute with collectives in flight against the
// same ops without, comm_compute_weight from overlapped training collectives against the
// commbench tables. Applied by the executor (ExecutorOptions::core_sharing: each computing rank
// runs at 1 / busy_slowdown of its node's busy threads at that instant) and statically by
// calibrate.hpp's profile_for_ranks (`orrery replay`).
#pragma once

#include "orrery/sim/hardware.hpp"

namespace orrery::sim {

// The compute slowdown of one rank when `ranks_on_node` ranks share the node's cores:
// busy_slowdown(s, ranks_on_node · threads_per_rank); 1 without a sharing model.
double compute_slowdown(const CoreSharing& s, int ranks_on_node);
// f(b) above for a busy-thread count b that need not be whole (compute threads plus
// comm_thread_weight per collective in flight); compute_slowdown(s, n) = busy_slowdown(s, n · t).
double busy_slowdown(const CoreSharing& s, double busy_threads);
// The slowdown of collectives when `ranks_on_node` ranks share the node's cores (u^comm_exponent
// beyond the cores, 1 within them).
double comm_slowdown(const CoreSharing& s, int ranks_on_node);

}  // namespace orrery::sim
