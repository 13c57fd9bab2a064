// The Nsight Systems importer: the SQLite file of `nsys export --type sqlite` into a Trace. The
// mapping rules are in import.hpp. Tables appear only when nsys recorded something of their kind
// and their columns changed across nsys versions, so every table and column is looked up first:
// what is required and missing is an InputError naming the table and column; what is optional and
// missing is simply not imported.
#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "import_common.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/import.hpp"
#include "orrery/traces/kernel_work.hpp"

namespace orrery::traces {

namespace {

namespace fs = std::filesystem;

constexpr const char* kKernelTable = "CUPTI_ACTIVITY_KIND_KERNEL";
constexpr int kNvtxPushPopRange = 59;
constexpr int kNvtxStartEndRange = 60;

// A process is the part of a globalPid / globalTid above the thread id's 24 bits (nsys: PID =
// globalTid / 0x1000000 % 0x1000000, TID = globalTid % 0x1000000).
int64_t process_of(int64_t global_id) { return global_id >> 24; }
int64_t pid_of(int64_t global_id) { return (global_id >> 24) & 0xFFFFFF; }
int64_t tid_of(int64_t global_id) { return global_id & 0xFFFFFF; }

class Db {
 public:
  explicit Db(const std::string& path) : path_(path) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) throw InputError(path + ": cannot open (no such file)");
    char head[16] = {};
    std::ifstream f(path, std::ios::binary);
    if (!f.read(head, sizeof head) || std::memcmp(head, "SQLite format 3", 16) != 0) {
      throw InputError(path +
                       ": not an SQLite file (expected the output of nsys export --type sqlite)");
    }
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr) !=
        SQLITE_OK) {
      const std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      db_ = nullptr;
      throw InputError(path + ": cannot open as SQLite (" + msg + ")");
    }
    try {  // a damaged file fails here: the destructor will not run, close the connection
      Query q(*this, "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')");
      while (q.next()) tables_.insert(q.text(0));
    } catch (...) {
      sqlite3_close(db_);
      db_ = nullptr;
      throw;
    }
  }
  ~Db() { sqlite3_close(db_); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  bool has_table(const std::string& t) const { return tables_.count(t) > 0; }
  std::set<std::string> columns(const std::string& table) {
    std::set<std::string> cols;
    Query q(*this, "PRAGMA table_info(\"" + table + "\")");
    while (q.next()) cols.insert(q.text(1));
    return cols;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(path_ + ": " + what + " (" + sqlite3_errmsg(db_) + ")");
  }
  const std::string& path() const { return path_; }

  class Query {
   public:
    Query(Db& db, const std::string& sql) : db_(db) {
      if (sqlite3_prepare_v2(db.db_, sql.c_str(), -1, &st_, nullptr) != SQLITE_OK) {
        db.fail("cannot query: " + sql);
      }
    }
    ~Query() { sqlite3_finalize(st_); }
    Query(const Query&) = delete;
    Query& operator=(const Query&) = delete;
    bool next() {
      const int rc = sqlite3_step(st_);
      if (rc == SQLITE_ROW) return true;
      if (rc == SQLITE_DONE) return false;
      db_.fail("cannot read");
    }
    bool is_null(int i) const { return sqlite3_column_type(st_, i) == SQLITE_NULL; }
    bool is_int(int i) const { return sqlite3_column_type(st_, i) == SQLITE_INTEGER; }
    int64_t integer(int i) const { return sqlite3_column_int64(st_, i); }
    std::string text(int i) const {
      const auto* p = sqlite3_column_text(st_, i);
      return p ? std::string(reinterpret_cast<const char*>(p),
                             static_cast<size_t>(sqlite3_column_bytes(st_, i)))
               : std::string();
    }

   private:
    Db& db_;
    sqlite3_stmt* st_ = nullptr;
  };

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
  std::set<std::string> tables_;
};

// The columns of an optional table, or nullopt when the table or a needed column is absent.
std::optional<std::set<std::string>> optional_table(Db& db, const std::string& table,
                                                    std::initializer_list<const char*> needed) {
  if (!db.has_table(table)) return std::nullopt;
  auto cols = db.columns(table);
  for (const char* c : needed) {
    if (!cols.count(c)) return std::nullopt;
  }
  return cols;
}

std::optional<int64_t> session_start_ns(Db& db) {
  if (!optional_table(db, "TARGET_INFO_SESSION_START_TIME", {"utcEpochNs"})) return std::nullopt;
  Db::Query q(db, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1");
  if (!q.next() || !q.is_int(0)) return std::nullopt;
  const int64_t v = q.integer(0);
  if (v < 0 || v > (int64_t{1} << 62)) return std::nullopt;
  return v;
}

// One device activity row (kernel, memcpy or memset).
struct DeviceRow {
  SpanKind kind = SpanKind::Compute;
  CollOp op = CollOp::None;
  int64_t start = 0, end = 0;
  int64_t device = 0, stream = 0, process = 0;
  std::optional<int64_t> correlation;
  NameId name = 0;
  int64_t bytes = 0;
};

struct NvtxRow {
  int64_t start = 0, end = 0;
  int64_t tid = 0;  // globalTid
  std::string text;
};

class FileReader {
 public:
  FileReader(const std::string& path, int64_t offset_ns, detail::Draft& d, int32_t& next_rank)
      : db_(path), offset_(offset_ns), d_(d), next_rank_(next_rank) {}
  void run();

 private:
  std::string lookup(int64_t id) {
    auto it = strings_.find(id);
    return it != strings_.end() ? it->second : "string " + std::to_string(id);
  }
  // Start/end columns 0 and 1 of q, shifted to the common time base; false for a row to skip.
  bool times(const Db::Query& q, const char* table, int64_t& start, int64_t& end) {
    if (!q.is_int(0) || !q.is_int(1)) {
      d_.skipped_events += 1;
      return false;
    }
    if (__builtin_add_overflow(q.integer(0), offset_, &start) ||
        __builtin_add_overflow(q.integer(1), offset_, &end)) {
      throw InputError(db_.path() + ": " + table + ": a start or end time out of range");
    }
    if (end < start) {
      d_.skipped_events += 1;
      return false;
    }
    return true;
  }
  void read_device_table(const char* table, SpanKind kind, std::vector<DeviceRow>& out);

  // The kernel table's name column, checked with the required columns; reads StringIds.
  struct KernelTable {
    bool has_correlation = false;
    const char* name_col = nullptr;
  };
  // Device and host streams per rank: (device, stream) and globalTid -> stream id.
  struct Streams {
    std::map<int32_t, std::map<std::pair<int64_t, int64_t>, int32_t>> device;
    std::map<int32_t, std::map<int64_t, int32_t>> host;
  };
  using Ranks = std::map<int64_t, int32_t>;  // process -> rank
  struct Launch {
    int64_t start = 0;
    int64_t tid = 0;  // globalTid of the thread that made the call
  };
  using Launches = std::map<std::pair<int64_t, int64_t>, Launch>;  // (process, correlation)
  // NVTX operator ranges with GEMM or attention work (kernel_work.hpp), per thread by start.
  struct ShapedRange {
    int64_t start = 0, end = 0;
    int64_t group = 0;  // the range's index: the op instance
    std::string op;
    OpWork work;
  };
  using ShapedRanges = std::map<int64_t, std::vector<ShapedRange>>;
  static ShapedRanges shaped_ranges(const std::vector<NvtxRow>& nvtx);
  // The innermost shaped range open on the launching thread when a kernel was launched.
  static const ShapedRange* launching_op(const ShapedRanges& ranges, const Launch& l);
  void attach_work(const std::vector<DeviceRow>& rows, const Ranks& rank_of, const Launches& launch,
                   const ShapedRanges& ranges, size_t first_span);
  KernelTable check_kernel_table();
  std::vector<DeviceRow> read_kernels(const KernelTable& kt);
  Ranks assign_ranks(const std::vector<DeviceRow>& rows);
  Launches launch_times();
  std::vector<NvtxRow> read_nvtx(const Ranks& rank_of);
  std::unordered_map<int64_t, std::string> thread_names();
  Streams assign_streams(const std::vector<DeviceRow>& rows, const std::vector<NvtxRow>& nvtx,
                         Ranks& rank_of);
  void add_device_spans(const std::vector<DeviceRow>& rows, const Ranks& rank_of, Streams& streams,
                        const Launches& launch);
  void add_nvtx_spans(const std::vector<NvtxRow>& nvtx, Ranks& rank_of, Streams& streams);

  Db db_;
  int64_t offset_;
  detail::Draft& d_;
  int32_t& next_rank_;
  std::unordered_map<int64_t, std::string> strings_;
  std::unordered_map<int64_t, NameId> kernel_names_;
};

void FileReader::read_device_table(const char* table, SpanKind kind, std::vector<DeviceRow>& out) {
  const auto cols =
      optional_table(db_, table, {"start", "end", "deviceId", "streamId", "globalPid"});
  if (!cols) return;
  const bool has_bytes = cols->count("bytes") > 0;
  const bool has_corr = cols->count("correlationId") > 0;
  const bool has_copy_kind = cols->count("copyKind") > 0;
  std::string sql = "SELECT start, end, deviceId, streamId, globalPid";
  sql += has_bytes ? ", bytes" : ", 0";
  sql += has_corr ? ", correlationId" : ", NULL";
  sql += has_copy_kind ? ", copyKind" : ", NULL";
  sql += std::string(" FROM ") + table;
  Db::Query q(db_, sql);
  // CUDA's memcpy kinds (ENUM_CUDA_MEMCPY_OPER).
  static const std::map<int64_t, const char*> kCopy = {
      {1, "HtoD"}, {2, "DtoH"}, {3, "HtoA"}, {4, "AtoH"}, {5, "AtoA"},
      {6, "AtoD"}, {7, "DtoA"}, {8, "DtoD"}, {9, "HtoH"}, {10, "PtoP"}};
  const bool memset = std::strcmp(table, "CUPTI_ACTIVITY_KIND_MEMSET") == 0;
  while (q.next()) {
    DeviceRow r;
    if (!times(q, table, r.start, r.end)) continue;
    r.kind = kind;
    r.device = q.integer(2);
    r.stream = q.integer(3);
    r.process = process_of(q.integer(4));
    r.bytes = std::max<int64_t>(0, q.integer(5));
    if (!q.is_null(6)) r.correlation = q.integer(6);
    std::string name = memset ? "Memset" : "Memcpy";
    if (!memset && !q.is_null(7)) {
      auto it = kCopy.find(q.integer(7));
      if (it != kCopy.end()) name += std::string(" ") + it->second;
    }
    r.name = d_.trace.strings.intern(name);
    out.push_back(r);
  }
}

void FileReader::run() {
  const KernelTable kt = check_kernel_table();
  std::vector<DeviceRow> rows = read_kernels(kt);
  read_device_table("CUPTI_ACTIVITY_KIND_MEMCPY", SpanKind::Memcpy, rows);
  read_device_table("CUPTI_ACTIVITY_KIND_MEMSET", SpanKind::Memcpy, rows);
  Ranks rank_of = assign_ranks(rows);
  const Launches launch = launch_times();
  const std::vector<NvtxRow> nvtx = read_nvtx(rank_of);
  Streams streams = assign_streams(rows, nvtx, rank_of);
  const size_t first_span = d_.spans.size();
  add_device_spans(rows, rank_of, streams, launch);
  attach_work(rows, rank_of, launch, shaped_ranges(nvtx), first_span);
  add_nvtx_spans(nvtx, rank_of, streams);
  // The GPUs' names (TARGET_INFO_GPU), which say the device preset calibrate fits.
  if (optional_table(db_, "TARGET_INFO_GPU", {"name"})) {
    Db::Query q(db_, "SELECT name FROM TARGET_INFO_GPU");
    while (q.next()) {
      if (q.is_null(0)) continue;
      const std::string n = q.text(0);
      if (!n.empty() && std::find(d_.devices.begin(), d_.devices.end(), n) == d_.devices.end())
        d_.devices.push_back(n);
    }
  }
}

FileReader::ShapedRanges FileReader::shaped_ranges(const std::vector<NvtxRow>& nvtx) {
  ShapedRanges out;
  for (size_t i = 0; i < nvtx.size(); ++i) {
    const auto parsed = parse_nvtx_op(nvtx[i].text);
    if (!parsed) continue;
    const auto w = op_work(parsed->first, parsed->second);
    if (!w || (w->cls != "gemm" && w->cls != "attention")) continue;
    out[nvtx[i].tid].push_back(
        {nvtx[i].start, nvtx[i].end, static_cast<int64_t>(i), parsed->first, *w});
  }
  for (auto& [tid, v] : out)
    std::stable_sort(v.begin(), v.end(),
                     [](const ShapedRange& a, const ShapedRange& b) { return a.start < b.start; });
  return out;
}

const FileReader::ShapedRange* FileReader::launching_op(const ShapedRanges& ranges,
                                                        const Launch& l) {
  const auto it = ranges.find(l.tid);
  if (it == ranges.end()) return nullptr;
  const auto& v = it->second;
  // Ranges of one thread nest: the latest-starting one still open at the launch is the innermost.
  auto ub = std::upper_bound(v.begin(), v.end(), l.start,
                             [](int64_t t, const ShapedRange& r) { return t < r.start; });
  while (ub != v.begin()) {
    --ub;
    if (ub->end >= l.start) return &*ub;
  }
  return nullptr;
}

// Compute kernels launched inside a shaped NVTX range: each its share of the range's op work
// (spans [first_span, ...) of the draft are `rows`, in order, but for the rows of no rank).
void FileReader::attach_work(const std::vector<DeviceRow>& rows, const Ranks& rank_of,
                             const Launches& launch, const ShapedRanges& ranges,
                             size_t first_span) {
  if (ranges.empty()) return;
  std::vector<const ShapedRange*> op_of(d_.spans.size() - first_span, nullptr);
  std::map<int64_t, int> kernels;  // per group
  size_t span = first_span;
  for (const auto& r : rows) {
    if (!rank_of.count(r.process)) continue;  // add_device_spans skipped it
    if (span >= d_.spans.size()) break;
    const size_t at = span++ - first_span;
    if (r.kind != SpanKind::Compute || !r.correlation) continue;
    const auto l = launch.find({r.process, *r.correlation});
    if (l == launch.end()) continue;
    op_of[at] = launching_op(ranges, l->second);
    if (op_of[at]) kernels[op_of[at]->group] += 1;
  }
  for (size_t i = 0; i < op_of.size(); ++i) {
    const ShapedRange* op = op_of[i];
    if (!op) continue;
    detail::DraftSpan& s = d_.spans[first_span + i];
    const double share = 1.0 / std::max(1, kernels[op->group]);
    s.span.flops = op->work.flops * share;
    s.span.bytes = static_cast<int64_t>(std::llround(op->work.bytes * share));
    KernelWork k;
    k.group = op->group;
    k.op = op->op;
    k.work = op->work;
    s.work = static_cast<int32_t>(d_.works.size());
    d_.works.push_back(std::move(k));
  }
}

// Required: the kernel table and the strings it refers to.
FileReader::KernelTable FileReader::check_kernel_table() {
  const auto sid_cols = optional_table(db_, "StringIds", {"id", "value"});
  if (!db_.has_table(kKernelTable)) {
    throw InputError(db_.path() + ": no table " + kKernelTable +
                     " (an nsys export without CUDA kernels: profile with --trace=cuda)");
  }
  const auto kcols = db_.columns(kKernelTable);
  for (const char* c : {"start", "end", "deviceId", "streamId", "globalPid"}) {
    if (!kcols.count(c)) {
      throw InputError(db_.path() + ": table " + kKernelTable + " has no column " + c);
    }
  }
  KernelTable kt;
  kt.name_col = kcols.count("shortName")       ? "shortName"
                : kcols.count("demangledName") ? "demangledName"
                                               : nullptr;
  if (!kt.name_col) {
    throw InputError(db_.path() + ": table " + kKernelTable +
                     " has no column shortName or demangledName");
  }
  if (!sid_cols)
    throw InputError(db_.path() + ": no table StringIds(id, value) for the kernel names");
  {
    Db::Query q(db_, "SELECT id, value FROM StringIds");
    while (q.next()) strings_.emplace(q.integer(0), q.text(1));
  }
  kt.has_correlation = kcols.count("correlationId") > 0;
  return kt;
}

std::vector<DeviceRow> FileReader::read_kernels(const KernelTable& kt) {
  std::vector<DeviceRow> rows;
  Db::Query q(db_, std::string("SELECT start, end, deviceId, streamId, globalPid, ") + kt.name_col +
                       (kt.has_correlation ? ", correlationId" : ", NULL") + " FROM " +
                       kKernelTable);
  while (q.next()) {
    DeviceRow r;
    if (!times(q, kKernelTable, r.start, r.end)) continue;
    r.device = q.integer(2);
    r.stream = q.integer(3);
    r.process = process_of(q.integer(4));
    if (!q.is_null(6)) r.correlation = q.integer(6);
    // Names are StringIds ids; some exports write the text itself.
    std::string name;
    if (q.is_int(5)) {
      const int64_t id = q.integer(5);
      auto it = kernel_names_.find(id);
      if (it == kernel_names_.end()) {
        it = kernel_names_.emplace(id, d_.trace.strings.intern(lookup(id))).first;
      }
      r.name = it->second;
      name = d_.trace.strings.str(r.name);
    } else {
      name = q.text(5);
      r.name = d_.trace.strings.intern(name);
    }
    const auto nccl = detail::nccl_kernel_op(name);
    r.kind = nccl ? detail::kind_of_op(*nccl) : SpanKind::Compute;
    r.op = nccl ? *nccl : CollOp::None;
    rows.push_back(r);
  }
  return rows;
}

// Ranks: the processes that ran kernels, by lowest device, then pid.
FileReader::Ranks FileReader::assign_ranks(const std::vector<DeviceRow>& rows) {
  std::map<int64_t, int64_t> min_device;  // process -> lowest deviceId
  for (const auto& r : rows) {
    if (r.kind == SpanKind::Memcpy) continue;
    auto [it, inserted] = min_device.emplace(r.process, r.device);
    if (!inserted) it->second = std::min(it->second, r.device);
  }
  std::vector<std::pair<int64_t, int64_t>> order;  // (device, process)
  for (const auto& [p, dev] : min_device) order.emplace_back(dev, p);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : pid_of(a.second) < pid_of(b.second);
  });
  Ranks rank_of;
  for (const auto& [dev, p] : order) {
    const int32_t rank = next_rank_++;
    rank_of[p] = rank;
    RankInfo ri;
    ri.rank = rank;
    ri.device = "cuda:" + std::to_string(dev);
    d_.trace.ranks.push_back(ri);
  }
  return rank_of;
}

// Host launch times, for the step of device work.
FileReader::Launches FileReader::launch_times() {
  Launches launch;
  if (optional_table(db_, "CUPTI_ACTIVITY_KIND_RUNTIME", {"start", "correlationId", "globalTid"})) {
    Db::Query q(db_, "SELECT start, correlationId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME");
    while (q.next()) {
      int64_t t = 0;
      if (!q.is_int(0) || __builtin_add_overflow(q.integer(0), offset_, &t)) continue;
      launch.emplace(std::make_pair(process_of(q.integer(2)), q.integer(1)),
                     Launch{t, q.integer(2)});
    }
  }
  return launch;
}

// NVTX push/pop and start/end ranges of the ranks' processes.
std::vector<NvtxRow> FileReader::read_nvtx(const Ranks& rank_of) {
  std::vector<NvtxRow> nvtx;
  auto cols = optional_table(db_, "NVTX_EVENTS", {"start", "end", "eventType", "globalTid"});
  if (!cols) return nvtx;
  const bool has_text = cols->count("text") > 0, has_text_id = cols->count("textId") > 0;
  if (!has_text && !has_text_id) return nvtx;
  Db::Query q(db_, std::string("SELECT start, end, globalTid, eventType, ") +
                       (has_text ? "text" : "NULL") + ", " + (has_text_id ? "textId" : "NULL") +
                       " FROM NVTX_EVENTS");
  while (q.next()) {
    const int64_t type = q.integer(3);
    if (type != kNvtxPushPopRange && type != kNvtxStartEndRange) continue;
    NvtxRow r;
    if (!times(q, "NVTX_EVENTS", r.start, r.end)) continue;
    r.tid = q.integer(2);
    if (!rank_of.count(process_of(r.tid))) {
      d_.skipped_events += 1;  // a process without kernels is not a rank
      continue;
    }
    r.text = !q.is_null(4) ? q.text(4) : !q.is_null(5) ? lookup(q.integer(5)) : std::string();
    nvtx.push_back(std::move(r));
  }
  return nvtx;
}

std::unordered_map<int64_t, std::string> FileReader::thread_names() {
  std::unordered_map<int64_t, std::string> names;
  if (optional_table(db_, "ThreadNames", {"nameId", "globalTid"})) {
    Db::Query q(db_, "SELECT nameId, globalTid FROM ThreadNames");
    while (q.next()) names[q.integer(1)] = lookup(q.integer(0));
  }
  return names;
}

// Streams per rank: device streams by (device, stream), then host threads by tid.
FileReader::Streams FileReader::assign_streams(const std::vector<DeviceRow>& rows,
                                               const std::vector<NvtxRow>& nvtx, Ranks& rank_of) {
  const std::unordered_map<int64_t, std::string> names = thread_names();
  Streams st;
  for (const auto& r : rows) {
    auto it = rank_of.find(r.process);
    if (it != rank_of.end()) st.device[it->second][{r.device, r.stream}] = -1;
  }
  for (const auto& r : nvtx) st.host[rank_of[process_of(r.tid)]][r.tid] = -1;
  for (const auto& [p, rank] : rank_of) {
    int32_t next = 0;
    std::set<int64_t> devices;
    for (const auto& [k, id] : st.device[rank]) devices.insert(k.first);
    for (auto& [k, id] : st.device[rank]) {
      id = next++;
      std::string name = "stream " + std::to_string(k.second);
      if (devices.size() > 1) name = "device " + std::to_string(k.first) + " " + name;
      d_.trace.streams.push_back({rank, id, name});
    }
    for (auto& [tid, id] : st.host[rank]) {
      id = next++;
      auto it = names.find(tid);
      d_.trace.streams.push_back(
          {rank, id, it != names.end() ? it->second : "thread " + std::to_string(tid_of(tid))});
    }
  }
  return st;
}

// Kernels and copies, in their tables' order; the step is that of their launch when known.
void FileReader::add_device_spans(const std::vector<DeviceRow>& rows, const Ranks& rank_of,
                                  Streams& streams, const Launches& launch) {
  for (const auto& r : rows) {
    auto it = rank_of.find(r.process);
    if (it == rank_of.end()) {
      d_.skipped_events += 1;  // a copy by a process that ran no kernel
      continue;
    }
    detail::DraftSpan s;
    s.span.rank = it->second;
    s.span.stream = streams.device[it->second][{r.device, r.stream}];
    s.span.kind = r.kind;
    s.span.op = r.op;
    s.span.name = r.name;
    s.span.start_ns = r.start;
    s.span.end_ns = r.end;
    s.span.bytes = r.kind == SpanKind::Memcpy ? r.bytes : 0;
    s.issue_ns = r.start;
    if (r.correlation) {
      auto l = launch.find({r.process, *r.correlation});
      if (l != launch.end()) s.issue_ns = l->second.start;
    }
    d_.spans.push_back(s);
  }
}

// NVTX ranges as phases; "step N" ranges are steps.
void FileReader::add_nvtx_spans(const std::vector<NvtxRow>& nvtx, Ranks& rank_of,
                                Streams& streams) {
  for (const auto& r : nvtx) {
    const int32_t rank = rank_of[process_of(r.tid)];
    detail::DraftSpan s;
    s.span.rank = rank;
    s.span.stream = streams.host[rank][r.tid];
    s.span.kind = SpanKind::Phase;
    const auto step = detail::parse_step_name(r.text);
    s.span.name = d_.trace.strings.intern(step ? std::string("step") : r.text);
    s.span.step = step ? *step : -1;
    s.span.start_ns = r.start;
    s.span.end_ns = r.end;
    s.issue_ns = r.start;
    d_.spans.push_back(s);
  }
}

}  // namespace

Trace import_nsys(const std::vector<std::string>& files) {
  if (files.empty()) throw InputError("import nsys: no input files");
  // Session start times align several files; used only when every file has one.
  std::vector<std::optional<int64_t>> starts;
  bool all = true;
  for (const auto& f : files) {
    Db db(f);
    starts.push_back(session_start_ns(db));
    all = all && starts.back().has_value();
  }
  detail::Draft d;
  d.format = ImportFormat::Nsys;
  d.files = files;
  int32_t next_rank = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    FileReader(files[i], all ? *starts[i] : 0, d, next_rank).run();
  }
  if (all) d.unix_origin_ns = 0;
  return detail::finish_import(std::move(d));
}

}  // namespace orrery::traces
