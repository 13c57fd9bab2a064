// One rank's run on a CUDA device (see gpu_run.hpp); follows runtime::run_rank (launch.cpp).
#include "orrery/runtime/cuda/gpu_run.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "orrery/common/error.hpp"
#include "orrery/profiler/flight_recorder.hpp"
#if ORRERY_HAVE_CUPTI_TRACER
#include "orrery/profiler/cupti_tracer.hpp"
#endif
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/nccl_comm.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime::cuda {

namespace {

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
  if (d.cc_major == 9 && d.cc_minor == 0)
    return std::array<double, 3>{67e12, 494.7e12, 989.4e12}[i];
  return 0.0;
}

RankRunResult run_rank_cuda(const Scenario& s, Communicator& world, const RankRunOptions& opt,
                            const CudaRunOptions& copt) {
  check_supported_cuda(s);
  if (!opt.resume.empty()) {
    throw InputError("--resume " + opt.resume + ": resuming is not available on device cuda yet " +
                     "(runtime.device: cpu resumes)");
  }
  RankSession session(s, world, opt, true);
  profiler::Recorder& rec = session.recorder();
  RankRunResult& result = session.result();

  GpuTrainer trainer(s, world, &rec, copt);
  const Layout& lay = trainer.layout();
  const DeviceInfo& dev = trainer.device();
  result.tokens_per_step = static_cast<int64_t>(s.training.global_batch) * s.model.seq;
  result.params =
      static_cast<int64_t>(trainer.flat_elems());  // this rank's shard, without ZeRO padding

  if (session.profiling()) {
    traces::RunMeta meta = real_run_meta(s, lay, world.size());
    meta.peak_flops_per_rank = peak_flops(dev, copt.math);
    meta.extra_json = "{\"device\": \"" + json_escape(dev.name) + "\", \"precision\": \"" +
                      math_mode_name(copt.math) + "\", \"comm_backend\": \"" +
                      trainer.comm_backend() +
                      "\", \"micro_batches\": " + std::to_string(trainer.micro_batches()) +
                      ", \"ddp_buckets\": " + std::to_string(trainer.buckets().size()) +
                      ", \"params\": " + std::to_string(result.params) + "}";
    session.describe(meta, real_rank_info(lay, world.rank(), meta.host,
                                          "cuda:" + std::to_string(dev.index) + " " + dev.name));
  }

#if ORRERY_HAVE_CUPTI_TRACER
  // Kernel-level spans (every kernel, copy and memset on its CUDA stream) next to the trainer's
  // event-timed op spans. A CUPTI that refuses (no profiling permission, another profiler attached)
  // costs the kernel spans only: the run goes on and says why.
  std::unique_ptr<profiler::CuptiTracer> cupti;
  if (session.profiling()) {
    try {
      cupti = profiler::CuptiTracer::start(rec);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "orrery: rank %d: CUPTI kernel tracing is off: %s\n", world.rank(),
                   e.what());
    }
  }
#endif

  trainer.prepare();
  session.start_steps(0);
  for (int i = 0; i < s.training.steps; ++i) {
    session.before_step(i);
    session.after_step(i, trainer.step());
  }

  // Reports over the host communicators (host buffers), as run_rank does.
  session.reduce_reports(trainer.dp_group());
  trainer.finish();
  session.end_steps([&] {
#if ORRERY_HAVE_CUPTI_TRACER
    if (cupti) {
      ORRERY_CUDA_CHECK(
          cudaDeviceSynchronize());  // every kernel complete, so flush() gets them all
      cupti->flush();
      if (cupti->dropped_records() > 0) {
        std::fprintf(stderr,
                     "orrery: rank %d: CUPTI dropped %llu activity records (buffers full)\n",
                     world.rank(), static_cast<unsigned long long>(cupti->dropped_records()));
      }
      cupti.reset();
    }
#endif
  });
  return session.finish();
}

}  // namespace orrery::runtime::cuda
