"""PyTorch's DistributedDataParallel on the data of ddp_python_test.cpp.

  ddp_peer.py DIR MODE WORLD PER_RANK STEPS

Reads DIR/init.bin (flat float32 parameters) and DIR/x.bin, DIR/y.bin (float32, [STEPS,
WORLD * PER_RANK, 8] and [..., 4]), trains the test's MLP with DDP in WORLD processes
(Gloo, FileStore in DIR) exactly as the C++ scenario does, and writes each rank's final
parameters to DIR/py.rank<r>.bin. MODE is default, bucket_view, no_sync or no_sync_view.
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


def worker(rank, d, mode, world, per_rank, steps):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "pystore"),
                            rank=rank, world_size=world)
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
    flat(model).numpy().tofile(os.path.join(d, "py.rank%d.bin" % rank))
    # Every rank is done before any releases its group: PyTorch 2.x's Gloo can abort a
    # process whose peer tears down its connections while it still has work queued. The
    # DDP wrapper holds the group, so it goes first: the group is released here, not at
    # the interpreter's exit.
    dist.barrier()
    del ddp
    gc.collect()
    dist.destroy_process_group()


def main():
    d, mode = sys.argv[1], sys.argv[2]
    world, per_rank, steps = (int(a) for a in sys.argv[3:6])
    if mode not in ("default", "bucket_view", "no_sync", "no_sync_view"):
        sys.exit("ddp_peer.py: unknown mode %r" % mode)
    mp.spawn(worker, args=(d, mode, world, per_rank, steps), nprocs=world, join=True)


if __name__ == "__main__":
    main()
