// Shared state of the multi-rank runtime tests: the world communicator created by mpi_main.cpp.
#pragma once

#include "orrery/runtime/comm.hpp"

namespace orrery::runtime::testing {
extern Communicator* g_world;
inline Communicator& world() { return *g_world; }
}  // namespace orrery::runtime::testing
