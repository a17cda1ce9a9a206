"""Driver of bench/run-fsdp-cap: a GPT that DDP cannot fit in a per-rank memory limit
trains under fully_shard (docs/fsdp-cap.md).

Each rank runs in a memory cgroup of its own (cgroup v1 or v2, whichever this machine
lets root write). First DDP and fully_shard each train once with no limit, and each
rank's peak is read; then the limit is set between fully_shard's peak and DDP's, and
both train again under it. The report (markdown) says what each run needed, how it
ended (exit code, signal, the kernel's OOM killer) and how far it trained.
Standard library only.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MB = 1e6
NPROC = 2

# The GPT of each size (build/bin/gpt's flags). Model state per rank: 16 bytes a
# parameter under DDP (weights, gradients, AdamW's two averages), 8 at 2 ranks under
# fully_shard; LibTorch itself takes about 400 MB a rank on top. The default is GPT-2
# small's blocks (12 x 768; 85 M parameters with this vocabulary): its four runs take
# about 1.5 minutes on a 2-core machine (docs/fsdp-cap.md); --quick's (8 x 512, 25 M
# parameters), 20 s.
SIZES = {
    "default": dict(n_layer=12, n_head=12, n_embd=768, block_size=64, batch_size=4, steps=6,
                    truncate=0.05, learning_rate=1e-4),
    "quick": dict(n_layer=8, n_head=8, n_embd=512, block_size=32, batch_size=4, steps=3,
                  truncate=0.02, learning_rate=1e-4),
}
# fully_shard's and DDP's needs must be at least this far apart for a cap between them
# to say something: a tenth of fully_shard's, and never less than 32 MB.
MIN_GAP_FRACTION = 0.10
MIN_GAP_BYTES = 32 * 2**20


class NoCgroup(Exception):
    """No writable memory controller: the message says what was looked for."""


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def read_int(path):
    try:
        return int(read(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_keyed(path):
    """memory.stat, memory.events, memory.oom_control: 'key value' lines."""
    out = {}
    try:
        for line in read(path).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                out[parts[0]] = int(parts[1])
    except OSError:
        pass
    return out


def mounts():
    """(mount point, root within the hierarchy, fs type, super options) of each cgroup mount."""
    found = []
    for line in read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(r) >= 3 and r[0] in ("cgroup", "cgroup2"):
            found.append((f[4], f[3], r[0], r[2].split(",")))
    return found


def own_cgroups():
    """This process's groups, {'v1': path in the memory hierarchy, 'v2': path}, from
    /proc/self/cgroup."""
    own = {}
    for line in read("/proc/self/cgroup").splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            own["v2"] = path
        elif "memory" in controllers.split(","):
            own["v1"] = path
    return own


def dir_of(mount_point, mount_root, path):
    """Where the cgroup `path` (as /proc/self/cgroup names it) is under this mount."""
    if path is None:
        return mount_point
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root):]
    elif mount_root != "/":
        return mount_point
    return os.path.normpath(mount_point + "/" + path)


class Cgroups:
    """The memory cgroups of one driver: a parent group named after its PID (so that
    two drivers never collide), one group per rank and run inside it; all removed by
    close(), after the processes in them have ended."""

    def __init__(self, tag):
        self.name = f"{tag}-{os.getpid()}"
        self.version = None
        self.parent = None
        self.made = []  # rank groups not yet removed
        tried = []
        own = own_cgroups()
        ms = mounts()
        v1 = [m for m in ms if m[2] == "cgroup" and "memory" in m[3]]
        v2 = [m for m in ms if m[2] == "cgroup2"]
        if not v1:
            tried.append("cgroup v1: no hierarchy with the memory controller is mounted")
        for point, root, _, _ in v1:
            # Inside this process's own group (its limits still apply around ours); the
            # hierarchy's root where that group is not visible here.
            own_dir = dir_of(point, root, own.get("v1"))
            err = self._try_v1(own_dir if os.path.isdir(own_dir) else point)
            if err is None:
                return
            tried.append(f"cgroup v1 memory controller at {point}: {err}")
        if not v2:
            tried.append("cgroup v2: not mounted")
        for point, root, _, _ in v2:
            err = self._try_v2(point, dir_of(point, root, own.get("v2")))
            if err is None:
                return
            tried.append(f"cgroup v2 at {point}: {err}")
        raise NoCgroup(tried)

    def _try_v1(self, base):
        if not os.path.isfile(os.path.join(base, "memory.limit_in_bytes")):
            return f"{base} has no memory.limit_in_bytes"
        parent = os.path.join(base, self.name)
        try:
            os.mkdir(parent)
        except OSError as e:
            return f"cannot create {parent}: {e.strerror}"
        self.version, self.parent = 1, parent
        return None

    def _try_v2(self, point, own_dir):
        controllers = read(os.path.join(point, "cgroup.controllers")).split()
        if "memory" not in controllers:
            return ("the memory controller is not available here (cgroup.controllers: "
                    f"{' '.join(controllers) or 'none'})")
        # A group whose children get the memory controller: this process's own group or
        # the nearest one above it that hands memory down (cgroup v2 lets a group with
        # processes in it, other than the root, hand no controller down).
        d, errors = own_dir, []
        while True:
            sub = os.path.join(d, "cgroup.subtree_control")
            if os.path.isfile(sub) and "memory" in read(sub).split():
                parent = os.path.join(d, self.name)
                try:
                    os.mkdir(parent)
                except OSError as e:
                    errors.append(f"cannot create {parent}: {e.strerror}")
                else:
                    try:
                        write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
                        self.version, self.parent = 2, parent
                        return None
                    except OSError as e:
                        errors.append(f"cannot enable memory in {parent}: {e.strerror}")
                        os.rmdir(parent)
            if os.path.normpath(d) == os.path.normpath(point):
                break
            d = os.path.dirname(d)
        if errors:
            return "; ".join(errors)
        return (f"no group from {own_dir} up to {point} hands the memory controller down "
                "(memory in its cgroup.subtree_control)")

    # -- one group per rank and run ------------------------------------------------------
    def create(self, name, limit=None):
        path = os.path.join(self.parent, name)
        os.mkdir(path)
        self.made.append(path)
        if limit is not None:
            if self.version == 1:
                write(os.path.join(path, "memory.limit_in_bytes"), str(limit))
                # No swap here, but where there is, swap must not hide the limit.
                memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):
                    write(memsw, str(limit))
            else:
                write(os.path.join(path, "memory.max"), str(limit))
                swap = os.path.join(path, "memory.swap.max")
                if os.path.exists(swap):
                    write(swap, "0")
        return path

    def limit(self, path):
        f = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        text = read(os.path.join(path, f)).strip()
        return None if text == "max" or int(text) >= 2**62 else int(text)

    def usage(self, path):
        return read_int(os.path.join(path, "memory.usage_in_bytes" if self.version == 1
                                     else "memory.current"))

    def peak(self, path):
        """The kernel's high-water mark of the group (None: a v2 kernel without memory.peak)."""
        return read_int(os.path.join(path, "memory.max_usage_in_bytes" if self.version == 1
                                     else "memory.peak"))

    def resident(self, path):
        """(what reclaim cannot free without swap: anonymous + shared memory, page cache)."""
        s = read_keyed(os.path.join(path, "memory.stat"))
        if self.version == 1:
            return s.get("total_rss", 0) + s.get("total_shmem", 0), s.get("total_cache", 0)
        return s.get("anon", 0) + s.get("shmem", 0), s.get("file", 0)

    def events(self, path):
        """(times the limit was hit, OOM kills in the group)."""
        if self.version == 1:
            hits = read_int(os.path.join(path, "memory.failcnt"))
            oom = read_keyed(os.path.join(path, "memory.oom_control")).get("oom_kill")
            return hits, oom
        e = read_keyed(os.path.join(path, "memory.events"))
        return e.get("max"), e.get("oom_kill")

    def procs(self, path):
        try:
            return [int(p) for p in read(os.path.join(path, "cgroup.procs")).split()]
        except OSError:
            return []

    def remove(self, path, wait_s=30):
        """rmdir once the group's processes are gone; any still there after wait_s
        (processes this driver started) are killed, and the rmdir is given 10 s more."""
        deadline, killed, error = time.monotonic() + wait_s, False, None
        while os.path.isdir(path):
            pids = self.procs(path)
            if not pids:
                try:
                    os.rmdir(path)
                    break
                except OSError as e:  # EBUSY for a moment after the last process exits
                    error = e.strerror
            if time.monotonic() > deadline:
                if killed or not pids:
                    print(f"fsdp_cap: could not remove {path}: "
                          f"{f'processes {pids} are still in it' if pids else error}",
                          file=sys.stderr)
                    return False
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed, deadline = True, time.monotonic() + 10
            time.sleep(0.05)
        if path in self.made:
            self.made.remove(path)
        return True

    def close(self):
        ok = all([self.remove(p) for p in list(self.made)])
        if self.parent and os.path.isdir(self.parent):
            try:
                os.rmdir(self.parent)
            except OSError as e:
                print(f"fsdp_cap: could not remove {self.parent}: {e.strerror}", file=sys.stderr)
                ok = False
        return ok


class Sampler(threading.Thread):
    """Every 10 ms, each rank group's anonymous + shared memory and its usage: the kernel
    keeps a peak of the usage only (page cache included), so the resident part's peak
    is sampled."""

    def __init__(self, cgroups, paths):
        super().__init__(daemon=True)
        self.cg, self.paths = cgroups, paths
        self.resident = {p: 0 for p in paths}
        self.usage = {p: 0 for p in paths}
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def snapshot(self):
        """Each group's peaks so far: (sampled resident, kernel peak less cache now)."""
        with self.lock:
            out = {}
            for p in self.paths:
                r, cache = self.cg.resident(p)
                peak = self.cg.peak(p)
                if peak is None:
                    peak = self.usage[p]
                out[p] = max(self.resident[p], r, peak - cache)
            return out

    def run(self):
        while not self.stop.is_set():
            for p in self.paths:
                try:
                    r, _ = self.cg.resident(p)
                    u = self.cg.usage(p) or 0
                except OSError:
                    continue
                with self.lock:
                    self.resident[p] = max(self.resident[p], r)
                    self.usage[p] = max(self.usage[p], u)
            self.stop.wait(0.01)


def prewarm(paths):
    """Reads the programs, their shared libraries and the data into the page cache from
    this driver's own cgroup: a rank's group is then charged for what the rank itself
    allocates, not for whichever run happened to read LibTorch from disk first."""
    files = set(paths)
    for p in paths:
        try:
            out = subprocess.run(["ldd", p], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for m in re.finditer(r"=>\s*(/\S+)", out):
            files.add(m.group(1))
    total = 0
    for f in sorted(files):
        try:
            with open(f, "rb", buffering=0) as fh:
                while True:
                    b = fh.read(1 << 22)
                    if not b:
                        break
                    total += len(b)
        except OSError:
            pass
    return total


def gpt_args(size, steps, run_dir):
    return ["--n-layer", str(size["n_layer"]), "--n-head", str(size["n_head"]),
            "--n-embd", str(size["n_embd"]), "--block-size", str(size["block_size"]),
            "--batch-size", str(size["batch_size"]), "--max-steps", str(steps),
            "--max-epochs", "1000", "--log-every", "1", "--sample-length", "0",
            # Training alone: the final checkpoint and model.pt gather the whole model and
            # AdamW's state on rank 0 (docs/fsdp-cap.md says what that costs).
            "--no-save", "--truncate", str(size["truncate"]),
            "--learning-rate", str(size["learning_rate"]), "--run-dir", run_dir, "--name", "gpt"]


def parameter_count(size, vocab):
    e, layers = size["n_embd"], size["n_layer"]
    # wte (tied to the output), wpe, per block: 2 LayerNorms, qkv (no bias), proj, fc,
    # proj, then ln_f (examples/gpt/model.h).
    return vocab * e + size["block_size"] * e + layers * (12 * e * e + 10 * e) + 2 * e


class Runner:
    def __init__(self, a, cgroups):
        self.a, self.cg = a, cgroups
        self.ddprun, self.gpt = a.ddprun, a.gpt
        self.proc = None
        self.work = None  # this driver's temporary folder (TMPDIR of the programs too)
        self.count = 0
        self.vocab = None
        self.printed_params = None

    def run(self, mode, phase, limit, size, steps):
        """One 2-rank run of gpt (DDP or --fsdp), each rank in a fresh group; its record."""
        self.count += 1
        label = f"{self.count}-{phase}-{mode}"
        paths = [self.cg.create(f"{label}-rank{r}", limit) for r in range(NPROC)]
        run_dir = tempfile.mkdtemp(prefix=f"{label}-", dir=self.work)
        reports = os.path.join(run_dir, "ranks")
        os.mkdir(reports)
        cmd = [self.ddprun, "--nproc-per-node", str(NPROC), "--", sys.executable,
               os.path.join(HERE, "cap_exec.py"), os.path.join(self.cg.parent, f"{label}-"),
               reports, "--", self.gpt] + gpt_args(size, steps, run_dir)
        if mode == "fsdp":
            cmd.append("--fsdp")
        what = "fully_shard" if mode == "fsdp" else "DDP"
        cap = f"limit {limit / MB:.0f} MB a rank" if limit else "no limit"
        print(f"== {what}, {cap}", flush=True)
        sampler = Sampler(self.cg, paths)
        sampler.start()
        start = time.monotonic()
        log, rc = [], None
        self.timed_out = False
        timer = threading.Timer(self.a.timeout, self._time_out)
        timer.daemon = True
        try:
            env = dict(os.environ, TMPDIR=self.work)  # ddprun's flight-recorder dumps too
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, errors="replace", env=env)
            timer.start()
            training = None
            last = re.compile(rf"step\s+{steps}\s.*val loss")
            for line in self.proc.stdout:
                log.append(line.rstrip("\n"))
                if training is None and last.search(line):
                    # The last step's record, after its validation: training is over, the
                    # final checkpoint and model.pt come next.
                    training = sampler.snapshot()
                if not self.a.quiet:
                    print("   ", line.rstrip("\n"), flush=True)
            rc = self.proc.wait()
        finally:
            timer.cancel()
            if self.proc and self.proc.poll() is None:
                self._stop()
                self.proc.wait()
            self.proc = None
            sampler.stop.set()
        wall = time.monotonic() - start
        sampler.join()
        # Every worker has ended (ddprun waits for them all); the groups hold only the
        # page cache that rank 0's files left, and the kernel's counters.
        ranks = []
        for r, path in enumerate(paths):
            try:
                with open(os.path.join(reports, f"rank{r}.json")) as f:
                    rec = json.load(f)
            except (OSError, ValueError):
                rec = {"rank": r, "exit_code": None, "signal": None, "peak_rss_bytes": None}
            hits, oom = self.cg.events(path)
            _, cache = self.cg.resident(path)
            peak = self.cg.peak(path)
            if peak is None:  # cgroup v2 before memory.peak (Linux 5.19): sampled
                peak = sampler.usage[path]
            rec.update(limit_read=self.cg.limit(path), cgroup_peak=peak, cache_at_end=cache,
                       resident_peak=sampler.resident[path], limit_hits=hits, oom_kills=oom)
            # What the rank needed: anonymous and shared memory, which no reclaim frees
            # without swap. The sampled peak may miss a short spike; the kernel's peak
            # less the page cache still there at the end is also a lower bound of it.
            rec["needed"] = max(sampler.resident[path], peak - cache)
            rec["needed_training"] = training[path] if training else None
            ranks.append(rec)
            self.cg.remove(path)
        records = []
        metrics = os.path.join(run_dir, "gpt", "metrics.jsonl")
        try:
            with open(metrics) as f:
                records = [json.loads(l) for l in f if l.strip()]
        except (OSError, ValueError):
            pass
        for line in log:
            m = re.search(r"vocabulary (\d+)", line)
            if m:
                self.vocab = int(m.group(1))
            m = re.search(r"([0-9.]+)M parameters", line)
            if m:
                self.printed_params = float(m.group(1))
        if self.a.keep_runs:
            print(f"   (run folder kept: {run_dir})")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
        losses = [r["train_loss"] for r in records if "train_loss" in r]
        steps_done = max((r["step"] for r in records if "train_loss" in r), default=0)
        summary = [l for l in log if "ddprun:" in l or "error" in l.lower()][-6:]
        return dict(mode=mode, phase=phase, limit=limit, rc=rc, timed_out=self.timed_out,
                    wall_s=wall, ranks=ranks, steps_done=steps_done, steps=steps,
                    first_loss=losses[0] if losses else None,
                    last_loss=losses[-1] if losses else None,
                    val_loss=next((r["val_loss"] for r in reversed(records) if "val_loss" in r),
                                  None),
                    needed=max(r["needed"] for r in ranks),
                    needed_training=(max(r["needed_training"] for r in ranks) if training
                                     else None),
                    training_done=training is not None,
                    log_tail=summary,
                    command=cmd[cmd.index(self.gpt):], cgroups=paths, run_dir=run_dir)

    def _time_out(self):
        self.timed_out = True
        print(f"fsdp_cap: the run took over {self.a.timeout:.0f} s; stopping it", flush=True)
        self._stop()

    def _stop(self):
        p = self.proc
        if p and p.poll() is None:
            p.send_signal(signal.SIGTERM)  # ddprun passes it to every worker
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def oom_killed(rank):
    """SIGKILL, and the group counted an OOM kill (a kernel without that count, before
    Linux 4.13 on cgroup v1: the group hit its limit)."""
    if rank.get("signal") != signal.SIGKILL:
        return False
    if rank.get("oom_kills") is None:
        return bool(rank.get("limit_hits"))
    return rank["oom_kills"] > 0


def ended(rank):
    if rank.get("exit_code") is not None:
        return f"exit {rank['exit_code']}"
    s = rank.get("signal")
    if s is None:
        return "no record (the wrapper was killed)"
    name = signal.Signals(s).name if s in signal.Signals._value2member_map_ else str(s)
    if oom_killed(rank) and rank.get("oom_kills") is None:
        return (f"{name}: the OOM killer (inferred: the limit was hit {rank['limit_hits']} "
                "times; this kernel counts no OOM kills)")
    if oom_killed(rank):
        return f"{name}: the kernel's OOM killer"
    if s == signal.SIGTERM:
        return f"{name} (ddprun, stopping the job)"
    return name


def verdict(run):
    """'ok', 'oom' (a rank killed by the OOM killer) or 'failed'."""
    if any(oom_killed(r) for r in run["ranks"]):
        return "oom"
    if run["rc"] == 0 and all(r.get("exit_code") == 0 for r in run["ranks"]):
        return "ok"
    return "failed"


def falling(run):
    return (run["first_loss"] is not None and run["last_loss"] is not None
            and run["last_loss"] < run["first_loss"])


def mb(x):
    return "–" if x is None else f"{x / MB:,.0f}"


def loss(x):
    return "–" if x is None else f"{x:.3f}"


def diagnose(d, f):
    """Why no limit separates fully_shard's need from DDP's: which phase and rank set it."""
    dt, ft = d.get("needed_training"), f.get("needed_training")
    f0, f1 = (r["needed"] for r in f["ranks"])
    if dt and ft and ft >= dt - max(MIN_GAP_FRACTION * ft, MIN_GAP_BYTES):
        return (f"fully_shard needs as much as DDP or more already while training "
                f"({ft / MB:,.0f} MB against {dt / MB:,.0f} MB on the largest rank): at "
                f"{NPROC} ranks its weights, gradients and AdamW state are half of DDP's, so "
                "something else of it takes the difference (see docs/fsdp.md, Memory).")
    if ft and f0 > f1 and f0 - ft > max(MIN_GAP_FRACTION * ft, MIN_GAP_BYTES):
        return (f"fully_shard trains in {ft / MB:,.0f} MB, below DDP's {dt / MB:,.0f} MB, "
                f"but its rank 0 needs {f0 / MB:,.0f} MB at the end: gpt's last checkpoint "
                "(`ddp::save_checkpoint`) gathers the full model and AdamW's state on rank 0, "
                "beside the rank's own shards, and builds the file in memory; DDP's rank 0 "
                "needs less there, since its state is already whole. A sharded checkpoint "
                "(`ddp::save_sharded_checkpoint`) would gather nothing.")
    return ("a larger model (more of each rank's memory in model state) widens the gap, "
            "if fully_shard's memory is 1/N of DDP's plus a block's.")


def report(a, cg, size, runs, cap, params, vocab, outcome, total_s):
    what = {"ddp": "DDP", "fsdp": "fully_shard"}
    calib = {r["mode"]: r for r in runs if r["phase"] == "measure"}
    capped = {r["mode"]: r for r in runs if r["phase"] == "capped"}
    d, f = calib.get("ddp"), calib.get("fsdp")
    pbytes = 4 * params if params else None
    lines = ["# fully_shard under a memory limit: a GPT that DDP cannot fit", ""]
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    cpu = next((l.split(":", 1)[1].strip() for l in read("/proc/cpuinfo").splitlines()
                if l.startswith("model name")), "unknown CPU")
    lines += [f"Written by `bench/run-fsdp-cap{' --quick' if a.quick else ''}` on {now}: "
              f"{os.cpu_count()} cores ({cpu}), {NPROC} ranks, one memory cgroup per rank "
              f"(cgroup v{cg.version}). Total time {total_s:.0f} s.", ""]
    if outcome == "shown":
        dk, fk = capped["ddp"], capped["fsdp"]
        at = dk["steps_done"]
        when = ("after its last step, while rank 0 wrote the final checkpoint and model.pt"
                if dk["training_done"] else "before its first step" if at == 0
                else f"while training, after {at} of {dk['steps']} steps")
        if d and f:
            lines += [f"**This GPT needs {d['needed'] / MB:,.0f} MB per rank with DDP; with "
                      f"fully_shard it trains in {f['needed'] / MB:,.0f} MB.**"]
        lines += [f"Under a limit of {cap / MB:,.0f} MB per rank, DDP was killed by the "
                  f"kernel's OOM killer ({when}); fully_shard trained all "
                  f"{fk['steps_done']} steps, its loss falling from {loss(fk['first_loss'])} to "
                  f"{loss(fk['last_loss'])}.", ""]
    elif outcome == "no-gap":
        lines += [f"**No limit separates them at this size:** fully_shard needed "
                  f"{f['needed'] / MB:,.0f} MB per rank and DDP {d['needed'] / MB:,.0f} MB; a "
                  f"limit between them needs fully_shard at least {MIN_GAP_FRACTION:.0%} (and "
                  f"{MIN_GAP_BYTES / 2**20:.0f} MiB) below DDP, so the runs under a limit were "
                  "not made. " + diagnose(d, f), ""]
    else:
        lines += [f"**Not shown:** " + (f"under a limit of {cap / MB:,.0f} MB per rank, "
                                          if cap else "") + outcome, ""]
    e = size["n_embd"]
    lines += ["## The model", "",
              "| | |", "| --- | --- |",
              f"| GPT (`examples/gpt.cpp`) | {size['n_layer']} blocks, {size['n_head']} heads, "
              f"n_embd {e}, block size {size['block_size']}, vocabulary {vocab or '?'} |"]
    if params:
        lines += [f"| parameters | {params:,} ({pbytes / MB:,.0f} MB of float32) |",
                  f"| model state per rank | DDP: weights, gradients, AdamW's two averages: "
                  f"{4 * pbytes / MB:,.0f} MB; fully_shard at {NPROC} ranks: "
                  f"{4 * pbytes / NPROC / MB:,.0f} MB, plus a block's full weights while it runs "
                  f"({4 * (12 * e * e + 10 * e) / MB:,.0f} MB) |"]
    if runs:
        lines += [f"| training | {size['batch_size']} windows of {size['block_size']} "
                  f"characters per rank and step, {runs[0]['steps']} steps, AdamW lr "
                  f"{size['learning_rate']:g}, fortunes' songs-poems (its first "
                  f"{size['truncate']:.0%}) |",
                  f"| command | `ddprun --nproc-per-node {NPROC} -- gpt "
                  f"{' '.join(runs[0]['command'][1:-4])} --run-dir DIR --name gpt` (and "
                  "`--fsdp` for fully_shard), each run in a fresh temporary DIR |", ""]
        lines += ["## The runs", "",
                  "Each rank in a group of its own: first with no limit (the measurement), then, "
                  "where a limit lies between them, both under that limit. MB are 10^6 bytes.",
                  "",
                  "| run | limit (MB) | rank | cgroup peak (MB) | page cache at the end (MB) | "
                  "needed (MB) | of it while training (MB) | peak RSS (MB) | ended | steps | "
                  "first loss | last loss | time (s) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | "
                  "---: | ---: |"]
        for r in runs:
            for k in r["ranks"]:
                lines.append(
                    f"| {what[r['mode']]} | {mb(r['limit']) if r['limit'] else 'none'} | "
                    f"{k['rank']} | {mb(k['cgroup_peak'])} | {mb(k['cache_at_end'])} | "
                    f"{mb(k['needed'])} | {mb(k['needed_training'])} | "
                    f"{mb(k.get('peak_rss_bytes'))} | {ended(k)} | "
                    f"{r['steps_done']}/{r['steps']} | {loss(r['first_loss'])} | "
                    f"{loss(r['last_loss'])} | {r['wall_s']:.0f} |")
        lines += [""]
    if d and f:
        lines += ["## The limit", "",
                  f"fully_shard needed {f['needed'] / MB:,.0f} MB on its largest rank, DDP "
                  f"{d['needed'] / MB:,.0f} MB: "
                  + (f"the limit is the midpoint, {cap / MB:,.0f} MB per rank."
                     if cap else "no limit between them." if f["needed"] >= d["needed"]
                     else "too close for a limit between them.")
                  + " DDP is over it if any rank is; fully_shard must stay under it on every "
                  "rank, through the final checkpoint.", ""]
    elif cap:
        lines += ["## The limit", "", f"{cap / MB:,.0f} MB per rank, given with `--cap`.", ""]
    lines += ["## Reading the table", "",
              "- **cgroup peak**: the kernel's high-water mark of all that was charged to the "
              "rank's group (`memory.max_usage_in_bytes` on cgroup v1, `memory.peak` on v2): "
              "anonymous memory (tensors, LibTorch's heap), shared memory (the shm backend's "
              "buffers), and the page cache of the files the rank wrote: rank 0 writes the "
              "checkpoint and `model.pt` at the end.",
              "- **page cache at the end**: what of it was file pages when the rank had ended "
              "(`memory.stat`). The kernel reclaims these under a limit (writing them back "
              "first), so they count toward the peak but not toward what the rank needs.",
              "- **needed**: the peak of anonymous and shared memory, which nothing reclaims "
              "without swap: the larger of `memory.stat`'s rss + shmem sampled every 10 ms and "
              "the cgroup peak less the page cache at the end. The limit is chosen from these. "
              "**Of it while training**: the same up to the last step's record, before the "
              "final checkpoint and `model.pt`.",
              "- **peak RSS**: the process's own high-water mark (`getrusage`, exact). It also "
              "counts the pages of LibTorch's shared libraries that the rank touched, which are "
              "not charged to its group: the driver reads the libraries into the page cache "
              "first, from its own group, so that no run is charged for them.",
              "- **ended**: how the rank's process ended. The OOM killer is named only when "
              "the group's own count says so (`oom_kill` in `memory.oom_control` on v1, "
              "`memory.events` on v2); after one rank fails, ddprun stops the other with "
              "SIGTERM.", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(
        prog="bench/run-fsdp-cap",
        description="Shows a GPT that DDP cannot fit in a per-rank memory limit training "
                    "under fully_shard: each rank in a memory cgroup of its own (needs root "
                    "and a writable memory controller, cgroup v1 or v2), DDP and fully_shard "
                    "measured with no limit, then both run under a limit between their "
                    "needs. Writes a markdown report; docs/fsdp-cap.md explains it. Exit "
                    "status: 0 shown, 1 not shown (a run ended otherwise than expected), 3 no "
                    "limit separates the two, --skip-code (2) no writable memory cgroup.")
    ap.add_argument("--build-dir", default=os.path.join(os.path.dirname(HERE), "build"),
                    help="where bin/ddprun and bin/gpt are (default: build/)")
    ap.add_argument("--ddprun", help="the ddprun to use (default: BUILD_DIR/bin/ddprun)")
    ap.add_argument("--gpt", help="the gpt to use (default: BUILD_DIR/bin/gpt)")
    ap.add_argument("--quick", action="store_true",
                    help="a small model and a small limit: under a minute on 2 cores")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "fsdp-cap.md"),
                    help="the report (default: bench/results/fsdp-cap.md)")
    ap.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    ap.add_argument("--cap", type=float, metavar="MB",
                    help="no measurement: run both under this limit (MB per rank)")
    ap.add_argument("--steps", type=int, help="optimizer steps per run (default: the size's)")
    ap.add_argument("--n-layer", type=int, help="GPT blocks (default: the size's)")
    ap.add_argument("--n-embd", type=int, help="embedding width (default: the size's)")
    ap.add_argument("--n-head", type=int, help="attention heads (default: the size's)")
    ap.add_argument("--block-size", type=int, help="characters per window")
    ap.add_argument("--batch-size", type=int, help="windows per rank and step")
    ap.add_argument("--timeout", type=float, help="seconds per run (default 600, 120 quick)")
    ap.add_argument("--skip-code", type=int, default=2, metavar="N",
                    help="exit status when no writable memory cgroup exists (default 2; "
                         "CTest gives 77, its skip code)")
    ap.add_argument("--keep-runs", action="store_true",
                    help="keep the temporary folder of the runs (checkpoints, metrics, logs)")
    ap.add_argument("--quiet", action="store_true", help="do not echo the programs' output")
    a = ap.parse_args()

    size = dict(SIZES["quick" if a.quick else "default"])
    for k in ("n_layer", "n_embd", "n_head", "block_size", "batch_size"):
        if getattr(a, k) is not None:
            size[k] = getattr(a, k)
    if a.timeout is None:
        a.timeout = 120 if a.quick else 600
    steps = a.steps or size["steps"]
    for prog in ("ddprun", "gpt"):
        path = getattr(a, prog) or os.path.join(a.build_dir, "bin", prog)
        setattr(a, prog, os.path.abspath(path))
        if not os.access(path, os.X_OK):
            print(f"fsdp_cap: {path} is missing; build it (scripts/build gpt ddprun)",
                  file=sys.stderr)
            return 2

    try:
        cg = Cgroups("ddp-fsdp-cap")
    except NoCgroup as e:
        who = "" if os.geteuid() == 0 else f" (this process is not root: uid {os.geteuid()})"
        print("fsdp_cap: no writable cgroup memory controller, so no per-rank memory limit "
              f"can be set{who}; nothing was run. Looked for:", file=sys.stderr)
        for t in e.args[0]:
            print(f"  - {t}", file=sys.stderr)
        print("Run it as root on a machine with the memory controller: cgroup v1 with a "
              "memory hierarchy mounted (/sys/fs/cgroup/memory), or cgroup v2 with memory in "
              "cgroup.controllers and in the subtree_control of this process's group or one "
              "above it (under systemd: systemd-run --scope -p Delegate=yes bench/run-fsdp-cap).",
              file=sys.stderr)
        return a.skip_code

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signum)

    runner = Runner(a, cg)
    runs, cap, outcome = [], None, None
    start = time.monotonic()
    status = 1
    try:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGHUP, on_signal)
        runner.work = tempfile.mkdtemp(prefix="fsdp-cap-")
        print(f"fsdp_cap: cgroup v{cg.version}: one group per rank and run in {cg.parent}/",
              flush=True)
        data = "/usr/share/games/fortunes/songs-poems"
        warmed = prewarm([runner.ddprun, runner.gpt, data, sys.executable])
        print(f"fsdp_cap: read {warmed / MB:,.0f} MB of programs, libraries and data into the "
              "page cache first (charged to this driver, not to the ranks)", flush=True)
        if a.cap:
            cap = int(a.cap * MB) // 4096 * 4096  # the kernel keeps whole pages
        else:
            for mode in ("ddp", "fsdp"):
                runs.append(runner.run(mode, "measure", None, size, steps))
                if verdict(runs[-1]) != "ok":
                    outcome = (f"the {mode} run with no limit failed (exit {runs[-1]['rc']}): "
                               + " / ".join(runs[-1]["log_tail"]))
                    break
            if outcome is None:
                d, f = runs[0]["needed"], runs[1]["needed"]
                if d - f < max(MIN_GAP_FRACTION * f, MIN_GAP_BYTES):
                    outcome = "no-gap"
                else:
                    cap = int((d + f) / 2 // 2**20 * 2**20)
        if cap and outcome is None:
            for mode in ("ddp", "fsdp"):
                runs.append(runner.run(mode, "capped", cap, size, steps))
            dk, fk = runs[-2], runs[-1]
            problems = []
            if verdict(dk) != "oom":
                problems.append(f"DDP was not killed by the OOM killer ({verdict(dk)}: "
                                f"{', '.join(ended(k) for k in dk['ranks'])})")
            if verdict(fk) != "ok":
                problems.append("fully_shard did not finish "
                                f"({', '.join(ended(k) for k in fk['ranks'])})")
            elif fk["steps_done"] != steps or not falling(fk):
                problems.append(f"fully_shard trained {fk['steps_done']}/{steps} steps, loss "
                                f"{loss(fk['first_loss'])} to {loss(fk['last_loss'])}")
            outcome = "shown" if not problems else "; ".join(problems) + "."
        status = 0 if outcome == "shown" else (3 if outcome == "no-gap" else 1)
    except KeyboardInterrupt as e:
        print("fsdp_cap: interrupted; stopping the run and removing the cgroups", file=sys.stderr)
        runner._stop()
        status = 128 + (e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT)
    finally:
        removed = cg.close()
        if runner.work and not a.keep_runs:
            shutil.rmtree(runner.work, ignore_errors=True)
        elif runner.work:
            print(f"fsdp_cap: the runs' folders are in {runner.work}")
    if status > 128:
        return status
    total = time.monotonic() - start
    vocab = runner.vocab
    params = parameter_count(size, vocab) if vocab else None
    if params and runner.printed_params and abs(params / 1e6 - runner.printed_params) > 0.006:
        params = int(runner.printed_params * 1e6)  # the program's count, if ours disagrees
    text = report(a, cg, size, runs, cap, params, vocab, outcome, total)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print()
    print(text)
    print(f"fsdp_cap: report in {a.out}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(outcome=outcome, status=status, cap=cap, params=params, vocab=vocab,
                           size=size, steps=steps, cgroup_version=cg.version,
                           cgroup_parent=cg.parent, cgroups_removed=removed, total_s=total,
                           runs=runs), f, indent=1)
    if not removed:
        status = status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
