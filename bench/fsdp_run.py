"""Driver of bench/run-fsdp: every configuration once per trial, the configurations
taking turns, TRIALS times; medians over trials; bench/results/fsdp.md."""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="a small model, 2 trials")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "fsdp.md"))
    a = ap.parse_args()
    size = ["--dim", "1024", "--blocks", "6"]
    trials = a.trials
    if a.quick:
        size, trials = ["--dim", "256", "--blocks", "4"], 2
    ddprun = os.path.join(a.build_dir, "bin", "ddprun")
    cpp = os.path.join(a.build_dir, "bin", "bench_fsdp")
    configs = [
        ("ddp-cpp DDP", "shm", [cpp, "ddp", "--backend", "shm"]),
        ("ddp-cpp ZeRO-1", "shm", [cpp, "zero", "--backend", "shm"]),
        ("ddp-cpp fully_shard", "shm", [cpp, "fsdp", "--backend", "shm"]),
        ("ddp-cpp DDP", "gloo", [cpp, "ddp", "--backend", "gloo"]),
        ("ddp-cpp fully_shard", "gloo", [cpp, "fsdp", "--backend", "gloo"]),
        ("PyTorch FSDP2", "gloo", [a.python, os.path.join(HERE, "fsdp_py.py"), "fsdp2"]),
        ("PyTorch DDP", "gloo", [a.python, os.path.join(HERE, "fsdp_py.py"), "ddp"]),
    ]
    results = {i: [] for i in range(len(configs))}
    for t in range(trials):
        for i, (name, backend, cmd) in enumerate(configs):
            env = dict(os.environ)
            full = [ddprun, "--nproc-per-node", "2", "--no-prefix", "--"] + cmd + size
            # PyTorch 2.x's Gloo has been seen to abort a process at exit ("terminate
            # called without an active exception") after it printed its result; such a
            # run is repeated, up to twice.
            for attempt in range(3):
                out = subprocess.run(full, env=env, capture_output=True, text=True, timeout=900)
                lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
                if out.returncode == 0 and lines:
                    break
                aborted = "terminate called without an active exception" in out.stdout + out.stderr
                if not aborted or attempt == 2:
                    sys.exit(f"{name} ({backend}) failed:\n{out.stdout}\n{out.stderr}")
            line = lines[-1]
            results[i].append(json.loads(line))
            print(f"trial {t + 1}/{trials}  {name:22s} {backend:5s} {results[i][-1]['ms']:8.1f} ms",
                  flush=True)
    rows = []
    for i, (name, backend, _) in enumerate(configs):
        r = results[i]
        med = lambda k: statistics.median(x[k] for x in r)  # noqa: E731
        rows.append(dict(name=name, backend=backend, ms=med("ms"), rss=med("peak_rss"),
                         params=med("params"), grads=med("grads"), opt=med("optimizer"),
                         unit=r[0]["unit_bytes"]))
    ddp = rows[0]
    model_mb = ddp["params"] / 1e6
    lines = [
        "# fully_shard: memory and time per iteration",
        "",
        f"Written by `bench/run-fsdp` ({trials} trials, configurations interleaved, medians). "
        f"2 ranks on one host, 1 thread each; model: {len(size) and size[3]} residual blocks "
        f"Linear(D, 4D), GELU, Linear(4D, D) with D = {size[1]} ({model_mb:.0f} MB of fp32 "
        "parameters), Adam, batch 16 rows per rank. Each block is a unit under fully_shard "
        "and FSDP2; the root holds none. Bytes are the largest rank's.",
        "",
        "| configuration | backend | ms / iteration | vs ddp-cpp DDP | peak RSS (MB) | "
        "params + grads + Adam state (MB) | vs DDP |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        total = r["params"] + r["grads"] + r["opt"]
        base = ddp["params"] + ddp["grads"] + ddp["opt"]
        lines.append(f"| {r['name']} | {r['backend']} | {r['ms']:.1f} | {r['ms'] / ddp['ms']:.2f} | "
                     f"{r['rss'] / 1e6:.0f} | {total / 1e6:.0f} | {total / base:.2f} |")
    fs = next(r for r in rows if r["name"] == "ddp-cpp fully_shard" and r["backend"] == "gloo")
    py = next(r for r in rows if r["name"] == "PyTorch FSDP2")
    base = ddp["params"] + ddp["grads"] + ddp["opt"]
    lines += [
        "",
        f"fully_shard's bytes against the goal of 1/N of DDP's plus the largest unit "
        f"unsharded: {(fs['params'] + fs['grads'] + fs['opt']) / 1e6:.0f} MB against "
        f"{base / 2e6:.0f} + {fs['unit'] / 1e6:.0f} = {(base / 2 + fs['unit']) / 1e6:.0f} MB.",
        f"On the same backend (Gloo), ddp-cpp's fully_shard takes {fs['ms'] / py['ms']:.2f}x "
        "PyTorch FSDP2's time per iteration.",
        "",
    ]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
