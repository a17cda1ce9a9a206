"""PyTorch's side of bench/run-fsdp: the same block model, batch and Adam as bench_fsdp,
under FSDP2 (torch.distributed.fsdp.fully_shard on each block and the root) or DDP, on
CPUs with Gloo. Run one process per rank under a launcher that sets torchrun's variables:

  ddprun --nproc-per-node 2 --no-prefix -- python bench/fsdp_py.py fsdp2|ddp [--dim D] ...

Prints bench_fsdp's line of JSON on rank 0.
"""

import argparse
import json
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["fsdp2", "ddp"])
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(a.dim) for _ in range(a.blocks)])
    unit_bytes = sum(p.numel() * p.element_size() for p in model[0].parameters())
    if a.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        run = model
    else:
        run = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    times = []
    for it in range(a.warmup + a.iters):
        x = torch.randn(a.batch, a.dim)
        t0 = time.perf_counter()
        run(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if it >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)

    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = sum(local(p) for p in model.parameters())
    grads = sum(local(p.grad) for p in model.parameters() if p.grad is not None)
    state = sum(local(v) for s in opt.state.values() for v in s.values()
                if torch.is_tensor(v) and v.dim() > 0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    vals = torch.tensor([statistics.median(times), rss, params, grads, state], dtype=torch.float64)
    dist.all_reduce(vals, op=dist.ReduceOp.MAX)
    if rank == 0:
        ms, rss, params, grads, state = vals.tolist()
        print(json.dumps({"mode": "pytorch-" + a.mode, "backend": "gloo", "world": world,
                          "ms": ms, "peak_rss": int(rss), "params": int(params),
                          "grads": int(grads), "optimizer": int(state),
                          "unit_bytes": unit_bytes}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
