#!/usr/bin/env python3
"""The GEMM error of a profile on real GPU traces, from `orrery calibrate ... --json` output.

Reads the JSON that `orrery calibrate TRACE --json` (fitted) or `orrery calibrate TRACE --check
PROFILE --json` (a profile priced against the trace, nothing fitted) prints, keeps the GEMM
operators (aten::mm, addmm, bmm, matmul, linear), and prints per shape the instances, the measured
and modelled median time and the error, then the time-weighted absolute error
    sum(count x |modelled - measured|) / sum(count x measured)
over all GEMMs and over those of at least 2 GFLOP. scenarios/hardware/README.md uses it for the
A100 real-trace check.

    bench/gemm_trace_error.py CALIBRATE.json [--min-gflop G] [--quiet]
"""
import argparse
import json
import re
import sys

GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")


def gflop(shape):
    """2·B·M·N·K of a calibrate shape text ("1024x 647x30x96 e4" or "98304x15x647 e4")."""
    dims = [int(x) for x in re.findall(r"\d+", shape.split(" e")[0])]
    if len(dims) == 3:
        dims = [1] + dims
    b, m, n, k = dims
    return 2.0 * b * m * n * k / 1e9


def weighted_error(rows):
    den = sum(r["count"] * r["measured_ns"] for r in rows)
    num = sum(r["count"] * abs(r["fitted_ns"] - r["measured_ns"]) for r in rows)
    return 100.0 * num / den if den > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("--min-gflop", type=float, default=2.0)
    ap.add_argument("--quiet", action="store_true", help="only the two weighted errors")
    a = ap.parse_args()
    with open(a.json) as f:
        ops = json.load(f)["ops"]
    rows = [o for o in ops if o["name"] in GEMMS]
    if not rows:
        sys.exit(f"{a.json}: no GEMM operators")
    rows.sort(key=lambda o: -o["count"] * o["measured_ns"])
    if not a.quiet:
        print(f"{'op':12} {'shape':24} {'GFLOP':>7} {'count':>5} {'measured_us':>12} "
              f"{'modelled_us':>12} {'error_%':>8}")
        for o in rows:
            err = 100.0 * (o["fitted_ns"] - o["measured_ns"]) / o["measured_ns"]
            print(f"{o['name']:12} {o['shape']:24} {gflop(o['shape']):7.2f} {o['count']:5d} "
                  f"{o['measured_ns'] / 1e3:12.1f} {o['fitted_ns'] / 1e3:12.1f} {err:+8.1f}")
    big = [o for o in rows if gflop(o["shape"]) >= a.min_gflop]
    print(f"time-weighted absolute GEMM error: {weighted_error(rows):.1f} % over {len(rows)} "
          f"shapes; {weighted_error(big):.1f} % over the {len(big)} of >= {a.min_gflop:g} GFLOP")


if __name__ == "__main__":
    main()
