// Checkpoints of a real run and resuming from them, on the same or another data-parallel size.
//
// Format: one directory per checkpoint, DIR/step-<k>/ (k = steps done), holding
//   tp<t>-pp<p>-dp<d>.bin   one file per rank that owns state: for each of its ranges of the (t, p)
//                           shard's flat parameter array (model.hpp), `count` float32 parameters,
//                           then `count` AdamW first moments, then `count` second moments
//                           (little-endian, no header). Without ZeRO dp rank 0 of each (t, p) writes
//                           the whole array; under ZeRO each dp rank writes the range(s) it owns.
//                           Offsets are global coordinates (model.hpp global_flat_runs): the flat
//                           array of the (t, p) shard with every routed expert held, as at ep = 1,
//                           so expert e of block l has one place whichever ep rank held it. MoE with
//                           ep > 1: without ZeRO dp ranks 1..ep-1 also write their own experts;
//                           under ZeRO 1/2 each rank writes its dense shard and its shard of its
//                           experts over the expert-data-parallel group.
//   tp<t>-pp<p>-dp<d>.compression.bin
//                           with parallel.grad_compression (dp > 1), every rank: its DDP
//                           compression hook's state, `residual_elems` float32 error-feedback
//                           residuals (its own unsent part, every bucket in bucket order), then
//                           `q_elems` float32 of PowerSGD's warm-started Q (the same on every dp
//                           replica after its all-reduce, different per (tp, pp) shard). Listed
//                           in the manifest's "compression" object with the scheme and its
//                           parameters (powersgd_rank, topk_ratio, start_step).
//   manifest.json           written last, by world rank 0, after every rank's file is on disk:
//                           scenario, step, layout, model, AdamW step count, data position, seed,
//                           and per file its name, bytes, CRC32C and ranges.
// Every file is written as <name>.tmp, fsync'ed and renamed (then the directory is fsync'ed), so a
// checkpoint without a manifest is partial, and a manifest names only complete files.
//
// fp16's dynamic loss scaler (loss_scaler.hpp) is the same on every rank (the overflow check is
// global): its scale, clean-step count and skipped-step count are the manifest's "loss_scaler".
//
// RNG state: the runtime's random streams are counter-based (xoshiro256** seeded from (seed, stream
// name, index): initialisation per tensor, the data permutation per epoch, each synthetic sequence
// by its index), so the seed and the loader's position are the whole of it; nothing else draws.
//
// Resuming: every rank reads, for each stretch it needs (RankTrainer::state_to_load), the pieces of
// whichever files hold it, so the data-parallel size, the ZeRO stage and parallel.ep may differ
// from the run that wrote the checkpoint; tp, pp, the model (model.moe's experts included) and the
// seed must be equal. The compression state is restored when the checkpoint's scheme, its
// parameter (powersgd_rank or topk_ratio), dp and state sizes equal the run's; otherwise (another
// dp, as an elastic restart on fewer ranks, or another scheme, or a checkpoint without the state)
// the hook starts fresh (zero residuals, Q from its seed) and restore_trainer says so in its
// notes: residuals are each rank's unsent part of its own data shard, which has no place in
// another partition, and error feedback holds again from the first step on (sent + residual ==
// gradient + residual), losing at most the one step's compression error the residuals held. The
// loss scaler continues from the manifest's state; without one it starts at training.loss_scale.
// The data position is
// kept in global sequences: call c at G sequences per call becomes call c*G/G' (data.hpp; within
// an epoch, which is where a run continues).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "orrery/common/crc32c.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/rank_trainer.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime {

// The checksum of the shard files: CRC32C (orrery/common/crc32c.hpp).
using orrery::crc32c;

struct CheckpointRange {
  uint64_t offset = 0;  // in the (tp, pp) shard's flat array, global coordinates (ep = 1)
  uint64_t count = 0;
};

struct CheckpointFile {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  int tp = 0, pp = 0, dp = 0;           // the writer's coordinates
  uint64_t flat_elems = 0;              // of its (tp, pp) shard's global flat array
  int64_t data_calls = 0;               // the writer's loader position
  std::vector<CheckpointRange> ranges;  // in file order; 12 * count bytes each
};

// model.moe's keys that shape the parameters or the routing (a manifest without them: not
// recorded, written before MoE checkpoints existed).
struct CheckpointMoe {
  bool recorded = false;
  int experts = 0, top_k = 0, every = 0, first_dense = 0, expert_ffn_hidden = 0, shared_experts = 0;
};

// One rank's compression state file (file layout above).
struct CheckpointStateFile {
  std::string name;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  int tp = 0, pp = 0, dp = 0;
  uint64_t residual_elems = 0, q_elems = 0;
};

// parallel.grad_compression of the writer (scheme "none": it held no compression state).
struct CheckpointCompression {
  std::string scheme = "none";
  int powersgd_rank = 0;
  double topk_ratio = 0;
  int start_step = 0;
  std::vector<CheckpointStateFile> files;
};

struct CheckpointLossScaler {
  bool recorded = false;  // runtime.precision fp16
  double scale = 1.0;
  int clean_steps = 0;
  int64_t skipped_steps = 0;
};

struct CheckpointManifest {
  std::string path;  // the manifest file it was parsed from ("" when built in memory)
  std::string scenario;
  int32_t step = 0;         // steps done
  int64_t adamw_steps = 0;  // AdamW's step count (bias corrections)
  int dp = 1, tp = 1, pp = 1, zero = 0;
  int ep = 1;  // parallel.ep of the writer (informative: the files are in global coordinates)
  // Blocks per pipeline stage (model::stage_layer_counts: parallel.pp_layers or the even split);
  // empty in a manifest that does not record it (the even split).
  std::vector<int> pp_layers;
  int layers = 0, d_model = 0, heads = 0, vocab = 0, seq = 0;
  CheckpointMoe moe;
  uint64_t seed = 0;
  std::string data_source;
  int64_t data_calls = 0;          // world rank 0's loader calls
  int64_t sequences_per_call = 0;  // G = micro_batch * dp of the writer
  int64_t calls_per_epoch = 0;
  std::vector<CheckpointFile> files;
  CheckpointCompression compression;
  CheckpointLossScaler loss_scaler;
};

std::string manifest_to_json(const CheckpointManifest& m);
// Throws InputError naming `origin` and the key when the text is not a manifest of this format.
CheckpointManifest parse_manifest(const std::string& text, const std::string& origin);

// DIR/step-<k>.
std::string checkpoint_step_dir(const std::string& dir, int32_t step);

// Writes `file` (path) atomically: <path>.tmp, fsync, rename, fsync of the directory. `pieces` are
// written back to back; returns the bytes and the CRC32C of what was written. InternalError on I/O
// failure (disk full and the like), naming the file.
struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};
struct ConstPiece {
  const void* data = nullptr;
  std::size_t bytes = 0;
};
WrittenFile write_file_atomic(const std::string& path, const std::vector<ConstPiece>& pieces);

// Reads DIR/manifest.json and checks every file it names: present, the recorded size, the recorded
// CRC32C. Throws InputError naming the file and what is wrong (missing, truncated, checksum
// mismatch, bad JSON, no manifest: a partial checkpoint).
CheckpointManifest verify_checkpoint(const std::string& step_dir);

struct ResumePoint {
  std::string step_dir;  // the checkpoint used
  CheckpointManifest manifest;
  std::vector<std::string> skipped;  // newer checkpoints passed over, each "path: why"
};
// The step-<k> directories in `dir` (complete or not), newest first: (k, path).
std::vector<std::pair<int64_t, std::string>> checkpoint_steps(const std::string& dir);
// The first of `steps` (as checkpoint_steps lists them) that verifies becomes rp's step_dir and
// manifest; each one before it that does not is noted in rp.skipped with its reason. false: none.
bool take_first_verified(const std::vector<std::pair<int64_t, std::string>>& steps,
                         ResumePoint& rp);
// `dir` is either one checkpoint (it holds manifest.json: used as is, or refused) or a directory of
// step-<k> checkpoints: the newest that verifies, the newer ones skipped with their reason.
// InputError when none can be used (with each one's reason).
ResumePoint find_resume_point(const std::string& dir);

// Throws InputError naming the key when `s` cannot continue from `m`: a different model, tp, pp or
// seed, a data position that does not map onto s's data-parallel size, or no steps left. A
// different model.moe (experts, top_k, every, ...) names the manifest file and the key.
void check_resume_compatible(const CheckpointManifest& m, const Scenario& s,
                             const std::string& where);

// Reads ranges of one (tp, pp) shard's fields from the files of a verified checkpoint, whichever
// files hold them.
class CheckpointReader {
 public:
  enum class Field { Params = 0, M = 1, V = 2 };
  CheckpointReader(std::string step_dir, CheckpointManifest m);
  // Fills dst[0, count) with elements [offset, offset + count) of `field`; InputError naming the
  // checkpoint when some element is in no file.
  void read(int tp, int pp, Field field, uint64_t offset, uint64_t count, float* dst) const;
  const CheckpointManifest& manifest() const { return m_; }

 private:
  std::string dir_;
  CheckpointManifest m_;
};

// Restores a trainer of any device (before prepare()) from a verified checkpoint. Returns notes
// for the user (stderr): state the checkpoint could not give this run (see Resuming above).
std::vector<std::string> restore_trainer(RankTrainer& trainer, const Scenario& s,
                                         const std::string& step_dir, const CheckpointManifest& m);

struct CheckpointStats {
  int saves = 0;
  uint64_t bytes = 0;       // of every file of every checkpoint written (all ranks)
  int64_t blocking_ns = 0;  // training loop held (this rank): snapshot, write or wait, manifest
  int64_t write_ns = 0;     // this rank's file writes (on the thread when in background)
  std::vector<std::string> written;  // checkpoint directories completed
};

// The checkpoints of one rank's run (scenario keys checkpoint.*): call after_step() after every
// step and finish() after the last. Records Phase "checkpoint.save" (compute stream) around the
// work that holds the loop, and in background mode Phase "checkpoint.write" on stream 3
// ("checkpoint") around the file write. A background write overlaps the next step; it is completed
// (joined, the manifest written) after that step, before the next snapshot, and in finish().
// faults.kill_after_step = k: every rank raises SIGKILL once the checkpoint of step k is complete.
class CheckpointSession {
 public:
  // Checkpoints go to `dir`/step-<k>/. Construct before prepare() (it records a stream).
  CheckpointSession(const Scenario& s, RankTrainer& trainer, Communicator& world,
                    profiler::Recorder* rec, std::string dir);
  ~CheckpointSession();  // joins a pending write (no manifest: the checkpoint stays partial)
  CheckpointSession(const CheckpointSession&) = delete;
  CheckpointSession& operator=(const CheckpointSession&) = delete;

  void after_step();
  void finish();
  const CheckpointStats& stats() const { return stats_; }

 private:
  struct Pending;
  void snapshot_and_write();
  void complete(Pending& p);

  Scenario s_;
  RankTrainer& trainer_;
  Communicator& world_;
  profiler::Recorder* rec_;
  std::string dir_;
  std::unique_ptr<Pending> pending_;
  CheckpointStats stats_;
};

}  // namespace orrery::runtime
