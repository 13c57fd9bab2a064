// Loading a trace for the GUI, and the per-step figures the charts and the compare view show.
#include "orrery/gui/document.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

#include "orrery/traces/store.hpp"

namespace orrery::gui {

std::shared_ptr<TraceDocument> load_document(const std::string& path) {
  return load_document(path, LoadOptions{});
}

std::shared_ptr<TraceDocument> load_document(const std::string& path, const LoadOptions& o) {
  auto reader = std::make_shared<const traces::TraceReader>(path);
  if (reader->span_count() <= o.zoom_above_spans) {
    auto t = reader->load_all();
    return make_document(std::move(t), path);
  }
  auto doc = std::make_shared<TraceDocument>();
  doc->path = path;
  doc->trace = reader->load_header();
  doc->zoom = std::make_shared<const traces::ZoomIndex>(path);
  const auto range = reader->time_range();
  doc->index = TraceIndex(doc->trace, doc->zoom->lanes(), range ? range->start_ns : 0,
                          range ? range->end_ns : 1);
  doc->counters = counter_tracks(doc->trace);
  // Step windows from the writer's per-step aggregates, not from the spans.
  std::map<int32_t, StepWindow> by_step;
  for (const auto& a : reader->step_aggregates()) {
    auto [it, fresh] = by_step.try_emplace(a.step, StepWindow{a.step, a.start_ns, a.end_ns});
    if (!fresh) {
      it->second.start_ns = std::min(it->second.start_ns, a.start_ns);
      it->second.end_ns = std::max(it->second.end_ns, a.end_ns);
    }
  }
  for (const auto& [step, w] : by_step) doc->steps.push_back(w);
  doc->reader = std::move(reader);
  return doc;
}

std::shared_ptr<TraceDocument> load_window(const TraceDocument& doc, int64_t t0_ns, int64_t t1_ns) {
  traces::Trace t;
  t.path = doc.path;
  t.meta = doc.trace.meta;
  t.ranks = doc.trace.ranks;
  t.streams = doc.trace.streams;
  t.comms = doc.trace.comms;
  t.strings = doc.trace.strings;
  if (doc.reader && doc.zoom) {
    for (const auto& l : doc.zoom->lanes()) {
      auto spans = doc.reader->spans_in_window(l.rank, l.stream, t0_ns, t1_ns);
      t.spans.insert(t.spans.end(), spans.begin(), spans.end());
    }
  }
  auto w = make_document(std::move(t), doc.path);
  if (doc.zoom) w->index.pad_rows(doc.zoom->lanes());
  w->steps = doc.steps;
  return w;
}

std::shared_ptr<TraceDocument> make_document(traces::Trace t, std::string path) {
  auto doc = std::make_shared<TraceDocument>();
  doc->path = path.empty() ? t.path : std::move(path);
  doc->trace = std::move(t);
  doc->index = TraceIndex(doc->trace);
  doc->flows = FlowIndex(doc->trace);
  doc->counters = counter_tracks(doc->trace);
  doc->steps = step_windows(doc->trace);
  return doc;
}

namespace {

// The components of a path, last first ("/a/b/c.db" -> c.db, b, a), empty ones dropped.
std::vector<std::string> components_reversed(const std::string& path) {
  std::vector<std::string> out;
  size_t end = path.size();
  while (end > 0) {
    const size_t slash = path.rfind('/', end - 1);
    const size_t begin = slash == std::string::npos ? 0 : slash + 1;
    if (end > begin) out.push_back(path.substr(begin, end - begin));
    if (slash == std::string::npos) break;
    end = slash;
  }
  return out;
}

// The last k components of `comps` (reversed, as above) joined with '/'.
std::string suffix(const std::vector<std::string>& comps, size_t k) {
  std::string s;
  for (size_t i = std::min(k, comps.size()); i-- > 0;) {
    s += comps[i];
    if (i > 0) s += '/';
  }
  return s;
}

}  // namespace

std::vector<std::string> distinct_names(const std::vector<std::string>& paths) {
  std::vector<std::vector<std::string>> comps;
  for (const auto& p : paths) comps.push_back(components_reversed(p));
  std::vector<std::string> out(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    size_t k = 1;
    auto clashes = [&](size_t kk) {
      for (size_t j = 0; j < paths.size(); ++j) {
        if (j != i && paths[j] != paths[i] && suffix(comps[j], kk) == suffix(comps[i], kk))
          return true;
      }
      return false;
    };
    while (k < comps[i].size() && clashes(k)) ++k;
    out[i] = k >= comps[i].size() ? paths[i] : suffix(comps[i], k);
  }
  return out;
}

std::vector<StepBreakdown> step_breakdowns(const profiler::Metrics& m, const traces::Trace& t) {
  std::map<int32_t, int> pp_of;
  for (const auto& r : t.ranks) pp_of[r.rank] = r.pp;
  const bool pipelined = t.meta.pp > 1;
  std::vector<StepBreakdown> out;
  for (const auto& rm : m.ranks) {
    for (const auto& [step, tb] : rm.by_step) {
      StepBreakdown b;
      b.rank = rm.rank;
      b.step = step;
      b.compute_ns = tb.compute_ns;
      b.exposed_comm_ns = tb.exposed_comm_ns;
      b.window_ns = tb.window_ns;
      if (pipelined) {
        b.bubble_ns = tb.idle_ns;
      } else {
        b.idle_ns = tb.idle_ns;
      }
      out.push_back(b);
    }
  }
  return out;
}

std::vector<StepBreakdown> mean_per_rank(const std::vector<StepBreakdown>& per_step) {
  std::map<int32_t, std::pair<StepBreakdown, int64_t>> acc;
  for (const auto& b : per_step) {
    auto& [sum, n] = acc[b.rank];
    sum.rank = b.rank;
    sum.step = -1;
    sum.compute_ns += b.compute_ns;
    sum.exposed_comm_ns += b.exposed_comm_ns;
    sum.bubble_ns += b.bubble_ns;
    sum.idle_ns += b.idle_ns;
    sum.window_ns += b.window_ns;
    ++n;
  }
  std::vector<StepBreakdown> out;
  for (auto& [rank, p] : acc) {
    auto [s, n] = p;
    s.compute_ns /= n;
    s.exposed_comm_ns /= n;
    s.bubble_ns /= n;
    s.idle_ns /= n;
    s.window_ns /= n;
    out.push_back(s);
  }
  return out;
}

namespace {

struct StepMeans {
  int64_t compute_ns = 0, exposed_ns = 0;
};

std::map<int32_t, StepMeans> means_by_step(const profiler::Metrics& m) {
  std::map<int32_t, std::pair<StepMeans, int64_t>> acc;
  for (const auto& rm : m.ranks) {
    for (const auto& [step, tb] : rm.by_step) {
      auto& [s, n] = acc[step];
      s.compute_ns += tb.compute_ns;
      s.exposed_ns += tb.exposed_comm_ns;
      ++n;
    }
  }
  std::map<int32_t, StepMeans> out;
  for (auto& [step, p] : acc) {
    out[step] = {p.first.compute_ns / p.second, p.first.exposed_ns / p.second};
  }
  return out;
}

}  // namespace

std::vector<StepDiff> diff_steps(const profiler::Metrics& a, const profiler::Metrics& b) {
  std::map<int32_t, const profiler::StepStats*> bs;
  for (const auto& s : b.steps) bs[s.step] = &s;
  const auto ma = means_by_step(a);
  const auto mb = means_by_step(b);
  std::vector<StepDiff> out;
  for (const auto& s : a.steps) {
    auto it = bs.find(s.step);
    if (it == bs.end()) continue;
    StepDiff d;
    d.step = s.step;
    d.a_ns = s.duration_ns();
    d.b_ns = it->second->duration_ns();
    if (auto x = ma.find(s.step); x != ma.end()) {
      d.a_compute_ns = x->second.compute_ns;
      d.a_exposed_ns = x->second.exposed_ns;
    }
    if (auto x = mb.find(s.step); x != mb.end()) {
      d.b_compute_ns = x->second.compute_ns;
      d.b_exposed_ns = x->second.exposed_ns;
    }
    out.push_back(d);
  }
  return out;
}

double OpDiff::ratio() const {
  if (a_ns == 0) return b_ns == 0 ? 1.0 : std::numeric_limits<double>::infinity();
  return static_cast<double>(b_ns) / static_cast<double>(a_ns);
}

std::vector<OpDiff> diff_ops(const traces::Trace& a, const traces::Trace& b) {
  std::map<std::string, OpDiff> by_name;
  auto rank_steps = [](const traces::Trace& t) {
    std::set<std::pair<int32_t, int32_t>> seen;
    for (const auto& s : t.spans) {
      if (s.step >= 0) seen.emplace(s.rank, s.step);
    }
    return std::max<int64_t>(1, static_cast<int64_t>(seen.size()));
  };
  const int64_t ua = rank_steps(a), ub = rank_steps(b);
  auto add = [&](const traces::Trace& t, bool is_a) {
    // Totals per name id first (one map lookup per name, not per span).
    std::vector<int64_t> ns(t.strings.size(), 0), count(t.strings.size(), 0);
    for (const auto& s : t.spans) {
      ns[s.name] += s.duration_ns();
      ++count[s.name];
    }
    for (size_t id = 0; id < ns.size(); ++id) {
      if (count[id] == 0) continue;
      auto& d = by_name[t.strings.str(static_cast<traces::NameId>(id))];
      (is_a ? d.a_total_ns : d.b_total_ns) += ns[id];
      (is_a ? d.a_count : d.b_count) += count[id];
    }
  };
  add(a, true);
  add(b, false);
  auto mean = [](int64_t total, int64_t n) { return (total + n / 2) / n; };
  std::vector<OpDiff> out;
  out.reserve(by_name.size());
  for (auto& [name, d] : by_name) {
    d.name = name;
    d.a_rank_steps = ua;
    d.b_rank_steps = ub;
    d.a_ns = mean(d.a_total_ns, ua);
    d.b_ns = mean(d.b_total_ns, ub);
    out.push_back(std::move(d));
  }
  // by_name is ordered by name, so a stable sort on |diff| leaves ties by name.
  std::stable_sort(out.begin(), out.end(), [](const OpDiff& x, const OpDiff& y) {
    return std::abs(x.diff_ns()) > std::abs(y.diff_ns());
  });
  return out;
}

int64_t step_start_ns(const profiler::Metrics& m, int32_t step) {
  for (const auto& s : m.steps) {
    if (s.step == step) return s.start_ns;
  }
  return INT64_MIN;
}

}  // namespace orrery::gui
