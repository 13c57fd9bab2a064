// Trace files written by the `orrery` commands, whole or not at all like every file they write
// (common/atomic_file.hpp): SQLite writes the temporary by name, and its journals beside a
// database (-wal, -shm, -journal) must never meet the new file under the old name.
#pragma once

#include <string>

#include "orrery/common/atomic_file.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::cli {

// traces::write_trace to `path` through an AtomicFile.
inline void write_trace_atomic(const traces::Trace& t, const std::string& path) {
  AtomicFile f(path, AtomicFile::ByName{{"-wal", "-shm", "-journal"}});
  traces::write_trace(t, f.temp_path());
  f.commit();
}

}  // namespace orrery::cli
