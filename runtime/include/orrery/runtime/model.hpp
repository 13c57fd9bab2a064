// The reference GPT (shared/reference/gpt.md) on CPUs: configuration, parameters in one flat
// allocation with named pointers carved out, activations per micro-batch, and forward/backward per
// piece (embedding, each block, head + loss) so that data, tensor and pipeline parallelism can be
// built on top without touching the maths.
//
// Memory layout of the flat parameter array (the gradient array has the same layout):
//   [segment -1: wte (V,C), wpe (T,C)]            only the tensors this shard holds
//   [segment l:  block l, for l in [layer_begin, layer_end)]
//   [segment L:  final LayerNorm lnfw (C), lnfb (C)]   when has_head
// A segment is a contiguous range whose gradients are complete at the same moment of the backward
// pass: GptHooks::on_grads_ready(segment) fires in the order L, L-1, ..., layer_begin, -1 (the
// embedding last: wte is tied to the LM head, its gradient is complete only after the embedding
// backward). Gradients accumulate (+=) until gpt_zero_grad.
//
// Pipeline parallelism: a GptShard holds blocks [layer_begin, layer_end), the embedding when
// has_embed (first stage) and the head when has_head (last stage). A last stage that is not also
// the first holds its own copy of wte (segment -1) for the tied LM head; the trainer keeps the two
// copies equal by summing their gradients over the first and last stage (Megatron's embedding
// group) before the optimizer step. Stage boundaries: before gpt_forward on a stage without the
// embedding, write the received activation (B,T,C) to GptActivations::stage_input(); after it, send
// stage_output(). Before gpt_backward on a stage without the head, write the received gradient
// (B,T,C) to GptGradScratch::dres; after it, dres holds the gradient of stage_input() to send back.
// Each micro-batch in flight needs its own GptActivations; one GptGradScratch is enough per rank.
// Interleaved schedules (several model chunks per rank) use one Gpt per chunk, each created with
// its own GptShard (a contiguous layer range); the chunks' flat arrays are then separate.
//
// Tensor parallelism (Megatron): with tp_size > 1 each block holds NH/tp heads (qkv columns, i.e.
// rows of the (3C, C) weight for q, k and v of those heads; the matching columns of the attention
// output projection) and 4C/tp of the MLP width (rows of fc1, columns of fc2). LayerNorms, the
// row-parallel biases (attention projection, fc2), the embedding and the head are replicated. The
// block calls GptHooks::tp_all_reduce at the four points where Megatron sums over the tp group:
// forward after the attention-projection and fc2 matmuls (before their bias and residual, so those
// are added once), backward on the gradient of the ln2 and ln1 outputs (before the LayerNorm
// backward, so LayerNorm gradients come out identical on every tp rank).
//
// Initialisation depends only on (seed, tensor, layer): every tensor is drawn whole from its own
// random stream and then sliced, so any shard holds exactly the values of the full model.
//
// Spans (OpObserver), names and FLOPs (model/names.hpp, model/flops.hpp):
//   "fwd.embed" layer -1 | "fwd.block" layer l | "fwd.head" layer L
//   "bwd.head"  layer L  | "bwd.block" layer l | "bwd.embed" layer -1
// With tp_size > 1 each block span is split into three pieces with the same name and layer, ended
// before each tp_all_reduce and begun again after it, so collectives never sit inside a compute
// span: forward pieces carry flops::block_attention_forward, flops::block_mlp_forward, 0; backward
// pieces 2 x block_mlp_forward, 2 x block_attention_forward, 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/model/moe.hpp"
#include "orrery/model/names.hpp"
#include "orrery/model/parameters.hpp"
#include "orrery/runtime/tensor.hpp"

namespace orrery::runtime {

// The model description this runtime implements (model/): FLOPs, span names, parameter table.
namespace flops = ::orrery::model::flops;
namespace names = ::orrery::model::names;

struct GptConfig {
  int n_layer = 4;    // L
  int n_embd = 256;   // C
  int n_head = 4;     // H
  int vocab = 8192;   // V
  int max_seq = 128;  // T of the position embedding; a batch may use any T <= max_seq
  // The block (common/scenario.hpp): GPT-2's by default; kv heads, MLP width, SwiGLU, RMSNorm,
  // RoPE, an untied LM head and no biases for Llama-style blocks. Zero widths are resolved by
  // gpt_create (BlockArch::resolve).
  BlockArch arch{};
  // Mixture-of-experts blocks (model/moe.hpp; experts 0: none): moe_pieces.hpp.
  MoeConfig moe{};
};
GptConfig gpt_config(const orrery::ModelConfig& m);

// The part of the model one rank holds.
struct GptShard {
  int layer_begin = 0;
  int layer_end = -1;     // exclusive; -1 means n_layer
  bool has_embed = true;  // first pipeline stage: wte, wpe, embedding forward/backward
  bool has_head = true;   // last pipeline stage: final LayerNorm, tied LM head, loss
  int tp_rank = 0;
  int tp_size = 1;
  // Megatron sequence parallelism (tp_size > 1): the residual stream, LayerNorms and residual adds
  // hold this rank's contiguous 1/tp of the B·T tokens (buffers.hpp; gpt_pieces.hpp).
  bool sequence_parallel = false;
  // Expert parallelism (model/moe.hpp): this rank's ep rank of ep_size; it holds experts
  // [ep_rank·E/ep_size, +E/ep_size) of every MoE block.
  int ep_rank = 0;
  int ep_size = 1;
  bool sp() const { return sequence_parallel && tp_size > 1; }
  // Stage `stage` of `stages`: its blocks by the model's one rule (model::stage_layer_range):
  // `stage_layers` (parallel.pp_layers) when given, else split as evenly as possible, earlier
  // stages taking the remainder.
  static GptShard pipeline_stage(const GptConfig& cfg, int stage, int stages,
                                 const std::vector<int>& stage_layers = {});
};

// Sizes inside one block of this shard (the local slice under tensor parallelism).
struct BlockDims {
  int C = 0;   // model width (norms, residual stream)
  int NH = 0;  // heads held: n_head / tp
  int hs = 0;  // head size C / n_head
  int Cl = 0;  // attention channels held: NH * hs
  int F = 0;   // MLP width held: ffn_hidden / tp
  int tp = 1;  // tensor-parallel slices
  int NKV =
      0;  // key/value heads held: kv_heads / tp, or 1 replicated (BlockArch::kv_heads_per_rank)
  int Ckvl = 0;  // key/value channels held: NKV * hs
  int up = 1;    // fc1 outputs per MLP channel: 2 for SwiGLU (gate and up), else 1
  int qkv() const { return Cl + 2 * Ckvl; }  // qkv width held
  int fc1() const { return up * F; }         // fc1 width held
};

// A block's tensors; the biases (*b) are null without model.bias, ln1b and ln2b also under RMSNorm.
struct BlockParams {
  float* ln1w = nullptr;     // (C)
  float* ln1b = nullptr;     // (C)
  float* qkvw = nullptr;     // (Cl + 2 Ckvl, C): rows [q of the held heads | their k | their v]
  float* qkvb = nullptr;     // (Cl + 2 Ckvl)
  float* projw = nullptr;    // (C, Cl): the held columns of the attention output projection
  float* projb = nullptr;    // (C) row-parallel bias, added once after the tp sum
  float* ln2w = nullptr;     // (C)
  float* ln2b = nullptr;     // (C)
  float* fcw = nullptr;      // (F, C), or (2F, C) for SwiGLU: rows [gate | up]
  float* fcb = nullptr;      // (F) or (2F)
  float* fcprojw = nullptr;  // (C, F)
  float* fcprojb = nullptr;  // (C) row-parallel bias, added once after the tp sum
};
// One FFN of an MoE block (a routed or a shared expert), cut over tp as the dense MLP:
struct FfnParams {
  float* fcw = nullptr;      // (up·We, C), SwiGLU rows [gate | up]
  float* fcb = nullptr;      // (up·We)
  float* fcprojw = nullptr;  // (C, We)
  float* fcprojb = nullptr;  // (C) added by tp rank 0 only (the expert's output is a tp partial)
};
// An MoE block's FFN side (model/moe.hpp); empty for a dense block.
struct MoeParams {
  float* router = nullptr;         // (E, C), replicated
  std::vector<FfnParams> shared;   // (shared_experts)
  std::vector<FfnParams> experts;  // (El) this ep rank's experts, in expert order
};
// MoE sizes of this shard (E = 0 without MoE).
struct MoeDims {
  int E = 0;      // routed experts
  int K = 0;      // top_k
  int El = 0;     // experts held: E / ep
  int first = 0;  // the first expert held
  int ep = 1;     // ep ranks
  int We = 0;     // expert width held: expert width / tp
  int S = 0;      // shared experts
};
struct EmbedParams {
  float* wte = nullptr;  // (V, C), also the LM head when tied
  float* wpe = nullptr;  // (max_seq, C); null on a head-only stage and under RoPE
};
struct HeadParams {
  float* lnfw = nullptr;  // (C)
  float* lnfb = nullptr;  // (C); null under RMSNorm or without biases
  float* lmw = nullptr;   // (V, C) the untied LM head; null when tied (wte is the head)
};

inline constexpr int kEmbedSegment = model::kEmbedSegment;
// Whether this shard holds the embedding segment (wte, wpe): the first stage, and the last stage's
// copy of wte when the LM head is tied to it.
struct Gpt;
bool holds_embedding_segment(const Gpt& g);

// One named tensor of the flat array.
struct ParamTensor {
  std::string name;  // e.g. "wte", "h.3.qkvw", "lnfw"
  int segment = 0;   // kEmbedSegment, a layer, or n_layer for the final LayerNorm
  std::size_t offset = 0;
  std::size_t count = 0;
  int rows = 1;  // local shape (rows, cols); vectors have rows == 1
  int cols = 1;
  bool decay = false;  // AdamW weight decay: matrices only (dim >= 2)
  // How it is cut from the full model's tensor under tp (model/parameters.hpp's table).
  model::Slice slice = model::Slice::None;
  std::vector<int> bands;        // Slice::Bands: the full rows (columns of a vector) of each band
  std::vector<int> band_shards;  // and the slices each is cut into (empty: tp; model::band_cut)
  // A routed expert's tensor (model/parameters.hpp): laid out after every dense tensor, in no
  // segment_range, its gradient reduced over the edp group.
  bool expert = false;
};

struct Gpt {
  GptConfig config;
  GptShard shard;  // layer_end resolved
  BlockDims dims;
  std::vector<ParamTensor> tensors;          // memory order
  FloatArray params;                         // all parameters of this shard
  FloatArray grads;                          // same layout
  EmbedParams embed, dembed;                 // pointers into params / grads
  std::vector<BlockParams> blocks, dblocks;  // index layer - layer_begin
  HeadParams head, dhead;
  MoeDims moe_dims;
  std::vector<MoeParams> moe, dmoe;  // index layer - layer_begin; empty entries for dense blocks

  int num_blocks() const { return shard.layer_end - shard.layer_begin; }
  std::size_t num_params() const { return params.size(); }
  // The contiguous range of `segment` in params/grads (count 0 when this shard holds none of it);
  // routed experts' tensors excluded.
  ParamRange segment_range(int segment) const;
  // The routed experts' tensors of block `layer` (count 0: a dense block), contiguous after every
  // dense tensor, in layer order.
  ParamRange expert_range(int layer) const;
  bool is_moe_block(int layer) const;
  // Ranges that get weight decay (the matrices), in memory order.
  std::vector<ParamRange> decay_ranges() const;
  // Looks a tensor up by name; throws std::out_of_range when absent.
  const ParamTensor& tensor(const std::string& name) const;
};

// Global coordinates of a shard's flat array (checkpoint.hpp): the flat array of the same (tp, pp)
// shard with every routed expert held (ep = 1), where expert e of block l sits at one place
// whichever ep rank holds it. A run of this shard's array is contiguous in both.
struct FlatRun {
  std::size_t local = 0, global = 0, count = 0;
};
// The runs covering [0, num tensors' end) of `m`, in local order, adjacent tensors merged (a dense
// model or ep = 1: one run, local == global).
std::vector<FlatRun> global_flat_runs(const Gpt& m);
// Elements of the global array (the ep = 1 shard's flat array).
std::size_t global_flat_elems(const Gpt& m);

// Allocates and initialises (gpt.md): linear and embedding weights N(0, 0.02), attention output
// projection and fc2 N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1 and biases 0.
// Throws InputError for an impossible config or shard (heads % tp, 4C % tp, layers out of range).
Gpt gpt_create(const GptConfig& config, const GptShard& shard, uint64_t seed);
void gpt_zero_grad(Gpt& model);

struct BlockActivations {
  float* ln1;       // (B,T,C)
  float* ln1_mean;  // (B,T)
  float* ln1_rstd;  // (B,T)
  float* qkv;       // (B,T,3*Cl)
  float* atty;      // (B,T,Cl)
  float* att;       // (B,NH,T,T) softmax probabilities
  float* attproj;   // (B,T,C) projection product, before bias (a partial sum under tp)
  float* res2;      // (B,T,C) residual after attention
  float* ln2;       // (B,T,C)
  float* ln2_mean;  // (B,T)
  float* ln2_rstd;  // (B,T)
  float* fch;       // (B,T,F)
  float* fch_gelu;  // (B,T,F)
  float* fcproj;    // (B,T,C) fc2 product, before bias (a partial sum under tp)
};

// One MoE block's forward state for its backward (moe_pieces.hpp), N = B·T tokens, R the rows this
// rank's experts received, S the rows it sent (the kept assignments). The routing and the index
// tables are decided on the host (this part, the same on every backend); the rows and the experts'
// activations are in the backend's memory (BasicMoeBlockState's buffers).
struct MoeRoutingPlan {
  model::moe::Routing routing;      // top-k choices, weights, kept, counts (model/moe.hpp)
  std::vector<int64_t> send_row;    // (N·K) each assignment's row of the send buffer, -1 dropped
  std::vector<int64_t> send_token;  // (S) the token whose ln2 row each send row is
  std::vector<int64_t> send_counts, recv_counts;  // (ep·El) rows per (ep rank, local expert)
  std::vector<int64_t> expert_rows;   // (R) recv rows of each local expert, expert by expert
  std::vector<int64_t> expert_begin;  // (El + 1) where each local expert's rows begin there
  int64_t send_rows = 0;              // S
  int64_t recv_rows = 0;              // R
  std::vector<float> host_probs;      // (N, E) the host's copy of probs (empty on the CPU)
  std::vector<float> host_dgate;      // (N·K) the host's copy of the gates' gradient (idem)
  std::vector<float> dlogits;         // (N, E) the router logits' gradient, made on the host
  double aux = 0;                     // the block's load-balancing loss (coef included)
};
// `FloatBuf`: std::vector<float> on the CPU, cuda::DeviceArray<float> on CUDA; `IndexBuf` holds
// the device's copies of the plan's index tables (unused on the CPU, whose kernels read the plan).
template <class FloatBuf, class IndexBuf>
struct BasicMoeBlockState : MoeRoutingPlan {
  FloatBuf probs;                   // (N, E) router softmax
  FloatBuf send;                    // (S, C) ln2 rows dispatched
  FloatBuf recv;                    // (R, C) rows received, by source, expert, token, slot
  FloatBuf out;                     // (R, C) expert outputs, in recv's order
  FloatBuf back;                    // (S, C) expert outputs combined back, in send's order
  std::vector<FloatBuf> x, h, act;  // per local expert (n, C), (n, up·We), (n, We)
  std::vector<FloatBuf> sh, sact;   // per shared expert (N, up·We), (N, We)
  FloatBuf weight;                  // (N·K) the device's copy of routing.weight
  IndexBuf send_row_dev, send_token_dev, expert_rows_dev;  // the device's copies of the tables
  // Working buffers of one block's forward or backward at a time (BasicActivations::moe_work).
  struct Work {
    FloatBuf y;              // (n, C) one FFN's output
    FloatBuf dback, dgate;   // (S, C), (N·K)
    FloatBuf dout_recv, dx;  // (R, C) each
    FloatBuf dxs_recv;       // (S, C)
    FloatBuf dy_e, dx_e;     // (n, C) one expert's rows
    FloatBuf dact, dh;       // (n, We), (n, up·We)
    FloatBuf dlogits;        // (N, E) the device's copy of MoeRoutingPlan::dlogits
  };
};
using MoeBlockState = BasicMoeBlockState<std::vector<float>, std::vector<int64_t>>;

// Everything the backward of one micro-batch needs from its forward, over any storage: the CPU
// model's FloatArray and host token copies, or the CUDA model's device arrays (cuda/model.hpp's
// GpuActivations). The pointers point into `memory` (carved by buffers.hpp, one layout for both).
template <class FloatStore, class TokenStore, class MoeState = MoeBlockState>
struct BasicActivations {
  int B = 0;
  int T = 0;
  FloatStore memory;
  TokenStore inputs;        // (B,T) copy, for the embedding backward
  TokenStore targets;       // (B,T) copy, for the loss backward
  float* stream = nullptr;  // (num_blocks+1, B,T,C) residual stream at each block boundary
  std::vector<BlockActivations> blocks;
  std::vector<MoeState> moe;         // (num_blocks) MoE blocks' state (empty without MoE)
  typename MoeState::Work moe_work;  // the MoE blocks' working buffers, one block at a time
  float objective_scale = 1.0f;      // the backward's loss_scale (the aux loss's gradient scale)
  float* lnf = nullptr;              // (B,T,C)
  float* lnf_mean = nullptr;         // (B,T)
  float* lnf_rstd = nullptr;         // (B,T)
  float* logits = nullptr;           // (B,T,V) logits, then probabilities, then dlogits (in place)
  float* losses = nullptr;           // (B,T)
  float loss = 0.0f;                 // mean over B*T, set by the head forward
  // What the blocks keep (buffers.hpp): under recomputation some of `blocks`' pointers are the
  // backward scratch's workspace (bind_workspace), and block_backward recomputes them.
  Recompute recompute = Recompute::None;

  std::size_t boundary_elems =
      0;  // B*T*C (B*T*C/tp under sequence parallelism): what crosses a stage boundary
  std::size_t full_elems = 0;  // B*T*C
  // Sequence parallelism's workspace (the backward scratch's, bound by bind_workspace):
  // a (B,T,C) partial product before its reduce-scatter (and the whole embedding output), and this
  // rank's (B·T/tp, C) LayerNorm output before its all-gather.
  float* tp_partial = nullptr;
  float* tp_local = nullptr;

  float* stage_input() { return stream; }
  float* stage_output() { return stream + blocks.size() * boundary_elems; }
  const float* stage_output() const { return stream + blocks.size() * boundary_elems; }
};
using GptActivations = BasicActivations<FloatArray, std::vector<int32_t>>;
// Under recomputation, usable once bind_workspace(acts, scratch) (buffers.hpp) has
// pointed it at a scratch made with the same mode.
GptActivations gpt_activations(const Gpt& model, int B, int T,
                               Recompute recompute = Recompute::None);

// Backward scratch, reusable across micro-batches (over any storage, as BasicActivations).
template <class FloatStore>
struct BasicGradScratch {
  int B = 0;
  int T = 0;
  FloatStore memory;
  float* dres = nullptr;       // (B,T,C) gradient of the residual stream at the current boundary
  float* dln = nullptr;        // (B,T,C)
  float* dqkv = nullptr;       // (B,T,3*Cl)
  float* datty = nullptr;      // (B,T,Cl)
  float* datt = nullptr;       // (B,NH,T,T)
  float* dfch = nullptr;       // (B,T,F)
  float* dfch_gelu = nullptr;  // (B,T,F)
  // Recomputation's workspace (buffers.hpp): a whole block's buffers (full), only `att`
  // (selective), nothing (none).
  BlockActivations work{};
  // Sequence parallelism (else null): dres is then (B·T/tp, C); tp_full a gathered (B,T,C)
  // gradient, tp_partial / tp_local the activations' workspace (above), tp_grads the 6·C
  // replicated LayerNorm and bias gradients of one block's backward before their tp all-reduce.
  float* tp_full = nullptr;
  float* tp_partial = nullptr;
  float* tp_local = nullptr;
  float* tp_grads = nullptr;
};
using GptGradScratch = BasicGradScratch<FloatArray>;
GptGradScratch gpt_grad_scratch(const Gpt& model, int B, int T,
                                Recompute recompute = Recompute::None);

// The FLOP-count dimensions (model/flops.hpp) of a (B, T) micro-batch on this shard.
flops::Dims flop_dims(const Gpt& model, int B, int T);

// Observer of compute spans (profiling). begin/end pairs never nest.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void begin(const char* name, int layer, double flops) = 0;
  virtual void end() = 0;
};

// An observer span for a scope (CPU and CUDA models): begins at construction, ends at close() or
// destruction; reopen() ends it and begins the next piece (a tp-split block). A null observer costs
// one branch.
class OpSpan {
 public:
  OpSpan(OpObserver* obs, const char* name, int layer, double flops) : obs_(obs) {
    if (obs_ != nullptr) obs_->begin(name, layer, flops);
  }
  ~OpSpan() { close(); }
  OpSpan(const OpSpan&) = delete;
  OpSpan& operator=(const OpSpan&) = delete;
  void close() {
    if (obs_ != nullptr) obs_->end();
    obs_ = nullptr;
  }
  void reopen(OpObserver* obs, const char* name, int layer, double flops) {
    close();
    obs_ = obs;
    if (obs_ != nullptr) obs_->begin(name, layer, flops);
  }

 private:
  OpObserver* obs_;
};

// The four tensor-parallel sum points (see the top of this file), and under sequence parallelism
// (model/block.hpp) the reduce-scatters and all-gathers that replace them and the all-reduce of the
// replicated gradients.
enum class TpPoint {
  kAttnProjForward,    // attproj (B,T,C) after the output-projection matmul
  kMlpProjForward,     // fcproj (B,T,C) after the fc2 matmul
  kMlpInputBackward,   // dln (B,T,C): gradient of the ln2 output, before the ln2 backward
  kAttnInputBackward,  // dln (B,T,C): gradient of the ln1 output, before the ln1 backward
  kLn1Gather,          // sequence parallelism: ln1's output, before qkv
  kLn2Gather,          // ln2's output, before fc1
  kOutputGradGather,   // a residual-stream gradient, before fc2's or the projection's backward
  kHeadGather,         // the final LayerNorm's output, before the LM head
  kEmbedGather,        // the first block's input gradient, before the embedding backward
  kReplicatedGrads,    // LayerNorm and row-parallel bias gradients summed over the tp group
  kMoeGateBackward,    // MoE: the gate gradients' partial dot products (N·K) (model/moe.hpp)
};
// Must replace data[0..count) by its sum over the tensor-parallel group (an in-place all-reduce).
using TpAllReduce = std::function<void(TpPoint point, int layer, float* data, std::size_t count)>;

// Sequence parallelism: recv[0..recv_count) = this rank's shard of the sum over the tp group of
// send[0..tp·recv_count); and recv[0..tp·send_count) = every rank's send, in tp-rank order.
using TpReduceScatter = std::function<void(TpPoint point, int layer, const float* send, float* recv,
                                           std::size_t recv_count)>;
using TpAllGather = std::function<void(TpPoint point, int layer, const float* send, float* recv,
                                       std::size_t send_count)>;

// Expert parallelism (model/moe.hpp): Communicator::all_to_all_v of F32 rows over the ep group for
// one of the four all-to-alls of MoE block `layer`, named by `name` (names.hpp kMoeDispatch ...).
using EpAllToAll = std::function<void(const char* name, int layer, const float* send,
                                      const int64_t* send_counts, std::size_t groups, float* recv,
                                      int64_t* recv_counts, std::size_t recv_capacity)>;

struct GptHooks {
  OpObserver* observer = nullptr;
  EpAllToAll ep_all_to_all;  // required when shard.ep_size > 1 and the shard has an MoE block
  // After each MoE block's routing (counters, the aux loss's report); may be empty.
  std::function<void(int layer, const model::moe::Routing& r, double aux)> on_routing;
  TpAllReduce tp_all_reduce;          // required when shard.tp_size > 1, unused otherwise
  TpReduceScatter tp_reduce_scatter;  // required under sequence parallelism
  TpAllGather tp_all_gather;          // required under sequence parallelism
  std::function<void(int segment)> on_grads_ready;  // see the layout note at the top
  // Before the forward of a segment (kEmbedSegment, each block, n_layer for the head) in the
  // whole-stage forward (gpt_forward, pieces::forward): the trainer waits there for the segment's
  // parameters (zero.overlap_param_gather's per-bucket all-gathers). May be empty.
  std::function<void(int segment)> before_forward;
};

// --- pieces, in execution order. Each reads/writes the micro-batch's GptActivations.
// stream[0] = wte[inputs] + wpe (needs has_embed).
void gpt_embed_forward(const Gpt& model, GptActivations& acts, const int32_t* inputs,
                       const GptHooks& hooks = {});
// stream[l-lb+1] = block_l(stream[l-lb]).
void gpt_block_forward(const Gpt& model, GptActivations& acts, int layer,
                       const GptHooks& hooks = {});
// Final LayerNorm, LM head, softmax cross-entropy on stage_output(); returns and stores the mean
// loss (needs has_head).
float gpt_head_forward(const Gpt& model, GptActivations& acts, const int32_t* targets,
                       const GptHooks& hooks = {});
// Sets scratch.dres = d(objective)/d(stage_output()), where objective = loss_scale * mean loss
// (use loss_scale = 1/M to average M accumulated micro-batches). Fires on_grads_ready(n_layer).
void gpt_head_backward(Gpt& model, GptActivations& acts, GptGradScratch& scratch, float loss_scale,
                       const GptHooks& hooks = {});
// Turns scratch.dres from the gradient of block l's output into that of its input; accumulates the
// block's parameter gradients; fires on_grads_ready(l).
void gpt_block_backward(Gpt& model, GptActivations& acts, GptGradScratch& scratch, int layer,
                        const GptHooks& hooks = {});
// Accumulates wte/wpe gradients from scratch.dres; fires on_grads_ready(kEmbedSegment).
void gpt_embed_backward(Gpt& model, GptActivations& acts, GptGradScratch& scratch,
                        const GptHooks& hooks = {});

// --- whole stage: embedding (if held), blocks, head (if held). Returns the mean loss, or 0 on a
// stage without the head.
float gpt_forward(const Gpt& model, GptActivations& acts, const int32_t* inputs,
                  const int32_t* targets, const GptHooks& hooks = {});
// Head (if held; otherwise scratch.dres must hold the output gradient), blocks in reverse,
// embedding (if held). On a head-only stage that holds wte, fires on_grads_ready(kEmbedSegment) last.
void gpt_backward(Gpt& model, GptActivations& acts, GptGradScratch& scratch,
                  float loss_scale = 1.0f, const GptHooks& hooks = {});

}  // namespace orrery::runtime
