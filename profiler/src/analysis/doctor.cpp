// The diagnosis of `orrery doctor` (see doctor.hpp) and the reader of flight_records tables.
// diagnose chains named steps: index the records by (comm, seq, rank), walk each communicator's
// collectives (hang and mismatch findings, matched count, stragglers), then write the paragraph.
#include "orrery/profiler/doctor.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
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

namespace {

// A collective span as the record of a completed collective.
FlightRecord as_record(const traces::Span& s) {
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
  return r;
}

}  // namespace

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
        in.records.push_back(as_record(s));
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

// `counts_missing(m)`: whether member m, without a record of this collective, is missing (else its
// records start after this seq: it was evicted from its ring, not absent).
template <typename CountsMissing>
Presence presence(const std::vector<int32_t>& members, const RankRecords& ranks,
                  CountsMissing&& counts_missing) {
  Presence p;
  for (int32_t m : members) {
    auto rit = ranks.find(m);
    if (rit == ranks.end()) {
      if (!counts_missing(m)) continue;
      p.missing.push_back(m);
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
  std::map<int32_t, std::vector<DoctorFinding>> hangs;  // by comm: its hang and mismatches
  int64_t collectives_matched = 0;
  std::map<int32_t, Late> late;  // by rank
};

// One collective (comm, seq) with the records `ranks`: the comm's first incomplete one is its
// hang; a complete one is matched and checked for a straggler. Called in seq order per comm (the
// communicators in any order: a rank's first lateness is the least (comm, seq)).
template <typename CountsMissing>
void judge_collective(const DoctorInput& in, const DoctorOptions& opt, int32_t comm, int64_t seq,
                      const std::vector<int32_t>& members, const RankRecords& ranks,
                      CountsMissing&& counts_missing, Matching& out) {
  const Presence p = presence(members, ranks, counts_missing);
  int32_t step = -1;
  for (const auto& [rank, rec] : ranks) step = std::max(step, rec->step);
  if (!p.all_complete && !out.hangs.count(comm))
    out.hangs[comm] = hang_findings(in, comm, seq, step, ranks, p.missing);
  if (!p.all_complete || !p.missing.empty()) return;
  ++out.collectives_matched;
  const std::optional<int32_t> straggler = straggler_at(ranks, opt.straggler_ns);
  if (!straggler) return;
  Late& l = out.late[*straggler];
  if (l.count++ == 0 || std::tie(comm, seq) < std::tie(l.first_comm, l.first_seq)) {
    l.first_seq = seq;
    l.first_comm = comm;
    l.first_step = step;
  }
}

// Walks every communicator's collectives in seq order (all records in memory).
Matching match_collectives(const DoctorInput& in, const DoctorOptions& opt) {
  Matching out;
  const RecordIndex ix = index_records(in);
  for (const auto& [comm, seqs] : ix.by) {
    const std::vector<int32_t> members = comm_members(in, comm, seqs);
    for (const auto& [seq, ranks] : seqs) {
      const auto counts_missing = [&, c = comm, q = seq](int32_t m) {
        auto sp = ix.span.find({c, m});
        return sp == ix.span.end() || sp->second.first <= q;
      };
      judge_collective(in, opt, comm, seq, members, ranks, counts_missing, out);
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

DoctorReport report_of(const DoctorInput& in, Matching mt, const DoctorOptions& opt) {
  DoctorReport rep;
  for (auto& [comm, fs] : mt.hangs)
    for (auto& f : fs) rep.findings.push_back(std::move(f));
  rep.collectives_matched = mt.collectives_matched;
  for (auto& f : straggler_findings(in, mt, opt)) rep.findings.push_back(std::move(f));
  rep.paragraph = paragraph(rep, opt);
  return rep;
}

// ---- The streamed diagnosis (diagnose_traces): the records of a collective are held only while
// it is in flight.
//
// Span blocks come from every file in one time order (TraceReader::BlockCursor). A record is a
// candidate for its key (rank, comm, seq); which candidate wins is what load_doctor_input's
// first-seen rule gives: files in order, in a file its flight records (in table order) before its
// spans, spans by (start, block id, place in block) (collectives_of's order). A communicator's
// collective seq is judged (judge_collective, as diagnose does) once every member has either
// recorded a span with that seq or a later one, or has no blocks left; its records are then
// dropped. Everything judged is final only if no candidate for a judged seq comes later, and a
// key's candidates agree on being a transfer (send/recv) or not; data that breaks either (a rank
// whose spans of one communicator arrive out of seq order, duplicate keys of different kinds)
// makes diagnose_traces() fall back to the in-memory diagnosis, so its output is always
// diagnose(load_doctor_input(...))'s.

// Precedence of a candidate for its key: lower wins.
using Precedence = std::tuple<int32_t, int32_t, int64_t, int64_t, int64_t>;

struct Candidate {
  FlightRecord rec;
  Precedence prec;
};

// A set of int64 as disjoint closed intervals (a rank's seqs on a communicator: one interval in
// a trace without gaps).
class IntervalSet {
 public:
  // Adds v; whether it was new.
  bool insert(int64_t v) {
    auto it = iv_.upper_bound(v);  // first interval starting after v
    if (it != iv_.begin() && std::prev(it)->second >= v) return false;
    const bool joins_prev = it != iv_.begin() && std::prev(it)->second == v - 1;
    const bool joins_next = it != iv_.end() && it->first == v + 1;
    if (joins_prev && joins_next) {
      std::prev(it)->second = it->second;
      iv_.erase(it);
    } else if (joins_prev) {
      std::prev(it)->second = v;
    } else if (joins_next) {
      const int64_t hi = it->second;
      iv_.erase(it);
      iv_.emplace(v, hi);
    } else {
      iv_.emplace(v, v);
    }
    return true;
  }

 private:
  std::map<int64_t, int64_t> iv_;  // first -> last
};

struct CommState {
  std::vector<int32_t> members;  // empty: unknown (judged at the end, from who recorded)
  std::map<std::pair<int64_t, int32_t>, Candidate> held;  // (seq, rank): span candidates
  std::map<int32_t, int64_t> hi_span;       // rank -> highest seq of its span candidates
  std::map<int32_t, int64_t> hi_coll;       // rank -> highest seq of its non-transfer candidates
  std::map<int32_t, int64_t> first_judged;  // rank -> lowest judged seq it has a record of
  int64_t judged_to = -1;  // every seq <= this is judged; a candidate for one is too late
};

class StreamedDoctor {
 public:
  StreamedDoctor(const DoctorInput& in, const DoctorOptions& opt) : in_(in), opt_(opt) {}

  // A flight record, all of them before any span, in load_doctor_input's order (so the first of
  // a key among them is the one to hold).
  void add_flight(const FlightRecord& r, int32_t file, int64_t row) {
    if (!count_key(r.rank, r.comm, r.seq) || r.comm < 0 || r.seq < 0) return;
    flights_.emplace(std::make_tuple(r.comm, r.seq, r.rank), Candidate{r, {file, 0, row, 0, 0}});
    CommState& c = comm(r.comm);
    if (!is_p2p(r.op)) raise(c.hi_coll, r.rank, r.seq);
  }

  // A span of a communicator of its file; false when the stream cannot be exact.
  bool add_span(const traces::Span& s, int32_t file, int64_t block, int64_t place) {
    count_key(s.rank, s.comm, s.seq);
    if (s.seq < 0) return true;
    CommState& c = comm(s.comm);
    if (s.seq <= c.judged_to) return false;
    const bool p2p = is_p2p(s.op);
    if (auto f = flights_.find({s.comm, s.seq, s.rank}); f != flights_.end())
      if (is_p2p(f->second.rec.op) != p2p) return false;
    Candidate cand{as_record(s), {file, 1, s.start_ns, block, place}};
    auto [it, fresh] = c.held.try_emplace({s.seq, s.rank}, cand);
    if (!fresh) {
      if (is_p2p(it->second.rec.op) != p2p) return false;
      if (cand.prec < it->second.prec) it->second = cand;
    }
    raise(c.hi_span, s.rank, s.seq);
    if (!p2p) raise(c.hi_coll, s.rank, s.seq);
    touched_.insert(s.comm);
    return true;
  }

  // A rank has no span blocks left in one file (expect_rank: once per file it has blocks in).
  void rank_done(int32_t rank) {
    if (--blocks_left_[rank] > 0) return;
    for (auto& [id, c] : comms_) touched_.insert(id);
  }
  void expect_rank(int32_t rank) { ++blocks_left_[rank]; }

  // Judges what every member has passed, in the communicators touched since the last call.
  void judge_ready() {
    for (int32_t id : touched_) {
      CommState& c = comms_.at(id);
      if (!c.members.empty()) judge_upto(id, c, ready_upto(c));
    }
    touched_.clear();
  }

  // After the last block: judges everything left, and the report.
  DoctorReport finish() {
    for (const auto& [key, f] : flights_) comm(std::get<0>(key));
    for (auto& [id, c] : comms_) {
      if (c.members.empty()) c.members = recorders(id, c);
      judge_upto(id, c, std::numeric_limits<int64_t>::max());
    }
    return report_of(in_, std::move(mt_), opt_);
  }

  int64_t records() const { return records_; }
  size_t held() const { return flights_.size() + held_spans(); }

 private:
  static void raise(std::map<int32_t, int64_t>& hi, int32_t rank, int64_t seq) {
    auto [it, fresh] = hi.try_emplace(rank, seq);
    if (!fresh) it->second = std::max(it->second, seq);
  }
  size_t held_spans() const {
    size_t n = 0;
    for (const auto& [id, c] : comms_) n += c.held.size();
    return n;
  }

  // Counts a key the first time it is met (load_doctor_input's records); whether it was new.
  bool count_key(int32_t rank, int32_t comm, int64_t seq) {
    const bool fresh = keys_[{rank, comm}].insert(seq);
    records_ += fresh ? 1 : 0;
    return fresh;
  }

  CommState& comm(int32_t id) {
    auto [it, fresh] = comms_.try_emplace(id);
    if (fresh) {
      if (auto k = in_.comms.find(id); k != in_.comms.end()) it->second.members = k->second.ranks;
    }
    return it->second;
  }

  bool done(int32_t rank) const {
    auto it = blocks_left_.find(rank);
    return it == blocks_left_.end() || it->second <= 0;
  }

  // The highest seq every member has reached (a member without blocks left: every seq).
  int64_t ready_upto(const CommState& c) const {
    int64_t upto = std::numeric_limits<int64_t>::max();
    for (int32_t m : c.members) {
      if (done(m)) continue;
      auto it = c.hi_span.find(m);
      upto = std::min(upto, it == c.hi_span.end() ? int64_t{-1} : it->second);
    }
    return upto;
  }

  // The ranks with a non-transfer record on a communicator of unknown membership.
  std::vector<int32_t> recorders(int32_t id, const CommState& c) const {
    std::set<int32_t> m;
    for (const auto& [key, cand] : c.held)
      if (!is_p2p(winner(id, key.first, key.second).op)) m.insert(key.second);
    for (auto it = flights_.lower_bound({id, INT64_MIN, INT32_MIN});
         it != flights_.end() && std::get<0>(it->first) == id; ++it)
      if (!is_p2p(winner(id, std::get<1>(it->first), std::get<2>(it->first)).op))
        m.insert(std::get<2>(it->first));
    return {m.begin(), m.end()};
  }

  // The winning candidate of a held key (a flight record or a span).
  const FlightRecord& winner(int32_t id, int64_t seq, int32_t rank) const {
    const CommState& c = comms_.at(id);
    auto h = c.held.find({seq, rank});
    auto f = flights_.find({id, seq, rank});
    if (h == c.held.end()) return f->second.rec;
    if (f == flights_.end()) return h->second.rec;
    return f->second.prec < h->second.prec ? f->second.rec : h->second.rec;
  }

  // The lowest held seq of a communicator (spans or flight records), or nullopt.
  std::optional<int64_t> next_seq(int32_t id, const CommState& c) const {
    std::optional<int64_t> s;
    if (!c.held.empty()) s = c.held.begin()->first.first;
    auto f = flights_.lower_bound({id, INT64_MIN, INT32_MIN});
    if (f != flights_.end() && std::get<0>(f->first) == id)
      s = s ? std::min(*s, std::get<1>(f->first)) : std::get<1>(f->first);
    return s;
  }

  void judge_upto(int32_t id, CommState& c, int64_t upto);
  bool judge_one(int32_t id, CommState& c, int64_t seq);

  const DoctorInput& in_;
  const DoctorOptions& opt_;
  Matching mt_;
  std::map<int32_t, CommState> comms_;
  std::map<std::tuple<int32_t, int64_t, int32_t>, Candidate> flights_;  // (comm, seq, rank)
  std::map<std::pair<int32_t, int32_t>, IntervalSet> keys_;             // (rank, comm) -> seqs
  std::map<int32_t, int> blocks_left_;  // rank -> files in which it still has span blocks
  std::set<int32_t> touched_;
  int64_t records_ = 0;
};

// Judges the held seqs <= upto in order; stops before one whose absent members cannot be told
// missing or evicted yet.
void StreamedDoctor::judge_upto(int32_t id, CommState& c, int64_t upto) {
  while (true) {
    const std::optional<int64_t> seq = next_seq(id, c);
    if (!seq || *seq > upto) break;
    if (!judge_one(id, c, *seq)) {
      c.judged_to = std::max(c.judged_to, *seq - 1);
      return;
    }
  }
  c.judged_to = std::max(c.judged_to, upto);
}

// One seq of a communicator: its winning records, judged and dropped; false (nothing done) when
// a member without a record may still turn out to have records before it.
bool StreamedDoctor::judge_one(int32_t id, CommState& c, int64_t seq) {
  std::vector<FlightRecord> recs;
  const auto lo_h = c.held.lower_bound({seq, INT32_MIN});
  const auto hi_h = c.held.upper_bound({seq, INT32_MAX});
  const auto lo_f = flights_.lower_bound({id, seq, INT32_MIN});
  const auto hi_f = flights_.upper_bound({id, seq, INT32_MAX});
  std::set<int32_t> ranks_here;
  for (auto it = lo_h; it != hi_h; ++it) ranks_here.insert(it->first.second);
  for (auto it = lo_f; it != hi_f; ++it) ranks_here.insert(std::get<2>(it->first));
  for (int32_t r : ranks_here)
    if (!is_p2p(winner(id, seq, r).op)) recs.push_back(winner(id, seq, r));
  RankRecords ranks;
  for (const auto& r : recs) ranks[r.rank] = &r;
  // A member without a record is missing when it recorded an earlier seq or nothing at all, and
  // evicted when its records start later.
  std::map<int32_t, bool> missing;
  for (int32_t m : c.members) {
    if (ranks.count(m)) continue;
    if (c.first_judged.count(m)) {
      missing[m] = true;
    } else if (auto h = c.hi_coll.find(m); h != c.hi_coll.end() && h->second > seq) {
      missing[m] = false;
    } else if (done(m)) {
      missing[m] = true;
    } else {
      return false;
    }
  }
  if (!ranks.empty()) {
    judge_collective(
        in_, opt_, id, seq, c.members, ranks, [&](int32_t m) { return missing.at(m); }, mt_);
    for (const auto& [rank, rec] : ranks) c.first_judged.try_emplace(rank, seq);
  }
  c.held.erase(lo_h, hi_h);
  flights_.erase(lo_f, hi_f);
  return true;
}

}  // namespace

DoctorReport diagnose(const DoctorInput& in, const DoctorOptions& opt) {
  return report_of(in, match_collectives(in, opt), opt);
}

namespace {

// The streamed diagnosis, or nullopt when the data is out of the order it needs.
std::optional<DoctorResult> diagnose_streamed(const std::vector<std::string>& trace_paths,
                                              const DoctorOptions& opt) {
  DoctorInput header;
  std::vector<std::unique_ptr<traces::TraceReader>> readers;
  std::vector<std::set<int32_t>> comm_ids;
  for (const auto& path : trace_paths) {
    readers.push_back(std::make_unique<traces::TraceReader>(path));
    comm_ids.emplace_back();
    for (const auto& c : readers.back()->communicators()) {
      header.comms[c.id] = c;
      comm_ids.back().insert(c.id);
    }
  }
  StreamedDoctor doc(header, opt);
  for (size_t f = 0; f < trace_paths.size(); ++f) {
    int64_t row = 0;
    for (const auto& r : read_flight_records(trace_paths[f]))
      doc.add_flight(r, static_cast<int32_t>(f), row++);
  }
  std::vector<std::unique_ptr<traces::TraceReader::BlockCursor>> cursors;
  for (const auto& r : readers) {
    cursors.push_back(std::make_unique<traces::TraceReader::BlockCursor>(*r));
    for (int32_t rank : r->span_ranks()) doc.expect_rank(rank);
  }
  size_t peak = 0;
  while (true) {
    // The file whose next block starts first (ties: the first file).
    size_t f = 0;
    for (size_t k = 1; k < cursors.size(); ++k)
      if (cursors[k]->next_start_ns() < cursors[f]->next_start_ns()) f = k;
    const traces::TraceReader::SpanBlockView* b = cursors[f]->next();
    if (!b) break;
    for (size_t i = 0; i < b->spans.size(); ++i) {
      const traces::Span& s = b->spans[i];
      if (s.comm < 0 || !comm_ids[f].count(s.comm)) continue;
      if (!doc.add_span(s, static_cast<int32_t>(f), b->id, static_cast<int64_t>(i)))
        return std::nullopt;
    }
    if (b->rank_done) doc.rank_done(b->rank);
    peak = std::max(peak, doc.held());
    doc.judge_ready();
  }
  DoctorResult out;
  out.report = doc.finish();
  out.records = doc.records();
  out.peak_held = std::max(peak, doc.held());
  return out;
}

}  // namespace

DoctorResult diagnose_traces(const std::vector<std::string>& trace_paths,
                             const DoctorOptions& opt) {
  if (auto streamed = diagnose_streamed(trace_paths, opt)) return *streamed;
  const DoctorInput in = load_doctor_input(trace_paths);
  DoctorResult out;
  out.report = diagnose(in, opt);
  out.records = static_cast<int64_t>(in.records.size());
  out.streamed = false;
  out.peak_held = in.records.size();
  return out;
}

}  // namespace orrery::profiler
