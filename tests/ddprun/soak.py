#!/usr/bin/env python3
"""Kill soak: SIGKILL a simulated host at chosen moments of an elastic multi-host job of
examples/fashion_mnist, trial after trial, and check that nothing is lost.

    python3 soak.py --ddprun PATH --example PATH --trials N [--phases a,b,...]
                    [--victim rotate|other|node0] [--report FILE] [--seed S]

Each trial makes fresh hosts (network namespaces on one bridge, netns_testlib.py), runs
the same elastic command on each of them, as tests/ddprun/test_elastic_hosts.py does:

    ddprun --nnodes 2:H --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST0:29400
           --rdzv-id ID --max-restarts 3 --rdzv-conf join_timeout=60,last_call_timeout=2 ...
           -- fashion_mnist --run-dir RUNS --name job --resume --epochs 5 ...

and kills every process of one host (Hosts.kill_all) at a moment the trial's phase aims
at. Trial i runs phase i % len(phases); the victim alternates between a host other than
node 0 and node 0's host (the one serving the rendezvous endpoint) every round of phases:

    rendezvous      before every host joined: node 1 right after it got its node rank
                    (host 2 is started after the kill); or node 0 itself
    allreduce-shm   inside a bucket's all-reduce, default backend (shared memory): the
    allreduce-gloo  worker of host A is SIGSTOPped, so the other ranks block in the next
                    collective; then host B is killed and A continued (SIGCONT). The
                    survivors' flight recorder dumps name the collective in flight.
    checkpoint      while rank 0 writes a checkpoint: inotify sees the temporary file
                    created (IN_CREATE of .ckpt-<step>.pt.tmp.*) and the host is killed
                    at once; node 0's host is the writer, the other variant kills a rank
                    that only waits for the writer
    restart         4 hosts, --nnodes 2:4: one host is killed in training, a second one
                    while the survivors restart ("restarting all workers", or once the
                    next attempt's workers run)

Checks of each trial (one failed check fails the trial): the job ends within 60 s of the
last kill, either finished (every surviving ddprun exits 0, metrics.jsonl has every
epoch, the last at the smaller world size) or stopped cleanly (every surviving ddprun
exits non-zero and printed its cause); no process is left in any host or with the
trial's marker; nothing new in /dev/shm; every checkpoint and what `latest` names is a
complete torch.save archive, and temporary files remain only after a stop;
metrics.jsonl has one record per epoch, in order, up to the latest checkpoint's epoch
(or one more: the example writes an epoch's record before its checkpoint). Losing node
0 once the job runs, with two of its three hosts left (a majority), must let them go on
under a new coordinator; in the rendezvous it must stop them, and in the restart phase
(two of four hosts lost close together) either is accepted, and reported.

Exit code 0 when every trial passed, 1 otherwise, 77 (skipped) without root, iproute2,
network namespaces or the Fashion-MNIST files. SIGTERM and SIGINT stop the soak with
every host torn down. Standard library only. docs/soak.md has the details.
"""
import argparse
import collections
import ctypes
import ctypes.util
import json
import os
import pickle
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ddprun_testlib as T  # noqa: E402
import netns_testlib as N  # noqa: E402

SKIP = 77
DATA_DIR = "/usr/share/datasets/fashion-mnist"
PHASES = ["rendezvous", "allreduce-shm", "allreduce-gloo", "checkpoint", "restart"]
# Victim of each round of phases (round = trial // len(phases), alternating). The
# checkpoint phase kills the writer (rank 0, on node 0's host) first.
VARIANTS = {"rendezvous": ("other", "node0"), "allreduce-shm": ("other", "node0"),
            "allreduce-gloo": ("other", "node0"), "checkpoint": ("node0", "other"),
            "restart": ("other", "node0")}
RDZV_PORT = 29400
MASTER_PORT = 29500
MAX_RESTARTS = 3
LAST_CALL = 2          # s: --rdzv-conf last_call_timeout
END_LIMIT = 60.0       # s: the job must end this soon after the last kill
WAIT_LIMIT = 90.0      # s: the most any step before a kill may take
COLLECTIVE_TIMEOUT = 30  # s: fashion_mnist --timeout (a rank waiting for a lost one)
CAUSE = re.compile(r"^ddprun: (error: .*|.*\bnode \d+\b.*\b(failed|lost)\b.*|"
                   r".*\b(failed|lost)\b.*\bnode \d+\b.*)$", re.M)
TMP_NAME = re.compile(r"^\.(ckpt-(\d+)\.pt)\.tmp\.")


class Interrupted(Exception):
    """SIGTERM or SIGINT: stop the soak (the trial's hosts are torn down)."""

    def __init__(self, sig):
        super().__init__("stopped by signal %d" % sig)
        self.sig = sig


class Hang(Exception):
    """A step of the trial did not happen in time."""


read = T.read_text


def tail(path, lines=15):
    return "\n".join(read(path).splitlines()[-lines:])


def node_rank(stderr):
    """The node rank a ddprun's stderr announced, or None so far."""
    if "ddprun: node 0 waiting for" in stderr:
        return 0
    m = re.search(r"ddprun: this host is node (\d+) of", stderr)
    return int(m.group(1)) if m else None


def proc_environ(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return dict(v.decode(errors="replace").split("=", 1)
                        for v in f.read().split(b"\0") if b"=" in v)
    except OSError:
        return {}


def proc_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def cpu_ticks(pid):
    """utime + stime of a process (clock ticks), or None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def wchans(pid):
    """{wchan: count} over a process's threads ('' reads as 'running')."""
    out = collections.Counter()
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        w = read("/proc/%d/task/%s/wchan" % (pid, tid)).strip()
        out[w if w and w != "0" else "running"] += 1
    return out


COLLECTIVE_FRAME = re.compile(r"(\w+::(?:all_reduce\w*|allreduce\w*|broadcast\w*|all_gather\w*|"
                              r"allgather\w*|barrier\w*|reduce_scatter\w*|wait_for_buckets))\b")
FUNCTION = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(?:[\w:<>, ()]*?::)?(\w+::~?\w+) ?\(")


def stack_evidence(pid, libtorch=False, timeout=30):
    """What the threads of process `pid` wait in, from gdb's backtraces: for each thread
    whose stack names a collective (or DDP's wait for its buckets), its outermost such
    frame and the innermost named frame, e.g. "ShmComm::all_reduce_in_place ->
    Transport::wait_one(peer 0)". Only the executable's symbols are read (a second or
    two), and libtorch_cpu's with `libtorch` (Gloo's frames; a few seconds more). None
    without gdb."""
    gdb = shutil.which("gdb")
    if not gdb:
        return None
    cmd = [gdb, "-p", str(pid), "-batch", "-nx", "-iex", "set auto-solib-add off"]
    if libtorch:
        cmd += ["-ex", "sharedlibrary libtorch_cpu"]
    try:
        r = subprocess.run(cmd + ["-ex", "thread apply all bt 40"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = []
    for block in re.split(r"\n(?=Thread \d+ )", r.stdout):
        frames = [l for l in block.splitlines() if l.startswith("#")]
        hits = [i for i, f in enumerate(frames) if COLLECTIVE_FRAME.search(f)]
        if not hits:
            continue
        outer = COLLECTIVE_FRAME.search(frames[hits[-1]]).group(1)
        inner = ""
        for f in frames:
            m = FUNCTION.match(f)
            if m and not m.group(1).startswith(("std::", "__")):
                inner = m.group(1)
                peer = re.search(r"\bpeer=(?:peer@entry=)?(\d+)", f)
                if peer:
                    inner += "(peer %s)" % peer.group(1)
                break
        found.append(outer + (" -> " + inner if inner and inner != outer else ""))
    return found


# ---- torch.save archives without torch ----

class _Any:
    """Stands for every class a checkpoint's pickle names (tensors, OrderedDict aside)."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass


class _Pickle(pickle.Unpickler):
    def __init__(self, f):
        super().__init__(f)
        self.records = []

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        return _Any

    def persistent_load(self, pid):
        self.records.append(str(pid[2]))  # ("storage", type, key, location, numel)
        return _Any()


def read_archive(path):
    """The top-level object of a torch.save zip archive after checking that it is whole:
    a zip whose every record matches its CRC, a data.pkl that unpickles to the end, and
    every tensor record it names present. Raises ValueError saying what is wrong."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                raise ValueError("record %s fails its CRC" % bad)
            names = z.namelist()
            prefix = names[0].split("/", 1)[0] + "/"
            if prefix + "data.pkl" not in names:
                raise ValueError("no data.pkl")
            with z.open(prefix + "data.pkl") as f:
                up = _Pickle(f)
                obj = up.load()
            missing = [r for r in up.records if prefix + "data/" + r not in names]
            if missing:
                raise ValueError("tensor records %s are missing" % ", ".join(missing[:5]))
            return obj
    except (zipfile.BadZipFile, OSError, EOFError, pickle.UnpicklingError, IndexError,
            KeyError, AttributeError, TypeError) as e:
        raise ValueError("%s: %s" % (type(e).__name__, e)) from None


# ---- inotify through ctypes ----

class Inotify:
    IN_CREATE = 0x100

    def __init__(self, path):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, "inotify_init1: " + os.strerror(e))
        if libc.inotify_add_watch(self.fd, os.fsencode(path), self.IN_CREATE) < 0:
            e = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(e, "inotify_add_watch %s: %s" % (path, os.strerror(e)))

    def names(self, timeout):
        """Names created in the folder, waiting up to `timeout` s for the first."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return []
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        out, off = [], 0
        while off + 16 <= len(data):
            _, _, _, length = struct.unpack_from("iIII", data, off)
            out.append(data[off + 16:off + 16 + length].split(b"\0", 1)[0].decode(errors="replace"))
            off += 16 + length
        return out

    def close(self):
        os.close(self.fd)


def shm_names():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


class Trial:
    def __init__(self, opts, index, phase, variant, work):
        self.o = opts
        self.index, self.phase, self.variant = index, phase, variant
        self.rng = random.Random("%s/%d" % (opts.seed, index))
        self.backend = "gloo" if phase == "allreduce-gloo" else "default (shm)"
        self.nhosts = 4 if phase == "restart" else 3
        self.dir = os.path.join(work, "trial-%03d-%s-%s" % (index, phase, variant))
        self.runs = os.path.join(self.dir, "runs")
        self.run_dir = os.path.join(self.runs, "job")
        self.ckpt_dir = os.path.join(self.run_dir, "checkpoints")
        self.marker = uuid.uuid4().hex
        self.run_id = "soak-%d-%d" % (os.getpid(), index)
        self.hosts = N.Hosts(self.nhosts, tag="soak%d" % index)
        self.procs = {}          # host -> Popen of its ddprun
        self.killed = []         # hosts killed, in order
        self.kill_t = []         # monotonic time of each kill
        self.kill_us = []        # wall-clock microseconds of each kill
        self.nodes = {}          # host -> node rank in attempt 0
        self.aim = []            # where the kills were aimed / landed
        self.failures = []       # failed checks
        self.notes = []
        self.details = []        # stderr tails and such, for the report
        self.flight = {}         # pid -> flight recorder dump (first one seen)
        self._flight_seen = set()
        self.inflight = ""
        self.stack = None        # the victim's collective frames (allreduce phases, gdb)
        self.outcome = "?"
        self.kill_to_end = None
        self.seconds = None
        self.ours = set()        # pids seen carrying the marker
        self.example_real = os.path.realpath(opts.example)

    # ---- hosts and processes ----

    def err(self, h):
        return os.path.join(self.dir, "host%d.err" % h)

    def out(self, h):
        return os.path.join(self.dir, "host%d.out" % h)

    def start(self, h):
        logs = os.path.join(self.dir, "logs", "host%d" % h)
        flight = os.path.join(self.dir, "flight", "host%d" % h)
        tmp = os.path.join(self.dir, "tmp", "host%d" % h)
        for d in (logs, flight, tmp):
            os.makedirs(d, exist_ok=True)
        cmd = [self.o.ddprun, "--nnodes", "2:%d" % self.nhosts, "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", "%s:%d" % (self.hosts.addrs[0], RDZV_PORT),
               "--rdzv-id", self.run_id, "--max-restarts", str(MAX_RESTARTS),
               "--rdzv-conf", "join_timeout=60,last_call_timeout=%d" % LAST_CALL,
               "--grace-period", "3", "--master-port", str(MASTER_PORT), "--log-dir", logs,
               "--", self.o.example, "--run-dir", self.runs, "--name", "job", "--resume",
               "--epochs", str(self.o.epochs), "--train-samples", str(self.o.train_samples),
               "--test-samples", "300", "--batch-size", "32", "--seed", "7", "--threads", "1",
               "--progress", "none", "--timeout", str(COLLECTIVE_TIMEOUT)]
        if self.phase == "allreduce-gloo":
            cmd += ["--backend", "gloo"]
        env = T.base_env(**{T.MARKER_VAR: self.marker, "OMP_NUM_THREADS": 1,
                            "DDP_FLIGHT_RECORDER_DIR": flight, "TMPDIR": tmp})
        with open(self.out(h), "w") as fo, open(self.err(h), "w") as fe:
            self.procs[h] = subprocess.Popen(self.hosts.command(h, cmd), env=env, stdout=fo,
                                             stderr=fe, stdin=subprocess.DEVNULL,
                                             start_new_session=True)

    def workers(self, h):
        """[(pid, TORCHELASTIC_RESTART_COUNT)] of the fashion_mnist workers on host h."""
        found = []
        for pid in self.hosts.pids(h):
            try:
                exe = os.readlink("/proc/%d/exe" % pid)
            except OSError:
                continue
            if exe.replace(" (deleted)", "") != self.example_real:
                continue
            env = proc_environ(pid)
            if env.get(T.MARKER_VAR) == self.marker:
                self.ours.add(pid)
                found.append((pid, int(env.get("TORCHELASTIC_RESTART_COUNT", "-1") or -1)))
        return found

    def alive(self, h):
        p = self.procs.get(h)
        return p is not None and p.poll() is None

    def survivors(self):
        return [h for h in self.procs if h not in self.killed]

    def wait(self, predicate, what, timeout=WAIT_LIMIT):
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return
            if self.kill_t:
                self.collect_flight()
            if time.monotonic() > deadline:
                raise Hang("%s within %d s" % (what, timeout))
            time.sleep(0.05)

    def wait_node_rank(self, h):
        self.wait(lambda: node_rank(read(self.err(h))) is not None or not self.alive(h),
                  "host %d did not get a node rank" % h)
        n = node_rank(read(self.err(h)))
        if n is None:
            raise Hang("host %d's ddprun exited (code %s) before it got a node rank"
                       % (h, self.procs[h].returncode))
        self.nodes[h] = n
        return n

    def host_of_node(self, n):
        return [h for h, m in self.nodes.items() if m == n][0]

    def wait_training(self):
        """Until rank 0 said it starts or resumes (after its checkpoint barrier)."""
        started = re.compile(r"\[rank 0\]: (no checkpoint in|resuming from)")
        self.wait(lambda: any(started.search(read(self.out(h))) for h in self.procs),
                  "training did not start")

    def kill(self, h, first=()):
        """SIGKILLs `first` (pids gathered beforehand: no time lost looking them up),
        then every process of host h."""
        self.kill_us.append(int(time.time() * 1e6))
        self.kill_t.append(time.monotonic())
        for pid in first:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.signalled_t = time.monotonic()
        ok = self.hosts.kill_all(h)
        self.killed.append(h)
        try:
            self.procs[h].wait(timeout=10)
        except subprocess.TimeoutExpired:
            ok = False
        if not ok:
            self.fail("host %d: processes outlived SIGKILL for 10 s: %s"
                      % (h, [(p, proc_cmdline(p)) for p in self.hosts.pids(h)]))

    def who(self, h):
        n = self.nodes.get(h)
        return "host%d/node%s" % (h, "?" if n is None else n)

    def fail(self, why):
        self.failures.append(why)

    # ---- flight recorder ----

    def collect_flight(self):
        """Reads each new dump once (a later attempt's rank of the same number overwrites
        the file, so they are read while the trial runs)."""
        for h in range(self.nhosts):
            d = os.path.join(self.dir, "flight", "host%d" % h)
            try:
                names = os.listdir(d)
            except OSError:
                continue
            for name in names:
                if not name.endswith(".json"):
                    continue
                path = os.path.join(d, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                key = (path, st.st_ino, st.st_mtime_ns)
                if key in self._flight_seen:
                    continue
                try:
                    with open(path) as f:
                        doc = json.load(f)
                except (OSError, ValueError):
                    continue
                self._flight_seen.add(key)
                doc["host"] = h
                self.flight.setdefault(doc.get("pid"), doc)

    def in_flight(self, kill_us):
        """The collectives that dumps of ranks of the attempt the kill hit show started
        before the kill and not completed (the one with the highest seq per rank)."""
        seen = collections.defaultdict(list)
        for doc in self.flight.values():
            if doc.get("dumped_us", 0) < kill_us:
                continue
            open_ones = [e for e in doc.get("entries", [])
                         if e.get("start_us", 0) <= kill_us and e.get("state") != "completed"]
            if not open_ones:
                continue
            e = max(open_ones, key=lambda e: e["seq"])
            ago = (kill_us - e["start_us"]) / 1000.0
            seen["%s #%d" % (e["what"], e["seq"])].append(
                "rank %s on host %d: %s, entered %.0f ms before the kill"
                % (doc.get("rank"), doc["host"], e.get("state"), ago))
        return seen

    # ---- phases: each ends with its last kill done ----

    def phase_rendezvous(self):
        self.start(0)
        self.wait_node_rank(0)
        self.start(1)
        t0 = time.monotonic()
        self.wait_node_rank(1)
        started = "starting attempt" in read(self.err(0)) or "starting the workers" in read(self.err(0))
        last_call = "starting in" in read(self.err(0))
        victim = 0 if self.variant == "node0" else 1
        self.kill(victim)
        self.aim.append("%s killed %.2f s after host1 got its node rank, %s%s" % (
            self.who(victim), self.kill_t[-1] - t0,
            "during the last call" if last_call else "before the last call",
            "; AFTER the start (missed)" if started else "; before the job started"))
        if started:
            self.fail("the kill was meant to land before the start, but node 0 had started")
        if victim == 1:
            self.start(2)  # the job must start on hosts 0 and 2 and finish

    def start_all_and_train(self, lo, hi):
        """Starts every host, waits for training, then a random lo..hi seconds more."""
        for h in range(self.nhosts):
            self.start(h)
        for h in range(self.nhosts):
            self.wait_node_rank(h)
        self.wait_training()
        time.sleep(self.rng.uniform(lo, hi))

    def phase_allreduce(self):
        self.start_all_and_train(0.3, 2.5)
        node0 = self.host_of_node(0)
        b = node0 if self.variant == "node0" else self.rng.choice(
            [h for h in range(self.nhosts) if h != node0])
        a = self.rng.choice([h for h in range(self.nhosts) if h != b])
        c = [h for h in range(self.nhosts) if h not in (a, b)][0]
        wa, wb, wc = (self.workers(h) for h in (a, b, c))
        if not (wa and wb and wc):
            raise Hang("a host had no worker when the kill was to be aimed "
                       "(hosts %d, %d, %d: %s, %s, %s)" % (a, b, c, wa, wb, wc))
        pa, pb, pc = wa[0][0], wb[0][0], wc[0][0]
        os.kill(pa, signal.SIGSTOP)
        try:
            tb, tc = cpu_ticks(pb), cpu_ticks(pc)
            time.sleep(0.8)
            tb2, tc2 = cpu_ticks(pb), cpu_ticks(pc)
            wait_b = wchans(pb)
            stack = stack_evidence(pb, libtorch=self.phase == "allreduce-gloo")
            self.kill(b, first=[pb])
        finally:
            try:
                os.kill(pa, signal.SIGCONT)
            except OSError:
                pass
        idle = "cpu in 0.8 s: victim +%s ticks, host%d +%s ticks" % (
            None if None in (tb, tb2) else tb2 - tb, c, None if None in (tc, tc2) else tc2 - tc)
        self.aim.append("%s's worker SIGSTOPped; %s killed 0.8 s later (%s; victim's threads "
                        "wait in %s); SIGCONT to host%d" % (
                            self.who(a), self.who(b), idle,
                            ", ".join("%s x%d" % kv for kv in sorted(wait_b.items())), a))
        if stack is not None:
            self.aim.append("victim's stack at the kill: %s" % ("; ".join(stack) or "no collective"))
            self.stack = stack

    def phase_checkpoint(self):
        os.makedirs(self.ckpt_dir, exist_ok=True)
        watch = Inotify(self.ckpt_dir)
        try:
            for h in range(self.nhosts):
                self.start(h)
            for h in range(self.nhosts):
                self.wait_node_rank(h)
            node0 = self.host_of_node(0)
            victim = node0 if self.variant == "node0" else self.rng.choice(
                [h for h in range(self.nhosts) if h != node0])
            target = self.rng.choice([1, 2])  # the target-th checkpoint written
            count, pids, refreshed = 0, [], 0.0
            deadline = time.monotonic() + WAIT_LIMIT
            while True:
                if time.monotonic() - refreshed > 0.2:
                    ws = [p for p, _ in self.workers(victim)]
                    pids = ws + [p for p in self.hosts.pids(victim) if p not in ws]
                    refreshed = time.monotonic()
                if time.monotonic() > deadline:
                    raise Hang("checkpoint %d's temporary file did not appear within %d s"
                               % (target, WAIT_LIMIT))
                if not all(self.alive(h) for h in self.procs):
                    raise Hang("a ddprun exited before checkpoint %d was written: %s" % (
                        target, {h: p.returncode for h, p in self.procs.items()}))
                hit = None
                for name in watch.names(0.1):
                    m = TMP_NAME.match(name)
                    if m:
                        count += 1
                        if count == target:
                            hit = (name, m.group(1))
                            break
                if hit:
                    t_seen = time.monotonic()
                    self.kill(victim, first=pids)
                    tmp = os.path.exists(os.path.join(self.ckpt_dir, hit[0]))
                    final = os.path.exists(os.path.join(self.ckpt_dir, hit[1]))
                    where = ("BEFORE the rename (temporary there, %s not)" % hit[1] if tmp and not final
                             else "after the rename (%s there)" % hit[1] if final
                             else "temporary already gone, %s not there" % hit[1])
                    self.aim.append("checkpoint %d (%s): %s killed %.1f ms after IN_CREATE; %s" % (
                        target, hit[0], self.who(victim), (self.signalled_t - t_seen) * 1000, where))
                    return
        finally:
            watch.close()

    def phase_restart(self):
        self.start_all_and_train(0.3, 1.5)
        node0 = self.host_of_node(0)
        first = self.rng.choice([h for h in range(self.nhosts) if h != node0])
        moment = self.rng.choice(["stopping", "starting"])
        left = [h for h in range(self.nhosts) if h != first]
        second = node0 if self.variant == "node0" else self.rng.choice(
            [h for h in left if h != node0])
        # Every process of both hosts, gathered beforehand, so that each kill is one
        # kill(2) per process (ddprun and its worker) and nothing is lost looking them up.
        old = [p for p, _ in self.workers(second)]
        pids_first = self.hosts.pids(first)
        pids_second = old + [p for p in self.hosts.pids(second) if p not in old]
        self.kill(first, first=pids_first)
        self.aim.append("%s killed in training" % self.who(first))
        said = lambda: any("restarting all workers" in read(self.err(h)) for h in left)  # noqa: E731
        deadline = time.monotonic() + WAIT_LIMIT
        while not said():
            if not any(self.alive(h) for h in left):
                self.aim.append("no restart: the survivors stopped; no second kill")
                return
            if time.monotonic() > deadline:
                raise Hang("the survivors neither restarted nor stopped within %d s" % WAIT_LIMIT)
            time.sleep(0.002)
        t_said = time.monotonic()
        if moment == "stopping":
            still = [p for p in old if T.pid_alive(p)]
            self.kill(second, first=pids_second)
            self.aim.append("%s killed %.1f ms after 'restarting all workers' appeared (%.2f s "
                            "after the first kill); its attempt-0 worker %s" % (
                                self.who(second), (self.signalled_t - t_said) * 1000,
                                self.kill_t[-1] - self.kill_t[-2],
                                "was still there (stopping)" if still else "had already exited"))
            return
        news = []

        def next_attempt():
            news[:] = [(h, p, r) for h in left for p, r in self.workers(h) if r >= 1]
            return news or not any(self.alive(h) for h in left)
        self.wait(next_attempt, "no worker of the next attempt appeared")
        self.kill(second)
        self.aim.append("%s killed once the next attempt's workers ran (%s; %.2f s after "
                        "'restarting all workers')" % (
                            self.who(second), ", ".join("host%d: pid %d at restart %d" % n for n in news)
                            or "none: the survivors ended", self.kill_t[-1] - t_said))

    # ---- the trial ----

    def run(self):
        t0 = time.monotonic()
        os.makedirs(self.dir)
        shm_before = shm_names()
        why = self.hosts.setup()
        if why:
            self.fail("hosts: " + why)
            self.outcome = "no hosts"
            return
        try:
            try:
                {"rendezvous": self.phase_rendezvous, "allreduce-shm": self.phase_allreduce,
                 "allreduce-gloo": self.phase_allreduce, "checkpoint": self.phase_checkpoint,
                 "restart": self.phase_restart}[self.phase]()
                self.finish()
            except Hang as e:
                self.fail("hang: %s" % e)
                self.outcome = "hang"
                self.dump_tails()
                self.kill_everything()
            except Interrupted:
                raise
            except Exception as e:  # a bug of the soak itself: fail the trial, go on
                import traceback
                self.fail("soak error: %s: %s" % (type(e).__name__, e))
                self.outcome = "soak error"
                self.details.append(traceback.format_exc())
                self.kill_everything()
            self.check_processes()
        finally:
            self.kill_everything()
            T.kill_marked(self.marker)
            self.hosts.teardown()
        left = set(N.ip("netns", "list", check=False).stdout.split())
        stale = [n for n in self.hosts.names + [self.hosts.bridge_ns] if n in left]
        if stale:
            self.fail("namespaces left after teardown: %s" % stale)
        self.check_shm(shm_before)
        for h in range(self.nhosts):  # ddprun's TMPDIR: a killed ddprun may leave its folders
            d = os.path.join(self.dir, "tmp", "host%d" % h)
            left = sorted(os.listdir(d)) if os.path.isdir(d) else []
            if left:
                self.notes.append("left in host %d's TMPDIR: %s" % (h, ", ".join(left)))
        self.seconds = time.monotonic() - t0

    def kill_everything(self):
        for h in self.procs:
            if h not in self.killed:
                self.hosts.kill_all(h)
                try:
                    self.procs[h].wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass

    def dump_tails(self):
        for h in sorted(self.procs):
            self.details.append("host %d (%s) stderr, last lines:\n%s" % (h, self.who(h), tail(self.err(h))))

    def finish(self):
        """Waits for the surviving ddprun processes, then decides the outcome."""
        survivors = self.survivors()
        deadline = self.kill_t[-1] + self.o.end_limit
        while any(self.alive(h) for h in survivors):
            self.collect_flight()
            for h in survivors:
                self.workers(h)
            if time.monotonic() > deadline:
                hung = [h for h in survivors if self.alive(h)]
                self.fail("hang: %s still running %g s after the last kill"
                          % (", ".join(self.who(h) for h in hung), self.o.end_limit))
                self.outcome = "hang"
                self.dump_tails()
                for h in hung:
                    self.hosts.kill_all(h)
                return
            time.sleep(0.1)
        self.kill_to_end = time.monotonic() - self.kill_t[-1]
        time.sleep(0.2)
        self.collect_flight()
        for i, us in enumerate(self.kill_us):
            seen = self.in_flight(us)
            if seen:
                self.inflight += ("; " if self.inflight else "") + ", ".join(
                    "%s (%s)" % (what, "; ".join(who)) for what, who in seen.items())
        if self.stack:
            colls = [f for f in self.stack if "wait_for_buckets" not in f]
            self.inflight = "%s (victim's stack%s)%s" % (
                ", ".join(colls) or "no collective frame", "; main thread in DDP's wait for its buckets"
                if any("wait_for_buckets" in f for f in self.stack) else "",
                "; " + self.inflight if self.inflight else "")
        rcs = {h: self.procs[h].returncode for h in survivors}
        node0_lost = any(self.nodes.get(h) == 0 for h in self.killed)
        if all(rc == 0 for rc in rcs.values()):
            self.outcome = "finished at world size %d" % len(survivors)
            if node0_lost:
                self.outcome += " (node 0 lost: the survivors went on)"
            finished = True
        elif all(rc != 0 for rc in rcs.values()):
            finished = False
            causes = {}
            for h in survivors:
                m = CAUSE.findall(read(self.err(h)))
                lines = [l for l in read(self.err(h)).splitlines() if CAUSE.match(l)]
                if not m:
                    self.fail("%s exited %d without saying why (no 'ddprun: error:' line and no "
                              "'failed'/'lost' naming a node)" % (self.who(h), rcs[h]))
                elif node0_lost and not any(re.search(r"\bnode 0\b", l) for l in lines):
                    self.fail("%s stopped after node 0 was lost, but its cause does not name "
                              "node 0: %s" % (self.who(h), lines[0]))
                if lines:
                    causes[h] = lines[-1] if not node0_lost else next(
                        (l for l in lines if re.search(r"\bnode 0\b", l)), lines[-1])
            self.outcome = "stopped (exit %s)" % ",".join(str(rcs[h]) for h in survivors)
            if node0_lost:
                self.outcome += " (node 0 lost)"
            for h, line in causes.items():
                self.notes.append("%s: %s" % (self.who(h), line[:200]))
        else:
            finished = None
            self.outcome = "mixed exits %s" % rcs
            self.fail("some survivors exited 0 and others not: %s" % rcs)
            self.dump_tails()
        # The victim was not node 0 and enough hosts are left: the job must go on
        # (tools/ddprun/README.md, Hosts that come and go).
        if finished is False and not node0_lost and len(survivors) >= 2:
            self.fail("the job stopped although %d hosts (>= MIN 2) were left and node 0 "
                      "was not lost" % len(survivors))
            self.dump_tails()
        # Node 0 lost once the job ran, with 2 of the 3 hosts left: a majority of the last
        # attempt's hosts, which must go on under a new coordinator (tools/ddprun/README.md,
        # When node 0 is lost). Before the job started, nobody can take over.
        if node0_lost and self.phase in ("allreduce-shm", "allreduce-gloo", "checkpoint") \
                and finished is False:
            self.fail("node 0 was lost with %d of 3 hosts left, a majority, but the job stopped"
                      % len(survivors))
            self.dump_tails()
        if node0_lost and self.phase == "rendezvous" and finished:
            self.fail("node 0 was lost before the job started, yet the job finished")
        self.check_files(finished, len(survivors))

    def check_processes(self):
        ok = T.wait_for(lambda: not any(self.hosts.pids(h) for h in range(self.nhosts))
                        and not T.pids_with_marker(self.marker), 5.0, step=0.1)
        if not ok:
            left = {h: [(p, proc_cmdline(p)) for p in self.hosts.pids(h)] for h in range(self.nhosts)}
            left = {h: v for h, v in left.items() if v}
            marked = [(p, proc_cmdline(p)) for p in T.pids_with_marker(self.marker)]
            self.fail("processes left behind: in hosts %s; with the marker %s" % (left, marked))
        for h in range(self.nhosts):
            self.ours.update(self.hosts.pids(h))

    def check_shm(self, before):
        for name in sorted(shm_names() - before):
            m = re.match(r"ddp-\d+-(\d+)-", name)
            if m:
                pid = int(m.group(1))
                if T.pid_alive(pid) and pid not in self.ours and \
                        proc_environ(pid).get(T.MARKER_VAR) != self.marker:
                    self.notes.append("/dev/shm/%s is another job's (pid %d runs)" % (name, pid))
                else:
                    self.fail("/dev/shm/%s was left behind (the library's segment of pid %d)" % (name, pid))
            else:
                self.notes.append("new in /dev/shm (not the library's name): %s" % name)

    def check_files(self, finished, world):
        """Checkpoints whole, temporaries only after a stop, metrics one per epoch."""
        epochs_of = {}
        try:
            names = sorted(os.listdir(self.ckpt_dir))
        except OSError:
            names = []
        for name in names:
            m = re.match(r"^ckpt-(\d+)\.pt$", name)
            if not m:
                continue
            try:
                obj = read_archive(os.path.join(self.ckpt_dir, name))
                epochs_of[name] = int(obj["epoch"]) if isinstance(obj, dict) else None
            except (ValueError, KeyError, TypeError) as e:
                self.fail("torn checkpoint %s: %s" % (name, e))
        latest_path = os.path.join(self.ckpt_dir, "latest")
        latest_epoch = 0
        if os.path.exists(latest_path):
            target = read(latest_path).strip()
            if target not in epochs_of:
                self.fail("'latest' names %r, which is not a complete checkpoint (have %s)"
                          % (target, sorted(epochs_of)))
            else:
                latest_epoch = epochs_of[target] or 0
        elif epochs_of:
            latest_epoch = max(e or 0 for e in epochs_of.values())
        temps = []
        for root, _, files in os.walk(self.run_dir):
            temps += [os.path.relpath(os.path.join(root, f), self.run_dir) for f in files if ".tmp" in f]
        if temps and finished:
            self.fail("temporary files left although the job finished: %s" % temps)
        elif temps:
            self.notes.append("temporaries left by the stop: %s" % ", ".join(temps))
        try:
            text = read(os.path.join(self.run_dir, "metrics.jsonl"))
            records = [json.loads(l) for l in text.splitlines() if l.strip()]
        except ValueError as e:
            self.fail("metrics.jsonl has a torn line: %s" % e)
            return
        epochs = [r.get("epoch") for r in records]
        if epochs != list(range(1, len(epochs) + 1)):
            self.fail("metrics.jsonl epochs %s: expected 1..%d, once each, in order" % (epochs, len(epochs)))
        if finished:
            if epochs != list(range(1, self.o.epochs + 1)):
                self.fail("finished, but metrics.jsonl has epochs %s of %d" % (epochs, self.o.epochs))
            if latest_epoch != self.o.epochs:
                self.fail("finished, but the latest checkpoint is epoch %d of %d" % (latest_epoch, self.o.epochs))
            if records and records[-1].get("world_size") != world:
                self.fail("finished on %d hosts, but the last epoch ran at world size %s"
                          % (world, records[-1].get("world_size")))
            try:
                read_archive(os.path.join(self.run_dir, "model.pt"))
            except ValueError as e:
                self.fail("model.pt: %s" % e)
            self.notes.append("world sizes per epoch: %s" % [r.get("world_size") for r in records])
        elif finished is False:
            if len(epochs) not in (latest_epoch, latest_epoch + 1):
                self.fail("stopped with the latest checkpoint at epoch %d, but metrics.jsonl has "
                          "%d record(s) (expected %d, or %d when the kill came between an "
                          "epoch's record and its checkpoint)" % (
                              latest_epoch, len(epochs), latest_epoch, latest_epoch + 1))
            self.notes.append("stopped with %d record(s), latest checkpoint epoch %d"
                              % (len(epochs), latest_epoch))

    # ---- output ----

    def victims(self):
        return ", then ".join(self.who(h) for h in self.killed) or "-"

    def line(self):
        text = "trial %d %s, victim %s (%s), backend %s: %s, %s after the kill (trial %.1f s) -- %s" % (
            self.index, self.phase, self.victims(), self.variant, self.backend, self.outcome,
            "-" if self.kill_to_end is None else "%.1f s" % self.kill_to_end, self.seconds or 0,
            "PASS" if not self.failures else "FAIL: " + "; ".join(self.failures))
        for a in self.aim:
            text += "\n    aim: " + a
        if self.inflight:
            text += "\n    in flight: " + self.inflight
        for d in self.details:
            text += "\n    " + d.replace("\n", "\n      ")
        return text


def md(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_report(path, trials, opts, done):
    rows = ["# Kill soak", "",
            "ddprun `%s`, example `%s`, seed `%s`, %d trial(s)%s." % (
                opts.ddprun, opts.example, opts.seed, len(trials), "" if done else " (so far)"), "",
            "| trial | phase | victim host/node | backend | outcome | s from kill to end | "
            "in-flight collective | aim | trial s | checks |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for t in trials:
        rows.append("| %d | %s | %s (%s) | %s | %s | %s | %s | %s | %.1f | %s |" % (
            t.index, t.phase, t.victims(), t.variant, t.backend, md(t.outcome),
            "-" if t.kill_to_end is None else "%.1f" % t.kill_to_end, md(t.inflight or "-"),
            md("; ".join(t.aim) or "-"), t.seconds or 0,
            "pass" if not t.failures else md("FAIL: " + "; ".join(t.failures))))
    rows += ["", "## Per phase", "", "| phase | trials | finished | stopped cleanly | failed checks |",
             "|---|---|---|---|---|"]
    for phase, s in summary(trials).items():
        rows.append("| %s | %d | %d | %d | %d |" % (phase, s["trials"], s["finished"], s["stopped"], s["failed"]))
    notes = [t for t in trials if t.notes or t.details]
    if notes:
        rows += ["", "## Notes and logs", ""]
        for t in notes:
            rows.append("### Trial %d (%s, %s)" % (t.index, t.phase, t.variant))
            rows.append("")
            rows += ["- %s" % n for n in t.notes]
            for d in t.details:
                rows += ["", "```", d, "```"]
            rows.append("")
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")


def summary(trials):
    out = collections.OrderedDict()
    for t in trials:
        s = out.setdefault(t.phase, {"trials": 0, "finished": 0, "stopped": 0, "failed": 0})
        s["trials"] += 1
        s["finished"] += t.outcome.startswith("finished")
        s["stopped"] += t.outcome.startswith("stopped") and not t.failures
        s["failed"] += bool(t.failures)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ddprun", required=True, help="the ddprun binary")
    ap.add_argument("--example", required=True, help="the fashion_mnist binary")
    ap.add_argument("--trials", type=int, default=len(PHASES), help="number of trials (default: one per phase)")
    ap.add_argument("--phases", default=",".join(PHASES), help="comma-separated, of: " + ",".join(PHASES))
    ap.add_argument("--victim", choices=("rotate", "other", "node0"), default="rotate",
                    help="rotate (default): a host other than node 0 in even rounds of phases, "
                         "node 0's host in odd ones (the checkpoint phase the other way round)")
    ap.add_argument("--report", help="write a Markdown report here")
    ap.add_argument("--seed", default="1", help="seeds the moments and victims")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--train-samples", type=int, default=4096)
    ap.add_argument("--end-limit", type=float, default=END_LIMIT,
                    help="seconds the job may take to end after the last kill (default %(default)s)")
    ap.add_argument("--work-dir", help="trial folders go here (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the folders of passed trials too")
    opts = ap.parse_args()
    phases = [p for p in opts.phases.split(",") if p]
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases or opts.trials < 1:
        ap.error("--phases: unknown %s; expected some of %s" % (bad, ",".join(PHASES)) if bad or not phases
                 else "--trials must be >= 1")
    for name in ("ddprun", "example"):
        path = os.path.abspath(getattr(opts, name))
        if not os.access(path, os.X_OK):
            ap.error("--%s %s is not an executable file" % (name, path))
        setattr(opts, name, path)
    if not os.path.exists(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz")):
        print("SKIPPED: no Fashion-MNIST in %s (apt-get install dataset-fashion-mnist)" % DATA_DIR)
        return SKIP
    probe = N.Hosts(1, tag="soakprobe")
    why = probe.setup()
    if why:
        print("SKIPPED: %s" % why)
        return SKIP
    probe.teardown()

    work = opts.work_dir or tempfile.mkdtemp(prefix="ddp-soak-")
    os.makedirs(work, exist_ok=True)
    trials, current = [], [None]

    def on_signal(sig, _frame):
        raise Interrupted(sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print("kill soak: %d trial(s) of %s; folders in %s" % (opts.trials, ",".join(phases), work), flush=True)
    t_all = time.monotonic()
    try:
        for i in range(opts.trials):
            phase = phases[i % len(phases)]
            variant = VARIANTS[phase][(i // len(phases)) % 2] if opts.victim == "rotate" else opts.victim
            t = Trial(opts, i, phase, variant, work)
            current[0] = t
            t.run()
            current[0] = None
            trials.append(t)
            print(t.line(), flush=True)
            if not t.failures and not opts.keep:
                shutil.rmtree(t.dir, ignore_errors=True)
            if opts.report:
                write_report(opts.report, trials, opts, done=False)
    except Interrupted as e:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        t = current[0]
        if t is not None:
            for h in t.procs:
                t.hosts.kill_all(h)
            T.kill_marked(t.marker)
            t.hosts.teardown()
        print("kill soak: stopped by signal %d after %d trial(s); hosts torn down" % (e.sig, len(trials)),
              flush=True)
        if opts.report:
            write_report(opts.report, trials, opts, done=False)
        return 128 + e.sig
    print("\nper phase (%.0f s in all):" % (time.monotonic() - t_all))
    print("  %-16s %7s %9s %16s %14s" % ("phase", "trials", "finished", "stopped cleanly", "failed checks"))
    for phase, s in summary(trials).items():
        print("  %-16s %7d %9d %16d %14d" % (phase, s["trials"], s["finished"], s["stopped"], s["failed"]))
    if opts.report:
        write_report(opts.report, trials, opts, done=True)
        print("report: %s" % opts.report)
    failed = [t for t in trials if t.failures]
    if failed:
        print("FAILED: trial(s) %s; their folders are kept in %s" % (", ".join(str(t.index) for t in failed), work))
        return 1
    if not opts.keep and not opts.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    print("all %d trial(s) passed" % len(trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
