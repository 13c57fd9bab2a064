// orrery doctor's diagnosis on hand-built flight records: exact paragraphs.
#include <gtest/gtest.h>

#include "orrery/profiler/doctor.hpp"

namespace orrery::profiler {
namespace {

using traces::CollOp;

FlightRecord rec(int32_t rank, int64_t seq, CollOp op, int64_t bytes, FlightState st,
                 int64_t start_ns = 1000, int32_t step = 2) {
  FlightRecord r;
  r.rank = rank;
  r.comm = 0;
  r.seq = seq;
  r.op = op;
  r.bytes = bytes;
  r.step = step;
  r.state = st;
  r.scheduled_ns = start_ns;
  r.started_ns = st == FlightState::Scheduled ? 0 : start_ns;
  r.completed_ns = st == FlightState::Completed ? start_ns + 10 : 0;
  return r;
}

DoctorInput four_ranks() {
  DoctorInput in;
  traces::CommunicatorInfo c;
  c.id = 0;
  c.name = "world";
  c.ranks = {0, 1, 2, 3};
  in.comms[0] = c;
  for (int r = 0; r < 4; ++r) {
    in.records.push_back(rec(r, 0, CollOp::AllReduce, 64, FlightState::Completed));
  }
  return in;
}

TEST(Doctor, RankNeverJoined) {
  DoctorInput in = four_ranks();
  for (int r : {0, 2, 3}) in.records.push_back(rec(r, 1, CollOp::AllReduce, 64, FlightState::Started));
  const DoctorReport rep = diagnose(in);
  EXPECT_EQ(rep.paragraph,
            "Collective #1 on world (all_reduce, step 2) never completed: ranks 0, 2 and 3 joined "
            "it, rank 1 never did.");
  EXPECT_EQ(rep.collectives_matched, 1);
}

TEST(Doctor, OpMismatch) {
  DoctorInput in = four_ranks();
  for (int r : {0, 2, 3}) in.records.push_back(rec(r, 1, CollOp::AllReduce, 64, FlightState::Started));
  in.records.push_back(rec(1, 1, CollOp::AllGather, 64, FlightState::Scheduled));
  EXPECT_EQ(diagnose(in).paragraph,
            "Op mismatch at collective #1 on world (step 2): rank 1 called all_gather where ranks "
            "0, 2 and 3 called all_reduce.");
}

TEST(Doctor, SizeMismatch) {
  DoctorInput in = four_ranks();
  for (int r : {0, 1, 3}) in.records.push_back(rec(r, 1, CollOp::AllReduce, 64, FlightState::Started));
  in.records.push_back(rec(2, 1, CollOp::AllReduce, 132, FlightState::Scheduled));
  EXPECT_EQ(diagnose(in).paragraph,
            "Size mismatch at collective #1 on world (step 2), all_reduce: rank 2 passed 132 bytes "
            "where ranks 0, 1 and 3 passed 64 bytes.");
}

TEST(Doctor, Straggler) {
  DoctorInput in = four_ranks();
  for (int r = 0; r < 4; ++r) {
    const int64_t t = r == 3 ? 900'000'000 : 1000 + r;
    in.records.push_back(rec(r, 1, CollOp::AllReduce, 64, FlightState::Completed, t));
  }
  EXPECT_EQ(diagnose(in).paragraph,
            "Rank 3 straggles: it arrived last, 200 ms or more after the others, at 1 of 2 matched "
            "collectives (first at collective #1 on world (step 2)).");
}

TEST(Doctor, NothingWrong) {
  EXPECT_EQ(diagnose(four_ranks()).paragraph,
            "No problem found: 1 collectives matched on every member, none incomplete or "
            "mismatched, no rank 200 ms or more late.");
}

TEST(FlightRecorder, RingKeepsTheLastN) {
  FlightRecorder fr(3);
  uint64_t ids[5];
  for (int i = 0; i < 5; ++i) ids[i] = fr.scheduled(rec(0, i, CollOp::AllReduce, 8, FlightState::Scheduled));
  fr.started(ids[0], 5);  // evicted: ignored
  fr.completed(ids[4], 7);
  const auto s = fr.snapshot();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].seq, 2);
  EXPECT_EQ(s[2].seq, 4);
  EXPECT_EQ(s[2].state, FlightState::Completed);
  EXPECT_EQ(s[2].completed_ns, 7);
}

}  // namespace
}  // namespace orrery::profiler
