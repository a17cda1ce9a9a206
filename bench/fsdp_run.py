"""Driver of bench/run-fsdp: every configuration once per trial, the configurations
taking turns, TRIALS times; medians over trials; bench/results/fsdp.md. With --timeline,
one more run of DDP and fully_shard on each backend records every event of every step
(bench_fsdp --timeline) and bench/results/fsdp-timeline.md shows one step of each."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MB = 1e6


def run_config(ddprun, ranks, cmd, name, backend, env=None):
    full = [ddprun, "--nproc-per-node", str(ranks), "--no-prefix", "--"] + cmd
    env = dict(os.environ, **(env or {}))
    # PyTorch 2.x's Gloo has been seen to abort a process at exit ("terminate called
    # without an active exception") after it printed its result; such a run is repeated,
    # up to twice.
    for attempt in range(3):
        out = subprocess.run(full, capture_output=True, text=True, timeout=900, env=env)
        lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
        if out.returncode == 0 and lines:
            return json.loads(lines[-1])
        aborted = "terminate called without an active exception" in out.stdout + out.stderr
        if not aborted or attempt == 2:
            sys.exit(f"{name} ({backend}, {ranks} ranks) failed:\n{out.stdout}\n{out.stderr}")


def model_bytes(r):
    """fully_shard's memory model (docs/fsdp.md): the sharded state, two units unsharded
    (the running one's full parameters, the next one's all-gather output), one unit's
    full gradients, one reduce-scatter's input in flight (its output is a row of it, or
    the new sharded gradients, which the state counts), the activations; on Gloo one unit
    more, c10d's all-gather's own flat buffer."""
    u = r["unit"]
    backend = u if r["backend"] == "gloo" else 0
    return r["state"] + 2 * u + u + u + r["activations"] + backend


def write_timeline(a, ddprun, cpp, size, out_path):
    rows = []
    with tempfile.TemporaryDirectory(prefix="fsdp-timeline-") as tmp:
        for mode, backend in [("ddp", "shm"), ("fsdp", "shm"), ("ddp", "gloo"), ("fsdp", "gloo")]:
            base = os.path.join(tmp, f"{mode}-{backend}")
            run_config(ddprun, 2, [cpp, mode, "--backend", backend, "--timeline", base] + size,
                       mode, backend)
            with open(base + ".rank0.jsonl") as f:
                events = [json.loads(l) for l in f]
            baseline = next(e for e in events if e["event"] == "baseline")
            last = max(e["step"] for e in events)
            step = [e for e in events if e["step"] == last]
            rows.append((mode, backend, baseline, step))
    lines = [
        "# fully_shard: one step's memory, event by event",
        "",
        "Written by `bench/run-fsdp --timeline`: rank 0 of 2, the last step of one run per "
        "configuration (the model of bench/results/fsdp.md). Figures are MB above the "
        "process's baseline (after `init_process_group`, before the model exists): the "
        "resident set (RSS), LibTorch's live CPU allocations (allocated), ddp-cpp's reused "
        "buffers in use and cached, and what glibc holds freed (resident or not). A unit "
        "is named by its place in the model (block 3 of the Sequential: `3`).",
        "",
    ]
    for mode, backend, baseline, step in rows:
        name = "DDP" if mode == "ddp" else "fully_shard"
        lines += [f"## {name} on {backend}", "",
                  "| ms | event | unit | RSS | allocated | buffers in use | cached | glibc free |",
                  "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        unit_events = {"all_gather_started", "unsharded", "resharded", "reduce_scatter_started",
                       "reduce_scatter_finished"}
        for e in step:
            # A unit by its place in the model ("3": the Sequential's fourth block).
            unit = (e["unit"] or "root") if e["event"] in unit_events else ""
            lines.append(
                f"| {e['ms']:.1f} | {e['event']} | {unit} | {(e['rss'] - baseline['rss']) / MB:.0f} | "
                f"{e['allocated'] / MB:.0f} | {e['buffers_in_use'] / MB:.0f} | "
                f"{e['buffers_cached'] / MB:.0f} | {e['malloc_free'] / MB:.0f} |")
        lines.append("")
    with open(out_path, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {out_path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a small model, 2 trials")
    ap.add_argument("--timeline", action="store_true",
                    help="also write bench/results/fsdp-timeline.md")
    ap.add_argument("--timeline-only", action="store_true",
                    help="write bench/results/fsdp-timeline.md alone")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "fsdp.md"))
    a = ap.parse_args()
    size = ["--dim", "1024", "--blocks", "6"]
    trials = a.trials
    if a.quick:
        size, trials = ["--dim", "256", "--blocks", "4"], 2
    ddprun = os.path.join(a.build_dir, "bin", "ddprun")
    cpp = os.path.join(a.build_dir, "bin", "bench_fsdp")
    py = [a.python, os.path.join(HERE, "fsdp_py.py")]
    glibc = {"DDP_CPU_CACHING_ALLOCATOR": "0"}
    # (name, backend, ranks, command, environment). fully_shard turns on the caching CPU
    # allocator itself (docs/fsdp.md); the rows marked glibc run without it, and DDP runs
    # once with it (--caching-allocator), so that each comparison is visible.
    configs = [
        ("ddp-cpp DDP", "shm", 2, [cpp, "ddp", "--backend", "shm"], None),
        ("ddp-cpp DDP + caching allocator", "shm", 2,
         [cpp, "ddp", "--backend", "shm", "--caching-allocator"], None),
        ("ddp-cpp ZeRO-1", "shm", 2, [cpp, "zero", "--backend", "shm"], None),
        ("ddp-cpp fully_shard", "shm", 2, [cpp, "fsdp", "--backend", "shm"], None),
        ("ddp-cpp fully_shard, glibc", "shm", 2, [cpp, "fsdp", "--backend", "shm"], glibc),
        ("ddp-cpp DDP", "gloo", 2, [cpp, "ddp", "--backend", "gloo"], None),
        ("ddp-cpp fully_shard", "gloo", 2, [cpp, "fsdp", "--backend", "gloo"], None),
        ("ddp-cpp fully_shard, glibc", "gloo", 2, [cpp, "fsdp", "--backend", "gloo"], glibc),
        ("PyTorch FSDP2", "gloo", 2, py + ["fsdp2"], None),
        ("PyTorch DDP", "gloo", 2, py + ["ddp"], None),
        ("ddp-cpp fully_shard", "shm", 4, [cpp, "fsdp", "--backend", "shm"], None),
        ("ddp-cpp fully_shard", "gloo", 4, [cpp, "fsdp", "--backend", "gloo"], None),
    ]
    if a.timeline_only:
        write_timeline(a, ddprun, cpp, size, os.path.join(os.path.dirname(a.out), "fsdp-timeline.md"))
        return
    results = {i: [] for i in range(len(configs))}
    for t in range(trials):
        for i, (name, backend, ranks, cmd, env) in enumerate(configs):
            results[i].append(run_config(ddprun, ranks, cmd + size, name, backend, env))
            print(f"trial {t + 1}/{trials}  {name:32s} {backend:5s} {ranks} ranks "
                  f"{results[i][-1]['ms']:8.1f} ms  {results[i][-1]['peak_rss'] / MB:6.0f} MB",
                  flush=True)
    rows = []
    for i, (name, backend, ranks, _, _) in enumerate(configs):
        r = results[i]
        med = lambda k: statistics.median(x[k] for x in r)  # noqa: E731
        row = dict(name=name, backend=backend, world=ranks, ms=med("ms"), rss=med("peak_rss"),
                   params=med("params"), grads=med("grads"), opt=med("optimizer"),
                   unit=r[0]["unit_bytes"])
        row["state"] = row["params"] + row["grads"] + row["opt"]
        for k in ("baseline_rss", "activations", "step_transient", "malloc_free", "buffers"):
            row[k] = med(k) if k in r[0] else None
        rows.append(row)

    def find(name, backend, world=2):
        return next(r for r in rows if r["name"] == name and r["backend"] == backend
                    and r["world"] == world)

    ddp_shm = find("ddp-cpp DDP", "shm")
    model_mb = ddp_shm["params"] / MB
    lines = [
        "# fully_shard: memory and time per iteration",
        "",
        f"Written by `bench/run-fsdp` ({trials} trials, configurations interleaved, medians). "
        f"Ranks on one host, 1 thread each; model: {size[3]} residual blocks "
        f"Linear(D, 4D), GELU, Linear(4D, D) with D = {size[1]} ({model_mb:.0f} MB of fp32 "
        "parameters), Adam, batch 16 rows per rank. Each block is a unit under fully_shard "
        "and FSDP2; the root holds none. Bytes are the largest rank's. *Above baseline*: "
        "peak RSS less the RSS after `init_process_group` (before the model exists); "
        "*model*: the memory model of docs/fsdp.md (sharded state + 2 units unsharded + "
        "1 unit of full gradients + 1 reduce-scatter in flight + activations).",
        "",
        "| configuration | backend | ranks | ms / iteration | vs DDP (same backend) | "
        "peak RSS (MB) | vs DDP | above baseline (MB) | model (MB) | params + grads + Adam (MB) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ddp_of = {"shm": ddp_shm, "gloo": find("ddp-cpp DDP", "gloo")}
    for r in rows:
        ref = ddp_of[r["backend"]]
        base = r["baseline_rss"]
        above = f"{(r['rss'] - base) / MB:.0f}" if base else "—"
        model = (f"{model_bytes(r) / MB:.0f}"
                 if "fully_shard" in r["name"] and r["activations"] is not None else "—")
        lines.append(
            f"| {r['name']} | {r['backend']} | {r['world']} | {r['ms']:.1f} | "
            f"{r['ms'] / ref['ms']:.2f} | {r['rss'] / MB:.0f} | {r['rss'] / ref['rss']:.2f} | "
            f"{above} | {model} | {r['state'] / MB:.0f} |")
    fs_shm, fs_gloo = find("ddp-cpp fully_shard", "shm"), find("ddp-cpp fully_shard", "gloo")
    fsdp2 = find("PyTorch FSDP2", "gloo")
    fs4_shm, fs4_gloo = find("ddp-cpp fully_shard", "shm", 4), find("ddp-cpp fully_shard", "gloo", 4)

    def fits(r):
        above = r["rss"] - r["baseline_rss"]
        return f"{above / MB:.0f} MB above baseline against a model of {model_bytes(r) / MB:.0f} MB ({above / model_bytes(r):.2f}x)"

    fs_glibc_shm = find("ddp-cpp fully_shard, glibc", "shm")
    fs_glibc_gloo = find("ddp-cpp fully_shard, glibc", "gloo")
    ddp_cache = find("ddp-cpp DDP + caching allocator", "shm")
    lines += [
        "",
        "Against the targets:",
        f"- peak RSS, fully_shard / DDP: shm {fs_shm['rss'] / ddp_shm['rss']:.2f} "
        f"({fs_shm['rss'] / ddp_cache['rss']:.2f} against DDP with the caching allocator too), "
        f"Gloo {fs_gloo['rss'] / ddp_of['gloo']['rss']:.2f}; fully_shard / PyTorch FSDP2 on "
        f"Gloo {fs_gloo['rss'] / fsdp2['rss']:.2f}. Without the caching allocator (glibc): "
        f"shm {fs_glibc_shm['rss'] / ddp_shm['rss']:.2f}, Gloo "
        f"{fs_glibc_gloo['rss'] / ddp_of['gloo']['rss']:.2f} (medians; glibc's runs vary most).",
        f"- time, fully_shard / PyTorch FSDP2 on Gloo: {fs_gloo['ms'] / fsdp2['ms']:.2f}; "
        f"fully_shard / DDP on shm: {fs_shm['ms'] / ddp_shm['ms']:.2f}.",
        f"- the memory model: shm {fits(fs_shm)}; Gloo {fits(fs_gloo)}.",
        f"- 4 ranks against 2: sharded state {fs4_shm['state'] / MB:.0f} against "
        f"{fs_shm['state'] / MB:.0f} MB ({fs4_shm['state'] / fs_shm['state']:.2f}x); peak RSS "
        f"shm {fs4_shm['rss'] / MB:.0f} against {fs_shm['rss'] / MB:.0f} MB, Gloo "
        f"{fs4_gloo['rss'] / MB:.0f} against {fs_gloo['rss'] / MB:.0f} MB.",
        f"- what glibc held freed at the end (resident or not): fully_shard shm "
        f"{fs_shm['malloc_free'] / MB:.0f} MB (glibc alone: {fs_glibc_shm['malloc_free'] / MB:.0f} MB), "
        f"DDP shm {ddp_shm['malloc_free'] / MB:.0f} MB.",
        "",
    ]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    if a.timeline:
        write_timeline(a, ddprun, cpp, size, os.path.join(os.path.dirname(a.out), "fsdp-timeline.md"))


if __name__ == "__main__":
    main()
