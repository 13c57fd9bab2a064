// Launching a run: mpirun re-launch, one rank's run with its per-rank trace and the merge, and
// what is left of a run that failed (salvage_failed_run).
#include "orrery/runtime/launch.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "orrery/common/error.hpp"
#include "orrery/common/slurm.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/profiler/flight_recorder.hpp"
#include "orrery/profiler/ranges.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/elastic.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {
namespace fs = std::filesystem;

namespace {

bool is_executable(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

volatile sig_atomic_t g_child_pid = 0;
void forward_signal(int sig) {
  if (g_child_pid > 0) ::kill(g_child_pid, sig);
}

// A step's spans and this rank's progress on disk: a rank killed without warning keeps every span
// up to its last completed step (and the periodic flush's, within the step).
void save_progress(profiler::Recorder& rec, int next_step) {
  rec.flush();
  auto& fr = profiler::FlightRecorder::instance();
  fr.set_status(profiler::RankState::Running, next_step);
  fr.save();
}

std::string rank_list_text(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return (ranks.size() == 1 ? "rank " : "ranks ") + s;
}

// Rank 0 chooses the default output path (it holds a timestamp) and tells the others.
std::string agree_on_path(Communicator& world, const std::string& mine) {
  if (world.size() == 1) return mine;
  constexpr size_t kMax = 4096;
  std::vector<char> buf(kMax, 0);
  if (world.rank() == 0) std::strncpy(buf.data(), mine.c_str(), kMax - 1);
  world.broadcast(buf.data(), kMax, DType::U8, 0, OpLabel{"launch.out_path"}).wait();
  return std::string(buf.data());
}

}  // namespace

std::string find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return is_executable(name) ? name : "";
  const char* path = std::getenv("PATH");
  if (!path) return "";
  std::string dirs(path);
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    if (is_executable(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

std::string self_executable() {
  std::error_code ec;
  const auto p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw InternalError("cannot find this program's path (/proc/self/exe): " + ec.message());
  return p.string();
}

MpirunOptions mpirun_options_for(int nproc) {
  MpirunOptions o;
  o.nproc = nproc;
  const unsigned cores = std::thread::hardware_concurrency();
  o.oversubscribe = cores == 0 || static_cast<unsigned>(nproc) > cores;
  o.allow_run_as_root = ::geteuid() == 0;
  return o;
}

std::vector<std::string> mpirun_command(const std::string& mpirun, const MpirunOptions& opt,
                                        const std::vector<std::string>& program) {
  std::vector<std::string> cmd{mpirun, "-n", std::to_string(opt.nproc)};
  if (opt.oversubscribe) cmd.push_back("--oversubscribe");
  if (opt.allow_run_as_root) cmd.push_back("--allow-run-as-root");
  if (!opt.hostfile.empty()) cmd.insert(cmd.end(), {"--hostfile", opt.hostfile});
  for (const auto& name : opt.export_env) cmd.insert(cmd.end(), {"-x", name});
  cmd.insert(cmd.end(), {"--bind-to", "none"});
  cmd.insert(cmd.end(), program.begin(), program.end());
  return cmd;
}

int run_and_wait(const std::vector<std::string>& argv) {
  if (argv.empty()) throw InternalError("run_and_wait: empty command");
  // When a rank dies, mpirun sends the others SIGTERM and SIGKILL this long after (default 1 s):
  // time for them to write their buffered spans (a user's own setting wins).
  ::setenv("OMPI_MCA_odls_base_sigkill_timeout", "5", 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw InternalError(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "orrery: cannot start %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  g_child_pid = pid;
  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      status = -1;
      break;
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  g_child_pid = 0;
  if (status == -1) throw InternalError(std::string("waitpid failed: ") + std::strerror(errno));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string rank_trace_path(const std::string& out, int rank) {
  return out + ".rank" + std::to_string(rank) + ".db";
}

std::string default_trace_path(const std::string& scenario_name) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  return "out/" + (scenario_name.empty() ? std::string("run") : scenario_name) + "-" + stamp +
         ".db";
}

std::string agree_on_trace_path(Communicator& world, const Scenario& s,
                                const std::string& requested) {
  return agree_on_path(world, requested.empty() ? default_trace_path(s.name) : requested);
}

std::unique_ptr<traces::TraceWriter> open_rank_trace(const std::string& out, int rank) {
  const std::string rank_file = rank_trace_path(out, rank);
  const fs::path parent = fs::path(out).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  auto writer = std::make_unique<traces::TraceWriter>(rank_file);
  // Flight records go into the rank's file every 200 ms, so they survive an abort.
  profiler::FlightRecorder::instance().set_dump_path(rank_file);
  return writer;
}

traces::RunMeta real_run_meta(const Scenario& s, const Layout& lay, int world_size) {
  traces::RunMeta meta;
  meta.source = traces::TraceSource::Real;
  meta.origin = traces::TraceOrigin::Run;
  meta.layout.zero = s.parallel.zero;
  meta.layout.micro_batches = s.micro_batches_per_step();
  meta.layout.schedule = s.parallel.schedule;
  meta.layout.placement = s.parallel.placement;
  meta.layout.recompute = s.training.recompute;
  meta.layout.device = s.runtime.device;
  meta.layout.precision = s.runtime.precision;
  meta.scenario_text = s.text;
  meta.scenario_name = s.name;
  meta.host = host_name();
  meta.start_time_unix_ns = unix_now_ns();
  meta.world_size = world_size;
  meta.dp = lay.dp;
  meta.tp = lay.tp;
  meta.pp = lay.pp;
  meta.tokens_per_step = static_cast<int64_t>(s.training.global_batch) * s.model.seq;
  meta.model_flops_per_step =
      flops::model_step(flops::dims_of(s.model, s.training.global_batch), s.model.layers);
  return meta;
}

traces::RankInfo real_rank_info(const Layout& lay, int rank, const std::string& host,
                                const std::string& device) {
  traces::RankInfo ri;
  ri.rank = rank;
  ri.host = host;
  ri.device = device;
  ri.dp = lay.dp_rank;
  ri.tp = lay.tp_rank;
  ri.pp = lay.pp_rank;
  return ri;
}

void reduce_step_reports(RankRunResult& result, Communicator& dp_group, Communicator& world) {
  // One all-reduce each at the end, so the steps' traces hold only the training's own communication.
  result.mean_loss.resize(result.steps.size());
  result.max_duration_ns.resize(result.steps.size());
  for (size_t i = 0; i < result.steps.size(); ++i) {
    result.mean_loss[i] = result.steps[i].loss;
    result.max_duration_ns[i] = result.steps[i].duration_ns;
  }
  if (result.steps.empty()) return;
  dp_group
      .all_reduce(result.mean_loss.data(), result.mean_loss.size(), DType::F32, ReduceOp::Avg,
                  OpLabel{"report.loss"})
      .wait();
  world
      .all_reduce(result.max_duration_ns.data(), result.max_duration_ns.size(), DType::I64,
                  ReduceOp::Max, OpLabel{"report.step_time"})
      .wait();
}

std::string merge_rank_traces(Communicator& world, const std::string& out) {
  // Every rank's file is complete before rank 0 merges.
  world.barrier().wait();
  if (world.rank() != 0) return out;
  std::vector<std::string> inputs;
  for (int r = 0; r < world.size(); ++r) inputs.push_back(rank_trace_path(out, r));
  std::error_code ec;
  fs::remove(out, ec);
  traces::merge_traces(inputs, out);
  for (const auto& f : inputs) {
    fs::remove(f, ec);
    fs::remove(f + "-wal", ec);
    fs::remove(f + "-shm", ec);
  }
  return out;
}

RankSession::RankSession(const Scenario& s, Communicator& world, const RankRunOptions& opt)
    : s_(s), opt_(opt), world_(world), out_(agree_on_trace_path(world, s, opt.out)) {
  result_.rank = world.rank();
  result_.world_size = world.size();
  // Per-rank trace file, written while the run goes.
  if (opt.profile) writer_ = open_rank_trace(out_, world.rank());
  rec_ = std::make_unique<profiler::Recorder>(writer_.get(), world.rank());
  rec_->start_periodic_flush(std::chrono::milliseconds(500));  // bounds what a SIGKILL loses
  profiler::Recorder::set_current(rec_.get());
  world.set_recorder(rec_.get());
}

RankSession::~RankSession() {
  world_.set_recorder(nullptr);
  profiler::Recorder::set_current(nullptr);
}

void RankSession::describe(const traces::RunMeta& meta, const traces::RankInfo& rank) {
  if (!writer_) return;
  std::unique_lock file(profiler::trace_file_mutex());  // the flight recorder writes too
  writer_->set_meta(meta);
  writer_->add_rank(rank);
  file.unlock();
  rec_->add_stream(profiler::kComputeStream, "compute");
}

void RankSession::start_steps(int first) { save_progress(*rec_, first); }

void RankSession::before_step(int i) const {
  if (i == s_.faults.step && world_.rank() == s_.faults.kill_rank) ::raise(SIGKILL);
}

void RankSession::after_step(int i, const StepResult& r) {
  result_.steps.push_back(r);
  save_progress(*rec_, i + 1);
  if (opt_.on_step) opt_.on_step(r);
}

void RankSession::reduce_reports(Communicator& dp_group) {
  reduce_step_reports(result_, dp_group, world_);
}

void RankSession::end_steps(const std::function<void()>& before_close) {
  world_.set_recorder(nullptr);
  world_.synchronize();
  if (before_close) before_close();
}

RankRunResult RankSession::finish() {
  if (writer_) {
    profiler::FlightRecorder::instance().set_dump_path("");  // last write, before close()
    rec_->flush();
    writer_->close();
    result_.trace_path = merge_rank_traces(world_, out_);
  }
  return result_;
}

RankRunResult run_rank(const Scenario& s, Communicator& world, const RankRunOptions& opt,
                       const TrainerFactory& make) {
  RankSession session(s, world, opt);
  profiler::Recorder& rec = session.recorder();
  RankRunResult& result = session.result();

  std::unique_ptr<RankTrainer> owned =
      make ? make(s, world, &rec) : std::make_unique<Trainer>(s, world, &rec);
  RankTrainer& trainer = *owned;
  const Layout& lay = trainer.layout();
  result.tokens_per_step = static_cast<int64_t>(s.training.global_batch) * s.model.seq;
  result.params =
      static_cast<int64_t>(trainer.flat_elems());  // this rank's shard, without ZeRO padding

  if (session.profiling()) {
    traces::RunMeta meta = real_run_meta(s, lay, world.size());
    if (trainer.peak_flops_per_rank() > 0) meta.peak_flops_per_rank = trainer.peak_flops_per_rank();
    meta.layout.micro_batches = trainer.micro_batches();
    nlohmann::json extra = trainer.meta_fields();
    extra["ddp_buckets"] = trainer.buckets().size();
    extra["params"] = result.params;
    // The steps the run's own summary leaves out (cli/cmd_run.cpp), the report's default.
    extra["warmup_steps"] = std::max(0, std::min(s.training.warmup_steps, s.training.steps - 1));
    // An elastic job's attempts so far (this one last), as the launcher told them.
    const auto attempts = attempts_from_env();
    if (!attempts.empty()) extra["attempts"] = nlohmann::json::parse(attempts_to_json(attempts));
    // The Slurm job the ranks ran in (srun, or mpirun inside an allocation).
    if (const auto job = slurm_job()) extra["slurm"] = nlohmann::json::parse(slurm_json(*job));
    meta.extra_json = extra.dump();
    session.describe(meta,
                     real_rank_info(lay, world.rank(), meta.host, trainer.device_description()));
    trainer.start_device_tracing(rec);
  }

  // Checkpoints: checkpoint.dir, else next to the checkpoint resumed from, else "checkpoints".
  const std::string ckpt_dir = !s.checkpoint.dir.empty() ? s.checkpoint.dir
                               : opt.resume.empty()      ? std::string("checkpoints")
                                                    : fs::path(opt.resume).parent_path().string();
  CheckpointSession ckpt(s, trainer, world, &rec, ckpt_dir);
  if (!opt.resume.empty()) {
    // State the checkpoint could not give this run (checkpoint.hpp: Resuming), said once.
    const auto notes = restore_trainer(trainer, s, opt.resume, verify_checkpoint(opt.resume));
    for (const auto& n : notes) {
      if (world.rank() == 0) std::fprintf(stderr, "orrery run: note: %s\n", n.c_str());
    }
  }
  trainer.prepare();
  session.start_steps(0);
  const int64_t loop_t0 = profiler::steady_now_ns();
  for (int i = trainer.steps_done(); i < s.training.steps; ++i) {
    session.before_step(i);
    session.after_step(i, trainer.step());
    ckpt.after_step();
  }
  ckpt.finish();
  result.loop_ns = profiler::steady_now_ns() - loop_t0;
  result.checkpoint = ckpt.stats();

  // Reports over the host communicators (host buffers).
  session.reduce_reports(trainer.dp_group());
  trainer.finish();
  session.end_steps([&] { trainer.stop_device_tracing(); });
  return session.finish();
}

namespace {
std::map<Device, DeviceRunner>& device_runners() {
  static std::map<Device, DeviceRunner> runners;  // built before the first registration
  return runners;
}
}  // namespace

void register_device_runner(Device device, DeviceRunner runner) {
  device_runners()[device] = std::move(runner);
}

bool has_device_runner(Device device) { return device_runners().count(device) > 0; }

void check_supported_on_device(const Scenario& s) {
  // Issue 18 item 1: the compression hooks (ddp_compression.hpp) run on the host; on a device over a
  // host copy of the gradients with their collectives on the dp group's host communicator (MPI).
  // The process's one MPI thread runs collectives one at a time in issue order (mpi_comm.cpp), and
  // a device's host-staged communicators (ranks sharing a GPU, comm_backend mpi, 1F1B's pipeline)
  // issue to it from their own thread: with tp, pp or MoE blocks (their all-reduces, transfers and
  // all-to-alls during the backward) the two threads' collectives could reach it in orders that
  // differ between ranks and wait on each other. So on a device the hook runs with dp (and ZeRO 1)
  // only, where no other collective is in flight while it runs.
  // The vocabulary-parallel head is a simulator key (common/scenario.hpp): the runtime keeps the
  // embedding and LM head whole on every tp rank, so running it would not be the run it describes.
  if (s.parallel.vocab_parallel) {
    throw InputError(s.path +
                     ": key 'parallel.vocab_parallel': orrery run keeps the embedding and LM head "
                     "whole on every tp rank; the vocabulary-parallel head is simulated only "
                     "(orrery sim), set it to false to run");
  }
  if (s.parallel.grad_compression != "none" && device_of(s.runtime) != orrery::Device::Cpu &&
      (s.parallel.tp > 1 || s.parallel.pp > 1 || s.model.moe.enabled())) {
    throw InputError((s.path.empty() ? std::string("scenario") : s.path) +
                     ": key 'parallel.grad_compression': '" + s.parallel.grad_compression +
                     "' on runtime.device " + s.runtime.device +
                     " runs with data parallelism only (parallel.tp 1, parallel.pp 1, no "
                     "model.moe), got tp " +
                     std::to_string(s.parallel.tp) + ", pp " + std::to_string(s.parallel.pp) +
                     ", moe.experts " + std::to_string(s.model.moe.experts) +
                     "; use device cpu for those");
  }
  // Offload (issue 18 item 3) runs on both devices: the optimizer's (host or nvme) and ZeRO 3's
  // parameter shards in the file (offload_params; on a device each shard is uploaded through pinned
  // memory before its gather). What the scenario refuses (offload_params without ZeRO 3 or without
  // offload_optimizer nvme, host offload on the CPU) it refused when it was read.
  const auto it = device_runners().find(device_of(s.runtime));
  if (it == device_runners().end()) {
    check_supported(s);
  } else {
    it->second.check_supported(s);
  }
}

RankRunResult run_rank_on_device(const Scenario& s, Communicator& world,
                                 const RankRunOptions& opt) {
  const auto it = device_runners().find(device_of(s.runtime));
  if (it == device_runners().end()) return run_rank(s, world, opt);
  return run_rank(s, world, opt, it->second.make_trainer);
}

FailedRun salvage_failed_run(const std::string& out, int nproc, int exit_status) {
  FailedRun f;
  std::vector<std::string> files;
  std::vector<int> lost, stopped;
  std::vector<std::string> failed;  // "rank 0 failed (exit 1)"
  int lost_step = -1, latest_step = -1;
  for (int r = 0; r < nproc; ++r) {
    const std::string path = rank_trace_path(out, r);
    std::optional<profiler::RankStatus> st;
    if (fs::exists(path)) {
      files.push_back(path);
      try {
        for (const auto& row : profiler::read_rank_status(path)) {
          if (row.rank == r) st = row;
        }
      } catch (const std::exception&) {
        // An unreadable status reads as a rank that said nothing: lost.
      }
    }
    if (st) latest_step = std::max(latest_step, st->step);
    if (!st || st->state == profiler::RankState::Running) {
      lost.push_back(r);
      if (st && st->step >= 0 && (lost_step < 0 || st->step < lost_step)) lost_step = st->step;
    } else if (st->state == profiler::RankState::Failed) {
      failed.push_back("rank " + std::to_string(r) + " failed (" + st->detail + ")");
    } else {
      stopped.push_back(r);
    }
  }
  // The step the run was in: the lost rank's (its last saved progress), else the latest.
  const int step = lost_step >= 0 ? lost_step : latest_step;
  if (files.empty()) return f;  // nothing was recorded (bad input, or --no-profile)

  std::vector<std::string> parts;
  if (!lost.empty()) {
    std::string how = exit_status > 128 ? "killed by signal " + std::to_string(exit_status - 128)
                                        : "ended without saying why";
    parts.push_back(rank_list_text(lost) + (lost.size() == 1 ? " was" : " were") + " lost (" + how +
                    ")" + (step >= 0 ? " during step " + std::to_string(step) : " in set-up"));
  } else {
    parts.push_back("the run failed" + (step >= 0 ? " during step " + std::to_string(step)
                                                  : std::string(" in set-up")));
  }
  for (const auto& x : failed) parts.push_back(x);
  if (!stopped.empty()) parts.push_back(rank_list_text(stopped) + " stopped");
  for (size_t i = 0; i < parts.size(); ++i) f.message += (i ? "; " : "") + parts[i];
  f.lost_ranks = lost;
  f.step = step;

  // The remains, merged as a finished run's are, with the failure's account in the metadata.
  try {
    std::error_code ec;
    fs::remove(out, ec);
    traces::merge_traces(files, out);  // carries flight_records and rank_status over too
    std::vector<int32_t> lost32(lost.begin(), lost.end());
    profiler::mark_trace_failed(out, lost32, f.message, step);
    for (const auto& file : files) {
      fs::remove(file, ec);
      fs::remove(file + "-wal", ec);
      fs::remove(file + "-shm", ec);
    }
    f.trace = out;
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(out, ec);  // no half-merged file that looks whole; the per-rank files stay
    f.merge_error = e.what();
  }
  return f;
}

}  // namespace orrery::runtime
