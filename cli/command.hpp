// Subcommand registry of the `orrery` command. Each cmd_<name>.cpp registers its subcommand with a
// static Registrar: a setup function that adds the CLI11 subcommand and its options, returning the
// function to run when that subcommand is chosen. main() runs it and maps exceptions to exit codes
// (InputError -> 2, anything else -> 1).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace orrery::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
using CommandSetup = std::function<Command(CLI::App& root)>;

std::vector<CommandSetup>& command_registry();

struct Registrar {
  explicit Registrar(CommandSetup setup) { command_registry().push_back(std::move(setup)); }
};

}  // namespace orrery::cli
