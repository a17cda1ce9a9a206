"""Turns run.py's measurements into the markdown report (bench/results/compare.md)."""

import json
import statistics


def med(values):
    return statistics.median(values) if values else float("nan")


def spread(values):
    """(median, min, max)."""
    return med(values), min(values), max(values)


def f_ms(values):
    m, lo, hi = spread([v * 1e3 for v in values])
    return "%s (%s–%s)" % (_num(m), _num(lo), _num(hi))


def _num(v):
    if v != v:
        return "n/a"
    if abs(v) >= 100:
        return "%.0f" % v
    if abs(v) >= 10:
        return "%.1f" % v
    return "%.2f" % v


def f_ratio(values, pct=False):
    if not values:
        return "n/a"
    m, lo, hi = spread(values)
    if pct:
        return "%+.1f%% (%+.1f … %+.1f)" % (100 * m, 100 * lo, 100 * hi)
    return "%.3f (%.3f–%.3f)" % (m, lo, hi)


def f_share(values):
    if not values:
        return "n/a"
    m, lo, hi = spread(values)
    return "%.0f%% (%.0f–%.0f)" % (100 * m, 100 * lo, 100 * hi)


def times(trials):
    return [t["t"] for t in trials]


def paired(a, b, fn):
    return [fn(x["t"], y["t"]) for x, y in zip(a, b)]


# ---- DDP statistics ----------------------------------------------------------------------

def _stats_entries(trials, field):
    """stats[field] of every rank and trial, concatenated."""
    return [e for t in trials for r in t["ranks"] if r.get("stats")
            for e in r["stats"][field]]


def cpp_iterations(trials):
    """Every measured iteration's IterationStats, of every rank and trial."""
    return _stats_entries(trials, "iterations")


def bucket_sizes(trials, side):
    last = trials[-1]["ranks"][0].get("stats") or {}
    if side == "cpp":
        its = last.get("iterations") or []
        return list(its[-1]["bucket_bytes"]) if its else []
    return list(last.get("bucket_bytes") or [])


def busbw(nbytes, seconds, world=2):
    return nbytes / seconds / 1e9 * 2.0 * (world - 1) / world if seconds > 0 else float("nan")


def cpp_bucket_busbw(trials):
    """Per measured iteration: all bucket bytes over the summed launch->reduced times.
    Each bucket's time is the smallest over ranks: a rank that launches its bucket early
    also waits for its peer to launch, which is skew, not transfer. The rank that
    launched last sees the all-reduce itself (as bench_allreduce does after a barrier)."""
    vals = []
    for t in trials:
        per_rank = [{i["iteration"]: i for i in r["stats"]["iterations"]}
                    for r in t["ranks"] if r.get("stats")]
        if not per_rank:
            continue
        for it in sorted(set.intersection(*[set(d) for d in per_rank])):
            rows = [d[it] for d in per_rank]
            if len({len(r["bucket_ms"]) for r in rows}) != 1:
                continue
            ms = [min(r["bucket_ms"][b] for r in rows) for b in range(len(rows[0]["bucket_ms"]))]
            if sum(ms) > 0:
                vals.append(busbw(sum(rows[0]["bucket_bytes"]), sum(ms) / 1e3))
    return vals


def raw_busbw(sizes, raw):
    """busbw of a raw all-reduce of each size, one after another, as one figure."""
    secs = 0.0
    for s in sizes:
        t = raw.get(str(int(s) // 4 * 4))
        if t is None:
            return float("nan")
        secs += t
    return busbw(sum(sizes), secs)


def py_samples(trials):
    """Every sample of PyTorch's DDP runtime statistics, of every rank and trial."""
    return _stats_entries(trials, "samples")


def py_hidden_shares(trials):
    return [min(1.0, max(0.0, s["overlap_ms"] / s["backward_comm_ms"]))
            for s in py_samples(trials) if s["backward_comm_ms"] > 0]


def py_span_busbw(trials):
    """busbw over PyTorch's whole communication window, smallest window over ranks."""
    sizes = bucket_sizes(trials, "py")
    vals = []
    for t in trials:
        per_rank = [r["stats"]["samples"] for r in t["ranks"] if r.get("stats")]
        for samples in zip(*per_rank):
            window = min(s["backward_comm_ms"] for s in samples)
            if window > 0 and sizes:
                vals.append(busbw(sum(sizes), window / 1e3))
    return vals


# ---- the report ---------------------------------------------------------------------------

def markdown(data, summary=None):
    """The full report. `summary`, if a dict, receives per model the cells that
    readme_block() shows."""
    if summary is None:
        summary = {}
    meta = data["meta"]
    m = meta["machine"]
    st = meta["settings"]
    L = []
    add = L.append
    add("# ddp-cpp vs PyTorch DDP%s" % (" (quick smoke run: not for quoting)" if st["quick"] else ""))
    add("")
    add("| | |")
    add("|---|---|")
    add("| date | %s |" % meta["date"])
    add("| machine | %s, %s cores, %.0f GiB, %s, Linux %s |"
        % (m["cpu"], m["cores"], m["memory_gb"] or 0, m["os"], m["kernel"]))
    add("| load average (1/5/15 min) | before %s, after %s |"
        % (_load(meta["load_before"]), _load(meta.get("load_after"))))
    add("| PyTorch (Python) | %s |" % meta["python_torch"])
    add("| LibTorch (C++) | %s |" % _cpp_torch(data))
    add("| compiler | %s |" % " ".join(meta["compiler"]))
    add("| ddp-cpp | %s |" % (meta["git"] or "unknown"))
    add("| launcher | %s |" % meta["launcher"])
    add("| settings | %d trials per configuration, interleaved; %d warm-up + %d measured "
        "iterations per trial; bucket_cap_mb %g%s; ddp-cpp on %s, PyTorch on gloo; 1 thread "
        "per rank; SGD lr 0.01; zero_grad(set_to_none=True); glibc malloc: %s "
        "(docs/benchmarks.md) |"
        % (st["trials"], st["warmup"], st["iters"], st["bucket_cap_mb"],
           "; gradient_as_bucket_view" if st.get("gradient_as_bucket_view") else "",
           _cpp_backend(data),
           st.get("malloc", "default" if st.get("no_hugetlb") else "hugetlb")))
    add("| run time | %.0f s |" % meta["elapsed_s"])
    relaunched = data.get("relaunched", [])
    add("| relaunched trials | %s |" % (
        "none" if not relaunched else "%d (a launch that failed was run again): %s" % (
            len(relaunched), "; ".join("%s %s: %s" % (r["model"], r["config"],
                                                       r["error"].replace("|", "/")[:200])
                                       for r in relaunched))))
    add("")
    add("Iteration time = zero_grad + forward + loss + backward + optimizer step: the median "
        "over the measured iterations of a trial, on the slowest rank. Cells show the median over "
        "trials and, in brackets, the smallest and largest trial. Ratios are taken per "
        "trial pair (run back to back) and then summarised the same way.")
    add("")

    models = [k for k in ("small", "cnn", "wide", "gpt") if k in data["trials"]]
    tr = data["trials"]

    add("## 1. Iteration time at world size 2 (the headline)")
    add("")
    add("The floor is two ddp-cpp processes that each train alone, side by side, with no "
        "process group and no communication at all (`bench_compare --ddp 0` at 2 ranks): "
        "what ddp-cpp's iteration time would be with an infinitely fast transport. They "
        "still share the cores and the memory, so the floor is above the 1-process time of "
        "section 3. Floor / PyTorch is the smallest ratio any transport could reach here.")
    add("")
    add("| model | parameters | batch per rank | ddp-cpp (ms) | PyTorch DDP (ms) | "
        "ddp-cpp / PyTorch | verdict | floor, no communication (ms) | floor / PyTorch |")
    add("|---|---:|---:|---:|---:|---:|---|---:|---:|")
    verdicts = {}
    for k in models:
        a, b = tr[k]["cpp-ddp-2"], tr[k]["py-ddp-2"]
        r = paired(a, b, lambda x, y: x / y)
        rm, lo, hi = spread(r)
        wins = sum(1 for x in r if x < 1)
        if wins == len(r):
            v = "ddp-cpp faster in every trial"
        elif wins == 0:
            v = "**PyTorch faster in every trial**"
        elif 2 * wins > len(r):
            v = "ddp-cpp faster in %d of %d trials" % (wins, len(r))
        elif 2 * wins < len(r):
            v = "**PyTorch faster in %d of %d trials**" % (len(r) - wins, len(r))
        else:
            v = "even (%d of %d trials each)" % (wins, len(r))
        verdicts[k] = rm
        alone = tr[k].get("cpp-alone-2", [])
        floor_ms = f_ms(times(alone)) if alone else "n/a"
        floor_ratio = f_ratio(paired(alone, b, lambda x, y: x / y))
        summary.setdefault(k, {}).update(
            cpp_ms=f_ms(times(a)), py_ms=f_ms(times(b)), ratio=f_ratio(r), verdict=v,
            floor_ratio=floor_ratio)
        r0 = a[0]["ranks"][0]
        add("| %s | %s | %d | %s | %s | %s | %s | %s | %s |"
            % (k, "{:,}".format(r0["num_parameters"]), r0["batch"], f_ms(times(a)),
               f_ms(times(b)), f_ratio(r), v, floor_ms, floor_ratio))
    add("")
    if "gpt" in models:
        # Tokens per second of the GPT: 2 ranks x batch x block tokens per iteration.
        tokens = 2 * tr["gpt"]["cpp-ddp-2"][0]["ranks"][0]["batch"] * 64
        cells = {}
        for name, key in (("ddp-cpp", "cpp-ddp-2"), ("PyTorch DDP", "py-ddp-2"),
                          ("floor", "cpp-alone-2")):
            if tr["gpt"].get(key):
                cells[name] = "{:,.0f}".format(tokens / med(times(tr["gpt"][key])))
        summary.setdefault("gpt", {})["tokens"] = cells
        add("GPT tokens per second at 2 ranks (%d tokens per iteration, from the medians): %s."
            % (tokens, ", ".join("%s %s" % kv for kv in cells.items())))
        add("")

    add("## 2. DDP overhead at world size 1 (DDP against the same loop without DDP)")
    add("")
    add("Both loops run in the same process on the same module (the plain loop calls the "
        "module's own forward instead of the DDP wrapper's), alternating blocks of 5 "
        "iterations (ABBA...), so that the variation between launches (up to ±10% on this "
        "machine for the same binary) and where the allocator put a model's weights do not "
        "enter the ratio. The plain columns are also the 1-process baselines of section 3.")
    add("")
    add("| model | ddp-cpp plain (ms) | ddp-cpp DDP (ms) | ddp-cpp overhead | "
        "PyTorch plain (ms) | PyTorch DDP (ms) | PyTorch overhead |")
    add("|---|---:|---:|---:|---:|---:|---:|")
    overheads = {}
    for k in models:
        cells = [k]
        for side in ("cpp", "py"):
            plain, d1 = tr[k]["%s-plain-1" % side], tr[k]["%s-ddp-1" % side]
            o = paired(d1, plain, lambda x, y: x / y - 1)
            overheads[(k, side)] = med(o)
            summary.setdefault(k, {})[side + "_overhead"] = "%+.1f%%" % (100 * med(o))
            cells += [f_ms(times(plain)), f_ms(times(d1)), f_ratio(o, pct=True)]
        add("| " + " | ".join(cells) + " |")
    add("")
    fixed = data.get("fixed_cost", {})
    bounds = {}
    if fixed:
        add("### Fixed cost per iteration")
        add("")
        add("The ratios above spread by several percent from trial to trial, which hides a "
            "1% effect. What DDP adds at world size 1 is measured directly on a model with "
            "next to no work (`tiny`: one Linear 16-10, 4 samples), in the same way (DDP and "
            "plain loops in one process, alternating blocks of 100 iterations, 2000 each): "
            "the difference of the two loops' median iteration times. Divided by each "
            "model's plain iteration time, it is nearly all of ddp-cpp's overhead at world "
            "size 1: there it runs its gradient hooks and checks but copies nothing, so its "
            "cost grows only by one hook call per parameter tensor, not with the gradients' "
            "size. PyTorch's DDP still runs its reducer at world size 1 "
            "(bucket copies, a one-rank all-reduce), so its overhead grows with the "
            "gradients' size and the fixed cost is only its lower part.")
        add("")
        add("| | tiny, plain (µs) | tiny, DDP (µs) | fixed cost per iteration (µs) | "
            + " | ".join("share of %s" % k for k in models) + " |")
        add("|---|---:|---:|---:|" + "---:|" * len(models))
        for side, label in (("cpp", "ddp-cpp"), ("py", "PyTorch")):
            runs = fixed.get(side, [])
            if not runs:
                continue
            cost = med([r["cost_s"] for r in runs])
            cells = [label, _us([r["plain_s"] for r in runs]), _us([r["ddp_s"] for r in runs]),
                     _us([r["cost_s"] for r in runs])]
            for k in models:
                plain = med(times(tr[k]["%s-plain-1" % side]))
                share = max(cost, 0.0) / plain
                bounds[(k, side)] = share
                summary.setdefault(k, {})[side + "_fixed"] = "%.3f%%" % (100 * share)
                cells.append("%.3f%%" % (100 * share))
            add("| " + " | ".join(cells) + " |")
        add("")

    if all("cpu" in t for k in models for ts in tr[k].values() for t in ts):
        add("### CPU time per iteration")
        add("")
        add("The same runs, counted in CPU time (all threads of a rank, Gloo's included, "
            "averaged over ranks) instead of wall-clock time: what an iteration costs, "
            "nearly independent of what else the machine runs.")
        add("")
        add("| model | ddp-cpp DDP, 2 ranks (ms) | PyTorch DDP, 2 ranks (ms) | ddp-cpp / PyTorch | "
            "ddp-cpp DDP overhead, 1 rank | PyTorch DDP overhead, 1 rank |")
        add("|---|---:|---:|---:|---:|---:|")
        for k in models:
            a, b = tr[k]["cpp-ddp-2"], tr[k]["py-ddp-2"]
            cells = [k, f_ms([t["cpu"] for t in a]), f_ms([t["cpu"] for t in b]),
                     f_ratio([x["cpu"] / y["cpu"] for x, y in zip(a, b)])]
            for side in ("cpp", "py"):
                plain, d1 = tr[k]["%s-plain-1" % side], tr[k]["%s-ddp-1" % side]
                cells.append(f_ratio([x["cpu"] / y["cpu"] - 1 for x, y in zip(d1, plain)],
                                     pct=True))
            add("| " + " | ".join(cells) + " |")
        add("")

    add("## 3. Scaling efficiency at world size 2")
    add("")
    add("Per-rank throughput with DDP at world size 2 against one process without DDP at "
        "the same per-rank batch (1.0 = perfect scaling).")
    add("")
    add("| model | ddp-cpp 1 process (samples/s) | ddp-cpp per rank, 2 ranks | "
        "ddp-cpp efficiency | PyTorch 1 process | PyTorch per rank, 2 ranks | "
        "PyTorch efficiency |")
    add("|---|---:|---:|---:|---:|---:|---:|")
    for k in models:
        cells = [k]
        for side in ("cpp", "py"):
            plain, d2 = tr[k]["%s-plain-1" % side], tr[k]["%s-ddp-2" % side]
            batch = plain[0]["ranks"][0]["batch"]
            e = paired(plain, d2, lambda x, y: x / y)
            summary.setdefault(k, {})[side + "_efficiency"] = "%.2f" % med(e)
            cells += ["%.0f" % (batch / med(times(plain))), "%.0f" % (batch / med(times(d2))),
                      f_ratio(e)]
        add("| " + " | ".join(cells) + " |")
    add("")

    add("## 4. Overlap of communication with backward (world size 2)")
    add("")
    add("Hidden share = the part of the communication window (first bucket launched → last "
        "bucket reduced) that lies before backward ended: (end of backward − first launch) / "
        "(end of the wait − first launch). ddp-cpp: from its Chrome trace (a traced run "
        "after the timed ones); PyTorch: its reducer's own sampled timers "
        "(`_get_ddp_logging_data()`: backward_compute_comm_overlap_time / "
        "backward_comm_time), sampled every iteration in extra iterations after the timed "
        "ones. The wait and bucket counts of ddp-cpp are its IterationStats over all timed "
        "iterations.")
    add("")
    add("| model | ddp-cpp buckets (sizes, MB) | launched during backward | finished during "
        "backward | wait at end (ms) | ddp-cpp hidden share | PyTorch buckets (sizes, MB) | "
        "PyTorch comm window (ms) | PyTorch hidden share |")
    add("|---|---|---:|---:|---:|---:|---|---:|---:|")
    overlap = data.get("overlap", {})
    for k in models:
        its = cpp_iterations(tr[k]["cpp-ddp-2"])
        cpp_sizes = bucket_sizes(tr[k]["cpp-ddp-2"], "cpp")
        py_sizes = bucket_sizes(tr[k]["py-ddp-2"], "py")
        launched = med([i["launched_before_end"] for i in its]) if its else float("nan")
        done = med([i["done_before_end"] for i in its]) if its else float("nan")
        wait = [i["wait_ms"] / 1e3 for i in its]
        samples = py_samples(tr[k]["py-ddp-2"])
        cpp_hidden = overlap.get(k, {}).get("hidden_shares", [])
        py_hidden = py_hidden_shares(tr[k]["py-ddp-2"])
        summary.setdefault(k, {}).update(
            cpp_hidden="%.0f%%" % (100 * med(cpp_hidden)) if cpp_hidden else "n/a",
            py_hidden="%.0f%%" % (100 * med(py_hidden)) if py_hidden else "n/a")
        add("| %s | %d (%s) | %s of %d | %s of %d | %s | %s | %d (%s) | %s | %s |"
            % (k, len(cpp_sizes), _mb(cpp_sizes), _count(launched), len(cpp_sizes),
               _count(done), len(cpp_sizes), f_ms(wait) if wait else "n/a",
               f_share(overlap.get(k, {}).get("hidden_shares", [])), len(py_sizes),
               _mb(py_sizes),
               f_ms([s["backward_comm_ms"] / 1e3 for s in samples]) if samples else "n/a",
               f_share(py_hidden_shares(tr[k]["py-ddp-2"]))))
    add("")

    add("## 5. All-reduce bandwidth of DDP's buckets (world size 2)")
    add("")
    lb = data.get("loopback", {})
    add("busbw = bytes / time × 2(n−1)/n (for n = 2: bytes / time), as nccl-tests and "
        "`bench_allreduce` report it. **ddp-cpp (trace)**: per iteration of the traced run, "
        "all bucket bytes over the time communication was in flight: the union over buckets "
        "of [the last rank's launch, the first rank's completion] (an all-reduce cannot "
        "start before every rank launched it; buckets in flight together count once). "
        "**ddp-cpp (stats)**: the same from IterationStats of the timed runs, with each "
        "bucket's launch → reduced time taken on the rank that launched it last, summed over "
        "buckets (so buckets in flight together count twice: a lower bound). Both run "
        "while backward computes on the same cores. **Raw all-reduce** (on the backend ddp-cpp used): `bench_allreduce` "
        "(ProcessGroupGloo all-reduce after a barrier, nothing else running) at exactly "
        "the same sizes, one after another. **PyTorch** exposes only its whole "
        "communication window (first launch → end of finalize), a lower bound. "
        "**Loopback ceiling**: a plain TCP stream between two processes on 127.0.0.1 "
        "(`loopback.py`): %s GB/s one way, %s GB/s per direction when both directions run "
        "at once, as in an all-reduce." % (_num(lb.get("one_way_GBps", float("nan"))),
                                          _num(lb.get("duplex_per_direction_GBps",
                                                      float("nan")))))
    add("")
    add("")
    add("**Raw all-reduce beside compute**: the same `bench_allreduce`, with one compute thread "
        "per rank (a loop of 256×256 matrix products) running for the whole measurement, "
        "as backward does while DDP's buckets are in flight. On this 2-core machine the "
        "two ranks' compute threads and Gloo's threads share the cores, which is what "
        "separates DDP's buckets from the idle raw figure.")
    add("")
    add("| model | bucket sizes (MB) | ddp-cpp (trace) GB/s | ddp-cpp (stats) GB/s | raw all-reduce, "
        "same sizes | ddp-cpp (trace) / raw | raw beside compute | ddp-cpp (trace) / "
        "raw beside compute | PyTorch window (lower bound) | duplex loopback ceiling |")
    add("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    bw_ratio = {}
    raw = data.get("raw_allreduce", {})
    raw_busy = data.get("raw_allreduce_busy", {})
    for k in models:
        sizes = bucket_sizes(tr[k]["cpp-ddp-2"], "cpp")
        traced_bw = overlap.get(k, {}).get("busbw", [])
        stats_bw = cpp_bucket_busbw(tr[k]["cpp-ddp-2"])
        r = raw_busbw(sizes, raw)
        rb = raw_busbw(sizes, raw_busy) if raw_busy else float("nan")
        bw_ratio[k] = med(traced_bw) / r if traced_bw else float("nan")
        summary.setdefault(k, {}).update(
            busbw=_pct(bw_ratio[k]),
            busbw_busy=_pct(med(traced_bw) / rb) if traced_bw and rb == rb else "n/a")
        add("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
            % (k, _mb(sizes), _bw(traced_bw), _bw(stats_bw), _num(r),
               _pct(bw_ratio[k]), _num(rb),
               _pct(med(traced_bw) / rb) if traced_bw and rb == rb else "n/a",
               _bw(py_span_busbw(tr[k]["py-ddp-2"])),
               _num(lb.get("duplex_per_direction_GBps", float("nan")))))
    add("")
    sweep = data.get("allreduce_sweep")
    if sweep:
        add("Raw all-reduce at 2 ranks (`bench_allreduce`), the transports side by side, "
            "for reference. shm: an ordinary tensor, copied through the segment in slices; "
            "shm, bucket: a buffer the group made, reduced in shared memory, as DDP's "
            "buckets are with a comm hook or gradient_as_bucket_view; shm, in place: an "
            "ordinary tensor reduced where it is, straight between the ranks' memory, as "
            "DDP's gradients are by default (docs/shm.md). The 'raw all-reduce' figures "
            "above are the last when ddp-cpp runs on shm.")
        add("")
        add("| size | gloo (us) | shm (us) | shm, bucket (us) | shm, in place (us) "
            "| gloo busbw (GB/s) | shm busbw (GB/s) | shm, bucket busbw (GB/s) "
            "| shm, in place busbw (GB/s) | shm / gloo | shm, bucket / gloo "
            "| shm, in place / gloo | memcpy (GB/s) | shm, in place busbw / memcpy |")
        add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        nan = float("nan")
        for row in sweep:
            if "shm_time_s" not in row:  # results of an older run
                continue
            bt = row.get("bucket_time_s", nan)
            dt = row.get("in_place_time_s", nan)
            add("| %s | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f "
                "| %.2f | %.2f | %.2f |"
                % (row["size"], row["gloo_time_s"] * 1e6, row["shm_time_s"] * 1e6, bt * 1e6,
                   dt * 1e6, row["gloo_busbw"], row["shm_busbw"],
                   row.get("bucket_busbw", nan), row.get("in_place_busbw", nan),
                   row["gloo_time_s"] / row["shm_time_s"], row["gloo_time_s"] / bt,
                   row["gloo_time_s"] / dt, row["memcpy_GBps"],
                   row.get("in_place_busbw", nan) / row["memcpy_GBps"]))
        add("")

    add("## Same work on both sides")
    add("")
    add("Both sides start from the same closed-form weights and data (models.py / "
        "models.h) and train %d SGD steps; the largest parameter difference, relative "
        "to the largest parameter, must be below %g (and training must have moved the weights, and 2 ranks must differ from 1)."
        % (next(iter(data["equivalence"].values()))["steps"] if data["equivalence"] else 0,
           st["rtol"]))
    add("")
    add("| model | DDP 2 ranks: C++ vs Python | no DDP: C++ vs Python | rank 1 vs rank 0 "
        "(C++ / Python) | moved from init | DDP vs 1 rank | result |")
    add("|---|---:|---:|---:|---:|---:|---|")
    for k, e in data["equivalence"].items():
        add("| %s | %.1e | %.1e | %.1e / %.1e | %.1e | %.1e | %s |"
            % (k, e["ddp_cpp_vs_py"], e["plain_cpp_vs_py"], e["cpp_rank1_vs_rank0"],
               e["py_rank1_vs_rank0"], e["moved_from_init"], e["ddp_vs_plain"],
               "same work" if e["ok"] else "**MISMATCH**"))
    add("")

    add("## Goals")
    add("")
    add("The overhead goal is judged on the fixed cost (section 2), which is precise; the "
        "paired wall-clock median is shown beside it.")
    add("")
    add("| model | iteration time ≤ PyTorch DDP (ratio) | DDP overhead at world size 1 ≤ 1% "
        "(fixed cost; paired wall clock) | bucket busbw ≥ 95% of raw all-reduce |")
    add("|---|---|---|---|")
    for k in models:
        r, o, b = verdicts[k], overheads[(k, "cpp")], bw_ratio[k]
        bound = bounds.get((k, "cpp"), float("nan"))
        judged = bound if bound == bound else o
        add("| %s | %s (%.3f) | %s (%.3f%%; %+.1f%%) | %s (%s) |"
            % (k, _met(r <= 1, r), r, _met(judged <= 0.01, judged), 100 * bound, 100 * o,
               _met(b >= 0.95, b), _pct(b)))
    add("")

    if data.get("timeline"):
        add("## Timeline")
        add("")
        add("![ddp-cpp timeline](%s)" % data["timeline"]["svg"])
        add("")
        add("    %s" % data["timeline"]["cmd"])
        add("")

    add("## Commands")
    add("")
    add("```sh")
    add("bench/run-compare %s" % " ".join(meta["argv"]))
    add("# each trial is one launch, every rank with %s; for example:" % meta["env"])
    for c in meta["commands"]:
        add(c)
    add("```")
    add("")
    return "\n".join(L)


README_BEGIN = "<!-- bench/run-compare: begin -->"
README_END = "<!-- bench/run-compare: end -->"


def readme_block(data):
    """The README's copy of the latest results: the headline table and a summary of the
    other figures, between README_BEGIN and README_END."""
    summary = {}
    markdown(data, summary)
    meta = data["meta"]
    m = meta["machine"]
    models = [k for k in ("small", "cnn", "wide", "gpt") if k in summary]
    L = [README_BEGIN, ""]
    L.append("Measured by `bench/run-compare` on %s (%s, %s cores, %s), ddp-cpp %s, "
             "%d interleaved trials per configuration; medians, with the smallest and "
             "largest trial in brackets. Full report: "
             "[bench/results/compare.md](bench/results/compare.md)."
             % (meta["date"], m["cpu"], m["cores"], m["os"], meta["git"] or "?",
                meta["settings"]["trials"]))
    L.append("")
    L.append("| model | ddp-cpp (ms) | PyTorch DDP (ms) | ddp-cpp / PyTorch | verdict | "
             "floor / PyTorch (no communication) |")
    L.append("|---|---:|---:|---:|---|---:|")
    for k in models:
        c = summary[k]
        L.append("| %s | %s | %s | %s | %s | %s |"
                 % (k, c["cpp_ms"], c["py_ms"], c["ratio"], c["verdict"],
                    c.get("floor_ratio", "n/a")))
    if summary.get("gpt", {}).get("tokens"):
        L.append("")
        L.append("GPT tokens per second at 2 ranks: %s."
                 % ", ".join("%s %s" % kv for kv in summary["gpt"]["tokens"].items()))
    L.append("")
    L.append("| model | DDP overhead at world size 1, ddp-cpp (fixed cost; paired) | "
             "PyTorch (paired) | scaling efficiency at 2 ranks, ddp-cpp / PyTorch | "
             "communication hidden behind backward, ddp-cpp / PyTorch | bucket busbw, "
             "% of raw all-reduce (idle / beside compute) |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for k in models:
        c = summary[k]
        L.append("| %s | %s; %s | %s | %s / %s | %s / %s | %s / %s |"
                 % (k, c.get("cpp_fixed", "n/a"), c["cpp_overhead"], c["py_overhead"],
                    c["cpp_efficiency"], c["py_efficiency"], c["cpp_hidden"],
                    c["py_hidden"], c["busbw"], c["busbw_busy"]))
    L.append("")
    L.append(README_END)
    return "\n".join(L)


def update_readme(path, data):
    """Replaces the block between the markers in `path`; False if they are missing."""
    with open(path) as f:
        text = f.read()
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        return False
    text = text[:start] + readme_block(data) + text[end + len(README_END):]
    with open(path, "w") as f:
        f.write(text)
    return True


def _us(values):
    m, lo, hi = spread([v * 1e6 for v in values])
    return "%.2f (%.2f … %.2f)" % (m, lo, hi)


def _pct(v):
    return "%.0f%%" % (100 * v) if v == v else "n/a"


def _met(ok, value):
    return "n/a" if value != value else ("met" if ok else "not met")


def _count(v):
    return "%g" % v if v == v else "n/a"


def _load(v):
    return "/".join("%.2f" % x for x in v) if v else "n/a"


def _mb(sizes):
    return ", ".join("%.1f" % (s / 2**20) for s in sizes) if sizes else "n/a"


def _bw(values):
    if not values:
        return "n/a"
    m, lo, hi = spread(values)
    return "%s (%s–%s)" % (_num(m), _num(lo), _num(hi))


def _cpp_backend(data):
    """The backend ddp-cpp's DDP runs used (bench_compare records it per rank)."""
    seen = set()
    for trials in data["trials"].values():
        for ts in trials.values():
            for t in ts:
                for r in t["ranks"]:
                    if r.get("side") == "cpp" and r.get("ddp") and r.get("backend"):
                        seen.add(r["backend"])
    return ", ".join(sorted(seen)) or "gloo"


def _cpp_torch(data):
    for trials in data["trials"].values():
        for ts in trials.values():
            for t in ts:
                r = t["ranks"][0]
                if r["side"] == "cpp":
                    return r.get("torch", "?")
    return "?"


def example_commands(data):
    out = []
    for trials in data["trials"].values():
        for k in ("cpp-ddp-2", "py-ddp-2", "cpp-ddp-1"):
            if k in trials:
                out.append(trials[k][0]["cmd"])
        break
    return out
