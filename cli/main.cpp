// The `orrery` command: parses arguments and calls the libraries, nothing more.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>

#include "command.hpp"
#include "orrery/common/error.hpp"

namespace orrery::cli {
std::vector<CommandSetup>& command_registry() {
  static std::vector<CommandSetup> registry;
  return registry;
}
}  // namespace orrery::cli

namespace {
// A command over many files holds descriptors per file: `orrery doctor` over a 1,024-rank run's
// per-rank files needs about two each, past the common soft limit of 1,024. The soft limit is
// raised to the hard one (at most 65,536), which any process may do; what stays short fails with
// the file named and "Too many open files".
void raise_open_file_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const rlim_t want =
      rl.rlim_max == RLIM_INFINITY ? rlim_t(65536) : std::min<rlim_t>(rl.rlim_max, 65536);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rl.rlim_cur = want;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}
}  // namespace

int main(int argc, char** argv) {
  using namespace orrery::cli;
  raise_open_file_limit();
  CLI::App app{"orrery: distributed-training profiler and simulator"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "orrery 0.1.0");
  std::vector<Command> commands;
  for (auto& setup : command_registry()) commands.push_back(setup(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    for (auto& c : commands) {
      if (c.app && c.app->parsed()) return c.run();
    }
    std::cerr << "orrery: no command given (see orrery --help)\n";
    return 2;
  } catch (const orrery::InputError& e) {
    std::cerr << "orrery: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "orrery: internal error: " << e.what() << "\n";
    return 1;
  }
}
