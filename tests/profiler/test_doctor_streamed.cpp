// diagnose_traces (the streamed `orrery doctor`) against the in-memory diagnosis it replaces,
// diagnose(load_doctor_input(...)): the same paragraph, findings, matched count and record count,
// on synthetic traces written in small blocks (so that the blocks of all ranks interleave), merged
// or one file per rank, with flight records, on clean runs, a straggler, a rank that never joined,
// op and size mismatches, pipeline transfers, a communicator of unknown membership; streamed on
// all of them, and on a rank whose spans arrive out of seq order, falling back to the same answer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "orrery/profiler/doctor.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"

namespace orrery::profiler {
namespace {

namespace fs = std::filesystem;
using traces::CollOp;
using traces::Span;
using traces::SpanKind;

std::string temp_trace(const std::string& name) {
  return (fs::temp_directory_path() /
          ("orrery_doctor_" + std::to_string(::getpid()) + "_" + name + ".db"))
      .string();
}

// A trace and the flight records each rank dumped.
struct RunRecords {
  traces::Trace trace;
  std::vector<FlightRecord> flights;
};

// Writes `spans` of `t` to `path` in blocks of at most `batch` spans per flush.
void write_spans(const traces::Trace& t, const std::vector<Span>& spans, const std::string& path,
                 size_t batch) {
  traces::TraceWriter w(path, batch);
  w.set_meta(t.meta);
  for (const auto& r : t.ranks) w.add_rank(r);
  for (const auto& s : t.streams) w.add_stream(s);
  for (const auto& c : t.comms) w.add_communicator(c);
  for (const auto& s : t.strings.all()) w.intern(s);
  w.add_spans(spans);
  w.close();
}

void write_flights(const std::string& path, const std::vector<FlightRecord>& flights,
                   int32_t only_rank) {
  std::map<int32_t, std::vector<FlightRecord>> by_rank;
  for (const auto& f : flights)
    if (only_rank < 0 || f.rank == only_rank) by_rank[f.rank].push_back(f);
  for (const auto& [rank, v] : by_rank) write_flight_records(path, rank, v);
}

// The run as one merged file, or one file per rank (as a run that died leaves them).
std::vector<std::string> write_run(const RunRecords& run, const std::string& name, bool per_rank,
                                   size_t batch) {
  std::vector<std::string> files;
  if (!per_rank) {
    files.push_back(temp_trace(name));
    write_spans(run.trace, run.trace.spans, files.back(), batch);
    write_flights(files.back(), run.flights, -1);
    return files;
  }
  for (const auto& r : run.trace.ranks) {
    std::vector<Span> mine;
    for (const auto& s : run.trace.spans)
      if (s.rank == r.rank) mine.push_back(s);
    files.push_back(temp_trace(name + ".rank" + std::to_string(r.rank)));
    write_spans(run.trace, mine, files.back(), batch);
    write_flights(files.back(), run.flights, r.rank);
  }
  return files;
}

void remove_all(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    fs::remove(f);
    fs::remove(f + "-wal");
    fs::remove(f + "-shm");
  }
}

// Streamed and in-memory answers equal, field by field; returns the streamed one.
DoctorResult expect_same(const std::vector<std::string>& files, bool expect_streamed,
                         const DoctorOptions& opt = {}) {
  const DoctorInput in = load_doctor_input(files);
  const DoctorReport want = diagnose(in, opt);
  const DoctorResult got = diagnose_traces(files, opt);
  EXPECT_EQ(got.streamed, expect_streamed);
  EXPECT_EQ(got.records, static_cast<int64_t>(in.records.size()));
  EXPECT_EQ(got.report.paragraph, want.paragraph);
  EXPECT_EQ(got.report.collectives_matched, want.collectives_matched);
  EXPECT_EQ(got.report.findings.size(), want.findings.size());
  for (size_t i = 0; i < std::min(got.report.findings.size(), want.findings.size()); ++i) {
    const DoctorFinding &a = got.report.findings[i], &b = want.findings[i];
    SCOPED_TRACE("finding " + std::to_string(i));
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.comm, b.comm);
    EXPECT_EQ(a.seq, b.seq);
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.ranks, b.ranks);
    EXPECT_EQ(a.text, b.text);
  }
  return got;
}

traces::SynthOptions ddp(int32_t ranks, int32_t steps) {
  traces::SynthOptions o;
  o.ranks = ranks;
  o.steps = steps;
  o.layers = 4;
  o.layers_per_bucket = 1;  // 4 all-reduces per step: seq = 4 * step + bucket
  o.jitter_ns = 50'000;
  return o;
}

FlightRecord flight(const Span& s, FlightState st) {
  FlightRecord r;
  r.rank = s.rank;
  r.comm = s.comm;
  r.seq = s.seq;
  r.op = s.op;
  r.bytes = s.bytes;
  r.step = s.step;
  r.state = st;
  r.scheduled_ns = s.start_ns;
  r.started_ns = st == FlightState::Scheduled ? 0 : s.start_ns;
  r.completed_ns = st == FlightState::Completed ? s.end_ns : 0;
  return r;
}

// A run that hangs at all-reduce `hang_seq`: every rank's spans end before it, each rank's last
// `ring` collectives are in its flight records (completed), and at `hang_seq` the ranks in
// `joined` have a started record made by `joined_as` (its op or size changed for mismatches).
template <typename JoinedAs>
RunRecords hung_run(int32_t ranks, int32_t steps, int64_t hang_seq,
                    const std::vector<int32_t>& joined, int ring, JoinedAs&& joined_as) {
  RunRecords run{traces::synthesize(ddp(ranks, steps)), {}};
  std::vector<Span> kept;
  std::map<int32_t, std::vector<Span>> colls;
  for (const auto& s : run.trace.spans) {
    if (s.kind == SpanKind::Collective && s.seq >= hang_seq) {
      if (s.seq == hang_seq) colls[-1 - s.rank].push_back(s);  // the hung one, per rank
      continue;
    }
    if (s.kind == SpanKind::Collective) colls[s.rank].push_back(s);
    kept.push_back(s);
  }
  run.trace.spans = kept;
  for (int32_t r = 0; r < ranks; ++r) {
    const auto& v = colls[r];
    for (size_t i = v.size() > size_t(ring) ? v.size() - ring : 0; i < v.size(); ++i) {
      run.flights.push_back(flight(v[i], FlightState::Completed));
      // Rank 2's flight records say it started 250 ms late, its spans on time: which of the two
      // counts (the flight record) decides whether it straggles there.
      if (r == 2) run.flights.back().started_ns += 250'000'000;
    }
  }
  for (int32_t r : joined) {
    FlightRecord f = flight(colls[-1 - r].at(0), FlightState::Started);
    joined_as(f);
    run.flights.push_back(f);
  }
  return run;
}

struct Layout {
  bool per_rank;
  size_t batch;
};
const Layout kLayouts[] = {{false, 37}, {false, 1 << 16}, {true, 53}};

TEST(DoctorStreamed, CleanRunMatchesEveryCollective) {
  for (const Layout& l : kLayouts) {
    RunRecords run{traces::synthesize(ddp(4, 40)), {}};
    const auto files = write_run(run, "clean", l.per_rank, l.batch);
    const DoctorResult got = expect_same(files, true);
    // Small blocks: the records are dropped as the collectives are judged (108 of 640 held at
    // most merged, 212 per rank); one block per stream holds them all.
    if (l.batch < 100) EXPECT_LT(got.peak_held * 2, size_t(got.records));
    EXPECT_EQ(got.report.collectives_matched, 40 * 4);  // steps x buckets
    EXPECT_EQ(got.records, 4 * 40 * 4);                 // ranks x steps x buckets
    EXPECT_TRUE(got.report.findings.empty());
    remove_all(files);
  }
}

TEST(DoctorStreamed, Straggler) {
  for (const Layout& l : kLayouts) {
    traces::SynthOptions o = ddp(4, 30);
    o.straggler_rank = 2;
    o.straggler_delay_ns = 300'000'000;
    RunRecords run{traces::synthesize(o), {}};
    const auto files = write_run(run, "straggler", l.per_rank, l.batch);
    const DoctorResult got = expect_same(files, true);
    ASSERT_EQ(got.report.findings.size(), 1u);
    EXPECT_EQ(got.report.findings[0].kind, "straggler");
    EXPECT_EQ(got.report.findings[0].ranks, std::vector<int32_t>{2});
    remove_all(files);
  }
}

TEST(DoctorStreamed, RankNeverJoined) {
  for (const Layout& l : kLayouts) {
    const RunRecords run = hung_run(4, 25, 61, {0, 2, 3}, 8, [](FlightRecord&) {});
    const auto files = write_run(run, "missing", l.per_rank, l.batch);
    const DoctorResult got = expect_same(files, true);
    ASSERT_FALSE(got.report.findings.empty());
    EXPECT_EQ(got.report.findings[0].kind, "missing");
    EXPECT_EQ(got.report.findings[0].seq, 61);
    EXPECT_EQ(got.report.findings[0].ranks, std::vector<int32_t>{1});
    EXPECT_EQ(got.report.collectives_matched, 61);
    // Rank 2 late in its 8 flight records (seqs 53..60), not in its spans.
    EXPECT_EQ(got.report.findings.back().kind, "straggler");
    EXPECT_EQ(got.report.findings.back().seq, 53);
    EXPECT_NE(got.report.paragraph.find("at 8 of 61 matched"), std::string::npos);
    remove_all(files);
  }
}

// Rank 1 left no spans, only its flight records (seqs 53..60): before them it was evicted from
// its ring, not absent, so the collectives there still match.
TEST(DoctorStreamed, EvictedFromTheRing) {
  for (const Layout& l : kLayouts) {
    RunRecords run = hung_run(4, 25, 61, {0, 2, 3}, 8, [](FlightRecord&) {});
    std::erase_if(run.trace.spans,
                  [](const Span& s) { return s.rank == 1 && s.kind == SpanKind::Collective; });
    const auto files = write_run(run, "evicted", l.per_rank, l.batch);
    const DoctorResult got = expect_same(files, true);
    EXPECT_EQ(got.report.collectives_matched, 61);
    EXPECT_EQ(got.report.findings.at(0).kind, "missing");
    remove_all(files);
  }
}

TEST(DoctorStreamed, OpAndSizeMismatch) {
  for (const Layout& l : kLayouts) {
    const RunRecords ops = hung_run(4, 25, 42, {0, 1, 2, 3}, 5, [](FlightRecord& f) {
      if (f.rank == 3) f.op = CollOp::AllGather;
    });
    const RunRecords sizes = hung_run(4, 25, 42, {0, 1, 2, 3}, 5, [](FlightRecord& f) {
      if (f.rank == 0) f.bytes += 4;
    });
    const auto a = write_run(ops, "ops", l.per_rank, l.batch);
    const auto b = write_run(sizes, "sizes", l.per_rank, l.batch);
    EXPECT_EQ(expect_same(a, true).report.findings.at(0).kind, "op_mismatch");
    EXPECT_EQ(expect_same(b, true).report.findings.at(0).kind, "size_mismatch");
    remove_all(a);
    remove_all(b);
  }
}

TEST(DoctorStreamed, PipelineTransfersAndUnknownMembership) {
  for (const Layout& l : kLayouts) {
    traces::SynthOptions o = ddp(8, 12);
    o.pp = 2;
    o.jitter_ns = 0;
    RunRecords run{traces::synthesize(o), {}};
    const auto files = write_run(run, "pp", l.per_rank, l.batch);
    expect_same(files, true);
    remove_all(files);
    for (auto& c : run.trace.comms) c.ranks.clear();  // membership from who recorded
    const auto unknown = write_run(run, "unknown", l.per_rank, l.batch);
    expect_same(unknown, true);
    remove_all(unknown);
  }
}

TEST(DoctorStreamed, OutOfSeqOrderFallsBackToTheSameAnswer) {
  RunRecords run = hung_run(4, 25, 70, {1, 2, 3}, 6, [](FlightRecord&) {});
  // Rank 0's all-reduces #3 and #60 trade seqs: #60 arrives long before the others reach it, #3
  // long after every other rank passed it.
  for (auto& s : run.trace.spans) {
    if (s.rank != 0 || s.kind != SpanKind::Collective) continue;
    if (s.seq == 3)
      s.seq = 60;
    else if (s.seq == 60)
      s.seq = 3;
  }
  const auto files = write_run(run, "reorder", false, 37);
  expect_same(files, false);
  remove_all(files);
}

}  // namespace
}  // namespace orrery::profiler
