// Error types used across Orrery. Libraries throw; only main() turns them into exit codes:
// InputError (bad user input: a file, a key, a layout) exits 2, anything else exits 1.
#pragma once

#include <stdexcept>
#include <string>

namespace orrery {

// Bad input from the user: a missing or malformed file, an unknown key, an impossible layout.
// The message names what was wrong (file, line, key) and what was expected.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failure inside Orrery or a library it calls (SQLite, MPI, CUDA) that is not the user's input.
class InternalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace orrery
