"""PyTorch side of the DDP comparison: one trial of one model, with or without
torch.nn.parallel.DistributedDataParallel. bench_cpp.cpp is the same program in C++ with
ddp::DistributedDataParallel; run.py launches both with ddprun and compares them.

Each rank writes <out>/rank<r>.json: per-iteration times of the measured iterations and,
under DDP, PyTorch's own runtime statistics (see stats_pass below).

  ddprun --nproc-per-node 2 -- /usr/bin/python3 bench_py.py --model small --ddp 1 --out DIR
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description="PyTorch side of bench/compare")
    ap.add_argument("--model", required=True, choices=sorted(models.SPECS))
    ap.add_argument("--ddp", type=int, default=1, help="1: wrap in DDP, 0: plain loop")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--set-to-none", type=int, default=1, help="zero_grad(set_to_none=...)")
    ap.add_argument("--check-steps", type=int, default=0,
                    help="run this many steps, dump the parameters to --out, no timing")
    ap.add_argument("--stats-iters", type=int, default=10,
                    help="DDP iterations after the measured ones that sample PyTorch's "
                         "runtime statistics")
    ap.add_argument("--out", required=True)
    return ap.parse_args()


def dump_parameters(model, path):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    with open(path, "wb") as f:
        f.write(flat.numpy().tobytes())


def main():
    args = parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.ddp:
        # The same rendezvous directory ddprun gives the C++ side; a separate file in it.
        rdzv = os.environ.get("DDP_RENDEZVOUS_DIR")
        init = f"file://{rdzv}/pystore" if rdzv else "env://"
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    elif world != 1:
        raise SystemExit(f"--ddp 0 runs one process, but WORLD_SIZE is {world}")

    model = models.build(args.model)
    net = model
    if args.ddp:
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = models.batches(args.model, rank)
    set_to_none = bool(args.set_to_none)

    def step(i):
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss

    os.makedirs(args.out, exist_ok=True)
    if args.check_steps:
        for i in range(args.check_steps):
            step(i)
        dump_parameters(model, os.path.join(args.out, f"rank{rank}.bin"))
        if args.ddp:
            dist.destroy_process_group()
        return

    for i in range(args.warmup):
        step(i)
    if args.ddp:
        dist.barrier()
    times = []
    cpu_start = time.process_time()  # every thread of this process, Gloo's included
    for i in range(args.iters):
        start = time.perf_counter()
        step(args.warmup + i)
        times.append(time.perf_counter() - start)
    cpu_s = time.process_time() - cpu_start

    result = {
        "side": "py", "model": args.model, "ddp": args.ddp, "rank": rank,
        "world_size": world, "batch": models.SPECS[args.model][0],
        "num_parameters": models.num_parameters(model),
        "iter_s": times, "cpu_s": cpu_s, "stats": stats_pass(net, step, args) if args.ddp else None,
        "torch": torch.__version__,
    }
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if args.ddp:
        dist.destroy_process_group()


def stats_pass(net, step, args):
    """PyTorch's reducer times a sample of iterations (every 100th by default) on CPU:
    backward compute start/end, and communication from the first bucket's launch to the
    end of finalize_backward (after every bucket was waited for). We sample every one of a
    few extra iterations *after* the timed ones, so sampling cannot slow the timed loop."""
    net._set_ddp_runtime_logging_sample_rate(1)
    samples = []
    for i in range(args.stats_iters):
        step(i)
        d = net._get_ddp_logging_data()
        samples.append({
            "backward_compute_ms": d.get("backward_compute_time", 0) / 1e6,
            "backward_comm_ms": d.get("backward_comm_time", 0) / 1e6,
            "overlap_ms": d.get("backward_compute_comm_overlap_time", 0) / 1e6,
        })
    d = net._get_ddp_logging_data()
    sizes = d.get("rebuilt_bucket_sizes") or d.get("bucket_sizes") or ""
    return {
        "samples": samples,
        "bucket_bytes": [int(s) for s in str(sizes).split(",") if s.strip()],
        "has_rebuilt_buckets": d.get("has_rebuilt_buckets"),
    }


if __name__ == "__main__":
    main()
