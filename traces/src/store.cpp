// The SQLite trace store: schema, the buffered writer, the read-only reader and merge_traces().
//
// Schema version 3. Layout, and why:
// - blocks: the spans, packed (span_block.hpp) per (rank, stream) in runs of at most
//   kBlockSpans sorted by start, with each block's count, first start, last end, longest span,
//   the smallest and largest communicator id among its spans (NULL when none has one) and its
//   CRC32C (detail::block_crc: of rank, stream, count and the packed bytes). load_all(),
//   spans_in_window() and collectives_of() read these: decoding bytes costs a fraction of stepping
//   SQLite once per span and reading 15 columns. blocks_by_stream (rank, stream, min_start_ns,
//   max_end_ns) finds the blocks that meet a time window without touching the packed bytes; the
//   packed bytes are the last column so that the others are read without the overflow pages.
// - counter_blocks: the counter samples, packed per (rank, counter name) in runs of at most
//   kBlockSpans sorted by time, with count, first and last time and the CRC32C (of rank, name id,
//   count and the packed bytes).
// - Every read of a block checks its CRC32C first: a mismatch is an InputError naming the file and
//   the block (table, id, rank and stream or counter name id); TraceReader::verify() checks them
//   all. Version 2 (before the checksums: no crc32c column, counters one row per sample in a table
//   `counters`) is still read, without checks.
// - steps: per (rank, step) aggregates, kept up to date by the writer at every flush.
// - strings, meta, ranks, streams, communicators: one row each, as named.
// - A flush writes span blocks, counter blocks and steps in one transaction; blocks are never
//   modified afterwards, so a reader of a file still being written sees whole batches only. Among
//   equal starts, spans keep the order they were added.
// - spans (optional, only in files written with sql_spans, e.g. by `orrery export --format
//   sqlite`): one row per span with every attribute as a column, indexed by (comm, seq) and
//   (step, rank), for people who query traces in SQL, and beside it `counters`, one row per counter
//   sample (rank, name, ts_ns, value). Schema version 1 wrote spans into every file at close();
//   filling it costs about 1.3 us of CPU per span, five times what recording the span
//   costs, and no Orrery reader needs it, so version 2 writes it on request only. Meta key
//   'sql_spans' says whether a file has it.
// - meta: the RunMeta fields one key each. The typed ones (origin; zero, micro_batches, schedule,
//   placement, recompute, device, precision; failed, lost_ranks as a JSON array, failed_step,
//   failure) were
//   keys of extra_json before; the reader takes them from there in files that lack the keys.
// - Tables the store does not own (the profiler's flight_records and rank_status) may be added to
//   a file by others; merge_traces() copies them.
// - While writing: WAL journal (readers can read a file being written), synchronous=OFF. close()
//   fills and indexes the SQL tables (with sql_spans), marks the file complete and returns it to a
//   single-file journal (unless a reader still holds it open; it then stays WAL, which readers
//   handle).
#include "orrery/traces/store.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "orrery/common/atomic_file.hpp"
#include "orrery/common/crc32c.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/stream_chunks.hpp"
#include "orrery/traces/zoom.hpp"
#include "span_block.hpp"

namespace orrery::traces {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSchemaSql = R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE ranks(rank INTEGER PRIMARY KEY, host TEXT, device TEXT, dp INTEGER, tp INTEGER,
                   pp INTEGER);
CREATE TABLE streams(rank INTEGER, stream INTEGER, name TEXT, PRIMARY KEY(rank, stream))
  WITHOUT ROWID;
CREATE TABLE strings(id INTEGER PRIMARY KEY, text TEXT NOT NULL);
CREATE TABLE communicators(id INTEGER PRIMARY KEY, kind TEXT, name TEXT, ranks TEXT);
CREATE TABLE blocks(id INTEGER PRIMARY KEY, rank INTEGER, stream INTEGER, chunk INTEGER,
                    count INTEGER, min_start_ns INTEGER, max_end_ns INTEGER, max_dur_ns INTEGER,
                    min_comm INTEGER, max_comm INTEGER, crc32c INTEGER, packed BLOB);
CREATE INDEX blocks_by_stream ON blocks(rank, stream, min_start_ns, max_end_ns, count);
CREATE TABLE steps(rank INTEGER, step INTEGER, start_ns INTEGER, end_ns INTEGER,
                   compute_ns INTEGER, collective_ns INTEGER, span_count INTEGER,
                   PRIMARY KEY(rank, step)) WITHOUT ROWID;
CREATE TABLE counter_blocks(id INTEGER PRIMARY KEY, rank INTEGER, name INTEGER, count INTEGER,
                            min_ts_ns INTEGER, max_ts_ns INTEGER, crc32c INTEGER, packed BLOB);
)sql";

// The optional per-span and per-sample SQL tables (files written with sql_spans), filled and
// indexed by close(). The store's readers never read them: blocks are the trace.
constexpr const char* kSqlSpansTable = R"sql(
CREATE TABLE spans(id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, stream INTEGER NOT NULL,
                   kind INTEGER, name INTEGER, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
                   step INTEGER, micro_batch INTEGER, layer INTEGER, bytes INTEGER, flops REAL,
                   comm INTEGER, peer INTEGER, seq INTEGER, op INTEGER);
CREATE TABLE counters(rank INTEGER, name INTEGER, ts_ns INTEGER, value REAL);
)sql";
constexpr const char* kSqlSpansIndexSql = R"sql(
CREATE INDEX IF NOT EXISTS spans_by_comm_seq ON spans(comm, seq) WHERE comm >= 0;
CREATE INDEX IF NOT EXISTS spans_by_step ON spans(step, rank) WHERE step >= 0;
CREATE INDEX IF NOT EXISTS counters_by_rank ON counters(rank, name, ts_ns);
)sql";

// The tables every Orrery trace of this schema version has (the reader checks them), and those of
// version 2, which is still read.
constexpr const char* kOrreryTables[] = {"meta",          "strings",        "ranks",  "streams",
                                         "communicators", "counter_blocks", "blocks", "steps"};
constexpr const char* kOrreryTablesV2[] = {"meta",          "strings",  "ranks",  "streams",
                                           "communicators", "counters", "blocks", "steps"};
constexpr int kOldestReadableVersion = 2;

constexpr const char* kSpanColumns =
    "rank, stream, kind, name, start_ns, end_ns, step, micro_batch, layer, bytes, flops, comm, "
    "peer, seq, op";

constexpr int kInsertRows = 32;  // rows per multi-row INSERT: fewer statement executions
constexpr int kSpanInsertCols = 16;

std::string join_ranks(const std::vector<int32_t>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ranks[i]);
  }
  return s;
}

std::vector<int32_t> split_ranks(const std::string& s) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i)
      out.push_back(static_cast<int32_t>(std::strtoll(s.substr(i, j - i).c_str(), nullptr, 10)));
    i = j + 1;
  }
  return out;
}

std::string column_text(sqlite3_stmt* st, int i) {
  const auto* p = sqlite3_column_text(st, i);
  return p ? std::string(reinterpret_cast<const char*>(p),
                         static_cast<size_t>(sqlite3_column_bytes(st, i)))
           : std::string();
}

using StreamKey = std::pair<int32_t, int32_t>;  // (rank, stream)

// A (rank, step) row's figures merged with another part of the same step: the earliest start, the
// latest end, the sums.
constexpr const char* kAddToStepRow =
    "ON CONFLICT(rank, step) DO UPDATE SET start_ns = min(start_ns, excluded.start_ns), end_ns = "
    "max(end_ns, excluded.end_ns), compute_ns = compute_ns + excluded.compute_ns, collective_ns = "
    "collective_ns + excluded.collective_ns, span_count = span_count + excluded.span_count";
const std::string kAccumulateStep =
    std::string("INSERT INTO steps VALUES(?,?,?,?,?,?,?) ") + kAddToStepRow;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Small RAII helpers shared by the writer and the reader.

namespace {

class Stmt {
 public:
  Stmt() = default;
  explicit Stmt(sqlite3_stmt* st) : st_(st) {}
  ~Stmt() { sqlite3_finalize(st_); }
  Stmt(Stmt&& o) noexcept : st_(std::exchange(o.st_, nullptr)) {}
  Stmt& operator=(Stmt&& o) noexcept {
    if (this != &o) {
      sqlite3_finalize(st_);
      st_ = std::exchange(o.st_, nullptr);
    }
    return *this;
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  sqlite3_stmt* get() const { return st_; }

 private:
  sqlite3_stmt* st_ = nullptr;
};

bool is_input_corruption(int rc) {
  const int primary = rc & 0xff;
  return primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB || primary == SQLITE_IOERR ||
         primary == SQLITE_FORMAT || primary == SQLITE_CANTOPEN || primary == SQLITE_RANGE;
}

// Reader errors: a damaged file is the user's input (InputError); anything else is ours.
[[noreturn]] void rfail(sqlite3* db, const std::string& path, int rc, const std::string& what) {
  const std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if (is_input_corruption(rc)) throw InputError(path + ": cannot read trace (" + msg + ")");
  // A damaged record can claim a value of hundreds of megabytes; SQLite then fails the read for
  // memory or length. The file is the likelier cause than this process.
  const int primary = rc & 0xff;
  if (primary == SQLITE_NOMEM || primary == SQLITE_TOOBIG) {
    throw InputError(path + ": cannot read trace (" + msg +
                     " while reading it: a damaged record claims more than the file holds, or the "
                     "trace needs more memory than this machine has)");
  }
  throw InternalError(path + ": trace read failed: " + what + " (" + msg + ")");
}

Stmt rprep(sqlite3* db, const std::string& path, const char* sql) {
  sqlite3_stmt* st = nullptr;
  const int rc = sqlite3_prepare_v2(db, sql, -1, &st, nullptr);
  // Our queries are fixed and tested, so a prepare that fails is the file's schema: damaged
  // ("malformed database schema", "unsupported file format", or an absurd schema SQLite refuses
  // with "out of memory") or a table lacking our columns.
  if ((rc & 0xff) == SQLITE_ERROR || (rc & 0xff) == SQLITE_NOMEM) {
    throw InputError(path + ": not a readable Orrery trace (" + sqlite3_errmsg(db) + ")");
  }
  if (rc != SQLITE_OK) rfail(db, path, rc, std::string("prepare ") + sql);
  return Stmt(st);
}

bool rstep(sqlite3* db, const std::string& path, Stmt& st) {
  const int rc = sqlite3_step(st.get());
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  rfail(db, path, rc, "query");
}

[[noreturn]] void writer_fail(const std::string& path, sqlite3* db, const std::string& what) {
  throw InternalError(path + ": trace write failed: " + what + " (" +
                      (db ? sqlite3_errmsg(db) : "no database") + ")");
}

Stmt wprep(sqlite3* db, const std::string& path, const char* sql) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr) != SQLITE_OK) {
    writer_fail(path, db, std::string("prepare ") + sql);
  }
  return Stmt(st);
}

// ---------------------------------------------------------------------------------------------
// Checked blocks. Every query of packed blocks selects (id, key0, key1, count, crc32c, packed) as
// its first six columns: key0, key1 are rank and stream (blocks) or rank and counter name id
// (counter_blocks); crc32c is NULL in a file of schema 2, which has none.

// The least bytes one packed span (a presence byte and five varints) and one packed counter
// sample (a varint and 8 bytes) take: a count beyond size / this is damage, not an allocation.
constexpr size_t kMinSpanBytes = 6;
constexpr size_t kMinSampleBytes = 9;

struct PackedRow {
  int64_t id = 0, key0 = 0, key1 = 0, count = 0;
  const unsigned char* data = nullptr;
  size_t size = 0;
};

PackedRow packed_row(sqlite3_stmt* st) {
  PackedRow r;
  r.id = sqlite3_column_int64(st, 0);
  r.key0 = sqlite3_column_int64(st, 1);
  r.key1 = sqlite3_column_int64(st, 2);
  r.count = sqlite3_column_int64(st, 3);
  r.data = static_cast<const unsigned char*>(sqlite3_column_blob(st, 5));
  r.size = static_cast<size_t>(sqlite3_column_bytes(st, 5));
  return r;
}

const char* crc_column(bool checksums) { return checksums ? "crc32c" : "NULL"; }

std::string hex32(int64_t v) {
  if (v < 0 || v > 0xffffffffLL) return std::to_string(v) + " (not a 32-bit value)";
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", static_cast<unsigned>(v));
  return b;
}

// What is wrong with a block row before it is decoded, "" if nothing: its checksum (when the file
// has them), then its count against its size (each item takes at least `min_item_bytes`).
std::string row_problem(sqlite3_stmt* st, const PackedRow& r, bool checksums,
                        size_t min_item_bytes) {
  if (checksums) {
    if (sqlite3_column_type(st, 4) != SQLITE_INTEGER) return "its crc32c column is not an integer";
    const int64_t stored = sqlite3_column_int64(st, 4);
    const uint32_t actual = detail::block_crc(r.key0, r.key1, r.count, r.data, r.size);
    if (stored != static_cast<int64_t>(actual)) {
      return "checksum mismatch: CRC32C " + hex32(actual) + " of its key, count and " +
             std::to_string(r.size) + " packed bytes, the block records " + hex32(stored);
    }
  }
  if (r.count < 0) return "negative count " + std::to_string(r.count);
  if (static_cast<uint64_t>(r.count) > r.size / min_item_bytes) {
    return "count " + std::to_string(r.count) + ", more than its " + std::to_string(r.size) +
           " packed bytes can hold";
  }
  return {};
}

std::string span_block_label(const PackedRow& r) {
  return "span block " + std::to_string(r.id) + " (rank " + std::to_string(r.key0) + ", stream " +
         std::to_string(r.key1) + ")";
}

std::string counter_block_label(const PackedRow& r) {
  return "counter block " + std::to_string(r.id) + " (rank " + std::to_string(r.key0) +
         ", counter name id " + std::to_string(r.key1) + ")";
}

[[noreturn]] void corrupt_block(const std::string& path, const std::string& label,
                                const std::string& problem) {
  throw InputError(path + ": corrupt trace (" + label + ": " + problem + ")");
}

// Checks and decodes the span block of the current row into `out` (resized to its count).
// Returns the problem, "" if none.
std::string span_block_problem(sqlite3_stmt* st, bool checksums, std::vector<Span>& out) {
  const PackedRow r = packed_row(st);
  std::string problem = row_problem(st, r, checksums, kMinSpanBytes);
  if (!problem.empty()) return problem;
  out.resize(static_cast<size_t>(r.count));
  if (!detail::decode_block(r.data, r.size, static_cast<int32_t>(r.key0),
                            static_cast<int32_t>(r.key1), out.size(), out.data())) {
    return "its bytes do not decode";
  }
  return {};
}

// The same for the counter block of the current row.
std::string counter_block_problem(sqlite3_stmt* st, bool checksums,
                                  std::vector<CounterSample>& out) {
  const PackedRow r = packed_row(st);
  std::string problem = row_problem(st, r, checksums, kMinSampleBytes);
  if (!problem.empty()) return problem;
  out.resize(static_cast<size_t>(r.count));
  if (!detail::decode_counter_block(r.data, r.size, static_cast<int32_t>(r.key0),
                                    static_cast<NameId>(r.key1), out.size(), out.data())) {
    return "its bytes do not decode";
  }
  return {};
}

// Decodes the span (counter) block of the current row into `out`; throws InputError naming
// `path` and the block if it is damaged.
void read_span_block(const std::string& path, sqlite3_stmt* st, bool checksums,
                     std::vector<Span>& out) {
  const std::string problem = span_block_problem(st, checksums, out);
  if (!problem.empty()) corrupt_block(path, span_block_label(packed_row(st)), problem);
}

void read_counter_block(const std::string& path, sqlite3_stmt* st, bool checksums,
                        std::vector<CounterSample>& out) {
  const std::string problem = counter_block_problem(st, checksums, out);
  if (!problem.empty()) corrupt_block(path, counter_block_label(packed_row(st)), problem);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

void exec_or_throw(sqlite3* db, const char* sql, const std::string& path) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw InternalError(path + ": trace write failed: " + msg);
  }
}

void bind_span(sqlite3_stmt* st, int base, const Span& s, int64_t id) {
  // Column order of the INSERT: id, then kSpanColumns.
  sqlite3_bind_int64(st, base + 1, id);
  sqlite3_bind_int64(st, base + 2, s.rank);
  sqlite3_bind_int64(st, base + 3, s.stream);
  sqlite3_bind_int64(st, base + 4, static_cast<int64_t>(s.kind));
  sqlite3_bind_int64(st, base + 5, s.name);
  sqlite3_bind_int64(st, base + 6, s.start_ns);
  sqlite3_bind_int64(st, base + 7, s.end_ns);
  sqlite3_bind_int64(st, base + 8, s.step);
  sqlite3_bind_int64(st, base + 9, s.micro_batch);
  sqlite3_bind_int64(st, base + 10, s.layer);
  sqlite3_bind_int64(st, base + 11, s.bytes);
  sqlite3_bind_double(st, base + 12, s.flops);
  sqlite3_bind_int64(st, base + 13, s.comm);
  sqlite3_bind_int64(st, base + 14, s.peer);
  sqlite3_bind_int64(st, base + 15, s.seq);
  sqlite3_bind_int64(st, base + 16, static_cast<int64_t>(s.op));
}

std::string span_insert_sql(int rows) {
  std::string sql = std::string("INSERT INTO spans(id, ") + kSpanColumns + ") VALUES ";
  for (int r = 0; r < rows; ++r) {
    sql += r ? ",(" : "(";
    for (int c = 0; c < kSpanInsertCols; ++c) sql += c ? ",?" : "?";
    sql += ")";
  }
  return sql;
}

struct StepAgg {
  int64_t start_ns = std::numeric_limits<int64_t>::max();
  int64_t end_ns = std::numeric_limits<int64_t>::min();
  int64_t compute_ns = 0, collective_ns = 0, span_count = 0;
};

using CounterKey = std::pair<int32_t, NameId>;  // (rank, counter name)

// A batch's indices grouped by key: the groups in key order, each in arrival order, in one array
// the size of the batch. Kept between flushes, it holds the largest batch; a vector per key kept
// each key's largest share of any batch (up to the keys times the batch: 0.3 GB of a 64-rank
// trace's 320 streams in export). A key is looked up only when it changes from the previous one.
template <class Key>
class BatchGroups {
 public:
  struct Group {
    Key key;
    uint32_t* begin;
    uint32_t* end;
  };
  template <class KeyOf>
  const std::vector<Group>& group(size_t n, const KeyOf& key_of) {
    cursor_.clear();
    for_each_run(n, key_of, [](size_t& count, size_t) { ++count; });
    size_t at = 0;
    for (auto& [key, slot] : cursor_) {  // counts -> where each group begins
      const size_t count = slot;
      slot = at;
      at += count;
    }
    order_.resize(n);
    for_each_run(n, key_of, [this](size_t& next, size_t i) { order_[next++] = uint32_t(i); });
    groups_.clear();
    size_t begin = 0;
    for (const auto& [key, end] : cursor_) {
      groups_.push_back(Group{key, order_.data() + begin, order_.data() + end});
      begin = end;
    }
    return groups_;
  }

 private:
  // fn(the key's slot in cursor_, i) for each i < n.
  template <class KeyOf, class Fn>
  void for_each_run(size_t n, const KeyOf& key_of, const Fn& fn) {
    size_t* slot = nullptr;
    Key last{};
    for (size_t i = 0; i < n; ++i) {
      const Key key = key_of(i);
      if (!slot || key != last) slot = &cursor_[key], last = key;
      fn(*slot, i);
    }
  }
  std::map<Key, size_t> cursor_;  // the batch's keys: their counts, then their groups' ends
  std::vector<uint32_t> order_;
  std::vector<Group> groups_;
};

// Scratch of the counter flush, kept between flushes to avoid reallocating.
struct CounterScratch {
  BatchGroups<CounterKey> groups;
  std::vector<CounterSample> block;
  std::string packed;
};

// Writes `buf` as counter blocks through `st` (the INSERT INTO counter_blocks): grouped by (rank,
// name), each group in time order (ties in arrival order), runs of kBlockSpans samples.
void write_counter_blocks(sqlite3* db, const std::string& path, sqlite3_stmt* st,
                          const std::vector<CounterSample>& buf, CounterScratch& sc) {
  auto by_time = [&buf](uint32_t a, uint32_t b) { return buf[a].ts_ns < buf[b].ts_ns; };
  const auto key_of = [&buf](size_t i) { return CounterKey{buf[i].rank, buf[i].name}; };
  for (const auto& [key, begin, end] : sc.groups.group(buf.size(), key_of)) {
    if (!std::is_sorted(begin, end, by_time)) std::stable_sort(begin, end, by_time);
    const size_t size = size_t(end - begin);
    for (size_t b = 0; b < size; b += detail::kBlockSpans) {
      const size_t n = std::min(detail::kBlockSpans, size - b);
      sc.block.clear();
      for (size_t j = b; j < b + n; ++j) sc.block.push_back(buf[begin[j]]);
      sc.packed.clear();
      detail::encode_counter_block(sc.block.data(), n, sc.packed);
      const auto* bytes = reinterpret_cast<const unsigned char*>(sc.packed.data());
      sqlite3_bind_int64(st, 1, key.first);
      sqlite3_bind_int64(st, 2, key.second);
      sqlite3_bind_int64(st, 3, static_cast<int64_t>(n));
      sqlite3_bind_int64(st, 4, sc.block.front().ts_ns);
      sqlite3_bind_int64(st, 5, sc.block.back().ts_ns);
      sqlite3_bind_int64(st, 6,
                         detail::block_crc(key.first, key.second, static_cast<int64_t>(n), bytes,
                                           sc.packed.size()));
      sqlite3_bind_blob(st, 7, sc.packed.data(), static_cast<int>(sc.packed.size()), SQLITE_STATIC);
      if (sqlite3_step(st) != SQLITE_DONE) writer_fail(path, db, "insert counter block");
      sqlite3_reset(st);
    }
  }
}

}  // namespace

struct TraceWriter::Impl {
  Stmt insert_string, insert_counter_block, insert_block, upsert_step;
  int64_t next_chunk = 0;
  // Per (rank, step), the batch's part; added to its row by the flush (kAccumulateStep).
  std::map<std::pair<int32_t, int32_t>, StepAgg> steps;
  // Per-flush scratch, kept to avoid reallocating: the batch grouped by stream, one block.
  BatchGroups<StreamKey> groups;
  std::vector<Span> block;
  std::string packed;
  CounterScratch counters;
};

TraceWriter::TraceWriter(const std::string& path, size_t batch_spans, bool sql_spans)
    : path_(path), batch_spans_(std::max<size_t>(batch_spans, 1)), sql_spans_(sql_spans) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(path + suffix, ec);
  const int rc =
      sqlite3_open_v2(path.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw InputError(path + ": cannot create trace file (" + msg + ")");
  }
  try {
    // Page size before anything is written; 16 KiB pages keep big traces' B-trees shallow.
    exec_or_throw(db_, "PRAGMA page_size=16384", path_);
    exec_or_throw(db_, "PRAGMA journal_mode=WAL", path_);
    exec_or_throw(db_, "PRAGMA synchronous=OFF", path_);
    exec_or_throw(db_, "PRAGMA cache_size=-65536", path_);
    exec_or_throw(db_, "PRAGMA wal_autocheckpoint=4096", path_);
    exec_or_throw(db_, "BEGIN", path_);
    exec_or_throw(db_, kSchemaSql, path_);
    const std::string version = "PRAGMA user_version=" + std::to_string(kSchemaVersion);
    exec_or_throw(db_, version.c_str(), path_);
    const std::string meta = "INSERT INTO meta VALUES('schema_version'," +
                             std::to_string(kSchemaVersion) + "),('complete',0)";
    exec_or_throw(db_, meta.c_str(), path_);
    exec_or_throw(db_, "COMMIT", path_);
    impl_ = std::make_unique<Impl>();
    impl_->insert_string = wprep(db_, path_, "INSERT INTO strings(id, text) VALUES(?,?)");
    impl_->insert_counter_block = wprep(db_, path_,
                                        "INSERT INTO counter_blocks(rank, name, count, min_ts_ns, "
                                        "max_ts_ns, crc32c, packed) VALUES(?,?,?,?,?,?,?)");
    impl_->insert_block = wprep(db_, path_,
                                "INSERT INTO blocks(rank, stream, chunk, count, min_start_ns, "
                                "max_end_ns, max_dur_ns, min_comm, max_comm, crc32c, packed) "
                                "VALUES(?,?,?,?,?,?,?,?,?,?,?)");
    // Each flush adds its batch's part of a (rank, step) to the row: nothing per step is held
    // between flushes (1.4 M steps of a 64-rank 50 M-span trace held 0.12 GB).
    impl_->upsert_step = wprep(db_, path_, kAccumulateStep.c_str());
  } catch (...) {
    impl_.reset();
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
  span_buf_.reserve(batch_spans_);
}

TraceWriter::~TraceWriter() {
  try {
    close();
  } catch (...) {
    // A destructor must not throw; callers who care call close() themselves.
  }
  impl_.reset();
  if (db_) sqlite3_close(db_);
}

void TraceWriter::set_meta(const RunMeta& m) {
  std::lock_guard lock(mu_);
  if (closed_) throw InternalError(path_ + ": set_meta after close()");
  Stmt st = wprep(db_, path_, "INSERT OR REPLACE INTO meta(key, value) VALUES(?,?)");
  auto put = [&](const char* key, auto bind_value) {
    sqlite3_bind_text(st.get(), 1, key, -1, SQLITE_STATIC);
    bind_value(st.get());
    if (sqlite3_step(st.get()) != SQLITE_DONE) writer_fail(path_, db_, "meta");
    sqlite3_reset(st.get());
  };
  auto text = [&](const char* key, const std::string& v) {
    put(key, [&](sqlite3_stmt* s) {
      sqlite3_bind_text(s, 2, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    });
  };
  auto integer = [&](const char* key, int64_t v) {
    put(key, [&](sqlite3_stmt* s) { sqlite3_bind_int64(s, 2, v); });
  };
  auto real = [&](const char* key, double v) {
    put(key, [&](sqlite3_stmt* s) { sqlite3_bind_double(s, 2, v); });
  };
  exec_or_throw(db_, "BEGIN", path_);
  text("source", std::string(to_string(m.source)));
  text("scenario_text", m.scenario_text);
  text("scenario_name", m.scenario_name);
  text("host", m.host);
  integer("start_time_unix_ns", m.start_time_unix_ns);
  integer("world_size", m.world_size);
  integer("dp", m.dp);
  integer("tp", m.tp);
  integer("pp", m.pp);
  integer("tokens_per_step", m.tokens_per_step);
  real("model_flops_per_step", m.model_flops_per_step);
  real("peak_flops_per_rank", m.peak_flops_per_rank);
  text("origin", std::string(to_string(m.origin)));
  integer("zero", m.layout.zero);
  integer("micro_batches", m.layout.micro_batches);
  text("schedule", m.layout.schedule);
  text("placement", m.layout.placement);
  text("recompute", m.layout.recompute);
  text("device", m.layout.device);
  text("precision", m.layout.precision);
  integer("failed", m.failure.failed ? 1 : 0);
  text("lost_ranks", nlohmann::json(m.failure.lost_ranks).dump());
  integer("failed_step", m.failure.step);
  text("failure", m.failure.message);
  text("extra_json", m.extra_json.empty() ? std::string("{}") : m.extra_json);
  exec_or_throw(db_, "COMMIT", path_);
}

void TraceWriter::add_rank(const RankInfo& r) {
  std::lock_guard lock(mu_);
  if (closed_) throw InternalError(path_ + ": add_rank after close()");
  Stmt st = wprep(db_, path_, "INSERT OR REPLACE INTO ranks VALUES(?,?,?,?,?,?)");
  sqlite3_bind_int64(st.get(), 1, r.rank);
  sqlite3_bind_text(st.get(), 2, r.host.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.get(), 3, r.device.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.get(), 4, r.dp);
  sqlite3_bind_int64(st.get(), 5, r.tp);
  sqlite3_bind_int64(st.get(), 6, r.pp);
  if (sqlite3_step(st.get()) != SQLITE_DONE) writer_fail(path_, db_, "add_rank");
}

void TraceWriter::add_stream(const StreamInfo& s) {
  std::lock_guard lock(mu_);
  if (closed_) throw InternalError(path_ + ": add_stream after close()");
  Stmt st = wprep(db_, path_, "INSERT OR REPLACE INTO streams VALUES(?,?,?)");
  sqlite3_bind_int64(st.get(), 1, s.rank);
  sqlite3_bind_int64(st.get(), 2, s.stream);
  sqlite3_bind_text(st.get(), 3, s.name.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.get()) != SQLITE_DONE) writer_fail(path_, db_, "add_stream");
}

void TraceWriter::add_communicator(const CommunicatorInfo& c) {
  std::lock_guard lock(mu_);
  if (closed_) throw InternalError(path_ + ": add_communicator after close()");
  Stmt st = wprep(db_, path_, "INSERT OR REPLACE INTO communicators VALUES(?,?,?,?)");
  const std::string kind(to_string(c.kind));
  const std::string ranks = join_ranks(c.ranks);
  sqlite3_bind_int64(st.get(), 1, c.id);
  sqlite3_bind_text(st.get(), 2, kind.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.get(), 3, c.name.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.get(), 4, ranks.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.get()) != SQLITE_DONE) writer_fail(path_, db_, "add_communicator");
}

NameId TraceWriter::intern(std::string_view name) {
  std::lock_guard lock(mu_);
  return strings_.intern(name);
}

void TraceWriter::add_span(const Span& s) {
  std::lock_guard lock(mu_);
  if (closed_) throw InternalError(path_ + ": add_span after close()");
  span_buf_.push_back(s);
  if (span_buf_.size() >= batch_spans_) flush_locked();
}

void TraceWriter::add_spans(const std::vector<Span>& spans) {
  std::lock_guard lock(mu_);
  if (closed_) throw InternalError(path_ + ": add_spans after close()");
  for (const auto& s : spans) {
    span_buf_.push_back(s);
    if (span_buf_.size() >= batch_spans_) flush_locked();
  }
}

void TraceWriter::add_counter(const CounterSample& c) {
  std::lock_guard lock(mu_);
  if (closed_) throw InternalError(path_ + ": add_counter after close()");
  counter_buf_.push_back(c);
  if (counter_buf_.size() >= batch_spans_) flush_locked();
}

void TraceWriter::flush() {
  std::lock_guard lock(mu_);
  if (!closed_) flush_locked();
}

void TraceWriter::flush_locked() {
  auto& im = *impl_;
  if (span_buf_.empty() && counter_buf_.empty() && strings_written_ == strings_.size()) return;
  exec_or_throw(db_, "BEGIN", path_);

  // Strings first: spans in this batch may refer to them.
  {
    sqlite3_stmt* st = im.insert_string.get();
    for (; strings_written_ < strings_.size(); ++strings_written_) {
      const auto& text = strings_.str(static_cast<NameId>(strings_written_));
      sqlite3_bind_int64(st, 1, static_cast<int64_t>(strings_written_));
      sqlite3_bind_text(st, 2, text.data(), static_cast<int>(text.size()), SQLITE_STATIC);
      if (sqlite3_step(st) != SQLITE_DONE) writer_fail(path_, db_, "insert string");
      sqlite3_reset(st);
    }
  }

  if (!span_buf_.empty()) {
    // Blocks: group by stream (a map lookup only when the stream changes), order each group by
    // start (ties in arrival order; nearly always already so), pack runs of kBlockSpans.
    const int64_t chunk = im.next_chunk++;
    std::pair<int32_t, int32_t> last_step{0, 0};
    StepAgg* agg = nullptr;
    for (const Span& s : span_buf_) {
      if (s.step >= 0) {
        const std::pair<int32_t, int32_t> sk{s.rank, s.step};
        if (!agg || sk != last_step) {
          agg = &im.steps[sk];
          last_step = sk;
        }
        agg->start_ns = std::min(agg->start_ns, s.start_ns);
        agg->end_ns = std::max(agg->end_ns, s.end_ns);
        if (s.kind == SpanKind::Compute || s.kind == SpanKind::Optimizer) {
          agg->compute_ns += s.end_ns - s.start_ns;
        } else if (s.kind == SpanKind::Collective || s.kind == SpanKind::P2P) {
          agg->collective_ns += s.end_ns - s.start_ns;
        }
        agg->span_count += 1;
      }
    }
    auto by_start = [this](uint32_t a, uint32_t b) {
      return span_buf_[a].start_ns < span_buf_[b].start_ns;
    };
    sqlite3_stmt* block_st = im.insert_block.get();
    const auto stream_of = [this](size_t i) {
      return StreamKey{span_buf_[i].rank, span_buf_[i].stream};
    };
    for (const auto& [key, begin, end] : im.groups.group(span_buf_.size(), stream_of)) {
      if (!std::is_sorted(begin, end, by_start)) std::stable_sort(begin, end, by_start);
      const size_t size = size_t(end - begin);
      for (size_t b = 0; b < size; b += detail::kBlockSpans) {
        const size_t n = std::min(detail::kBlockSpans, size - b);
        im.block.clear();
        int64_t max_end = std::numeric_limits<int64_t>::min(), max_dur = 0;
        int32_t min_comm = std::numeric_limits<int32_t>::max(), max_comm = -1;
        for (size_t j = b; j < b + n; ++j) {
          const Span& s = span_buf_[begin[j]];
          im.block.push_back(s);
          // A malformed span ending before it starts still has to be found by its start.
          max_end = std::max(max_end, std::max(s.end_ns, s.start_ns));
          max_dur = std::max(max_dur, s.end_ns - s.start_ns);
          if (s.comm >= 0) {
            min_comm = std::min(min_comm, s.comm);
            max_comm = std::max(max_comm, s.comm);
          }
        }
        im.packed.clear();
        detail::encode_block(im.block.data(), n, im.packed);
        sqlite3_bind_int64(block_st, 1, key.first);
        sqlite3_bind_int64(block_st, 2, key.second);
        sqlite3_bind_int64(block_st, 3, chunk);
        sqlite3_bind_int64(block_st, 4, static_cast<int64_t>(n));
        sqlite3_bind_int64(block_st, 5, im.block.front().start_ns);
        sqlite3_bind_int64(block_st, 6, max_end);
        sqlite3_bind_int64(block_st, 7, max_dur);
        if (max_comm >= 0) {
          sqlite3_bind_int64(block_st, 8, min_comm);
          sqlite3_bind_int64(block_st, 9, max_comm);
        } else {
          sqlite3_bind_null(block_st, 8);
          sqlite3_bind_null(block_st, 9);
        }
        sqlite3_bind_int64(
            block_st, 10,
            detail::block_crc(key.first, key.second, static_cast<int64_t>(n),
                              reinterpret_cast<const unsigned char*>(im.packed.data()),
                              im.packed.size()));
        sqlite3_bind_blob(block_st, 11, im.packed.data(), static_cast<int>(im.packed.size()),
                          SQLITE_STATIC);
        if (sqlite3_step(block_st) != SQLITE_DONE) writer_fail(path_, db_, "insert block");
        sqlite3_reset(block_st);
      }
    }

    sqlite3_stmt* step_st = im.upsert_step.get();
    for (const auto& [sk, a] : im.steps) {
      sqlite3_bind_int64(step_st, 1, sk.first);
      sqlite3_bind_int64(step_st, 2, sk.second);
      sqlite3_bind_int64(step_st, 3, a.start_ns);
      sqlite3_bind_int64(step_st, 4, a.end_ns);
      sqlite3_bind_int64(step_st, 5, a.compute_ns);
      sqlite3_bind_int64(step_st, 6, a.collective_ns);
      sqlite3_bind_int64(step_st, 7, a.span_count);
      if (sqlite3_step(step_st) != SQLITE_DONE) writer_fail(path_, db_, "upsert step");
      sqlite3_reset(step_st);
    }
    im.steps.clear();
  }

  write_counter_blocks(db_, path_, im.insert_counter_block.get(), counter_buf_, im.counters);
  exec_or_throw(db_, "COMMIT", path_);
  span_buf_.clear();
  counter_buf_.clear();
}

namespace {

// The SQL table `counters` of a file written with sql_spans: one row per sample, from the counter
// blocks.
void fill_counters_table(sqlite3* db, const std::string& path) {
  Stmt insert = wprep(db, path, "INSERT INTO counters(rank, name, ts_ns, value) VALUES(?,?,?,?)");
  Stmt blocks = wprep(
      db, path, "SELECT id, rank, name, count, crc32c, packed FROM counter_blocks ORDER BY id");
  std::vector<CounterSample> samples;
  for (;;) {
    const int rc = sqlite3_step(blocks.get());
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) writer_fail(path, db, "read counter blocks");
    const std::string problem = counter_block_problem(blocks.get(), true, samples);
    if (!problem.empty()) {
      throw InternalError(path + ": " + counter_block_label(packed_row(blocks.get())) +
                          ", written by this writer: " + problem);
    }
    sqlite3_stmt* st = insert.get();
    for (const auto& c : samples) {
      sqlite3_bind_int64(st, 1, c.rank);
      sqlite3_bind_int64(st, 2, c.name);
      sqlite3_bind_int64(st, 3, c.ts_ns);
      sqlite3_bind_double(st, 4, c.value);
      if (sqlite3_step(st) != SQLITE_DONE) writer_fail(path, db, "insert counter");
      sqlite3_reset(st);
    }
  }
}

}  // namespace

void TraceWriter::close() {
  std::lock_guard lock(mu_);
  if (closed_ || !db_) return;
  flush_locked();
  exec_or_throw(db_, "BEGIN", path_);
  if (sql_spans_) {
    exec_or_throw(db_, kSqlSpansTable, path_);
    fill_spans_table();
    fill_counters_table(db_, path_);
    exec_or_throw(db_, kSqlSpansIndexSql, path_);
    exec_or_throw(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES('sql_spans', 1)", path_);
  }
  exec_or_throw(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES('complete', 1)", path_);
  exec_or_throw(db_, "COMMIT", path_);
  closed_ = true;
  impl_.reset();
  // The zoom levels, from the committed blocks (one streaming pass; a viewer reads them instead
  // of the spans when zoomed out).
  std::exception_ptr zoom_error;
  try {
    if (zoom_levels_) write_zoom_levels(db_, path_, TraceReader(path_));
  } catch (...) {
    zoom_error = std::current_exception();
  }
  // Back to a single self-contained file. Fails harmlessly (stays WAL) if a reader holds it open.
  sqlite3_exec(db_, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
  sqlite3_exec(db_, "PRAGMA journal_mode=DELETE", nullptr, nullptr, nullptr);
  sqlite3_close(db_);
  db_ = nullptr;
  if (zoom_error) std::rethrow_exception(zoom_error);
}

void TraceWriter::fill_spans_table() {
  // One row per span, from the blocks, in block order (id is a row number, not an arrival
  // number). Done once here rather than per batch: stepping SQLite for 16 columns per span costs
  // more than everything else the writer does, and a running program should not pay it.
  Stmt insert_many = wprep(db_, path_, span_insert_sql(kInsertRows).c_str());
  Stmt insert_one = wprep(db_, path_, span_insert_sql(1).c_str());
  Stmt blocks =
      wprep(db_, path_, "SELECT id, rank, stream, count, crc32c, packed FROM blocks ORDER BY id");
  std::vector<Span> spans;
  int64_t next_id = 0;
  sqlite3_stmt* many = insert_many.get();
  sqlite3_stmt* one = insert_one.get();
  for (;;) {
    const int rc = sqlite3_step(blocks.get());
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) writer_fail(path_, db_, "read blocks");
    const std::string problem = span_block_problem(blocks.get(), true, spans);
    if (!problem.empty()) {
      throw InternalError(path_ + ": " + span_block_label(packed_row(blocks.get())) +
                          ", written by this writer: " + problem);
    }
    const size_t n = spans.size();
    size_t k = 0;
    for (; k + kInsertRows <= n; k += kInsertRows) {
      for (int r = 0; r < kInsertRows; ++r)
        bind_span(many, r * kSpanInsertCols, spans[k + r], next_id++);
      if (sqlite3_step(many) != SQLITE_DONE) writer_fail(path_, db_, "insert spans");
      sqlite3_reset(many);
    }
    for (; k < n; ++k) {
      bind_span(one, 0, spans[k], next_id++);
      if (sqlite3_step(one) != SQLITE_DONE) writer_fail(path_, db_, "insert span");
      sqlite3_reset(one);
    }
  }
}

void write_trace(const Trace& t, const std::string& path, bool sql_spans, size_t batch_spans) {
  TraceWriter w(path, batch_spans, sql_spans);
  w.set_meta(t.meta);
  for (const auto& r : t.ranks) w.add_rank(r);
  for (const auto& s : t.streams) w.add_stream(s);
  for (const auto& c : t.comms) w.add_communicator(c);
  // Interning in table order keeps every NameId of `t` valid in the file.
  for (const auto& s : t.strings.all()) w.intern(s);
  w.add_spans(t.spans);
  for (const auto& c : t.counters) w.add_counter(c);
  w.close();
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

// SQLite reports a truncated file as "database disk image is malformed"; the header says how big
// the file should be, so name the problem exactly. Skipped while a WAL exists beside the file (the
// main file lags the WAL there) and for files whose header size field is not valid.
void check_not_truncated(const std::string& path, uintmax_t file_size) {
  std::error_code ec;
  if (fs::exists(path + "-wal", ec)) return;
  unsigned char h[100] = {};
  std::ifstream f(path, std::ios::binary);
  if (!f.read(reinterpret_cast<char*>(h), sizeof h)) return;
  if (std::memcmp(h, "SQLite format 3", 16) != 0) return;
  auto be32 = [&](int o) {
    return (uint32_t{h[o]} << 24) | (uint32_t{h[o + 1]} << 16) | (uint32_t{h[o + 2]} << 8) |
           uint32_t{h[o + 3]};
  };
  uint32_t page_size = (uint32_t{h[16]} << 8) | h[17];
  if (page_size == 1) page_size = 65536;
  const uint32_t pages = be32(28);
  if (pages == 0 || be32(24) != be32(92)) return;
  const uintmax_t expected = uintmax_t{page_size} * pages;
  if (file_size < expected) {
    throw InputError(path + ": truncated trace file (" + std::to_string(file_size) +
                     " bytes, its header says " + std::to_string(expected) + ")");
  }
}

// Read-only connection without SQLite's per-call mutex: each connection is used by one thread at a
// time (TraceReader serialises its own calls; load_all's workers open their own).
sqlite3* open_readonly(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    // The operating system's reason (e.g. "Too many open files") where SQLite kept it.
    if (const int e = db ? sqlite3_system_errno(db) : 0; e != 0)
      msg += ": " + std::string(std::strerror(e));
    sqlite3_close(db);
    throw InputError(path + ": cannot open trace (" + msg + ")");
  }
  // A reader may meet a writer mid-checkpoint; wait instead of failing. Memory-mapped reads save
  // a copy per page on big scans.
  sqlite3_busy_timeout(db, 5000);
  sqlite3_exec(db, "PRAGMA mmap_size=4294967296", nullptr, nullptr, nullptr);
  sqlite3_exec(db, "PRAGMA cache_size=-32768", nullptr, nullptr, nullptr);
  return db;
}

struct DbCloser {
  sqlite3* db;
  ~DbCloser() { sqlite3_close(db); }
};

// A connection of its own for reading each block once: plain reads into a small page cache, not a
// mapping of the whole file (whose touched pages would count as this process's memory) nor the
// reader's 32 MiB cache.
sqlite3* open_streaming(const std::string& path) {
  sqlite3* db = open_readonly(path);
  sqlite3_exec(db, "PRAGMA mmap_size=0", nullptr, nullptr, nullptr);
  sqlite3_exec(db, "PRAGMA cache_size=-2048", nullptr, nullptr, nullptr);
  return db;
}

// Where the block index (read through the blocks_by_stream index) puts one span block's spans.
struct BlockPlace {
  size_t pos = 0, count = 0;
  int32_t rank = 0, stream = 0;
  bool listed = false;
};

// Decodes the blocks with ids in [id0, id1) into `out`, each at the place `where` gives
// (indexed by id - where_base), after checking its checksum (`checksums`: the file has them).
// Every block must be one the index listed, once, with the key and count the index said: the
// table and the index are separate b-trees, and a damaged file can make them disagree.
void load_block_range(const std::string& path, bool checksums, int64_t id0, int64_t id1,
                      int64_t expected_blocks, const std::vector<BlockPlace>& where,
                      int64_t where_base, std::vector<Span>& out) {
  sqlite3* db = open_readonly(path);
  DbCloser closer{db};
  const std::string sql = std::string("SELECT id, rank, stream, count, ") + crc_column(checksums) +
                          ", packed FROM blocks WHERE id>=?1 AND id<?2 ORDER BY id";
  Stmt st = rprep(db, path, sql.c_str());
  sqlite3_bind_int64(st.get(), 1, id0);
  sqlite3_bind_int64(st.get(), 2, id1);
  int64_t seen = 0;
  std::vector<char> decoded(static_cast<size_t>(std::max<int64_t>(id1 - id0, 0)), 0);
  while (rstep(db, path, st)) {
    const PackedRow r = packed_row(st.get());
    // A rowid range scan trusts the b-tree's order, so a damaged cell can bring an id outside
    // [id0, id1) or one already read.
    if (sqlite3_column_type(st.get(), 0) != SQLITE_INTEGER || r.id < id0 || r.id >= id1 ||
        !where[static_cast<size_t>(r.id - where_base)].listed) {
      corrupt_block(path, span_block_label(r), "its id is not one the block index lists");
    }
    if (decoded[static_cast<size_t>(r.id - id0)]++) {
      corrupt_block(path, span_block_label(r), "the table holds this id twice");
    }
    const BlockPlace& place = where[static_cast<size_t>(r.id - where_base)];
    const size_t pos = place.pos, count = place.count;
    std::string problem = row_problem(st.get(), r, checksums, kMinSpanBytes);
    if (problem.empty() && (r.key0 != place.rank || r.key1 != place.stream)) {
      problem = "the block index lists it under rank " + std::to_string(place.rank) + ", stream " +
                std::to_string(place.stream);
    }
    if (problem.empty() && static_cast<size_t>(r.count) != count) {
      problem = "count " + std::to_string(r.count) + ", the index said " + std::to_string(count);
    }
    if (problem.empty() &&
        !detail::decode_block(r.data, r.size, static_cast<int32_t>(r.key0),
                              static_cast<int32_t>(r.key1), count, out.data() + pos)) {
      problem = "its bytes do not decode";
    }
    if (!problem.empty()) corrupt_block(path, span_block_label(r), problem);
    ++seen;
  }
  if (seen != expected_blocks) {
    throw InputError(path + ": corrupt trace (" + std::to_string(expected_blocks - seen) +
                     " span blocks missing)");
  }
}

}  // namespace

TraceReader::TraceReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path + ": no such trace file");
  if (fs::is_directory(path, ec))
    throw InputError(path + ": is a directory, expected a trace file");
  const auto file_size = fs::file_size(path, ec);
  if (!ec && file_size == 0) throw InputError(path + ": empty file, not an Orrery trace");
  if (!ec) check_not_truncated(path, file_size);
  db_ = open_readonly(path);
  try {
    int version = 0;
    {
      auto st = rprep(db_, path_, "PRAGMA user_version");
      // The first read of the file: "file is not a database" surfaces here for non-SQLite input.
      if (sqlite3_step(st.get()) != SQLITE_ROW) {
        throw InputError(path + ": not an Orrery trace (" + sqlite3_errmsg(db_) + ")");
      }
      version = static_cast<int>(sqlite3_column_int64(st.get(), 0));
    }
    bool has_tables = false;
    {
      std::string sql = "SELECT count(*) FROM sqlite_master WHERE type='table' AND name IN (";
      const auto& tables = version == 2 ? kOrreryTablesV2 : kOrreryTables;
      for (const char* name : tables)
        sql += std::string(sql.back() == '(' ? "'" : ",'") + name + "'";
      sql += ")";
      auto st = rprep(db_, path_, sql.c_str());
      if (rstep(db_, path_, st)) {
        has_tables = sqlite3_column_int64(st.get(), 0) == static_cast<int64_t>(std::size(tables));
      }
    }
    if (version == 0 && !has_tables) {
      throw InputError(path + ": not an Orrery trace (no Orrery tables in this SQLite file)");
    }
    if (version < kOldestReadableVersion || version > kSchemaVersion) {
      throw InputError(path + ": schema version " + std::to_string(version) + ", expected " +
                       std::to_string(kSchemaVersion) + " (or " +
                       std::to_string(kOldestReadableVersion) + ", without block checksums)");
    }
    if (!has_tables) {
      throw InputError(path + ": not an Orrery trace (tables missing for schema version " +
                       std::to_string(version) + ")");
    }
    schema_version_ = version;
  } catch (...) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

TraceReader::~TraceReader() {
  if (db_) sqlite3_close(db_);
}

bool TraceReader::complete() const {
  std::lock_guard lock(mu_);
  auto st = rprep(db_, path_, "SELECT value FROM meta WHERE key='complete'");
  return rstep(db_, path_, st) && sqlite3_column_int64(st.get(), 0) == 1;
}

namespace {

// meta "lost_ranks": a JSON array of ranks.
std::vector<int32_t> lost_ranks_from_text(const std::string& path, const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text.empty() ? "[]" : text);
    return j.get<std::vector<int32_t>>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(path + ": corrupt trace (meta lost_ranks is not a JSON array of ranks: '" +
                     text.substr(0, 80) + "')");
  }
}

// Traces written before the typed keys kept these in extra_json: "kind": "commbench",
// "failed"/"lost_ranks"/"failure" (the launcher's mark), "micro_batches".
void meta_from_older_extra(RunMeta& m, bool seen_origin, bool seen_failed,
                           bool seen_micro_batches) {
  nlohmann::json extra;
  try {
    extra = nlohmann::json::parse(m.extra_json.empty() ? "{}" : m.extra_json);
  } catch (const nlohmann::json::exception&) {
    extra = nlohmann::json::object();
  }
  if (!extra.is_object()) extra = nlohmann::json::object();
  if (!seen_origin) {
    const bool bench = extra.value("kind", std::string()) == "commbench";
    m.origin = bench                             ? TraceOrigin::Commbench
               : m.source == TraceSource::Sim    ? TraceOrigin::Sim
               : m.source == TraceSource::Synth  ? TraceOrigin::Synth
               : m.source == TraceSource::Import ? TraceOrigin::Import
               : extra.contains("micro_batches") ? TraceOrigin::Run
                                                 : TraceOrigin::Unknown;
  }
  try {
    if (!seen_failed && extra.value("failed", false)) {
      m.failure.failed = true;
      m.failure.lost_ranks = extra.value("lost_ranks", std::vector<int32_t>{});
      m.failure.message = extra.value("failure", std::string());
    }
    if (!seen_micro_batches) m.layout.micro_batches = extra.value("micro_batches", 0);
  } catch (const nlohmann::json::exception&) {
    // An older trace's extra keys of another type: left unknown.
  }
}

}  // namespace

RunMeta TraceReader::meta() const {
  std::lock_guard lock(mu_);
  RunMeta m;
  bool seen_origin = false, seen_failed = false, seen_micro_batches = false;
  auto st = rprep(db_, path_, "SELECT key, value FROM meta");
  while (rstep(db_, path_, st)) {
    const std::string key = column_text(st.get(), 0);
    sqlite3_stmt* s = st.get();
    auto i32 = [&] { return static_cast<int32_t>(sqlite3_column_int64(s, 1)); };
    if (key == "source") {
      m.source = trace_source_from_string(column_text(s, 1)).value_or(TraceSource::Real);
    } else if (key == "scenario_text") {
      m.scenario_text = column_text(s, 1);
    } else if (key == "scenario_name") {
      m.scenario_name = column_text(s, 1);
    } else if (key == "host") {
      m.host = column_text(s, 1);
    } else if (key == "start_time_unix_ns") {
      m.start_time_unix_ns = sqlite3_column_int64(s, 1);
    } else if (key == "world_size") {
      m.world_size = i32();
    } else if (key == "dp") {
      m.dp = i32();
    } else if (key == "tp") {
      m.tp = i32();
    } else if (key == "pp") {
      m.pp = i32();
    } else if (key == "tokens_per_step") {
      m.tokens_per_step = sqlite3_column_int64(s, 1);
    } else if (key == "model_flops_per_step") {
      m.model_flops_per_step = sqlite3_column_double(s, 1);
    } else if (key == "peak_flops_per_rank") {
      m.peak_flops_per_rank = sqlite3_column_double(s, 1);
    } else if (key == "origin") {
      m.origin = trace_origin_from_string(column_text(s, 1)).value_or(TraceOrigin::Unknown);
      seen_origin = true;
    } else if (key == "zero") {
      m.layout.zero = i32();
    } else if (key == "micro_batches") {
      m.layout.micro_batches = i32();
      seen_micro_batches = true;
    } else if (key == "schedule") {
      m.layout.schedule = column_text(s, 1);
    } else if (key == "placement") {
      m.layout.placement = column_text(s, 1);
    } else if (key == "recompute") {
      m.layout.recompute = column_text(s, 1);
    } else if (key == "device") {
      m.layout.device = column_text(s, 1);
    } else if (key == "precision") {
      m.layout.precision = column_text(s, 1);
    } else if (key == "failed") {
      m.failure.failed = sqlite3_column_int64(s, 1) != 0;
      seen_failed = true;
    } else if (key == "lost_ranks") {
      m.failure.lost_ranks = lost_ranks_from_text(path_, column_text(s, 1));
    } else if (key == "failed_step") {
      m.failure.step = i32();
    } else if (key == "failure") {
      m.failure.message = column_text(s, 1);
    } else if (key == "extra_json") {
      m.extra_json = column_text(s, 1);
    }
  }
  if (!seen_origin || !seen_failed || !seen_micro_batches)
    meta_from_older_extra(m, seen_origin, seen_failed, seen_micro_batches);
  return m;
}

std::vector<RankInfo> TraceReader::ranks() const {
  std::lock_guard lock(mu_);
  std::vector<RankInfo> out;
  auto st = rprep(db_, path_, "SELECT rank, host, device, dp, tp, pp FROM ranks ORDER BY rank");
  while (rstep(db_, path_, st)) {
    RankInfo r;
    r.rank = static_cast<int32_t>(sqlite3_column_int64(st.get(), 0));
    r.host = column_text(st.get(), 1);
    r.device = column_text(st.get(), 2);
    r.dp = static_cast<int32_t>(sqlite3_column_int64(st.get(), 3));
    r.tp = static_cast<int32_t>(sqlite3_column_int64(st.get(), 4));
    r.pp = static_cast<int32_t>(sqlite3_column_int64(st.get(), 5));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<StreamInfo> TraceReader::streams() const {
  std::lock_guard lock(mu_);
  std::vector<StreamInfo> out;
  auto st = rprep(db_, path_, "SELECT rank, stream, name FROM streams ORDER BY rank, stream");
  while (rstep(db_, path_, st)) {
    StreamInfo s;
    s.rank = static_cast<int32_t>(sqlite3_column_int64(st.get(), 0));
    s.stream = static_cast<int32_t>(sqlite3_column_int64(st.get(), 1));
    s.name = column_text(st.get(), 2);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<CommunicatorInfo> TraceReader::communicators() const {
  std::lock_guard lock(mu_);
  std::vector<CommunicatorInfo> out;
  auto st = rprep(db_, path_, "SELECT id, kind, name, ranks FROM communicators ORDER BY id");
  while (rstep(db_, path_, st)) {
    CommunicatorInfo c;
    c.id = static_cast<int32_t>(sqlite3_column_int64(st.get(), 0));
    c.kind = comm_kind_from_string(column_text(st.get(), 1)).value_or(CommKind::Other);
    c.name = column_text(st.get(), 2);
    c.ranks = split_ranks(column_text(st.get(), 3));
    out.push_back(std::move(c));
  }
  return out;
}

StringTable TraceReader::strings() const {
  std::lock_guard lock(mu_);
  StringTable t;
  auto st = rprep(db_, path_, "SELECT id, text FROM strings ORDER BY id");
  while (rstep(db_, path_, st)) {
    const auto id = static_cast<NameId>(sqlite3_column_int64(st.get(), 0));
    if (id != t.size()) {
      throw InputError(path_ + ": corrupt string table (id " + std::to_string(id) + " where " +
                       std::to_string(t.size()) + " was expected)");
    }
    t.intern(column_text(st.get(), 1));
    if (t.size() != static_cast<size_t>(id) + 1) {
      throw InputError(path_ + ": corrupt string table (duplicate text at id " +
                       std::to_string(id) + ")");
    }
  }
  return t;
}

int64_t TraceReader::span_count() const {
  std::lock_guard lock(mu_);
  auto st = rprep(db_, path_, "SELECT COALESCE(SUM(count), 0) FROM blocks");
  return rstep(db_, path_, st) ? sqlite3_column_int64(st.get(), 0) : 0;
}

int64_t TraceReader::counter_count() const {
  // A scan of every counter block's row (no index holds the counts): on a connection of its own,
  // so that the pages it reads (most of each block, in 16 KiB pages) are not mapped into this
  // process.
  sqlite3* conn = open_streaming(path_);
  DbCloser closer{conn};
  auto st = rprep(conn, path_,
                  checksums() ? "SELECT COALESCE(SUM(count), 0) FROM counter_blocks"
                              : "SELECT count(*) FROM counters");
  return rstep(conn, path_, st) ? sqlite3_column_int64(st.get(), 0) : 0;
}

std::optional<TraceReader::TimeRange> TraceReader::time_range() const {
  std::lock_guard lock(mu_);
  auto st = rprep(db_, path_, "SELECT MIN(min_start_ns), MAX(max_end_ns) FROM blocks");
  if (!rstep(db_, path_, st) || sqlite3_column_type(st.get(), 0) == SQLITE_NULL) {
    return std::nullopt;
  }
  return TimeRange{sqlite3_column_int64(st.get(), 0), sqlite3_column_int64(st.get(), 1)};
}

std::vector<TraceReader::StreamBounds> TraceReader::stream_bounds() const {
  // max_dur_ns is read from every block's row, most of whose bytes share its page: on a
  // connection of its own, as counter_count().
  sqlite3* conn = open_streaming(path_);
  DbCloser closer{conn};
  std::vector<StreamBounds> out;
  auto st = rprep(conn, path_,
                  "SELECT rank, stream, SUM(count), MIN(min_start_ns), MAX(max_end_ns), "
                  "MAX(max_dur_ns) FROM blocks GROUP BY rank, stream ORDER BY rank, stream");
  while (rstep(conn, path_, st)) {
    StreamBounds b;
    b.rank = static_cast<int32_t>(sqlite3_column_int64(st.get(), 0));
    b.stream = static_cast<int32_t>(sqlite3_column_int64(st.get(), 1));
    b.count = sqlite3_column_int64(st.get(), 2);
    b.start_ns = sqlite3_column_int64(st.get(), 3);
    b.end_ns = sqlite3_column_int64(st.get(), 4);
    b.max_dur_ns = sqlite3_column_int64(st.get(), 5);
    out.push_back(b);
  }
  return out;
}

std::vector<Span> TraceReader::spans_in_window(int32_t rank, int32_t stream, int64_t t0,
                                               int64_t t1) const {
  std::lock_guard lock(mu_);
  std::vector<Span> out;
  if (t1 <= t0) return out;
  // The blocks of this stream whose [first start, last end] meets the window, found in the index
  // alone, in arrival order; then only their packed bytes are read.
  auto blocks = rprep(db_, path_,
                      "SELECT id, count FROM blocks WHERE rank=?1 AND stream=?2 AND "
                      "min_start_ns<?3 AND max_end_ns>=?4 ORDER BY id");
  sqlite3_bind_int64(blocks.get(), 1, rank);
  sqlite3_bind_int64(blocks.get(), 2, stream);
  sqlite3_bind_int64(blocks.get(), 3, t1);
  sqlite3_bind_int64(blocks.get(), 4, t0);
  std::vector<std::pair<int64_t, size_t>> ids;
  size_t upper = 0;
  while (rstep(db_, path_, blocks)) {
    const auto n = static_cast<size_t>(std::max<int64_t>(0, sqlite3_column_int64(blocks.get(), 1)));
    ids.emplace_back(sqlite3_column_int64(blocks.get(), 0), n);
    upper += n;
  }
  if (ids.empty()) return out;
  out.reserve(std::min<size_t>(upper, size_t{1} << 20));
  const std::string sql = std::string("SELECT id, rank, stream, count, ") +
                          crc_column(checksums()) + ", packed FROM blocks WHERE id=?1";
  auto data = rprep(db_, path_, sql.c_str());
  std::vector<Span> block;
  int runs = 0;
  for (const auto& [id, n] : ids) {
    sqlite3_bind_int64(data.get(), 1, id);
    if (!rstep(db_, path_, data)) continue;
    read_span_block(path_, data.get(), checksums(), block);
    sqlite3_reset(data.get());
    // The block is sorted by start: skip to the first span that can start inside the window's
    // reach, stop at the first that starts at or after t1.
    const size_t before = out.size();
    for (const Span& s : block) {
      if (s.start_ns >= t1) break;
      if (s.end_ns > t0 || s.start_ns >= t0) out.push_back(s);
    }
    runs += out.size() > before ? 1 : 0;
  }
  // Each block's run is sorted; blocks come in arrival order, so a stable sort by start keeps the
  // arrival order among equal starts.
  if (runs > 1) {
    std::stable_sort(out.begin(), out.end(),
                     [](const Span& a, const Span& b) { return a.start_ns < b.start_ns; });
  }
  return out;
}

std::vector<Span> TraceReader::collectives_of(int32_t comm) const {
  std::vector<Span> out;
  if (comm < 0) return out;
  {
    // Only the blocks whose communicator range holds `comm` are read and decoded; in a run that
    // keeps collectives on their own streams, that is those streams' blocks.
    std::lock_guard lock(mu_);
    const std::string sql = std::string("SELECT id, rank, stream, count, ") +
                            crc_column(checksums()) +
                            ", packed FROM blocks WHERE min_comm<=?1 AND max_comm>=?1 ORDER BY id";
    auto st = rprep(db_, path_, sql.c_str());
    sqlite3_bind_int64(st.get(), 1, comm);
    std::vector<Span> block;
    while (rstep(db_, path_, st)) {
      read_span_block(path_, st.get(), checksums(), block);
      for (const Span& s : block) {
        if (s.comm == comm) out.push_back(s);
      }
    }
  }
  // Blocks come in arrival order, so among equal (seq, rank, start) the arrival order stays.
  std::stable_sort(out.begin(), out.end(), [](const Span& a, const Span& b) {
    return std::tie(a.seq, a.rank, a.start_ns) < std::tie(b.seq, b.rank, b.start_ns);
  });
  return out;
}

std::vector<TraceReader::StepAggregate> TraceReader::step_aggregates() const {
  std::lock_guard lock(mu_);
  std::vector<StepAggregate> out;
  auto st = rprep(db_, path_,
                  "SELECT rank, step, start_ns, end_ns, compute_ns, collective_ns, span_count "
                  "FROM steps ORDER BY rank, step");
  while (rstep(db_, path_, st)) {
    StepAggregate a{};
    a.rank = static_cast<int32_t>(sqlite3_column_int64(st.get(), 0));
    a.step = static_cast<int32_t>(sqlite3_column_int64(st.get(), 1));
    a.start_ns = sqlite3_column_int64(st.get(), 2);
    a.end_ns = sqlite3_column_int64(st.get(), 3);
    a.compute_ns = sqlite3_column_int64(st.get(), 4);
    a.collective_ns = sqlite3_column_int64(st.get(), 5);
    a.span_count = sqlite3_column_int64(st.get(), 6);
    out.push_back(a);
  }
  return out;
}

std::vector<CounterSample> TraceReader::counters() const { return counters(nullptr); }

std::vector<CounterSample> TraceReader::counters(const std::function<bool(NameId)>& keep) const {
  return counters_where(keep, std::nullopt);
}

std::vector<CounterSample> TraceReader::counters_of_rank(int32_t rank) const {
  return counters_where(nullptr, rank);
}

std::vector<CounterSample> TraceReader::counters_where(const std::function<bool(NameId)>& keep,
                                                       std::optional<int32_t> rank) const {
  std::unique_lock lock(mu_);
  // Filtered, the rows left out are still scanned (no index by name or rank): on a connection of
  // its own, so that their pages are not mapped into this process.
  sqlite3* const own = keep || rank ? open_streaming(path_) : nullptr;
  DbCloser closer{own};
  if (own) lock.unlock();
  sqlite3* const conn = own ? own : db_;
  std::vector<CounterSample> out;
  const auto kept = [&keep](int64_t name) {
    return !keep || (name >= 0 && name <= UINT32_MAX && keep(static_cast<NameId>(name)));
  };
  if (checksums()) {
    // Blocks in arrival order, each in time order: a stable sort keeps arrival order among ties.
    auto st = rprep(conn, path_,
                    "SELECT id, rank, name, count, crc32c, packed FROM counter_blocks ORDER BY id");
    std::vector<CounterSample> block;
    while (rstep(conn, path_, st)) {
      if (!kept(sqlite3_column_int64(st.get(), 2))) continue;
      if (rank && sqlite3_column_int64(st.get(), 1) != *rank) continue;
      read_counter_block(path_, st.get(), true, block);
      out.insert(out.end(), block.begin(), block.end());
    }
    std::stable_sort(out.begin(), out.end(), [](const CounterSample& a, const CounterSample& b) {
      return std::tie(a.rank, a.name, a.ts_ns) < std::tie(b.rank, b.name, b.ts_ns);
    });
    return out;
  }
  auto st = rprep(conn, path_,
                  "SELECT rank, name, ts_ns, value FROM counters ORDER BY rank, name, ts_ns");
  while (rstep(conn, path_, st)) {
    CounterSample c;
    c.rank = static_cast<int32_t>(sqlite3_column_int64(st.get(), 0));
    c.name = static_cast<NameId>(sqlite3_column_int64(st.get(), 1));
    c.ts_ns = sqlite3_column_int64(st.get(), 2);
    c.value = sqlite3_column_double(st.get(), 3);
    if (kept(c.name) && (!rank || c.rank == *rank)) out.push_back(c);
  }
  return out;
}

Trace TraceReader::load_all() const { return load_all(0); }

namespace {

// Every packed span takes at least 6 bytes: a block index counting more spans than the file (and
// its write-ahead log) can hold is damaged, which is reported, not allocated.
void check_span_total(const std::string& path, size_t total) {
  std::error_code ec;
  uintmax_t bytes = fs::file_size(path, ec);
  if (ec) bytes = 0;
  const uintmax_t wal = fs::file_size(path + "-wal", ec);
  if (!ec) bytes += wal;
  if (bytes > 0 && total > bytes / 6) {
    throw InputError(path + ": corrupt trace (its block index counts " + std::to_string(total) +
                     " spans, more than the file can hold)");
  }
}

// Span and counter names index the string table.
void check_name_ids(const Trace& t, const std::string& path) {
  const auto n_strings = static_cast<NameId>(t.strings.size());
  for (const auto& s : t.spans) {
    if (s.name >= n_strings) {
      throw InputError(path + ": corrupt trace (span name id " + std::to_string(s.name) +
                       " outside the string table of " + std::to_string(n_strings) + ")");
    }
  }
  for (const auto& c : t.counters) {
    if (c.name >= n_strings) {
      throw InputError(path + ": corrupt trace (counter name id " + std::to_string(c.name) +
                       " outside the string table of " + std::to_string(n_strings) + ")");
    }
  }
}

}  // namespace

Trace TraceReader::load_all(unsigned threads) const {
  Trace t;
  t.path = path_;
  t.meta = meta();
  t.ranks = ranks();
  t.streams = streams();
  t.comms = communicators();
  t.counters = counters();

  // The block index says how many spans each stream has and in which blocks, so every span's
  // final index is known before reading: workers decode disjoint id ranges of blocks straight to
  // their places. Blocks are immutable once committed, so a file still being written reads
  // consistently up to the last block listed here.
  struct BlockRow {
    int64_t id;
    StreamKey key;
    size_t count;
  };
  std::vector<BlockRow> rows;
  {
    std::lock_guard lock(mu_);
    auto st = rprep(db_, path_, "SELECT id, rank, stream, count FROM blocks");
    while (rstep(db_, path_, st)) {
      const auto n = sqlite3_column_int64(st.get(), 3);
      if (n < 0) throw InputError(path_ + ": corrupt trace (negative block count)");
      if (sqlite3_column_type(st.get(), 0) != SQLITE_INTEGER) {
        throw InputError(path_ + ": corrupt trace (a span block's id is not an integer)");
      }
      rows.push_back({sqlite3_column_int64(st.get(), 0),
                      {static_cast<int32_t>(sqlite3_column_int64(st.get(), 1)),
                       static_cast<int32_t>(sqlite3_column_int64(st.get(), 2))},
                      static_cast<size_t>(n)});
    }
  }
  std::sort(rows.begin(), rows.end(),
            [](const BlockRow& a, const BlockRow& b) { return a.id < b.id; });
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i].id == rows[i - 1].id) {
      throw InputError(path_ + ": corrupt trace (span block id " + std::to_string(rows[i].id) +
                       " listed twice)");
    }
  }
  std::map<StreamKey, size_t> stream_begin, stream_end;
  size_t total = 0;
  for (const auto& r : rows) stream_end[r.key] += r.count;
  for (auto& [key, n] : stream_end) {
    stream_begin[key] = total;
    total += n;
    n = total;
  }
  // Where each block's spans go: streams in (rank, stream) order, blocks of a stream by id.
  const int64_t base = rows.empty() ? 0 : rows.front().id;
  // Unsigned: ids at both ends of the int64 range must not overflow the difference.
  const uint64_t id_span =
      rows.empty() ? 0 : static_cast<uint64_t>(rows.back().id) - static_cast<uint64_t>(base) + 1;
  if (id_span > static_cast<uint64_t>(rows.size()) * 4 + 1024 ||
      (!rows.empty() && rows.back().id == std::numeric_limits<int64_t>::max())) {
    throw InputError(path_ + ": corrupt trace (block ids far from contiguous)");
  }
  std::vector<BlockPlace> where(static_cast<size_t>(id_span));
  {
    std::map<StreamKey, size_t> cursor = stream_begin;
    for (const auto& r : rows) {
      where[static_cast<size_t>(r.id - base)] = {cursor[r.key], r.count, r.key.first, r.key.second,
                                                 true};
      cursor[r.key] += r.count;
    }
  }
  check_span_total(path_, total);
  t.spans.resize(total);

  if (threads == 0) threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  // Small traces are not worth the extra connections.
  threads = static_cast<unsigned>(std::min<size_t>(threads, total / 200000 + 1));
  struct Range {
    int64_t id0, id1, blocks;
  };
  std::vector<Range> ranges;  // [id0, id1) with about equal span counts
  {
    const size_t per = total / threads + 1;
    size_t in_range = 0;
    int64_t id0 = base, blocks = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      in_range += rows[i].count;
      ++blocks;
      if (in_range >= per || i + 1 == rows.size()) {
        ranges.push_back({id0, rows[i].id + 1, blocks});
        id0 = rows[i].id + 1;
        in_range = 0;
        blocks = 0;
      }
    }
  }
  std::vector<std::exception_ptr> errors(ranges.size());
  auto work = [&](size_t i) {
    try {
      load_block_range(path_, checksums(), ranges[i].id0, ranges[i].id1, ranges[i].blocks, where,
                       base, t.spans);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  if (ranges.size() <= 1) {
    for (size_t i = 0; i < ranges.size(); ++i) work(i);
  } else {
    std::vector<std::thread> pool;
    for (size_t i = 0; i < ranges.size(); ++i) pool.emplace_back(work, i);
    for (auto& th : pool) th.join();
  }
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }

  // A stream whose spans arrived out of start order across chunks (a long range recorded when it
  // ended) is put in order here; ties keep arrival order.
  for (const auto& [key, begin] : stream_begin) {
    auto first = t.spans.begin() + static_cast<std::ptrdiff_t>(begin);
    auto last = t.spans.begin() + static_cast<std::ptrdiff_t>(stream_end[key]);
    auto by_start = [](const Span& a, const Span& b) { return a.start_ns < b.start_ns; };
    if (!std::is_sorted(first, last, by_start)) std::stable_sort(first, last, by_start);
  }

  // Strings last: a live file's newest spans may refer to strings committed with them.
  t.strings = strings();
  check_name_ids(t, path_);
  return t;
}

Trace load_trace(const std::string& path) { return TraceReader(path).load_all(); }

// ---------------------------------------------------------------------------------------------
// Streaming

namespace {

// One row of the block index, as the streaming reader visits them.
struct IndexedBlock {
  int64_t id = 0;
  int32_t rank = 0, stream = 0;
  size_t count = 0;
  int64_t min_start_ns = 0;  // INT64_MIN when the index does not say
};

// The block index in visiting order: streams by (rank, stream), a stream's blocks by id (arrival
// order), with load_all()'s checks on the index itself.
std::vector<IndexedBlock> indexed_blocks(sqlite3* db, const std::string& path) {
  std::vector<IndexedBlock> rows;
  Stmt st = rprep(db, path, "SELECT id, rank, stream, count, min_start_ns FROM blocks");
  size_t total = 0;
  while (rstep(db, path, st)) {
    const auto n = sqlite3_column_int64(st.get(), 3);
    if (n < 0) throw InputError(path + ": corrupt trace (negative block count)");
    if (sqlite3_column_type(st.get(), 0) != SQLITE_INTEGER) {
      throw InputError(path + ": corrupt trace (a span block's id is not an integer)");
    }
    IndexedBlock b;
    b.id = sqlite3_column_int64(st.get(), 0);
    b.rank = static_cast<int32_t>(sqlite3_column_int64(st.get(), 1));
    b.stream = static_cast<int32_t>(sqlite3_column_int64(st.get(), 2));
    b.count = static_cast<size_t>(n);
    b.min_start_ns = sqlite3_column_type(st.get(), 4) == SQLITE_INTEGER
                         ? sqlite3_column_int64(st.get(), 4)
                         : std::numeric_limits<int64_t>::min();
    total += b.count;
    rows.push_back(b);
  }
  check_span_total(path, total);
  std::sort(rows.begin(), rows.end(), [](const IndexedBlock& a, const IndexedBlock& b) {
    return std::tie(a.rank, a.stream, a.id) < std::tie(b.rank, b.stream, b.id);
  });
  std::vector<int64_t> ids(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) ids[i] = rows[i].id;
  std::sort(ids.begin(), ids.end());
  for (size_t i = 1; i < ids.size(); ++i) {
    if (ids[i] == ids[i - 1]) {
      throw InputError(path + ": corrupt trace (span block id " + std::to_string(ids[i]) +
                       " listed twice)");
    }
  }
  return rows;
}

// Reads, checks and decodes one listed block into `out`: its checksum, its key and count against
// the index, its bytes, its name ids, and that no span starts before the index's first start (the
// streaming order relies on it).
void read_indexed_block(sqlite3* db, const std::string& path, bool checksums, Stmt& st,
                        const IndexedBlock& b, NameId n_strings, std::vector<Span>& out) {
  sqlite3_reset(st.get());
  sqlite3_bind_int64(st.get(), 1, b.id);
  if (!rstep(db, path, st)) {
    throw InputError(path + ": corrupt trace (span block " + std::to_string(b.id) + " (rank " +
                     std::to_string(b.rank) + ", stream " + std::to_string(b.stream) +
                     ") is listed by the block index but missing)");
  }
  const PackedRow r = packed_row(st.get());
  std::string problem = row_problem(st.get(), r, checksums, kMinSpanBytes);
  if (problem.empty() && (r.key0 != b.rank || r.key1 != b.stream)) {
    problem = "the block index lists it under rank " + std::to_string(b.rank) + ", stream " +
              std::to_string(b.stream);
  }
  if (problem.empty() && static_cast<size_t>(r.count) != b.count) {
    problem = "count " + std::to_string(r.count) + ", the index said " + std::to_string(b.count);
  }
  if (problem.empty()) {
    out.resize(b.count);
    if (!detail::decode_block(r.data, r.size, b.rank, b.stream, out.size(), out.data()))
      problem = "its bytes do not decode";
  }
  for (size_t i = 0; problem.empty() && i < out.size(); ++i) {
    if (out[i].start_ns < b.min_start_ns) {
      problem = "a span starts at " + std::to_string(out[i].start_ns) +
                " ns, before the block index's first start " + std::to_string(b.min_start_ns);
    } else if (out[i].name >= n_strings) {
      problem = "span name id " + std::to_string(out[i].name) + " outside the string table of " +
                std::to_string(n_strings);
    }
  }
  if (!problem.empty()) corrupt_block(path, span_block_label(r), problem);
}

// Appends a block to a stream's pending spans, keeping them sorted by start with equal starts in
// arrival order (the order load_all() gives).
void append_in_order(std::vector<Span>& pending, const std::vector<Span>& block) {
  const auto by_start = [](const Span& a, const Span& b) { return a.start_ns < b.start_ns; };
  const size_t mid = pending.size();
  const bool sorted = std::is_sorted(block.begin(), block.end(), by_start);
  pending.insert(pending.end(), block.begin(), block.end());
  if (sorted && (mid == 0 || block.empty() || pending[mid - 1].start_ns <= block.front().start_ns))
    return;
  if (sorted) {
    std::inplace_merge(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(mid),
                       pending.end(), by_start);
  } else {
    std::stable_sort(pending.begin(), pending.end(), by_start);
  }
}

}  // namespace

Trace TraceReader::load_header() const { return load_header(CounterFilter()); }

Trace TraceReader::load_header(const CounterFilter& keep) const {
  Trace t;
  t.path = path_;
  t.meta = meta();
  t.ranks = ranks();
  t.streams = streams();
  t.comms = communicators();
  if (keep) {
    // The names of a live file's newest samples are committed with them: strings read after.
    const StringTable names = strings();
    t.counters = counters([&](NameId n) { return n >= names.size() || keep(names.str(n)); });
  } else {
    t.counters = counters();
  }
  t.strings = strings();
  const auto n_strings = static_cast<NameId>(t.strings.size());
  for (const auto& c : t.counters) {
    if (c.name >= n_strings) {
      throw InputError(path_ + ": corrupt trace (counter name id " + std::to_string(c.name) +
                       " outside the string table of " + std::to_string(n_strings) + ")");
    }
  }
  return t;
}

void TraceReader::for_each_span_run(const SpanRunVisitor& visit) const {
  const auto n_strings = static_cast<NameId>(strings().size());
  sqlite3* db = open_streaming(path_);  // each block is read once
  DbCloser closer{db};
  const std::vector<IndexedBlock> rows = indexed_blocks(db, path_);
  const std::string sql = std::string("SELECT id, rank, stream, count, ") +
                          crc_column(checksums()) + ", packed FROM blocks WHERE id=?1";
  Stmt st = rprep(db, path_, sql.c_str());
  std::vector<Span> block, pending;
  std::vector<int64_t> later;  // later[k]: earliest first start of the stream's blocks from k on
  for (size_t i = 0; i < rows.size();) {
    size_t j = i;
    while (j < rows.size() && rows[j].rank == rows[i].rank && rows[j].stream == rows[i].stream) ++j;
    later.assign(j - i + 1, std::numeric_limits<int64_t>::max());
    for (size_t k = j; k-- > i;) later[k - i] = std::min(later[k - i + 1], rows[k].min_start_ns);
    pending.clear();
    for (size_t k = i; k < j; ++k) {
      read_indexed_block(db, path_, checksums(), st, rows[k], n_strings, block);
      append_in_order(pending, block);
      // Spans starting at or before every later block's first start are final: a later span
      // with an equal start comes after them (arrival order).
      const int64_t bound = later[k - i + 1];
      const auto cut = std::upper_bound(pending.begin(), pending.end(), bound,
                                        [](int64_t t, const Span& s) { return t < s.start_ns; });
      const auto n = static_cast<size_t>(cut - pending.begin());
      if (n > 0) visit(std::span<const Span>(pending.data(), n));
      pending.erase(pending.begin(), cut);
    }
    i = j;
  }
}

struct TraceReader::BlockCursor::Impl {
  const TraceReader& reader;
  sqlite3* db = nullptr;
  Stmt st;
  std::vector<IndexedBlock> rows;    // by (first start, id)
  std::vector<size_t> last_of_rank;  // per row: whether it is its rank's last (1) or not (0)
  NameId n_strings = 0;
  size_t next = 0;
  std::vector<Span> block;
  SpanBlockView view;
  explicit Impl(const TraceReader& r) : reader(r) {}
  ~Impl() { sqlite3_close(db); }
};

TraceReader::BlockCursor::BlockCursor(const TraceReader& reader)
    : impl_(std::make_unique<Impl>(reader)) {
  Impl& m = *impl_;
  m.n_strings = static_cast<NameId>(reader.strings().size());
  m.db = open_streaming(reader.path_);
  m.rows = indexed_blocks(m.db, reader.path_);
  std::sort(m.rows.begin(), m.rows.end(), [](const IndexedBlock& a, const IndexedBlock& b) {
    return std::tie(a.min_start_ns, a.id) < std::tie(b.min_start_ns, b.id);
  });
  const std::string sql = std::string("SELECT id, rank, stream, count, ") +
                          crc_column(reader.checksums()) + ", packed FROM blocks WHERE id=?1";
  m.st = rprep(m.db, reader.path_, sql.c_str());
  std::map<int32_t, size_t> last;  // position of each rank's last block
  for (size_t i = 0; i < m.rows.size(); ++i) last[m.rows[i].rank] = i;
  m.last_of_rank.assign(m.rows.size(), 0);
  for (const auto& [rank, i] : last) m.last_of_rank[i] = 1;
}

TraceReader::BlockCursor::~BlockCursor() = default;

const TraceReader::SpanBlockView* TraceReader::BlockCursor::next() {
  Impl& m = *impl_;
  if (m.next >= m.rows.size()) return nullptr;
  const IndexedBlock& b = m.rows[m.next];
  read_indexed_block(m.db, m.reader.path_, m.reader.checksums(), m.st, b, m.n_strings, m.block);
  m.view = {b.rank, b.stream, b.id, m.last_of_rank[m.next] == 1,
            std::span<const Span>(m.block.data(), m.block.size())};
  ++m.next;
  return &m.view;
}

int64_t TraceReader::BlockCursor::next_start_ns() const {
  const Impl& m = *impl_;
  return m.next < m.rows.size() ? m.rows[m.next].min_start_ns : std::numeric_limits<int64_t>::max();
}

void TraceReader::for_each_block_by_time(const SpanBlockVisitor& visit) const {
  BlockCursor cursor(*this);
  while (const SpanBlockView* v = cursor.next()) visit(*v);
}

namespace {

// One counter name's samples of a rank, pulled in counters()'s order: its blocks by id, each block
// merged into the pending samples by time (ties in arrival order); samples at or before every
// later block's first time are final.
struct CounterSeries {
  struct Block {
    int64_t id, min_ts_ns;
  };
  std::vector<Block> blocks;   // by id
  std::vector<int64_t> later;  // later[k]: earliest first time of blocks[k..]
  size_t next_block = 0, pos = 0, final_end = 0;
  std::vector<CounterSample> pending;

  void prepare() {
    later.assign(blocks.size() + 1, std::numeric_limits<int64_t>::max());
    for (size_t k = blocks.size(); k-- > 0;) later[k] = std::min(later[k + 1], blocks[k].min_ts_ns);
  }
  // The next sample, or nullptr when the series is done; `read` decodes a block by id.
  template <typename Read>
  const CounterSample* head(Read&& read, std::vector<CounterSample>& block) {
    while (pos == final_end && next_block < blocks.size()) {
      pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(pos));
      pos = 0;
      read(blocks[next_block], block);
      const size_t mid = pending.size();
      pending.insert(pending.end(), block.begin(), block.end());
      const auto by_ts = [](const CounterSample& a, const CounterSample& b) {
        return a.ts_ns < b.ts_ns;
      };
      if (!std::is_sorted(block.begin(), block.end(), by_ts)) {
        std::stable_sort(pending.begin(), pending.end(), by_ts);
      } else if (mid > 0 && !block.empty() && pending[mid - 1].ts_ns > block.front().ts_ns) {
        std::inplace_merge(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(mid),
                           pending.end(), by_ts);
      }
      const int64_t bound = later[++next_block];
      final_end = static_cast<size_t>(
          std::upper_bound(pending.begin(), pending.end(), bound,
                           [](int64_t t, const CounterSample& c) { return t < c.ts_ns; }) -
          pending.begin());
    }
    return pos < final_end ? &pending[pos] : nullptr;
  }
};

}  // namespace

void TraceReader::for_each_counter_run(const CounterFilter& keep,
                                       const CounterRunVisitor& visit) const {
  const StringTable names = strings();
  const auto n_strings = static_cast<NameId>(names.size());
  const auto name_problem = [&](int64_t name) {
    return InputError(path_ + ": corrupt trace (counter name id " + std::to_string(name) +
                      " outside the string table of " + std::to_string(n_strings) + ")");
  };
  std::vector<CounterSample> run;
  const auto flush = [&] {
    if (!run.empty()) visit(std::span<const CounterSample>(run.data(), run.size()));
    run.clear();
  };
  if (!checksums()) {  // samples in a table: read whole, stably sorted by (rank, time)
    std::vector<CounterSample> all = counters();
    for (const auto& c : all) {
      if (c.name >= n_strings) throw name_problem(c.name);
    }
    std::erase_if(all, [&](const CounterSample& c) { return !keep(names.str(c.name)); });
    std::stable_sort(all.begin(), all.end(), [](const CounterSample& a, const CounterSample& b) {
      return std::tie(a.rank, a.ts_ns) < std::tie(b.rank, b.ts_ns);
    });
    for (size_t i = 0; i < all.size(); ++i) {
      if (i > 0 && all[i].rank != all[i - 1].rank) flush();
      run.push_back(all[i]);
    }
    flush();
    return;
  }
  sqlite3* db = open_streaming(path_);
  DbCloser closer{db};
  // (rank, name) -> its blocks by id
  std::map<std::pair<int32_t, NameId>, CounterSeries> series;
  {
    Stmt st = rprep(db, path_, "SELECT id, rank, name, min_ts_ns FROM counter_blocks ORDER BY id");
    while (rstep(db, path_, st)) {
      const int64_t name = sqlite3_column_int64(st.get(), 2);
      if (name < 0 || name >= n_strings) throw name_problem(name);
      if (!keep(names.str(static_cast<NameId>(name)))) continue;
      const int64_t min_ts = sqlite3_column_type(st.get(), 3) == SQLITE_INTEGER
                                 ? sqlite3_column_int64(st.get(), 3)
                                 : std::numeric_limits<int64_t>::min();
      series[{static_cast<int32_t>(sqlite3_column_int64(st.get(), 1)), static_cast<NameId>(name)}]
          .blocks.push_back({sqlite3_column_int64(st.get(), 0), min_ts});
    }
  }
  Stmt st = rprep(db, path_,
                  "SELECT id, rank, name, count, crc32c, packed FROM counter_blocks WHERE id=?1");
  const auto read = [&](const CounterSeries::Block& b, std::vector<CounterSample>& out) {
    sqlite3_reset(st.get());
    sqlite3_bind_int64(st.get(), 1, b.id);
    if (!rstep(db, path_, st)) {
      throw InputError(path_ + ": corrupt trace (counter block " + std::to_string(b.id) +
                       " vanished while read)");
    }
    read_counter_block(path_, st.get(), true, out);
    for (const CounterSample& c : out) {
      if (c.ts_ns < b.min_ts_ns) {
        corrupt_block(path_, counter_block_label(packed_row(st.get())),
                      "a sample at " + std::to_string(c.ts_ns) +
                          " ns, before the block index's first time " +
                          std::to_string(b.min_ts_ns));
      }
    }
  };
  std::vector<CounterSample> block;
  for (auto it = series.begin(); it != series.end();) {
    std::vector<CounterSeries*> rank_series;  // the rank's, by name id
    const int32_t rank = it->first.first;
    for (; it != series.end() && it->first.first == rank; ++it) {
      it->second.prepare();
      rank_series.push_back(&it->second);
    }
    for (;;) {  // the earliest head; ties to the lowest name id
      CounterSeries* best = nullptr;
      const CounterSample* best_c = nullptr;
      for (CounterSeries* sr : rank_series) {
        const CounterSample* c = sr->head(read, block);
        if (c && (!best_c || c->ts_ns < best_c->ts_ns)) {
          best = sr;
          best_c = c;
        }
      }
      if (!best) break;
      run.push_back(*best_c);
      ++best->pos;
      if (run.size() == 4096) flush();
    }
    flush();
    for (CounterSeries* sr : rank_series) *sr = CounterSeries{};
  }
}

std::vector<int32_t> TraceReader::span_ranks() const {
  std::lock_guard lock(mu_);
  std::vector<int32_t> out;
  auto st = rprep(db_, path_, "SELECT DISTINCT rank FROM blocks ORDER BY rank");  // the index's
  while (rstep(db_, path_, st))
    out.push_back(static_cast<int32_t>(sqlite3_column_int64(st.get(), 0)));
  return out;
}

std::optional<int32_t> TraceReader::first_counter_rank() const {
  sqlite3* conn = open_streaming(path_);  // a scan: its pages are not to stay mapped
  DbCloser closer{conn};
  auto st = rprep(
      conn, path_,
      checksums() ? "SELECT MIN(rank) FROM counter_blocks" : "SELECT MIN(rank) FROM counters");
  if (!rstep(conn, path_, st) || sqlite3_column_type(st.get(), 0) != SQLITE_INTEGER)
    return std::nullopt;
  return static_cast<int32_t>(sqlite3_column_int64(st.get(), 0));
}

// ---------------------------------------------------------------------------------------------
// Verification

namespace {

// "" if the integer column `col` of the current row is `want` (NULL when `want` is nullopt),
// otherwise what it holds instead.
std::string column_mismatch(sqlite3_stmt* st, int col, const char* name,
                            std::optional<int64_t> want) {
  const bool null = sqlite3_column_type(st, col) == SQLITE_NULL;
  const bool integer = sqlite3_column_type(st, col) == SQLITE_INTEGER;
  if (!want && null) return {};
  if (want && integer && sqlite3_column_int64(st, col) == *want) return {};
  const std::string have = null      ? std::string("NULL")
                           : integer ? std::to_string(sqlite3_column_int64(st, col))
                                     : column_text(st, col);
  return std::string("its index column ") + name + " is " + have + ", its contents say " +
         (want ? std::to_string(*want) : std::string("NULL"));
}

// The index columns of a decoded span block (columns 6..10 of the verify query: min_start_ns,
// max_end_ns, max_dur_ns, min_comm, max_comm) against its spans, as the writer computes them, and
// the spans' start order; "" if all agree.
std::string span_index_problem(sqlite3_stmt* st, const std::vector<Span>& spans) {
  if (spans.empty()) return "it holds no spans";
  int64_t max_end = std::numeric_limits<int64_t>::min(), max_dur = 0;
  int32_t min_comm = std::numeric_limits<int32_t>::max(), max_comm = -1;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (i > 0 && s.start_ns < spans[i - 1].start_ns) {
      return "its spans are out of start order at span " + std::to_string(i);
    }
    max_end = std::max(max_end, std::max(s.end_ns, s.start_ns));
    max_dur = std::max(max_dur, s.end_ns - s.start_ns);
    if (s.comm >= 0) {
      min_comm = std::min(min_comm, s.comm);
      max_comm = std::max(max_comm, s.comm);
    }
  }
  const bool comms = max_comm >= 0;
  for (std::string p :
       {column_mismatch(st, 6, "min_start_ns", spans.front().start_ns),
        column_mismatch(st, 7, "max_end_ns", max_end),
        column_mismatch(st, 8, "max_dur_ns", max_dur),
        column_mismatch(st, 9, "min_comm", comms ? std::optional<int64_t>(min_comm) : std::nullopt),
        column_mismatch(st, 10, "max_comm",
                        comms ? std::optional<int64_t>(max_comm) : std::nullopt)}) {
    if (!p.empty()) return p;
  }
  return {};
}

// The same for a counter block (columns 6, 7: min_ts_ns, max_ts_ns).
std::string counter_index_problem(sqlite3_stmt* st, const std::vector<CounterSample>& samples) {
  if (samples.empty()) return "it holds no samples";
  for (size_t i = 1; i < samples.size(); ++i) {
    if (samples[i].ts_ns < samples[i - 1].ts_ns) {
      return "its samples are out of time order at sample " + std::to_string(i);
    }
  }
  std::string p = column_mismatch(st, 6, "min_ts_ns", samples.front().ts_ns);
  return p.empty() ? column_mismatch(st, 7, "max_ts_ns", samples.back().ts_ns) : p;
}

}  // namespace

TraceReader::Verification TraceReader::verify() const {
  std::lock_guard lock(mu_);
  Verification v;
  v.checksums = checksums();
  {
    const std::string sql = std::string("SELECT id, rank, stream, count, ") +
                            crc_column(v.checksums) +
                            ", packed, min_start_ns, max_end_ns, max_dur_ns, min_comm, max_comm "
                            "FROM blocks ORDER BY id";
    auto st = rprep(db_, path_, sql.c_str());
    std::vector<Span> spans;
    while (rstep(db_, path_, st)) {
      ++v.span_blocks;
      std::string problem = span_block_problem(st.get(), v.checksums, spans);
      if (problem.empty()) problem = span_index_problem(st.get(), spans);
      if (problem.empty()) {
        v.spans += static_cast<int64_t>(spans.size());
      } else {
        v.damaged.push_back(span_block_label(packed_row(st.get())) + ": " + problem);
      }
    }
  }
  if (!v.checksums) {
    // Schema 2: one row per sample, nothing to check beyond what SQLite checks.
    auto st = rprep(db_, path_, "SELECT count(*) FROM counters");
    if (rstep(db_, path_, st)) v.counter_samples = sqlite3_column_int64(st.get(), 0);
    return v;
  }
  auto st = rprep(db_, path_,
                  "SELECT id, rank, name, count, crc32c, packed, min_ts_ns, max_ts_ns "
                  "FROM counter_blocks ORDER BY id");
  std::vector<CounterSample> samples;
  while (rstep(db_, path_, st)) {
    ++v.counter_blocks;
    std::string problem = counter_block_problem(st.get(), true, samples);
    if (problem.empty()) problem = counter_index_problem(st.get(), samples);
    if (problem.empty()) {
      v.counter_samples += static_cast<int64_t>(samples.size());
    } else {
      v.damaged.push_back(counter_block_label(packed_row(st.get())) + ": " + problem);
    }
  }
  return v;
}

void reseal_block_checksums(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr);
  DbCloser closer{db};
  auto fail = [&](const std::string& what) {
    throw InputError(path + ": cannot reseal checksums: " + what + " (" +
                     (db ? sqlite3_errmsg(db) : sqlite3_errstr(rc)) + ")");
  };
  if (rc != SQLITE_OK) fail("open");
  sqlite3_busy_timeout(db, 5000);
  {
    sqlite3_stmt* raw = nullptr;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &raw, nullptr) != SQLITE_OK) {
      fail("read the schema version");
    }
    Stmt st(raw);
    if (sqlite3_step(raw) != SQLITE_ROW || sqlite3_column_int64(raw, 0) != 3) {
      throw InputError(path + ": cannot reseal checksums: not a schema 3 trace");
    }
  }
  if (sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr) != SQLITE_OK) fail("begin");
  for (const char* table : {"blocks", "counter_blocks"}) {
    const bool spans = std::string(table) == "blocks";
    const std::string select = std::string("SELECT id, rank, ") + (spans ? "stream" : "name") +
                               ", count, NULL, packed FROM " + table;
    const std::string update = std::string("UPDATE ") + table + " SET crc32c=?1 WHERE id=?2";
    std::vector<std::pair<int64_t, uint32_t>> crcs;
    sqlite3_stmt* raw = nullptr;
    if (sqlite3_prepare_v2(db, select.c_str(), -1, &raw, nullptr) != SQLITE_OK) fail(select);
    Stmt sel(raw);
    int step = 0;
    while ((step = sqlite3_step(raw)) == SQLITE_ROW) {
      const PackedRow r = packed_row(raw);
      crcs.emplace_back(r.id, detail::block_crc(r.key0, r.key1, r.count, r.data, r.size));
    }
    if (step != SQLITE_DONE) fail(select);
    if (sqlite3_prepare_v2(db, update.c_str(), -1, &raw, nullptr) != SQLITE_OK) fail(update);
    Stmt upd(raw);
    for (const auto& [id, crc] : crcs) {
      sqlite3_bind_int64(raw, 1, crc);
      sqlite3_bind_int64(raw, 2, id);
      if (sqlite3_step(raw) != SQLITE_DONE) fail(update);
      sqlite3_reset(raw);
    }
  }
  if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) fail("commit");
}

// ---------------------------------------------------------------------------------------------
// Merge and SQL export

namespace {

// A URI filename for `path` (SQLite's rules: '?', '#' and '%' escaped), with `query` appended.
std::string sqlite_uri(const std::string& path, const std::string& query) {
  std::string uri = "file:";
  for (const char c : path) {
    if (c == '?' || c == '#' || c == '%') {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
      uri += buf;
    } else {
      uri += c;
    }
  }
  return uri + "?" + query;
}

std::string quoted_name(const std::string& name) {
  std::string q = "\"";
  for (const char c : name) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

bool is_store_table(const std::string& name) {
  if (name == "spans" || name == "counters" || name.rfind("sqlite_", 0) == 0) return true;
  // The zoom levels are the output's own, computed from its merged spans when it is closed.
  if (name == "zoom_levels" || name == "zoom_lanes" || name == "zoom_chunks") return true;
  for (const char* t : kOrreryTables) {
    if (name == t) return true;
  }
  return false;
}

// Attaches `in` read-only to `db` as "src" (InputError naming it when it cannot be read).
void attach_input(sqlite3* db, const std::string& in, const std::string& output) {
  Stmt attach = wprep(db, output, "ATTACH DATABASE ?1 AS src");
  const std::string uri = sqlite_uri(in, "mode=ro");
  sqlite3_bind_text(attach.get(), 1, uri.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(attach.get()) != SQLITE_DONE)
    throw InputError(in + ": cannot read trace (" + sqlite3_errmsg(db) + ")");
}

// Appends the rows of every table of the attached input `in` ("src") that the store does not own
// (the profiler's flight_records, rank_status) to the same table of `output`, creating it from the
// first input's definition. Runs inside the caller's transaction.
void copy_foreign_tables(sqlite3* db, const std::string& in, const std::string& output) {
  std::vector<std::pair<std::string, std::string>> tables;  // (name, CREATE statement)
  std::string error;
  {
    Stmt list = wprep(db, output,
                      "SELECT name, sql FROM src.sqlite_master WHERE type='table' ORDER BY name");
    int rc;
    while ((rc = sqlite3_step(list.get())) == SQLITE_ROW) {
      std::string name = column_text(list.get(), 0);
      if (!is_store_table(name)) tables.emplace_back(std::move(name), column_text(list.get(), 1));
    }
    if (rc != SQLITE_DONE) error = sqlite3_errmsg(db);
  }
  if (error.empty() && !tables.empty()) {
    std::string sql;
    for (const auto& [name, create] : tables) {
      Stmt has =
          wprep(db, output, "SELECT 1 FROM main.sqlite_master WHERE type='table' AND name=?1");
      sqlite3_bind_text(has.get(), 1, name.c_str(), -1, SQLITE_TRANSIENT);
      // The CREATE statement as SQLite stored it names no schema, so it creates in main.
      if (sqlite3_step(has.get()) != SQLITE_ROW) sql += create + ";";
      sql += "INSERT OR REPLACE INTO main." + quoted_name(name) + " SELECT * FROM src." +
             quoted_name(name) + ";";
    }
    char* err = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK)
      error = err ? err : "unknown error";
    sqlite3_free(err);
  }
  if (!error.empty())
    throw InputError(in + ": cannot copy its tables into " + output + " (" + error + ")");
}

}  // namespace

namespace {

// One input's spans into `w`, names remapped (for_each_span_chunk: memory bounded by a window).
void merge_spans_of(const TraceReader& reader, const std::vector<NameId>& remap, TraceWriter& w) {
  for_each_span_chunk(reader, [&](std::vector<Span>& spans) {
    for (auto& sp : spans) {
      if (sp.name >= remap.size())
        throw InputError(reader.path() + ": corrupt trace (span name " + std::to_string(sp.name) +
                         " beyond the string table of " + std::to_string(remap.size()) + ")");
      sp.name = remap[sp.name];
    }
    w.add_spans(spans);
  });
}

}  // namespace

// The chunks are the windows of start time they always were (a stream's [start, end] cut into
// count / chunk windows of equal width), cut from for_each_span_run()'s spans: read on a
// connection of its own a block at a time, not through the reader's mapping of the whole file
// (whose touched pages count as this process's memory: 0.4 GB more at 5 M spans).
void for_each_span_chunk(const TraceReader& reader,
                         const std::function<void(std::vector<Span>&)>& fn, int64_t chunk) {
  chunk = std::max<int64_t>(1, chunk);
  const std::vector<TraceReader::StreamBounds> bounds = reader.stream_bounds();
  size_t at = 0;        // bounds[at]: the stream being read
  int64_t taken = 0;    // its spans so far
  int64_t width = 1;    // its window width
  uint64_t window = 0;  // the window of `pending`
  std::vector<Span> pending;
  const auto mismatch = [&](int64_t got, const TraceReader::StreamBounds& b) {
    return InputError(reader.path() + ": corrupt trace (rank " + std::to_string(b.rank) +
                      ", stream " + std::to_string(b.stream) + ": " + std::to_string(got) +
                      " spans read, its blocks say " + std::to_string(b.count) + ")");
  };
  const auto emit = [&]() {
    if (!pending.empty()) fn(pending);
    pending.clear();
  };
  // Moves to the stream of `s`, checking that the streams before it gave their counts.
  const auto enter = [&](const Span& s) {
    emit();
    if (at < bounds.size() && taken > 0 && taken != bounds[at].count)
      throw mismatch(taken, bounds[at]);
    if (taken > 0) ++at;
    while (at < bounds.size() && (bounds[at].rank != s.rank || bounds[at].stream != s.stream)) {
      if (bounds[at].count > 0) throw mismatch(0, bounds[at]);
      ++at;
    }
    if (at == bounds.size()) {
      throw InputError(reader.path() + ": corrupt trace (rank " + std::to_string(s.rank) +
                       ", stream " + std::to_string(s.stream) + " out of the block index order)");
    }
    const TraceReader::StreamBounds& b = bounds[at];
    const int64_t windows = std::max<int64_t>(1, b.count / chunk);
    width = std::max<int64_t>(1, (b.end_ns - b.start_ns) / windows + 1);
    taken = 0;
  };
  reader.for_each_span_run([&](std::span<const Span> run) {
    for (const Span& s : run) {
      if (taken == 0 || s.rank != bounds[at].rank || s.stream != bounds[at].stream) enter(s);
      const uint64_t w =
          (static_cast<uint64_t>(s.start_ns) - static_cast<uint64_t>(bounds[at].start_ns)) /
          static_cast<uint64_t>(width);
      if (w != window) emit();
      window = w;
      pending.push_back(s);
      ++taken;
    }
  });
  emit();
  if (at < bounds.size() && taken > 0 && taken != bounds[at].count)
    throw mismatch(taken, bounds[at]);
  for (size_t k = at + (taken > 0 ? 1 : 0); k < bounds.size(); ++k)
    if (bounds[k].count > 0) throw mismatch(0, bounds[k]);
}

std::vector<int32_t> counter_ranks(const TraceReader& reader) {
  std::vector<int32_t> ranks;
  sqlite3* conn = open_streaming(reader.path());
  DbCloser closer{conn};
  auto st = rprep(conn, reader.path(),
                  reader.checksums()
                      ? "SELECT DISTINCT rank FROM counter_blocks WHERE count > 0 ORDER BY rank"
                      : "SELECT DISTINCT rank FROM counters ORDER BY rank");
  while (rstep(conn, reader.path(), st))
    ranks.push_back(static_cast<int32_t>(sqlite3_column_int64(st.get(), 0)));
  return ranks;
}

void for_each_counter_rank(const TraceReader& reader,
                           const std::function<void(std::vector<CounterSample>&)>& fn) {
  for (int32_t r : counter_ranks(reader)) {
    std::vector<CounterSample> samples = reader.counters_of_rank(r);
    if (!samples.empty()) fn(samples);
  }
}

namespace {

// Copies the span blocks, counter blocks and step rows of `inputs` (schema 3, string ids already
// the output's) into `output` as they are, one transaction per input, checking each block's CRC32C (a
// damaged input is an InputError naming it and the block, as a read would be). Step rows of a
// rank and step already present are combined (earliest start, latest end, sums).
// One table of blocks (span blocks, or counter blocks) of the attached `src` appended to main's,
// in id order, each row's CRC32C checked against its key, count and bytes first.
void copy_checked_blocks(sqlite3* db, const std::string& in, const std::string& output,
                         bool counters) {
  const char* select = counters
                           ? "SELECT id, rank, name, count, crc32c, packed, min_ts_ns, max_ts_ns "
                             "FROM src.counter_blocks ORDER BY id"
                           : "SELECT id, rank, stream, count, crc32c, packed, chunk, "
                             "min_start_ns, max_end_ns, max_dur_ns, min_comm, max_comm FROM "
                             "src.blocks ORDER BY id";
  const char* insert = counters ? "INSERT INTO main.counter_blocks(rank, name, count, crc32c, "
                                  "packed, min_ts_ns, max_ts_ns) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)"
                                : "INSERT INTO main.blocks(rank, stream, count, crc32c, packed, "
                                  "chunk, min_start_ns, max_end_ns, max_dur_ns, min_comm, "
                                  "max_comm) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";
  const int columns = counters ? 8 : 12;
  Stmt from = wprep(db, output, select);
  Stmt to = wprep(db, output, insert);
  for (;;) {
    const int rc = sqlite3_step(from.get());
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) throw InputError(in + ": cannot read trace (" + sqlite3_errmsg(db) + ")");
    sqlite3_stmt* r = from.get();
    const auto* data = static_cast<const unsigned char*>(sqlite3_column_blob(r, 5));
    const auto size = static_cast<size_t>(sqlite3_column_bytes(r, 5));
    const int64_t key0 = sqlite3_column_int64(r, 1), key1 = sqlite3_column_int64(r, 2);
    const int64_t count = sqlite3_column_int64(r, 3);
    const auto crc = static_cast<uint32_t>(sqlite3_column_int64(r, 4));
    if (sqlite3_column_type(r, 4) == SQLITE_NULL ||
        detail::block_crc(key0, key1, count, data, size) != crc) {
      throw InputError(in + ": corrupt trace (" + (counters ? "counter" : "span") + " block " +
                       std::to_string(sqlite3_column_int64(r, 0)) + " (rank " +
                       std::to_string(key0) + (counters ? ", counter " : ", stream ") +
                       std::to_string(key1) + "): checksum mismatch)");
    }
    for (int c = 1; c < columns; ++c) {
      if (c == 5) {
        sqlite3_bind_blob(to.get(), 5, data, static_cast<int>(size), SQLITE_STATIC);
      } else {
        sqlite3_bind_value(to.get(), c, sqlite3_column_value(r, c));
      }
    }
    if (sqlite3_step(to.get()) != SQLITE_DONE) writer_fail(output, db, "copy block");
    sqlite3_reset(to.get());
  }
}

// A connection that writes after the TraceWriter's close() (the blocks of inputs copied as they
// are, every input's foreign tables; then the zoom levels). `output` is a temporary
// that AtomicFile fsyncs before renaming it into place: a crash before then leaves no output, so
// the commits need not sync, and a failure throws and AtomicFile discards the whole file, so no
// rollback journal is kept either. One thread uses it: no mutexes.
sqlite3* open_unjournaled(const std::string& output) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      output.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    DbCloser closer{db};
    writer_fail(output, db, "open to write");
  }
  sqlite3_busy_timeout(db, 5000);
  try {
    exec_or_throw(db, "PRAGMA synchronous=OFF", output);
    exec_or_throw(db, "PRAGMA journal_mode=OFF", output);
    exec_or_throw(db, "PRAGMA cache_size=-8192", output);
  } catch (...) {
    sqlite3_close(db);
    throw;
  }
  return db;
}

// Starts the disk writing the output's pages already written (sync_file_range, Linux; elsewhere
// nothing) without waiting for it: the merge goes on with the next input while the disk works, so
// AtomicFile's final fsync waits for the last input's pages rather than for the whole file.
// Durability is that fsync's business alone: this only moves the writing earlier.
class EarlyWriteback {
 public:
  explicit EarlyWriteback(const std::string& path)
      : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~EarlyWriteback() {
    if (fd_ >= 0) ::close(fd_);
  }
  EarlyWriteback(const EarlyWriteback&) = delete;
  EarlyWriteback& operator=(const EarlyWriteback&) = delete;
  void start() const {
#ifdef __linux__
    if (fd_ >= 0) ::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
  }

 private:
  int fd_;
};

// Each input attached once, one transaction each (DETACH needs none open), in input order:
// those in `verbatim` (schema 3, string ids already the output's) have their span blocks,
// counter blocks and step rows copied as they are, each block's CRC32C checked (a damaged input is
// an InputError naming it and the block, as a read would be; step rows of a rank and step already
// present are combined: earliest start, latest end, sums); every input has its foreign tables
// copied.
void copy_inputs(sqlite3* db, const std::vector<std::string>& inputs,
                 const std::vector<bool>& verbatim, const std::string& output) {
  const EarlyWriteback writeback(output);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string& in = inputs[i];
    attach_input(db, in, output);
    exec_or_throw(db, "BEGIN", output);
    if (verbatim[i]) {
      copy_checked_blocks(db, in, output, false);
      copy_checked_blocks(db, in, output, true);
      exec_or_throw(db,
                    (std::string("INSERT INTO main.steps SELECT * FROM src.steps WHERE true ") +
                     kAddToStepRow)
                        .c_str(),
                    output);
    }
    copy_foreign_tables(db, in, output);
    exec_or_throw(db, "COMMIT", output);
    exec_or_throw(db, "DETACH DATABASE src", output);
    writeback.start();
  }
}

// The inputs streamed into `output` one at a time (spans by windows of each stream, counters of one
// input): memory is bounded by one input's counters and a window of spans. `merging`: the run's
// per-rank files become one (world size from the ranks, merged_from and incomplete_inputs noted);
// otherwise one file copied as it is (export --format sqlite, with `sql_spans`).
void stream_into(const std::vector<std::string>& inputs, const std::string& output, bool sql_spans,
                 bool merging) {
  AtomicFile f(output, AtomicFile::ByName{{"-wal", "-shm", "-journal"}});
  std::vector<bool> verbatim(inputs.size());  // inputs whose blocks are copied as they are
  {
    TraceWriter w(f.temp_path(), 1 << 18, sql_spans);
    // Merging, the blocks of inputs whose name ids are already the output's are copied after
    // close(), and the zoom levels computed then.
    if (merging) w.set_zoom_levels(false);
    RunMeta meta;
    std::map<int32_t, RankInfo> ranks;
    std::map<std::pair<int32_t, int32_t>, StreamInfo> streams;
    std::map<int32_t, CommunicatorInfo> comms;
    std::vector<std::string> incomplete;
    bool first = true;
    for (size_t index = 0; index < inputs.size(); ++index) {
      const std::string& path = inputs[index];
      TraceReader reader(path);
      if (!reader.complete()) incomplete.push_back(path);
      const RunMeta m = reader.meta();
      if (first) {
        meta = m;
        first = false;
      } else {
        meta.world_size = std::max(meta.world_size, m.world_size);
      }
      for (auto& r : reader.ranks()) ranks[r.rank] = std::move(r);
      for (auto& s : reader.streams()) streams[{s.rank, s.stream}] = std::move(s);
      for (auto& c : reader.communicators()) {
        auto [it, inserted] = comms.try_emplace(c.id, c);
        if (!inserted) {
          // Each rank knows its own view of a communicator; keep the fullest member list.
          if (c.ranks.size() > it->second.ranks.size()) it->second = std::move(c);
        }
      }
      const StringTable strings = reader.strings();
      std::vector<NameId> remap(strings.size());
      bool same_ids = true;
      for (size_t i = 0; i < strings.size(); ++i) {
        remap[i] = w.intern(strings.str(static_cast<NameId>(i)));
        same_ids = same_ids && remap[i] == static_cast<NameId>(i);
      }
      if (merging && same_ids && reader.checksums()) {
        verbatim[index] = true;
        continue;
      }
      merge_spans_of(reader, remap, w);
      for_each_counter_rank(reader, [&](std::vector<CounterSample>& samples) {
        for (auto c : samples) {
          if (c.name >= remap.size())
            throw InputError(path + ": corrupt trace (counter name " + std::to_string(c.name) +
                             " beyond the string table)");
          c.name = remap[c.name];
          w.add_counter(c);
        }
      });
    }
    for (const auto& [_, r] : ranks) w.add_rank(r);
    for (const auto& [_, s] : streams) w.add_stream(s);
    for (const auto& [_, c] : comms) w.add_communicator(c);
    if (merging) {
      meta.world_size = std::max<int32_t>(meta.world_size, static_cast<int32_t>(ranks.size()));
      nlohmann::json extra = nlohmann::json::object();
      try {
        extra = nlohmann::json::parse(meta.extra_json.empty() ? "{}" : meta.extra_json);
        if (!extra.is_object()) extra = nlohmann::json{{"previous_extra", extra}};
      } catch (const nlohmann::json::exception&) {
        extra = nlohmann::json{{"previous_extra_text", meta.extra_json}};
      }
      extra["merged_from"] = inputs.size();
      if (!incomplete.empty()) extra["incomplete_inputs"] = incomplete;
      meta.extra_json = extra.dump();
    }
    w.set_meta(meta);
    w.close();
  }
  {
    DbCloser copying{open_unjournaled(f.temp_path())};
    copy_inputs(copying.db, inputs, verbatim, f.temp_path());
  }  // closed before the zoom levels are read: its page cache is not held through them
  if (merging) {
    // From the inputs' levels when they have them (per-rank files of one run), written a lane at
    // a time; else from the merged spans. An input's damaged levels are not the merge's business:
    // computed then too. The lanes are written with a rollback journal (only the pages the
    // tables' replacement touches: a new table's pages are appended), so that a lane found off
    // the grid midway rolls back cleanly.
    bool merged_levels = false;
    {
      DbCloser writing{open_unjournaled(f.temp_path())};
      exec_or_throw(writing.db, "PRAGMA journal_mode=DELETE", f.temp_path());
      try {
        merged_levels = write_merged_zoom_levels(writing.db, f.temp_path(), inputs);
      } catch (const InputError&) {
        merged_levels = false;
      }
    }
    if (!merged_levels) {
      const ZoomLevels levels = compute_zoom_levels(TraceReader(f.temp_path()));
      DbCloser writing{open_unjournaled(f.temp_path())};
      write_zoom_levels(writing.db, f.temp_path(), levels);
    }
  }
  f.commit();
}

}  // namespace

void merge_traces(const std::vector<std::string>& inputs, const std::string& output) {
  if (inputs.empty()) throw InputError(output + ": merge needs at least one input trace");
  for (const auto& path : inputs) {
    if (fs::weakly_canonical(path) == fs::weakly_canonical(output)) {
      throw InputError(output + ": merge output is also one of its inputs");
    }
  }
  stream_into(inputs, output, false, true);
}

void export_sqlite(const std::string& input, const std::string& output) {
  std::error_code ec;
  if (fs::weakly_canonical(input, ec) == fs::weakly_canonical(output, ec)) {
    throw InputError(output + ": export output is also its input");
  }
  // Streamed (memory bounded by a window of spans), the per-span table filled from the blocks.
  stream_into({input}, output, true, false);
}

}  // namespace orrery::traces
