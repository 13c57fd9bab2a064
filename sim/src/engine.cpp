// The discrete-event engine: callbacks ordered by (time, sequence) plus models polled for their next
// event.
#include "orrery/sim/engine.hpp"

#include <stdexcept>
#include <string>

#include "orrery/common/error.hpp"

namespace orrery::sim {

uint64_t Engine::schedule_at(TimeNs t, Callback cb) {
  if (t < now_) {
    throw InternalError("event scheduled in the past: t=" + std::to_string(t) +
                        " ns < now=" + std::to_string(now_) + " ns");
  }
  const uint64_t seq = next_seq_++;
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = std::move(cb);
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.push_back(std::move(cb));
  }
  queue_.push(Event{t, seq, slot});
  return seq;
}

void Engine::add_model(Model* m) { models_.push_back(m); }

bool Engine::step(TimeNs limit) {
  // Earliest model event; ties between models go to the first registered.
  TimeNs best_t = kNever;
  Model* best = nullptr;
  for (Model* m : models_) {
    const TimeNs t = m->next_event(now_);
    if (t < best_t) {
      best_t = t;
      best = m;
    }
  }
  const TimeNs queue_t = queue_.empty() ? kNever : queue_.top().t;
  if (best && best_t <= queue_t) {
    if (best_t > limit) return false;
    if (best_t < now_) throw InternalError("model event in the past");
    now_ = best_t;
    ++events_;
    best->advance(now_);
    return true;
  }
  if (queue_t == kNever || queue_t > limit) return false;
  // Move the callback out and free its slot before running it: it may schedule more events.
  const uint32_t slot = queue_.top().slot;
  queue_.pop();
  Callback cb = std::move(slots_[slot]);
  slots_[slot] = nullptr;
  free_slots_.push_back(slot);
  now_ = queue_t;
  ++events_;
  cb();
  return true;
}

TimeNs Engine::run() {
  while (step(kNever)) {
  }
  return now_;
}

bool Engine::run_until(TimeNs t) {
  while (step(t)) {
  }
  if (t > now_) now_ = t;
  bool pending = !queue_.empty();
  for (Model* m : models_) pending = pending || m->next_event(now_) != kNever;
  return pending;
}

}  // namespace orrery::sim
