// Trace integrity (schema 3): every span block and counter block carries a CRC32C of its key,
// count and packed bytes. Each single-bit flip of one block's packed bytes (every bit in turn, by an
// SQL UPDATE of the blob on a copy of a trace written through the store) is an InputError naming the
// file and the block, from load_all(), from the queries and from verify(); a schema-2 file (no
// checksums) still opens; reseal_block_checksums() lets damage reach the decoder.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "orrery/common/crc32c.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/store.hpp"
#include "test_util.hpp"

namespace orrery::traces {
namespace {

using testing::make_trace;
using testing::same_span;
using testing::TempDir;

// A read-write connection for damaging a file on purpose.
class Db {
 public:
  explicit Db(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
    exec("PRAGMA synchronous=OFF");  // thousands of one-row updates: no need to reach the disk
  }
  ~Db() { sqlite3_close(db_); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  std::vector<unsigned char> blob(const std::string& table, int64_t id) {
    std::vector<unsigned char> out;
    sqlite3_stmt* st = nullptr;
    const std::string sql = "SELECT packed FROM " + table + " WHERE id=?1";
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr), SQLITE_OK);
    sqlite3_bind_int64(st, 1, id);
    if (sqlite3_step(st) == SQLITE_ROW) {
      const auto* p = static_cast<const unsigned char*>(sqlite3_column_blob(st, 0));
      out.assign(p, p + sqlite3_column_bytes(st, 0));
    }
    sqlite3_finalize(st);
    return out;
  }
  void set_blob(const std::string& table, int64_t id, const std::vector<unsigned char>& bytes) {
    sqlite3_stmt* st = nullptr;
    const std::string sql = "UPDATE " + table + " SET packed=?1 WHERE id=?2";
    ASSERT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr), SQLITE_OK);
    sqlite3_bind_blob(st, 1, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, id);
    ASSERT_EQ(sqlite3_step(st), SQLITE_DONE);
    ASSERT_EQ(sqlite3_changes(db_), 1);
    sqlite3_finalize(st);
  }
  int64_t integer(const std::string& sql) {
    sqlite3_stmt* st = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
    int64_t v = -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
  }
  void exec(const std::string& sql) {
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK)
        << sql << ": " << (err ? err : "");
    sqlite3_free(err);
  }

 private:
  sqlite3* db_ = nullptr;
};

// The InputError message of `fn`, or "(no InputError)".
template <typename Fn>
std::string input_error_of(Fn fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

// The small trace of these tests: 2 ranks, 2 streams, 12 spans per stream (one block each),
// 20 memory samples per rank (one counter block each), written through TraceWriter.
std::string write_small_trace(const TempDir& dir, const Trace& t) {
  const auto path = dir.path("t.db");
  write_trace(t, path);
  return path;
}

TEST(Integrity, EveryBlockCarriesItsCrc) {
  TempDir dir;
  const Trace t = make_trace(2, 12);
  const auto path = write_small_trace(dir, t);
  TraceReader r(path);
  EXPECT_EQ(r.schema_version(), 3);
  EXPECT_TRUE(r.checksums());
  const auto v = r.verify();
  EXPECT_TRUE(v.checksums);
  EXPECT_EQ(v.span_blocks, 4);
  EXPECT_EQ(v.spans, 48);
  EXPECT_EQ(v.counter_blocks, 2);
  EXPECT_EQ(v.counter_samples, 40);
  EXPECT_TRUE(v.damaged.empty());
  // The stored value is CRC32C of (rank, stream as 32-bit LE, count as 64-bit LE, packed bytes).
  Db db(path);
  const int64_t id = db.integer("SELECT id FROM blocks WHERE rank=1 AND stream=0");
  const auto bytes = db.blob("blocks", id);
  const unsigned char head[16] = {1, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0};
  const uint32_t want = crc32c(bytes.data(), bytes.size(), crc32c(head, sizeof head));
  EXPECT_EQ(db.integer("SELECT crc32c FROM blocks WHERE id=" + std::to_string(id)),
            static_cast<int64_t>(want));
  // Counters round-trip through their blocks in (rank, name, time) order.
  const auto back = r.counters();
  ASSERT_EQ(back.size(), t.counters.size());
  for (size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].rank, t.counters[i].rank);
    EXPECT_EQ(back[i].ts_ns, t.counters[i].ts_ns);
    EXPECT_EQ(back[i].value, t.counters[i].value);
  }
}

// Flips each bit of the packed bytes of block `id` of `table` in turn (restoring it after) and
// expects every reader path given by `read` and verify() to name the file and `label`.
template <typename Read>
void expect_every_flip_detected(const std::string& path, const std::string& table, int64_t id,
                                const std::string& label, Read read) {
  Db db(path);
  const std::vector<unsigned char> good = db.blob(table, id);
  ASSERT_FALSE(good.empty());
  int detected = 0, verified = 0;
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    std::vector<unsigned char> bad = good;
    bad[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    db.set_blob(table, id, bad);
    TraceReader r(path);
    const std::string msg = input_error_of([&] { read(r); });
    if (msg.find(path + ": corrupt trace (" + label + ": checksum mismatch") == 0) ++detected;
    const auto v = r.verify();
    if (v.damaged.size() == 1 && v.damaged[0].find(label + ": checksum mismatch") == 0) ++verified;
    EXPECT_EQ(msg.find(path + ": corrupt trace (" + label + ": checksum mismatch"), 0u)
        << "bit " << bit << ": " << msg;
  }
  EXPECT_EQ(detected, static_cast<int>(good.size() * 8));
  EXPECT_EQ(verified, static_cast<int>(good.size() * 8));
  db.set_blob(table, id, good);
  EXPECT_TRUE(TraceReader(path).verify().damaged.empty());
}

TEST(Integrity, EveryBitFlipInASpanBlockIsDetected) {
  TempDir dir;
  const Trace t = make_trace(2, 12);
  const auto path = write_small_trace(dir, t);
  int64_t id = 0;
  {
    Db db(path);
    id = db.integer("SELECT id FROM blocks WHERE rank=1 AND stream=1");
  }
  const std::string label = "span block " + std::to_string(id) + " (rank 1, stream 1)";
  expect_every_flip_detected(path, "blocks", id, label,
                             [](const TraceReader& r) { (void)r.load_all(); });
  // The window and communicator queries check the same block.
  Db db(path);
  const auto good = db.blob("blocks", id);
  auto bad = good;
  bad[bad.size() / 2] ^= 0x10;
  db.set_blob("blocks", id, bad);
  TraceReader r(path);
  for (const std::string& msg :
       {input_error_of([&] { (void)r.spans_in_window(1, 1, 0, int64_t{1} << 62); }),
        input_error_of([&] { (void)r.collectives_of(0); })}) {
    EXPECT_EQ(msg.find(path + ": corrupt trace (" + label + ": checksum mismatch"), 0u) << msg;
  }
  // Other streams' blocks still read.
  EXPECT_EQ(r.spans_in_window(0, 1, 0, int64_t{1} << 62).size(), 12u);
}

TEST(Integrity, EveryBitFlipInACounterBlockIsDetected) {
  TempDir dir;
  const Trace t = make_trace(2, 12);
  const auto path = write_small_trace(dir, t);
  int64_t id = 0, name = 0;
  {
    Db db(path);
    id = db.integer("SELECT id FROM counter_blocks WHERE rank=1");
    name = db.integer("SELECT name FROM counter_blocks WHERE rank=1");
  }
  const std::string label = "counter block " + std::to_string(id) + " (rank 1, counter name id " +
                            std::to_string(name) + ")";
  expect_every_flip_detected(path, "counter_blocks", id, label,
                             [](const TraceReader& r) { (void)r.counters(); });
  // load_all reads the counters too.
  Db db(path);
  auto bad = db.blob("counter_blocks", id);
  bad[0] ^= 1;
  db.set_blob("counter_blocks", id, bad);
  const std::string msg = input_error_of([&] { (void)TraceReader(path).load_all(); });
  EXPECT_EQ(msg.find(path + ": corrupt trace (" + label + ": checksum mismatch"), 0u) << msg;
}

TEST(Integrity, DamagedKeyAndIndexColumnsAreFound) {
  TempDir dir;
  const Trace t = make_trace(2, 12);
  const auto path = write_small_trace(dir, t);
  Db db(path);
  const int64_t id = db.integer("SELECT id FROM blocks WHERE rank=0 AND stream=0");
  // A block moved to another stream by a damaged rank column fails its checksum (the key is
  // covered); a damaged index column is not covered but verify() finds it.
  db.exec("UPDATE blocks SET stream=5 WHERE id=" + std::to_string(id));
  std::string msg = input_error_of([&] { (void)TraceReader(path).load_all(); });
  EXPECT_NE(msg.find("span block " + std::to_string(id) + " (rank 0, stream 5): checksum mismatch"),
            std::string::npos)
      << msg;
  db.exec("UPDATE blocks SET stream=0, max_dur_ns=max_dur_ns+1 WHERE id=" + std::to_string(id));
  EXPECT_NO_THROW((void)TraceReader(path).load_all());
  const auto v = TraceReader(path).verify();
  ASSERT_EQ(v.damaged.size(), 1u);
  EXPECT_NE(v.damaged[0].find("its index column max_dur_ns is"), std::string::npos) << v.damaged[0];
  // A damaged checksum column is itself a mismatch.
  db.exec(
      "UPDATE blocks SET max_dur_ns=max_dur_ns-1, crc32c=(crc32c | 1) - (crc32c & 1) WHERE id=" +
      std::to_string(id));
  EXPECT_NE(TraceReader(path).verify().damaged.at(0).find("checksum mismatch"), std::string::npos);
}

// Rewrites, in the file's bytes, the rowid of the `cell`-th cell of the blocks table's root page
// (a leaf holding every block in these small traces; rowids under 128 are one-byte varints). The
// table's b-tree then disagrees with the blocks_by_stream index, as a damaged page can make it.
void set_block_rowid_in_page(const std::string& path, int cell, unsigned char rowid) {
  int64_t root = 0;
  {
    Db db(path);
    root = db.integer("SELECT rootpage FROM sqlite_master WHERE name='blocks'");
  }
  std::vector<unsigned char> file;
  {
    std::ifstream in(path, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(file.size(), 100u);
  size_t page_size = (size_t{file[16]} << 8) | file[17];
  if (page_size == 1) page_size = 65536;
  const size_t page = static_cast<size_t>(root - 1) * page_size;
  const size_t header = page + (root == 1 ? 100 : 0);
  ASSERT_LT(header + 8, file.size());
  ASSERT_EQ(file[header], 0x0D) << "the blocks table is not one leaf page";
  const int cells = (file[header + 3] << 8) | file[header + 4];
  ASSERT_LT(cell, cells);
  const size_t ptr = header + 8 + 2 * static_cast<size_t>(cell);
  size_t at = page + ((size_t{file[ptr]} << 8) | file[ptr + 1]);
  while (file[at] & 0x80) ++at;  // the payload-size varint
  ++at;
  ASSERT_EQ(file[at] & 0x80, 0) << "rowid is not a one-byte varint";
  file[at] = rowid;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
}

TEST(Integrity, TableAndIndexThatDisagreeAreCorruptNotACrash) {
  // Found by fuzz_trace: a rowid range scan trusts the page's order, so a cell whose rowid was
  // damaged to one below the range came back from the scan and was looked up at index -1.
  TempDir dir;
  const auto path = write_small_trace(dir, make_trace(2, 12));
  {
    Db db(path);
    ASSERT_EQ(db.integer("SELECT count(*) FROM blocks"), 4);
    ASSERT_EQ(db.integer("SELECT min(id) FROM blocks"), 1);
  }
  const auto good = dir.path("good.db");
  std::filesystem::copy_file(path, good);
  // Cells hold rowids 1, 2, 3, 4; the third becomes 0: the scan from id 1 meets 1, 2, 0, 4.
  set_block_rowid_in_page(path, 2, 0);
  std::string msg = input_error_of([&] { (void)TraceReader(path).load_all(); });
  EXPECT_EQ(msg.find(path + ": corrupt trace (span block 0 (rank "), 0u) << msg;
  EXPECT_NE(msg.find("): its id is not one the block index lists)"), std::string::npos) << msg;
  // The same cell given the rowid of the one before it: one id read twice.
  std::filesystem::copy_file(good, path, std::filesystem::copy_options::overwrite_existing);
  set_block_rowid_in_page(path, 2, 2);
  msg = input_error_of([&] { (void)TraceReader(path).load_all(); });
  EXPECT_EQ(msg.find(path + ": corrupt trace (span block 2 (rank "), 0u) << msg;
  EXPECT_NE(msg.find("): the table holds this id twice)"), std::string::npos) << msg;
  // Undamaged, the copy reads.
  EXPECT_EQ(TraceReader(good).load_all().spans.size(), 48u);
}

TEST(Integrity, RecordClaimingTooMuchIsAnInputError) {
  // Found by fuzz_trace (fuzz/corpus/fuzz_trace/regress-step-nomem.trace): a damaged record makes
  // SQLite fail the communicators' collectives query with "out of memory", which was reported as
  // an InternalError (exit 1, "ours") rather than the file's damage.
  const std::string path = std::string(ORRERY_TRACE_DATA) + "/damaged-record-nomem.db";
  TempDir dir;
  const auto copy = dir.path("nomem.db");
  std::filesystem::copy_file(path, copy);
  const std::string msg = input_error_of([&] {
    TraceReader r(copy);
    const auto comms = r.communicators();
    ASSERT_FALSE(comms.empty());
    (void)r.collectives_of(comms.front().id);
  });
  EXPECT_EQ(msg, copy + ": cannot read trace (out of memory while reading it: a damaged record " +
                     "claims more than the file holds, or the trace needs more memory than this " +
                     "machine has)");
}

TEST(Integrity, ResealLetsDamageReachTheDecoder) {
  TempDir dir;
  const auto path = write_small_trace(dir, make_trace(2, 12));
  Db db(path);
  const int64_t id = db.integer("SELECT id FROM blocks WHERE rank=0 AND stream=1");
  auto bytes = db.blob("blocks", id);
  bytes.pop_back();  // the last span's last varint is cut
  db.set_blob("blocks", id, bytes);
  reseal_block_checksums(path);
  const std::string msg = input_error_of([&] { (void)TraceReader(path).load_all(); });
  EXPECT_EQ(msg, path + ": corrupt trace (span block " + std::to_string(id) +
                     " (rank 0, stream 1): its bytes do not decode)");
}

TEST(Integrity, SchemaTwoFileStillOpens) {
  // Written by the schema-2 writer (`orrery synth --ranks 2 --steps 2 --layers 2`, the fuzz seed
  // fuzz/corpus/fuzz_trace/ddp2.trace): no checksums, counters one row per sample.
  const std::string path = std::string(ORRERY_TRACE_DATA) + "/schema2-ddp2.db";
  TraceReader r(path);
  EXPECT_EQ(r.schema_version(), 2);
  EXPECT_FALSE(r.checksums());
  EXPECT_EQ(r.span_count(), 44);
  EXPECT_EQ(r.counter_count(), 28);
  const Trace t = r.load_all();
  EXPECT_EQ(t.spans.size(), 44u);
  EXPECT_EQ(t.counters.size(), 28u);
  EXPECT_EQ(r.spans_in_window(1, 0, 0, int64_t{1} << 62).size(), 12u);
  const auto v = r.verify();
  EXPECT_FALSE(v.checksums);
  EXPECT_EQ(v.span_blocks, 6);
  EXPECT_EQ(v.spans, 44);
  EXPECT_EQ(v.counter_blocks, 0);
  EXPECT_EQ(v.counter_samples, 28);
  EXPECT_TRUE(v.damaged.empty());
  // Merged (rewritten) it becomes schema 3 with the same spans.
  TempDir dir;
  const auto out = dir.path("merged.db");
  merge_traces({path}, out);
  TraceReader m(out);
  EXPECT_TRUE(m.checksums());
  const Trace back = m.load_all();
  ASSERT_EQ(back.spans.size(), t.spans.size());
  for (size_t i = 0; i < t.spans.size(); ++i) EXPECT_TRUE(same_span(back.spans[i], t.spans[i]));
  EXPECT_EQ(m.counter_count(), 28);
  EXPECT_TRUE(m.verify().damaged.empty());
}

TEST(Integrity, SchemaTwoDamageIsStillFoundByTheDecoder) {
  TempDir dir;
  const auto path = dir.path("v2.db");
  std::filesystem::copy_file(std::string(ORRERY_TRACE_DATA) + "/schema2-ddp2.db", path);
  Db db(path);
  auto bytes = db.blob("blocks", 1);
  bytes.pop_back();
  db.set_blob("blocks", 1, bytes);
  const std::string msg = input_error_of([&] { (void)TraceReader(path).load_all(); });
  EXPECT_EQ(msg,
            path + ": corrupt trace (span block 1 (rank 0, stream 0): its bytes do not decode)");
  EXPECT_EQ(TraceReader(path).verify().damaged.size(), 1u);
  // Resealing is for schema 3 only.
  EXPECT_NE(input_error_of([&] { reseal_block_checksums(path); }).find("not a schema 3 trace"),
            std::string::npos);
}

}  // namespace
}  // namespace orrery::traces
