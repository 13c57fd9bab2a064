// orrery-gui: the desktop application. `orrery-gui [TRACE...]` opens traces (the first in the
// timeline and as A in the compare view, the second as B); `--screenshot FILE.png [--size WxH]` renders the
// window as a user first sees it and exits (for documentation, bug reports and tests).
#include <QApplication>
#include <QCommandLineParser>
#include <QPixmap>
#include <QTableView>
#include <QTimer>
#include <cstdio>
#include <exception>

#include "orrery/common/error.hpp"
#include "orrery/gui/widgets/compare_view.hpp"
#include "orrery/gui/widgets/main_window.hpp"
#include "orrery/gui/widgets/timeline_view.hpp"

namespace {

bool parse_pair(const QString& text, QChar sep, qlonglong& a, qlonglong& b) {
  const auto parts = text.split(sep);
  if (parts.size() != 2) return false;
  bool ok1 = false, ok2 = false;
  a = parts[0].trimmed().toLongLong(&ok1);
  b = parts[1].trimmed().toLongLong(&ok2);
  return ok1 && ok2;
}

// --range and --zoom offsets from the trace start: at most 1e17 ns (about 3 years) either way, so
// the start plus an offset and the view's differences of times stay within int64 (any 64-bit
// value used to overflow there: UBSan, signed integer overflow).
constexpr qlonglong kMaxOffsetNs = 100'000'000'000'000'000LL;

bool parse_offsets(const QString& text, qlonglong& t0, qlonglong& t1) {
  return parse_pair(text, ':', t0, t1) && t0 >= -kMaxOffsetNs && t0 <= kMaxOffsetNs &&
         t1 >= -kMaxOffsetNs && t1 <= kMaxOffsetNs;
}

int fail(const QString& msg, int rc) {
  std::fprintf(stderr, "orrery-gui: error: %s\n", msg.toLocal8Bit().constData());
  return rc;
}

// The options that show one feature (for the README's screenshots): --step, --flow, --counter,
// --compare-op and --critical-path, applied after the others. An error message, or empty.
struct FeatureOptions {
  QCommandLineOption step{QString("step"), "Frame step N across ranks.", "N"};
  QCommandLineOption flow{QString("flow"),
                          "Select the first collective or transfer whose name contains TEXT, at or "
                          "after the start of the view, and frame its flow.",
                          "TEXT"};
  QCommandLineOption counter{QString("counter"),
                             "Scroll the timeline to the first counter track named NAME.", "NAME"};
  QCommandLineOption compare_op{
      QString("compare-op"),
      "Show the compare tab with its per-op table, and jump to op NAME in both panes (top: the "
      "largest difference).",
      "NAME"};
  QCommandLineOption critical{QString("critical-path"),
                              "Draw the critical path of the step at the centre of the view (or of "
                              "the selected span)."};
  QList<QCommandLineOption> all() const { return {step, flow, counter, compare_op, critical}; }
};

QString apply_feature_options(orrery::gui::MainWindow& win, const QCommandLineParser& cli,
                              const FeatureOptions& o) {
  auto* tl = win.timeline();
  if (cli.isSet(o.step)) {
    bool ok = false;
    const int n = cli.value(o.step).toInt(&ok);
    if (!ok || !win.go_to_step(n))
      return "--step: no step '" + cli.value(o.step) + "' in the trace";
  }
  if (cli.isSet(o.flow) && tl->show_flow(cli.value(o.flow)) < 0) {
    return "--flow: no collective or transfer named like '" + cli.value(o.flow) +
           "' from the start of the view on";
  }
  if (cli.isSet(o.counter) && !tl->scroll_to_counter(cli.value(o.counter).toStdString())) {
    return "--counter: no counter track named '" + cli.value(o.counter) + "'";
  }
  if (cli.isSet(o.critical) && !win.toggle_critical_path()) {
    return "--critical-path: no step at the centre of the view (use --step N)";
  }
  if (cli.isSet(o.compare_op)) {
    auto* cmp = win.compare();
    if (win.document_count() < 2) return "--compare-op: needs two traces";
    win.show_tab("compare");
    const QString name = cli.value(o.compare_op);
    const int row = name == "top" ? 0 : cmp->op_row(name);
    if (row < 0 || !cmp->jump_to_op(row)) return "--compare-op: no op named '" + name + "'";
    cmp->emphasize_tables();
    cmp->op_table()->selectRow(row);
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QCoreApplication::setOrganizationName("orrery");
  QCoreApplication::setApplicationName("orrery-gui");
  QCoreApplication::setApplicationVersion("0.1.0");

  QCommandLineParser cli;
  cli.setApplicationDescription(
      "Orrery: timelines of real and simulated training runs, metrics and charts.");
  cli.addHelpOption();
  cli.addVersionOption();
  cli.addPositionalArgument(
      "TRACE",
      "Trace files (.db) to open; a .csv from `orrery sweep --csv` opens as scaling curves.",
      "[TRACE...]");
  QCommandLineOption shot(QString("screenshot"), "Render the window to FILE.png and exit.",
                          "FILE.png");
  QCommandLineOption size(QString("size"), "Window size for --screenshot (default 1600x1000).",
                          "WxH", "1600x1000");
  QCommandLineOption tab(QString("tab"), "Tab to show: timeline, compare, charts or experts.",
                         "NAME", "timeline");
  QCommandLineOption select(
      QString("select"),
      "Select the first span whose name contains TEXT, at or after the start of the view.", "TEXT");
  QCommandLineOption range(QString("range"),
                           "Select the range T0:T1 (ns from the trace start) and show its metrics.",
                           "T0:T1");
  QCommandLineOption zoom(QString("zoom"), "Show T0:T1 (ns from the trace start).", "T0:T1");
  QCommandLineOption group(QString("group"), "Group lanes by rank, dp, tp or pp.", "BY", "rank");
  cli.addOptions({shot, size, tab, select, range, zoom, group});
  const FeatureOptions features;
  cli.addOptions(features.all());
  cli.process(app);

  const bool screenshot = cli.isSet(shot);
  qlonglong w = 1600, h = 1000;
  if (!parse_pair(cli.value(size), 'x', w, h) || w < 200 || h < 150 || w > 10000 || h > 10000) {
    return fail("--size: expected WxH such as 1600x1000, got '" + cli.value(size) + "'", 2);
  }
  const QStringList groups{"rank", "dp", "tp", "pp"},
      tabs{"timeline", "compare", "charts", "experts"};
  if (!groups.contains(cli.value(group))) {
    return fail("--group: expected rank, dp, tp or pp, got '" + cli.value(group) + "'", 2);
  }
  if (!tabs.contains(cli.value(tab))) {
    return fail(
        "--tab: expected timeline, compare, charts or experts, got '" + cli.value(tab) + "'", 2);
  }
  qlonglong r0 = 0, r1 = 0, z0 = 0, z1 = 0;
  if (cli.isSet(range) && !parse_offsets(cli.value(range), r0, r1)) {
    return fail("--range: expected T0:T1 in ns from the trace start, each within +-1e17, got '" +
                    cli.value(range) + "'",
                2);
  }
  if (cli.isSet(zoom) && !parse_offsets(cli.value(zoom), z0, z1)) {
    return fail("--zoom: expected T0:T1 in ns from the trace start, each within +-1e17, got '" +
                    cli.value(zoom) + "'",
                2);
  }

  orrery::gui::MainWindow win;
  win.resize(static_cast<int>(w), static_cast<int>(h));
  const QStringList files = cli.positionalArguments();
  QString first_trace;
  for (const QString& f : files) {
    if (!f.endsWith(".csv", Qt::CaseInsensitive)) {
      first_trace = f;
      break;
    }
  }
  auto apply_view_options = [&] {
    // GroupBy's values are the positions in `groups` (Rank, DP, TP, PP).
    win.set_group_by(static_cast<orrery::gui::GroupBy>(groups.indexOf(cli.value(group))));
    auto doc = win.current_document();
    const int64_t zero = doc ? doc->index.start_ns() : 0;
    if (cli.isSet(zoom)) win.timeline()->zoom_to(zero + z0, zero + z1);
    if (cli.isSet(range)) win.select_range(zero + r0, zero + r1);
    if (cli.isSet(select)) {
      win.search(cli.value(select));
      win.search_from(win.timeline()->visible_start_ns());
    }
    win.show_tab(cli.value(tab));
  };

  if (screenshot) {
    try {
      win.open_files_now(files);
    } catch (const orrery::InputError& e) {
      return fail(QString::fromUtf8(e.what()), 2);
    } catch (const std::exception& e) {
      return fail(QString::fromUtf8(e.what()), 1);
    }
    // Each trace opened is shown in turn; the first one named is the one to show.
    if (win.document_count() > 0) win.show_document(first_trace);
    win.show();
    QCoreApplication::processEvents();
    win.wait_for_metrics();
    apply_view_options();
    win.wait_for_metrics();
    QCoreApplication::processEvents();
    if (const QString err = apply_feature_options(win, cli, features); !err.isEmpty())
      return fail(err, 2);
    QCoreApplication::processEvents();
    const QPixmap pm = win.grab();
    if (!pm.save(cli.value(shot), "PNG")) return fail("cannot write " + cli.value(shot), 2);
    return 0;
  }

  win.show();
  // Once every file named is loaded (or failed), show the first trace named and apply the options;
  // files opened later from the menu do not count.
  int pending = static_cast<int>(files.size());
  if (!files.isEmpty()) {
    auto one_done = [&] {
      if (pending <= 0 || --pending > 0) return;
      if (win.document_count() > 0) win.show_document(first_trace);
      if (cli.isSet(zoom) || cli.isSet(range) || cli.isSet(select) || cli.isSet(tab) ||
          cli.isSet(group))
        apply_view_options();
      const QString err = apply_feature_options(win, cli, features);
      if (!err.isEmpty()) std::fprintf(stderr, "orrery-gui: %s\n", err.toLocal8Bit().constData());
    };
    QObject::connect(&win, &orrery::gui::MainWindow::documentLoaded, &win, one_done);
    QObject::connect(&win, &orrery::gui::MainWindow::loadFailed, &win, one_done);
    win.open_files(files);
  }
  return app.exec();
}
