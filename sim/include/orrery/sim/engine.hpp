// The discrete-event engine: integer-nanosecond time, a queue of callbacks ordered by (time, sequence
// number), and models that expose their next event and advance to it (SimGrid/ns-3 style). The same
// input always gives the same event order, so runs are bit-identical.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <vector>

namespace orrery::sim {

using TimeNs = int64_t;
inline constexpr TimeNs kNever = std::numeric_limits<TimeNs>::max();

// A model with its own notion of pending events (e.g. the flow network: flow completions follow from
// rates, not from queued callbacks). The engine asks for the model's next event time and advances it
// there; advance() may call back into the engine (schedule_at) and into other models.
class Model {
 public:
  virtual ~Model() = default;
  // Time of this model's earliest pending event at or after `now`, or kNever.
  virtual TimeNs next_event(TimeNs now) const = 0;
  // Processes every event of this model due at `now` (the engine guarantees now == next_event).
  virtual void advance(TimeNs now) = 0;
};

class Engine {
 public:
  using Callback = std::function<void()>;

  TimeNs now() const { return now_; }
  // Runs `cb` at time t (t >= now(); earlier times are an internal error). Equal times run in the
  // order they were scheduled. Returns the event's sequence number.
  uint64_t schedule_at(TimeNs t, Callback cb);
  uint64_t schedule_in(TimeNs dt, Callback cb) { return schedule_at(now_ + dt, std::move(cb)); }

  // Registers a model (not owned; it must outlive run()). At equal times, models advance before
  // queued callbacks, in registration order.
  void add_model(Model* m);

  // Runs until no callback is queued and no model has an event. Returns the final time.
  TimeNs run();
  // Runs the events with time <= t, then sets now() to t. Returns true if events remain (after t).
  bool run_until(TimeNs t);

  uint64_t events_processed() const { return events_; }
  size_t queued() const { return queue_.size(); }

 private:
  // The queue orders small entries; the callbacks stay in slots_ (reused through free_slots_), so
  // sifting the heap never moves a std::function.
  struct Event {
    TimeNs t;
    uint64_t seq;
    uint32_t slot;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.t != b.t ? a.t > b.t : a.seq > b.seq;
    }
  };
  // Executes the next event (model or callback) if its time is <= limit; false when none.
  bool step(TimeNs limit);

  TimeNs now_ = 0;
  uint64_t next_seq_ = 0;
  uint64_t events_ = 0;
  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  std::vector<Callback> slots_;
  std::vector<uint32_t> free_slots_;
  std::vector<Model*> models_;
};

}  // namespace orrery::sim
