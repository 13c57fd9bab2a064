// `orrery synth`: writes a plausible synthetic DDP trace (traces/synth.hpp) with known totals, for
// tests, benchmarks and demos.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/format.hpp"
#include "orrery/traces/synth.hpp"
#include "output_file.hpp"

namespace orrery::cli {
namespace {

struct SynthArgs {
  traces::SynthOptions o;
  std::string out;
  int64_t target_spans = 0;
  double peak_tflops = 0;
  bool bucket_given = false;
  bool json = false;
};

Command setup(CLI::App& root) {
  auto args = std::make_shared<SynthArgs>();
  CLI::App* app = root.add_subcommand(
      "synth", "Write a synthetic DDP trace with known totals (for tests, benchmarks and demos)");
  app->add_option("--ranks", args->o.ranks, "Ranks")->capture_default_str();
  app->add_option("--steps", args->o.steps, "Training steps")->capture_default_str();
  app->add_option("--out", args->out, "Output trace file")->required();
  app->add_option("--layers", args->o.layers,
                  "Layers per rank (the trace must fit this machine's memory: about 100 bytes per "
                  "span, ranks x steps x (2 x layers + buckets + 6) spans)")
      ->capture_default_str();
  app->add_option_function<int32_t>(
      "--bucket-layers",
      [args](const int32_t& k) {
        args->o.layers_per_bucket = k;
        args->bucket_given = true;
      },
      "Layers per gradient bucket (default 2, or 1 when --layers is odd)");
  app->add_option("--seed", args->o.seed, "Seed of the jitter")->capture_default_str();
  app->add_option("--jitter-ns", args->o.jitter_ns, "Uniform extra data-loading time per step")
      ->capture_default_str();
  app->add_option("--straggler-rank", args->o.straggler_rank, "A consistently late rank (-1: none)")
      ->capture_default_str();
  app->add_option("--straggler-delay-ns", args->o.straggler_delay_ns, "Its delay per step")
      ->capture_default_str();
  app->add_option("--pp", args->o.pp, "Pipeline stages (GPipe schedule when > 1)")
      ->capture_default_str();
  app->add_option("--micro-batches", args->o.micro_batches, "Micro-batches per step when --pp > 1")
      ->capture_default_str();
  app->add_option("--spans", args->target_spans,
                  "Choose the step count to reach at least this many spans (overrides --steps)");
  app->add_option("--peak-tflops", args->peak_tflops, "Peak TFLOP/s per rank stored in the trace");
  app->add_flag("--json", args->json, "Print one JSON object");

  auto run = [args]() {
    traces::SynthOptions o = args->o;
    const int32_t stage_layers = o.pp > 0 ? o.layers / o.pp : o.layers;
    if (!args->bucket_given && stage_layers > 0 && stage_layers % o.layers_per_bucket != 0)
      o.layers_per_bucket = 1;
    if (args->target_spans > 0) {
      o.steps = traces::synth_steps_for_spans(o, args->target_spans);
      try {  // synthesize() checks it too; here the message can say where the steps came from
        traces::check_synth_size(o);
      } catch (const InputError& e) {
        throw InputError("--spans " + std::to_string(args->target_spans) + " (" +
                         std::to_string(o.steps) + " steps): " + e.what());
      }
    }
    if (args->peak_tflops < 0) throw InputError("--peak-tflops: expected a value >= 0");
    o.peak_flops_per_rank = args->peak_tflops * 1e12;
    const traces::Trace t = traces::synthesize(o);
    write_trace_atomic(t, args->out);
    const traces::SynthTotals x = traces::synth_totals(o);
    const bool exact = o.jitter_ns == 0 && (o.straggler_rank < 0 || o.straggler_delay_ns == 0);
    if (args->json) {
      nlohmann::json j;
      j["out"] = args->out;
      j["ranks"] = o.ranks;
      j["steps"] = o.steps;
      j["layers"] = o.layers;
      j["layers_per_bucket"] = o.layers_per_bucket;
      j["pp"] = o.pp;
      j["micro_batches"] = o.micro_batches;
      j["seed"] = o.seed;
      j["spans"] = t.spans.size();
      j["counters"] = t.counters.size();
      j["exact"] = exact;
      j["expected"] = {{"step_ns", x.step_ns},
                       {"compute_ns_per_step_rank", x.compute_ns},
                       {"comm_ns_per_step_rank", x.comm_ns},
                       {"exposed_comm_ns_per_step_rank", x.exposed_comm_ns},
                       {"overlap_ns_per_step_rank", x.overlap_ns},
                       {"idle_ns_per_step_rank", x.idle_ns},
                       {"allreduce_bytes_per_step_rank", x.allreduce_bytes},
                       {"allreduce_calls_per_step_rank", x.allreduce_calls},
                       {"flops_per_step", x.flops},
                       {"peak_memory_bytes_per_rank", x.peak_memory_bytes},
                       {"bubble_ns_per_step_rank", x.bubble_ns}};
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << "wrote " << t.spans.size() << " spans and " << t.counters.size()
                << " counter samples (" << o.ranks << " ranks x " << o.steps << " steps, "
                << o.layers << " layers) to " << args->out << "\n";
      std::cout << (exact ? "expected" : "expected without jitter/straggler") << ": step "
                << format_duration_ns(double(x.step_ns)) << "; per rank and step: compute "
                << format_duration_ns(double(x.compute_ns)) << ", comm "
                << format_duration_ns(double(x.comm_ns)) << ", exposed comm "
                << format_duration_ns(double(x.exposed_comm_ns)) << ", all-reduce "
                << format_bytes(double(x.allreduce_bytes)) << " in " << x.allreduce_calls
                << " calls";
      if (o.pp > 1) std::cout << ", pipeline bubble " << format_duration_ns(double(x.bubble_ns));
      std::cout << "\n";
    }
    return 0;
  };
  return {app, run};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
