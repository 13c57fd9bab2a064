// The diagnosis of `orrery doctor` (see doctor.hpp) and the reader of flight_records tables.
// diagnose chains named steps: index the records by (comm, seq, rank), walk each communicator's
// collectives (hang and mismatch findings, matched count, stragglers), then write the paragraph.
#include "orrery/profiler/doctor.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::profiler {

std::vector<FlightRecord> read_flight_records(const std::string& trace_path) {
  std::vector<FlightRecord> out;
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(trace_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  struct Close {
    sqlite3* d;
    ~Close() { sqlite3_close(d); }
  } closer{db};
  if (rc != SQLITE_OK) throw InputError(trace_path + ": cannot open: " + sqlite3_errstr(rc));
  sqlite3_busy_timeout(db, 2000);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db,
                         "SELECT rank, comm, seq, op, bytes, dtype, peer, step, state, "
                         "scheduled_ns, started_ns, completed_ns FROM flight_records",
                         -1, &st, nullptr) != SQLITE_OK) {
    return out;  // no table: a trace without flight records
  }
  while (sqlite3_step(st) == SQLITE_ROW) {
    FlightRecord r;
    r.rank = sqlite3_column_int(st, 0);
    r.comm = sqlite3_column_int(st, 1);
    r.seq = sqlite3_column_int64(st, 2);
    r.op = static_cast<traces::CollOp>(sqlite3_column_int(st, 3));
    r.bytes = sqlite3_column_int64(st, 4);
    r.dtype = sqlite3_column_int(st, 5);
    r.peer = sqlite3_column_int(st, 6);
    r.step = sqlite3_column_int(st, 7);
    r.state = static_cast<FlightState>(sqlite3_column_int(st, 8));
    r.scheduled_ns = sqlite3_column_int64(st, 9);
    r.started_ns = sqlite3_column_int64(st, 10);
    r.completed_ns = sqlite3_column_int64(st, 11);
    out.push_back(r);
  }
  sqlite3_finalize(st);
  return out;
}

DoctorInput load_doctor_input(const std::vector<std::string>& trace_paths) {
  DoctorInput in;
  std::set<std::tuple<int32_t, int32_t, int64_t>> seen;  // (rank, comm, seq)
  for (const auto& path : trace_paths) {
    traces::TraceReader reader(path);
    for (const auto& c : reader.communicators()) in.comms[c.id] = c;
    for (const auto& r : read_flight_records(path)) {
      if (seen.insert({r.rank, r.comm, r.seq}).second) in.records.push_back(r);
    }
    for (const auto& c : reader.communicators()) {
      for (const auto& s : reader.collectives_of(c.id)) {
        if (!seen.insert({s.rank, s.comm, s.seq}).second) continue;
        FlightRecord r;
        r.rank = s.rank;
        r.comm = s.comm;
        r.seq = s.seq;
        r.op = s.op;
        r.bytes = s.bytes;
        r.peer = s.peer;
        r.step = s.step;
        r.state = FlightState::Completed;
        r.scheduled_ns = s.start_ns;
        r.started_ns = s.start_ns;
        r.completed_ns = s.end_ns;
        in.records.push_back(r);
      }
    }
  }
  return in;
}

namespace {

bool is_p2p(traces::CollOp op) { return op == traces::CollOp::Send || op == traces::CollOp::Recv; }

// "rank 1", "ranks 0, 2 and 3"
std::string rank_list(const std::vector<int32_t>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += (i + 1 == ranks.size()) ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

std::string comm_name(const DoctorInput& in, int32_t comm) {
  auto it = in.comms.find(comm);
  return it != in.comms.end() && !it->second.name.empty() ? it->second.name
                                                          : "communicator " + std::to_string(comm);
}

std::string where(const DoctorInput& in, int32_t comm, int64_t seq, int32_t step) {
  std::string s = "collective #" + std::to_string(seq) + " on " + comm_name(in, comm);
  if (step >= 0) s += " (step " + std::to_string(step) + ")";
  return s;
}

using RankRecords = std::map<int32_t, const FlightRecord*>;  // rank -> its record of one collective
using SeqRecords = std::map<int64_t, RankRecords>;

// The collective records by comm, seq and rank, and each (comm, rank)'s seq range.
struct RecordIndex {
  std::map<int32_t, SeqRecords> by;
  std::map<std::pair<int32_t, int32_t>, std::pair<int64_t, int64_t>> span;  // (comm, rank)
};

RecordIndex index_records(const DoctorInput& in) {
  RecordIndex ix;
  for (const auto& r : in.records) {
    if (is_p2p(r.op) || r.comm < 0 || r.seq < 0) continue;
    ix.by[r.comm][r.seq][r.rank] = &r;
    auto [it, fresh] = ix.span.try_emplace({r.comm, r.rank}, r.seq, r.seq);
    if (!fresh) {
      it->second.first = std::min(it->second.first, r.seq);
      it->second.second = std::max(it->second.second, r.seq);
    }
  }
  return ix;
}

// The communicator's members; with unknown membership, the ranks that recorded on it.
std::vector<int32_t> comm_members(const DoctorInput& in, int32_t comm, const SeqRecords& seqs) {
  std::vector<int32_t> members;
  if (auto it = in.comms.find(comm); it != in.comms.end()) members = it->second.ranks;
  if (members.empty()) {
    std::set<int32_t> m;
    for (const auto& [seq, ranks] : seqs)
      for (const auto& [rank, rec] : ranks) m.insert(rank);
    members.assign(m.begin(), m.end());
  }
  return members;
}

struct Presence {
  std::vector<int32_t> missing;  // members without a record
  bool all_complete = true;      // every member has a completed record
};

Presence presence(const RecordIndex& ix, int32_t comm, int64_t seq,
                  const std::vector<int32_t>& members, const RankRecords& ranks) {
  Presence p;
  for (int32_t m : members) {
    auto rit = ranks.find(m);
    if (rit == ranks.end()) {
      // A rank whose records start after this seq was evicted from its ring, not absent.
      auto sp = ix.span.find({comm, m});
      if (sp == ix.span.end() || sp->second.first <= seq)
        p.missing.push_back(m);
      else
        continue;
      p.all_complete = false;
    } else if (rit->second->state != FlightState::Completed) {
      p.all_complete = false;
    }
  }
  return p;
}

// The group with the most ranks (ties: the lowest rank's).
template <typename Groups>
typename Groups::const_iterator majority(const Groups& groups) {
  auto best = groups.begin();
  for (auto it = groups.begin(); it != groups.end(); ++it) {
    if (it->second.size() > best->second.size() ||
        (it->second.size() == best->second.size() && it->second[0] < best->second[0])) {
      best = it;
    }
  }
  return best;
}

// Ranks that joined with something other than the majority's op (or size): one finding per
// group, the sentence on the last.
template <typename Key, typename Describe>
void mismatch_findings(const std::map<Key, std::vector<int32_t>>& groups, const std::string& kind,
                       const std::string& head, const std::string& verb, Describe&& describe,
                       int32_t comm, int64_t seq, int32_t step,
                       std::vector<DoctorFinding>& findings) {
  const auto maj = majority(groups);
  std::string text = head;
  bool first = true;
  for (const auto& [key, rs] : groups) {
    if (key == maj->first) continue;
    text += std::string(first ? " " : "; ") + rank_list(rs) + " " + verb + " " + describe(key);
    first = false;
    findings.push_back({kind, comm, seq, step, rs, ""});
  }
  text += " where " + rank_list(maj->second) + " " + verb + " " + describe(maj->first) + ".";
  findings.back().text = text;
}

// The findings at a communicator's first collective that did not complete on every member.
std::vector<DoctorFinding> hang_findings(const DoctorInput& in, int32_t comm, int64_t seq,
                                         int32_t step, const RankRecords& ranks,
                                         const std::vector<int32_t>& missing) {
  std::vector<DoctorFinding> findings;
  // Majority op and size among those that joined (ties: the lowest rank's).
  std::map<traces::CollOp, std::vector<int32_t>> ops;
  for (const auto& [rank, rec] : ranks) ops[rec->op].push_back(rank);
  std::map<int64_t, std::vector<int32_t>> sizes;
  for (const auto& [rank, rec] : ranks) sizes[rec->bytes].push_back(rank);
  const std::string at = where(in, comm, seq, step);
  if (ops.size() > 1) {
    mismatch_findings(
        ops, "op_mismatch", "Op mismatch at " + at + ":", "called",
        [](traces::CollOp op) { return std::string(traces::to_string(op)); }, comm, seq, step,
        findings);
  } else if (sizes.size() > 1) {
    const std::string op(traces::to_string(ranks.begin()->second->op));
    mismatch_findings(
        sizes, "size_mismatch", "Size mismatch at " + at + ", " + op + ":", "passed",
        [](int64_t bytes) { return std::to_string(bytes) + " bytes"; }, comm, seq, step, findings);
  }
  if (!missing.empty()) {
    std::vector<int32_t> joined;
    for (const auto& [rank, rec] : ranks) joined.push_back(rank);
    const std::string op(traces::to_string(majority(ops)->first));
    std::string text = "Collective #" + std::to_string(seq) + " on " + comm_name(in, comm) + " (" +
                       op + (step >= 0 ? ", step " + std::to_string(step) : "") +
                       ") never completed: " + rank_list(joined) + " joined it, " +
                       rank_list(missing) + " never did.";
    findings.push_back({"missing", comm, seq, step, missing, text});
  } else if (ops.size() == 1 && sizes.size() == 1) {
    std::vector<int32_t> waiting;
    for (const auto& [rank, rec] : ranks)
      if (rec->state != FlightState::Completed) waiting.push_back(rank);
    findings.push_back({"incomplete", comm, seq, step, waiting,
                        "Collective #" + std::to_string(seq) + " on " + comm_name(in, comm) +
                            " never completed on " + rank_list(waiting) +
                            ", though every member joined it."});
  }
  return findings;
}

// The last to start, when by at least straggler_ns after the next-latest.
std::optional<int32_t> straggler_at(const RankRecords& ranks, int64_t straggler_ns) {
  if (ranks.size() < 2) return std::nullopt;
  std::vector<std::pair<int64_t, int32_t>> starts;
  for (const auto& [rank, rec] : ranks) starts.emplace_back(rec->started_ns, rank);
  std::sort(starts.begin(), starts.end());
  const auto& last = starts.back();
  return last.first - starts[starts.size() - 2].first >= straggler_ns
             ? std::optional<int32_t>(last.second)
             : std::nullopt;
}

struct Late {
  int64_t count = 0;
  int64_t first_seq = -1;
  int32_t first_comm = -1;
  int32_t first_step = -1;
};

struct Matching {
  std::vector<DoctorFinding> findings;  // hangs and mismatches
  int64_t collectives_matched = 0;
  std::map<int32_t, Late> late;  // by rank
};

// Walks every communicator's collectives in seq order: the first incomplete one is its hang;
// complete ones are matched and checked for a straggler.
Matching match_collectives(const DoctorInput& in, const DoctorOptions& opt) {
  Matching out;
  const RecordIndex ix = index_records(in);
  for (const auto& [comm, seqs] : ix.by) {
    const std::vector<int32_t> members = comm_members(in, comm, seqs);
    bool hang_reported = false;
    for (const auto& [seq, ranks] : seqs) {
      const Presence p = presence(ix, comm, seq, members, ranks);
      int32_t step = -1;
      for (const auto& [rank, rec] : ranks) step = std::max(step, rec->step);
      if (!p.all_complete && !hang_reported) {
        hang_reported = true;
        for (auto& f : hang_findings(in, comm, seq, step, ranks, p.missing))
          out.findings.push_back(std::move(f));
      }
      if (!p.all_complete || !p.missing.empty()) continue;
      ++out.collectives_matched;
      const std::optional<int32_t> straggler = straggler_at(ranks, opt.straggler_ns);
      if (!straggler) continue;
      Late& l = out.late[*straggler];
      if (l.count++ == 0) {
        l.first_seq = seq;
        l.first_comm = comm;
        l.first_step = step;
      }
    }
  }
  return out;
}

std::vector<DoctorFinding> straggler_findings(const DoctorInput& in, const Matching& mt,
                                              const DoctorOptions& opt) {
  std::vector<DoctorFinding> findings;
  for (const auto& [rank, l] : mt.late) {
    const std::string text = "Rank " + std::to_string(rank) + " straggles: it arrived last, " +
                             std::to_string(opt.straggler_ns / 1'000'000) +
                             " ms or more after the others, at " + std::to_string(l.count) +
                             " of " + std::to_string(mt.collectives_matched) +
                             " matched collectives (first at " +
                             where(in, l.first_comm, l.first_seq, l.first_step) + ").";
    findings.push_back({"straggler", l.first_comm, l.first_seq, l.first_step, {rank}, text});
  }
  return findings;
}

std::string paragraph(const DoctorReport& rep, const DoctorOptions& opt) {
  std::string s;
  for (const auto& f : rep.findings) {
    if (f.text.empty()) continue;
    if (!s.empty()) s += " ";
    s += f.text;
  }
  if (s.empty()) {
    s = "No problem found: " + std::to_string(rep.collectives_matched) +
        " collectives matched on every member, none incomplete or mismatched, no rank " +
        std::to_string(opt.straggler_ns / 1'000'000) + " ms or more late.";
  }
  return s;
}

}  // namespace

DoctorReport diagnose(const DoctorInput& in, const DoctorOptions& opt) {
  Matching mt = match_collectives(in, opt);
  DoctorReport rep;
  rep.findings = std::move(mt.findings);
  rep.collectives_matched = mt.collectives_matched;
  for (auto& f : straggler_findings(in, mt, opt)) rep.findings.push_back(std::move(f));
  rep.paragraph = paragraph(rep, opt);
  return rep;
}

}  // namespace orrery::profiler
