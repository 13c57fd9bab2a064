// What the simulator prices for a mixture-of-experts block (model/moe.hpp has the rules): how the
// routed tokens spread over the experts and the ep ranks, the kernels of the moe.* compute ops, the
// all-to-all sizes, and the parameters a rank holds.
//
// Load model, per micro-batch, n = B·T tokens on every rank (tp ranks route identically):
//   share_e     expert_load_shares(E, model.moe.router_skew) (uniform 1/E at skew 0)
//   routed_e    n · top_k · share_e          assignments of one rank's tokens to expert e
//   kept_e      min(routed_e, capacity(n))   (capacity_factor 0: dropless, kept_e = routed_e)
//   send rows   Σ_e kept_e                   one rank's dispatch buffer (rows for itself included)
//   rows_e      ep · kept_e                  rows expert e receives from its ep group (every ep rank
//                                            routes alike in the mean)
// The ep rank holding the experts with the most rows ("busiest") decides moe.experts' time: every
// rank of the group waits for it at the combine all-to-all, and all dp ranks of a stage run one
// program (workload.hpp's symmetry), so the program prices every rank at the busiest one's rows.
// Expert GEMMs are priced by shape (M = rows_e), which makes an expert with few rows slower per
// FLOP, as on real GPUs. The all-to-alls likewise: the busiest rank receives Σ rows_e of its local
// experts (its dispatch; it sends as many back at the combine), more than the mean send_rows when
// the router is uneven, and the exchange ends when that rank's bytes have moved; the simulator
// prices the exchange as a balanced one of max(send_rows, busiest received rows) per rank.
#pragma once

#include <cstdint>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::sim {

struct MoeLoad {
  int experts = 0, top_k = 0, ep = 1, local_experts = 0;
  double tokens = 0;                 // n = B·T per rank and micro-batch
  int64_t capacity = -1;             // per rank and expert (-1: dropless)
  std::vector<double> shares;        // (E) share of the assignments
  std::vector<double> kept;          // (E) kept_e of one rank's tokens
  double send_rows = 0;              // Σ kept_e
  double dropped_rows = 0;           // n · top_k − send_rows
  int busiest_rank = 0;              // the ep rank with the most received rows
  std::vector<double> busiest_rows;  // (E / ep) rows_e of its local experts
  double mean_rows_per_rank = 0;     // ep · send_rows / ep = send_rows
  double busiest_received_rows = 0;  // Σ busiest_rows: what the busiest rank's experts receive
};
// The load of one MoE block (all MoE blocks route alike in the simulator): the shares from
// `measured` (a profile's moe_expert_shares, normalised) when it has one entry per expert, else
// from model.moe.router_skew.
MoeLoad moe_load(const Scenario& s, const std::vector<double>& measured = {});

// The experts' shares of the routed assignments in real traces: the moe.tokens[l=L,e=E] counters
// (model/moe.hpp) summed over blocks, ranks and steps, normalised; empty when there are none.
std::vector<double> measured_expert_shares(const std::vector<traces::Trace>& traces);

// Bytes of one all-to-all (moe.dispatch, moe.combine and their backward) per rank, as the simulator
// prices it: max(send_rows, busiest_received_rows) · C · act_bytes, rounded to the nearest byte.
// A uniform router gives this rank's whole send buffer (send_rows; the runtime's span bytes); an
// uneven one the busiest member's volume, which decides when the exchange ends (and the size of
// that rank's receive buffer).
int64_t moe_all_to_all_bytes(const MoeLoad& m, const Scenario& s, int act_bytes);
// Bytes of tp.moe_gate_all_reduce: tokens · top_k values of act_bytes.
int64_t moe_gate_all_reduce_bytes(const Scenario& s, int act_bytes);

// Kernels of the moe.* compute ops on one rank for one micro-batch (forward; the backward op of
// each is its forward's backward_kernels: 2x FLOPs and bytes). Router: the (n x E over C) GEMM,
// softmax and top-k over (n, E), the permutation of the kept rows into the dispatch buffer.
// Experts: for each local expert of the busiest ep rank its fc1 (rows x up·F/tp over C), the
// activation and fc2 (rows x C over F/tp); then every shared expert on all n tokens. Gated sum:
// reads the returned rows (and the shared experts' output), writes the block's (n, C) output.
std::vector<Kernel> moe_router_kernels(const ModelDims& d, const Scenario& s, const MoeLoad& m);
std::vector<Kernel> moe_expert_kernels(const ModelDims& d, const Scenario& s, const MoeLoad& m);
std::vector<Kernel> moe_gated_sum_kernels(const ModelDims& d, const Scenario& s, const MoeLoad& m);
// One expert FFN's kernels on `rows` rows (the tp slice of width F / tp).
std::vector<Kernel> expert_ffn_kernels(const ModelDims& d, const Scenario& s, double rows);
// A forward kernel list's backward (2x FLOPs and bytes, GEMMs as their two products), reversed.
std::vector<Kernel> backward_kernels(std::vector<Kernel> ks);

// Expert parameters one rank holds in one MoE block: the E / ep local experts' tp slices, reduced
// over the edp group (closed form; model::parameter_tensors lists the same tensors with `expert`
// set, and its router and shared experts, which are dense, reduced over dp with the rest).
struct MoeBlockParams {
  int64_t expert = 0;
};
MoeBlockParams moe_block_params(const Scenario& s);
// MoE blocks among the stage's blocks (its chunks' under the interleaved schedule).
int stage_moe_blocks(const Scenario& s, int stage);
// Expert parameters one rank of `stage` holds (its MoE blocks x moe_block_params().expert).
int64_t stage_expert_params(const Scenario& s, int stage);
// The dense parameter count model::parameter_tensors gives the stage, corrected for its MoE blocks.
int64_t stage_dense_params(const Scenario& s, int stage);

// Saved activations of one MoE block's FFN half on one rank for one micro-batch, in bytes: router
// probabilities (n x E, fp32), the busiest rank's received rows through its experts (fc1 input,
// activation input, fc2 input), the returned rows the gated sum's gradient needs, and the shared
// experts' activation and fc2 inputs. (Replaces the dense block's act and fc2 terms.)
double moe_activation_bytes(const Scenario& s, int act_bytes);
// The dense terms an MoE block does not keep (act, fc2), in bytes, for the same micro-batch.
double dense_mlp_activation_bytes(const Scenario& s, int act_bytes);

}  // namespace orrery::sim
