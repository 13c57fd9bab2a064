#!/usr/bin/env python3
"""Writes tests/data/calibrate/kineto_h100_calib.json and kineto_h100_noshapes.json: HAND-WRITTEN
(generated, not recorded) Kineto traces of one H100 rank in the format torch.profiler writes with
record_shapes=True (cpu_op events with "Input Dims", "Input type", "Concrete Inputs"; kernels
linked to their op by "External id" and correlation), whose kernel durations come from a KNOWN
profile, so that `orrery calibrate` must recover it (tests/sim/test_calibrate_gpu.cpp):

  H100-SXM preset peaks (989 TFLOP/s bf16, 3.35 TB/s), the preset's gemm_shape model (132 SMs,
  tiles 128x256 .. 64x64, k_fixed 32, split-K until the grid fills the SMs with its fp32 partial
  outputs through memory, 1830 MHz, no L2 term, 64 bf16 elements of K per main-loop iteration)
  with a main-loop iteration latency of 96 cycles (the preset's is 64), and
    gemm ceiling 0.80, attention 0.62, elementwise 0.90, layernorm 0.75, softmax_loss 0.70,
    optimizer 0.78 of HBM bandwidth, 4.5 us per kernel launched;
  GEMM and attention kernels on the memory side of their roofline at the preset's 0.85.

The shape model and the byte rules are written here again, independently of the C++ (from
scenarios/hardware/README.md and traces/include/orrery/traces/kernel_work.hpp): a kernel takes
ceil(max(flops / (peak x eff x shape), bytes / (bw x bw_eff)) in ns) + launches x 4.5 us, split over
the op's kernels when it launches several.

The noshapes file is the same trace with every "Input Dims" removed (a profile taken without
record_shapes): nothing can be fitted from it.
Run: python3 tests/data/calibrate/make_kineto_h100_fixture.py
"""
import json
import math
import os

OUT_DIR = os.path.dirname(os.path.abspath(__file__))
PEAK = 989e12
BW = 3350e9
SMS = 132
TILES = [(128, 256, 1.0), (256, 128, 1.0), (128, 128, 0.75), (64, 128, 0.5), (128, 64, 0.5),
         (64, 64, 0.375)]
K_FIXED = 32
MAX_SPLIT = SMS
CLOCK_HZ = 1830e6
LATENCY_CYCLES = 96
TILE_K = 64  # 128 bytes of bf16
TRUTH = {"gemm": 0.80, "attention": 0.62, "elementwise": 0.90, "layernorm": 0.75,
         "softmax_loss": 0.70, "optimizer": 0.78}
GEMM_BW_EFF = 0.85  # the preset's (not fitted)
OVERHEAD_NS = 4500
BF16 = "c10::BFloat16"


def shape_eff(m, n, k):
    """The fraction of the ceiling: the ideal time (m n k MMAs over every SM at its share of the
    peak) over the fastest tile and split-K factor's time."""
    step = 2.0 * SMS / PEAK  # one SM's MMA of one output element over one K element
    ideal = m * n * k / SMS * step
    best = float("inf")
    for tm, tn, rel in TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        for split in range(1, MAX_SPLIT + 1):
            if split > 1 and (tiles * split > SMS or k / split < 1):
                break
            waves = math.ceil(tiles * split / SMS)
            mma = tm * tn / rel * step  # seconds per K element of the tile
            chunk = k / split
            latency = LATENCY_CYCLES / CLOCK_HZ / TILE_K  # seconds per K element
            t = waves * (chunk * mma + max(chunk, TILE_K) * latency + K_FIXED * mma)
            if split > 1:
                t += 8.0 * split * m * n / BW  # fp32 partials written and read
            best = min(best, t)
    return min(1.0, ideal / best)


def numel(d):
    n = 1
    for x in d:
        n *= x
    return n


# ---- ops: (name, input dims, input types, concrete inputs, class, flops, bytes, shape efficiency)

def gemm_op(name, dims, m, n, k, batch=1, types=None):
    e = 2
    flops = 2.0 * batch * m * n * k
    nbytes = e * batch * (m * k + k * n + m * n)
    t = types or [BF16 if d else "" for d in dims]
    return dict(name=name, dims=dims, types=t, concrete=["" for _ in dims], cls="gemm",
                flops=flops, bytes=nbytes, eff=shape_eff(m * batch, n, k))


def attn_op(q, k, causal, backward):
    b, h, t, d = q
    s = k[2]
    mult = 2.0 if backward else 1.0
    flops = mult * (2.0 if causal else 4.0) * b * h * t * s * d
    nbytes = mult * 2 * b * h * d * (2 * t + 2 * s)
    if backward:
        name = "aten::_scaled_dot_product_flash_attention_backward"
        dims = [q, q, k, k, q, [b, h, t], [], [], [], [], [], [], [], [], []]
        concrete = [""] * 10 + ["0.0", "True" if causal else "False", "", "", ""]
    else:
        name = "aten::_scaled_dot_product_flash_attention"
        dims = [q, k, k, [], [], [], []]
        concrete = ["", "", "", "0.0", "True" if causal else "False", "False", ""]
    types = [BF16 if x else "" for x in dims]
    return dict(name=name, dims=dims, types=types, concrete=concrete, cls="attention", flops=flops,
                bytes=nbytes, eff=1.0)


def mem_op(name, cls, dims, types, written=None):
    """Every tensor input read once, the output (largest input; `written`: those inputs) once."""
    sizes = []
    for d, t in zip(dims, types):
        e = {BF16: 2, "float": 4}.get(t, 4)
        if d and isinstance(d[0], list):
            sizes.append(sum(e * numel(x) for x in d))
        elif d:
            sizes.append(e * numel(d))
        else:
            sizes.append(0)
    out = max(sizes) if written is None else sum(sizes[i] for i in written)
    return dict(name=name, dims=dims, types=types, concrete=["" for _ in dims], cls=cls, flops=0.0,
                bytes=float(sum(sizes) + out), eff=1.0)


def ops():
    o = []
    # GEMMs (bf16): large ones near the ceiling, skinny and small ones far below it, the third wave.
    o += [gemm_op("aten::mm", [[8192, 8192], [8192, 8192]], 8192, 8192, 8192)]
    o += [gemm_op("aten::mm", [[4096, 4096], [4096, 4096]], 4096, 4096, 4096)] * 3
    o += [gemm_op("aten::addmm", [[4608], [2048, 12288], [12288, 4608], [], []], 2048, 4608, 12288)]
    o += [gemm_op("aten::linear", [[4, 512, 1536], [12288, 1536], [12288]], 2048, 12288, 1536)]
    o += [gemm_op("aten::mm", [[1024, 1024], [1024, 1024]], 1024, 1024, 1024)] * 2
    o += [gemm_op("aten::mm", [[16896, 8192], [8192, 512]], 16896, 512, 8192)] * 2
    o += [gemm_op("aten::mm", [[16896, 8192], [8192, 520]], 16896, 520, 8192)] * 2
    o += [gemm_op("aten::bmm", [[8, 1024, 2048], [8, 2048, 1024]], 1024, 1024, 2048, batch=8)]
    o += [gemm_op("aten::matmul", [[8, 256, 1024], [1024, 1024]], 2048, 1024, 1024)]
    o += [gemm_op("aten::mm", [[16, 4096], [4096, 4096]], 16, 4096, 4096)]  # memory-bound
    o += [gemm_op("aten::mm", [[256, 256], [256, 256]], 256, 256, 256)] * 2
    split = gemm_op("aten::mm", [[512, 8192], [8192, 512]], 512, 512, 8192)
    split["kernels"] = 2  # a split-K product and its reduction
    o += [split]
    # fused attention (bf16)
    o += [attn_op([4, 16, 2048, 128], [4, 16, 2048, 128], True, False),
          attn_op([4, 16, 2048, 128], [4, 16, 2048, 128], True, True),
          attn_op([2, 32, 4096, 128], [2, 32, 4096, 128], True, False),
          attn_op([2, 32, 4096, 128], [2, 32, 4096, 128], True, True),
          attn_op([8, 16, 1024, 128], [8, 16, 1024, 128], False, False)]
    # memory-bound
    o += [mem_op("aten::add", "elementwise", [[8192, 4096], [8192, 4096], []], [BF16, BF16, "Scalar"]),
          mem_op("aten::gelu", "elementwise", [[4096, 16384], []], [BF16, "c10::string_view"]),
          mem_op("aten::mul", "elementwise", [[1024, 1024], [1024, 1024]], [BF16, BF16]),
          mem_op("aten::add_", "elementwise", [[256, 256], [256, 256], []], [BF16, BF16, "Scalar"],
                 written=[0]),
          mem_op("aten::copy_", "elementwise", [[2048, 2048], [2048, 2048], []], ["float", BF16, "bool"],
                 written=[0])]
    o += [mem_op("aten::native_layer_norm", "layernorm", [[8192, 4096], [], [4096], [4096], []],
                 [BF16, "", BF16, BF16, "double"]),
          mem_op("aten::native_layer_norm", "layernorm", [[1024, 1024], [], [1024], [1024], []],
                 [BF16, "", BF16, BF16, "double"]),
          mem_op("aten::native_layer_norm_backward", "layernorm",
                 [[8192, 4096], [8192, 4096], [], [8192, 1], [8192, 1], [4096], [4096], []],
                 [BF16, BF16, "", "float", "float", BF16, BF16, ""])]
    o += [mem_op("aten::_log_softmax", "softmax_loss", [[8192, 50304], [], []], [BF16, "", "bool"]),
          mem_op("aten::_log_softmax_backward_data", "softmax_loss",
                 [[8192, 50304], [8192, 50304], [], []], [BF16, BF16, "", ""]),
          mem_op("aten::_softmax", "softmax_loss", [[64, 1024, 1024], [], []], [BF16, "", "bool"])]
    params = [[4096, 4096], [4096], [4096, 16384], [16384]]
    adam = mem_op("aten::_fused_adamw_", "optimizer",
                  [params, params, params, params, [], [[] for _ in params]],
                  ["TensorList"] * 6, written=[0, 2, 3])
    adam["kernels"] = 3  # multi_tensor_apply in chunks
    o += [adam,
          mem_op("aten::_foreach_add_", "optimizer", [[[1024, 1024], [1024]], [[1024, 1024], [1024]]],
                 ["TensorList", "TensorList"], written=[0])]
    return o


def duration_ns(op):
    cls = op["cls"]
    eff = TRUTH[cls]
    if cls in ("gemm", "attention"):
        tc = op["flops"] / (PEAK * eff * op["eff"])
        bw_eff = GEMM_BW_EFF
        tm = op["bytes"] / (BW * bw_eff)
        t = max(tc, tm)
    else:
        t = op["bytes"] / (BW * eff)
    return math.ceil(t * 1e9) + op.get("kernels", 1) * OVERHEAD_NS


def us(ns):
    return round(ns / 1000.0, 3)


def events(with_shapes):
    host, stream = 4242, 7
    ev = [{"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": stream,
           "args": {"name": "stream 7 "}}]
    t_host = 100_000  # ns
    t_dev = 200_000
    ext = 100
    corr = 5000
    kernels = []
    for op in ops():
        ext += 1
        args = {"External id": ext}
        if with_shapes:
            args.update({"Input Dims": op["dims"], "Input type": op["types"],
                         "Concrete Inputs": op["concrete"]})
        ev.append({"ph": "X", "cat": "cpu_op", "name": op["name"], "pid": host, "tid": host,
                   "ts": us(t_host), "dur": us(8000), "args": args})
        total = duration_ns(op)
        n = op.get("kernels", 1)
        parts = [total - (n - 1) * (OVERHEAD_NS + 1000)] + [OVERHEAD_NS + 1000] * (n - 1)
        for i, part in enumerate(parts):
            corr += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": host,
                       "tid": host, "ts": us(t_host + 1000 + 1000 * i), "dur": us(900),
                       "args": {"correlation": corr, "External id": ext}})
            kname = "sm90_xmma_gemm_bf16bf16_bf16f32" if op["cls"] == "gemm" else op["name"] + "_kernel"
            # The first kernel of each op names its op by External id; the others only by their
            # launch's correlation (both links occur in PyTorch's files).
            kargs = {"device": 0, "stream": stream, "correlation": corr}
            if i == 0:
                kargs["External id"] = ext
            kernels.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": stream,
                            "ts": us(t_dev), "dur": us(part), "args": kargs})
            t_dev += part + 1000
        t_host += 10_000
    ev.insert(1, {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "pid": host,
                  "tid": host, "ts": us(50_000), "dur": us(max(t_host, t_dev)),
                  "args": {"External id": 1}})
    return ev + kernels


for name, shapes in (("kineto_h100_calib.json", True), ("kineto_h100_noshapes.json", False)):
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912,
                              "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
        "traceEvents": events(shapes),
        "traceName": name,
        "displayTimeUnit": "ms",
    }
    with open(os.path.join(OUT_DIR, name), "w") as f:
        json.dump(trace, f, indent=0)
        f.write("\n")
