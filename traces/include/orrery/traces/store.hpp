// The SQLite trace store: a versioned schema, a buffered thread-safe writer, a read-only reader.
//
// One trace file per run; in a multi-process run each rank writes its own file while it runs and
// the run ends with merge_traces() into one file. Readers open files read-only and can read a
// file that is still being written (WAL mode).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "orrery/traces/trace.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace orrery::traces {

// 2: the per-span SQL table `spans` is optional (written on request, see store.cpp); blocks carry
// their spans' communicator range.
// 3: every span block and counter block carries a CRC32C, checked on every read; counter samples
// are packed in blocks (table counter_blocks) like spans. Version 2 files are still read (without
// checks: they have no checksums).
inline constexpr int kSchemaVersion = 3;

// Buffered writer. Spans and counters are appended to an in-memory batch and flushed in one
// transaction when the batch fills, on flush(), and on close(). All methods are safe to call from
// several threads of one process. What is flushed is visible to readers at once; close() builds
// the indexes and, with `sql_spans`, fills the per-span SQL table `spans` (one row per span, every
// attribute a column, for SQL users; about five times the CPU the rest of the writer costs).
class TraceWriter {
 public:
  // Creates (truncates) `path`. Throws InputError if the file cannot be created.
  explicit TraceWriter(const std::string& path, size_t batch_spans = 65536, bool sql_spans = false);
  ~TraceWriter();  // close()s, swallowing errors
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  void set_meta(const RunMeta& meta);
  void add_rank(const RankInfo& r);
  void add_stream(const StreamInfo& s);
  void add_communicator(const CommunicatorInfo& c);
  NameId intern(std::string_view name);
  void add_span(const Span& s);
  void add_spans(const std::vector<Span>& spans);
  void add_counter(const CounterSample& c);
  void flush();
  // Whether close() computes the zoom levels (traces/zoom.hpp; on by default). A caller that adds
  // blocks to the file after close() (merge_traces copies them) turns it off and writes them.
  void set_zoom_levels(bool on) { zoom_levels_ = on; }
  // Flushes, fills the per-span SQL table (with sql_spans), builds the indexes, marks the file
  // complete and writes its zoom levels. Idempotent.
  void close();
  const std::string& path() const { return path_; }

 private:
  void flush_locked();
  void fill_spans_table();
  struct Impl;  // prepared statements and per-stream bounds, private to store.cpp
  std::string path_;
  size_t batch_spans_;
  bool sql_spans_ = false;
  std::mutex mu_;
  sqlite3* db_ = nullptr;
  StringTable strings_;
  size_t strings_written_ = 0;
  std::vector<Span> span_buf_;
  std::vector<CounterSample> counter_buf_;
  bool closed_ = false;
  bool zoom_levels_ = true;
  std::unique_ptr<Impl> impl_;
};

// Writes a whole in-memory trace to `path` (used by synth, sim, import, merge); with `sql_spans`
// the file also gets the per-span SQL table. `batch_spans`: spans per flush (TraceWriter's batch;
// a small one gives many blocks per stream).
void write_trace(const Trace& t, const std::string& path, bool sql_spans = false,
                 size_t batch_spans = size_t{1} << 18);

// `orrery export --format sqlite`: a copy of the trace at `input` written to `output` with the
// per-span SQL table `spans` and its indexes, for SQL users. Written beside `output` and renamed
// when whole. Throws InputError on an unreadable input or an unwritable output.
void export_sqlite(const std::string& input, const std::string& output);

// Read-only access. Open throws InputError naming the file and the problem: missing, not SQLite,
// corrupt, another schema version ("schema version 7, expected 3 (or 2, ...)"), no Orrery tables.
// Every read of a packed block checks its CRC32C first (schema 3); a mismatch, or bytes that do
// not decode, is an InputError naming the file and the block: "T.db: corrupt trace (span block 7
// (rank 0, stream 1): checksum mismatch: ...)".
class TraceReader {
 public:
  explicit TraceReader(const std::string& path);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  const std::string& path() const { return path_; }
  int schema_version() const { return schema_version_; }
  // Whether the file's blocks carry checksums (schema 3; a schema 2 file has none).
  bool checksums() const { return schema_version_ >= 3; }
  bool complete() const;  // false for a trace whose writer never close()d (a run that died)

  RunMeta meta() const;
  std::vector<RankInfo> ranks() const;
  std::vector<StreamInfo> streams() const;
  std::vector<CommunicatorInfo> communicators() const;
  StringTable strings() const;
  int64_t span_count() const;
  int64_t counter_count() const;

  // Earliest span start and latest span end over all spans; nullopt when the trace has none.
  struct TimeRange {
    int64_t start_ns;
    int64_t end_ns;
  };
  std::optional<TimeRange> time_range() const;
  // Per (rank, stream): span count, first start, last end, longest span (kept by the writer).
  struct StreamBounds {
    int32_t rank = 0;
    int32_t stream = 0;
    int64_t count = 0;
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    int64_t max_dur_ns = 0;
  };
  std::vector<StreamBounds> stream_bounds() const;

  // Spans of one rank and stream overlapping [t0, t1), sorted by start: start < t1 and
  // (end > t0, or a zero-length span starting at or after t0).
  std::vector<Span> spans_in_window(int32_t rank, int32_t stream, int64_t t0, int64_t t1) const;
  // The collectives/transfers of a communicator in sequence order (all ranks).
  std::vector<Span> collectives_of(int32_t comm) const;

  struct StepAggregate {
    int32_t rank;
    int32_t step;
    int64_t start_ns;       // earliest span start in the step
    int64_t end_ns;         // latest span end in the step
    int64_t compute_ns;     // sum of compute-kind span durations (not merged)
    int64_t collective_ns;  // sum of collective + p2p durations (not merged)
    int64_t span_count;
  };
  std::vector<StepAggregate> step_aggregates() const;

  std::vector<CounterSample> counters() const;
  // Those whose name id `keep` accepts (nullptr: all).
  std::vector<CounterSample> counters(const std::function<bool(NameId)>& keep) const;
  // Those of one rank: counters()'s samples of that rank, in its order (the Chakra export, a
  // rank at a time).
  std::vector<CounterSample> counters_of_rank(int32_t rank) const;
  // Everything, spans sorted by (rank, stream, start_ns); equal starts in the order they were
  // added. Reads the spans on up to min(8, hardware threads) connections in parallel.
  Trace load_all() const;
  // The same with an explicit number of reading threads (0: the default above).
  Trace load_all(unsigned threads) const;

  // Streaming, for traces larger than memory (`orrery report`): calls `visit` with consecutive
  // runs of the spans, which together are load_all()'s spans in load_all()'s order ((rank,
  // stream, start), equal starts in arrival order); a run lies in one stream. Blocks are read one
  // at a time on a connection of its own, each checked as load_all() checks it (checksum, key and
  // count against the block index, decoding, name ids against the string table); a stream whose
  // spans arrived out of start order across blocks holds back only the spans a later block
  // could still precede (its index's first start), so memory is about a block per call, not the
  // span count. The runs are valid only during the call.
  using SpanRunVisitor = std::function<void(std::span<const Span>)>;
  void for_each_span_run(const SpanRunVisitor& visit) const;
  // The span blocks one at a time in the order of their index's first start (then id), so the
  // spans of all ranks arrive roughly in time order: what groups collective instances across ranks
  // with only the instances in flight in memory. Each block is checked as for_each_span_run()
  // checks it; its spans come as stored (a stream's spans in load_all()'s order are its blocks by
  // id, each block's spans in place, stably sorted by start). Memory is one block.
  struct SpanBlockView {
    int32_t rank = 0, stream = 0;
    int64_t id = 0;          // the block's id
    bool rank_done = false;  // no later block of this rank follows
    std::span<const Span> spans;
  };
  using SpanBlockVisitor = std::function<void(const SpanBlockView&)>;
  void for_each_block_by_time(const SpanBlockVisitor& visit) const;
  // for_each_block_by_time() pulled one block at a time, so that the blocks of several files can
  // be taken in one time order (`orrery doctor` on per-rank files). The same blocks, order and
  // checks; a view is valid until the next call of next(). The reader must outlive the cursor.
  class BlockCursor {
   public:
    explicit BlockCursor(const TraceReader& reader);
    ~BlockCursor();
    BlockCursor(const BlockCursor&) = delete;
    BlockCursor& operator=(const BlockCursor&) = delete;
    // The next block, or nullptr after the last.
    const SpanBlockView* next();
    // The index's first start of the block next() gives next (INT64_MAX after the last): no span
    // of this file still to come starts earlier.
    int64_t next_start_ns() const;

   private:
    struct Impl;  // the connection, the sorted block index and the decoded block (store.cpp)
    std::unique_ptr<Impl> impl_;
  };
  // Everything load_all() gives but the spans (meta, ranks, streams, communicators, strings,
  // counters): what a streaming reader needs beside for_each_span_run().
  Trace load_header() const;
  // The same with only the counters whose name `keep` accepts (the others can be streamed).
  using CounterFilter = std::function<bool(std::string_view name)>;
  Trace load_header(const CounterFilter& keep) const;
  // Streaming the counters: the samples whose name `keep` accepts, rank by rank (ascending), each
  // rank's in time order, equal times by name id, then in counters()'s order (so a rank's samples
  // of counters(), stably sorted by time); a run lies in one rank. Blocks are read one at a time,
  // checked as counters() checks them; memory is a block per counter name of a rank. A file
  // without block checksums (its samples in a table) is read whole.
  using CounterRunVisitor = std::function<void(std::span<const CounterSample>)>;
  void for_each_counter_run(const CounterFilter& keep, const CounterRunVisitor& visit) const;
  // The ranks with span blocks, ascending (from the block index alone).
  std::vector<int32_t> span_ranks() const;
  // The lowest rank with counter samples (counters().front().rank); nullopt when none.
  std::optional<int32_t> first_counter_rank() const;

  // `orrery info --verify`: checks every span and counter block, one at a time (memory bounded by
  // a block): its checksum (when the file has them), that it decodes to its count, and that its
  // index columns (first start, last end, longest span, communicator range; first and last time)
  // are those of its spans. Damage is reported here, not thrown.
  struct Verification {
    bool checksums = false;                           // the file has them (schema 3)
    int64_t span_blocks = 0, spans = 0;               // checked
    int64_t counter_blocks = 0, counter_samples = 0;  // checked (schema 2: samples, no blocks)
    // One line per damaged block, in table then id order: "span block 7 (rank 0, stream 1):
    // checksum mismatch: ...".
    std::vector<std::string> damaged;
  };
  Verification verify() const;

 private:
  std::vector<CounterSample> counters_where(const std::function<bool(NameId)>& keep,
                                            std::optional<int32_t> rank) const;
  std::string path_;
  sqlite3* db_ = nullptr;  // opened without SQLite's mutex; mu_ serialises its use
  mutable std::mutex mu_;
  int schema_version_ = 0;
};

// Convenience: TraceReader(path).load_all().
Trace load_trace(const std::string& path);

// Merges per-rank trace files into one. Metadata, ranks and communicators are united (by id);
// string tables are remapped. An input (schema 3) whose string ids are the output's (its table a
// prefix of the names met so far: every rank of one run interns in the same order) has its span
// and counter blocks and step rows copied as they are, each block's CRC32C checked on the way;
// any other input is decoded and re-encoded. The zoom levels are computed on the merged file. Inputs that are incomplete are still merged (and the output says so
// in meta.extra_json). Tables of the inputs that are not the store's own (the profiler's
// flight_records and rank_status) are copied into the output: rows appended, in input order
// (INSERT OR REPLACE: a table with a primary key keeps the last input's row). Throws InputError on
// unreadable inputs.
void merge_traces(const std::vector<std::string>& inputs, const std::string& output);

// For tests and the fuzzer only: rewrites the CRC32C of every block of the schema-3 trace at `path`
// to match its bytes, so that damage made on purpose reaches the decoder below the checksum. Never
// for real traces: it makes a damaged block look whole. Throws InputError if the file cannot be
// opened for writing or is not schema 3.
void reseal_block_checksums(const std::string& path);

}  // namespace orrery::traces
