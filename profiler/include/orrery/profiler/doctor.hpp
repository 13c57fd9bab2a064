// `orrery doctor`: what went wrong in a run, from its flight records (and collective spans).
//
// Records of all ranks are matched by communicator and sequence number. For each communicator the
// first collective that did not complete on every member is the hang: the members without a record
// for it "never joined"; differing ops or sizes among those that did are a mismatch (the
// asymmetric-control-flow deadlock). Among collectives every member completed, a rank that started
// last by at least `straggler_ns` after the next-latest member is a straggler there. Timestamps
// are compared across ranks as they are (one host's steady clock).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "orrery/profiler/flight_recorder.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::profiler {

struct DoctorOptions {
  int64_t straggler_ns = 200'000'000;
};

struct DoctorFinding {
  std::string kind;  // "missing", "op_mismatch", "size_mismatch", "straggler"
  int32_t comm = -1;
  int64_t seq = -1;
  int32_t step = -1;
  std::vector<int32_t> ranks;  // the ranks at fault
  std::string text;            // one sentence
};

struct DoctorReport {
  std::vector<DoctorFinding> findings;
  int64_t collectives_matched = 0;  // (comm, seq) pairs complete on every member
  std::string paragraph;            // the findings' sentences, or "No problem found: ..."
};

struct DoctorInput {
  std::vector<FlightRecord> records;
  std::map<int32_t, traces::CommunicatorInfo> comms;  // by id: members in comm-rank order
};

DoctorReport diagnose(const DoctorInput& in, const DoctorOptions& opt = {});

// Reads trace files (a merged trace or per-rank files): flight records where present, else the
// collective spans as completed records; communicators from each file. The first record of a
// key (rank, comm, seq) counts: files in order, a file's flight records before its spans. Holds
// every record of every rank: diagnose_traces() streams instead, and uses this only as its
// fallback (and tests as its reference).
DoctorInput load_doctor_input(const std::vector<std::string>& trace_paths);

struct DoctorResult {
  DoctorReport report;
  int64_t records = 0;   // load_doctor_input(...).records.size(): the distinct keys read
  bool streamed = true;  // false: the data needed the in-memory fallback
  size_t peak_held = 0;  // most records held at once (the fallback: all of them)
};

// diagnose(load_doctor_input(trace_paths), opt), streamed: the span blocks of all files are read
// in one time order and a collective's records are dropped once it is judged, so memory is
// bounded by the collectives in flight (about a block of spans per rank and stream), the flight
// records and, per (rank, communicator), the runs of seqs it recorded, not by the span count.
// Spans of a rank and communicator that arrive out of seq order (or one key recorded both as a
// transfer and as a collective) are diagnosed by the in-memory path instead (`streamed` false);
// the result is the same either way.
DoctorResult diagnose_traces(const std::vector<std::string>& trace_paths,
                             const DoctorOptions& opt = {});

}  // namespace orrery::profiler
