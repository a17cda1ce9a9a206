"""PyTorch side of the DDP comparison: one trial of one model, with or without
torch.nn.parallel.DistributedDataParallel. bench_cpp.cpp is the same program in C++ with
ddp::DistributedDataParallel; run.py launches both with ddprun and compares them.

Each rank writes <out>/rank<r>.json: per-iteration times of the measured iterations and,
under DDP, PyTorch's own runtime statistics (see stats_pass below). With --with-plain 1
(world size 1) the process also times the loop without DDP on the same module,
alternating blocks of iterations with the DDP one (Note [Paired overhead]).

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
    ap.add_argument("--gradient-as-bucket-view", type=int, default=0,
                    help="DDP's gradient_as_bucket_view")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--set-to-none", type=int, default=1, help="zero_grad(set_to_none=...)")
    ap.add_argument("--check-steps", type=int, default=0,
                    help="run this many steps, dump the parameters to --out, no timing")
    ap.add_argument("--stats-iters", type=int, default=10,
                    help="DDP iterations after the measured ones that sample PyTorch's "
                         "runtime statistics")
    ap.add_argument("--with-plain", type=int, default=0,
                    help="1 (with --ddp 1 at world size 1): also time the same loop without "
                         "DDP on the same module, in alternating blocks")
    ap.add_argument("--block", type=int, default=5,
                    help="iterations per block when alternating with --with-plain")
    ap.add_argument("--out", required=True)
    return ap.parse_args()


def dump_parameters(model, path):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    with open(path, "wb") as f:
        f.write(flat.numpy().tobytes())


def make_step(net, model, lr, data, set_to_none):
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step(i):
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def measure(steps, first, iters, block):
    """Runs `iters` timed iterations of every step function in `steps` (a dict), in
    alternating blocks of `block` iterations (ABBA...), so that both see the same machine.
    Returns {name: (per-iteration seconds, CPU seconds of the process)}."""
    times = {name: [] for name in steps}
    cpu = {name: 0.0 for name in steps}
    order = list(steps)
    b = 0
    while any(len(t) < iters for t in times.values()):
        for name in (order if b % 2 == 0 else order[::-1]):
            cpu_start = time.process_time()  # every thread of this process, Gloo's included
            for _ in range(block):
                if len(times[name]) >= iters:
                    break
                start = time.perf_counter()
                steps[name](first + len(times[name]))
                times[name].append(time.perf_counter() - start)
            cpu[name] += time.process_time() - cpu_start
        b += 1
    return {name: (times[name], cpu[name]) for name in steps}


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
    if args.with_plain and not (args.ddp and world == 1):
        raise SystemExit("--with-plain 1 needs --ddp 1 and world size 1")

    model = models.build(args.model)
    net = model
    if args.ddp:
        net = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=args.bucket_cap_mb,
            gradient_as_bucket_view=bool(args.gradient_as_bucket_view))
    data = models.batches(args.model, rank)
    set_to_none = bool(args.set_to_none)
    step = make_step(net, model, args.lr, data, set_to_none)
    steps = {"main": step}
    if args.with_plain:
        # Note [Paired overhead]: the loop without DDP runs in this process on the same
        # module (its own forward instead of the wrapper's), alternating blocks of
        # iterations with the DDP loop. Separate launches differ by up to 10% on this
        # machine, and so do two copies of a model in one process (where glibc puts their
        # weights), which would drown a 1% overhead. Outside a DDP forward, PyTorch's
        # gradient hooks return at once (the reducer expects no hooks); ddp-cpp's refuse
        # such a backward, so bench_cpp unwraps the module for its plain blocks.
        steps["plain"] = make_step(model, model, args.lr, data, set_to_none)

    os.makedirs(args.out, exist_ok=True)
    if args.check_steps:
        for i in range(args.check_steps):
            step(i)
        dump_parameters(model, os.path.join(args.out, f"rank{rank}.bin"))
        if args.ddp:
            dist.destroy_process_group()
        return

    for i in range(args.warmup):
        for s in steps.values():
            s(i)
    if args.ddp:
        dist.barrier()
    measured = measure(steps, args.warmup, args.iters, args.block)

    result = {
        "side": "py", "model": args.model, "ddp": args.ddp, "rank": rank,
        "world_size": world, "batch": models.SPECS[args.model][0],
        "num_parameters": models.num_parameters(model),
        "iter_s": measured["main"][0], "cpu_s": measured["main"][1],
        "stats": stats_pass(net, step, args) if args.ddp and world > 1 else None,
        "torch": torch.__version__,
    }
    if "plain" in measured:
        result["plain_iter_s"], result["plain_cpu_s"] = measured["plain"]
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
