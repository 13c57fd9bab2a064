// GUI benchmark: how long a big trace takes to open, and how long a timeline frame takes to paint
// (offscreen, the real paintEvent) at several zoom levels, as frames per second.
//
//   bench_gui [--spans N] [--width W] [--height H] [--frames F] [--trace FILE] [--keep] [--load-all]
//
// Generates a DDP trace of about N spans (default 5,000,000) with traces::synthesize, writes it to
// FILE (default /tmp/orrery_bench_gui.db, removed afterwards unless --keep or --trace names an
// existing file), then times gui::load_document (SQLite read + timeline index: what opening a file
// costs, off the GUI thread) and paints F frames per zoom level, each panned by 7 px, with the
// counter tracks on (under each rank) and a flow drawn: an all-reduce at the middle of the trace is
// selected, so every frame also draws its members' outlines and the arrows between them.
// "Open to first frame" is load_document, set_document, fit_all and the first full paint, with
// the process's peak RSS (VmHWM) at that point: a trace of more than 2 M spans opens through its
// zoom levels (gui::LoadOptions); --load-all loads every span as before. For a big trace, write
// it first with `orrery synth` and pass --trace, so that generating it does not count in the peak.
// A trace opened through its zoom levels is also searched, as the GUI searches it (over the file's
// blocks, gui/file_search.hpp), for "layers.3.forward": its wall time. Prints a table and one JSON
// line. Figures, not a test.
#if __has_include(<QApplication>)
#include <QApplication>
#include <QImage>
#include <QPainter>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "orrery/common/format.hpp"
#include "orrery/gui/critical_path.hpp"
#include "orrery/gui/document.hpp"
#include "orrery/gui/file_search.hpp"
#include "orrery/gui/widgets/timeline_view.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of this process (all its threads: the reader loads with several): on a shared,
// oversubscribed machine wall time mostly measures the other processes; CPU time is what we cost.
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The process's peak resident set (VmHWM), KiB.
long peak_rss_kib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "VmHWM:", 6) == 0) kib = std::strtol(line + 6, nullptr, 10);
  }
  std::fclose(f);
  return kib;
}

}  // namespace

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  int64_t spans = 5'000'000;
  int width = 1920, height = 1080, frames = 30;
  std::string path = "/tmp/orrery_bench_gui.db";
  bool keep = false, given = false, load_all = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--spans")
      spans = std::stoll(next());
    else if (a == "--width")
      width = std::stoi(next());
    else if (a == "--height")
      height = std::stoi(next());
    else if (a == "--frames")
      frames = std::stoi(next());
    else if (a == "--trace") {
      path = next();
      given = true;
    } else if (a == "--keep")
      keep = true;
    else if (a == "--load-all")
      load_all = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_gui [--spans N] [--width W] [--height H] [--frames F] [--trace "
                   "FILE] [--keep] [--load-all]\n");
      return 2;
    }
  }
  QApplication app(argc, argv);

  double gen_s = 0, write_s = 0;
  if (!(given && std::filesystem::exists(path))) {
    orrery::traces::SynthOptions o;
    o.ranks = 16;
    o.layers = 24;
    o.layers_per_bucket = 2;
    o.jitter_ns = 50'000;
    o.steps = orrery::traces::synth_steps_for_spans(o, spans);
    auto t0 = std::chrono::steady_clock::now();
    auto t = orrery::traces::synthesize(o);
    gen_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    std::filesystem::remove(path);
    orrery::traces::write_trace(t, path);
    write_s = seconds_since(t0);
  }

  // Opening: what the GUI's loader thread does (read everything, build the lanes and rows).
  auto t0 = std::chrono::steady_clock::now();
  double c0 = process_cpu_s();
  orrery::gui::LoadOptions load_options;
  if (load_all) load_options.zoom_above_spans = INT64_MAX;
  auto doc = orrery::gui::load_document(path, load_options);
  const double open_s = seconds_since(t0);
  const double open_cpu_s = process_cpu_s() - c0;
  double first_frame_s = 0, first_frame_cpu_s = 0;
  long first_frame_rss_kib = 0;
  {
    orrery::gui::TimelineView first;
    first.resize(width, height);
    first.set_document(doc);
    first.fit_all();
    QImage frame(first.viewport()->size(), QImage::Format_ARGB32_Premultiplied);
    first.viewport()->render(&frame);
    first_frame_s = seconds_since(t0);
    first_frame_cpu_s = process_cpu_s() - c0;
    first_frame_rss_kib = peak_rss_kib();
  }
  t0 = std::chrono::steady_clock::now();
  c0 = process_cpu_s();
  orrery::gui::TraceIndex again(doc->trace);
  const double index_s = seconds_since(t0);
  const double index_cpu_s = process_cpu_s() - c0;
  const size_t n = doc->trace.spans.size();

  orrery::gui::TimelineView view;
  view.resize(width, height);
  view.set_document(doc);
  view.show();
  QApplication::processEvents();
  view.fit_all();
  // A flow on: the collective that starts nearest the middle of the trace, on rank 0.
  const int64_t mid_t = doc->index.start_ns() + (doc->index.end_ns() - doc->index.start_ns()) / 2;
  int64_t flow_span = -1;
  for (size_t i = 0; i < doc->trace.spans.size(); ++i) {
    const auto& s = doc->trace.spans[i];
    if (s.rank != 0 || s.kind != orrery::traces::SpanKind::Collective) continue;
    if (flow_span < 0 ||
        std::llabs(s.start_ns - mid_t) <
            std::llabs(doc->trace.spans[static_cast<size_t>(flow_span)].start_ns - mid_t))
      flow_span = static_cast<int64_t>(i);
  }
  view.select_span(flow_span);
  // The critical path of the middle step, computed on demand (P): what the GUI thread spends.
  const int32_t crit_step = doc->steps.empty() ? -1 : doc->steps[doc->steps.size() / 2].step;
  t0 = std::chrono::steady_clock::now();
  c0 = process_cpu_s();
  const auto crit = orrery::gui::critical_path(doc->trace, crit_step);
  const double crit_s = seconds_since(t0);
  const double crit_cpu_s = process_cpu_s() - c0;
  // A zoomed trace's search runs over the file's blocks (gui/file_search.hpp), off the GUI thread.
  double search_s = -1;
  int64_t search_count = 0;
  if (doc->zoomed()) {
    t0 = std::chrono::steady_clock::now();
    search_count = orrery::gui::search_file(*doc->reader, doc->trace.strings, "layers.3.forward",
                                            orrery::gui::kAllKinds, 1'000'000)
                       .count;
    search_s = seconds_since(t0);
  }
  QImage img(view.viewport()->size(), QImage::Format_ARGB32_Premultiplied);

  const int64_t full = doc->index.end_ns() - doc->index.start_ns();
  const int64_t mid = doc->index.start_ns() + full / 2;
  struct Level {
    const char* name;
    double fraction;
  };
  const Level levels[] = {{"fit all", 1.0}, {"1/10", 1e-1},  {"1/100", 1e-2}, {"1/1e3", 1e-3},
                          {"1/1e4", 1e-4},  {"1/1e5", 1e-5}, {"1/1e6", 1e-6}};
  std::printf("bench_gui: %zu spans, %zu lanes, %dx%d viewport (%s)\n", n,
              doc->index.lanes().size(), width, height,
              QApplication::platformName().toLocal8Bit().constData());
  std::printf("  generate %.2f s, write %.2f s (not part of opening)\n", gen_s, write_s);
  std::printf("  critical path of step %d: %zu spans, wall %.2f s, CPU %.2f s\n", crit_step,
              crit.links.size(), crit_s, crit_cpu_s);
  if (search_s >= 0)
    std::printf("  search of the file for \"layers.3.forward\": %lld matches, wall %.2f s\n",
                static_cast<long long>(search_count), search_s);
  std::printf("  counter tracks on: %zu tracks; flow on: span %lld selected, %zu members\n",
              doc->counters.size(), static_cast<long long>(flow_span), view.flow_members().size());
  std::printf(
      "  open (load_trace + index): wall %.2f s, CPU %.2f s; of which index: wall %.2f s, CPU %.2f "
      "s\n",
      open_s, open_cpu_s, index_s, index_cpu_s);
  std::printf(
      "  open to first frame (%s): wall %.2f s, CPU %.2f s, peak RSS %.0f MiB; zoomed view: %s\n",
      doc->zoomed() ? "zoom levels" : "every span loaded", first_frame_s, first_frame_cpu_s,
      static_cast<double>(first_frame_rss_kib) / 1024.0,
      doc->zoomed() ? (doc->zoom->from_file() ? "levels from the file" : doc->zoom->note().c_str())
                    : "no");
  std::printf("  %-8s %12s %9s %9s %7s %9s %9s %7s %11s\n", "zoom", "visible", "wall ms", "max ms",
              "fps", "cpu ms", "max cpu", "cpu fps", "items/frame");
  std::string json = "{\"spans\":" + std::to_string(n) + ",\"open_s\":" + std::to_string(open_s) +
                     ",\"index_s\":" + std::to_string(index_s) +
                     ",\"open_cpu_s\":" + std::to_string(open_cpu_s) +
                     ",\"index_cpu_s\":" + std::to_string(index_cpu_s) +
                     ",\"zoomed\":" + std::string(doc->zoomed() ? "true" : "false") +
                     ",\"first_frame_s\":" + std::to_string(first_frame_s) +
                     ",\"first_frame_cpu_s\":" + std::to_string(first_frame_cpu_s) +
                     ",\"first_frame_peak_rss_kib\":" + std::to_string(first_frame_rss_kib) +
                     ",\"counter_tracks\":" + std::to_string(doc->counters.size()) +
                     ",\"flow_members\":" + std::to_string(view.flow_members().size()) +
                     ",\"file_search_s\":" + std::to_string(search_s) + ",\"levels\":[";
  double worst_fps = 1e30, worst_cpu_fps = 1e30, worst_frame_cpu_ms = 0;
  for (const auto& lv : levels) {
    const int64_t len = std::max<int64_t>(1, static_cast<int64_t>(full * lv.fraction));
    view.zoom_to(mid - len / 2, mid + len / 2);
    double total = 0, worst = 0, total_cpu = 0, worst_cpu = 0;
    size_t items = 0;
    for (int f = 0; f < frames + 2; ++f) {
      view.pan_by_px(f % 2 ? 7 : -7);
      img.fill(0);
      const auto s = std::chrono::steady_clock::now();
      const double cs = process_cpu_s();
      view.viewport()->render(&img);
      const double ms = seconds_since(s) * 1e3;
      const double cpu_ms = (process_cpu_s() - cs) * 1e3;
      if (f < 2) continue;  // warm-up
      total += ms;
      worst = std::max(worst, ms);
      total_cpu += cpu_ms;
      worst_cpu = std::max(worst_cpu, cpu_ms);
      items += view.last_frame_items();
    }
    const double avg = total / frames;
    const double fps = 1000.0 / avg;
    const double avg_cpu = total_cpu / frames;
    const double cpu_fps = 1000.0 / avg_cpu;
    worst_fps = std::min(worst_fps, fps);
    worst_cpu_fps = std::min(worst_cpu_fps, cpu_fps);
    worst_frame_cpu_ms = std::max(worst_frame_cpu_ms, worst_cpu);
    std::printf("  %-8s %12s %9.2f %9.2f %7.0f %9.2f %9.2f %7.0f %11zu\n", lv.name,
                orrery::format_duration_ns(static_cast<double>(len)).c_str(), avg, worst, fps,
                avg_cpu, worst_cpu, cpu_fps, items / frames);
    json += std::string(lv.name[0] == 'f' ? "" : ",") + "{\"zoom\":\"" + lv.name +
            "\",\"visible_ns\":" + std::to_string(len) +
            ",\"ms_per_frame\":" + std::to_string(avg) + ",\"fps\":" + std::to_string(fps) +
            ",\"cpu_ms_per_frame\":" + std::to_string(avg_cpu) +
            ",\"cpu_fps\":" + std::to_string(cpu_fps) + "}";
  }
  json += "],\"worst_fps\":" + std::to_string(worst_fps) +
          ",\"worst_cpu_fps\":" + std::to_string(worst_cpu_fps) +
          ",\"worst_frame_cpu_ms\":" + std::to_string(worst_frame_cpu_ms) + "}";
  std::printf("%s\n", json.c_str());
  if (!keep && !given) std::filesystem::remove(path);
  return 0;
}
#else
#include <cstdio>
int main() {
  std::printf("bench_gui: built without Qt 6; nothing to measure\n");
  return 0;
}
#endif
