// Span-level comparison of two traces (see compare.hpp).
#include "orrery/profiler/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

namespace orrery::profiler {

std::string op_class(const traces::Trace& t, const traces::Span& s) {
  using traces::SpanKind;
  const std::string& n = t.name_of(s);
  switch (s.kind) {
    case SpanKind::Compute:
      if (n.rfind("fwd.", 0) == 0) return "forward";
      if (n.rfind("bwd.", 0) == 0) return "backward";
      return "compute";
    case SpanKind::Optimizer: return "optimizer";
    case SpanKind::Data: return "data";
    case SpanKind::Collective: return "collective." + std::string(traces::to_string(s.op));
    case SpanKind::P2P: return "p2p";
    case SpanKind::Memcpy: return "memcpy";
    case SpanKind::Phase: return "phase." + n;
    default: return "other";
  }
}

namespace {

using Key = std::tuple<int32_t, int32_t, std::string, int32_t>;  // rank, step, name, occurrence

struct Indexed {
  std::map<Key, size_t> spans;           // key -> span index
  std::map<int32_t, std::pair<int64_t, int64_t>> steps;  // renumbered step -> [min start, max end]
};

Indexed index(const traces::Trace& t, const CompareOptions& opt) {
  Indexed ix;
  int32_t lo = INT32_MAX, hi = INT32_MIN;
  for (const auto& s : t.spans)
    if (s.step >= 0) lo = std::min(lo, s.step), hi = std::max(hi, s.step);
  if (lo == INT32_MAX) return ix;
  const int32_t first = hi > lo ? lo + std::max(0, opt.skip_steps) : lo;
  std::vector<size_t> order(t.spans.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = t.spans[a], &y = t.spans[b];
    return std::tie(x.rank, x.start_ns, x.end_ns) < std::tie(y.rank, y.start_ns, y.end_ns);
  });
  std::map<std::tuple<int32_t, int32_t, traces::NameId>, int32_t> occ;
  for (size_t i : order) {
    const auto& s = t.spans[i];
    if (s.step < first) continue;
    const int32_t step = s.step - first;
    const int32_t k = occ[{s.rank, step, s.name}]++;
    ix.spans[{s.rank, step, t.name_of(s), k}] = i;
    auto [it, fresh] = ix.steps.try_emplace(step, s.start_ns, s.end_ns);
    if (!fresh) it->second.first = std::min(it->second.first, s.start_ns), it->second.second = std::max(it->second.second, s.end_ns);
  }
  return ix;
}

void add(std::map<std::string, CompareRow>& rows, const std::string& key, double a, double b) {
  CompareRow& r = rows[key];
  r.key = key;
  r.pairs++;
  r.a_ns += a;
  r.b_ns += b;
  if (a > 0) r.abs_error_sum += std::abs(b - a) / a;
}

}  // namespace

SpanComparison compare_spans(const traces::Trace& a, const traces::Trace& b, const CompareOptions& opt) {
  SpanComparison c;
  const Indexed ia = index(a, opt), ib = index(b, opt);
  std::set<int32_t> steps;
  for (const auto& [s, w] : ia.steps)
    if (ib.steps.count(s)) steps.insert(s);
  std::set<int32_t> ranks_b;
  for (const auto& [k, i] : ib.spans) ranks_b.insert(std::get<0>(k));
  std::map<std::string, CompareRow> by_class, by_name;
  for (const auto& [k, i] : ia.spans) {
    if (!steps.count(std::get<1>(k)) || !ranks_b.count(std::get<0>(k))) continue;
    const auto j = ib.spans.find(k);
    if (j == ib.spans.end()) {
      c.only_a++;
      continue;
    }
    const auto& sa = a.spans[i];
    const auto& sb = b.spans[j->second];
    const double da = double(sa.duration_ns()), db = double(sb.duration_ns());
    add(by_class, op_class(a, sa), da, db);
    add(by_name, a.name_of(sa), da, db);
    c.matched++;
  }
  std::set<int32_t> ranks_a;
  for (const auto& [k, i] : ia.spans) ranks_a.insert(std::get<0>(k));
  for (const auto& [k, i] : ib.spans)
    if (steps.count(std::get<1>(k)) && ranks_a.count(std::get<0>(k)) && !ia.spans.count(k)) c.only_b++;
  for (int32_t s : steps) {
    c.step_a_ns += double(ia.steps.at(s).second - ia.steps.at(s).first);
    c.step_b_ns += double(ib.steps.at(s).second - ib.steps.at(s).first);
  }
  c.steps_compared = static_cast<int64_t>(steps.size());
  if (c.steps_compared) c.step_a_ns /= double(c.steps_compared), c.step_b_ns /= double(c.steps_compared);
  for (auto& [k, r] : by_class) c.by_class.push_back(r);
  for (auto& [k, r] : by_name) c.by_name.push_back(r);
  return c;
}

std::string format_comparison(const SpanComparison& c) {
  std::ostringstream o;
  char buf[256];
  auto ms = [](double ns) { return ns / 1e6; };
  std::snprintf(buf, sizeof buf,
                "Span-level comparison: %lld spans matched by (rank, step, name, occurrence) over %lld step(s); "
                "%lld only in A, %lld only in B\n",
                static_cast<long long>(c.matched), static_cast<long long>(c.steps_compared),
                static_cast<long long>(c.only_a), static_cast<long long>(c.only_b));
  o << buf;
  if (c.steps_compared) {
    std::snprintf(buf, sizeof buf, "step time: A %.3f ms, B %.3f ms, B vs A %+.1f %%\n", ms(c.step_a_ns),
                  ms(c.step_b_ns), c.step_a_ns > 0 ? 100.0 * (c.step_b_ns - c.step_a_ns) / c.step_a_ns : 0.0);
    o << buf;
  }
  auto table = [&](const char* title, const std::vector<CompareRow>& rows) {
    std::snprintf(buf, sizeof buf, "\n%-24s %8s %14s %14s %10s %12s\n", title, "pairs", "A total", "B total",
                  "B vs A", "mean |err|");
    o << buf;
    for (const auto& r : rows) {
      std::snprintf(buf, sizeof buf, "%-24s %8lld %11.3f ms %11.3f ms %+8.1f %% %10.1f %%\n", r.key.c_str(),
                    static_cast<long long>(r.pairs), ms(r.a_ns), ms(r.b_ns), r.error_pct(), r.mean_abs_error_pct());
      o << buf;
    }
  };
  table("op class", c.by_class);
  table("op name", c.by_name);
  return o.str();
}

}  // namespace orrery::profiler
