// Zoom levels of a trace: computing them from sorted spans, packing them in checksummed chunks,
// the zoom tables, and reading them back for a viewer (see zoom.hpp).
#include "orrery/traces/zoom.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <optional>

#include "orrery/common/crc32c.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::traces {
namespace {

constexpr const char* kZoomSchema = R"sql(
DROP TABLE IF EXISTS zoom_levels;
DROP TABLE IF EXISTS zoom_lanes;
DROP TABLE IF EXISTS zoom_chunks;
CREATE TABLE zoom_levels(version INTEGER, origin_ns INTEGER, base_ns INTEGER, levels INTEGER,
                         span_count INTEGER, crc32c INTEGER);
CREATE TABLE zoom_lanes(rank INTEGER, stream INTEGER, rows INTEGER, spans INTEGER);
CREATE TABLE zoom_chunks(rank INTEGER, stream INTEGER, row INTEGER, level INTEGER, chunk INTEGER,
                         buckets INTEGER, crc32c INTEGER, packed BLOB,
                         PRIMARY KEY(rank, stream, row, level, chunk));
)sql";

struct StmtFree {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using Stmt = std::unique_ptr<sqlite3_stmt, StmtFree>;

[[noreturn]] void fail(sqlite3* db, const std::string& path, const std::string& what) {
  throw InternalError(path + ": zoom levels: " + what + " (" +
                      (db ? sqlite3_errmsg(db) : "no database") + ")");
}

Stmt prep(sqlite3* db, const std::string& path, const char* sql) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) {
    throw InputError(path + ": cannot read zoom levels (" + sqlite3_errmsg(db) + ")");
  }
  return Stmt(st);
}

void put_varint(uint64_t v, std::string& out) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

bool get_varint(const unsigned char*& p, const unsigned char* end, int64_t& v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p == end) return false;
    const uint64_t b = *p++;
    x |= (b & 0x7f) << shift;
    if (!(b & 0x80)) {
      v = static_cast<int64_t>(x);
      return v >= 0;
    }
  }
  return false;
}

uint32_t chunk_crc(const ZoomChunk& c) {
  unsigned char key[32];
  auto put = [&](int at, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) key[at + i] = static_cast<unsigned char>(v >> (8 * i));
  };
  put(0, static_cast<uint32_t>(c.rank), 4);
  put(4, static_cast<uint32_t>(c.stream), 4);
  put(8, static_cast<uint32_t>(c.row), 4);
  put(12, static_cast<uint32_t>(c.level), 4);
  put(16, static_cast<uint64_t>(c.chunk), 8);
  put(24, static_cast<uint64_t>(c.buckets), 8);
  return crc32c(c.packed.data(), c.packed.size(), crc32c(key, sizeof key));
}

// The header's checksum: CRC32C of version, origin, base, levels, span count and each lane's
// rank, stream, rows and spans, each as int64 little-endian, so that a damaged grid or row count
// cannot go unnoticed (the chunks carry their own).
uint32_t header_crc(const ZoomLevels& z) {
  std::vector<int64_t> v{kZoomVersion, z.grid.origin_ns, z.grid.base_ns, z.grid.levels,
                         z.span_count};
  for (const auto& l : z.lanes) v.insert(v.end(), {l.rank, l.stream, l.rows, l.spans});
  std::string bytes;
  for (int64_t x : v) {
    for (int i = 0; i < 8; ++i)
      bytes.push_back(static_cast<char>(static_cast<uint64_t>(x) >> (8 * i)));
  }
  return crc32c(bytes.data(), bytes.size());
}

// Adds `b` into `into` (the coarser bucket): counts and times add; the extent widens; the name
// with most time wins.
void combine(ZoomBucket& into, const ZoomBucket& b, bool first) {
  if (first) {
    const int64_t index = into.index;
    into = b;
    into.index = index;
    return;
  }
  into.count += b.count;
  into.lo_ns = std::min(into.lo_ns, b.lo_ns);
  into.hi_ns = std::max(into.hi_ns, b.hi_ns);
  for (int k = 0; k < kSpanKindCount; ++k) into.kind_ns[k] += b.kind_ns[k];
  if (b.name == into.name) {
    into.name_ns += b.name_ns;
  } else if (b.name_ns > into.name_ns) {
    into.name = b.name;
    into.name_ns = b.name_ns;
  }
}

std::vector<ZoomBucket> coarser(const std::vector<ZoomBucket>& fine) {
  std::vector<ZoomBucket> out;
  for (const auto& b : fine) {
    const int64_t parent = b.index / kZoomFanout;
    const bool first = out.empty() || out.back().index != parent;
    if (first) {
      out.emplace_back();
      out.back().index = parent;
    }
    combine(out.back(), b, first);
  }
  return out;
}

void pack_level(int32_t rank, int32_t stream, int row, int level,
                const std::vector<ZoomBucket>& buckets, const ZoomGrid& g,
                std::vector<ZoomChunk>& out) {
  const int64_t w = g.bucket_ns(level);
  for (size_t i = 0; i < buckets.size();) {
    ZoomChunk c;
    c.rank = rank;
    c.stream = stream;
    c.row = row;
    c.level = level;
    c.chunk = buckets[i].index / kZoomChunkBuckets;
    int64_t prev = c.chunk * kZoomChunkBuckets - 1;
    for (; i < buckets.size() && buckets[i].index / kZoomChunkBuckets == c.chunk; ++i) {
      const auto& b = buckets[i];
      const int64_t start = g.origin_ns + b.index * w;
      put_varint(static_cast<uint64_t>(b.index - prev - 1), c.packed);
      prev = b.index;
      put_varint(static_cast<uint64_t>(b.count), c.packed);
      put_varint(static_cast<uint64_t>(b.lo_ns - start), c.packed);
      put_varint(static_cast<uint64_t>(b.hi_ns - b.lo_ns), c.packed);
      // A presence byte (bit k: kind k has time here), then those kinds' times.
      unsigned present = 0;
      for (int k = 0; k < kSpanKindCount; ++k) present |= b.kind_ns[k] > 0 ? 1u << k : 0u;
      c.packed.push_back(static_cast<char>(present));
      for (int k = 0; k < kSpanKindCount; ++k) {
        if (present & (1u << k)) put_varint(static_cast<uint64_t>(b.kind_ns[k]), c.packed);
      }
      put_varint(static_cast<uint64_t>(b.name), c.packed);
      put_varint(static_cast<uint64_t>(b.name_ns), c.packed);
      ++c.buckets;
    }
    c.crc32c = chunk_crc(c);
    out.push_back(std::move(c));
  }
}

// One (rank, stream) at a time: assigns rows as the timeline does and accumulates level 0 densely
// per row; finish() builds the coarser levels and packs them.
class LaneBuilder {
 public:
  explicit LaneBuilder(const ZoomGrid& g) : g_(g) {}

  void begin(int32_t rank, int32_t stream) {
    lane_ = ZoomLane{rank, stream, 0, 0};
    row_last_end_.clear();
    rows_.clear();
    group_.clear();
  }
  bool active() const { return lane_.spans > 0 || !group_.empty(); }
  int32_t rank() const { return lane_.rank; }
  int32_t stream() const { return lane_.stream; }

  void add(const Span& s) {
    // Equal starts go longest first, as the timeline sorts them, so a parent precedes its child.
    if (!group_.empty() && group_.front().start_ns != s.start_ns) flush_group();
    group_.push_back(s);
  }

  void finish(ZoomLevels& out) {
    flush_group();
    if (lane_.spans == 0) return;
    lane_.rows = static_cast<int>(rows_.size());
    out.lanes.push_back(lane_);
    for (size_t r = 0; r < rows_.size(); ++r) {
      std::vector<ZoomBucket> level;
      for (size_t i = 0; i < rows_[r].size(); ++i) {
        if (!used_[r][i]) continue;
        level.push_back(rows_[r][i]);
        level.back().index = static_cast<int64_t>(i);
      }
      for (int k = 0; k <= g_.levels; ++k) {
        if (k > 0) level = coarser(level);
        pack_level(lane_.rank, lane_.stream, static_cast<int>(r), k, level, g_, out.chunks);
      }
    }
    rows_.clear();
    used_.clear();
  }

 private:
  void flush_group() {
    std::stable_sort(group_.begin(), group_.end(),
                     [](const Span& a, const Span& b) { return a.end_ns > b.end_ns; });
    for (const auto& s : group_) place(s);
    group_.clear();
  }

  void place(const Span& s) {
    size_t r = 0;
    while (r < row_last_end_.size() && row_last_end_[r] > s.start_ns) ++r;
    if (r >= static_cast<size_t>(kZoomMaxRows)) r = kZoomMaxRows - 1;
    if (r == row_last_end_.size()) {
      row_last_end_.push_back(s.end_ns);
      rows_.emplace_back(static_cast<size_t>(g_.buckets(0)));
      used_.emplace_back(static_cast<size_t>(g_.buckets(0)), 0);
    }
    row_last_end_[r] = std::max(row_last_end_[r], s.end_ns);
    ++lane_.spans;
    auto& row = rows_[r];
    auto& used = used_[r];
    const int64_t b0 = g_.bucket_of(0, s.start_ns);
    const int64_t b1 = s.end_ns > s.start_ns ? g_.bucket_of(0, s.end_ns - 1) : b0;
    row[static_cast<size_t>(b0)].count += 1;
    for (int64_t b = b0; b <= b1; ++b) {
      const int64_t bs = g_.origin_ns + b * g_.base_ns;
      const int64_t lo = std::max(s.start_ns, bs);
      const int64_t hi = std::max(lo, std::min(s.end_ns, bs + g_.base_ns));
      ZoomBucket& z = row[static_cast<size_t>(b)];
      if (!used[static_cast<size_t>(b)]) {
        z.lo_ns = lo;
        z.hi_ns = hi;
        z.name = s.name;
        z.name_ns = hi - lo;
        used[static_cast<size_t>(b)] = 1;
      } else {
        z.lo_ns = std::min(z.lo_ns, lo);
        z.hi_ns = std::max(z.hi_ns, hi);
        if (hi - lo > z.name_ns) {
          z.name = s.name;
          z.name_ns = hi - lo;
        }
      }
      z.kind_ns[static_cast<int>(s.kind)] += hi - lo;
    }
  }

  ZoomGrid g_;
  ZoomLane lane_;
  std::vector<int64_t> row_last_end_;
  std::vector<std::vector<ZoomBucket>> rows_;  // level 0, dense, per row
  std::vector<std::vector<uint8_t>> used_;
  std::vector<Span> group_;  // spans of equal start not yet placed
};

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// The aligned grid of `levels` levels with the finest bucket a power of 4 no finer than `min_base`
// that covers [t0, t1): origin a multiple of the top bucket, so that every grid's buckets are
// buckets of one quadtree of absolute time and the levels of two files combine (merge).
ZoomGrid aligned_grid(int64_t t0, int64_t t1, int levels, int64_t min_base) {
  ZoomGrid g;
  g.levels = levels;
  g.base_ns = 1;
  while (g.base_ns < min_base) g.base_ns *= kZoomFanout;
  for (;;) {
    const int64_t top = g.bucket_ns(levels);
    g.origin_ns = floor_div(t0, top) * top;
    if (t1 <= g.origin_ns + top) return g;
    g.base_ns *= kZoomFanout;
  }
}

// About 16 spans per level-0 bucket of the busiest lane (`lane_spans`), at most 4^8 buckets.
int levels_for(int64_t lane_spans) {
  int levels = 1;
  while (levels < kZoomMaxLevels && (int64_t{1} << (2 * levels)) * 16 < lane_spans) ++levels;
  return levels;
}

ZoomGrid make_grid(int64_t t0, int64_t t1, int64_t lane_spans) {
  return aligned_grid(t0, std::max(t1, t0 + 1), levels_for(lane_spans), 1);
}

// The levels of the spans `feed` visits, lane by lane; after each lane, lane_done(z) may take its
// chunks out of z (the streamed write keeps one lane's).
template <class Feed, class LaneDone>
ZoomLevels compute(const ZoomGrid& g, int64_t span_count, Feed&& feed, LaneDone&& lane_done) {
  ZoomLevels z;
  z.grid = g;
  z.span_count = span_count;
  LaneBuilder lane(g);
  bool open = false;
  feed([&](const Span& s) {
    if (!open || s.rank != lane.rank() || s.stream != lane.stream()) {
      if (open) lane.finish(z), lane_done(z);
      lane.begin(s.rank, s.stream);
      open = true;
    }
    lane.add(s);
  });
  if (open) lane.finish(z), lane_done(z);
  return z;
}

template <class Feed>
ZoomLevels compute(const ZoomGrid& g, int64_t span_count, Feed&& feed) {
  return compute(g, span_count, feed, [](ZoomLevels&) {});
}

// The levels of a file's spans, streaming its blocks; lane_done as compute's.
template <class LaneDone>
ZoomLevels compute_from_file(const TraceReader& r, LaneDone&& lane_done) {
  const auto range = r.time_range();
  const int64_t n = r.span_count();
  int64_t most = 0;
  for (const auto& b : r.stream_bounds()) most = std::max(most, b.count);
  const ZoomGrid g = range ? make_grid(range->start_ns, range->end_ns, most) : make_grid(0, 1, 0);
  return compute(
      g, n,
      [&](const auto& visit) {
        r.for_each_span_run([&](std::span<const Span> run) {
          for (const auto& s : run) visit(s);
        });
      },
      lane_done);
}

// Writes zoom tables in one transaction (BEGIN IMMEDIATE, the tables replaced): chunks as they
// come, then the grid and lanes; rolled back unless finish() committed.
class ZoomTableWriter {
 public:
  ZoomTableWriter(sqlite3* db, const std::string& path) : db_(db), path_(path) {
    exec("BEGIN IMMEDIATE");
    open_ = true;
    exec(kZoomSchema);
    chunk_ = prepare("INSERT INTO zoom_chunks VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  }
  ~ZoomTableWriter() {
    chunk_.reset();
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  ZoomTableWriter(const ZoomTableWriter&) = delete;
  ZoomTableWriter& operator=(const ZoomTableWriter&) = delete;

  void chunks(const std::vector<ZoomChunk>& cs) {
    for (const auto& c : cs) {
      const int64_t v[] = {c.rank, c.stream, c.row, c.level, c.chunk, c.buckets, c.crc32c};
      for (int i = 0; i < 7; ++i) sqlite3_bind_int64(chunk_.get(), i + 1, v[i]);
      sqlite3_bind_blob(chunk_.get(), 8, c.packed.data(), static_cast<int>(c.packed.size()),
                        SQLITE_STATIC);
      done(chunk_);
    }
  }
  // The grid and lanes of `z` (its chunks already written), and commits.
  void finish(const ZoomLevels& z) {
    Stmt head = prepare("INSERT INTO zoom_levels VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
    const int64_t head_values[] = {kZoomVersion,  z.grid.origin_ns, z.grid.base_ns,
                                   z.grid.levels, z.span_count,     header_crc(z)};
    for (int i = 0; i < 6; ++i) sqlite3_bind_int64(head.get(), i + 1, head_values[i]);
    done(head);
    Stmt lane = prepare("INSERT INTO zoom_lanes VALUES(?1, ?2, ?3, ?4)");
    for (const auto& l : z.lanes) {
      const int64_t v[] = {l.rank, l.stream, l.rows, l.spans};
      for (int i = 0; i < 4; ++i) sqlite3_bind_int64(lane.get(), i + 1, v[i]);
      done(lane);
    }
    chunk_.reset();
    exec("COMMIT");
    open_ = false;
  }

 private:
  void exec(const char* sql) {
    if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) fail(db_, path_, sql);
  }
  Stmt prepare(const char* sql) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) fail(db_, path_, sql);
    return Stmt(st);
  }
  void done(Stmt& st) {
    if (sqlite3_step(st.get()) != SQLITE_DONE) fail(db_, path_, "insert");
    sqlite3_reset(st.get());
  }
  sqlite3* db_;
  const std::string& path_;
  Stmt chunk_;
  bool open_ = false;
};

}  // namespace

int64_t ZoomGrid::bucket_of(int level, int64_t t_ns) const {
  const int64_t w = bucket_ns(level);
  const int64_t d = t_ns - origin_ns;
  const int64_t b = d < 0 ? 0 : d / w;
  return std::min(b, buckets(level) - 1);
}

int64_t ZoomBucket::busy_ns() const { return std::accumulate(kind_ns.begin(), kind_ns.end(), 0LL); }

SpanKind ZoomBucket::dominant() const {
  int best = 0;
  for (int k = 1; k < kSpanKindCount; ++k) {
    if (kind_ns[k] > kind_ns[best]) best = k;
  }
  return static_cast<SpanKind>(best);
}

ZoomLevels compute_zoom_levels(const Trace& t) { return compute_zoom_levels(t, std::nullopt); }

ZoomLevels compute_zoom_levels(const Trace& t, const std::optional<ZoomGrid>& grid) {
  int64_t t0 = 0, t1 = 1;
  for (size_t i = 0; i < t.spans.size(); ++i) {
    t0 = i == 0 ? t.spans[i].start_ns : std::min(t0, t.spans[i].start_ns);
    t1 = i == 0 ? t.spans[i].end_ns : std::max(t1, t.spans[i].end_ns);
  }
  std::vector<uint32_t> order(t.spans.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const auto& x = t.spans[a];
    const auto& y = t.spans[b];
    return std::tie(x.rank, x.stream, x.start_ns) < std::tie(y.rank, y.stream, y.start_ns);
  });
  const auto n = static_cast<int64_t>(t.spans.size());
  std::map<std::pair<int32_t, int32_t>, int64_t> per_lane;
  int64_t most = 0;
  for (const auto& s : t.spans) most = std::max(most, ++per_lane[{s.rank, s.stream}]);
  return compute(grid ? *grid : make_grid(t0, t1, most), n, [&](const auto& visit) {
    for (uint32_t i : order) visit(t.spans[i]);
  });
}

ZoomLevels compute_zoom_levels(const TraceReader& r) {
  return compute_from_file(r, [](ZoomLevels&) {});
}

std::vector<ZoomBucket> decode_zoom_chunk(const ZoomChunk& c, const ZoomGrid& g,
                                          const std::string& path) {
  const std::string where = path + ": corrupt zoom levels (chunk " + std::to_string(c.chunk) +
                            " of rank " + std::to_string(c.rank) + ", stream " +
                            std::to_string(c.stream) + ", row " + std::to_string(c.row) +
                            ", level " + std::to_string(c.level) + "): ";
  const std::string fix = "; rebuild them with `orrery info --index " + path + "`";
  const uint32_t crc = chunk_crc(c);
  if (crc != c.crc32c) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "checksum mismatch: CRC32C 0x%08x, the chunk records 0x%08x",
                  crc, c.crc32c);
    throw InputError(where + buf + fix);
  }
  if (c.level < 0 || c.level > g.levels || c.buckets < 0 || c.buckets > kZoomChunkBuckets)
    throw InputError(where + "key out of range" + fix);
  std::vector<ZoomBucket> out(static_cast<size_t>(c.buckets));
  const auto* p = reinterpret_cast<const unsigned char*>(c.packed.data());
  const auto* end = p + c.packed.size();
  const int64_t w = g.bucket_ns(c.level);
  int64_t prev = c.chunk * kZoomChunkBuckets - 1;
  for (auto& b : out) {
    int64_t gap = 0, lo = 0, len = 0, name = 0;
    bool ok = get_varint(p, end, gap) && get_varint(p, end, b.count) && get_varint(p, end, lo) &&
              get_varint(p, end, len);
    const unsigned present = ok && p != end ? *p++ : 0;
    for (int k = 0; k < kSpanKindCount; ++k) {
      if (present & (1u << k)) ok = ok && get_varint(p, end, b.kind_ns[k]);
    }
    ok = ok && get_varint(p, end, name) && get_varint(p, end, b.name_ns);
    b.index = prev + 1 + gap;
    prev = b.index;
    if (!ok || b.index >= (c.chunk + 1) * kZoomChunkBuckets || lo + len > w || name > INT32_MAX) {
      throw InputError(where + "bytes do not decode" + fix);
    }
    b.lo_ns = g.origin_ns + b.index * w + lo;
    b.hi_ns = b.lo_ns + len;
    b.name = static_cast<NameId>(name);
  }
  if (p != end) throw InputError(where + "trailing bytes" + fix);
  return out;
}

void write_zoom_levels(sqlite3* db, const std::string& path, const ZoomLevels& z) {
  ZoomTableWriter w(db, path);
  w.chunks(z.chunks);
  w.finish(z);
}

void write_zoom_levels(sqlite3* db, const std::string& path, const TraceReader& r) {
  ZoomTableWriter w(db, path);
  const ZoomLevels z = compute_from_file(r, [&w](ZoomLevels& lane) {
    w.chunks(lane.chunks);
    lane.chunks.clear();
  });
  w.finish(z);
}

void write_zoom_levels(const std::string& path, const ZoomLevels& z) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    const std::string msg = db ? sqlite3_errmsg(db) : "cannot open";
    sqlite3_close(db);
    throw InputError(path + ": cannot open the trace to write its zoom levels (" + msg + ")");
  }
  sqlite3_busy_timeout(db, 5000);
  try {
    write_zoom_levels(db, path, z);
  } catch (...) {
    sqlite3_close(db);
    throw;
  }
  sqlite3_close(db);
}

ZoomLevels build_zoom_levels(const std::string& path) {
  ZoomLevels z;
  {
    TraceReader r(path);
    z = compute_zoom_levels(r);
  }
  write_zoom_levels(path, z);
  return z;
}

namespace {

// The file's zoom header, or why it cannot be used ("" and the header when it can).
std::string read_header(sqlite3* db, const std::string& path, const TraceReader& r, ZoomLevels& z) {
  {
    Stmt st = prep(db, path,
                   "SELECT count(*) FROM sqlite_master WHERE type='table' AND name IN "
                   "('zoom_levels', 'zoom_lanes', 'zoom_chunks')");
    if (sqlite3_step(st.get()) != SQLITE_ROW || sqlite3_column_int64(st.get(), 0) != 3)
      return "the file has no zoom levels";
  }
  // Tables without our columns (damaged, or not ours) are a reason not to use them, not an error.
  sqlite3_stmt* raw = nullptr;
  if (sqlite3_prepare_v2(db,
                         "SELECT version, origin_ns, base_ns, levels, span_count, crc32c FROM "
                         "zoom_levels",
                         -1, &raw, nullptr) != SQLITE_OK) {
    return std::string("its zoom tables are not readable (") + sqlite3_errmsg(db) + ")";
  }
  Stmt st(raw);
  {
    sqlite3_stmt* probe = nullptr;
    const int rc = sqlite3_prepare_v2(
        db, "SELECT rank, stream, row, level, chunk, buckets, crc32c, packed FROM zoom_chunks", -1,
        &probe, nullptr);
    sqlite3_finalize(probe);
    if (rc != SQLITE_OK)
      return std::string("its zoom tables are not readable (") + sqlite3_errmsg(db) + ")";
  }
  if (sqlite3_step(st.get()) != SQLITE_ROW) return "its zoom_levels table is empty";
  const int64_t version = sqlite3_column_int64(st.get(), 0);
  if (version != kZoomVersion)
    return "its zoom levels are version " + std::to_string(version) + ", expected " +
           std::to_string(kZoomVersion);
  z.grid.origin_ns = sqlite3_column_int64(st.get(), 1);
  z.grid.base_ns = sqlite3_column_int64(st.get(), 2);
  const int64_t levels = sqlite3_column_int64(st.get(), 3);
  z.span_count = sqlite3_column_int64(st.get(), 4);
  const auto recorded_crc = static_cast<uint32_t>(sqlite3_column_int64(st.get(), 5));
  if (z.grid.base_ns <= 0 || levels < 1 || levels > kZoomMaxLevels)
    return "its zoom grid is invalid (base " + std::to_string(z.grid.base_ns) + " ns, " +
           std::to_string(levels) + " levels)";
  z.grid.levels = static_cast<int>(levels);
  const auto range = r.time_range();
  const int64_t spans = r.span_count();
  const bool covers = !range || (range->start_ns >= z.grid.origin_ns &&
                                 range->end_ns <= z.grid.origin_ns + z.grid.bucket_ns(levels));
  if (spans != z.span_count || !covers)
    return "its zoom levels are stale (they cover " + std::to_string(z.span_count) +
           " spans, the trace has " + std::to_string(spans) + ")";
  if (sqlite3_prepare_v2(db,
                         "SELECT rank, stream, rows, spans FROM zoom_lanes ORDER BY rank, stream",
                         -1, &raw, nullptr) != SQLITE_OK) {
    return std::string("its zoom tables are not readable (") + sqlite3_errmsg(db) + ")";
  }
  Stmt lanes(raw);
  int64_t total = 0;
  while (sqlite3_step(lanes.get()) == SQLITE_ROW) {
    ZoomLane l;
    l.rank = static_cast<int32_t>(sqlite3_column_int64(lanes.get(), 0));
    l.stream = static_cast<int32_t>(sqlite3_column_int64(lanes.get(), 1));
    l.rows = static_cast<int>(sqlite3_column_int64(lanes.get(), 2));
    l.spans = sqlite3_column_int64(lanes.get(), 3);
    if (l.rows < 1 || l.rows > kZoomMaxRows) return "its zoom lanes are invalid";
    total += l.spans;
    z.lanes.push_back(l);
  }
  if (total != spans)
    return "its zoom lanes count " + std::to_string(total) + " spans, the trace has " +
           std::to_string(spans);
  if (header_crc(z) != recorded_crc)
    return "its zoom header (grid and lanes) is damaged: checksum mismatch";
  return {};
}

}  // namespace

ZoomIndex::ZoomIndex(const std::string& path) : path_(path) {
  TraceReader r(path);
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr) !=
      SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "cannot open";
    if (const int e = db_ ? sqlite3_system_errno(db_) : 0; e != 0)
      msg += ": " + std::string(std::strerror(e));  // e.g. "Too many open files"
    sqlite3_close(db_);
    db_ = nullptr;
    throw InputError(path + ": cannot open trace (" + msg + ")");
  }
  sqlite3_busy_timeout(db_, 5000);
  const std::string why = read_header(db_, path, r, z_);
  if (why.empty()) {
    from_file_ = true;
    return;
  }
  note_ = why + "; computed on open (`orrery info --index` stores them in the file)";
  sqlite3_close(db_);
  db_ = nullptr;
  z_ = compute_zoom_levels(r);
}

ZoomIndex::~ZoomIndex() {
  sqlite3_finalize(select_);
  sqlite3_close(db_);
}

int64_t ZoomIndex::spans_between(int64_t t0_ns, int64_t t1_ns) const {
  const ZoomGrid& g = z_.grid;
  int level = 0;
  while (level < g.levels && g.bucket_ns(level + 1) * 8 <= t1_ns - t0_ns) ++level;
  const int64_t b0 = g.bucket_of(level, t0_ns), b1 = g.bucket_of(level, t1_ns) + 1;
  const int64_t w = g.bucket_ns(level);
  double n = 0;
  for (const auto& l : z_.lanes) {
    for (int row = 0; row < l.rows; ++row) {
      for (const auto& b : buckets(l.rank, l.stream, row, level, b0, b1)) {
        // A bucket's share of the range: its count is spread evenly over it.
        const int64_t bs = g.origin_ns + b.index * w;
        const int64_t overlap = std::min(t1_ns, bs + w) - std::max(t0_ns, bs);
        if (overlap > 0) n += static_cast<double>(b.count) * static_cast<double>(overlap) / w;
      }
    }
  }
  return static_cast<int64_t>(std::ceil(n));
}

std::vector<ZoomBucket> ZoomIndex::buckets(int32_t rank, int32_t stream, int row, int level,
                                           int64_t b0, int64_t b1) const {
  std::vector<ZoomBucket> out;
  if (b1 <= b0 || level < 0 || level > z_.grid.levels) return out;
  const int64_t c0 = b0 / kZoomChunkBuckets, c1 = (b1 - 1) / kZoomChunkBuckets;
  auto take = [&](const ZoomChunk& c) {
    for (const auto& b : decode_zoom_chunk(c, z_.grid, path_)) {
      if (b.index >= b0 && b.index < b1) out.push_back(b);
    }
  };
  if (!from_file_) {
    auto key = [](const ZoomChunk& c) {
      return std::tie(c.rank, c.stream, c.row, c.level, c.chunk);
    };
    ZoomChunk lo;
    lo.rank = rank;
    lo.stream = stream;
    lo.row = row;
    lo.level = level;
    lo.chunk = c0;
    auto it =
        std::lower_bound(z_.chunks.begin(), z_.chunks.end(), lo,
                         [&](const ZoomChunk& a, const ZoomChunk& b) { return key(a) < key(b); });
    for (; it != z_.chunks.end() && it->rank == rank && it->stream == stream && it->row == row &&
           it->level == level && it->chunk <= c1;
         ++it)
      take(*it);
    return out;
  }
  std::lock_guard lock(mu_);
  if (!select_) {
    select_ = prep(db_, path_,
                   "SELECT chunk, buckets, crc32c, packed FROM zoom_chunks WHERE rank=?1 AND "
                   "stream=?2 AND row=?3 AND level=?4 AND chunk BETWEEN ?5 AND ?6 ORDER BY chunk")
                  .release();
  }
  std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> st(select_, sqlite3_reset);
  const int64_t v[] = {rank, stream, row, level, c0, c1};
  for (int i = 0; i < 6; ++i) sqlite3_bind_int64(st.get(), i + 1, v[i]);
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    ZoomChunk c;
    c.rank = rank;
    c.stream = stream;
    c.row = row;
    c.level = level;
    c.chunk = sqlite3_column_int64(st.get(), 0);
    c.buckets = sqlite3_column_int64(st.get(), 1);
    c.crc32c = static_cast<uint32_t>(sqlite3_column_int64(st.get(), 2));
    const auto* blob = static_cast<const char*>(sqlite3_column_blob(st.get(), 3));
    c.packed.assign(blob ? blob : "", static_cast<size_t>(sqlite3_column_bytes(st.get(), 3)));
    take(c);
  }
  if (rc != SQLITE_DONE)
    throw InputError(path_ + ": cannot read zoom levels (" + sqlite3_errmsg(db_) + ")");
  return out;
}

namespace {

// One row of an input's levels as the output grid's level-0 buckets: the input level whose bucket
// is the output's (or its coarsest), re-indexed in absolute time, coarsened up to the output's
// bucket, re-indexed from the output's origin. False when they do not fit the output's grid.
bool row_on_grid(const ZoomIndex& in, const ZoomLane& lane, int row, const ZoomGrid& out,
                 std::vector<ZoomBucket>& buckets) {
  const ZoomGrid& gi = in.grid();
  int m = 0;
  while (m < gi.levels && gi.bucket_ns(m) < out.base_ns) ++m;
  buckets = in.buckets(lane.rank, lane.stream, row, m, 0, gi.buckets(m));
  int64_t w = gi.bucket_ns(m);
  if (w > out.base_ns || gi.origin_ns % w != 0) return false;
  for (auto& b : buckets) b.index += gi.origin_ns / w;
  while (w < out.base_ns) {
    buckets = coarser(buckets);
    w *= kZoomFanout;
  }
  if (w != out.base_ns) return false;
  for (auto& b : buckets) {
    b.index -= out.origin_ns / w;
    if (b.index < 0 || b.index >= out.buckets(0)) return false;
  }
  return true;
}

// The stored chunks of one lane of `path` (open as `db`), each one's CRC32C checked but not
// decoded: where the merged grid is its input's, the input's chunks are the merged file's (the
// same buckets, and the key the checksum covers is the same rank, stream, row, level and chunk).
void copy_lane_chunks(sqlite3* db, const std::string& path, int32_t rank, int32_t stream,
                      std::vector<ZoomChunk>& out) {
  Stmt st = prep(db, path,
                 "SELECT row, level, chunk, buckets, crc32c, packed FROM zoom_chunks WHERE "
                 "rank=?1 AND stream=?2 ORDER BY row, level, chunk");
  sqlite3_bind_int64(st.get(), 1, rank);
  sqlite3_bind_int64(st.get(), 2, stream);
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    ZoomChunk c;
    c.rank = rank;
    c.stream = stream;
    c.row = static_cast<int32_t>(sqlite3_column_int64(st.get(), 0));
    c.level = static_cast<int32_t>(sqlite3_column_int64(st.get(), 1));
    c.chunk = sqlite3_column_int64(st.get(), 2);
    c.buckets = sqlite3_column_int64(st.get(), 3);
    c.crc32c = static_cast<uint32_t>(sqlite3_column_int64(st.get(), 4));
    const auto* blob = static_cast<const char*>(sqlite3_column_blob(st.get(), 5));
    c.packed.assign(blob ? blob : "", static_cast<size_t>(sqlite3_column_bytes(st.get(), 5)));
    if (const uint32_t crc = chunk_crc(c); crc != c.crc32c) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "checksum mismatch: CRC32C 0x%08x, the chunk records 0x%08x",
                    crc, c.crc32c);
      throw InputError(path + ": corrupt zoom levels (chunk " + std::to_string(c.chunk) +
                       " of rank " + std::to_string(rank) + ", stream " + std::to_string(stream) +
                       ", row " + std::to_string(c.row) + ", level " + std::to_string(c.level) +
                       "): " + buf + "; rebuild them with `orrery info --index " + path + "`");
    }
    out.push_back(std::move(c));
  }
  if (rc != SQLITE_DONE)
    throw InputError(path + ": cannot read zoom levels (" + sqlite3_errmsg(db) + ")");
}

bool same_grid(const ZoomGrid& a, const ZoomGrid& b) {
  return a.origin_ns == b.origin_ns && a.base_ns == b.base_ns && a.levels == b.levels;
}

}  // namespace

void ZoomIndex::stored_chunks(int32_t rank, int32_t stream, std::vector<ZoomChunk>& out) const {
  if (!from_file_) {
    throw InternalError(path_ + ": stored_chunks on zoom levels computed on open (" + note_ + ")");
  }
  std::lock_guard lock(mu_);
  copy_lane_chunks(db_, path_, rank, stream, out);
  // The chunks are the caller's now: a merge holds every input's index at once, and their page
  // caches would otherwise keep a second copy of every chunk until it ends.
  sqlite3_db_release_memory(db_);
}

namespace {

// A merge's zoom levels before their chunks: the merged grid, span count and lanes (in z), each
// lane's input, and the inputs' indexes.
struct ZoomMergePlan {
  ZoomLevels z;
  std::vector<size_t> input;  // per lane of z
  std::vector<std::unique_ptr<ZoomIndex>> zs;
};

// nullopt where merge_zoom_levels says so (an input without current levels, lanes that are not
// the inputs'); reads `merged`'s header and closes it again.
std::optional<ZoomMergePlan> plan_zoom_merge(const std::vector<std::string>& inputs,
                                             const std::string& merged) {
  TraceReader out(merged);
  const auto range = out.time_range();
  if (!range || range->start_ns < 0) return std::nullopt;
  ZoomMergePlan plan;
  std::map<std::pair<int32_t, int32_t>, std::pair<size_t, ZoomLane>> lanes;
  int64_t most = 0, min_base = 1;
  for (const auto& in : inputs) {
    auto z = std::make_unique<ZoomIndex>(in);
    if (!z->from_file() || z->grid().origin_ns < 0) return std::nullopt;
    for (const auto& l : z->lanes()) {
      if (!lanes.try_emplace({l.rank, l.stream}, plan.zs.size(), l).second) return std::nullopt;
      most = std::max(most, l.spans);
    }
    min_base = std::max(min_base, z->grid().base_ns);
    plan.zs.push_back(std::move(z));
  }
  // The merged file's lanes must be the inputs' lanes, with their spans.
  const auto bounds = out.stream_bounds();
  if (bounds.size() != lanes.size()) return std::nullopt;
  for (const auto& b : bounds) {
    auto it = lanes.find({b.rank, b.stream});
    if (it == lanes.end() || it->second.second.spans != b.count) return std::nullopt;
  }
  plan.z.grid = aligned_grid(range->start_ns, std::max(range->end_ns, range->start_ns + 1),
                             levels_for(most), min_base);
  plan.z.span_count = out.span_count();
  for (const auto& [key, entry] : lanes) {
    plan.input.push_back(entry.first);
    plan.z.lanes.push_back(entry.second);
  }
  return plan;
}

// Appends the merged chunks of the plan's lane `i` to `out`: its input's as stored where the
// grids are the same (copy_same_grid), else re-derived on the merged grid; false when a row is
// not on it.
bool merged_lane_chunks(const ZoomMergePlan& plan, size_t i, bool copy_same_grid,
                        std::vector<ZoomChunk>& out) {
  const ZoomLane& lane = plan.z.lanes[i];
  const ZoomIndex& in = *plan.zs[plan.input[i]];
  const ZoomGrid& g = plan.z.grid;
  if (copy_same_grid && same_grid(in.grid(), g)) {
    in.stored_chunks(lane.rank, lane.stream, out);
    return true;
  }
  for (int row = 0; row < lane.rows; ++row) {
    std::vector<ZoomBucket> level;
    if (!row_on_grid(in, lane, row, g, level)) return false;
    for (int k = 0; k <= g.levels; ++k) {
      if (k > 0) level = coarser(level);
      pack_level(lane.rank, lane.stream, row, k, level, g, out);
    }
  }
  return true;
}

}  // namespace

std::optional<ZoomLevels> merge_zoom_levels(const std::vector<std::string>& inputs,
                                            const std::string& merged, bool copy_same_grid) {
  std::optional<ZoomMergePlan> plan = plan_zoom_merge(inputs, merged);
  if (!plan) return std::nullopt;
  for (size_t i = 0; i < plan->z.lanes.size(); ++i)
    if (!merged_lane_chunks(*plan, i, copy_same_grid, plan->z.chunks)) return std::nullopt;
  return std::move(plan->z);
}

bool write_merged_zoom_levels(sqlite3* db, const std::string& merged,
                              const std::vector<std::string>& inputs) {
  const std::optional<ZoomMergePlan> plan = plan_zoom_merge(inputs, merged);
  if (!plan) return false;
  ZoomTableWriter w(db, merged);
  std::vector<ZoomChunk> chunks;
  for (size_t i = 0; i < plan->z.lanes.size(); ++i) {
    chunks.clear();
    if (!merged_lane_chunks(*plan, i, true, chunks)) return false;  // rolled back by w
    w.chunks(chunks);
  }
  w.finish(plan->z);
  return true;
}

ZoomVerification verify_zoom_levels(const std::string& path) {
  ZoomVerification v;
  TraceReader r(path);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    throw InputError(path + ": cannot open trace to verify its zoom levels");
  }
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> closer(db, sqlite3_close);
  ZoomLevels z;
  v.unused = read_header(db, path, r, z);
  if (!v.unused.empty()) return v;
  Stmt st = prep(db, path,
                 "SELECT rank, stream, row, level, chunk, buckets, crc32c, packed FROM "
                 "zoom_chunks ORDER BY rowid");
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    ZoomChunk c;
    c.rank = static_cast<int32_t>(sqlite3_column_int64(st.get(), 0));
    c.stream = static_cast<int32_t>(sqlite3_column_int64(st.get(), 1));
    c.row = static_cast<int32_t>(sqlite3_column_int64(st.get(), 2));
    c.level = static_cast<int32_t>(sqlite3_column_int64(st.get(), 3));
    c.chunk = sqlite3_column_int64(st.get(), 4);
    c.buckets = sqlite3_column_int64(st.get(), 5);
    c.crc32c = static_cast<uint32_t>(sqlite3_column_int64(st.get(), 6));
    const auto* blob = static_cast<const char*>(sqlite3_column_blob(st.get(), 7));
    c.packed.assign(blob ? blob : "", static_cast<size_t>(sqlite3_column_bytes(st.get(), 7)));
    ++v.chunks;
    try {
      decode_zoom_chunk(c, z.grid, path);
    } catch (const InputError& e) {
      v.damaged.push_back(e.what());
    }
  }
  if (rc != SQLITE_DONE)
    throw InputError(path + ": cannot read zoom levels (" + sqlite3_errmsg(db) + ")");
  return v;
}

std::string zoom_summary(const std::string& path) {
  TraceReader r(path);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return "unreadable";
  }
  ZoomLevels z;
  std::string why;
  try {
    why = read_header(db, path, r, z);
  } catch (...) {
    sqlite3_close(db);
    throw;
  }
  sqlite3_close(db);
  if (!why.empty()) return "not used: " + why + " (`orrery info --index` writes them)";
  return "version " + std::to_string(kZoomVersion) + ", " + std::to_string(z.grid.levels + 1) +
         " levels, finest bucket " + std::to_string(z.grid.base_ns) + " ns, " +
         std::to_string(z.lanes.size()) + " lanes";
}

}  // namespace orrery::traces
