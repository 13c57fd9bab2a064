// The diagnosis of `orrery doctor` (see doctor.hpp) and the reader of flight_records tables.
#include "orrery/profiler/doctor.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <set>
#include <tuple>

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

bool is_p2p(traces::CollOp op) {
  return op == traces::CollOp::Send || op == traces::CollOp::Recv;
}

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

}  // namespace

DoctorReport diagnose(const DoctorInput& in, const DoctorOptions& opt) {
  DoctorReport rep;
  // comm -> seq -> rank -> record
  std::map<int32_t, std::map<int64_t, std::map<int32_t, const FlightRecord*>>> by;
  std::map<std::pair<int32_t, int32_t>, std::pair<int64_t, int64_t>> span;  // (comm, rank) seq range
  for (const auto& r : in.records) {
    if (is_p2p(r.op) || r.comm < 0 || r.seq < 0) continue;
    by[r.comm][r.seq][r.rank] = &r;
    auto [it, fresh] = span.try_emplace({r.comm, r.rank}, r.seq, r.seq);
    if (!fresh) {
      it->second.first = std::min(it->second.first, r.seq);
      it->second.second = std::max(it->second.second, r.seq);
    }
  }
  struct Late {
    int64_t count = 0;
    int64_t first_seq = -1;
    int32_t first_comm = -1;
    int32_t first_step = -1;
  };
  std::map<int32_t, Late> late;
  for (const auto& [comm, seqs] : by) {
    std::vector<int32_t> members;
    if (auto it = in.comms.find(comm); it != in.comms.end()) members = it->second.ranks;
    if (members.empty()) {  // unknown membership: the ranks that recorded on it
      std::set<int32_t> m;
      for (const auto& [seq, ranks] : seqs)
        for (const auto& [rank, rec] : ranks) m.insert(rank);
      members.assign(m.begin(), m.end());
    }
    bool hang_reported = false;
    for (const auto& [seq, ranks] : seqs) {
      std::vector<int32_t> missing;
      bool all_complete = true;
      for (int32_t m : members) {
        auto rit = ranks.find(m);
        if (rit == ranks.end()) {
          // A rank whose records start after this seq was evicted from its ring, not absent.
          auto sp = span.find({comm, m});
          if (sp == span.end() || sp->second.first <= seq) missing.push_back(m);
          else continue;
          all_complete = false;
        } else if (rit->second->state != FlightState::Completed) {
          all_complete = false;
        }
      }
      int32_t step = -1;
      for (const auto& [rank, rec] : ranks) step = std::max(step, rec->step);
      if (!all_complete && !hang_reported) {
        hang_reported = true;
        // Majority op and size among those that joined (ties: the lowest rank's).
        std::map<traces::CollOp, std::vector<int32_t>> ops;
        for (const auto& [rank, rec] : ranks) ops[rec->op].push_back(rank);
        std::map<int64_t, std::vector<int32_t>> sizes;
        for (const auto& [rank, rec] : ranks) sizes[rec->bytes].push_back(rank);
        auto majority = [](const auto& groups) {
          auto best = groups.begin();
          for (auto it = groups.begin(); it != groups.end(); ++it) {
            if (it->second.size() > best->second.size() ||
                (it->second.size() == best->second.size() && it->second[0] < best->second[0])) {
              best = it;
            }
          }
          return best;
        };
        const std::string at = where(in, comm, seq, step);
        if (ops.size() > 1) {
          auto maj = majority(ops);
          std::string text = "Op mismatch at " + at + ":";
          bool first = true;
          for (const auto& [op, rs] : ops) {
            if (op == maj->first) continue;
            text += std::string(first ? " " : "; ") + rank_list(rs) + " called " +
                    std::string(traces::to_string(op));
            first = false;
            rep.findings.push_back({"op_mismatch", comm, seq, step, rs, ""});
          }
          text += " where " + rank_list(maj->second) + " called " +
                  std::string(traces::to_string(maj->first)) + ".";
          rep.findings.back().text = text;
        } else if (sizes.size() > 1) {
          auto maj = majority(sizes);
          const std::string op(traces::to_string(ranks.begin()->second->op));
          std::string text = "Size mismatch at " + at + ", " + op + ":";
          bool first = true;
          for (const auto& [bytes, rs] : sizes) {
            if (bytes == maj->first) continue;
            text += std::string(first ? " " : "; ") + rank_list(rs) + " passed " +
                    std::to_string(bytes) + " bytes";
            first = false;
            rep.findings.push_back({"size_mismatch", comm, seq, step, rs, ""});
          }
          text += " where " + rank_list(maj->second) + " passed " + std::to_string(maj->first) +
                  " bytes.";
          rep.findings.back().text = text;
        }
        if (!missing.empty()) {
          std::vector<int32_t> joined;
          for (const auto& [rank, rec] : ranks) joined.push_back(rank);
          const std::string op(traces::to_string(majority(ops)->first));
          std::string text = "Collective #" + std::to_string(seq) + " on " + comm_name(in, comm) +
                              " (" + op + (step >= 0 ? ", step " + std::to_string(step) : "") +
                              ") never completed: " + rank_list(joined) + " joined it, " +
                              rank_list(missing) + " never did.";
          rep.findings.push_back({"missing", comm, seq, step, missing, text});
        } else if (ops.size() == 1 && sizes.size() == 1) {
          std::vector<int32_t> waiting;
          for (const auto& [rank, rec] : ranks)
            if (rec->state != FlightState::Completed) waiting.push_back(rank);
          rep.findings.push_back({"incomplete", comm, seq, step, waiting,
                                  "Collective #" + std::to_string(seq) + " on " +
                                      comm_name(in, comm) + " never completed on " +
                                      rank_list(waiting) + ", though every member joined it."});
        }
      }
      if (!all_complete || !missing.empty()) continue;
      ++rep.collectives_matched;
      // Straggler: the last to start, by at least straggler_ns after the next-latest.
      if (ranks.size() < 2) continue;
      std::vector<std::pair<int64_t, int32_t>> starts;
      for (const auto& [rank, rec] : ranks) starts.emplace_back(rec->started_ns, rank);
      std::sort(starts.begin(), starts.end());
      const auto& last = starts.back();
      if (last.first - starts[starts.size() - 2].first >= opt.straggler_ns) {
        Late& l = late[last.second];
        if (l.count++ == 0) {
          l.first_seq = seq;
          l.first_comm = comm;
          l.first_step = step;
        }
      }
    }
  }
  for (const auto& [rank, l] : late) {
    const std::string text =
        "Rank " + std::to_string(rank) + " straggles: it arrived last, " +
        std::to_string(opt.straggler_ns / 1'000'000) + " ms or more after the others, at " +
        std::to_string(l.count) + " of " + std::to_string(rep.collectives_matched) +
        " matched collectives (first at " + where(in, l.first_comm, l.first_seq, l.first_step) +
        ").";
    rep.findings.push_back({"straggler", l.first_comm, l.first_seq, l.first_step, {rank}, text});
  }
  for (const auto& f : rep.findings) {
    if (f.text.empty()) continue;
    if (!rep.paragraph.empty()) rep.paragraph += " ";
    rep.paragraph += f.text;
  }
  if (rep.paragraph.empty()) {
    rep.paragraph = "No problem found: " + std::to_string(rep.collectives_matched) +
                    " collectives matched on every member, none incomplete or mismatched, no rank " +
                    std::to_string(opt.straggler_ns / 1'000'000) + " ms or more late.";
  }
  return rep;
}

}  // namespace orrery::profiler
