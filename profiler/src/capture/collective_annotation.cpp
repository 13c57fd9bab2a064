// begin_collective_annotation / end_collective_annotation (range_hooks.hpp): the collective hooks
// of the installed RangeHooks, if any.
#include "orrery/profiler/range_hooks.hpp"

namespace orrery::profiler {
namespace {
// The hooks that took this thread's open annotation (the hooks may be replaced meanwhile: the close
// goes to the ones that opened).
thread_local const RangeHooks* t_open_collective = nullptr;
}  // namespace

bool begin_collective_annotation(const CollectiveAnnotation& a) {
  const RangeHooks* h = range_hooks();
  if (h == nullptr || h->collective_open == nullptr || h->collective_close == nullptr) return false;
  if (!h->collective_open(a)) return false;
  t_open_collective = h;
  return true;
}

void end_collective_annotation() {
  const RangeHooks* h = t_open_collective;
  t_open_collective = nullptr;
  if (h != nullptr) h->collective_close();
}

}  // namespace orrery::profiler
