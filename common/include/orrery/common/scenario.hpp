// The scenario: one YAML file that describes a training job (model, batch, data, parallel layout,
// runtime and profiling). The same scenario runs for real (`orrery run`) and in simulation
// (`orrery sim`). Every key is documented in scenarios/README.md.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace orrery {

// Mixture of experts (issue 19; Shazeer et al. 2017, GShard, Switch Transformer, Mixtral,
// DeepSeek-V3): the model.moe.* keys. model/moe.hpp holds the rules every consumer follows (which
// blocks are MoE, routing, capacity, the op and span order, the groups); the runtime and the
// simulator both take them from there.
struct MoeConfig {
  int experts = 0;  // routed experts per MoE block; 0 = a dense model (every other key unused)
  int top_k = 2;    // experts each token is routed to, 1 <= top_k <= experts
  int every = 1;    // an MoE FFN in block l when l >= first_dense and l % every == 0 (Megatron's
                    // moe_layer_freq), dense FFN otherwise
  int first_dense = 0;  // blocks [0, first_dense) keep the dense FFN (DeepSeek-V3's first three;
                        // Hugging Face's first_k_dense_replace); 0 <= first_dense < layers
  int expert_ffn_hidden = 0;  // each expert's FFN width; 0 = the dense FFN width (model.ffn_hidden)
  int shared_experts = 0;     // always-on experts of that width (DeepSeek), summed ungated
  double capacity_factor = 0.0;  // > 0: each expert takes at most ceil(factor * tokens * top_k /
                                 // experts) of a micro-batch's assignments, the rest dropped;
                                 // 0 = dropless
  double aux_loss_coef = 0.01;   // Switch/GShard load-balancing loss coefficient, >= 0
  // Simulated only: how unevenly the router spreads tokens when no measured histogram is given
  // (model/moe.hpp expert_load_shares): 0 = uniform, larger = more skewed.
  double router_skew = 0.0;
  bool enabled() const { return experts > 0; }
};

struct ModelConfig {
  int layers = 4;     // L, transformer blocks
  int d_model = 256;  // C, hidden size
  int heads = 4;      // H, attention heads (C % H == 0)
  int vocab = 8192;   // V
  int seq = 128;      // T, sequence length (also the size of the position embedding)
  std::string name;   // optional label, e.g. "gpt-tiny"
  // Llama-style blocks (Touvron et al. 2023, arXiv 2302.13971 and 2307.09288); the defaults are
  // GPT-2/3's. Read through block_arch() below, the one reader of these keys.
  int kv_heads = 0;  // key/value heads: 0 = heads (multi-head), 1 = multi-query, else grouped-query
                     // (Ainslie et al. 2023); divides heads
  int ffn_hidden = 0;                // MLP width F: 0 = 4 * d_model
  std::string activation = "gelu";   // gelu (tanh approximation) | swiglu (Shazeer 2020)
  std::string norm = "layernorm";    // layernorm | rmsnorm (Zhang & Sennrich 2019: gain only)
  std::string position = "learned";  // learned (wpe) | rope (rotary, Su et al. 2021)
  double rope_theta = 10000.0;       // RoPE base
  bool tied_embeddings = true;       // the LM head is wte; false: its own (V, C) matrix
  bool bias = true;  // biases in the linear layers and LayerNorms (false: Llama, none anywhere)
  MoeConfig moe;     // model.moe.*: mixture-of-experts FFNs (off by default)
};

struct TrainingConfig {
  int steps = 10;
  int global_batch = 8;  // sequences per step over all data-parallel replicas
  int micro_batch =
      8;  // sequences per micro-batch per rank; global/(dp*micro) accumulated per step
  uint64_t seed = 1234;
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  int warmup_steps = 1;  // steps excluded from step-time statistics
  // Activation recomputation (Korthikanti et al. 2022): none | selective (the attention core, whose
  // B·heads·T·T probabilities are recomputed in the backward) | full (each block keeps only its
  // input and recomputes its forward in the backward). Parsed by recompute_of.
  std::string recompute = "none";
  // Dynamic loss scaling of runtime.precision fp16 (as PyTorch's GradScaler): the loss gradient is
  // multiplied by the scale, the gradients unscaled before the optimizer; a step whose gradients
  // hold an inf or NaN on any rank is skipped (no update) and the scale halved; after
  // loss_scale_window clean steps in a row it doubles. Unused by fp32 and bf16.
  double loss_scale = 65536.0;   // initial scale, > 0
  int loss_scale_window = 2000;  // clean steps before the scale doubles, >= 1
};

struct DataConfig {
  std::string source = "synthetic";  // synthetic | text
  std::string path;                  // for text: a plain-text file, byte-level tokens
};

struct ParallelConfig {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int zero = 0;                   // 0..3, over the dp group
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved
  int virtual_stages = 1;         // model chunks per pipeline rank (interleaved)
  // Blocks per pipeline stage, stage 0 first (e.g. {11, 12, 12, 13}: the stages with the embedding
  // and the head take fewer), as Megatron-LM and DeepSpeed cut them; empty = layers / pp each. Exactly
  // pp entries, each >= 1, summing to model.layers (validate_layout); not with the interleaved
  // schedule. model/parameters.hpp's stage_layer_counts is the one reader.
  std::vector<int> pp_layers;
  double bucket_mb = 25.0;             // DDP gradient bucket size, MiB
  bool overlap = true;                 // overlap gradient communication with backward
  std::string placement = "tp,dp,pp";  // fastest-varying first (Megatron's default)
  std::string comm_backend = "auto";   // device cuda: auto | nccl | mpi (host-staged)
  // Megatron sequence parallelism (needs tp > 1 and micro_batch x seq divisible by tp): the residual
  // stream, LayerNorms and residual adds sharded over the tp group's tokens, each tp all-reduce a
  // reduce-scatter plus an all-gather (model/block.hpp). Run and simulated.
  bool sequence_parallel = false;
  // Megatron's vocabulary-parallel embedding and output layer (VocabParallelEmbedding, the
  // column-parallel LM head and the vocab-parallel cross-entropy): the embedding table, the LM head's
  // GEMM, the logits and the tied-embedding gradient split over tp by vocabulary rows. Simulated
  // only (the runtime keeps the head whole on every tp rank and refuses it); needs vocab % tp == 0.
  bool vocab_parallel = false;
  // Gradient compression on the dp group's gradient all-reduce (issue 18): none | int8 | powersgd |
  // topk; options in CompressionConfig. Validated here (scheme, ranges, not with ZeRO 2/3); run on
  // device cpu (runtime ddp_compression.hpp), refused on cuda and by sim / sweep.
  std::string grad_compression = "none";
  // Number format of DDP's gradient all-reduce on device cpu (issue 18): fp32 | bf16 | fp16. Not
  // with grad_compression other than none. Parsed by grad_dtype_of.
  std::string grad_dtype = "fp32";
  // Expert parallelism (model.moe, issue 19): the experts of each MoE block sharded over ep
  // consecutive ranks of the dp group (model/moe.hpp: the ep and expert-data-parallel groups);
  // divides dp and model.moe.experts. 1 = every dp rank holds every expert.
  int ep = 1;
};

struct CompressionConfig {
  int powersgd_rank = 4;     // PowerSGD rank r, >= 1
  double topk_ratio = 0.01;  // top-k: fraction of each bucket's entries sent, in (0, 1]
  int start_step = 0;        // uncompressed warm-up steps (PowerSGD's start_powerSGD_iter), >= 0
};

// Offload of ZeRO's state (issue 18; ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et
// al. 2021). Values checked by parse_scenario (names, combinations); the directory by
// check_nvme_path when a run starts (a simulation needs no directory).
struct ZeroConfig {
  // none | host (device cuda: the moments in host memory; meaningless on device cpu, refused) |
  // nvme (the AdamW moments of the range this rank updates live in a file under nvme_path)
  std::string offload_optimizer = "none";
  // none | nvme (ZeRO 3's parameter shards in the file too; needs parallel.zero 3 and
  // offload_optimizer nvme)
  std::string offload_params = "none";
  std::string nvme_path;          // an existing, writable directory; one file per rank in it
  double offload_chunk_mb = 4.0;  // the I/O chunk per state array, MiB (> 0): 3 chunks in memory
  // ZeRO 1/2 as Megatron-LM's distributed optimizer (model/buckets.hpp zero_buckets): the shard
  // cut per DDP bucket, each bucket's reduce-scatter issued as its gradients are ready (every
  // micro-batch under ZeRO 2); with overlap_param_gather (needs overlap_grad_reduce) each bucket's
  // all-gather after the optimizer is waited for only before the next step's first forward that
  // uses it. Both false: one reduce-scatter and one all-gather of the whole array.
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  bool nvme() const { return offload_optimizer == "nvme"; }
};

struct RuntimeConfig {
  std::string device = "cpu";  // cpu | cuda
  int threads = 1;             // compute threads per rank
  double watchdog_s = 300.0;   // a collective not done after this long ends the job
  // cuda: fp32 | tf32 | bf16; cpu: fp32 | bf16 | fp16 (16-bit matrix inputs and outputs, emulated
  // by rounding; fp32 accumulation and master weights). tf32 on cpu and fp16 on cuda are refused.
  std::string precision = "fp32";
};

// Test-only fault injection (scenarios/README.md): ranks are global, -1 is off.
struct FaultsConfig {
  int step = 0;
  int skip_collective_rank = -1;
  int size_mismatch_rank = -1;
  int wrong_op_rank = -1;
  int sleep_rank = -1;
  int sleep_ms = 0;
  int kill_rank = -1;  // that rank SIGKILLs itself at the start of step `step` (rank death)
  int offload_remove_rank = -1;  // that rank's NVMe offload file is removed at the start of `step`
  int kill_after_step =
      -1;  // every rank SIGKILLs itself once the checkpoint of this step is complete
  // Under `orrery run --max-restarts`, the faults fire on the first attempt only unless this is set
  // (then on every attempt, so the restarts run out).
  bool every_attempt = false;
};

struct ProfileConfig {
  bool enabled = true;
};

// Checkpoints of a real run (runtime/include/orrery/runtime/checkpoint.hpp).
struct CheckpointConfig {
  int every = 0;            // steps between checkpoints; 0 = none
  std::string dir;          // DIR/step-<k>/; "" = "checkpoints", or where a run resumed from
  bool background = false;  // write from a thread while training continues
};

struct Scenario {
  std::string path;  // file it was read from ("" when built in code)
  std::string text;  // the YAML text after --set overrides (stored in traces)
  std::string name;  // scenario name (file stem unless `name:` is given)
  ModelConfig model;
  TrainingConfig training;
  DataConfig data;
  ParallelConfig parallel;
  CompressionConfig compression;
  ZeroConfig zero;
  RuntimeConfig runtime;
  ProfileConfig profile;
  CheckpointConfig checkpoint;
  FaultsConfig faults;

  int world_size() const { return parallel.dp * parallel.tp * parallel.pp; }
  // Micro-batches each data-parallel replica accumulates per step.
  int micro_batches_per_step() const {
    return training.global_batch / (parallel.dp * training.micro_batch);
  }
};

// Reads and validates a scenario file. `overrides` are "a.b.c=value" strings (from --set), applied
// before validation. Throws InputError naming the file, the line and the key: unknown keys (with a
// "did you mean"), wrong types, values out of range, batches that do not divide.
Scenario load_scenario(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from YAML text; `origin` names it in messages.
Scenario parse_scenario(const std::string& yaml_text, const std::string& origin,
                        const std::vector<std::string>& overrides = {});

// Checks the parallel layout against the model (heads % tp, layers % (pp*virtual) or
// parallel.pp_layers, zero needs dp>1 for stages that shard, batch divisibility). Throws InputError
// with the reason.
void validate_layout(const Scenario& s);

// zero.nvme_path when zero.offload_optimizer is nvme: an existing directory this process can
// create files in. InputError naming the key otherwise. Called by the runtime before a run starts.
void check_nvme_path(const Scenario& s);

// parallel.schedule parsed, by its one parser: the scenario check and every consumer compare the
// enum, not the text.
enum class Schedule : uint8_t { GPipe, OneFOneB, Interleaved };
std::optional<Schedule> parse_schedule(
    const std::string& name);  // "gpipe" | "1f1b" | "interleaved"
// p.schedule as the enum; InputError naming the key when it is none of the three.
Schedule schedule_of(const ParallelConfig& p);
const char* schedule_name(Schedule s);  // "gpipe" | "1f1b" | "interleaved"

// runtime.device parsed, by its one parser (as parallel.schedule).
enum class Device : uint8_t { Cpu, Cuda };
std::optional<Device> parse_device(const std::string& name);  // "cpu" | "cuda"
// r.device as the enum; InputError naming the key when it is neither.
Device device_of(const RuntimeConfig& r);
const char* device_name(Device d);

// Number formats of matrix inputs: runtime.precision (fp32 | tf32 | bf16 | fp16 on a scenario, by
// device as RuntimeConfig says) and the simulator's device peaks and hardware profiles. One parser,
// case-insensitive.
enum class Precision : uint8_t { FP32, TF32, BF16, FP16 };
std::optional<Precision> precision_from_string(std::string_view s);  // fp32 | tf32 | bf16 | fp16
std::string_view to_string(Precision p);
// r.precision as the enum; InputError naming the key for a value none of fp32, tf32, bf16, fp16.
Precision precision_of(const RuntimeConfig& r);
// parallel.grad_dtype as the enum (FP32, BF16 or FP16); InputError naming the key otherwise.
Precision grad_dtype_of(const ParallelConfig& p);

// training.recompute parsed, by its one parser (as parallel.schedule).
enum class Recompute : uint8_t { None, Selective, Full };
std::optional<Recompute> parse_recompute(const std::string& name);  // "none" | "selective" | "full"
// t.recompute as the enum; InputError naming the key when it is none of the three.
Recompute recompute_of(const TrainingConfig& t);
const char* recompute_name(Recompute r);

// The block architecture with its defaults resolved: model.kv_heads, ffn_hidden, activation, norm,
// position, rope_theta, tied_embeddings, bias, parsed by one function (InputError naming the key
// for a value none of the choices). The runtime's shards, the parameter table, the FLOPs and the
// simulator all take the block from it.
enum class Activation : uint8_t { Gelu, Swiglu };
enum class Norm : uint8_t { LayerNorm, RmsNorm };
enum class Position : uint8_t { Learned, Rope };
struct BlockArch {
  int kv_heads = 0;    // heads when model.kv_heads is 0 (block_arch and resolve() fill it in)
  int ffn_hidden = 0;  // 4 * d_model when model.ffn_hidden is 0 (likewise)
  Activation activation = Activation::Gelu;
  Norm norm = Norm::LayerNorm;
  Position position = Position::Learned;
  double rope_theta = 10000.0;
  bool tied_embeddings = true;
  bool bias = true;
  bool swiglu() const { return activation == Activation::Swiglu; }
  bool rmsnorm() const { return norm == Norm::RmsNorm; }
  bool rope() const { return position == Position::Rope; }
  // Key/value heads one of `tp` tensor-parallel ranks holds (kv_heads resolved): kv_heads / tp, or
  // 1 when there are fewer kv heads than ranks (each replicated on kv_replicas(tp) ranks, as
  // Megatron-style GQA sharding does: the ranks sharing a head sum its gradients).
  int kv_heads_per_rank(int tp) const { return kv_heads >= tp ? kv_heads / tp : 1; }
  int kv_replicas(int tp) const { return kv_heads >= tp ? 1 : tp / kv_heads; }
  // Gains and shifts of one norm: 2 C for a LayerNorm with bias, else C.
  int norm_params_per_channel() const { return !rmsnorm() && bias ? 2 : 1; }
  // With the zero (default) widths filled in for a model of `heads` heads and width `d_model`.
  BlockArch resolve(int heads, int d_model) const {
    BlockArch r = *this;
    if (r.kv_heads <= 0) r.kv_heads = heads;
    if (r.ffn_hidden <= 0) r.ffn_hidden = 4 * d_model;
    return r;
  }
};
BlockArch block_arch(const ModelConfig& m);
const char* activation_name(Activation a);
const char* norm_name(Norm n);
const char* position_name(Position p);

// parallel.placement parsed: the grid axes fastest-varying first, as ids 0 = dp, 1 = tp, 2 = pp
// ("tp,dp,pp" gives {1, 0, 2}); nullopt unless it names each of tp, dp and pp once. The one parser
// of the key: the scenario check and the rank grid (model/grid.hpp) both use it.
std::optional<std::array<int, 3>> parse_placement(const std::string& placement);

// Serialises back to YAML (all keys, defaults included).
std::string to_yaml(const Scenario& s);

}  // namespace orrery
