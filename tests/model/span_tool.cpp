// Test tool for the one-model-description checks (reference_spans.sh):
//   span_tool counts TRACE       one line per (rank, kind, name): the span count, sorted; the golden
//                                files in tests/data/reference_spans/ hold these for the reference runs
//   span_tool compare REAL SIM   the simulator's ops against a real run's spans, rank by rank: the
//                                compute ops in program order (name, step, micro-batch, layer, FLOPs),
//                                per communicator the collectives in sequence order and the transfers
//                                as a set (name, op, step, micro-batch, layer, bytes), each with the
//                                name of its stream (the same for both); the MoE experts' FLOPs and
//                                the all-to-alls' bytes, which follow the data's routing, only as
//                                present. Spans outside a step (the
//                                real run's set-up broadcast and barrier) and phases are not compared.
// Exit 0 when equal (compare) / written (counts), 1 with the first differences on stderr, 2 on bad use.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "orrery/traces/store.hpp"

namespace {

using orrery::traces::Span;
using orrery::traces::SpanKind;
using orrery::traces::Trace;

int counts(const Trace& t) {
  std::map<std::tuple<int, std::string, std::string>, long> n;
  for (const Span& s : t.spans) ++n[{s.rank, std::string(to_string(s.kind)), t.name_of(s)}];
  for (const auto& [k, c] : n)
    std::printf("%d\t%s\t%s\t%ld\n", std::get<0>(k), std::get<1>(k).c_str(), std::get<2>(k).c_str(),
                c);
  return 0;
}

bool is_compute(SpanKind k) {
  return k == SpanKind::Compute || k == SpanKind::Optimizer || k == SpanKind::Data;
}
bool is_comm(SpanKind k) { return k == SpanKind::Collective || k == SpanKind::P2P; }

// Mixture of experts (model/moe.hpp): what the experts compute and what the all-to-alls carry
// follow the real run's routing, which depends on the data; the simulator prices the expected
// load. Those FLOPs and bytes are compared as present ("routed"), not by value; the router, the
// block's own pieces and every other collective exactly.
bool routed_flops(const std::string& name) {
  return name == "moe.experts" || name == "moe.experts.bwd" || name == "moe.gated_sum" ||
         name == "moe.gated_sum.bwd";
}

// One rank's comparable program: compute ops in start order, communication per communicator name.
struct Program {
  std::vector<std::string> compute;
  std::map<std::string, std::vector<std::pair<int64_t, std::string>>>
      comm;                                             // comm name -> (seq, op)
  std::map<std::string, std::vector<std::string>> p2p;  // comm name -> transfers
};

std::map<int, Program> programs(const Trace& t) {
  std::map<int, Program> out;
  std::vector<const Span*> spans;
  for (const Span& s : t.spans) {
    if (s.step >= 0 && (is_compute(s.kind) || is_comm(s.kind))) spans.push_back(&s);
  }
  std::stable_sort(spans.begin(), spans.end(), [](const Span* a, const Span* b) {
    return std::tie(a->rank, a->start_ns, a->end_ns) < std::tie(b->rank, b->start_ns, b->end_ns);
  });
  std::map<std::pair<int, int>, std::string> stream_names;
  for (const auto& st : t.streams) stream_names[{st.rank, st.stream}] = st.name;
  char buf[96];
  for (const Span* s : spans) {
    Program& p = out[s->rank];
    const auto sn = stream_names.find({s->rank, s->stream});
    // The stream by name: one stream naming for a scenario real and simulated.
    std::string op =
        std::string(to_string(s->kind)) + " " + t.name_of(*s) + " step " + std::to_string(s->step) +
        " mb " + std::to_string(s->micro_batch) + " layer " + std::to_string(s->layer) + " on " +
        (sn == stream_names.end() ? "stream " + std::to_string(s->stream) : sn->second);
    const std::string name = t.name_of(*s);
    if (is_compute(s->kind) && routed_flops(name)) {
      p.compute.push_back(op + " flops routed");
    } else if (is_compute(s->kind)) {
      std::snprintf(buf, sizeof buf, " flops %.6g", s->flops);
      p.compute.push_back(op + buf);
    } else {
      const auto* c = t.comm(s->comm);
      const std::string comm = c != nullptr ? c->name : "comm " + std::to_string(s->comm);
      const std::string entry =
          op + " op " + std::string(to_string(s->op)) + " bytes " +
          (s->op == orrery::traces::CollOp::AllToAll ? "routed" : std::to_string(s->bytes));
      // Collectives in their communicator's sequence; transfers as a set (below): the simulator
      // numbers a pipeline's sends and receives by matching pair, not in the communicator's order.
      if (s->kind == SpanKind::Collective)
        p.comm[comm].emplace_back(s->seq, entry);
      else
        p.p2p[comm].push_back(entry);
    }
  }
  for (auto& [rank, p] : out) {
    for (auto& [name, v] : p.comm)
      std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first < b.first; });
    for (auto& [name, v] : p.p2p) std::sort(v.begin(), v.end());
  }
  return out;
}

int diff_lists(const std::string& what, const std::vector<std::string>& a,
               const std::vector<std::string>& b, int& shown) {
  int bad = 0;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const std::string x = i < a.size() ? a[i] : "(none)", y = i < b.size() ? b[i] : "(none)";
    if (x == y) continue;
    ++bad;
    if (shown++ < 20)
      std::fprintf(stderr, "%s #%zu: real '%s' vs sim '%s'\n", what.c_str(), i, x.c_str(),
                   y.c_str());
  }
  return bad;
}

int compare(const Trace& real, const Trace& sim) {
  const auto r = programs(real), s = programs(sim);
  int bad = 0, shown = 0;
  long ops = 0;
  for (const auto& [rank, rp] : r) {
    auto it = s.find(rank);
    if (it == s.end()) {
      std::fprintf(stderr, "rank %d: not in the simulated trace\n", rank);
      ++bad;
      continue;
    }
    const Program& sp = it->second;
    bad += diff_lists("rank " + std::to_string(rank) + " compute", rp.compute, sp.compute, shown);
    ops += long(rp.compute.size());
    std::map<std::string, int> names;
    for (const auto& [c, v] : rp.comm) names[c] |= 1;
    for (const auto& [c, v] : sp.comm) names[c] |= 2;
    for (const auto& [c, where] : names) {
      std::vector<std::string> a, b;
      if (where & 1)
        for (const auto& e : rp.comm.at(c)) a.push_back(e.second);
      if (where & 2)
        for (const auto& e : sp.comm.at(c)) b.push_back(e.second);
      bad += diff_lists("rank " + std::to_string(rank) + " " + c, a, b, shown);
      ops += long(a.size());
    }
    std::map<std::string, int> links;
    for (const auto& [c, v] : rp.p2p) links[c] |= 1;
    for (const auto& [c, v] : sp.p2p) links[c] |= 2;
    for (const auto& [c, where] : links) {
      const std::vector<std::string> none;
      const auto& a = (where & 1) ? rp.p2p.at(c) : none;
      const auto& b = (where & 2) ? sp.p2p.at(c) : none;
      bad += diff_lists("rank " + std::to_string(rank) + " " + c + " transfers", a, b, shown);
      ops += long(a.size());
    }
  }
  if (s.size() != r.size()) {
    std::fprintf(stderr, "ranks: real %zu, simulated %zu\n", r.size(), s.size());
    ++bad;
  }
  std::printf("compared %ld ops on %zu ranks: %d differences\n", ops, r.size(), bad);
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "counts" && argc == 3) return counts(orrery::traces::load_trace(argv[2]));
    if (mode == "compare" && argc == 4) {
      return compare(orrery::traces::load_trace(argv[2]), orrery::traces::load_trace(argv[3]));
    }
    std::fprintf(stderr, "usage: span_tool counts TRACE | span_tool compare REAL SIM\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "span_tool: %s\n", e.what());
    return 2;
  }
}
