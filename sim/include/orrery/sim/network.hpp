// Network models: they run collective plans (collectives.hpp) on a cluster's topology, on the engine.
//  - AnalyticalNetwork: no contention between collectives; each phase costs its latency steps plus
//    the most loaded link's bytes over its bandwidth (exact for symmetric algorithms on their own).
//    Results are cached per (op, algorithm, members, channels) as latency + seconds per byte.
//  - FlowNetwork: every flow of every running collective shares links by max-min fairness; rates are
//    re-solved when flows start or end, only for the flows that share links with them (transitively).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "orrery/sim/cluster.hpp"
#include "orrery/sim/collectives.hpp"
#include "orrery/sim/engine.hpp"

namespace orrery::sim {

enum class NetworkModel { Analytical, Flow };
std::string_view to_string(NetworkModel m);
std::optional<NetworkModel> network_model_from_string(std::string_view s);  // analytical, flow

struct NetworkStats {
  uint64_t collectives = 0;
  uint64_t flows = 0;          // unit-flow entries started (after aggregation)
  uint64_t solves = 0;         // max-min solves (flow model)
  uint64_t solved_flows = 0;   // flows re-rated over all solves
  uint64_t cached_solves = 0;  // phases started alone on idle links, rated from their cached solve
};

class NetworkSim : public Model {
 public:
  // Starts a collective (or send/recv) now (engine.now()); on_done runs when it completes (every
  // member done; the simulator does not model per-rank skew inside one collective). The request is
  // copied. Throws InputError for an invalid request.
  virtual void start(const CollectiveRequest& req, std::function<void()> on_done) = 0;
  virtual const NetworkStats& stats() const = 0;
};

// Creates the model and registers it with the engine (engine.add_model); cluster and engine must
// outlive it. whole_components (flow model, for tests): re-rate every flow connected to a change
// through shared links, the reference for the default, which re-rates only the flows connected to it
// through saturated links (the same allocation up to floating-point rounding; network.cpp).
std::unique_ptr<NetworkSim> make_network(NetworkModel model, const Cluster& cluster, Engine& engine,
                                         bool whole_components = false);

// What a request resolves to: Auto algorithm and protocol chosen like NCCL's tuner (the lowest
// analytical estimate at the request's size), and the channels NCCL would use (nccl_channels).
struct CollectiveChoice {
  Algorithm algo = Algorithm::Ring;
  Protocol protocol = Protocol::Simple;
  int channels = 1;
};
CollectiveChoice resolve_collective(const Cluster& cluster, const CollectiveRequest& req);

// One collective alone on an idle network: its duration in ns.
int64_t collective_time_ns(const Cluster& cluster, const CollectiveRequest& req,
                           NetworkModel model);

}  // namespace orrery::sim
