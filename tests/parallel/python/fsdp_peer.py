"""PyTorch's FSDP2 (torch.distributed.fsdp.fully_shard) on the data of
fully_shard_python_test.cpp.

  fsdp_peer.py DIR WORLD PER_RANK STEPS [REPLICAS]

Reads DIR/init.bin (the model's parameters, float32, in named_parameters order), DIR/x.bin
and DIR/y.bin (int64 tokens and targets, [STEPS, WORLD * PER_RANK, CTX]), trains the
test's transformer with fully_shard on each block and on the root, Adam(lr=1e-2), in WORLD
processes (Gloo on CPUs, FileStore in DIR), and writes the full parameters after training
to DIR/py.bin. With REPLICAS > 1 the mesh is 2-D, (REPLICAS, WORLD / REPLICAS): FSDP2's
HSDP, sharding along dimension 1 and all-reducing across dimension 0. Exits 3 (and says
why) when this PyTorch has no FSDP2.
"""

import faulthandler
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

VOCAB, CTX, DIM, HEADS = 11, 6, 12, 2


class Block(nn.Module):
    """ddp_test::BlockImpl, parameters registered in the same order."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.fc = nn.Linear(DIM, 4 * DIM)
        self.out = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t, hd = x.size(0), x.size(1), DIM // HEADS
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)

        def heads(y):
            return y.view(b, t, HEADS, hd).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(mask, -1e9), -1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGpt(nn.Module):
    """ddp_test::TinyGptImpl: output weights tied to the token embedding."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(CTX, DIM)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln_f = nn.LayerNorm(DIM)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        x = self.ln_f(self.blocks(x))
        return F.linear(x, self.wte.weight)


def read(path, dtype, shape):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=dtype).reshape(shape).clone()


def worker(rank, d, world, per_rank, steps, replicas):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    faulthandler.enable()  # an abort inside PyTorch prints where Python was
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "pystore"),
                            rank=rank, world_size=world)
    model = TinyGpt()
    n = sum(p.numel() for p in model.parameters())
    init = read(os.path.join(d, "init.bin"), torch.float32, (n,))
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            p.copy_(init[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    if replicas > 1:
        mesh = init_device_mesh("cpu", (replicas, world // replicas),
                                mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = read(os.path.join(d, "x.bin"), torch.int64, (steps, world * per_rank, CTX))
    y = read(os.path.join(d, "y.bin"), torch.int64, (steps, world * per_rank, CTX))
    for s in range(steps):
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        out = model(x[s, rows])
        loss = F.cross_entropy(out.reshape(-1, VOCAB), y[s, rows].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    full = [p.full_tensor().detach().reshape(-1) for p in model.parameters()]
    if rank == 0:
        torch.cat(full).numpy().tofile(os.path.join(d, "py.bin.part"))
        os.replace(os.path.join(d, "py.bin.part"), os.path.join(d, "py.bin"))
    dist.barrier()
    # The result is written and every rank is past its last collective. Leave without
    # PyTorch's teardown: a Gloo worker thread destroyed at interpreter exit has aborted a
    # rank here ("terminate called without an active exception") after a complete run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    d, world, per_rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    replicas = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception as e:  # ImportError, or an older torch failing inside the package
        print(f"PyTorch {torch.__version__} has no torch.distributed.fsdp.fully_shard "
              f"(FSDP2): {type(e).__name__}: {e}")
        sys.exit(3)
    # fork: the ranks inherit the imported torch, where spawn would import it again in
    # each (seconds apiece). Nothing before this line starts a thread of ours.
    mp.start_processes(worker, args=(d, world, per_rank, steps, replicas), nprocs=world,
                       start_method="fork")


if __name__ == "__main__":
    main()
