// Collective spans grouped into the operations they belong to, and point-to-point spans matched
// into transfers: what the metrics, the calibration, the replay and commbench's table all need
// before they time anything. Results are span indices into the span list passed in.
//
// A collective instance is every Collective span with one (comm, seq): the same operation seen on
// each member rank. A transfer is the k-th send from rank a to rank b on communicator c with the
// k-th receive on b from a on c (the pairing MPI and NCCL guarantee for one tag and communicator).
// Neither checks completeness: a member missing from the trace is simply absent (compare
// members.size() with the communicator's size), a send without its receive is left out.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "orrery/traces/span.hpp"

namespace orrery::traces {

// Which spans take part (empty: every span of the kind the helper looks at).
using SpanFilter = std::function<bool(const Span&)>;

struct CollectiveInstance {
  int32_t comm = -1;
  int64_t seq = -1;
  // Span indices, in rank order; spans of one rank in span order. The span that comes last in the
  // trace (what "the last one seen" meant in a pass over the spans) is the largest index.
  std::vector<uint32_t> members;
};

struct CollectiveOptions {
  // Filtering here is the same as dropping members afterwards; an instance left without members
  // is not returned.
  SpanFilter keep;
  // False: spans with comm < 0 are grouped too, by (comm, seq) like the others (the metrics do, for
  // hand-written traces that number collectives without naming a communicator).
  bool require_comm = true;
};

// Collective spans with seq >= 0 (and comm >= 0 unless !require_comm), grouped by (comm, seq),
// sorted by (comm, seq). Linear in the spans when sequence numbers are dense per communicator (a
// counting sort), n log n otherwise. Callers that need the members by start time sort them.
std::vector<CollectiveInstance> collective_instances(std::span<const Span> spans,
                                                     const CollectiveOptions& opt = {});

struct P2pMatch {
  uint32_t send = 0;  // span index of the Send (on the sending rank)
  uint32_t recv = 0;  // span index of the matching Recv (on the receiving rank)
};

// How the k-th send (and receive) of a flow is counted. Ties in each key: span order.
enum class P2pOrder {
  Start,   // by start time (the calibration)
  Seq,     // by (seq, start, end): issue order per communicator (commbench's table)
  Stream,  // by (stream, start, end): a rank's recorded order, stream by stream (the replay)
};

struct P2pOptions {
  // Unlike for collectives, filtering changes which send is the k-th: spans left out are not
  // counted on either side.
  SpanFilter keep;
  bool require_comm = true;  // false: spans with comm < 0 match too, as communicator comm
  bool by_bytes = false;     // true: a flow is (comm, sender, receiver, bytes) (commbench)
  P2pOrder order = P2pOrder::Start;
};

// P2P spans with op Send or Recv and peer >= 0 (and comm >= 0 unless !require_comm), matched per
// flow (comm, sender, receiver[, bytes]). Sorted by (comm, sender, receiver[, bytes], k); callers
// that walk flows in another order sort the result (stably).
std::vector<P2pMatch> match_p2p(std::span<const Span> spans, const P2pOptions& opt = {});

}  // namespace orrery::traces
