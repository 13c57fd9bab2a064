// Elastic restarts: the attempts' record, the checkpoint and the ranks of a restart, the time lost.
#include "orrery/runtime/elastic.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "orrery/common/error.hpp"

namespace orrery::runtime {
namespace fs = std::filesystem;
using nlohmann::json;

int64_t unix_time_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string attempts_to_json(const std::vector<Attempt>& attempts) {
  json out = json::array();
  for (const auto& a : attempts) {
    json j = {{"attempt", a.attempt},
              {"nproc", a.nproc},
              {"dp", a.dp},
              {"resumed_from_step", a.resumed_from_step},
              {"resumed_from", a.resumed_from},
              {"start_unix_ns", a.start_unix_ns},
              {"failed", a.failed}};
    if (a.failed) {
      j["end_unix_ns"] = a.end_unix_ns;
      j["exit_status"] = a.exit_status;
      j["lost_ranks"] = a.lost_ranks;
      j["failed_step"] = a.failed_step;
      j["failure"] = a.failure;
      j["trace"] = a.trace;
      j["lost_ns"] = a.lost_ns;
    }
    out.push_back(std::move(j));
  }
  return out.dump();
}

std::vector<Attempt> attempts_from_json(const std::string& text, const std::string& origin) {
  std::vector<Attempt> out;
  try {
    const json arr = json::parse(text);
    if (!arr.is_array()) throw InputError(origin + ": expected a JSON array of attempts");
    for (const auto& j : arr) {
      Attempt a;
      a.attempt = j.at("attempt").get<int>();
      a.nproc = j.at("nproc").get<int>();
      a.dp = j.at("dp").get<int>();
      a.resumed_from_step = j.at("resumed_from_step").get<int>();
      a.resumed_from = j.at("resumed_from").get<std::string>();
      a.start_unix_ns = j.at("start_unix_ns").get<int64_t>();
      a.failed = j.at("failed").get<bool>();
      if (a.failed) {
        a.end_unix_ns = j.at("end_unix_ns").get<int64_t>();
        a.exit_status = j.at("exit_status").get<int>();
        a.lost_ranks = j.at("lost_ranks").get<std::vector<int>>();
        a.failed_step = j.at("failed_step").get<int>();
        a.failure = j.at("failure").get<std::string>();
        a.trace = j.at("trace").get<std::string>();
        a.lost_ns = j.at("lost_ns").get<int64_t>();
      }
      out.push_back(std::move(a));
    }
  } catch (const json::exception& e) {
    throw InputError(origin + ": not a list of attempts: " + e.what());
  }
  return out;
}

std::vector<Attempt> attempts_from_env() {
  const char* text = std::getenv(kAttemptsEnv);
  if (!text || !*text) return {};
  return attempts_from_json(text, std::string("environment variable ") + kAttemptsEnv);
}

void faults_for_attempt(Scenario& s, int attempt) {
  if (attempt <= 1 || s.faults.every_attempt) return;
  s.faults = FaultsConfig{};
}

int64_t checkpoint_time_unix_ns(const std::string& step_dir) {
  struct stat st {};
  if (::stat((fs::path(step_dir) / "manifest.json").c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

std::optional<ResumePoint> newest_checkpoint_since(const std::string& dir, int64_t since_unix_ns) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  // Whole seconds: file systems with coarse timestamps round a manifest written just after the
  // start down to the start's second.
  const int64_t since_s = since_unix_ns / 1'000'000'000;
  std::vector<std::pair<int64_t, std::string>> mine;  // complete or partial, not older than the job
  for (const auto& step : checkpoint_steps(dir)) {
    const int64_t t = checkpoint_time_unix_ns(step.second);
    if (t == 0 || t / 1'000'000'000 >= since_s) mine.push_back(step);
  }
  ResumePoint rp;
  if (!take_first_verified(mine, rp)) return std::nullopt;
  return rp;
}

int hostfile_slots(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError("--hostfile '" + path + "': cannot read it");
  std::string line;
  int slots = 0, line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host)) continue;
    int n = 1;
    while (words >> word) {
      if (word.rfind("slots=", 0) != 0) continue;
      try {
        size_t used = 0;
        n = std::stoi(word.substr(6), &used);
        if (used != word.size() - 6 || n < 0) throw std::invalid_argument(word);
      } catch (const std::exception&) {
        throw InputError(path + ":" + std::to_string(line_no) + ": '" + word +
                         "': expected slots=N with N a whole number >= 0");
      }
    }
    slots += n;
  }
  return slots;
}

int64_t time_lost_ns(const Attempt& a, int64_t checkpoint_unix_ns, int64_t restart_unix_ns) {
  const bool written_during =
      checkpoint_unix_ns >= a.start_unix_ns && checkpoint_unix_ns <= a.end_unix_ns;
  const int64_t from = written_during ? checkpoint_unix_ns : a.start_unix_ns;
  return std::max<int64_t>(0, restart_unix_ns - from);
}

}  // namespace orrery::runtime
