// A hand-built mixture-of-experts trace for the Experts tab's tests: the counters the runtime writes
// (one sample per rank and step: moe.tokens[l=L,e=E], moe.dropped[l=L]) with values in closed form,
// and one span per rank and step so the steps have windows (numbered from first_step).
#pragma once

#include <string>

#include "orrery/traces/trace.hpp"

namespace orrery::gui::test {

// Ranks 0-1, steps 0-1 (numbered first_step, first_step + 1), 4 experts in each of `blocks` MoE
// blocks at layers 1, 3, 5, ... At block 0 (layer 1), rank r, step s, expert e: 10(e + 1) + 100s + r
// tokens, 5s + r dropped. Every other block: 40 tokens to expert 0 and none to the rest, 7 dropped.
inline traces::Trace moe_trace(int blocks = 2, int first_step = 5) {
  traces::Trace t;
  const auto fwd = t.strings.intern("forward");
  for (int s = 0; s < 2; ++s) {
    const int64_t ts = 1000 * (s + 1);
    for (int r = 0; r < 2; ++r) {
      traces::Span sp;
      sp.rank = r;
      sp.name = fwd;
      sp.start_ns = ts - 500;
      sp.end_ns = ts + 100;
      sp.step = first_step + s;
      t.spans.push_back(sp);
      for (int b = 0; b < blocks; ++b) {
        const int layer = 2 * b + 1;
        for (int e = 0; e < 4; ++e) {
          const double v = b == 0 ? 10.0 * (e + 1) + 100.0 * s + r : (e == 0 ? 40.0 : 0.0);
          const std::string n =
              "moe.tokens[l=" + std::to_string(layer) + ",e=" + std::to_string(e) + "]";
          t.counters.push_back({r, t.strings.intern(n), ts + r, v});
        }
        const std::string d = "moe.dropped[l=" + std::to_string(layer) + "]";
        t.counters.push_back({r, t.strings.intern(d), ts + r, b == 0 ? 5.0 * s + r : 7.0});
      }
    }
  }
  t.sort_spans();
  return t;
}

}  // namespace orrery::gui::test
