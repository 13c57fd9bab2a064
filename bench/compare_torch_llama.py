#!/usr/bin/python3
"""Golden check of the CPU Llama-style model against PyTorch: loads a dump written by
`bench_model --dump FILE --llama` (parameters, batch, loss and gradients of Orrery's model with
grouped-query attention, SwiGLU, RMSNorm, RoPE, an untied LM head and no biases), builds the same
model from torch operations below (written from the papers' definitions: RMSNorm, Zhang & Sennrich
2019; rotary embeddings in the rotate-half pairing of GPT-NeoX, Su et al. 2021; grouped-query
attention, Ainslie et al. 2023; SwiGLU, Shazeer 2020), runs forward and backward with autograd, and
prints the loss and every gradient's max abs difference.

  bench_model --dump /tmp/llama.bin --llama && bench/compare_torch_llama.py /tmp/llama.bin

Exit status 0 when everything agrees within fp32 tolerance, 1 otherwise.
"""
import argparse
import struct
import sys

import numpy as np


def read_dump(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"ORGL":
        sys.exit(f"{path}: not a bench_model --llama dump")
    pos = 4

    def take(fmt, n=1):
        nonlocal pos
        vals = struct.unpack_from(f"<{n}{fmt}", data, pos)
        pos += struct.calcsize(fmt) * n
        return vals

    L, C, H, V, T, B = take("i", 6)
    KV, F = take("i", 2)
    (theta,) = take("d")
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
    return dict(L=L, C=C, H=H, V=V, T=T, B=B, KV=KV, F=F, theta=theta, inputs=inputs,
                targets=targets, loss=loss, tensors=tensors)


def forward(torch, d, P):
    """The loss of the model whose parameters are the leaf tensors P[name]."""
    B, T, C, H, KV, F = d["B"], d["T"], d["C"], d["H"], d["KV"], d["F"]
    hs, group = C // H, H // KV

    def rmsnorm(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * w

    # Rotation angles t * theta^(-2i/hs), computed in double as Orrery does.
    half = hs // 2
    inv = torch.tensor([d["theta"] ** (-2.0 * i / hs) for i in range(half)], dtype=torch.float64)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()

    def rope(x):  # (B, heads, T, hs)
        lo, hi = x[..., :half], x[..., half:]
        return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1)

    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = P["wte"][torch.from_numpy(d["inputs"])]
    for l in range(d["L"]):
        p = f"h.{l}."
        h = rmsnorm(x, P[p + "ln1w"][0])
        qkv = h @ P[p + "qkvw"].T
        q = qkv[..., :C].reshape(B, T, H, hs).transpose(1, 2)
        k = qkv[..., C:C + KV * hs].reshape(B, T, KV, hs).transpose(1, 2)
        v = qkv[..., C + KV * hs:].reshape(B, T, KV, hs).transpose(1, 2)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(group, dim=1)  # query head h reads kv head h // group
        v = v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-1, -2)) / hs ** 0.5
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ P[p + "projw"].T
        h = rmsnorm(x, P[p + "ln2w"][0])
        gu = h @ P[p + "fcw"].T
        gate, up = gu[..., :F], gu[..., F:]
        x = x + (torch.nn.functional.silu(gate) * up) @ P[p + "fcprojw"].T
    logits = rmsnorm(x, P["lnfw"][0]) @ P["lmw"].T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, d["V"]),
                                             torch.from_numpy(d["targets"]).reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    args = ap.parse_args()
    d = read_dump(args.dump)
    import torch

    torch.set_num_threads(1)
    P = {name: torch.tensor(p, requires_grad=True) for name, (p, _) in d["tensors"].items()}
    expected = {"wte", "lnfw", "lmw"} | {f"h.{l}.{n}" for l in range(d["L"]) for n in
                                         ("ln1w", "qkvw", "projw", "ln2w", "fcw", "fcprojw")}
    if set(P) != expected:
        sys.exit(f"{args.dump}: tensors {sorted(P)} are not a Llama-style model's {sorted(expected)}")
    loss = forward(torch, d, P)
    loss.backward()
    ok = True
    dl = abs(loss.item() - d["loss"])
    print(f"loss: orrery {d['loss']:.7f} torch {loss.item():.7f} diff {dl:.2e}")
    ok &= dl < 1e-5
    for name, (_, g) in d["tensors"].items():
        tg = P[name].grad.numpy()
        diff = float(np.max(np.abs(tg - g)))
        scale = float(np.max(np.abs(tg)))
        good = diff <= 1e-5 + 1e-3 * scale
        ok &= good
        print(f"{name:12s} max|grad| {scale:.3e} maxdiff {diff:.3e} {'ok' if good else 'MISMATCH'}")
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
