// A trace opened through its zoom levels (gui/zoom_view.hpp, load_document with LoadOptions):
// what the timeline draws zoomed out from the levels equals, pixel bucket by pixel bucket (span
// count and busy time), what the spans give in the same rows; the folded items keep the totals;
// a file without zoom levels opens with them computed; the window of spans zoomed in is the
// spans the file has there.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <QDir>
#include <algorithm>
#include <filesystem>

#include "orrery/gui/document.hpp"
#include "orrery/gui/zoom_view.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"

namespace orrery::gui {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("orrery_gui_zoom_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

struct Column {
  int64_t count = 0, busy_ns = 0;
  bool operator==(const Column&) const = default;
};

// Per level-`level` bucket (one pixel under ns_per_px = the bucket's width), from the spans of a
// row of the loaded trace: the spans starting in it and their time inside it.
std::vector<Column> raw_columns(const LaneRow& row, const traces::ZoomGrid& g, int level) {
  std::vector<Column> cols(static_cast<size_t>(g.buckets(level)));
  const int64_t w = g.bucket_ns(level);
  for (size_t i = 0; i < row.size(); ++i) {
    const int64_t s = row.start_ns[i], e = row.end_ns[i];
    cols[static_cast<size_t>(g.bucket_of(level, s))].count += 1;
    for (int64_t b = g.bucket_of(level, s); b <= g.bucket_of(level, std::max(s, e - 1)); ++b) {
      const int64_t bs = g.origin_ns + b * w;
      cols[static_cast<size_t>(b)].busy_ns +=
          std::max<int64_t>(0, std::min(e, bs + w) - std::max(s, bs));
    }
  }
  return cols;
}

std::vector<Column> zoom_columns(const traces::ZoomIndex& z, const Lane& lane, int row, int level) {
  std::vector<Column> cols(static_cast<size_t>(z.grid().buckets(level)));
  for (const auto& b : z.buckets(lane.rank, lane.stream, row, level, 0, z.grid().buckets(level))) {
    const FoldSummary f = bucket_summary(b);
    cols[static_cast<size_t>(b.index)] = {f.count, f.busy_ns};
  }
  return cols;
}

class ZoomView : public ::testing::Test {
 protected:
  void SetUp() override {
    traces::SynthOptions o;
    o.ranks = 3;
    o.steps = 4;
    o.layers = 6;
    o.jitter_ns = 20'000;
    path_ = temp_path("synth.db");
    std::filesystem::remove(path_);
    traces::write_trace(traces::synthesize(o), path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_;
};

TEST_F(ZoomView, SummariesDrawWhatTheSpansDrawPerPixelBucket) {
  const auto full = load_document(path_);  // every span loaded
  ASSERT_FALSE(full->zoomed());
  const auto doc = load_document(path_, LoadOptions{0});  // through the zoom levels
  ASSERT_TRUE(doc->zoomed());
  EXPECT_TRUE(doc->zoom->from_file()) << doc->zoom->note();
  EXPECT_TRUE(doc->trace.spans.empty());
  EXPECT_EQ(doc->index.span_count(), full->trace.spans.size());
  ASSERT_EQ(doc->index.lanes().size(), full->index.lanes().size());
  EXPECT_EQ(doc->steps.size(), full->steps.size());
  const auto& g = doc->zoom->grid();
  size_t rows_checked = 0;
  for (size_t l = 0; l < full->index.lanes().size(); ++l) {
    const Lane& fl = full->index.lanes()[l];
    const Lane& zl = doc->index.lanes()[l];
    ASSERT_EQ(zl.rank, fl.rank);
    ASSERT_EQ(zl.stream, fl.stream);
    ASSERT_EQ(zl.rows.size(), fl.rows.size()) << "lane " << l;  // the same rows
    for (size_t r = 0; r < fl.rows.size(); ++r) {
      for (int level = 0; level <= g.levels; ++level) {
        const auto raw = raw_columns(fl.rows[r], g, level);
        const auto zoom = zoom_columns(*doc->zoom, zl, static_cast<int>(r), level);
        ASSERT_EQ(raw, zoom) << "lane " << l << " row " << r << " level " << level;
      }
      // Folded as the view folds them (3 px), the items keep the row's count and busy time.
      const int level = 1;
      TimeMapping m;
      m.origin_ns = g.origin_ns;
      m.ns_per_px = static_cast<double>(g.bucket_ns(level));
      std::vector<ZoomItem> items;
      zoom_items(
          doc->zoom->buckets(zl.rank, zl.stream, static_cast<int>(r), level, 0, g.buckets(level)),
          m, 3, items);
      int64_t count = 0, busy = 0, raw_busy = 0;
      for (const auto& it : items) {
        count += it.fold.count;
        busy += it.fold.busy_ns;
        EXPECT_LE(it.fold.start_ns, it.fold.end_ns);
      }
      for (size_t i = 0; i < fl.rows[r].size(); ++i)
        raw_busy += fl.rows[r].end_ns[i] - fl.rows[r].start_ns[i];
      EXPECT_EQ(count, static_cast<int64_t>(fl.rows[r].size()));
      EXPECT_EQ(busy, raw_busy);
      ++rows_checked;
    }
  }
  EXPECT_GT(rows_checked, 6u);
}

TEST_F(ZoomView, LevelForAPixel) {
  traces::ZoomGrid g;
  g.base_ns = 100;
  g.levels = 4;
  EXPECT_EQ(zoom_level_for(g, 50), 0);   // finer than level 0
  EXPECT_EQ(zoom_level_for(g, 100), 0);  // level 0 is a pixel
  EXPECT_EQ(zoom_level_for(g, 399), 0);  // level 1 (400 ns) would be wider than a pixel
  EXPECT_EQ(zoom_level_for(g, 400), 1);
  EXPECT_EQ(zoom_level_for(g, 1e9), 4);  // the coarsest
}

TEST_F(ZoomView, FileWithoutZoomLevelsOpensWithThemComputed) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "DROP TABLE zoom_levels; DROP TABLE zoom_lanes; DROP TABLE zoom_chunks",
                   nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  const auto doc = load_document(path_, LoadOptions{0});
  ASSERT_TRUE(doc->zoomed());
  EXPECT_FALSE(doc->zoom->from_file());
  EXPECT_NE(doc->zoom->note().find("no zoom levels"), std::string::npos) << doc->zoom->note();
  const auto full = load_document(path_);
  const auto& g = doc->zoom->grid();
  const Lane& fl = full->index.lanes()[0];
  EXPECT_EQ(raw_columns(fl.rows[0], g, 0), zoom_columns(*doc->zoom, doc->index.lanes()[0], 0, 0));
}

TEST_F(ZoomView, WindowHoldsTheSpansOfTheFileThere) {
  const auto full = load_document(path_);
  const auto doc = load_document(path_, LoadOptions{0});
  const int64_t t0 = full->index.start_ns(), t1 = full->index.end_ns();
  const int64_t a = t0 + (t1 - t0) / 3, b = t0 + (t1 - t0) / 2;
  const auto w = load_window(*doc, a, b);
  size_t expected = 0;
  for (const auto& s : full->trace.spans) {
    if (s.start_ns < b && (s.end_ns > a || (s.start_ns == s.end_ns && s.start_ns >= a))) ++expected;
  }
  EXPECT_EQ(w->trace.spans.size(), expected);
  EXPECT_GT(expected, 10u);
  ASSERT_EQ(w->index.lanes().size(), doc->index.lanes().size());
  for (size_t l = 0; l < w->index.lanes().size(); ++l)  // padded to the zoom's rows
    EXPECT_GE(w->index.lanes()[l].rows.size(), doc->index.lanes()[l].rows.size());
}

}  // namespace
}  // namespace orrery::gui
