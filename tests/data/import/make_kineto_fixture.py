#!/usr/bin/env python3
"""Writes tests/data/import/torch113_legacy_ddp_cpu_rank{0,1}.json: a real torch.profiler Chrome trace of a
tiny GPT-like model trained with DDP over gloo on 2 CPU processes for 3 profiled steps.

Run with a Python that has torch (Debian: apt-get install python3-torch):
    python3 tests/data/import/make_kineto_fixture.py
The files are committed; CI does not need torch. Loopback only (127.0.0.1).
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function, schedule

OUT_DIR = os.path.dirname(os.path.abspath(__file__))
V, T, C, L, B = 64, 16, 32, 1, 2  # vocab, sequence, channels, layers, batch


class Block(nn.Module):
    """A GPT block without attention (kept small: every aten op is an event in the file)."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.Sequential(*[Block() for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        return self.head(self.lnf(self.blocks(self.wte(idx) + self.wpe(pos))))


def worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29533"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(TinyGPT())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    sched = schedule(wait=0, warmup=1, active=3, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, profile_memory=True) as prof:
        for _ in range(4):
            idx = torch.randint(0, V, (B, T), generator=g)
            logits = model(idx)
            loss = nn.functional.cross_entropy(logits.view(-1, V), idx.view(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    prof.export_chrome_trace(os.path.join(OUT_DIR, f"torch113_legacy_ddp_cpu_rank{rank}.json"))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
    sys.exit(0)
