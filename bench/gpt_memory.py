"""Driver of bench/run-gpt-memory: the GPT example's peak RSS and time per step with and
without activation checkpointing, under DDP and fully_shard, at 2 ranks on this host.
Each configuration once per trial, the configurations taking turns; medians over
trials; bench/results/gpt-memory.md. Each rank runs under this script's `peak` mode,
which reports its child's peak RSS (getrusage, exact). Standard library only."""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MB = 1e6
# A GPT whose activations weigh: long windows, a wide batch, 8 blocks.
MODEL = ["--n-layer", "6", "--n-head", "6", "--n-embd", "192", "--block-size", "128",
         "--batch-size", "16", "--dropout", "0.1"]
QUICK = ["--n-layer", "4", "--n-head", "4", "--n-embd", "128", "--block-size", "128",
         "--batch-size", "8", "--dropout", "0.1"]


def peak(report_dir, program):
    """Runs `program`, then writes its peak RSS to REPORT_DIR/rank$RANK.json."""
    code = subprocess.call(program)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    with open(os.path.join(report_dir, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
        json.dump({"peak_rss": rss, "exit": code}, f)
    sys.exit(code)


def run(a, mode, checkpointing, model, steps):
    with tempfile.TemporaryDirectory(prefix="gpt-memory-") as tmp:
        gpt = [a.gpt, "--max-steps", str(steps), "--log-every", "1", "--no-save",
               "--sample-length", "0", "--truncate", "0.3", "--run-dir", tmp] + model
        if mode == "fsdp":
            gpt.append("--fsdp")
        if checkpointing:
            gpt.append("--activation-checkpointing")
        cmd = [a.ddprun, "--nproc-per-node", "2", "--no-prefix", "--", sys.executable,
               os.path.abspath(__file__), "peak", tmp, "--"] + gpt
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            sys.exit(f"{mode} (checkpointing {checkpointing}) failed:\n{out.stdout}\n{out.stderr}")
        rss = max(json.load(open(os.path.join(tmp, f"rank{r}.json")))["peak_rss"] for r in range(2))
        records = [json.loads(l) for l in open(os.path.join(tmp, "gpt", "metrics.jsonl"))]
        # One record a step; "seconds" is the time since the run began: a step's time is
        # the difference, over the steps after the first two (warm-up).
        train = [r for r in records if "val_loss" not in r]  # not the validation's time
        times = [b["seconds"] - a_["seconds"] for a_, b in zip(train, train[1:]) if b["step"] > 2]
        losses = [r["train_loss"] for r in records]
        return dict(rss=rss, ms=1e3 * statistics.median(times), loss=losses[-1])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "peak":
        if len(sys.argv) < 5 or sys.argv[3] != "--":
            sys.exit("usage: gpt_memory.py peak REPORT_DIR -- PROGRAM [ARGS...]")
        peak(sys.argv[2], sys.argv[4:])
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="a small model, 1 trial")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "gpt-memory.md"))
    a = ap.parse_args()
    a.ddprun = os.path.join(a.build_dir, "bin", "ddprun")
    a.gpt = os.path.join(a.build_dir, "bin", "gpt")
    model, trials = (QUICK, 1) if a.quick else (MODEL, a.trials)
    configs = [("DDP", "ddp", False), ("DDP", "ddp", True),
               ("fully_shard", "fsdp", False), ("fully_shard", "fsdp", True)]
    results = {c: [] for c in configs}
    for t in range(trials):
        for c in configs:
            results[c].append(run(a, c[1], c[2], model, a.steps))
            r = results[c][-1]
            print(f"trial {t + 1}/{trials}  {c[0]:12s} checkpointing {str(c[2]):5s} "
                  f"{r['ms']:8.1f} ms/step  {r['rss'] / MB:6.0f} MB", flush=True)
    med = {c: {k: statistics.median(x[k] for x in results[c]) for k in ("rss", "ms", "loss")}
           for c in configs}
    lines = [
        "# The GPT with and without activation checkpointing",
        "",
        f"Written by `bench/run-gpt-memory` ({trials} trials, configurations interleaved, "
        f"medians): `gpt {' '.join(model)}`, 2 ranks on one host, {a.steps} steps each, "
        "time per step over the steps after the second. Peak RSS is the larger rank's.",
        "",
        "| wrapper | activation checkpointing | ms / step | vs without | peak RSS (MB) | vs without | loss after the last step |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in configs:
        base = med[(c[0], c[1], False)]
        m = med[c]
        lines.append(f"| {c[0]} | {'yes' if c[2] else 'no'} | {m['ms']:.1f} | {m['ms'] / base['ms']:.2f} | "
                     f"{m['rss'] / MB:.0f} | {m['rss'] / base['rss']:.2f} | {m['loss']:.4f} |")
    lines.append("")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
