// The SQLite trace store: schema, the buffered writer, the read-only reader and merge_traces().
//
// Layout choices, and why:
// - spans is a WITHOUT ROWID table clustered on (rank, stream, start_ns, id): a time-window query on
//   one stream and load_all() are then contiguous range scans of the table itself, no index lookups.
// - span_bounds keeps per (rank, stream) the span count, time range and the longest span, updated
//   with every flushed batch: the window query uses max_dur_ns to bound its scan (a span that starts
//   before t0 can still overlap the window), `info` reads counts without scanning.
// - While writing: WAL journal (readers can read a file being written), synchronous=OFF. close()
//   builds the secondary indexes, marks the file complete and returns it to a single-file journal.
#include <sqlite3.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "orrery/common/error.hpp"
#include "orrery/traces/store.hpp"

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
CREATE TABLE spans(rank INTEGER NOT NULL, stream INTEGER NOT NULL, start_ns INTEGER NOT NULL,
                   id INTEGER NOT NULL, end_ns INTEGER NOT NULL, kind INTEGER, name INTEGER,
                   step INTEGER, micro_batch INTEGER, layer INTEGER, bytes INTEGER, flops REAL,
                   comm INTEGER, peer INTEGER, seq INTEGER, op INTEGER,
                   PRIMARY KEY(rank, stream, start_ns, id)) WITHOUT ROWID;
CREATE TABLE span_bounds(rank INTEGER, stream INTEGER, count INTEGER, min_start_ns INTEGER,
                         max_end_ns INTEGER, max_dur_ns INTEGER, PRIMARY KEY(rank, stream))
  WITHOUT ROWID;
CREATE TABLE counters(rank INTEGER, name INTEGER, ts_ns INTEGER, value REAL);
)sql";

// Secondary indexes, built once by close(): building them at the end is much cheaper than keeping
// them up to date under millions of inserts. A reader of an unclosed file works without them.
constexpr const char* kIndexSql = R"sql(
CREATE INDEX IF NOT EXISTS spans_by_comm_seq ON spans(comm, seq) WHERE comm >= 0;
CREATE INDEX IF NOT EXISTS spans_by_step ON spans(step, rank) WHERE step >= 0;
CREATE INDEX IF NOT EXISTS counters_by_rank ON counters(rank, name, ts_ns);
)sql";

constexpr const char* kSpanColumns =
    "rank, stream, kind, name, start_ns, end_ns, step, micro_batch, layer, bytes, flops, comm, "
    "peer, seq, op";

constexpr int kInsertRows = 32;   // rows per multi-row INSERT: fewer statement executions
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
    if (j > i) out.push_back(static_cast<int32_t>(std::stoll(s.substr(i, j - i))));
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

Span read_span(sqlite3_stmt* st) {
  // Column order is kSpanColumns.
  Span s;
  s.rank = static_cast<int32_t>(sqlite3_column_int64(st, 0));
  s.stream = static_cast<int32_t>(sqlite3_column_int64(st, 1));
  s.kind = static_cast<SpanKind>(sqlite3_column_int64(st, 2));
  s.name = static_cast<NameId>(sqlite3_column_int64(st, 3));
  s.start_ns = sqlite3_column_int64(st, 4);
  s.end_ns = sqlite3_column_int64(st, 5);
  s.step = static_cast<int32_t>(sqlite3_column_int64(st, 6));
  s.micro_batch = static_cast<int32_t>(sqlite3_column_int64(st, 7));
  s.layer = static_cast<int32_t>(sqlite3_column_int64(st, 8));
  s.bytes = sqlite3_column_int64(st, 9);
  s.flops = sqlite3_column_double(st, 10);
  s.comm = static_cast<int32_t>(sqlite3_column_int64(st, 11));
  s.peer = static_cast<int32_t>(sqlite3_column_int64(st, 12));
  s.seq = sqlite3_column_int64(st, 13);
  s.op = static_cast<CollOp>(sqlite3_column_int64(st, 14));
  return s;
}

bool span_key_less(const Span& a, const Span& b) {
  if (a.rank != b.rank) return a.rank < b.rank;
  if (a.stream != b.stream) return a.stream < b.stream;
  return a.start_ns < b.start_ns;
}

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
  throw InternalError(path + ": trace read failed: " + what + " (" + msg + ")");
}

Stmt rprep(sqlite3* db, const std::string& path, const char* sql) {
  sqlite3_stmt* st = nullptr;
  const int rc = sqlite3_prepare_v2(db, sql, -1, &st, nullptr);
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

void exec_or_throw(sqlite3* db, const char* sql, const std::string& path) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw InternalError(path + ": trace write failed: " + msg + " [" + sql + "]");
  }
}

void bind_span(sqlite3_stmt* st, int base, const Span& s, int64_t id) {
  // Column order of the INSERT: rank, stream, start_ns, id, end_ns, kind, name, step, micro_batch,
  // layer, bytes, flops, comm, peer, seq, op.
  sqlite3_bind_int64(st, base + 1, s.rank);
  sqlite3_bind_int64(st, base + 2, s.stream);
  sqlite3_bind_int64(st, base + 3, s.start_ns);
  sqlite3_bind_int64(st, base + 4, id);
  sqlite3_bind_int64(st, base + 5, s.end_ns);
  sqlite3_bind_int64(st, base + 6, static_cast<int64_t>(s.kind));
  sqlite3_bind_int64(st, base + 7, s.name);
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
  std::string sql =
      "INSERT INTO spans(rank, stream, start_ns, id, end_ns, kind, name, step, micro_batch, layer, "
      "bytes, flops, comm, peer, seq, op) VALUES ";
  for (int r = 0; r < rows; ++r) {
    sql += r ? ",(" : "(";
    for (int c = 0; c < kSpanInsertCols; ++c) sql += c ? ",?" : "?";
    sql += ")";
  }
  return sql;
}

}  // namespace

struct TraceWriter::Impl {
  struct Bounds {
    int64_t count = 0;
    int64_t min_start_ns = std::numeric_limits<int64_t>::max();
    int64_t max_end_ns = std::numeric_limits<int64_t>::min();
    int64_t max_dur_ns = 0;
  };
  Stmt insert_many, insert_one, insert_string, insert_counter, upsert_bounds;
  std::map<std::pair<int32_t, int32_t>, Bounds> bounds;
  std::vector<std::pair<Span, int64_t>> sorted;  // batch with ids, sorted before insertion
  int64_t next_id = 0;
};

TraceWriter::TraceWriter(const std::string& path, size_t batch_spans)
    : path_(path), batch_spans_(std::max<size_t>(batch_spans, 1)) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(path + suffix, ec);
  const int rc = sqlite3_open_v2(path.c_str(), &db_,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw InputError(path + ": cannot create trace file (" + msg + ")");
  }
  try {
    // Page size before anything is written; bigger pages mean shallower B-trees for big traces.
    exec_or_throw(db_, "PRAGMA page_size=16384", path_);
    exec_or_throw(db_, "PRAGMA journal_mode=WAL", path_);
    exec_or_throw(db_, "PRAGMA synchronous=OFF", path_);
    exec_or_throw(db_, "PRAGMA cache_size=-65536", path_);
    exec_or_throw(db_, "PRAGMA wal_autocheckpoint=4096", path_);
    exec_or_throw(db_, "BEGIN", path_);
    exec_or_throw(db_, kSchemaSql, path_);
    const std::string version = "PRAGMA user_version=" + std::to_string(kSchemaVersion);
    exec_or_throw(db_, version.c_str(), path_);
    const std::string meta =
        "INSERT INTO meta VALUES('schema_version'," + std::to_string(kSchemaVersion) +
        "),('complete',0)";
    exec_or_throw(db_, meta.c_str(), path_);
    exec_or_throw(db_, "COMMIT", path_);
    impl_ = std::make_unique<Impl>();
    impl_->insert_many = wprep(db_, path_, span_insert_sql(kInsertRows).c_str());
    impl_->insert_one = wprep(db_, path_, span_insert_sql(1).c_str());
    impl_->insert_string = wprep(db_, path_, "INSERT INTO strings(id, text) VALUES(?,?)");
    impl_->insert_counter = wprep(
        db_, path_, "INSERT INTO counters(rank, name, ts_ns, value) VALUES(?,?,?,?)");
    impl_->upsert_bounds = wprep(
        db_, path_, "INSERT OR REPLACE INTO span_bounds VALUES(?,?,?,?,?,?)");
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
  auto put_text = [&](const char* key, const std::string& v) {
    sqlite3_bind_text(st.get(), 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st.get(), 2, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    if (sqlite3_step(st.get()) != SQLITE_DONE) writer_fail(path_, db_, "meta");
    sqlite3_reset(st.get());
  };
  auto put_int = [&](const char* key, int64_t v) {
    sqlite3_bind_text(st.get(), 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st.get(), 2, v);
    if (sqlite3_step(st.get()) != SQLITE_DONE) writer_fail(path_, db_, "meta");
    sqlite3_reset(st.get());
  };
  auto put_real = [&](const char* key, double v) {
    sqlite3_bind_text(st.get(), 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_double(st.get(), 2, v);
    if (sqlite3_step(st.get()) != SQLITE_DONE) writer_fail(path_, db_, "meta");
    sqlite3_reset(st.get());
  };
  exec_or_throw(db_, "BEGIN", path_);
  put_text("source", std::string(to_string(m.source)));
  put_text("scenario_text", m.scenario_text);
  put_text("scenario_name", m.scenario_name);
  put_text("host", m.host);
  put_int("start_time_unix_ns", m.start_time_unix_ns);
  put_int("world_size", m.world_size);
  put_int("dp", m.dp);
  put_int("tp", m.tp);
  put_int("pp", m.pp);
  put_int("tokens_per_step", m.tokens_per_step);
  put_real("model_flops_per_step", m.model_flops_per_step);
  put_real("peak_flops_per_rank", m.peak_flops_per_rank);
  put_text("extra_json", m.extra_json.empty() ? std::string("{}") : m.extra_json);
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

  // Spans: ids follow arrival order (the tie-break among equal starts); the batch is sorted by the
  // clustering key so inserts land in a few runs of adjacent B-tree pages.
  auto& batch = im.sorted;
  batch.clear();
  batch.reserve(span_buf_.size());
  for (const auto& s : span_buf_) {
    batch.emplace_back(s, im.next_id++);
    auto& b = im.bounds[{s.rank, s.stream}];
    b.count += 1;
    b.min_start_ns = std::min(b.min_start_ns, s.start_ns);
    b.max_end_ns = std::max(b.max_end_ns, s.end_ns);
    b.max_dur_ns = std::max(b.max_dur_ns, s.end_ns - s.start_ns);
  }
  if (!std::is_sorted(batch.begin(), batch.end(),
                      [](const auto& a, const auto& b) { return span_key_less(a.first, b.first); })) {
    std::stable_sort(batch.begin(), batch.end(), [](const auto& a, const auto& b) {
      return span_key_less(a.first, b.first);
    });
  }
  {
    size_t i = 0;
    sqlite3_stmt* many = im.insert_many.get();
    for (; i + kInsertRows <= batch.size(); i += kInsertRows) {
      for (int r = 0; r < kInsertRows; ++r) {
        bind_span(many, r * kSpanInsertCols, batch[i + r].first, batch[i + r].second);
      }
      if (sqlite3_step(many) != SQLITE_DONE) writer_fail(path_, db_, "insert spans");
      sqlite3_reset(many);
    }
    sqlite3_stmt* one = im.insert_one.get();
    for (; i < batch.size(); ++i) {
      bind_span(one, 0, batch[i].first, batch[i].second);
      if (sqlite3_step(one) != SQLITE_DONE) writer_fail(path_, db_, "insert span");
      sqlite3_reset(one);
    }
  }

  {
    sqlite3_stmt* st = im.insert_counter.get();
    for (const auto& c : counter_buf_) {
      sqlite3_bind_int64(st, 1, c.rank);
      sqlite3_bind_int64(st, 2, c.name);
      sqlite3_bind_int64(st, 3, c.ts_ns);
      sqlite3_bind_double(st, 4, c.value);
      if (sqlite3_step(st) != SQLITE_DONE) writer_fail(path_, db_, "insert counter");
      sqlite3_reset(st);
    }
  }

  if (!span_buf_.empty()) {
    sqlite3_stmt* st = im.upsert_bounds.get();
    for (const auto& [key, b] : im.bounds) {
      sqlite3_bind_int64(st, 1, key.first);
      sqlite3_bind_int64(st, 2, key.second);
      sqlite3_bind_int64(st, 3, b.count);
      sqlite3_bind_int64(st, 4, b.min_start_ns);
      sqlite3_bind_int64(st, 5, b.max_end_ns);
      sqlite3_bind_int64(st, 6, b.max_dur_ns);
      if (sqlite3_step(st) != SQLITE_DONE) writer_fail(path_, db_, "span bounds");
      sqlite3_reset(st);
    }
  }
  exec_or_throw(db_, "COMMIT", path_);
  span_buf_.clear();
  counter_buf_.clear();
  batch.clear();
}

void TraceWriter::close() {
  std::lock_guard lock(mu_);
  if (closed_ || !db_) return;
  flush_locked();
  exec_or_throw(db_, kIndexSql, path_);
  exec_or_throw(db_, "ANALYZE", path_);
  exec_or_throw(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES('complete', 1)", path_);
  closed_ = true;
  impl_.reset();
  // Back to a single self-contained file. Fails harmlessly (stays WAL) if a reader holds it open.
  sqlite3_exec(db_, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
  sqlite3_exec(db_, "PRAGMA journal_mode=DELETE", nullptr, nullptr, nullptr);
  sqlite3_close(db_);
  db_ = nullptr;
}

void write_trace(const Trace& t, const std::string& path) {
  TraceWriter w(path, 1 << 18);
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

}  // namespace

TraceReader::TraceReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path + ": no such trace file");
  if (fs::is_directory(path, ec)) throw InputError(path + ": is a directory, expected a trace file");
  const auto file_size = fs::file_size(path, ec);
  if (!ec && file_size == 0) {
    throw InputError(path + ": empty file, not an Orrery trace");
  }
  check_not_truncated(path, file_size);
  const int rc = sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr);
  if (rc != SQLITE_OK) {
    const std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw InputError(path + ": cannot open trace (" + msg + ")");
  }
  try {
    // A reader may meet a writer mid-commit; wait instead of failing.
    sqlite3_busy_timeout(db_, 5000);
    int version = 0;
    {
      auto st = rprep(db_, path_, "PRAGMA user_version");
      // The first read of the file: "file is not a database" surfaces here for non-SQLite input.
      const int src = sqlite3_step(st.get());
      if (src != SQLITE_ROW) {
        const std::string msg = sqlite3_errmsg(db_);
        throw InputError(path + ": not an Orrery trace (" + msg + ")");
      }
      version = static_cast<int>(sqlite3_column_int64(st.get(), 0));
    }
    bool has_tables = false;
    {
      auto st = rprep(db_, path_, 
          "SELECT count(*) FROM sqlite_master WHERE type='table' AND name IN "
          "('meta','spans','strings','ranks','streams','communicators','counters','span_bounds')");
      if (rstep(db_, path_, st)) has_tables = sqlite3_column_int64(st.get(), 0) == 8;
    }
    if (version == 0 && !has_tables) {
      throw InputError(path + ": not an Orrery trace (no Orrery tables in this SQLite file)");
    }
    if (version != kSchemaVersion) {
      throw InputError(path + ": schema version " + std::to_string(version) + ", expected " +
                       std::to_string(kSchemaVersion));
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
  auto st = rprep(db_, path_, "SELECT value FROM meta WHERE key='complete'");
  return rstep(db_, path_, st) && sqlite3_column_int64(st.get(), 0) == 1;
}

RunMeta TraceReader::meta() const {
  RunMeta m;
  auto st = rprep(db_, path_, "SELECT key, value FROM meta");
  while (rstep(db_, path_, st)) {
    const std::string key = column_text(st.get(), 0);
    sqlite3_stmt* s = st.get();
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
      m.world_size = static_cast<int32_t>(sqlite3_column_int64(s, 1));
    } else if (key == "dp") {
      m.dp = static_cast<int32_t>(sqlite3_column_int64(s, 1));
    } else if (key == "tp") {
      m.tp = static_cast<int32_t>(sqlite3_column_int64(s, 1));
    } else if (key == "pp") {
      m.pp = static_cast<int32_t>(sqlite3_column_int64(s, 1));
    } else if (key == "tokens_per_step") {
      m.tokens_per_step = sqlite3_column_int64(s, 1);
    } else if (key == "model_flops_per_step") {
      m.model_flops_per_step = sqlite3_column_double(s, 1);
    } else if (key == "peak_flops_per_rank") {
      m.peak_flops_per_rank = sqlite3_column_double(s, 1);
    } else if (key == "extra_json") {
      m.extra_json = column_text(s, 1);
    }
  }
  return m;
}

std::vector<RankInfo> TraceReader::ranks() const {
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
  StringTable t;
  auto st = rprep(db_, path_, "SELECT id, text FROM strings ORDER BY id");
  while (rstep(db_, path_, st)) {
    const auto id = static_cast<NameId>(sqlite3_column_int64(st.get(), 0));
    if (id != t.size()) {
      throw InputError(path_ + ": corrupt string table (id " + std::to_string(id) +
                       " where " + std::to_string(t.size()) + " was expected)");
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
  auto st = rprep(db_, path_, "SELECT COALESCE(SUM(count), 0) FROM span_bounds");
  return rstep(db_, path_, st) ? sqlite3_column_int64(st.get(), 0) : 0;
}

std::optional<TraceReader::TimeRange> TraceReader::time_range() const {
  auto st = rprep(db_, path_, "SELECT MIN(min_start_ns), MAX(max_end_ns), SUM(count) FROM span_bounds");
  if (!rstep(db_, path_, st) || sqlite3_column_type(st.get(), 0) == SQLITE_NULL) return std::nullopt;
  return TimeRange{sqlite3_column_int64(st.get(), 0), sqlite3_column_int64(st.get(), 1)};
}

std::vector<TraceReader::StreamBounds> TraceReader::stream_bounds() const {
  std::vector<StreamBounds> out;
  auto st = rprep(db_, path_, 
      "SELECT rank, stream, count, min_start_ns, max_end_ns, max_dur_ns FROM span_bounds "
      "ORDER BY rank, stream");
  while (rstep(db_, path_, st)) {
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
  std::vector<Span> out;
  if (t1 <= t0) return out;
  int64_t max_dur = 0;
  {
    auto st = rprep(db_, path_, "SELECT max_dur_ns FROM span_bounds WHERE rank=?1 AND stream=?2");
    sqlite3_bind_int64(st.get(), 1, rank);
    sqlite3_bind_int64(st.get(), 2, stream);
    if (!rstep(db_, path_, st)) return out;  // no spans on this stream
    max_dur = std::max<int64_t>(0, sqlite3_column_int64(st.get(), 0));
  }
  // A span overlapping [t0, t1) starts at or after t0 - max_dur, so the clustered key bounds the
  // scan. Zero-length spans count when they start inside the window.
  const int64_t lo = t0 < std::numeric_limits<int64_t>::min() + max_dur
                         ? std::numeric_limits<int64_t>::min()
                         : t0 - max_dur;
  const std::string sql = std::string("SELECT ") + kSpanColumns +
                          " FROM spans WHERE rank=?1 AND stream=?2 AND start_ns>=?3 AND "
                          "start_ns<?4 AND (end_ns>?5 OR start_ns>=?5) ORDER BY start_ns, id";
  auto st = rprep(db_, path_, sql.c_str());
  sqlite3_bind_int64(st.get(), 1, rank);
  sqlite3_bind_int64(st.get(), 2, stream);
  sqlite3_bind_int64(st.get(), 3, lo);
  sqlite3_bind_int64(st.get(), 4, t1);
  sqlite3_bind_int64(st.get(), 5, t0);
  while (rstep(db_, path_, st)) out.push_back(read_span(st.get()));
  return out;
}

std::vector<Span> TraceReader::collectives_of(int32_t comm) const {
  std::vector<Span> out;
  const std::string sql = std::string("SELECT ") + kSpanColumns +
                          " FROM spans WHERE comm=?1 AND comm>=0 ORDER BY seq, rank, start_ns";
  auto st = rprep(db_, path_, sql.c_str());
  sqlite3_bind_int64(st.get(), 1, comm);
  while (rstep(db_, path_, st)) out.push_back(read_span(st.get()));
  return out;
}

std::vector<TraceReader::StepAggregate> TraceReader::step_aggregates() const {
  std::vector<StepAggregate> out;
  const std::string sql =
      "SELECT rank, step, MIN(start_ns), MAX(end_ns), "
      "SUM(CASE WHEN kind IN (" + std::to_string(static_cast<int>(SpanKind::Compute)) + "," +
      std::to_string(static_cast<int>(SpanKind::Optimizer)) +
      ") THEN end_ns - start_ns ELSE 0 END), "
      "SUM(CASE WHEN kind IN (" + std::to_string(static_cast<int>(SpanKind::Collective)) + "," +
      std::to_string(static_cast<int>(SpanKind::P2P)) +
      ") THEN end_ns - start_ns ELSE 0 END), COUNT(*) "
      "FROM spans WHERE step >= 0 GROUP BY rank, step ORDER BY rank, step";
  auto st = rprep(db_, path_, sql.c_str());
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

std::vector<CounterSample> TraceReader::counters() const {
  std::vector<CounterSample> out;
  auto st = rprep(db_, path_, "SELECT rank, name, ts_ns, value FROM counters ORDER BY rank, name, ts_ns");
  while (rstep(db_, path_, st)) {
    CounterSample c;
    c.rank = static_cast<int32_t>(sqlite3_column_int64(st.get(), 0));
    c.name = static_cast<NameId>(sqlite3_column_int64(st.get(), 1));
    c.ts_ns = sqlite3_column_int64(st.get(), 2);
    c.value = sqlite3_column_double(st.get(), 3);
    out.push_back(c);
  }
  return out;
}

Trace TraceReader::load_all() const {
  Trace t;
  t.path = path_;
  t.meta = meta();
  t.ranks = ranks();
  t.streams = streams();
  t.comms = communicators();
  t.strings = strings();
  t.counters = counters();
  t.spans.reserve(static_cast<size_t>(span_count()));
  // One scan in clustering-key order: already sorted by (rank, stream, start_ns).
  const std::string sql =
      std::string("SELECT ") + kSpanColumns + " FROM spans ORDER BY rank, stream, start_ns, id";
  auto st = rprep(db_, path_, sql.c_str());
  while (rstep(db_, path_, st)) t.spans.push_back(read_span(st.get()));
  const auto n_strings = static_cast<NameId>(t.strings.size());
  for (const auto& s : t.spans) {
    if (s.name >= n_strings) {
      throw InputError(path_ + ": corrupt trace (span name id " + std::to_string(s.name) +
                       " outside the string table of " + std::to_string(n_strings) + ")");
    }
  }
  for (const auto& c : t.counters) {
    if (c.name >= n_strings) {
      throw InputError(path_ + ": corrupt trace (counter name id " + std::to_string(c.name) +
                       " outside the string table of " + std::to_string(n_strings) + ")");
    }
  }
  return t;
}

Trace load_trace(const std::string& path) { return TraceReader(path).load_all(); }

// ---------------------------------------------------------------------------------------------
// Merge

void merge_traces(const std::vector<std::string>& inputs, const std::string& output) {
  if (inputs.empty()) throw InputError(output + ": merge needs at least one input trace");
  Trace out;
  std::map<int32_t, RankInfo> ranks;
  std::map<std::pair<int32_t, int32_t>, StreamInfo> streams;
  std::map<int32_t, CommunicatorInfo> comms;
  std::vector<std::string> incomplete;
  bool first = true;
  for (const auto& path : inputs) {
    if (fs::weakly_canonical(path) == fs::weakly_canonical(output)) {
      throw InputError(output + ": merge output is also one of its inputs");
    }
    TraceReader reader(path);
    if (!reader.complete()) incomplete.push_back(path);
    Trace t = reader.load_all();
    if (first) {
      out.meta = t.meta;
      first = false;
    } else {
      out.meta.world_size = std::max(out.meta.world_size, t.meta.world_size);
    }
    for (auto& r : t.ranks) ranks[r.rank] = std::move(r);
    for (auto& s : t.streams) streams[{s.rank, s.stream}] = std::move(s);
    for (auto& c : t.comms) {
      auto [it, inserted] = comms.try_emplace(c.id, c);
      if (!inserted) {
        // Each rank knows its own view of a communicator; keep the fullest member list.
        if (c.ranks.size() > it->second.ranks.size()) it->second = std::move(c);
      }
    }
    std::vector<NameId> remap(t.strings.size());
    for (size_t i = 0; i < t.strings.size(); ++i) {
      remap[i] = out.strings.intern(t.strings.str(static_cast<NameId>(i)));
    }
    out.spans.reserve(out.spans.size() + t.spans.size());
    for (auto s : t.spans) {
      s.name = remap[s.name];
      out.spans.push_back(s);
    }
    for (auto c : t.counters) {
      c.name = remap[c.name];
      out.counters.push_back(c);
    }
  }
  for (auto& [_, r] : ranks) out.ranks.push_back(std::move(r));
  for (auto& [_, s] : streams) out.streams.push_back(std::move(s));
  for (auto& [_, c] : comms) out.comms.push_back(std::move(c));
  out.meta.world_size = std::max<int32_t>(out.meta.world_size, static_cast<int32_t>(ranks.size()));
  out.sort_spans();

  nlohmann::json extra = nlohmann::json::object();
  try {
    extra = nlohmann::json::parse(out.meta.extra_json.empty() ? "{}" : out.meta.extra_json);
    if (!extra.is_object()) extra = nlohmann::json{{"previous_extra", extra}};
  } catch (const nlohmann::json::exception&) {
    extra = nlohmann::json{{"previous_extra_text", out.meta.extra_json}};
  }
  extra["merged_from"] = inputs.size();
  if (!incomplete.empty()) extra["incomplete_inputs"] = incomplete;
  out.meta.extra_json = extra.dump();

  // Write next to the output and rename, so a failed merge leaves no file that looks whole.
  const std::string tmp = output + ".partial";
  try {
    write_trace(out, tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  for (const char* suffix : {"-wal", "-shm", "-journal"}) fs::remove(output + suffix, ec);
  fs::rename(tmp, output, ec);
  if (ec) throw InputError(output + ": cannot write merged trace (" + ec.message() + ")");
}

}  // namespace orrery::traces
