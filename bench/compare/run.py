#!/usr/bin/python3
"""ddp-cpp against PyTorch's DistributedDataParallel, on this machine, in one run.

For each model (small, cnn, wide) it runs six configurations, interleaved trial by trial
(ABAB...): C++ and Python, each as DDP at world size 2, DDP at world size 1 and the plain
loop without DDP. Before timing, it trains both sides a few steps from identical weights
and data and checks that their parameters agree, so both really did the same work. Then
it measures raw all-reduce (of the backend ddp-cpp uses) (bench_allreduce) at DDP's bucket sizes and the loopback
ceiling, draws a DDP timeline from a traced run, and writes a markdown report.

Run it through bench/run-compare, which builds what it needs first.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import launch  # noqa: E402
import report  # noqa: E402
import traces as traces_mod  # noqa: E402

# The PyTorch peer: the Python whose torch the C++ side was built against (bench/run-compare
# passes it; scripts/config.sh chooses it).
PYTHON = os.environ.get("DDP_PY", "/usr/bin/python3")

# (side, mode, world size); mode "ddp" wraps the model, "plain" is the loop without DDP.
# One launch each. The world-size-1 DDP launch also times the loop without DDP ("plain")
# in the same process, alternating blocks of iterations (--with-plain).
CONFIGS = [
    ("cpp", "ddp", 2), ("py", "ddp", 2),
    ("cpp", "ddp", 1), ("py", "ddp", 1),
    # Two processes that each train alone, side by side, with no communication: the
    # floor of ddp-cpp's iteration time at 2 ranks on this machine, whatever the transport.
    ("cpp", "alone", 2),
]
MODELS = ["small", "cnn", "wide", "gpt"]


def key(side, mode, world):
    return "%s-%s-%d" % (side, mode, world)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="bench/run-compare",
        description="Compare ddp-cpp with PyTorch DDP (see docs/benchmarks.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 trial, 2 warm-up and 5 measured iterations, no all-reduce sweep")
    ap.add_argument("--trials", type=int, default=7, help="trials per configuration (>= 5)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up iterations per trial")
    ap.add_argument("--iters", type=int, default=50, help="measured iterations per trial")
    ap.add_argument("--stats-iters", type=int, default=10,
                    help="iterations that sample the overlap: extra PyTorch iterations with "
                         "its DDP runtime statistics on, and a traced ddp-cpp run")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    ap.add_argument("--cpp-backend", default="", choices=["", "gloo", "shm"],
                    help="ddp-cpp's backend (empty: the library's choice, shared memory on one "
                         "host); PyTorch's DDP always runs on gloo")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0,
                    help="DDP bucket_cap_mb, the same on both sides")
    ap.add_argument("--gradient-as-bucket-view", type=int, default=0,
                    help="DDP gradient_as_bucket_view, the same on both sides")
    ap.add_argument("--check-steps", type=int, default=3,
                    help="SGD steps before comparing C++ and Python parameters")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="relative tolerance of the parameter comparison")
    ap.add_argument("--malloc", choices=sorted(launch.MALLOC), default="tuned",
                    help="glibc malloc settings of every rank, both sides alike "
                         "(docs/benchmarks.md, 'Page faults')")
    ap.add_argument("--timeline-model", default="cnn",
                    help="model of the traced run drawn as the timeline ('' to skip)")
    ap.add_argument("--build-dir", default=os.environ.get("DDP_BUILD_DIR",
                                                          os.path.join(ROOT, "build")),
                    help="where bin/ddprun, bin/bench_allreduce and bin/bench_compare are")
    ap.add_argument("--results-dir", default=os.path.join(ROOT, "bench", "results"),
                    help="where the report (and raw/ data) go")
    ap.add_argument("--name", default=None,
                    help="report file stem (default: compare, or compare-quick with --quick)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    ap.add_argument("--retries", type=int, default=2,
                    help="relaunches of a timing trial whose launch failed (a crash on either "
                         "side); each one is listed in the report")
    ap.add_argument("--verbose", action="store_true", help="print every rank's output")
    ap.add_argument("--update-readme", action="store_true",
                    help="with --render: also rewrite the results block of README.md")
    ap.add_argument("--render", metavar="JSON", default=None,
                    help="only rewrite the report from an earlier run's raw/<name>.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.trials, args.warmup, args.iters, args.stats_iters = 1, 2, 5, 3
    args.models = [m for m in args.models.split(",") if m]
    for m in args.models:
        if m not in MODELS:
            ap.error("unknown model %r: expected some of %s" % (m, ",".join(MODELS)))
    if args.trials < 1 or args.iters < 1:
        ap.error("--trials and --iters must be >= 1")
    if args.name is None:
        args.name = "compare-quick" if args.quick else "compare"
    return args


class Bench:
    def __init__(self, args):
        self.args = args
        self.bin = os.path.join(args.build_dir, "bin")
        self.cpp = os.path.join(self.bin, "bench_compare")
        self.env = launch.bench_env(args.malloc)
        self.launcher = launch.Launcher(os.path.join(self.bin, "ddprun"), self.env,
                                        args.timeout, args.verbose)
        self.tmp = tempfile.mkdtemp(prefix="ddp-bench-")
        # The transport whose raw all-reduce DDP's buckets are compared with: what
        # ddp-cpp's runs use (an empty --cpp-backend picks shared memory on one host).
        self.raw_backend = "gloo" if args.cpp_backend == "gloo" else "shm"
        self.commands = []
        self.relaunched = []  # timing launches that failed and were run again

    def command(self, side, model, mode, out, extra=(), warmup=None, iters=None):
        warmup = self.args.warmup if warmup is None else warmup
        iters = self.args.iters if iters is None else iters
        common = ["--model", model, "--ddp", "1" if mode == "ddp" else "0",
                  "--warmup", str(warmup), "--iters", str(iters),
                  "--bucket-cap-mb", "%g" % self.args.bucket_cap_mb,
                  "--gradient-as-bucket-view", str(self.args.gradient_as_bucket_view),
                  "--out", out]
        if side == "cpp":
            backend = ["--backend", self.args.cpp_backend] if self.args.cpp_backend else []
            return [self.cpp] + common + backend + list(extra)
        return [PYTHON, os.path.join(HERE, "bench_py.py")] + common + [
            "--stats-iters", str(self.args.stats_iters)] + list(extra)

    def launch(self, side, model, mode, world, extra=(), what=None, **counts):
        out = tempfile.mkdtemp(dir=self.tmp)
        cmd = self.command(side, model, mode, out, extra, **counts)
        self.launcher.run(world, cmd, what or "%s %s %s world %d" % (side, model, mode, world))
        return out, cmd

    # ---- correctness: both sides did the same work -----------------------------------

    def check_equivalence(self, model):
        import numpy as np
        import models

        steps = self.args.check_steps
        flags = ["--check-steps", str(steps)]
        dumps = {}
        for side, mode, world in [("cpp", "ddp", 2), ("py", "ddp", 2),
                                  ("cpp", "plain", 1), ("py", "plain", 1)]:
            out, _ = self.launch(side, model, mode, world, flags,
                                 "equivalence check (%s %s %s)" % (side, model, mode))
            dumps[key(side, mode, world)] = [
                np.fromfile(os.path.join(out, "rank%d.bin" % r), dtype=np.float32)
                for r in range(world)]
        import torch
        init = torch.cat([p.detach().reshape(-1)
                          for p in models.build(model).parameters()]).numpy()

        def rel(a, b):
            if a.shape != b.shape:
                return float("inf")
            return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))

        res = {
            "steps": steps,
            "ddp_cpp_vs_py": rel(dumps["cpp-ddp-2"][0], dumps["py-ddp-2"][0]),
            "plain_cpp_vs_py": rel(dumps["cpp-plain-1"][0], dumps["py-plain-1"][0]),
            "cpp_rank1_vs_rank0": rel(dumps["cpp-ddp-2"][1], dumps["cpp-ddp-2"][0]),
            "py_rank1_vs_rank0": rel(dumps["py-ddp-2"][1], dumps["py-ddp-2"][0]),
            "moved_from_init": rel(dumps["py-ddp-2"][0], init),
            "ddp_vs_plain": rel(dumps["py-ddp-2"][0], dumps["py-plain-1"][0]),
            "numel": int(init.size),
        }
        tol = self.args.rtol
        failures = [k for k in ("ddp_cpp_vs_py", "plain_cpp_vs_py", "cpp_rank1_vs_rank0",
                                "py_rank1_vs_rank0") if not res[k] <= tol]
        # The check means nothing if training did not change the weights, or if averaging
        # over 2 ranks gave what 1 rank alone gives (the ranks' data must differ).
        if not res["moved_from_init"] > 10 * tol:
            failures.append("moved_from_init")
        if not res["ddp_vs_plain"] > 10 * tol:
            failures.append("ddp_vs_plain")
        res["ok"] = not failures
        if failures:
            raise launch.RunError(
                "equivalence check failed for model %s after %d steps: %s (tolerance %g "
                "relative to the largest parameter; moved_from_init and ddp_vs_plain must "
                "exceed %g). C++ and Python did not do the same work, so their times are "
                "not comparable. Values: %s" % (model, steps, ", ".join(failures), tol,
                                                10 * tol, json.dumps(res)))
        return res

    # ---- timing -----------------------------------------------------------------------

    def trial(self, model, side, mode, world):
        """One launch. Returns {config key: trial}; the world-size-1 DDP launch yields the
        plain loop's trial too."""
        extra = ["--with-plain", "1"] if mode == "ddp" and world == 1 else []
        for attempt in range(self.args.retries + 1):
            try:
                out, cmd = self.launch(side, model, mode, world, extra)
                break
            except launch.RunError as e:
                # A timing launch that crashed measured nothing; run it again, and say so.
                # The equivalence check and the traced runs are never retried.
                if attempt == self.args.retries:
                    raise
                first = str(e).splitlines()[0]
                tail = [line for line in str(e).splitlines() if line.strip()][-1:]
                self.relaunched.append({"config": key(side, mode, world), "model": model,
                                        "error": first + (" | " + tail[0] if tail else "")})
                print("[compare] relaunching %s %s: %s" % (model, key(side, mode, world), first),
                      flush=True)
        ranks = launch.read_ranks(out, world)
        shutil.rmtree(out, ignore_errors=True)
        shown = self.launcher.describe(world, [c.replace(out, "OUT") for c in cmd])
        result = {key(side, mode, world): summarise(ranks, "", shown)}
        if extra:
            result[key(side, "plain", 1)] = summarise(ranks, "plain_", shown)
        return result

    def fixed_cost(self, side):
        """DDP's fixed cost per iteration at world size 1: the tiny model's DDP loop
        against its plain loop, alternating blocks of 100 iterations in one process.
        Returns the difference of their medians, in seconds, and both medians."""
        out, cmd = self.launch(side, "tiny", "ddp", 1, ["--with-plain", "1", "--block", "100"],
                               "%s tiny fixed cost" % side, warmup=200,
                               iters=200 if self.args.quick else 2000)
        r = launch.read_ranks(out, 1)[0]
        shutil.rmtree(out, ignore_errors=True)
        ddp, plain = report.med(r["iter_s"]), report.med(r["plain_iter_s"])
        return {"cost_s": ddp - plain, "ddp_s": ddp, "plain_s": plain,
                "cmd": self.launcher.describe(1, [c.replace(out, "OUT") for c in cmd])}

    def raw_allreduce(self, sizes, busy=False):
        """Median all-reduce time of each size in bytes, from bench_allreduce at 2 ranks;
        `busy`: with one compute thread per rank running alongside."""
        out = {}
        for size in sorted(set(sizes)):
            size = int(size) // 4 * 4
            if size <= 0 or size in out:
                continue
            text = self.launcher.run(2, [os.path.join(self.bin, "bench_allreduce"), str(size),
                                         str(size)] + (["busy"] if busy else []),
                                     "bench_allreduce %d%s" % (size, " busy" if busy else ""))
            out[size] = parse_allreduce_table(text, self.raw_backend)[0]["time_s"]
        return out

    def allreduce_sweep(self):
        text = self.launcher.run(2, [os.path.join(self.bin, "bench_allreduce"),
                                     str(1 << 20), str(64 << 20)], "bench_allreduce sweep")
        return parse_allreduce_table(text, self.raw_backend)

    def loopback(self):
        text = subprocess.run([PYTHON, os.path.join(HERE, "loopback.py")], env=self.env,
                              stdout=subprocess.PIPE, check=True, text=True,
                              timeout=self.args.timeout).stdout
        return json.loads(text.strip().splitlines()[-1])

    def traced(self, model, draw):
        """A traced DDP run at world size 2 (after the timed ones, so tracing cannot slow
        them): the overlap of communication with backward per iteration and, if `draw`,
        the timeline picture."""
        trace_dir = tempfile.mkdtemp(dir=self.tmp)
        trace = os.path.join(trace_dir, "trace.json")
        iters = max(3, self.args.stats_iters)
        out = tempfile.mkdtemp(dir=self.tmp)
        cmd = [self.cpp, "--model", model, "--ddp", "1", "--warmup", "5", "--iters",
               str(iters), "--bucket-cap-mb", "%g" % self.args.bucket_cap_mb,
               "--gradient-as-bucket-view", str(self.args.gradient_as_bucket_view), "--out", out,
               "--trace", trace]
        self.launcher.run(2, cmd, "traced run (%s)" % model)
        traces = sorted(os.path.join(trace_dir, f) for f in os.listdir(trace_dir))
        if len(traces) != 2:
            raise launch.RunError("the traced run of %s wrote %d trace files, expected 2: %s"
                                  % (model, len(traces), traces))
        events = []
        for t in traces:
            with open(t) as f:
                events.append(json.load(f))
        shown = [c.replace(out, "OUT").replace(trace, "TRACE.json") for c in cmd]
        result = {"hidden_shares": [], "busbw": traces_mod.bucket_busbw(events, skip=5),
                  "cmd": self.launcher.describe(2, shown)}
        for ev in events:
            result["hidden_shares"] += traces_mod.hidden_shares(ev, skip=5)
        if draw:
            # A run under another name (--quick: compare-quick) leaves the published
            # picture alone.
            stem = ("timeline-%s" % model if self.args.name == "compare"
                    else "%s-timeline-%s" % (self.args.name, model))
            svg = os.path.join(self.args.results_dir, stem + ".svg")
            subprocess.run([PYTHON, os.path.join(ROOT, "tools", "trace_to_svg.py")] + traces +
                           ["-o", svg, "--iterations", "2", "--title",
                            "ddp-cpp, %s model, 2 ranks: 2 of %d traced iterations"
                            % (model, iters)], check=True)
            raw_dir = os.path.join(self.args.results_dir, "raw")
            os.makedirs(raw_dir, exist_ok=True)
            for t in traces:
                shutil.copy(t, os.path.join(raw_dir, "%s.%s" % (stem, os.path.basename(t))))
            result["svg"] = os.path.basename(svg)
        return result


def summarise(ranks, prefix, cmd):
    """A trial's figures from its ranks' results: `prefix` "" for the main loop, "plain_"
    for the loop without DDP timed alongside it."""
    iters = [r[prefix + "iter_s"] for r in ranks]
    # Median over the measured iterations (robust to a neighbour's burst on a shared
    # machine), of the slowest rank.
    medians = [report.med(t) for t in iters]
    # CPU time of all threads per iteration, averaged over ranks: what the work costs,
    # whatever else the machine runs.
    cpu = sum(r[prefix + "cpu_s"] / len(t) for r, t in zip(ranks, iters)) / len(ranks)
    if prefix:
        ranks = [{k: v for k, v in r.items() if k not in ("iter_s", "cpu_s", "stats")}
                 for r in ranks]
        for r in ranks:
            r["iter_s"], r["cpu_s"], r["stats"] = r.pop(prefix + "iter_s"), r.pop(
                prefix + "cpu_s"), None
    return {"t": max(medians), "rank_medians": medians, "cpu": cpu, "ranks": ranks,
            "cmd": cmd}


def parse_allreduce_table(text, backend="shm"):
    """bench_allreduce's rows: time and busbw of `backend` ("gloo" or "shm"), with both
    transports' figures and the memcpy bandwidth beside them. For "shm" that is the
    all-reduce that DDP's default buckets take: of tensors reduced where they are (Note
    [Direct all-reduce]) when the table has that column and the group could, else of a
    buffer the group made (Note [Zero-copy buffers])."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[1].replace(".", "", 1).isdigit():
            g_us, s_us, g_bus, s_bus = (float(c) for c in cells[1:5])
            row = {"size": cells[0], "gloo_time_s": g_us / 1e6, "shm_time_s": s_us / 1e6,
                   "gloo_busbw": g_bus, "shm_busbw": s_bus, "memcpy_GBps": float(cells[6])}
            if len(cells) >= 11:
                row["bucket_time_s"] = float(cells[8]) / 1e6
                row["bucket_busbw"] = float(cells[9])
            if len(cells) >= 14 and cells[11] != "nan":
                row["in_place_time_s"] = float(cells[11]) / 1e6
                row["in_place_busbw"] = float(cells[12])
            if backend == "shm":
                row["time_s"] = row.get("in_place_time_s",
                                        row.get("bucket_time_s", row["shm_time_s"]))
                row["busbw"] = row.get("in_place_busbw",
                                       row.get("bucket_busbw", row["shm_busbw"]))
            else:
                row["time_s"], row["busbw"] = row["gloo_time_s"], g_bus
            rows.append(row)
    if not rows:
        raise launch.RunError("bench_allreduce printed no table:\n" + text[-2000:])
    return rows


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.results_dir, exist_ok=True)
    if args.render:
        with open(args.render) as f:
            data = json.load(f)
        stem = os.path.splitext(os.path.basename(args.render))[0]
        md_path = os.path.join(args.results_dir, stem + ".md")
        with open(md_path, "w") as f:
            f.write(report.markdown(data))
        print("[compare] rewrote %s" % md_path)
        if args.update_readme and report.update_readme(os.path.join(ROOT, "README.md"), data):
            print("[compare] updated the results in README.md")
        return
    started = time.monotonic()
    meta = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "machine": launch.machine_info(),
        "load_before": launch.load_average(),
        "git": launch.command_output(["git", "describe", "--always", "--dirty"], cwd=ROOT),
        "python_torch": launch.command_output(
            [PYTHON, "-c", "import torch, sys; print(torch.__version__, sys.version.split()[0])"]),
        "compiler": launch.command_output(["c++", "--version"]).splitlines()[:1],
        "settings": {k: getattr(args, k) for k in (
            "trials", "warmup", "iters", "stats_iters", "bucket_cap_mb",
            "gradient_as_bucket_view", "check_steps",
            "rtol", "quick", "malloc", "models")},
        "argv": sys.argv[1:] if argv is None else argv,
    }
    bench = Bench(args)
    meta["env"] = " ".join("%s=%s" % (k, bench.env[k]) for k in launch.BENCH_VARS
                           if k in bench.env)
    meta["launcher"] = "ddprun" if bench.launcher.ddprun else "built-in (ddprun not built)"
    data = {"meta": meta, "equivalence": {}, "trials": {m: {} for m in args.models}}
    try:
        for model in args.models:
            print("[compare] equivalence check: %s" % model, flush=True)
            data["equivalence"][model] = bench.check_equivalence(model)

        for t in range(args.trials):
            for model in args.models:
                for side, mode, world in CONFIGS:
                    for k, tr in bench.trial(model, side, mode, world).items():
                        data["trials"][model].setdefault(k, []).append(tr)
                        print("[compare] trial %d/%d %-5s %-22s %8.2f ms"
                              % (t + 1, args.trials, model, k, tr["t"] * 1e3), flush=True)
            for side in ("cpp", "py"):
                fc = bench.fixed_cost(side)
                data.setdefault("fixed_cost", {}).setdefault(side, []).append(fc)
                print("[compare] trial %d/%d tiny  %-22s %8.2f us"
                      % (t + 1, args.trials, side + " fixed cost", fc["cost_s"] * 1e6),
                      flush=True)

        sizes = set()
        for model in args.models:
            for k in ("cpp-ddp-2", "py-ddp-2"):
                sizes.update(report.bucket_sizes(data["trials"][model][k], k.split("-")[0]))
        print("[compare] raw all-reduce at %d bucket sizes" % len(sizes), flush=True)
        data["raw_allreduce"] = {str(k): v for k, v in bench.raw_allreduce(sizes).items()}
        data["raw_allreduce_busy"] = {
            str(k): v for k, v in bench.raw_allreduce(sizes, busy=True).items()}
        if not args.quick:
            data["allreduce_sweep"] = bench.allreduce_sweep()
        print("[compare] loopback ceiling", flush=True)
        data["loopback"] = bench.loopback()
        data["overlap"] = {}
        for model in args.models:
            print("[compare] traced run: %s" % model, flush=True)
            data["overlap"][model] = bench.traced(model, draw=model == args.timeline_model)
            if "svg" in data["overlap"][model]:
                data["timeline"] = data["overlap"][model]
    finally:
        shutil.rmtree(bench.tmp, ignore_errors=True)

    data["relaunched"] = bench.relaunched
    meta["load_after"] = launch.load_average()
    meta["elapsed_s"] = time.monotonic() - started
    meta["commands"] = report.example_commands(data)
    text = report.markdown(data)
    md_path = os.path.join(args.results_dir, args.name + ".md")
    with open(md_path, "w") as f:
        f.write(text)
    raw_dir = os.path.join(args.results_dir, "raw")
    os.makedirs(raw_dir, exist_ok=True)
    with open(os.path.join(raw_dir, args.name + ".json"), "w") as f:
        json.dump(data, f)
    print(text)
    print("[compare] wrote %s (%.0f s)" % (os.path.relpath(md_path), meta["elapsed_s"]))
    # A full run into the default place also refreshes the README's copy.
    readme = os.path.join(ROOT, "README.md")
    if (not args.quick and args.name == "compare" and os.path.abspath(args.results_dir)
            == os.path.join(ROOT, "bench", "results")
            and report.update_readme(readme, data)):
        print("[compare] updated the results in %s" % os.path.relpath(readme))
        if "timeline" in data:
            # The README shows the timeline of the same run as its table.
            shutil.copy(os.path.join(args.results_dir, data["timeline"]["svg"]),
                        os.path.join(ROOT, "docs", "img", "timeline.svg"))
            print("[compare] updated docs/img/timeline.svg")


if __name__ == "__main__":
    try:
        main()
    except launch.RunError as e:
        print("compare: %s" % e, file=sys.stderr)
        sys.exit(1)
