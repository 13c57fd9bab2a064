#!/usr/bin/python3
"""Golden check of the CPU GPT against PyTorch (llm.c's test_gpt2 idea): loads a dump written by
`bench_model --dump FILE` (parameters, batch, loss, gradients of Orrery's model), puts the same
parameters into the reference PyTorch model of shared/reference/pytorch_gpt_ddp_cpu.py, runs
forward and backward, and prints the loss and every gradient's max abs difference.

  bench_model --dump /tmp/gpt.bin && bench/compare_torch_gpt.py /tmp/gpt.bin [--reference PATH]

Exit status 0 when everything agrees within fp32 tolerance, 1 otherwise.
"""
import argparse
import importlib.util
import os
import struct
import sys

import numpy as np


def read_dump(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"ORGD":
        sys.exit(f"{path}: not a bench_model dump")
    pos = 4

    def take(fmt, n=1):
        nonlocal pos
        size = struct.calcsize(fmt) * n
        vals = struct.unpack_from(f"<{n}{fmt}", data, pos)
        pos += size
        return vals

    L, C, H, V, T, B = take("i", 6)
    inputs = np.array(take("i", B * T), dtype=np.int64).reshape(B, T)
    targets = np.array(take("i", B * T), dtype=np.int64).reshape(B, T)
    (loss,) = take("f")
    (count,) = take("i")
    tensors = {}
    for _ in range(count):
        (n,) = take("i")
        name = data[pos:pos + n].decode()
        pos += n
        rows, cols = take("i", 2)
        p = np.array(take("f", rows * cols), dtype=np.float32).reshape(rows, cols)
        g = np.array(take("f", rows * cols), dtype=np.float32).reshape(rows, cols)
        tensors[name] = (p, g)
    return dict(L=L, C=C, H=H, V=V, T=T, B=B, inputs=inputs, targets=targets, loss=loss, tensors=tensors)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("--reference", default=os.path.join(here, "..", "..", "shared", "reference",
                                                         "pytorch_gpt_ddp_cpu.py"))
    args = ap.parse_args()
    d = read_dump(args.dump)
    spec = importlib.util.spec_from_file_location("ref", args.reference)
    ref = importlib.util.module_from_spec(spec)
    saved = sys.argv
    sys.argv = [saved[0]]
    spec.loader.exec_module(ref)
    sys.argv = saved
    import torch

    torch.set_num_threads(1)
    model = ref.GPT(d["V"], d["T"], d["L"], d["C"], d["H"])
    # Orrery tensor name -> PyTorch parameter (vectors are stored as one row in the dump).
    names = {"wte": model.wte.weight, "wpe": model.wpe.weight,
             "lnfw": model.ln_f.weight, "lnfb": model.ln_f.bias}
    for l, blk in enumerate(model.blocks):
        p = f"h.{l}."
        names.update({p + "ln1w": blk.ln1.weight, p + "ln1b": blk.ln1.bias,
                      p + "qkvw": blk.attn.qkv.weight, p + "qkvb": blk.attn.qkv.bias,
                      p + "projw": blk.attn.proj.weight, p + "projb": blk.attn.proj.bias,
                      p + "ln2w": blk.ln2.weight, p + "ln2b": blk.ln2.bias,
                      p + "fcw": blk.mlp.fc.weight, p + "fcb": blk.mlp.fc.bias,
                      p + "fcprojw": blk.mlp.proj.weight, p + "fcprojb": blk.mlp.proj.bias})
    with torch.no_grad():
        for name, (p, _) in d["tensors"].items():
            names[name].copy_(torch.from_numpy(p).reshape(names[name].shape))
    loss = model(torch.from_numpy(d["inputs"]), torch.from_numpy(d["targets"]))
    loss.backward()
    ok = True
    dl = abs(loss.item() - d["loss"])
    print(f"loss: orrery {d['loss']:.7f} torch {loss.item():.7f} diff {dl:.2e}")
    ok &= dl < 1e-5
    for name, (_, g) in d["tensors"].items():
        tg = names[name].grad.numpy().reshape(g.shape)
        diff = float(np.max(np.abs(tg - g)))
        scale = float(np.max(np.abs(tg)))
        good = diff <= 1e-5 + 1e-3 * scale
        ok &= good
        print(f"{name:12s} max|grad| {scale:.3e} maxdiff {diff:.3e} {'ok' if good else 'MISMATCH'}")
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
