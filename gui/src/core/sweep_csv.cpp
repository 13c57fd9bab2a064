// Parsing of sweep CSV files (see the header for the accepted columns).
#include "orrery/gui/sweep_csv.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "orrery/common/error.hpp"

namespace orrery::gui {
namespace {

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) {
    // Trim blanks, quotes and a Windows line end.
    const auto b = cell.find_first_not_of(" \t\"\r");
    const auto e = cell.find_last_not_of(" \t\"\r");
    out.push_back(b == std::string::npos ? std::string() : cell.substr(b, e - b + 1));
  }
  return out;
}

// The text of column `c` to the end of the line, unquoted: the note is the last column and may
// hold commas (the columns before it hold none). Empty when c < 0 or the line is shorter.
std::string last_column_from(const std::string& line, int c) {
  if (c < 0) return {};
  size_t pos = 0;
  for (int i = 0; i < c; ++i) {
    pos = line.find(',', pos);
    if (pos == std::string::npos) return {};
    ++pos;
  }
  const auto b = line.find_first_not_of(" \t\"\r", pos);
  const auto e = line.find_last_not_of(" \t\"\r");
  return b == std::string::npos || e < b ? std::string() : line.substr(b, e - b + 1);
}

}  // namespace

std::vector<SweepPoint> parse_sweep_csv(const std::string& text, const std::string& source,
                                        std::vector<SweepUnplaced>* unplaced) {
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  std::vector<std::string> header;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    header = split(line);
    break;
  }
  auto col = [&](const std::string& name) -> int {
    auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? -1 : static_cast<int>(it - header.begin());
  };
  const int c_gpus = col("gpus"), c_tps = col("tokens_per_s"), c_eff = col("efficiency"),
            c_note = col("note");
  if (c_gpus < 0 || c_tps < 0) {
    throw InputError(source + ": line " + std::to_string(line_no) +
                     ": expected a CSV header with columns 'gpus' and 'tokens_per_s'");
  }
  std::map<int, SweepPoint> best;
  std::map<int, std::string> not_placed;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    const auto cells = split(line);
    auto num = [&](int c, const char* what) {
      if (c >= static_cast<int>(cells.size())) {
        throw InputError(source + ": line " + std::to_string(line_no) + ": missing column '" +
                         what + "'");
      }
      try {
        size_t used = 0;
        const double v = std::stod(cells[static_cast<size_t>(c)], &used);
        if (used != cells[static_cast<size_t>(c)].size()) throw std::invalid_argument(what);
        return v;
      } catch (const std::logic_error&) {
        throw InputError(source + ": line " + std::to_string(line_no) + ": column '" + what +
                         "' is '" + cells[static_cast<size_t>(c)] + "', expected a number");
      }
    };
    // `orrery sweep` leaves the figures empty for a GPU count it could not place (a note says why).
    if (c_tps >= static_cast<int>(cells.size()) || cells[static_cast<size_t>(c_tps)].empty()) {
      not_placed.try_emplace(static_cast<int>(num(c_gpus, "gpus")), last_column_from(line, c_note));
      continue;
    }
    SweepPoint p;
    p.gpus = static_cast<int>(num(c_gpus, "gpus"));
    p.tokens_per_s = num(c_tps, "tokens_per_s");
    p.efficiency = (c_eff >= 0 && c_eff < static_cast<int>(cells.size()) &&
                    !cells[static_cast<size_t>(c_eff)].empty())
                       ? num(c_eff, "efficiency")
                       : -1;
    auto [it, fresh] = best.try_emplace(p.gpus, p);
    if (!fresh && p.tokens_per_s > it->second.tokens_per_s) it->second = p;
  }
  if (unplaced) {
    unplaced->clear();
    for (auto& [g, note] : not_placed) {
      if (!best.count(g)) unplaced->push_back({g, note});
    }
  }
  std::vector<SweepPoint> out;
  for (auto& [g, p] : best) out.push_back(p);
  if (out.empty()) throw InputError(source + ": no data rows after the header");
  const double base = out.front().gpus > 0 ? out.front().tokens_per_s / out.front().gpus : 0;
  for (auto& p : out) {
    if (p.efficiency < 0)
      p.efficiency = (base > 0 && p.gpus > 0) ? (p.tokens_per_s / p.gpus) / base : 0;
  }
  return out;
}

std::vector<SweepPoint> load_sweep_csv(const std::string& path,
                                       std::vector<SweepUnplaced>* unplaced) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open the file");
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_sweep_csv(ss.str(), path, unplaced);
}

}  // namespace orrery::gui
