// The GUI's colours, in one place: the colour of each span kind and the fixed colours of the
// timeline, compare and charts views. Plain QColor values and small functions, no widgets, so every
// view draws with the same colours and a change of scheme is one edit.
#pragma once

#include <QColor>
#include <QRgb>
#include <algorithm>
#include <array>
#include <cstddef>

#include "orrery/traces/span.hpp"

namespace orrery::gui::palette {

// A colour written as 0xRRGGBB, opaque (constexpr, unlike QColor(QRgb); the same colour).
constexpr QColor rgb(QRgb v) {
  return QColor(static_cast<int>((v >> 16) & 0xFF), static_cast<int>((v >> 8) & 0xFF),
                static_cast<int>(v & 0xFF));
}

// Span kinds, indexed by SpanKind.
inline constexpr std::array<QColor, traces::kSpanKindCount> kKindColors = {
    rgb(0x4C8BF5),  // compute: blue
    rgb(0xE8710A),  // collective: orange
    rgb(0xA142F4),  // p2p: purple
    rgb(0x1E8E3E),  // memcpy: green
    rgb(0x9AA0A6),  // phase: grey
    rgb(0x12B5CB),  // data: teal
    rgb(0xF9AB00),  // optimizer: amber
    rgb(0x8D6E63),  // other: brown
};

// The colour of a kind; a kind out of range is drawn as Other.
inline QColor kind_color(traces::SpanKind k) {
  const auto i = static_cast<int>(k);
  return kKindColors[static_cast<size_t>(
      i >= 0 && i < traces::kSpanKindCount ? i : traces::kSpanKindCount - 1)];
}

// A span's colour: its kind's, a little lighter or darker per name, so neighbouring spans of one
// kind stay distinguishable.
inline QColor span_color(traces::SpanKind k, traces::NameId name) {
  QColor c = kind_color(k);
  const int shift = static_cast<int>((name * 2654435761u) >> 28) - 8;  // -8 .. 7
  return shift >= 0 ? c.lighter(100 + shift * 3) : c.darker(100 - shift * 3);
}

// Mixes a over b: a where t = 1, b where t = 0 (channel by channel, rounded; opaque).
inline QColor mix(const QColor& a, const QColor& b, double t) {
  t = t < 0 ? 0 : t > 1 ? 1 : t;
  auto ch = [t](int x, int y) { return static_cast<int>(y + (x - y) * t + 0.5); };
  return QColor(ch(a.red(), b.red()), ch(a.green(), b.green()), ch(a.blue(), b.blue()));
}

// A folded run of spans: the colour of the kind that covers most of its time, darker, shaded into
// the lane's background by how much of the run is busy (a run that is mostly gaps looks pale, as
// Perfetto and Tracy show density), with a lighter line along its top. A fully idle run keeps a
// quarter of the colour, so it stays visible.
inline QColor folded_color(traces::SpanKind k, double busy_fraction, const QColor& background) {
  return mix(kind_color(k).darker(130), background, 0.25 + 0.75 * busy_fraction);
}
inline QColor folded_edge_color(traces::SpanKind k) { return kind_color(k).lighter(130); }

// The outline of a kind's swatch in the kinds list; a switched-off kind's swatch is an empty box.
inline QColor kind_icon_border(traces::SpanKind k) { return kind_color(k).darker(150); }
inline constexpr QColor kKindOff = rgb(0x9AA0A6);

// Text on a span: dark on light colours, white on dark ones.
inline constexpr QColor kTextOnLight = rgb(0x101010);
inline constexpr QColor kTextOnDark = rgb(0xFFFFFF);
inline QColor text_on(const QColor& c) { return c.lightness() > 150 ? kTextOnLight : kTextOnDark; }

// The timeline.
inline constexpr QColor kBackground = rgb(0xFAFAFA);
inline constexpr QColor kEmptyText = rgb(0x606060);    // "Open a trace" when there is none
inline constexpr QColor kGroupHeader = rgb(0xDDE3EA);  // a dp/tp/pp group's band
inline constexpr QColor kRankHeader = rgb(0xECEFF3);   // a rank's band
inline constexpr QColor kBorder = rgb(0xC5CCD6);       // under headers and the axis, label column
inline constexpr QColor kDisclosure = rgb(0x505860);   // the headers' triangles
inline constexpr QColor kHeaderText = rgb(0x202428);
// Lanes alternate their background, starting again under each header.
inline constexpr QColor kLaneEven = rgb(0xFFFFFF);
inline constexpr QColor kLaneOdd = rgb(0xF3F5F7);
inline constexpr QColor kGrid = rgb(0xE6E8EB);        // tick lines across the lanes
inline constexpr QColor kFoldedText = rgb(0xFFFFFF);  // "N spans"
inline constexpr QColor kLaneLabel = rgb(0xF0F2F5);   // the lane names' column
inline constexpr QColor kLaneLabelText = rgb(0x303438);
inline constexpr QColor kLaneSeparator = rgb(0xE0E3E7);
inline constexpr QColor kSelectionOutline = rgb(0x111111);
inline constexpr QColor kSelectionHalo = rgb(0xFFEB3B);
// The selected span's flow: the other members' outlines and the arrows between them.
inline constexpr QColor kFlow = rgb(0xD81B60);
// Search matches: a frame inside each matching span.
inline constexpr QColor kSearchHit = rgb(0xFFD600);
// Counter tracks: the step function's line and the area under it.
inline constexpr QColor kCounterLine = rgb(0x00796B);
inline constexpr QColor kCounterFill = rgb(0xB2DFDB);
inline constexpr QColor kAccent = rgb(0x1A73E8);  // the range's edges and length; tokens/s
inline constexpr QColor kRangeFill = QColor(66, 133, 244, 40);
inline constexpr QColor kTextOnAccent = rgb(0xFFFFFF);
inline constexpr QColor kAxis = kRankHeader;  // the axis band looks like a rank's
inline constexpr QColor kTick = rgb(0x7A828C);
inline constexpr QColor kTickText = kHeaderText;
inline constexpr QColor kScaleText = kDisclosure;  // "x ms / 100 px" in the corner
// The steps' band at the bottom of the axis, alternately shaded; markers (lines and flags).
inline constexpr QColor kStepBandEven = rgb(0xDDE3EA);
inline constexpr QColor kStepBandOdd = rgb(0xCCD4DE);
inline constexpr QColor kMarker = rgb(0xE65100);
// The critical path of a step: the outline of its spans and the links between them.
inline constexpr QColor kCriticalPath = rgb(0xC62828);

// The compare view's A and B title bars look like the timeline's group headers.
inline constexpr QColor kCompareTitle = kGroupHeader;

// The charts: the step breakdown colours its parts like the kinds they come from (bubbles are
// pipeline waits, on p2p); idle is a neutral grey. Bars have a darker border.
inline constexpr QColor kBreakdownCompute =
    kKindColors[static_cast<size_t>(traces::SpanKind::Compute)];
inline constexpr QColor kBreakdownExposedComm =
    kKindColors[static_cast<size_t>(traces::SpanKind::Collective)];
inline constexpr QColor kBreakdownBubble = kKindColors[static_cast<size_t>(traces::SpanKind::P2P)];
inline constexpr QColor kBreakdownIdle = rgb(0xBDC1C6);
inline QColor bar_border(const QColor& c) { return c.darker(120); }
inline constexpr QColor kTokensPerS = kAccent;
inline constexpr QColor kEfficiency = rgb(0xD93025);

// The experts' heat map: an expert at its block's mean load is white, one with more tokens shades
// to red (twice the mean and above: full), one with fewer to blue (none: full).
inline constexpr QColor kLoadEven = rgb(0xFFFFFF);
inline constexpr QColor kLoadOver = rgb(0xD93025);
inline constexpr QColor kLoadUnder = rgb(0x4C8BF5);
inline QColor load_color(double share) {
  const double f = share >= 1 ? std::min(share - 1.0, 1.0) : 1.0 - std::max(share, 0.0);
  const QColor& to = share >= 1 ? kLoadOver : kLoadUnder;
  auto mix = [f](int a, int b) { return static_cast<int>(a + (b - a) * f + 0.5); };
  return QColor(mix(kLoadEven.red(), to.red()), mix(kLoadEven.green(), to.green()),
                mix(kLoadEven.blue(), to.blue()));
}

}  // namespace orrery::gui::palette
