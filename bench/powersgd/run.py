#!/usr/bin/python3
"""PowerSGD where it matters: DDP between two hosts whose link is slow.

Two network namespaces on one bridge (tests/ddprun/netns_testlib.py) are the hosts; tc
limits each one's interface to --rate (a token bucket, both directions). On them, one
rank each, ddprun runs bench_compare's model (the wide MLP by default, 25.2 M parameters,
101 MB of gradients) with DDP on Gloo and each comm hook: none (plain all-reduce), fp16,
bf16, and PowerSGD at each rank asked for (from iteration 2, so every measured iteration
is compressed). Trials are interleaved (ABCD ABCD ...). Reported: the median iteration
time of each trial on rank 0, the median and range over trials, the ratio to plain
all-reduce, and the bytes each rank's collectives were given per iteration
(IterationStats::bytes_sent).

Run it through bench/run-powersgd (root; builds first). Writes bench/results/powersgd.md.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "ddprun"))

import netns_testlib  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rate", default="1gbit", help="tc rate of each host's link")
    ap.add_argument("--model", default="wide")
    ap.add_argument("--hooks", default="none,fp16,powersgd1,powersgd4,alone",
                    help="comm hooks; 'alone': each host trains by itself, no communication "
                         "at all (the floor)")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "powersgd.md"))
    args = ap.parse_args()
    hooks = [h for h in args.hooks.split(",") if h]
    ddprun = os.path.join(args.build_dir, "bin", "ddprun")
    bench = os.path.join(args.build_dir, "bin", "bench_compare")
    for binary in (ddprun, bench):
        if not os.access(binary, os.X_OK):
            sys.exit(f"run.py: {binary} is missing: build it first (bench/run-powersgd does)")

    hosts = netns_testlib.Hosts(2, tag="psgd")
    why = hosts.setup()
    if why:
        sys.exit(f"run.py: {why}")
    work = tempfile.mkdtemp(prefix="ddp-powersgd-")
    results = {h: [] for h in hooks}
    sent = {}
    port = 29700
    try:
        for i in range(2):
            subprocess.run(hosts.command(i, ["tc", "qdisc", "add", "dev", netns_testlib.IFNAME,
                                             "root", "tbf", "rate", args.rate, "burst", "1mb",
                                             "latency", "100ms"]), check=True)
        for trial in range(args.trials):
            for hook in hooks:
                port += 2
                out = os.path.join(work, f"{hook}-{trial}")
                procs = []
                for node in range(2):
                    cmd = [ddprun, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
                           str(node), "--master-addr", hosts.addrs[0], "--master-port", str(port),
                           "--", bench, "--model", args.model, "--warmup", str(args.warmup),
                           "--iters", str(args.iters), "--out", out]
                    cmd += (["--ddp", "0"] if hook == "alone" else
                            ["--ddp", "1", "--backend", "gloo", "--hook", hook])
                    procs.append(subprocess.Popen(hosts.command(node, cmd),
                                                  stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT, text=True,
                                                  env=dict(os.environ, OMP_NUM_THREADS="1")))
                outputs = [p.communicate(timeout=args.timeout)[0] for p in procs]
                codes = [p.returncode for p in procs]
                if any(codes):
                    sys.exit(f"run.py: {hook} trial {trial}: exit codes {codes}\n" +
                             "\n".join(outputs))
                with open(os.path.join(out, "rank0.json")) as f:
                    r0 = json.load(f)
                t = statistics.median(r0["iter_s"])
                results[hook].append(t)
                sent[hook] = r0["stats"]["iterations"][-1]["bytes_sent"] if r0["stats"] else 0
                print(f"[powersgd] trial {trial + 1}/{args.trials} {hook:10s} "
                      f"{t * 1e3:9.1f} ms  {sent[hook] / 1e6:8.2f} MB sent", flush=True)
    finally:
        hosts.teardown()

    base = results.get("none")
    lines = [
        "# PowerSGD on a slow link between two hosts", "",
        f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; `bench/run-powersgd`: two network "
        f"namespaces on one bridge, each link limited by tc to {args.rate} (token bucket); "
        f"one rank per host, DDP on Gloo, model `{args.model}` (bench/compare/models.h), SGD; "
        f"{args.trials} interleaved trials of {args.warmup} warm-up and {args.iters} measured "
        "iterations; per trial the median iteration on rank 0; cells: median over trials "
        "(smallest–largest). PowerSGD starts at iteration 2, with error feedback and warm "
        "start. Bytes sent: what rank 0's collectives were given in one iteration "
        "(IterationStats::bytes_sent).", "",
        "| comm hook | ms / iteration | vs plain all-reduce | bytes sent per iteration | "
        "compression |",
        "|---|---:|---:|---:|---:|",
    ]
    for hook in hooks:
        ts = results[hook]
        cell = f"{statistics.median(ts) * 1e3:.0f} ({min(ts) * 1e3:.0f}–{max(ts) * 1e3:.0f})"
        ratio = (f"{statistics.median([a / b for a, b in zip(ts, base)]):.3f}" if base else "n/a")
        comp = f"{sent['none'] / sent[hook]:.0f}×" if "none" in sent and sent[hook] else "n/a"
        name = {"none": "none (plain all-reduce)", "fp16": "fp16_compress_hook",
                "bf16": "bf16_compress_hook",
                "alone": "floor: each host alone, no communication"}.get(
                    hook, hook.replace("powersgd", "PowerSGD, rank "))
        lines.append(f"| {name} | {cell} | {ratio} | {sent[hook] / 1e6:.2f} MB | {comp} |")
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
