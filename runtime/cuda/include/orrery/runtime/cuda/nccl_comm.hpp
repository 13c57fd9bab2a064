// Communicators for device buffers: NCCL (one GPU per rank) and the host-staged MPI communicator
// (several ranks sharing one GPU). Both implement runtime::Communicator (comm.hpp) with device
// pointers as buffers, and both order themselves against the caller's compute stream:
//  - at issue time an event is recorded on `compute_stream` and the communicator's own CUDA stream
//    waits on it, so an operation sees every kernel the caller queued before issuing it;
//  - Handle::wait() makes `compute_stream` wait on the operation's completion event and returns
//    without blocking the host (kernels queued afterwards on `compute_stream` run after it);
//    done() queries that event; synchronize() blocks the host until everything issued is done.
//    A wait that would hang (NCCL: the operation not complete after WorldOptions::watchdog_s) is
//    ended by a watchdog that aborts the NCCL communicator (ncclCommAbort) and throws.
//  - Spans: Collective/P2P spans on their group's trace stream, as the CPU runtime and the
//    simulator name them (comm_stream_of: comm.dp, comm.tp, comm.pp.send, comm.pp.recv; the staged
//    communicator's are the MPI communicator's own), with the MPI communicator's attributes (op, bytes,
//    comm id, peer, seq, label); times come from CUDA events, mapped onto the recorder's steady
//    clock when the events are resolved (off the hot path: at the next operation, synchronize(),
//    or destruction). Flight-recorder entries as the MPI communicator's. Under the CUPTI tracer
//    the NCCL kernel of an operation carries the same identity and is the counted span; this span
//    is then kind Other (profiler/range_hooks.hpp says who counts what when).
// all_to_all_v (expert parallelism): NCCL exchanges the counts first in one NCCL group and waits
// for them on the host (the receive layout depends on them), then the data in one group of a send
// and a receive per peer; the staged communicator runs the host's on staged copies and copies back
// only what arrived.
// Errors (no GPU, NCCL failing to start, an NCCL async error) throw InternalError with the cause
// (cudaGetErrorString / ncclGetErrorString, ncclCommGetAsyncError); nothing here exits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "orrery/runtime/comm.hpp"

namespace orrery::runtime::cuda {

// An NCCL communicator over the ranks of `bootstrap` (usually the MPI world): rank 0 creates the
// ncclUniqueId and broadcasts it over `bootstrap` in host memory; every rank then calls
// ncclCommInitRank on the CUDA device current on the calling thread. The result has the id, kind,
// name and ranks of `bootstrap` (its global ranks are the bootstrap's). split() uses ncclCommSplit
// (a collective over this communicator; color < 0 returns nullptr). abort() aborts the NCCL
// communicator and then calls bootstrap.abort(code). `bootstrap` must outlive the result.
// Throws InternalError when there is no usable device or NCCL fails to start (message says why).
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     cudaStream_t compute_stream,
                                                     const WorldOptions& opt = {});

// How far the span times of an NCCL communicator from make_nccl_communicator may be off the
// recorder's steady clock: the largest half-interval of the host-side bracket of any anchor its
// engine took (microseconds on bare metal, more in a sandbox). -1 for any other communicator.
int64_t nccl_clock_error_ns(const Communicator& c);

// Wraps `host_comm` (an MPI or local communicator on host memory) for device buffers: each
// operation copies its device input to a pinned host buffer (cudaMemcpyAsync on its own stream,
// after `compute_stream`'s work issued so far), runs the host operation, and copies the result
// back; operations complete in whatever order their host operations do, as MPI's; wait() blocks
// the host until the copy back is done and orders `compute_stream` after it. For ranks that share
// one GPU, where NCCL refuses two ranks on one device, and for pipeline traffic under 1F1B (see
// cuda/trainer.hpp). split() wraps host_comm.split(). A copy that does not finish within
// `watchdog_s` (runtime.watchdog_s) fails the operation. `host_comm` must outlive the result.
std::unique_ptr<Communicator> make_staged_communicator(
    Communicator& host_comm, cudaStream_t compute_stream,
    double watchdog_s = WorldOptions{}.watchdog_s);

}  // namespace orrery::runtime::cuda
