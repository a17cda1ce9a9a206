"""PyTorch's DistributedDataParallel on the data of ddp_python_test.cpp.

  ddp_peer.py DIR MODES WORLD PER_RANK STEPS

Reads DIR/init.bin (flat float32 parameters) and DIR/x.bin, DIR/y.bin (float32, [STEPS,
WORLD * PER_RANK, 8] and [..., 4]) and, for each mode of MODES (comma-separated: default,
bucket_view, no_sync, no_sync_view), trains the test's MLP with DDP in WORLD processes
(Gloo, FileStore in DIR) exactly as the C++ scenario does, and writes each rank's final
parameters to DIR/py.<mode>.rank<r>.bin. The modes share one group and one start-up.
"""

import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn


class Mlp(nn.Module):
    """ddp_test::Mlp: 8 -> 16 -> 16 -> 4 with ReLU, parameters in the same order."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def read(path, shape):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.float32).reshape(shape).clone()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def worker(rank, d, modes, world, per_rank, steps):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "pystore"),
                            rank=rank, world_size=world)
    for mode in modes:
        train(rank, d, mode, world, per_rank, steps)
    # Every rank is done before any releases its group: PyTorch 2.x's Gloo can abort a
    # process whose peer tears down its connections while it still has work queued.
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


def train(rank, d, mode, world, per_rank, steps):
    bucket_view = mode in ("bucket_view", "no_sync_view")
    no_sync = mode in ("no_sync", "no_sync_view")
    model = Mlp()
    n = sum(p.numel() for p in model.parameters())
    init = read(os.path.join(d, "init.bin"), (n,)) + (0.0 if rank == 0 else 0.5)
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            p.copy_(init[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    x = read(os.path.join(d, "x.bin"), (steps, world * per_rank, 8))
    y = read(os.path.join(d, "y.bin"), (steps, world * per_rank, 4))
    ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=bucket_view)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(steps):
        opt.zero_grad(set_to_none=not bucket_view)
        xs = x[s, rank * per_rank:(rank + 1) * per_rank]
        ys = y[s, rank * per_rank:(rank + 1) * per_rank]
        if no_sync:
            h = per_rank // 2
            with ddp.no_sync():
                F.mse_loss(ddp(xs[:h]), ys[:h]).backward()
            F.mse_loss(ddp(xs[h:]), ys[h:]).backward()
        else:
            F.mse_loss(ddp(xs), ys).backward()
        opt.step()
    flat(model).numpy().tofile(os.path.join(d, "py.%s.rank%d.bin" % (mode, rank)))
    # The next mode's DDP wrapper must not meet this one's hooks or buckets.
    dist.barrier()
    del ddp


def main():
    d, modes = sys.argv[1], sys.argv[2].split(",")
    world, per_rank, steps = (int(a) for a in sys.argv[3:6])
    for mode in modes:
        if mode not in ("default", "bucket_view", "no_sync", "no_sync_view"):
            sys.exit("ddp_peer.py: unknown mode %r" % mode)
    # fork: the ranks inherit the imported torch, where spawn would import it again in
    # each (seconds apiece). Nothing before this line starts a thread of ours.
    mp.start_processes(worker, args=(d, modes, world, per_rank, steps), nprocs=world,
                       start_method="fork")


if __name__ == "__main__":
    main()
