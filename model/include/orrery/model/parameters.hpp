// The parameter tensors of one pipeline stage and tensor-parallel rank, in memory order: the one
// table the runtime allocates and initialises its flat array from and the simulator counts
// parameters, gradients, optimizer state and ZeRO segments from.
//
// Memory order (the runtime's flat array, model.hpp): wte (the embedding's stage, and with tied
// embeddings the head's stage too: the last stage holds its own copy), wpe (the embedding's stage,
// learned positions only), the stage's blocks in chunk order, each ln1w ln1b qkvw qkvb projw projb
// ln2w ln2b fcw fcb fcprojw fcprojb, then lnfw lnfb, and lmw (V, C) when the embeddings are not
// tied (the head's stage). Without biases (model.bias false) every *b tensor is absent; RMSNorm
// has no ln*b either. qkvw is (C + 2 Ckv, C): q | k | v rows, Ckv = kv_heads x head size; fcw is
// (F, C), or (2F, C) for SwiGLU: gate | up rows. Megatron slicing over tp: qkv and fc
// column-parallel (weights and biases sliced, band by band), proj and fcproj row-parallel (weights
// sliced, biases replicated), norms replicated, lmw replicated. Segments (the unit of gradient
// readiness and of ZeRO 3's partition): -1 the embedding (wte, wpe, or the last stage's wte copy),
// l for block l, L for the final norm and lmw.
//
// MoE blocks (model/moe.hpp; model.moe.experts > 0, block l with l % every == 0): fcw fcb fcprojw
// fcprojb are replaced by router (E, C) (replicated), then per shared expert j "h.l.shared.j."
// fcw fcb fcprojw fcprojb, then per expert j this ep rank holds "h.l.expert.j." fcw fcb fcprojw
// fcprojb (expert = true), all of the expert width W and sliced over tp as the dense MLP's. The
// experts' tensors stay in segment l (the simulator counts them with their block); the runtime
// lays them out after every dense tensor so the dense segments stay contiguous (model.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "orrery/common/scenario.hpp"

namespace orrery::model {

inline constexpr int kEmbedSegment = -1;

// How a rank's tensor is cut from the full-model tensor (rows x cols, row-major).
enum class Slice : uint8_t {
  None,   // replicated: the whole tensor
  Bands,  // row bands: band k's rows [start_k + (r / (tp / s_k)) * n_k, +n_k), n_k = bands[k] / s_k
          // with s_k its band_shards (tp unless given) (qkv's q | k | v, SwiGLU fc1's gate | up)
  Rows,   // rows [r*n, +n) of (R, cols), n = local rows
  Cols,   // cols [r*n, +n) of (rows, Cfull), n = local cols
};
enum class Init : uint8_t { Normal, Zero, One };

struct ParamSpec {
  std::string name;  // "wte", "h.3.qkvw", "lnfw"
  int segment = 0;
  int rows = 1, cols = 1;            // this rank's shape
  int full_rows = 1, full_cols = 1;  // the full model's shape
  Slice slice = Slice::None;
  Init init = Init::Zero;
  float stddev = 0;        // Normal: GPT-2's 0.02, residual projections 0.02 / sqrt(2 L)
  std::vector<int> bands;  // Slice::Bands: the full rows of each band, in order
  // Slice::Bands: the distinct slices each band is cut into (empty: tp for every band). Fewer than
  // tp when a band is replicated: qkv's k and v bands with fewer kv heads than tp ranks, one head
  // per rank, shared by tp / kv_heads consecutive ranks.
  std::vector<int> band_shards;
  // A routed expert's tensor (model/moe.hpp): held by one ep rank, its gradient summed over the
  // expert-data-parallel group instead of averaged over dp with the dense ones.
  bool expert = false;
  int64_t count() const { return int64_t(rows) * cols; }
};

// The rows of band k (a band of `full` rows cut into `shards` slices) that tp rank `rank` of `tp`
// holds: [first, first + rows) counted from the band's start.
struct BandCut {
  int first = 0, rows = 0;
};
inline BandCut band_cut(int full, int shards, int tp, int rank) {
  const int n = full / shards;
  return {(rank / (tp / shards)) * n, n};
}
inline BandCut band_cut(const std::vector<int>& bands, const std::vector<int>& band_shards,
                        std::size_t k, int tp, int rank) {
  return band_cut(bands[k], band_shards.empty() ? tp : band_shards[k], tp, rank);
}

struct ModelShape {
  int d_model = 0;  // C
  int heads = 1;    // attention heads (the held attention width is heads/tp x C/heads)
  int vocab = 0;    // V
  int max_seq = 0;  // T (wpe rows)
  int layers = 0;   // L
  int tp = 1;  // tensor-parallel slices (divides heads and the MLP width; divides or is a multiple
               // of the kv heads)
  BlockArch arch;   // kv heads, MLP width, activation, norm, position, tied head, biases
  MoeConfig moe{};  // model.moe: MoE blocks (off by default)
  int ep = 1;       // parallel.ep, and this rank's ep rank (which experts it holds)
  int ep_rank = 0;
};
ModelShape model_shape(const Scenario& s);

// What one pipeline stage holds: the embedding (stage 0), the head (the last stage), and its
// blocks as ranges [first, last) in memory order (one range, unless the interleaved schedule gives
// the stage several model chunks).
struct StageContents {
  bool embed = true;
  bool head = true;
  std::vector<std::pair<int, int>> layers;
};
// Blocks of each pipeline stage, stage 0 first: `pp_layers` (parallel.pp_layers, checked by
// validate_layout) when given, else `layers` split evenly over `pp` stages (when pp does not divide
// them, the first layers % pp stages take one more). The one rule the runtime's shards
// (GptShard::pipeline_stage) and the simulator's stage programs and memory take a stage's layers
// from. InputError when pp_layers has not pp entries, or they are not >= 1 summing to `layers`.
std::vector<int> stage_layer_counts(int layers, int pp, const std::vector<int>& pp_layers);
std::vector<int> stage_layer_counts(const Scenario& s);  // model.layers, parallel.pp, pp_layers
// Stage `stage`'s blocks [first, last) under stage_layer_counts.
std::pair<int, int> stage_layer_range(int layers, int pp, const std::vector<int>& pp_layers,
                                      int stage);
// Model chunks per pipeline stage: parallel.virtual_stages under the interleaved schedule, else 1.
// Chunk k of stage s holds the layers [(k·pp + s)·Lc, (k·pp + s + 1)·Lc), Lc = layers / (pp·chunks);
// one chunk: stage_layer_range.
int chunks_per_stage(const Scenario& s);
StageContents stage_contents(const Scenario& s, int stage);

std::vector<ParamSpec> parameter_tensors(const ModelShape& m, const StageContents& stage);

}  // namespace orrery::model
