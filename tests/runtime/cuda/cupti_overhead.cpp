// cupti_overhead: what profiling costs per kernel launch on a GPU (a measurement printed by
// scripts/gpu-check, not a test). Launches `launches` tiny kernels (the worst case: the launch cost
// dominates), one named range per `per_range` launches, in three modes:
//   bare     no recorder: ranges cost one branch, no NVTX, no CUPTI;
//   ranges   a recorder: ranges recorded as spans, emitted as NVTX (and, with the tracer, tagged);
//   cupti    ranges + the CUPTI tracer (kernels, copies, memsets, runtime API, correlations);
// each timed from the first launch to the end of a stream synchronize, best of 5 repetitions.
// Prints one JSON object: ns per launch per mode and the overheads relative to bare.
//   usage: cupti_overhead [launches=20000] [per_range=10]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm_test_kernels.hpp"
#include "orrery/profiler/cupti_tracer.hpp"
#include "orrery/profiler/ranges.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/traces/store.hpp"

using namespace orrery;
using namespace orrery::runtime::cuda;

namespace {

double run_ns_per_launch(int launches, int per_range, float* dev, size_t n, cudaStream_t s) {
  double best = 1e300;
  for (int rep = 0; rep < 5; ++rep) {
    ORRERY_CUDA_CHECK(cudaStreamSynchronize(s));
    const int64_t t0 = profiler::steady_now_ns();
    for (int i = 0; i < launches; i += per_range) {
      ORRERY_RANGE("block");
      for (int k = 0; k < per_range && i + k < launches; ++k) test::launch_scale(dev, n, 1.0f, s);
    }
    ORRERY_CUDA_CHECK(cudaStreamSynchronize(s));
    best = std::min(best, static_cast<double>(profiler::steady_now_ns() - t0) / launches);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int launches = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20000;
  const int per_range = argc > 2 ? std::max(1, std::atoi(argv[2])) : 10;
  if (device_count() == 0) {
    std::fprintf(stderr, "cupti_overhead: %s\n", no_device_reason().c_str());
    return 1;
  }
  try {
    select_device(0);
    Stream stream;
    const size_t n = 256;
    DeviceArray<float> dev(n);
    run_ns_per_launch(1000, per_range, dev.data(), n, stream.get());  // warm-up (module load)
    const double bare = run_ns_per_launch(launches, per_range, dev.data(), n, stream.get());

    const std::string path = "/tmp/orrery_cupti_overhead_" + std::to_string(::getpid()) + ".db";
    double ranges = 0, cupti = 0;
    int64_t gpu_spans = 0;
    {
      traces::TraceWriter writer(path);
      profiler::Recorder rec(&writer, 0);
      profiler::Recorder::set_current(&rec);
      ranges = run_ns_per_launch(launches, per_range, dev.data(), n, stream.get());
      {
        auto tracer = profiler::CuptiTracer::start(rec);
        cupti = run_ns_per_launch(launches, per_range, dev.data(), n, stream.get());
        tracer->flush();
        gpu_spans = tracer->spans_recorded();
      }
      profiler::Recorder::set_current(nullptr);
      rec.flush();
      writer.close();
    }
    std::remove(path.c_str());
    std::printf(
        "{\"launches\": %d, \"per_range\": %d, \"bare_ns_per_launch\": %.1f, "
        "\"ranges_ns_per_launch\": %.1f, \"cupti_ns_per_launch\": %.1f, "
        "\"ranges_overhead_pct\": %.2f, \"cupti_overhead_pct\": %.2f, \"gpu_spans\": %lld}\n",
        launches, per_range, bare, ranges, cupti, (ranges - bare) / bare * 100.0,
        (cupti - bare) / bare * 100.0, static_cast<long long>(gpu_spans));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cupti_overhead: %s\n", e.what());
    return 1;
  }
  return 0;
}
