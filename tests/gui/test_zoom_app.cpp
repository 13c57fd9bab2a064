// The timeline on a trace opened through its zoom levels, offscreen: zoomed out it draws the
// levels (no spans loaded) with the same folded blocks' totals, zoomed in it loads the window's
// spans and draws them; a corrupt zoom chunk is shown as an error naming it, never drawn.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <QImage>
#include <filesystem>

#include "orrery/gui/document.hpp"
#include "orrery/gui/widgets/timeline_view.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"

namespace orrery::gui {
namespace {

class ZoomTimeline : public ::testing::Test {
 protected:
  void SetUp() override {
    traces::SynthOptions o;
    o.ranks = 2;
    o.steps = 6;
    o.layers = 4;
    path_ = (std::filesystem::temp_directory_path() /
             ("orrery_gui_zoomapp_" + std::to_string(::getpid()) + ".db"))
                .string();
    std::filesystem::remove(path_);
    traces::write_trace(traces::synthesize(o), path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }

  static QImage render(TimelineView& v) {
    QImage img(v.viewport()->size(), QImage::Format_ARGB32_Premultiplied);
    img.fill(0);
    v.viewport()->render(&img);
    return img;
  }
  std::string path_;
};

TEST_F(ZoomTimeline, ZoomedOutDrawsTheLevelsZoomedInTheSpans) {
  auto doc = load_document(path_, LoadOptions{0});
  ASSERT_TRUE(doc->zoomed());
  TimelineView v;
  v.resize(1200, 700);
  v.set_window_spans(50);  // zoomed out the view holds more: it draws the levels
  v.set_document(doc);
  v.fit_all();
  render(v);
  EXPECT_TRUE(v.zoom_error().isEmpty()) << v.zoom_error().toStdString();
  EXPECT_FALSE(v.window_loaded());
  EXPECT_GT(v.last_frame_items(), 0u);
  // Zoomed into a twentieth of the trace: about a twentieth of the spans, under 50 here.
  const int64_t t0 = doc->index.start_ns(), t1 = doc->index.end_ns();
  const int64_t len =
      std::max<int64_t>(1, (t1 - t0) * 40 / static_cast<int64_t>(doc->zoom->span_count()));
  const int64_t mid = t0 + (t1 - t0) / 2;
  v.zoom_to(mid - len / 2, mid + len / 2);
  render(v);
  ASSERT_TRUE(v.window_loaded());
  EXPECT_GT(v.last_frame_items(), 0u);
  const auto& w = v.shown().trace.spans;
  EXPECT_FALSE(w.empty());
  for (const auto& s : w) {  // every span of the window overlaps its three views
    EXPECT_LT(s.start_ns, v.visible_end_ns() + (v.visible_end_ns() - v.visible_start_ns()) + 2);
  }
  // Back out: the levels again.
  v.fit_all();
  render(v);
  EXPECT_FALSE(v.window_loaded());
}

TEST_F(ZoomTimeline, CorruptChunkIsShownAsAnError) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  // Every chunk's checksum off by one: whatever level the view picks is damaged.
  ASSERT_EQ(sqlite3_exec(db, "UPDATE zoom_chunks SET crc32c = (crc32c + 1) % 4294967296", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto doc = load_document(path_, LoadOptions{0});
  TimelineView v;
  v.resize(1200, 700);
  v.set_window_spans(0);
  v.set_document(doc);
  v.fit_all();
  render(v);
  const std::string e = v.zoom_error().toStdString();
  EXPECT_NE(e.find("corrupt zoom levels"), std::string::npos) << e;
  EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
  EXPECT_EQ(v.last_frame_items(), 0u);
}

}  // namespace
}  // namespace orrery::gui
