// One rank's run on a CUDA device (see gpu_run.hpp); follows runtime::run_rank (launch.cpp).
#include "orrery/runtime/cuda/gpu_run.hpp"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "orrery/profiler/flight_recorder.hpp"
#if ORRERY_HAVE_CUPTI_TRACER
#include "orrery/profiler/cupti_tracer.hpp"
#endif
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/nccl_comm.hpp"
#include "orrery/runtime/flops.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime::cuda {
namespace fs = std::filesystem;

namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
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

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

}  // namespace

double peak_flops(const DeviceInfo& d, MathMode m) {
  const int i = m == MathMode::kFp32 ? 0 : m == MathMode::kTf32 ? 1 : 2;
  if (d.cc_major == 8 && d.cc_minor == 0) return std::array<double, 3>{19.5e12, 156e12, 312e12}[i];
  if (d.cc_major == 9 && d.cc_minor == 0) return std::array<double, 3>{67e12, 494.7e12, 989.4e12}[i];
  return 0.0;
}

RankRunResult run_rank_cuda(const Scenario& s, Communicator& world, const RankRunOptions& opt,
                            const CudaRunOptions& copt) {
  check_supported_cuda(s);
  RankRunResult result;
  result.rank = world.rank();
  result.world_size = world.size();
  const std::string out = agree_on_path(world, opt.out.empty() ? default_trace_path(s.name) : opt.out);

  std::unique_ptr<traces::TraceWriter> writer;
  const std::string rank_file = rank_trace_path(out, world.rank());
  if (opt.profile) {
    const fs::path parent = fs::path(out).parent_path();
    std::error_code ec;
    if (!parent.empty()) fs::create_directories(parent, ec);
    writer = std::make_unique<traces::TraceWriter>(rank_file);
    profiler::FlightRecorder::instance().set_dump_path(rank_file);
  }
  profiler::Recorder rec(writer.get(), world.rank());
  profiler::Recorder::set_current(&rec);
  world.set_recorder(&rec);
  struct Detach {
    Communicator& w;
    ~Detach() {
      w.set_recorder(nullptr);
      profiler::Recorder::set_current(nullptr);
      profiler::FlightRecorder::instance().set_dump_path("");
    }
  } detach{world};

  GpuTrainer trainer(s, world, &rec, copt);
  const Layout& lay = trainer.layout();
  const DeviceInfo& dev = trainer.device();
  result.tokens_per_step = static_cast<int64_t>(s.training.global_batch) * s.model.seq;
  result.params = static_cast<int64_t>(trainer.model().num_params());

  if (writer) {
    traces::RunMeta meta;
    meta.source = traces::TraceSource::Real;
    meta.scenario_text = s.text;
    meta.scenario_name = s.name;
    meta.host = host_name();
    meta.start_time_unix_ns = unix_now_ns();
    meta.world_size = world.size();
    meta.dp = lay.dp;
    meta.tp = lay.tp;
    meta.pp = lay.pp;
    meta.tokens_per_step = result.tokens_per_step;
    flops::Dims d;
    d.batch = s.training.global_batch;
    d.seq = s.model.seq;
    d.d_model = s.model.d_model;
    d.vocab = s.model.vocab;
    meta.model_flops_per_step = flops::model_step(d, s.model.layers);
    meta.peak_flops_per_rank = peak_flops(dev, copt.math);
    meta.extra_json = "{\"device\": \"" + json_escape(dev.name) + "\", \"precision\": \"" +
                      math_mode_name(copt.math) + "\", \"comm_backend\": \"" + trainer.comm_backend() +
                      "\", \"micro_batches\": " + std::to_string(trainer.micro_batches()) +
                      ", \"ddp_buckets\": " + std::to_string(trainer.buckets().size()) +
                      ", \"params\": " + std::to_string(result.params) + "}";
    writer->set_meta(meta);
    traces::RankInfo ri;
    ri.rank = world.rank();
    ri.host = meta.host;
    ri.device = "cuda:" + std::to_string(dev.index) + " " + dev.name;
    ri.dp = lay.dp_rank;
    ri.tp = lay.tp_rank;
    ri.pp = lay.pp_rank;
    writer->add_rank(ri);
    rec.add_stream(profiler::kComputeStream, "compute");
    rec.add_stream(profiler::kCommStream, "comm");
  }

#if ORRERY_HAVE_CUPTI_TRACER
  // Kernel-level spans (every kernel, copy and memset on its CUDA stream) next to the trainer's
  // event-timed op spans. A CUPTI that refuses (no profiling permission, another profiler attached)
  // costs the kernel spans only: the run goes on and says why.
  std::unique_ptr<profiler::CuptiTracer> cupti;
  if (writer) {
    try {
      cupti = profiler::CuptiTracer::start(rec);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "orrery: rank %d: CUPTI kernel tracing is off: %s\n", world.rank(), e.what());
    }
  }
#endif

  trainer.prepare();
  for (int i = 0; i < s.training.steps; ++i) {
    StepResult r = trainer.step();
    result.steps.push_back(r);
    if (opt.on_step) opt.on_step(r);
  }

  // Reports over the host communicators (host buffers), as run_rank does.
  result.mean_loss.resize(result.steps.size());
  result.max_duration_ns.resize(result.steps.size());
  for (size_t i = 0; i < result.steps.size(); ++i) {
    result.mean_loss[i] = result.steps[i].loss;
    result.max_duration_ns[i] = result.steps[i].duration_ns;
  }
  if (!result.steps.empty()) {
    trainer.dp_group()
        .all_reduce(result.mean_loss.data(), result.mean_loss.size(), DType::F32, ReduceOp::Avg,
                    OpLabel{"report.loss"})
        .wait();
    world
        .all_reduce(result.max_duration_ns.data(), result.max_duration_ns.size(), DType::I64, ReduceOp::Max,
                    OpLabel{"report.step_time"})
        .wait();
  }

  trainer.finish();
  world.set_recorder(nullptr);
  world.synchronize();
#if ORRERY_HAVE_CUPTI_TRACER
  if (cupti) {
    ORRERY_CUDA_CHECK(cudaDeviceSynchronize());  // every kernel complete, so flush() gets them all
    cupti->flush();
    if (cupti->dropped_records() > 0) {
      std::fprintf(stderr, "orrery: rank %d: CUPTI dropped %llu activity records (buffers full)\n", world.rank(),
                   static_cast<unsigned long long>(cupti->dropped_records()));
    }
    cupti.reset();
  }
#endif
  if (writer) {
    profiler::FlightRecorder::instance().set_dump_path("");
    rec.flush();
    writer->close();
  }
  world.barrier().wait();
  if (writer && world.rank() == 0) {
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
    result.trace_path = out;
  } else if (writer) {
    result.trace_path = out;
  }
  return result;
}

}  // namespace orrery::runtime::cuda
