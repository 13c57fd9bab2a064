// Step time of the CPU GPT (forward + backward + AdamW, one process) at the reference configurations
// gpt-tiny and gpt-small-ish, with 1 and 2 threads: the figures to compare with PyTorch's
// shared/reference/pytorch_gpt_ddp_cpu.py --mode single at the same threads. Also the time per span
// kind (from the model's OpObserver) and the achieved model GFLOP/s, to see where a step goes.
//
//   bench_model [--config tiny|small|all] [--threads 1,2] [--steps 20] [--warmup 3] [--json]
//   bench_model --dump FILE [--llama]   writes a small model's parameters, batch, loss and gradients for
//                             bench/compare_torch_gpt.py, or with --llama compare_torch_llama.py
//                             (the golden checks against PyTorch)
#ifndef ORRERY_RUNTIME_AVAILABLE
#include <cstdio>
int main() {
  std::puts("bench_model: the CPU runtime is not built (no OpenBLAS)");
  return 0;
}
#else
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "orrery/model/flops.hpp"
#include "orrery/runtime/data.hpp"
#include "orrery/runtime/kernels.hpp"
#include "orrery/runtime/model.hpp"
#include "orrery/runtime/optimizer.hpp"

namespace rt = orrery::runtime;
using Clock = std::chrono::steady_clock;

namespace {

struct Preset {
  std::string name;
  rt::GptConfig cfg;
  int B;
};

// Sums wall time per span name.
class SpanTimer : public rt::OpObserver {
 public:
  void begin(const char* name, int, double) override {
    name_ = name;
    t0_ = Clock::now();
  }
  void end() override {
    ms[name_] += std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
  }
  std::map<std::string, double> ms;

 private:
  std::string name_;
  Clock::time_point t0_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json run(const Preset& p, int threads, int steps, int warmup) {
  rt::set_compute_threads(threads);
  const int B = p.B, T = p.cfg.max_seq;
  rt::MarkovSource src(p.cfg.vocab, 1, 4096);
  rt::DataLoader loader(src, T, B, 0, 1, 1);
  auto model = rt::gpt_create(p.cfg, rt::GptShard{}, 1234);
  auto acts = rt::gpt_activations(model, B, T);
  auto scratch = rt::gpt_grad_scratch(model, B, T);
  rt::AdamW opt(0, model.num_params(), model.decay_ranges());
  SpanTimer spans;
  rt::GptHooks hooks;
  hooks.observer = &spans;
  std::vector<double> step_ms, opt_ms;
  rt::Batch batch;
  float loss = 0.0f, first_loss = 0.0f;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) spans.ms.clear();
    loader.next_batch(batch);
    const auto t0 = Clock::now();
    rt::gpt_zero_grad(model);
    loss = rt::gpt_forward(model, acts, batch.inputs.data(), batch.targets.data(), hooks);
    rt::gpt_backward(model, acts, scratch, 1.0f, hooks);
    const auto t1 = Clock::now();
    opt.step(model.params.data(), model.grads.data());
    const auto t2 = Clock::now();
    if (s == 0) first_loss = loss;
    if (s >= warmup) {
      step_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
      opt_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
  }
  const double med = median(step_ms);
  const double flop = orrery::model::flops::model_step(
      orrery::model::flops::Dims{B, T, p.cfg.n_embd, p.cfg.vocab, 1}, p.cfg.n_layer);
  nlohmann::json j;
  j["config"] = p.name;
  j["threads"] = threads;
  j["layers"] = p.cfg.n_layer;
  j["d_model"] = p.cfg.n_embd;
  j["heads"] = p.cfg.n_head;
  j["vocab"] = p.cfg.vocab;
  j["seq"] = T;
  j["micro_batch"] = B;
  j["params"] = model.num_params();
  j["step_ms_median"] = med;
  j["step_ms_min"] = *std::min_element(step_ms.begin(), step_ms.end());
  j["step_ms_max"] = *std::max_element(step_ms.begin(), step_ms.end());
  j["optimizer_ms_median"] = median(opt_ms);
  j["tokens_per_s"] = B * T / (med * 1e-3);
  j["model_gflop_per_step"] = flop * 1e-9;
  j["model_gflops"] = flop * 1e-9 / (med * 1e-3);
  j["first_loss"] = first_loss;
  j["final_loss"] = loss;
  nlohmann::json per_span;
  for (const auto& [name, total] : spans.ms) per_span[name] = total / steps;
  j["span_ms_per_step"] = per_span;
  return j;
}

// The golden check's Llama-style model: grouped-query attention (4 heads over 2 kv heads),
// SwiGLU of width 80, RMSNorm, RoPE, an untied LM head, no biases.
rt::GptConfig llama_golden_config() {
  orrery::BlockArch a;
  a.kv_heads = 2;
  a.ffn_hidden = 80;
  a.activation = orrery::Activation::Swiglu;
  a.norm = orrery::Norm::RmsNorm;
  a.position = orrery::Position::Rope;
  a.rope_theta = 10000.0;
  a.tied_embeddings = false;
  a.bias = false;
  return rt::GptConfig{3, 48, 4, 97, 16, a};
}

// Binary dump, little-endian: magic "ORGD" (GPT) or "ORGL" (Llama-style), int32 L, C, H, V, T, B,
// for "ORGL" then int32 kv_heads, ffn_hidden and float64 rope_theta; then int32 inputs (B*T),
// int32 targets (B*T), float32 loss, int32 tensor count, and per tensor: int32 name length, name,
// int32 rows, cols, float32 params (rows*cols), float32 grads (rows*cols).
int dump(const std::string& path, bool llama) {
  const rt::GptConfig cfg = llama ? llama_golden_config() : rt::GptConfig{3, 48, 4, 97, 16};
  const int B = 3, T = cfg.max_seq;
  rt::MarkovSource src(cfg.vocab, 2, 256);
  rt::DataLoader loader(src, T, B, 0, 1, 3);
  auto model = rt::gpt_create(cfg, rt::GptShard{}, 42);
  // A few optimizer steps first, so biases and LayerNorms are no longer at their initial values.
  auto acts = rt::gpt_activations(model, B, T);
  auto scratch = rt::gpt_grad_scratch(model, B, T);
  rt::AdamWConfig oc;
  oc.lr = 1e-2f;
  rt::AdamW opt(0, model.num_params(), model.decay_ranges(), oc);
  rt::Batch batch;
  for (int s = 0; s < 3; ++s) {
    loader.next_batch(batch);
    rt::gpt_zero_grad(model);
    rt::gpt_forward(model, acts, batch.inputs.data(), batch.targets.data());
    rt::gpt_backward(model, acts, scratch);
    opt.step(model.params.data(), model.grads.data());
  }
  loader.next_batch(batch);
  rt::gpt_zero_grad(model);
  const float loss = rt::gpt_forward(model, acts, batch.inputs.data(), batch.targets.data());
  rt::gpt_backward(model, acts, scratch);

  std::ofstream out(path, std::ios::binary);
  auto i32 = [&](int32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
  out.write(llama ? "ORGL" : "ORGD", 4);
  for (int v : {cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab, T, B}) i32(v);
  if (llama) {
    i32(model.config.arch.kv_heads);
    i32(model.config.arch.ffn_hidden);
    const double theta = model.config.arch.rope_theta;
    out.write(reinterpret_cast<const char*>(&theta), 8);
  }
  out.write(reinterpret_cast<const char*>(batch.inputs.data()),
            static_cast<std::streamsize>(4 * batch.inputs.size()));
  out.write(reinterpret_cast<const char*>(batch.targets.data()),
            static_cast<std::streamsize>(4 * batch.targets.size()));
  out.write(reinterpret_cast<const char*>(&loss), 4);
  i32(static_cast<int32_t>(model.tensors.size()));
  for (const auto& t : model.tensors) {
    i32(static_cast<int32_t>(t.name.size()));
    out.write(t.name.data(), static_cast<std::streamsize>(t.name.size()));
    i32(t.rows);
    i32(t.cols);
    out.write(reinterpret_cast<const char*>(model.params.data() + t.offset),
              static_cast<std::streamsize>(4 * t.count));
    out.write(reinterpret_cast<const char*>(model.grads.data() + t.offset),
              static_cast<std::streamsize>(4 * t.count));
  }
  if (!out) {
    std::fprintf(stderr, "bench_model: cannot write %s\n", path.c_str());
    return 1;
  }
  std::printf("wrote %s: %zu tensors, loss %.6f\n", path.c_str(), model.tensors.size(), loss);
  return 0;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos < s.size()) {
    const std::size_t comma = s.find(',', pos);
    out.push_back(std::stoi(s.substr(pos, comma - pos)));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Step time of the CPU GPT at the reference configurations"};
  std::string config = "all", threads_list = "1,2";
  int steps = 20, warmup = 3;
  bool json = false;
  std::string dump_path;
  app.add_option("--config", config, "tiny | small | all")
      ->check(CLI::IsMember({"tiny", "small", "all"}));
  app.add_option("--threads", threads_list, "comma-separated thread counts");
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_flag("--json", json, "one JSON object");
  bool llama = false;
  app.add_option("--dump", dump_path,
                 "write a golden-check dump for bench/compare_torch_gpt.py (with --llama: "
                 "bench/compare_torch_llama.py) and exit");
  app.add_flag("--llama", llama, "--dump a Llama-style model (GQA, SwiGLU, RMSNorm, RoPE, untied)");
  CLI11_PARSE(app, argc, argv);
  if (!dump_path.empty()) return dump(dump_path, llama);

  std::vector<Preset> presets;
  if (config == "tiny" || config == "all")
    presets.push_back({"gpt-tiny", {4, 256, 4, 8192, 128}, 8});
  if (config == "small" || config == "all")
    presets.push_back({"gpt-small-ish", {6, 384, 6, 8192, 256}, 4});
  nlohmann::json results = nlohmann::json::array();
  if (!json) {
    std::printf("%-14s %7s %10s %10s %10s %9s %12s %9s\n", "config", "threads", "step_ms", "min_ms",
                "opt_ms", "GFLOP/s", "tokens/s", "loss");
  }
  for (const auto& p : presets) {
    for (int th : parse_list(threads_list)) {
      auto j = run(p, th, steps, warmup);
      if (!json) {
        std::printf("%-14s %7d %10.1f %10.1f %10.1f %9.1f %12.0f %9.4f\n", p.name.c_str(), th,
                    j["step_ms_median"].get<double>(), j["step_ms_min"].get<double>(),
                    j["optimizer_ms_median"].get<double>(), j["model_gflops"].get<double>(),
                    j["tokens_per_s"].get<double>(), j["final_loss"].get<double>());
        std::printf("  per step:");
        for (const auto& [name, ms] : j["span_ms_per_step"].items())
          std::printf(" %s %.1f ms", name.c_str(), ms.get<double>());
        std::printf("\n");
        std::fflush(stdout);
      }
      results.push_back(j);
    }
  }
  if (json)
    std::printf("%s\n", nlohmann::json{{"bench", "model"}, {"results", results}}.dump().c_str());
  return 0;
}
#endif
