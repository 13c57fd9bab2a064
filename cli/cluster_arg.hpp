// The --cluster argument shared by sim, sweep, sim-collective and replay: a path, or the name of a
// file in scenarios/clusters/ (e.g. "h100-1024").
#pragma once

#include <filesystem>
#include <string>

#include "orrery/common/error.hpp"

namespace orrery::cli {

inline std::string resolve_cluster_path(const std::string& c, const char* flag = "--cluster") {
  namespace fs = std::filesystem;
  if (fs::exists(c)) return c;
  for (const std::string& cand : {"scenarios/clusters/" + c + ".yaml", "scenarios/clusters/" + c}) {
    if (fs::exists(cand)) return cand;
  }
  throw InputError(std::string(flag) + " '" + c +
                   "': no such file (give a path or a name in scenarios/clusters/)");
}

}  // namespace orrery::cli
