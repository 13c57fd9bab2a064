#!/usr/bin/env python3
"""Writes tests/data/import/kineto_gpu_rank{0,1}.json: HAND-WRITTEN (not recorded) Kineto traces of
2 ranks x 2 profiler steps in the format torch.profiler's export_chrome_trace writes on a CUDA
machine (categories, args and metadata as PyTorch 2.x writes them), small enough that every count
and time in tests/traces/test_import.cpp can be checked by hand. Rank 1 is rank 0 shifted by 5 us.

Per rank, the GPU work (us, relative to baseTimeNanoseconds):
  stream 7:  sgemm [130, 530) step 2, memcpy [540, 540 + 10.0015) 4096 B, sgemm [1130, 1430)
             step 3, memset [1700, 1705) 1024 B
  stream 20: ncclDevKernel_AllReduce [230, 430): its args come from the record_param_comms with
             the same External id (1 Mi floats = 4 MiB); ncclDevKernel_AllGather [1400, 1600)
             with its own args (out 2000 bf16 = 4000 B)
  compute 700 us, communication 400 us, overlap 200 + 30 = 230 us.
Run: python3 tests/data/import/make_kineto_gpu_fixture.py
"""
import json
import os

OUT_DIR = os.path.dirname(os.path.abspath(__file__))
BASE_NS = 1700000000000000000


def events(rank):
    d = 5.0 * rank  # us
    host = 1234 + rank
    comm = {"Process Group Name": "0", "Process Group Description": "default_pg",
            "Group size": 2, "Process Group Ranks": "[0, 1]", "Rank": rank}

    def x(cat, name, ts, dur, pid, tid, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                "ts": ts + d, "dur": dur, "args": args}

    ev = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"name": "python 0"}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": 20, "args": {"name": "stream 20 "}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": host, "tid": host,
         "args": {"name": f"thread {host} (python)"}},
        x("Trace", "PyTorch Profiler (0)", 90.0, 2100.0, "Spans", 0),
        x("user_annotation", "ProfilerStep#2", 100.0, 1000.0, host, host, **{"External id": 1}),
        x("python_function", "train.py(12): step", 100.0, 1.0, host, host),
        x("user_annotation", "forward", 105.0, 50.0, host, host, **{"External id": 2}),
        x("cpu_op", "aten::mm", 110.5, 20.25, host, host, **{"External id": 10}),
        x("cuda_runtime", "cudaLaunchKernel", 120.0, 5.0, host, host, correlation=1001, **{"External id": 10}),
        x("cpu_op", "record_param_comms", 200.0, 30.0, host, host, **{
            "External id": 20, "Collective name": "allreduce", "In msg nelems": 1048576,
            "Out msg nelems": 1048576, "dtype": "Float"}, **comm),
        x("cuda_runtime", "cudaLaunchKernel", 210.0, 5.0, host, host, correlation=1002, **{"External id": 20}),
        x("user_annotation", "ProfilerStep#3", 1100.0, 1000.0, host, host, **{"External id": 30}),
        x("cpu_op", "aten::mm", 1110.0, 20.0, host, host, **{"External id": 31}),
        x("cuda_runtime", "cudaLaunchKernel", 1120.0, 5.0, host, host, correlation=1003, **{"External id": 31}),
        x("cpu_op", "record_param_comms", 1200.0, 30.0, host, host, **{
            "External id": 40, "Collective name": "_allgather_base", "In msg nelems": 1000,
            "Out msg nelems": 2000, "dtype": "BFloat16"}, **comm),
        x("cuda_runtime", "cudaLaunchKernel", 1210.0, 5.0, host, host, correlation=1004, **{"External id": 40}),
        x("kernel", "ampere_sgemm_128x64_nn", 130.0, 400.0, 0, 7, device=0, stream=7, correlation=1001,
          **{"External id": 10}),
        x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
          230.0, 200.0, 0, 20, device=0, stream=20, correlation=1002, **{"External id": 20}),
        x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 540.0, 10.0015, 0, 7, device=0, stream=7,
          correlation=1005, bytes=4096),
        x("kernel", "ampere_sgemm_128x64_nn", 1130.0, 300.0, 0, 7, device=0, stream=7, correlation=1003,
          **{"External id": 31}),
        x("kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
          1400.0, 200.0, 0, 20, device=0, stream=20, correlation=1004, **{
              "External id": 40, "Collective name": "_allgather_base", "In msg nelems": 1000,
              "Out msg nelems": 2000, "dtype": "BFloat16"}, **comm),
        x("gpu_memset", "Memset (Device)", 1700.0, 5.0, 0, 7, device=0, stream=7, bytes=1024),
        {"ph": "s", "id": 1001, "pid": host, "tid": host, "ts": 120.0 + d, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 1001, "pid": 0, "tid": 7, "ts": 130.0 + d, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": host, "tid": host,
         "ts": 150.0 + d, "args": {"Device Type": 1, "Device Id": 0, "Addr": 139800000000000,
                                   "Bytes": 1024, "Total Allocated": 1048576, "Total Reserved": 2097152}},
    ]
    return ev


for rank in (0, 1):
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2, "pg_count": 1,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config":
                                           "cuda:nccl", "pg_size": 2, "ranks": [0, 1]}]},
        "traceEvents": events(rank),
        "traceName": f"kineto_gpu_rank{rank}.json",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
    }
    with open(os.path.join(OUT_DIR, f"kineto_gpu_rank{rank}.json"), "w") as f:
        json.dump(trace, f, indent=1)
