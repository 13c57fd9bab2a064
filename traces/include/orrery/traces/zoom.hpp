// Zoom levels: per (rank, stream, row) a pyramid of summaries of the spans, stored in the trace
// file beside the blocks, so that a viewer shows a trace of tens of millions of spans zoomed out
// by reading one summary level (its buckets about a pixel wide) instead of every span, as
// Perfetto's and Tracy's zoomed-out views do.
//
// The grid: level 0 cuts [origin_ns, origin_ns + base_ns * 4^levels) into 4^levels buckets of
// base_ns; level k has buckets of base_ns * 4^k, so bucket i of level k+1 is buckets 4i..4i+3 of
// level k. base_ns is a power of 4 and origin_ns a multiple of the top bucket: every grid is part
// of one quadtree of absolute time, so the levels of per-rank files combine into the merged
// file's without reading their spans. Rows are the timeline's: per (rank, stream) the spans in (start, longest first) order,
// each in the first row whose last span has ended (kZoomMaxRows at most, the last row shared).
// A bucket of a row holds: the spans that start in it (count), per kind the time of the row's
// spans inside it (busy time, clipped to the bucket), the first and last instant they cover in
// it, and the name of the span that covers most of it. Counts and times add up exactly from level
// to level; the name of a coarser bucket is its children's name with the most time (the name of
// the single span covering most of it at level 0, an approximation above).
//
// Level 0 has about 16 spans per bucket in the busiest (rank, stream), at most 4^8 buckets: a
// 50 M-span trace of 24 lanes gets 65536 level-0 buckets per row (53 MB of chunks in 1.37 GB).
//
// Storage (tables zoom_levels, zoom_lanes and zoom_chunks, zoom version 1): the grid in one row
// with a CRC32C of it and the lanes (zoom_lanes: rows and spans per (rank, stream)); the buckets
// of a (rank, stream, row, level) in chunks of kZoomChunkBuckets, only non-empty buckets, each
// chunk carrying a CRC32C of its key (rank, stream, row, level as int32, chunk and bucket count
// as int64, little-endian) and bytes, checked on every read. Per bucket, as varints: the index
// minus the previous one minus 1 (the first: from the chunk's first index), count, first covered
// instant minus the bucket's start, last minus first; a byte with bit k set for each kind with
// time, those times; name id, name time.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "orrery/traces/span.hpp"
#include "orrery/traces/trace.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace orrery::traces {

class TraceReader;

inline constexpr int kZoomVersion = 1;
inline constexpr int kZoomFanout = 4;
inline constexpr int64_t kZoomChunkBuckets = 4096;
inline constexpr int kZoomMaxRows = 12;   // gui::TraceIndex::kMaxRows
inline constexpr int kZoomMaxLevels = 8;  // level 0 has at most 4^8 = 65536 buckets

struct ZoomGrid {
  int64_t origin_ns = 0;
  int64_t base_ns = 1;  // level 0's bucket
  int levels = 0;       // level 0 has 4^levels buckets; level `levels` has one
  int64_t bucket_ns(int level) const { return base_ns << (2 * level); }
  int64_t buckets(int level) const { return int64_t{1} << (2 * (levels - level)); }
  // The bucket of level `level` that holds time t (clamped to the grid).
  int64_t bucket_of(int level, int64_t t_ns) const;
};

struct ZoomBucket {
  int64_t index = 0;
  int64_t count = 0;             // spans starting in the bucket
  int64_t lo_ns = 0, hi_ns = 0;  // first and last instant covered (absolute), lo <= hi
  std::array<int64_t, kSpanKindCount> kind_ns{};
  NameId name = 0;      // the name covering most of the bucket
  int64_t name_ns = 0;  // that name's time in it
  int64_t busy_ns() const;
  SpanKind dominant() const;  // the kind with most time (ties: the lower kind)
};

struct ZoomLane {
  int32_t rank = 0;
  int32_t stream = 0;
  int rows = 0;
  int64_t spans = 0;
};

struct ZoomChunk {
  int32_t rank = 0, stream = 0, row = 0, level = 0;
  int64_t chunk = 0;
  int64_t buckets = 0;  // non-empty buckets packed
  uint32_t crc32c = 0;
  std::string packed;
};

// All zoom levels of a trace, in memory (what is written, or computed for a file without them).
struct ZoomLevels {
  ZoomGrid grid;
  int64_t span_count = 0;
  std::vector<ZoomLane> lanes;    // sorted by (rank, stream)
  std::vector<ZoomChunk> chunks;  // sorted by (rank, stream, row, level, chunk)
};

// The levels of the spans of `t` (any order), on the grid their time range and busiest lane give,
// or on `grid` when given (it must cover them).
ZoomLevels compute_zoom_levels(const Trace& t);
ZoomLevels compute_zoom_levels(const Trace& t, const std::optional<ZoomGrid>& grid);
// The same from a file, streaming its blocks (memory: one lane's level-0 buckets and the chunks).
ZoomLevels compute_zoom_levels(const TraceReader& r);
// Decodes one chunk (checking its CRC32C); throws InputError naming `path` and the chunk.
std::vector<ZoomBucket> decode_zoom_chunk(const ZoomChunk& c, const ZoomGrid& g,
                                          const std::string& path);

// The zoom levels of `merged`, the merge of `inputs`, from the inputs' own levels (their chunks,
// not their spans): the grid covers the merged time range with level 0 no finer than any input's,
// and each lane's buckets are its input's, combined up to that grid (grids are aligned, so they
// nest). Needs every input's levels current and each lane of `merged` to be one input's lane with
// its span count; nullopt otherwise (the caller computes them from the spans). Throws InputError
// for an input's damaged chunk.
// Where an input's grid is the merged one (per-rank files of one run usually), its lanes' chunks
// are copied as stored, each CRC32C checked (copy_same_grid; false re-derives every lane, the
// same chunks).
std::optional<ZoomLevels> merge_zoom_levels(const std::vector<std::string>& inputs,
                                            const std::string& merged, bool copy_same_grid = true);
// The same written into `merged` (open as `db`, with a rollback journal or WAL: a failure midway
// rolls back) a lane at a time, so memory holds one lane's chunks, not every lane's; false, with
// nothing written, where merge_zoom_levels gives nullopt. Throws InputError for an input's damaged
// chunk (rolled back too).
bool write_merged_zoom_levels(sqlite3* db, const std::string& merged,
                              const std::vector<std::string>& inputs);

// Replaces the zoom tables of the trace at `path` with `z`, in one transaction.
void write_zoom_levels(sqlite3* db, const std::string& path, const ZoomLevels& z);
// The same with the levels of `r`'s spans (the file `db` writes, or another), computed and written
// a lane at a time: memory holds one lane's chunks, not the trace's (0.5 GB of a 64-rank 50 M-span
// trace's 320 lanes). `db` must be a connection other than r's, in WAL mode when it is r's file.
void write_zoom_levels(sqlite3* db, const std::string& path, const TraceReader& r);
void write_zoom_levels(const std::string& path, const ZoomLevels& z);
// `orrery info --index`: computes the levels of the trace at `path` and writes them into it.
ZoomLevels build_zoom_levels(const std::string& path);

// The zoom levels of a trace file, for a viewer. Uses the file's own tables when they are of this
// version and match its spans (their span count and time range); otherwise (a file written before
// zoom levels, another version, stale tables) computes them on open, streaming, and says why in
// note(). A chunk whose checksum or bytes are wrong is an InputError when read (never drawn).
class ZoomIndex {
 public:
  explicit ZoomIndex(const std::string& path);
  ~ZoomIndex();
  ZoomIndex(const ZoomIndex&) = delete;
  ZoomIndex& operator=(const ZoomIndex&) = delete;

  const ZoomGrid& grid() const { return z_.grid; }
  const std::vector<ZoomLane>& lanes() const { return z_.lanes; }
  int64_t span_count() const { return z_.span_count; }
  bool from_file() const { return from_file_; }
  const std::string& note() const { return note_; }
  // About how many spans start in [t0, t1) (every lane and row): the counts of the buckets at
  // the level whose bucket is about an eighth of it, each spread evenly over its bucket (exact for
  // a range of whole buckets). What a viewer reads before loading a window's spans.
  int64_t spans_between(int64_t t0_ns, int64_t t1_ns) const;
  // Non-empty buckets of a row at `level` with index in [b0, b1), sorted by index.
  std::vector<ZoomBucket> buckets(int32_t rank, int32_t stream, int row, int level, int64_t b0,
                                  int64_t b1) const;
  // Appends the stored chunks of one lane (row, level, chunk order) to `out`, each one's CRC32C
  // checked but not decoded (InputError naming a damaged one). Only for levels read from the file
  // (from_file()); merge_zoom_levels copies an input's lanes with it.
  void stored_chunks(int32_t rank, int32_t stream, std::vector<ZoomChunk>& out) const;

 private:
  std::string path_;
  sqlite3* db_ = nullptr;                   // the file's chunks, when from_file_
  mutable sqlite3_stmt* select_ = nullptr;  // the chunk query, prepared once
  mutable std::mutex mu_;                   // serialises db_ (a viewer's threads share the index)
  ZoomLevels z_;  // the grid and lanes; the chunks too when computed on open
  bool from_file_ = false;
  std::string note_;
};

// `orrery info --verify`: every zoom chunk decoded and checked (CRC32C, bytes), one at a time.
struct ZoomVerification {
  std::string unused;                // why the file's levels are not used ("" when they are)
  int64_t chunks = 0;                // checked
  std::vector<std::string> damaged;  // one line per damaged chunk
};
ZoomVerification verify_zoom_levels(const std::string& path);

// The state of a file's zoom tables, for `orrery info`: "none", "version 1, 9 levels, ..." or why
// they are not used.
std::string zoom_summary(const std::string& path);

}  // namespace orrery::traces
