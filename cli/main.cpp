// The `orrery` command: parses arguments and calls the libraries, nothing more.
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

int main(int argc, char** argv) {
  using namespace orrery::cli;
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
