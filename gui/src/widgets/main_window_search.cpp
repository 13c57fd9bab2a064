// The main window's search (see main_window.hpp): over the spans in memory (SpanSearch), or, for a
// trace opened through its zoom levels, over the whole file in the background (file_search.hpp),
// next / previous zooming the timeline to each hit.
#include <QLabel>
#include <QLineEdit>
#include <QtConcurrent>

#include "orrery/common/format.hpp"
#include "orrery/gui/widgets/main_window.hpp"
#include "orrery/gui/widgets/timeline_view.hpp"

namespace orrery::gui {

namespace {
// Hits of a file search kept for next / previous (about 40 bytes each).
constexpr size_t kFileHitsKept = 1'000'000;
}  // namespace

void MainWindow::clear_search() {
  search_.clear();
  if (file_search_cancel_) *file_search_cancel_ = true;
  file_search_cancel_.reset();
  ++file_search_generation_;
  file_search_ = FileSearchResult{};
  file_search_running_ = false;
  file_jump_pending_ = false;
  file_cursor_ = -1;
}

void MainWindow::search(const QString& text) {
  auto d = current_document();
  if (!d) return;
  search_edit_->setText(text);
  clear_search();
  if (text.isEmpty()) {  // an empty query matches nothing and says nothing
    search_label_->clear();
    timeline_->set_highlighted({});
    return;
  }
  if (d->zoomed()) {
    start_file_search(d, text);
    return;
  }
  search_.run(d->trace, text.toStdString(), timeline_->kind_mask());
  // Every match is framed in the timeline.
  std::vector<uint8_t> flags(d->trace.spans.size(), 0);
  for (uint32_t m : search_.matches()) flags[m] = 1;
  timeline_->set_highlighted(std::move(flags));
  search_label_->setText(search_status());
}

void MainWindow::start_file_search(const std::shared_ptr<TraceDocument>& d, const QString& text) {
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  file_search_cancel_ = cancel;
  file_search_running_ = true;
  const uint64_t generation = file_search_generation_;
  auto* w = new QFutureWatcher<FileSearchResult>(this);
  jobs_.push_back(w);
  connect(w, &QFutureWatcherBase::finished, this, [this, w, d, generation] {
    jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), w), jobs_.end());
    w->deleteLater();
    // A newer search, another trace or a cleared box: this result is not wanted.
    if (generation != file_search_generation_ || current_document() != d) return;
    file_search_running_ = false;
    file_search_cancel_.reset();
    try {
      file_search_ = w->result();
    } catch (const std::exception& e) {  // a damaged block: say so where the count would be
      file_search_ = FileSearchResult{};
      search_label_->setText(tr("search stopped: %1").arg(QString::fromUtf8(e.what())));
      emit searchFinished();
      return;
    }
    search_label_->setText(search_status());
    highlight_window_matches();
    if (file_jump_pending_ && !file_search_.hits.empty()) {
      jump_to_file_hit(0);
      timeline_->setFocus();
    }
    file_jump_pending_ = false;
    emit searchFinished();
  });
  const std::string query = text.toStdString();
  const KindMask kinds = timeline_->kind_mask();
  w->setFuture(QtConcurrent::run([d, query, kinds, cancel] {
    return search_file(*d->reader, d->trace.strings, query, kinds, kFileHitsKept, cancel.get());
  }));
  search_label_->setText(search_status());
}

void MainWindow::highlight_window_matches() {
  auto d = current_document();
  if (!d || !d->zoomed() || search_edit_->text().isEmpty()) return;
  if (!timeline_->window_loaded()) return;  // zoomed out: the levels have no spans to frame
  const traces::Trace& shown = timeline_->shown().trace;
  SpanSearch s;
  s.run(shown, search_edit_->text().toStdString(), timeline_->kind_mask());
  std::vector<uint8_t> flags(shown.spans.size(), 0);
  for (uint32_t m : s.matches()) flags[m] = 1;
  timeline_->set_highlighted(std::move(flags));
}

QString MainWindow::search_status() const {
  auto d = current_document();
  if (!d || search_edit_->text().isEmpty()) return {};
  if (d->zoomed()) {
    if (file_search_running_)
      return tr("searching %1 spans...").arg(static_cast<qulonglong>(d->zoom->span_count()));
    if (file_search_.count == 0) return tr("no match");
    const QString where = file_cursor_ >= 0 ? tr("%1 / ").arg(file_cursor_ + 1) : QString();
    const QString kept = static_cast<int64_t>(file_search_.hits.size()) < file_search_.count
                             ? tr(" (the first %1 for next/previous)").arg(file_search_.hits.size())
                             : QString();
    return tr("%1%2 matches, %3%4")
        .arg(where)
        .arg(file_search_.count)
        .arg(QString::fromStdString(format_duration_ns(static_cast<double>(file_search_.total_ns))))
        .arg(kept);
  }
  if (search_.size() == 0) return tr("no match");
  int64_t total = 0;
  for (uint32_t m : search_.matches()) total += d->trace.spans[m].duration_ns();
  const QString where = search_.current() >= 0 ? tr("%1 / ").arg(search_.current() + 1) : QString();
  return tr("%1%2 matches, %3")
      .arg(where)
      .arg(search_.size())
      .arg(QString::fromStdString(format_duration_ns(static_cast<double>(total))));
}

bool MainWindow::has_search() const {
  return search_.size() > 0 || file_search_running_ || file_search_.count > 0;
}

bool MainWindow::file_search_active() const {
  auto d = current_document();
  return d && d->zoomed() && !file_search_.hits.empty();
}

void MainWindow::jump_to_file_hit(int64_t i) {
  file_cursor_ = i;
  const FileSearchHit& h = file_search_.hits[static_cast<size_t>(i)];
  // Zoomed to the hit, the timeline loads the spans around it; the hit is one of them.
  timeline_->zoom_to(h.start_ns, std::max(h.end_ns, h.start_ns + 1));
  timeline_->ensure_window();
  const auto& spans = timeline_->shown().trace.spans;
  for (size_t k = 0; timeline_->window_loaded() && k < spans.size(); ++k) {
    if (is_hit(spans[k], h)) {
      timeline_->select_span(static_cast<int64_t>(k), true);
      break;
    }
  }
  highlight_window_matches();
  search_label_->setText(search_status());
}

void MainWindow::search_next() {
  if (file_search_active()) {
    jump_to_file_hit((file_cursor_ + 1) % static_cast<int64_t>(file_search_.hits.size()));
    return;
  }
  const int64_t s = search_.next();
  if (s >= 0) {
    timeline_->select_span(s, true);
    search_label_->setText(search_status());
  }
}

bool MainWindow::search_from(int64_t t_ns) {
  if (file_search_active()) {
    const auto& hits = file_search_.hits;
    auto it = std::lower_bound(hits.begin(), hits.end(), t_ns,
                               [](const FileSearchHit& h, int64_t t) { return h.start_ns < t; });
    jump_to_file_hit(it == hits.end() ? 0 : it - hits.begin());
    return true;
  }
  const int64_t s = search_.first_at_or_after(t_ns);
  if (s < 0) return false;
  timeline_->select_span(s, true);
  search_label_->setText(search_status());
  return true;
}

void MainWindow::search_previous() {
  if (file_search_active()) {
    const auto n = static_cast<int64_t>(file_search_.hits.size());
    jump_to_file_hit(file_cursor_ <= 0 ? n - 1 : file_cursor_ - 1);
    return;
  }
  const int64_t s = search_.previous();
  if (s >= 0) {
    timeline_->select_span(s, true);
    search_label_->setText(search_status());
  }
}

}  // namespace orrery::gui
