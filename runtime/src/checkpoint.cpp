// Checkpoints: atomic shard files, the manifest, verification, resharding reads, and the per-run
// session that saves every N steps (in the foreground or from a thread). Format in checkpoint.hpp.
#include "orrery/runtime/checkpoint.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/model/parameters.hpp"
#include "orrery/profiler/recorder.hpp"

namespace orrery::runtime {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "orrery-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kManifest = "manifest.json";
constexpr int32_t kCheckpointStream = model::names::kStreamCheckpoint;

std::string errno_text() { return std::strerror(errno); }

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some filesystems do not open directories
  ::fsync(fd);
  ::close(fd);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// The step of a "step-<k>" directory name; -1 otherwise.
int64_t step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  int64_t k = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || k > (int64_t{1} << 40)) return -1;
    k = k * 10 + (name[i] - '0');
  }
  return k;
}

// A state range of a rank's flat array cut where its global coordinates jump (model.hpp
// global_flat_runs): each piece's global offset and its local stretch. One piece for a dense model.
struct GlobalPiece {
  uint64_t global = 0;
  StateRange local;
};
std::vector<GlobalPiece> global_pieces(const StateRange& r, const std::vector<FlatRun>& runs) {
  std::vector<GlobalPiece> out;
  std::size_t covered = 0;
  auto at = [](float* p, std::size_t d) { return p != nullptr ? p + d : nullptr; };
  for (const FlatRun& run : runs) {
    const std::size_t lo = std::max(r.offset, run.local);
    const std::size_t hi = std::min(r.offset + r.count, run.local + run.count);
    if (lo >= hi) continue;
    const std::size_t d = lo - r.offset;
    out.push_back({run.global + (lo - run.local),
                   StateRange{lo, hi - lo, at(r.params, d), at(r.m, d), at(r.v, d)}});
    covered += hi - lo;
  }
  if (covered != r.count) {
    throw InternalError("checkpoint: state range [" + std::to_string(r.offset) + ", +" +
                        std::to_string(r.count) + ") lies outside the flat array's tensors");
  }
  return out;
}

// The fields every file entry has (CheckpointFile, CheckpointStateFile): its name, bytes, CRC32C and
// the writer's coordinates.
template <class File>
json file_fields_to_json(const File& f) {
  return {{"name", f.name}, {"bytes", f.bytes}, {"crc32c", hex32(f.crc32c)},
          {"tp", f.tp},     {"pp", f.pp},       {"dp", f.dp}};
}

// Throws json exceptions on missing keys and wrong types; InputError naming `origin` and `key`
// for a name that is not a plain file name.
template <class File>
void file_fields_from_json(const json& jf, const std::string& origin, const char* key, File& f) {
  f.name = jf.at("name").get<std::string>();
  if (f.name.empty() || f.name.find('/') != std::string::npos || f.name[0] == '.') {
    throw InputError(origin + ": key '" + key + "': file name '" + f.name +
                     "' is not a plain name");
  }
  f.bytes = jf.at("bytes").get<uint64_t>();
  f.crc32c = static_cast<uint32_t>(std::stoul(jf.at("crc32c").get<std::string>(), nullptr, 16));
  f.tp = jf.at("tp").get<int>();
  f.pp = jf.at("pp").get<int>();
  f.dp = jf.at("dp").get<int>();
}

// One file's entry, in the manifest and in the record each rank sends rank 0.
json file_to_json(const CheckpointFile& f) {
  json rs = json::array();
  for (const auto& r : f.ranges) rs.push_back({{"offset", r.offset}, {"count", r.count}});
  json j = file_fields_to_json(f);
  j["flat_elems"] = f.flat_elems;
  j["data_calls"] = f.data_calls;
  j["ranges"] = rs;
  return j;
}

// Throws json exceptions on missing keys and wrong types; InputError naming `origin` otherwise.
CheckpointFile file_from_json(const json& jf, const std::string& origin) {
  CheckpointFile f;
  file_fields_from_json(jf, origin, "files", f);
  f.flat_elems = jf.at("flat_elems").get<uint64_t>();
  f.data_calls = jf.at("data_calls").get<int64_t>();
  uint64_t total = 0;
  for (const json& r : jf.at("ranges")) {
    f.ranges.push_back({r.at("offset").get<uint64_t>(), r.at("count").get<uint64_t>()});
    total += 12 * f.ranges.back().count;
  }
  if (total != f.bytes) {
    throw InputError(origin + ": key 'files': '" + f.name + "' lists ranges of " +
                     std::to_string(total) + " bytes but " + std::to_string(f.bytes) + " bytes");
  }
  return f;
}

// A compression state file's entry (the manifest's compression.files, and the rank's record).
json state_file_to_json(const CheckpointStateFile& f) {
  json j = file_fields_to_json(f);
  j["residual_elems"] = f.residual_elems;
  j["q_elems"] = f.q_elems;
  return j;
}

CheckpointStateFile state_file_from_json(const json& jf, const std::string& origin) {
  CheckpointStateFile f;
  file_fields_from_json(jf, origin, "compression.files", f);
  f.residual_elems = jf.at("residual_elems").get<uint64_t>();
  f.q_elems = jf.at("q_elems").get<uint64_t>();
  if (4 * (f.residual_elems + f.q_elems) != f.bytes) {
    throw InputError(origin + ": key 'compression.files': '" + f.name + "' lists " +
                     std::to_string(f.residual_elems + f.q_elems) + " float32 but " +
                     std::to_string(f.bytes) + " bytes");
  }
  return f;
}

json compression_to_json(const CheckpointCompression& c) {
  json files = json::array();
  for (const auto& f : c.files) files.push_back(state_file_to_json(f));
  return {{"scheme", c.scheme},
          {"powersgd_rank", c.powersgd_rank},
          {"topk_ratio", c.topk_ratio},
          {"start_step", c.start_step},
          {"file_layout",
           "per file: residual_elems float32 error-feedback residuals (every DDP bucket, bucket "
           "order), then q_elems float32 PowerSGD Q (little-endian)"},
          {"files", files}};
}

void compression_from_json(const json& j, const std::string& origin, CheckpointCompression& c) {
  c.scheme = j.at("scheme").get<std::string>();
  c.powersgd_rank = j.at("powersgd_rank").get<int>();
  c.topk_ratio = j.at("topk_ratio").get<double>();
  c.start_step = j.at("start_step").get<int>();
  for (const json& jf : j.at("files")) c.files.push_back(state_file_from_json(jf, origin));
}

}  // namespace

// ---------------------------------------------------------------- manifest

std::string manifest_to_json(const CheckpointManifest& m) {
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["scenario"] = m.scenario;
  j["step"] = m.step;
  j["adamw_steps"] = m.adamw_steps;
  j["layout"] = {{"dp", m.dp},     {"tp", m.tp}, {"pp", m.pp},
                 {"zero", m.zero}, {"ep", m.ep}, {"pp_layers", m.pp_layers}};
  j["model"] = {{"layers", m.layers},
                {"d_model", m.d_model},
                {"heads", m.heads},
                {"vocab", m.vocab},
                {"seq", m.seq}};
  if (m.moe.recorded) {  // every manifest written now; experts 0: a dense model
    j["model"]["moe"] = {{"experts", m.moe.experts},
                         {"top_k", m.moe.top_k},
                         {"every", m.moe.every},
                         {"first_dense", m.moe.first_dense},
                         {"expert_ffn_hidden", m.moe.expert_ffn_hidden},
                         {"shared_experts", m.moe.shared_experts}};
  }
  j["rng"] = {{"seed", m.seed},
              {"streams", "counter-based: (seed, stream, index) -> xoshiro256**; no other state"}};
  j["data"] = {{"source", m.data_source},
               {"calls", m.data_calls},
               {"sequences_per_call", m.sequences_per_call},
               {"calls_per_epoch", m.calls_per_epoch}};
  j["checksum"] = "crc32c";
  j["file_layout"] =
      "per range: count float32 params, count exp_avg, count exp_avg_sq (little-endian)";
  json files = json::array();
  for (const auto& f : m.files) files.push_back(file_to_json(f));
  j["files"] = files;
  if (m.compression.scheme != "none") j["compression"] = compression_to_json(m.compression);
  if (m.loss_scaler.recorded) {
    j["loss_scaler"] = {{"scale", m.loss_scaler.scale},
                        {"clean_steps", m.loss_scaler.clean_steps},
                        {"skipped_steps", m.loss_scaler.skipped_steps}};
  }
  return j.dump(1) + "\n";
}

CheckpointManifest parse_manifest(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InputError(origin + ": not valid JSON (" + e.what() + "): the manifest is damaged");
  }
  CheckpointManifest m;
  m.path = origin;
  const char* key = "format";
  try {
    if (!j.is_object() || j.value("format", "") != kFormat) {
      throw InputError(origin + ": key 'format': expected \"" + kFormat + "\"");
    }
    key = "version";
    if (j.at("version").get<int>() != kVersion) {
      throw InputError(origin + ": key 'version': expected " + std::to_string(kVersion) + ", got " +
                       j.at("version").dump());
    }
    key = "scenario";
    m.scenario = j.at("scenario").get<std::string>();
    key = "step";
    m.step = j.at("step").get<int32_t>();
    key = "adamw_steps";
    m.adamw_steps = j.at("adamw_steps").get<int64_t>();
    key = "layout";
    const json& l = j.at("layout");
    m.dp = l.at("dp").get<int>();
    m.tp = l.at("tp").get<int>();
    m.pp = l.at("pp").get<int>();
    m.zero = l.at("zero").get<int>();
    if (l.contains("pp_layers")) m.pp_layers = l.at("pp_layers").get<std::vector<int>>();
    if (l.contains("ep")) m.ep = l.at("ep").get<int>();
    key = "model";
    const json& md = j.at("model");
    m.layers = md.at("layers").get<int>();
    m.d_model = md.at("d_model").get<int>();
    m.heads = md.at("heads").get<int>();
    m.vocab = md.at("vocab").get<int>();
    m.seq = md.at("seq").get<int>();
    if (md.contains("moe")) {
      key = "model.moe";
      const json& e = md.at("moe");
      m.moe.recorded = true;
      m.moe.experts = e.at("experts").get<int>();
      m.moe.top_k = e.at("top_k").get<int>();
      m.moe.every = e.at("every").get<int>();
      m.moe.first_dense = e.at("first_dense").get<int>();
      m.moe.expert_ffn_hidden = e.at("expert_ffn_hidden").get<int>();
      m.moe.shared_experts = e.at("shared_experts").get<int>();
    }
    key = "rng";
    m.seed = j.at("rng").at("seed").get<uint64_t>();
    key = "data";
    const json& d = j.at("data");
    m.data_source = d.at("source").get<std::string>();
    m.data_calls = d.at("calls").get<int64_t>();
    m.sequences_per_call = d.at("sequences_per_call").get<int64_t>();
    m.calls_per_epoch = d.at("calls_per_epoch").get<int64_t>();
    key = "files";
    for (const json& jf : j.at("files")) m.files.push_back(file_from_json(jf, origin));
    if (j.contains("compression")) {
      key = "compression";
      compression_from_json(j.at("compression"), origin, m.compression);
    }
    if (j.contains("loss_scaler")) {
      key = "loss_scaler";
      const json& ls = j.at("loss_scaler");
      m.loss_scaler = {true, ls.at("scale").get<double>(), ls.at("clean_steps").get<int>(),
                       ls.at("skipped_steps").get<int64_t>()};
    }
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw InputError(origin + ": key '" + key + "': missing or of the wrong type (" + e.what() +
                     ")");
  }
  return m;
}

std::string checkpoint_step_dir(const std::string& dir, int32_t step) {
  return (fs::path(dir) / ("step-" + std::to_string(step))).string();
}

// ---------------------------------------------------------------- writing

WrittenFile write_file_atomic(const std::string& path, const std::vector<ConstPiece>& pieces) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InternalError("checkpoint: cannot create '" + tmp + "': " + errno_text());
  WrittenFile w;
  auto fail = [&](const std::string& what) {
    const std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw InternalError("checkpoint: " + what + " '" + tmp + "': " + why);
  };
  for (const ConstPiece& p : pieces) {
    const auto* b = static_cast<const char*>(p.data);
    w.crc32c = crc32c(b, p.bytes, w.crc32c);
    std::size_t left = p.bytes;
    while (left > 0) {
      const ssize_t n = ::write(fd, b, std::min<std::size_t>(left, std::size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("cannot write");
      }
      b += n;
      left -= static_cast<std::size_t>(n);
    }
    w.bytes += p.bytes;
  }
  if (::fsync(fd) != 0) fail("cannot fsync");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw InternalError("checkpoint: cannot close '" + tmp + "': " + errno_text());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw InternalError("checkpoint: cannot rename '" + tmp + "' to '" + path +
                        "': " + errno_text());
  }
  fsync_dir(fs::path(path).parent_path().string());
  return w;
}

// ---------------------------------------------------------------- verifying and finding

namespace {
// Checks that `name` in `step_dir` has the manifest's size and CRC32C; InputError otherwise.
void verify_file(const std::string& step_dir, const std::string& name, uint64_t bytes,
                 uint32_t crc32c_want, std::vector<char>& buf) {
  const std::string p = (fs::path(step_dir) / name).string();
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw InputError("checkpoint '" + step_dir + "': file '" + name +
                     "' named in the manifest is missing (" + errno_text() + ")");
  }
  struct stat st {};
  ::fstat(fd, &st);
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    ::close(fd);
    throw InputError("checkpoint '" + step_dir + "': file '" + name + "' has " +
                     std::to_string(st.st_size) + " bytes, the manifest says " +
                     std::to_string(bytes) +
                     (static_cast<uint64_t>(st.st_size) < bytes ? " (truncated)" : ""));
  }
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      throw InputError("checkpoint '" + step_dir + "': cannot read '" + name +
                       "': " + errno_text());
    }
    if (n == 0) break;
    crc = crc32c(buf.data(), static_cast<std::size_t>(n), crc);
  }
  ::close(fd);
  if (crc != crc32c_want) {
    throw InputError("checkpoint '" + step_dir + "': file '" + name +
                     "' fails its checksum (CRC32C " + hex32(crc) + ", the manifest says " +
                     hex32(crc32c_want) + "): the file is damaged");
  }
}
}  // namespace

CheckpointManifest verify_checkpoint(const std::string& step_dir) {
  const std::string mpath = (fs::path(step_dir) / kManifest).string();
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec))
    throw InputError("checkpoint '" + step_dir + "': no such directory");
  if (!fs::is_regular_file(mpath, ec)) {
    throw InputError(
        "checkpoint '" + step_dir + "': no " + kManifest +
        " (a partial checkpoint: its writer stopped before the manifest, which is written last)");
  }
  CheckpointManifest m = parse_manifest(read_text(mpath), mpath);
  std::vector<char> buf(std::size_t{8} << 20);
  for (const auto& f : m.files) verify_file(step_dir, f.name, f.bytes, f.crc32c, buf);
  for (const auto& f : m.compression.files) verify_file(step_dir, f.name, f.bytes, f.crc32c, buf);
  return m;
}

std::vector<std::pair<int64_t, std::string>> checkpoint_steps(const std::string& dir) {
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t k = step_of(e.path().filename().string());
    if (k >= 0 && e.is_directory()) steps.emplace_back(k, e.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

bool take_first_verified(const std::vector<std::pair<int64_t, std::string>>& steps,
                         ResumePoint& rp) {
  for (const auto& [k, path] : steps) {
    try {
      rp.manifest = verify_checkpoint(path);
      rp.step_dir = path;
      return true;
    } catch (const InputError& e) {
      rp.skipped.push_back(e.what());
    }
  }
  return false;
}

ResumePoint find_resume_point(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError("--resume '" + dir + "': no such directory");
  ResumePoint rp;
  if (fs::exists(fs::path(dir) / kManifest, ec) ||
      step_of(fs::path(dir).filename().string()) >= 0) {
    rp.step_dir = dir;
    rp.manifest = verify_checkpoint(dir);
    return rp;
  }
  const auto steps = checkpoint_steps(dir);
  if (steps.empty())
    throw InputError("--resume '" + dir + "': no checkpoints (step-<k> directories) in it");
  if (take_first_verified(steps, rp)) return rp;
  std::string why;
  for (const auto& s : rp.skipped) why += "\n  " + s;
  throw InputError("--resume '" + dir + "': no complete checkpoint:" + why);
}

namespace {
// The blocks of each pipeline stage, as written and as the scenario cuts them: a stage's shard
// (its flat array) holds other tensors when they differ, so the checkpoint cannot be loaded.
void check_stage_layers(const CheckpointManifest& m, const Scenario& s, const std::string& where) {
  std::vector<int> written, now = model::stage_layer_counts(s);
  try {
    written = model::stage_layer_counts(m.layers, m.pp, m.pp_layers);
  } catch (const InputError& e) {
    throw InputError(where + ": the checkpoint's layout: " + e.what());
  }
  if (written == now) return;
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
    return out;
  };
  throw InputError(where + ": key 'parallel.pp_layers': the checkpoint was written with " +
                   "pp_layers=" + list(written) +
                   " (layers per pipeline stage), the scenario has " + list(now) +
                   " (resuming may change parallel.dp, parallel.zero and parallel.ep only)");
}

// model.moe against the manifest's record (the experts' count fixes the global flat array; the
// rest the parameters or the routing): a difference names the manifest file and the key. A
// manifest without the record (written before it existed) is left to restore_trainer's check of
// the flat array's size.
void check_moe_keys(const CheckpointManifest& m, const Scenario& s, const std::string& where) {
  if (!m.moe.recorded) return;  // a manifest from before the record: the flat sizes decide
  const MoeConfig& e = s.model.moe;
  const std::string file = m.path.empty() ? std::string("the checkpoint's manifest") : m.path;
  auto differ = [&](const char* key, int ckpt, int now) {
    if (ckpt == now) return;
    throw InputError(file + ": key '" + key + "': the checkpoint was written with " + key + "=" +
                     std::to_string(ckpt) + ", the scenario (" + where + ") has " +
                     std::to_string(now) +
                     " (the experts and their shape are the model's; parallel.ep may change)");
  };
  differ("model.moe.experts", m.moe.experts, e.experts);
  if (!e.enabled()) return;
  differ("model.moe.top_k", m.moe.top_k, e.top_k);
  differ("model.moe.every", m.moe.every, e.every);
  differ("model.moe.first_dense", m.moe.first_dense, e.first_dense);
  differ("model.moe.expert_ffn_hidden", m.moe.expert_ffn_hidden, e.expert_ffn_hidden);
  differ("model.moe.shared_experts", m.moe.shared_experts, e.shared_experts);
}
}  // namespace

void check_resume_compatible(const CheckpointManifest& m, const Scenario& s,
                             const std::string& where) {
  auto differ = [&](const char* key, int64_t ckpt, int64_t now, const char* extra) {
    if (ckpt == now) return;
    throw InputError(where + ": key '" + key + "': the checkpoint was written with " + key + "=" +
                     std::to_string(ckpt) + ", the scenario has " + std::to_string(now) + extra);
  };
  const char* layout = " (resuming may change parallel.dp, parallel.zero and parallel.ep only)";
  differ("parallel.tp", m.tp, s.parallel.tp, layout);
  differ("parallel.pp", m.pp, s.parallel.pp, layout);
  differ("model.layers", m.layers, s.model.layers, "");
  differ("model.d_model", m.d_model, s.model.d_model, "");
  differ("model.heads", m.heads, s.model.heads, "");
  differ("model.vocab", m.vocab, s.model.vocab, "");
  differ("model.seq", m.seq, s.model.seq, "");
  check_stage_layers(m, s, where);
  check_moe_keys(m, s, where);
  if (m.seed != s.training.seed) {
    throw InputError(where + ": key 'training.seed': the checkpoint was written with seed " +
                     std::to_string(m.seed) + ", the scenario has " +
                     std::to_string(s.training.seed) +
                     " (the seed fixes the data order, so a resumed run keeps it)");
  }
  if (m.data_source != s.data.source) {
    throw InputError(where + ": key 'data.source': the checkpoint was written with '" +
                     m.data_source + "', the scenario has '" + s.data.source + "'");
  }
  const int64_t g_new = static_cast<int64_t>(s.training.micro_batch) * s.parallel.dp;
  if (m.sequences_per_call > 0 && m.calls_per_epoch > 0 && g_new != m.sequences_per_call) {
    const int64_t within = (m.data_calls % m.calls_per_epoch) * m.sequences_per_call;
    if (within % g_new != 0) {
      throw InputError(where + ": key 'training.micro_batch': the checkpoint's data position (" +
                       std::to_string(within) +
                       " sequences into the epoch) is not a whole number of "
                       "micro-batches of micro_batch * dp = " +
                       std::to_string(g_new) + " sequences");
    }
  }
  if (m.step >= s.training.steps) {
    throw InputError(where + ": key 'training.steps': the checkpoint is at step " +
                     std::to_string(m.step) + " and training.steps is " +
                     std::to_string(s.training.steps) +
                     ": nothing left to run (raise training.steps)");
  }
}

// ---------------------------------------------------------------- reading

CheckpointReader::CheckpointReader(std::string step_dir, CheckpointManifest m)
    : dir_(std::move(step_dir)), m_(std::move(m)) {}

void CheckpointReader::read(int tp, int pp, Field field, uint64_t offset, uint64_t count,
                            float* dst) const {
  const uint64_t end = offset + count;
  uint64_t covered = 0;
  // Pieces of [offset, end) found so far, to tell a gap from a double.
  std::vector<std::pair<uint64_t, uint64_t>> got;
  for (const auto& f : m_.files) {
    if (f.tp != tp || f.pp != pp) continue;
    uint64_t file_pos = 0;
    int fd = -1;
    for (const auto& r : f.ranges) {
      const uint64_t lo = std::max(offset, r.offset), hi = std::min(end, r.offset + r.count);
      if (lo < hi && std::none_of(got.begin(), got.end(),
                                  [&](auto& g) { return lo < g.second && g.first < hi; })) {
        if (fd < 0) {
          const std::string p = (fs::path(dir_) / f.name).string();
          fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
          if (fd < 0)
            throw InputError("checkpoint '" + dir_ + "': cannot open '" + f.name +
                             "': " + errno_text());
        }
        const uint64_t at =
            file_pos + (static_cast<uint64_t>(field) * r.count + (lo - r.offset)) * sizeof(float);
        auto* out = reinterpret_cast<char*>(dst + (lo - offset));
        uint64_t left = (hi - lo) * sizeof(float), pos = at;
        while (left > 0) {
          const ssize_t n = ::pread(fd, out, left, static_cast<off_t>(pos));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            const std::string why = n < 0 ? errno_text() : "end of file";
            ::close(fd);
            throw InputError("checkpoint '" + dir_ + "': cannot read '" + f.name + "': " + why);
          }
          out += n;
          pos += static_cast<uint64_t>(n);
          left -= static_cast<uint64_t>(n);
        }
        got.emplace_back(lo, hi);
        covered += hi - lo;
      }
      file_pos += 12 * r.count;
    }
    if (fd >= 0) ::close(fd);
    if (covered == count) return;
  }
  if (covered != count) {
    throw InputError("checkpoint '" + dir_ + "': elements [" + std::to_string(offset) + ", " +
                     std::to_string(end) + ") of the tp=" + std::to_string(tp) +
                     " pp=" + std::to_string(pp) + " shard are not all in its files (" +
                     std::to_string(covered) + " of " + std::to_string(count) + " found)");
  }
}

namespace {

// `count` float32 from element `first` of the checkpoint's file `name` (verified before).
std::vector<float> read_floats(const std::string& step_dir, const std::string& name, uint64_t first,
                               uint64_t count) {
  std::vector<float> out(count);
  std::ifstream in(fs::path(step_dir) / name, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(first * sizeof(float)));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * sizeof(float)));
  if (!in) throw InputError("checkpoint '" + step_dir + "': cannot read '" + name + "'");
  return out;
}

// Why the checkpoint's compression state does not fit this run ("" when it does).
std::string compression_mismatch(const CheckpointManifest& m, const Scenario& s) {
  const CheckpointCompression& c = m.compression;
  if (c.scheme == "none") {
    return "the checkpoint holds no compression state (written with parallel.grad_compression "
           "none or dp 1)";
  }
  if (c.scheme != s.parallel.grad_compression)
    return "it was written with parallel.grad_compression " + c.scheme;
  if (c.scheme == "powersgd" && c.powersgd_rank != s.compression.powersgd_rank)
    return "it was written with compression.powersgd_rank " + std::to_string(c.powersgd_rank);
  if (c.scheme == "topk" && c.topk_ratio != s.compression.topk_ratio)
    return "it was written with compression.topk_ratio " + json(c.topk_ratio).dump();
  if (m.dp != s.parallel.dp) {
    return "it was written with parallel.dp " + std::to_string(m.dp) +
           " (residuals are each rank's unsent part of its own data shard)";
  }
  return "";
}

// This rank's compression state from the checkpoint when it fits (checkpoint.hpp: Resuming);
// otherwise the hook keeps its fresh state and a note says why.
void restore_compression(RankTrainer& trainer, const Scenario& s, const std::string& step_dir,
                         const CheckpointManifest& m, std::vector<std::string>& notes) {
  const std::optional<CompressionState> now = trainer.compression_state();
  if (!now) return;
  const Layout& L = trainer.layout();
  std::string why = compression_mismatch(m, s);
  const CheckpointStateFile* file = nullptr;
  for (const auto& f : m.compression.files) {
    if (f.tp == L.tp_rank && f.pp == L.pp_rank && f.dp == L.dp_rank) file = &f;
  }
  if (why.empty() && file == nullptr) why = "it holds no state file for this rank";
  if (why.empty() &&
      (file->residual_elems != now->residuals.size() || file->q_elems != now->q.size())) {
    why = "'" + file->name + "' holds " + std::to_string(file->residual_elems) + " residuals and " +
          std::to_string(file->q_elems) + " Q values, this run's hook " +
          std::to_string(now->residuals.size()) + " and " + std::to_string(now->q.size()) +
          " (another bucket layout: parallel.bucket_mb or parallel.zero)";
  }
  if (!why.empty()) {
    notes.push_back("checkpoint '" + step_dir +
                    "': parallel.grad_compression: the error-feedback residuals start at zero" +
                    (now->q.empty() ? "" : " and PowerSGD's Q from its seed") + ": " + why);
    return;
  }
  CompressionState st;
  st.residuals = read_floats(step_dir, file->name, 0, file->residual_elems);
  st.q = read_floats(step_dir, file->name, file->residual_elems, file->q_elems);
  trainer.restore_compression_state(st);
}

// fp16's loss scaler from the manifest; without one it starts at training.loss_scale.
void restore_loss_scaler(RankTrainer& trainer, const std::string& step_dir,
                         const CheckpointManifest& m, std::vector<std::string>& notes) {
  if (!trainer.loss_scaler_state()) return;
  const CheckpointLossScaler& ls = m.loss_scaler;
  if (ls.recorded) {
    trainer.restore_loss_scaler({ls.scale, ls.clean_steps, ls.skipped_steps});
  } else {
    notes.push_back("checkpoint '" + step_dir +
                    "': runtime.precision fp16: the checkpoint holds no loss scaler state "
                    "(written without fp16); the scale starts at training.loss_scale");
  }
}

}  // namespace

std::vector<std::string> restore_trainer(RankTrainer& trainer, const Scenario& s,
                                         const std::string& step_dir, const CheckpointManifest& m) {
  check_resume_compatible(m, s, s.path.empty() ? std::string("scenario") : s.path);
  const Layout& L = trainer.layout();
  const std::size_t elems = trainer.checkpoint_elems();  // global coordinates
  for (const auto& f : m.files) {
    if (f.tp == L.tp_rank && f.pp == L.pp_rank && f.flat_elems != elems) {
      throw InputError("checkpoint '" + step_dir + "': '" + f.name + "' holds a flat array of " +
                       std::to_string(f.flat_elems) + " elements, this rank's shard has " +
                       std::to_string(elems) + " (another model)");
    }
  }
  CheckpointReader reader(step_dir, m);
  using F = CheckpointReader::Field;
  const std::vector<FlatRun> runs = trainer.checkpoint_runs();
  for (const auto& range : trainer.state_to_load()) {
    for (const auto& [g, r] : global_pieces(range, runs)) {
      if (r.params) reader.read(L.tp_rank, L.pp_rank, F::Params, g, r.count, r.params);
      if (r.m) reader.read(L.tp_rank, L.pp_rank, F::M, g, r.count, r.m);
      if (r.v) reader.read(L.tp_rank, L.pp_rank, F::V, g, r.count, r.v);
    }
  }
  trainer.commit_loaded_state();  // a device copies the state in
  // The data position in global sequences, mapped onto this run's sequences per call.
  const DataLoader& ld = trainer.loader();
  int64_t calls = m.data_calls;
  if (m.sequences_per_call != ld.sequences_per_call() && m.calls_per_epoch > 0) {
    const int64_t epoch = m.data_calls / m.calls_per_epoch;
    const int64_t within = (m.data_calls % m.calls_per_epoch) * m.sequences_per_call;
    calls = epoch * ld.calls_per_epoch() + within / ld.sequences_per_call();
  }
  trainer.restore_counters(m.step, m.adamw_steps, calls);
  std::vector<std::string> notes;
  restore_compression(trainer, s, step_dir, m, notes);
  restore_loss_scaler(trainer, step_dir, m, notes);
  return notes;
}

// ---------------------------------------------------------------- the session

struct CheckpointSession::Pending {
  int32_t step = 0;
  int64_t adamw_steps = 0;  // at the snapshot (a background write completes a step later)
  std::string step_dir;
  CheckpointFile file;        // this rank's (name "" when it writes none)
  CheckpointStateFile state;  // its compression state file (name "" without compression)
  CompressionState cstate;    // copied at the snapshot: the next step changes the hook's
  std::optional<LossScalerState> scaler;  // at the snapshot (the same on every rank)
  std::vector<float> buffer;              // background: the snapshot
  std::vector<ConstPiece> pieces;
  std::thread thread;
  std::exception_ptr error;
  int64_t write_ns = 0;
  int64_t started_ns = 0;
};

CheckpointSession::CheckpointSession(const Scenario& s, RankTrainer& trainer, Communicator& world,
                                     profiler::Recorder* rec, std::string dir)
    : s_(s),
      trainer_(trainer),
      world_(world),
      rec_(rec && rec->enabled() ? rec : nullptr),
      dir_(std::move(dir)) {
  if (rec_ && s_.checkpoint.every > 0 && s_.checkpoint.background)
    rec_->add_stream(kCheckpointStream, std::string(model::names::stream_name(kCheckpointStream)));
}

CheckpointSession::~CheckpointSession() {
  if (pending_ && pending_->thread.joinable()) pending_->thread.join();
}

namespace {
traces::Span phase(profiler::Recorder* rec, const char* name) {
  traces::Span sp;
  sp.kind = traces::SpanKind::Phase;
  if (rec) sp.name = rec->intern(name);
  return sp;
}
}  // namespace

void CheckpointSession::after_step() {
  if (s_.checkpoint.every <= 0) return;
  const int32_t done = trainer_.steps_done();
  const bool due = done % s_.checkpoint.every == 0;
  if (!pending_ && !due) return;
  profiler::ScopedSpan span(rec_, phase(rec_, "checkpoint.save"));
  const int64_t t0 = profiler::steady_now_ns();
  if (pending_) {  // the previous background write: it overlapped this step
    complete(*pending_);
    pending_.reset();
  }
  if (due) {
    snapshot_and_write();
    if (!s_.checkpoint.background) {
      complete(*pending_);
      pending_.reset();
    }
  }
  stats_.blocking_ns += profiler::steady_now_ns() - t0;
}

void CheckpointSession::finish() {
  if (!pending_) return;
  profiler::ScopedSpan span(rec_, phase(rec_, "checkpoint.save"));
  const int64_t t0 = profiler::steady_now_ns();
  complete(*pending_);
  pending_.reset();
  stats_.blocking_ns += profiler::steady_now_ns() - t0;
}

void CheckpointSession::snapshot_and_write() {
  auto p = std::make_unique<Pending>();
  p->step = trainer_.steps_done();
  p->adamw_steps = trainer_.adamw_steps();
  p->step_dir = checkpoint_step_dir(dir_, p->step);
  const Layout& L = trainer_.layout();
  std::error_code ec;
  fs::create_directories(p->step_dir, ec);
  if (ec)
    throw InputError("key 'checkpoint.dir': cannot create '" + p->step_dir + "': " + ec.message());
  // A checkpoint of this step written before (a run resumed from an earlier one) stops being complete
  // now; its files are replaced below.
  if (world_.rank() == 0) fs::remove(fs::path(p->step_dir) / kManifest, ec);

  // In global coordinates: a range that crosses into another expert's place is cut there.
  const std::vector<FlatRun> runs = trainer_.checkpoint_runs();
  std::vector<StateRange> ranges;
  std::vector<uint64_t> global;
  for (const StateRange& r : trainer_.state_to_save()) {
    for (const auto& [g, piece] : global_pieces(r, runs)) {
      ranges.push_back(piece);
      global.push_back(g);
    }
  }
  p->file.tp = L.tp_rank;
  p->file.pp = L.pp_rank;
  p->file.dp = L.dp_rank;
  p->file.flat_elems = trainer_.checkpoint_elems();
  p->file.data_calls = trainer_.loader().position();
  if (!ranges.empty()) {
    p->file.name = "tp" + std::to_string(L.tp_rank) + "-pp" + std::to_string(L.pp_rank) + "-dp" +
                   std::to_string(L.dp_rank) + ".bin";
    for (std::size_t i = 0; i < ranges.size(); ++i)
      p->file.ranges.push_back({global[i], ranges[i].count});
    if (s_.checkpoint.background) {
      // Copy now: the next step changes the parameters and moments while the thread writes.
      size_t total = 0;
      for (const auto& r : ranges) total += 3 * r.count;
      p->buffer.resize(total);
      float* out = p->buffer.data();
      for (const auto& r : ranges) {
        for (const float* src : {static_cast<const float*>(r.params),
                                 static_cast<const float*>(r.m), static_cast<const float*>(r.v)}) {
          std::copy(src, src + r.count, out);
          out += r.count;
        }
      }
      p->pieces.push_back({p->buffer.data(), p->buffer.size() * sizeof(float)});
    } else {
      for (const auto& r : ranges) {
        p->pieces.push_back({r.params, r.count * sizeof(float)});
        p->pieces.push_back({r.m, r.count * sizeof(float)});
        p->pieces.push_back({r.v, r.count * sizeof(float)});
      }
    }
  }
  p->scaler = trainer_.loss_scaler_state();
  if (auto cs = trainer_.compression_state()) {
    p->cstate = std::move(*cs);
    const std::string name = "tp" + std::to_string(L.tp_rank) + "-pp" + std::to_string(L.pp_rank) +
                             "-dp" + std::to_string(L.dp_rank) + ".compression.bin";
    p->state = {name,
                0,
                0,
                L.tp_rank,
                L.pp_rank,
                L.dp_rank,
                p->cstate.residuals.size(),
                p->cstate.q.size()};
  }
  Pending* pp = p.get();
  auto write = [pp]() {
    try {
      const int64_t t0 = profiler::steady_now_ns();
      if (!pp->state.name.empty()) {
        const auto& cs = pp->cstate;
        const WrittenFile w =
            write_file_atomic((fs::path(pp->step_dir) / pp->state.name).string(),
                              {{cs.residuals.data(), cs.residuals.size() * sizeof(float)},
                               {cs.q.data(), cs.q.size() * sizeof(float)}});
        pp->state.bytes = w.bytes;
        pp->state.crc32c = w.crc32c;
      }
      if (!pp->file.name.empty()) {
        const WrittenFile w =
            write_file_atomic((fs::path(pp->step_dir) / pp->file.name).string(), pp->pieces);
        pp->file.bytes = w.bytes;
        pp->file.crc32c = w.crc32c;
      }
      pp->write_ns = profiler::steady_now_ns() - t0;
    } catch (...) {
      pp->error = std::current_exception();
    }
  };
  if (s_.checkpoint.background) {
    profiler::Recorder* rec = rec_;
    pp->thread = std::thread([write, rec, pp]() {
      profiler::Recorder::set_thread_stream(kCheckpointStream);
      traces::Span sp = phase(rec, "checkpoint.write");
      sp.step = pp->step - 1;
      profiler::ScopedSpan span(rec, sp);
      write();
    });
  } else {
    write();
  }
  pending_ = std::move(p);
}

// Joins the write, gathers every rank's file entry, rank 0 writes the manifest; then the checkpoint
// is complete on every rank (barrier).
void CheckpointSession::complete(Pending& p) {
  if (p.thread.joinable()) p.thread.join();
  if (p.error) std::rethrow_exception(p.error);
  stats_.write_ns += p.write_ns;
  // This rank's record: {"file": ..., "state": ...}, each only when written ("" when neither).
  json record = json::object();
  if (!p.file.name.empty()) record["file"] = file_to_json(p.file);
  if (!p.state.name.empty()) record["state"] = state_file_to_json(p.state);
  const std::string mine = record.empty() ? std::string() : record.dump();
  const OpLabel label{"checkpoint.gather", -1, -1, -1};
  int64_t len = static_cast<int64_t>(mine.size());
  world_.all_reduce(&len, 1, DType::I64, ReduceOp::Max, label).wait();
  std::vector<char> send(static_cast<size_t>(len), ' '),
      all(static_cast<size_t>(len) * static_cast<size_t>(world_.size()));
  std::copy(mine.begin(), mine.end(), send.begin());
  if (len > 0)
    world_.all_gather(send.data(), all.data(), static_cast<size_t>(len), DType::U8, label).wait();

  CheckpointManifest m;
  m.scenario = s_.name;
  m.step = p.step;
  m.adamw_steps = p.adamw_steps;
  m.dp = s_.parallel.dp;
  m.tp = s_.parallel.tp;
  m.pp = s_.parallel.pp;
  m.ep = trainer_.layout().ep;
  const MoeConfig& e = s_.model.moe;
  m.moe = {true, e.experts, e.top_k, e.every, e.first_dense, e.expert_ffn_hidden, e.shared_experts};
  m.pp_layers = model::stage_layer_counts(s_);
  m.zero = s_.parallel.zero;
  m.layers = s_.model.layers;
  m.d_model = s_.model.d_model;
  m.heads = s_.model.heads;
  m.vocab = s_.model.vocab;
  m.seq = s_.model.seq;
  m.seed = s_.training.seed;
  m.data_source = s_.data.source;
  m.data_calls =
      p.file.data_calls;  // world rank 0 (a first stage: it loads data) is the one that writes
  m.sequences_per_call = trainer_.loader().sequences_per_call();
  m.calls_per_epoch = trainer_.loader().calls_per_epoch();
  for (int r = 0; r < world_.size(); ++r) {
    std::string rec(all.begin() + static_cast<std::ptrdiff_t>(r) * len,
                    all.begin() + static_cast<std::ptrdiff_t>(r + 1) * len);
    while (!rec.empty() && rec.back() == ' ') rec.pop_back();
    if (rec.empty()) continue;
    const json jr = json::parse(rec);
    const std::string origin = "checkpoint record of rank " + std::to_string(r);
    if (jr.contains("file")) {
      m.files.push_back(file_from_json(jr.at("file"), origin));
      stats_.bytes += m.files.back().bytes;
    }
    if (jr.contains("state")) {
      m.compression.files.push_back(state_file_from_json(jr.at("state"), origin));
      stats_.bytes += m.compression.files.back().bytes;
    }
  }
  if (!m.compression.files.empty()) {
    m.compression.scheme = s_.parallel.grad_compression;
    m.compression.powersgd_rank = s_.compression.powersgd_rank;
    m.compression.topk_ratio = s_.compression.topk_ratio;
    m.compression.start_step = s_.compression.start_step;
  }
  if (p.scaler) {
    m.loss_scaler = {true, p.scaler->scale, p.scaler->clean_steps, p.scaler->skipped_steps};
  }
  if (world_.rank() == 0) {
    const std::string text = manifest_to_json(m);
    write_file_atomic((fs::path(p.step_dir) / kManifest).string(), {{text.data(), text.size()}});
  }
  world_.barrier(label).wait();
  ++stats_.saves;
  stats_.written.push_back(p.step_dir);
  if (s_.faults.kill_after_step >= 0 && p.step == s_.faults.kill_after_step) {
    std::fflush(nullptr);
    ::raise(SIGKILL);  // test-only: the job dies as a killed one does, the checkpoint complete
  }
}

}  // namespace orrery::runtime
