#!/usr/bin/env python3
"""A lost host in an elastic job: examples/fashion_mnist on three simulated hosts.

    python3 test_elastic_hosts.py /path/to/ddprun --example /path/to/fashion_mnist [unittest options]

Three network namespaces on one bridge (netns_testlib.py) are three hosts. Each runs the
same torchrun-style command, one worker per host:

    ddprun --nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST0:29400
           --rdzv-id ID --max-restarts 2 ... -- fashion_mnist --run-dir RUNS --name job --resume ...

The hosts share the file system, so RUNS is the job's shared checkpoint folder. The test
checks that the hosts get node ranks 0, 1 and 2 (host 0, which has the endpoint's address,
is node 0) and that the job starts on three ranks. Once epoch 1's checkpoint and metrics
are written, it SIGKILLs node 1's ddprun (its worker dies with it). Nodes 0 and 2 must
start attempt 1 (restart 1) with two ranks, resume from the latest checkpoint and finish
with exit code 0.

The kill can land in any later epoch, so the schedule is read back from the run: K
epochs at three ranks (the checkpoint attempt 1 resumed from), the rest at two. A clean
run on one host with that schedule (--nproc-per-node 3 for K epochs, then 2 with
--resume) must end with the same model.pt, bit for bit, and the same world sizes in
metrics.jsonl. Both runs use --backend gloo. Left to choose, the library would take
shared memory ("shm") in the namespaces too, as they share /dev/shm, the host name and
the kernel (docs/shm.md: they count as one host); Gloo makes the workers talk through
the bridge as on separate machines. And the reference must use the same backend: with
three ranks shm and Gloo add the gradients in different orders, and their models differ
in the last bits after one epoch.

Needs root, iproute2 and Debian's dataset-fashion-mnist; without them it says why and
exits 77 (reported as skipped by CTest). Standard library only: model.pt files are
compared as the zip archives torch.save writes, record by record.
"""
import array
import collections
import io
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import unittest
import zipfile

import ddprun_testlib as T
import netns_testlib as N

SKIP = 77
EXAMPLE = None
DATA_DIR = "/usr/share/datasets/fashion-mnist"
HOSTS = N.Hosts(3)
RDZV_PORT = 29400  # each host has its own ports: no other test can take these
EPOCHS = 4
# A few seconds per epoch on a 2-core machine (three workers of one thread each), so that
# the kill lands in the middle of the run.
TRAIN_ARGS = ["--epochs", str(EPOCHS), "--train-samples", "6144", "--test-samples", "300",
              "--batch-size", "32", "--lr", "0.002", "--seed", "7", "--threads", "1",
              "--backend", "gloo", "--progress", "none", "--name", "job", "--resume"]
RESUMED = re.compile(r"\[rank 0\]: resuming from (\S+): (\d+) of (\d+) epochs done")


read = T.read_text


def read_metrics(run_dir):
    """The records of <run_dir>/metrics.jsonl ([] while there is none)."""
    text = read(os.path.join(run_dir, "metrics.jsonl"))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def node_rank(stderr):
    """The node rank a ddprun's stderr announced, or None so far."""
    if "ddprun: node 0 waiting for" in stderr:
        return 0
    m = re.search(r"ddprun: this host is node (\d+) of 3", stderr)
    return int(m.group(1)) if m else None


class RecordNames(pickle.Unpickler):
    """Reads the data.pkl of a torch.save archive without torch: each tensor comes out as
    the name of its data record (its storage's persistent id holds the key)."""

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        return lambda *args: args[0] if args else None  # _rebuild_tensor_v2(storage, ...)

    def persistent_load(self, pid):
        return "data/%s" % pid[2]  # ("storage", storage type, key, location, numel)


def tensor_records(path):
    """{state dict key: bytes of its data record} of a torch.save zip archive (model.pt)."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        prefix = names[0].split("/", 1)[0] + "/"
        with z.open(prefix + "data.pkl") as f:
            state = RecordNames(f).load()
        return {key: z.read(prefix + record) for key, record in state.items()}


def max_float_diff(a, b):
    """The largest difference between two records of float32 values (the model's dtype)."""
    x, y = array.array("f", a), array.array("f", b)
    return max((abs(p - q) for p, q in zip(x, y)), default=0.0)


class ElasticHostsTest(T.DdprunTestCase):
    # K -> (metrics, model.pt's bytes) of the clean run with K epochs at three ranks. The
    # two lost-node tests usually resume after the same epoch, and then share one run.
    references = {}

    def setUp(self):
        super().setUp()
        self.outputs = []  # (host, stdout path, stderr path) of each ddprun started
        self.seen = set()  # workers seen by watch()

    def tearDown(self):
        for host in range(HOSTS.count):
            HOSTS.kill_all(host)
        super().tearDown()

    def ddprun(self, nnodes, rdzv_id, grace_period=3):
        """The command every host runs: c10d with host 0's endpoint, one worker per host."""
        return [T.DDPRUN, "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", "%s:%d" % (HOSTS.addrs[0], RDZV_PORT),
                "--rdzv-id", "%s-%d" % (rdzv_id, os.getpid()), "--max-restarts", "2",
                "--grace-period", str(grace_period)]

    def spawn(self, host, cmd, tag="host"):
        """Starts `cmd` on `host`, its output in <tmp>/<tag><host>.out and .err."""
        out, err = (os.path.join(self.tmp, "%s%d.%s" % (tag, host, s)) for s in ("out", "err"))
        with open(out, "w") as fo, open(err, "w") as fe:
            p = subprocess.Popen(HOSTS.command(host, cmd), env=self.env(OMP_NUM_THREADS=1),
                                 stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        self.outputs.append((host, out, err))
        return p

    def start_host(self, host, runs, logs):
        return self.spawn(host, self.ddprun("2:3", "elastic") + [
            "--rdzv-conf", "join_timeout=60,last_call_timeout=30", "--log-dir", logs, "--",
            EXAMPLE, "--run-dir", runs] + TRAIN_ARGS)

    def logs(self):
        """Every ddprun's output so far, for failure messages."""
        parts = []
        for host, out, err in self.outputs:
            parts.append("--- host %d stdout\n%s--- host %d stderr\n%s"
                         % (host, read(out)[-4000:], host, read(err)[-4000:]))
        return "\n".join(parts)

    def workers(self):
        """(host, RANK, WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RESTART_COUNT) of each live
        fashion_mnist worker of this test, as its environment says."""
        keys = ("RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT")
        found = set()
        for pid in T.pids_with_marker(self.marker):
            host = HOSTS.host_of(pid)
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    argv0 = f.read().split(b"\0")[0].decode(errors="replace")
                with open("/proc/%d/environ" % pid, "rb") as f:
                    env = dict(v.decode(errors="replace").split("=", 1)
                               for v in f.read().split(b"\0") if b"=" in v)
            except OSError:
                continue
            # (A process that ended meanwhile reads as empty: it is skipped.)
            if argv0 == EXAMPLE and host is not None and all(k in env for k in keys):
                found.add((host,) + tuple(int(env[k]) for k in keys))
        return found

    def watch(self, predicate, timeout, what):
        """Waits until predicate() holds, noting meanwhile every worker seen (self.seen);
        fails the test with every host's output after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                self.fail("%s within %d s\n%s" % (what, timeout, self.logs()))
            self.seen |= self.workers()
            time.sleep(0.1)

    def node_ranks(self):
        """Each host's node rank (None where its ddprun has not announced one yet)."""
        return [node_rank(read(err)) for _, _, err in self.outputs]

    def run_elastic(self, runs, logs, victim_node=1):
        """The three-host run with node `victim_node` killed after epoch 1; returns how
        many epochs were trained at three ranks."""
        t0 = time.monotonic()
        self.seen = set()
        procs = [self.start_host(h, runs, logs) for h in range(HOSTS.count)]
        self.watch(lambda: None not in self.node_ranks(), 60, "the hosts did not all get a node rank")
        nodes = self.node_ranks()
        self.assertEqual(sorted(nodes), [0, 1, 2], self.logs())
        self.assertEqual(nodes[0], 0, "host 0 serves the endpoint: it is node 0\n" + self.logs())

        run_dir = os.path.join(runs, "job")
        # Epoch 1's end: its record, then its checkpoint (the example writes them in this
        # order, so that a kill between them loses nothing).
        latest = os.path.join(run_dir, "checkpoints", "latest")
        self.watch(lambda: read_metrics(run_dir) and os.path.exists(latest), 240,
                   "epoch 1 did not end with its record and its checkpoint")
        victim = nodes.index(victim_node)
        killed_after = max(m["epoch"] for m in read_metrics(run_dir))
        procs[victim].kill()  # SIGKILL: no goodbye on the control channel
        procs[victim].wait(timeout=30)
        t_kill = time.monotonic() - t0
        # Attempt 0: one worker per host, rank = node rank, no restart yet.
        self.assertEqual(self.seen, {(h, nodes[h], 3, nodes[h], 0) for h in range(3)}, self.logs())
        self.seen = set()
        # Its worker has PR_SET_PDEATHSIG(SIGKILL): nothing of that host is left.
        self.watch(lambda: not HOSTS.pids(victim), 10, "host %d's worker outlived its ddprun" % victim)

        survivors = [h for h in range(HOSTS.count) if h != victim]
        self.watch(lambda: all(procs[h].poll() is not None for h in survivors), 300,
                   "the two hosts left did not finish")
        for h in survivors:
            self.assertEqual(procs[h].returncode, 0, "host %d (node %d) failed\n%s" % (h, nodes[h], self.logs()))
        for h in range(HOSTS.count):
            self.watch(lambda: not HOSTS.pids(h), 10, "processes outlived host %d's ddprun" % h)
        # Attempt 1: the two survivors, renumbered 0 and 1 by node rank, at restart 1 (the
        # workers of attempt 0 that were still stopping may show up too).
        left = sorted(survivors, key=lambda h: nodes[h])
        self.assertEqual({w for w in self.seen if w[4] == 1},
                         {(h, g, 2, g, 1) for g, h in enumerate(left)}, self.logs())
        self.assertEqual({w[4] for w in self.seen} - {0}, {1}, self.logs())

        out = "".join(read(o) for _, o, _ in self.outputs)
        err = {h: read(e) for h, _, e in self.outputs}
        for h in survivors:
            self.assertIn("ddprun: restarting all workers (restart 1 of 2)", err[h], self.logs())
        # The coordinator of attempt 1 announces it: node 0, or node 1 after node 0 was lost.
        self.assertIn("ddprun: starting attempt 1 on 2 node(s)", err[left[0]], self.logs())
        if victim_node == 0:
            self.assertIn("ddprun: node 1 takes over as the coordinator at %s:%d"
                          % (HOSTS.addrs[left[0]], RDZV_PORT), err[left[0]], self.logs())
            self.assertIn("ddprun: rejoining the job at node 1 (%s:%d)"
                          % (HOSTS.addrs[left[0]], RDZV_PORT), err[left[1]], self.logs())
            self.assertIn("ddprun: node 2 rejoined", err[left[0]], self.logs())
        # --log-dir: attempt 0 ran ranks 0..2, attempt 1 ranks 0..1, and there was no attempt 2.
        self.assertEqual(sorted(os.listdir(logs)), ["0", "1"])
        self.assertEqual(sorted(os.listdir(os.path.join(logs, "0"))), ["rank0", "rank1", "rank2"])
        self.assertEqual(sorted(os.listdir(os.path.join(logs, "1"))), ["rank0", "rank1"])
        self.assertIn("[rank 0]: fashion_mnist: 3 rank(s), backend gloo", out)
        self.assertIn("[rank 0]: fashion_mnist: 2 rank(s), backend gloo", out)
        resumed = RESUMED.findall(out)
        self.assertEqual(len(resumed), 1, "expected one resume (attempt 1)\n" + self.logs())
        k = int(resumed[0][1])
        self.assertEqual(int(resumed[0][2]), EPOCHS)
        self.assertTrue(killed_after <= k < EPOCHS, "resumed after %d epochs; the kill came after "
                        "epoch %d's metrics; %d epochs in all\n%s" % (k, killed_after, EPOCHS, self.logs()))
        print("\nelastic run: node ranks %s (host: node); node %d = host %d killed at %.1f s, after "
              "epoch %d's metrics; attempt 1 resumed from %s (%d epochs at 3 ranks, %d at 2); "
              "done at %.1f s" % (dict(enumerate(nodes)), victim_node, victim, t_kill, killed_after, resumed[0][0],
                                  k, EPOCHS - k, time.monotonic() - t0), file=sys.stderr)
        return k

    def run_reference(self, runs, k):
        """The same schedule on one host: K epochs with 3 ranks, then --resume with 2."""
        t0 = time.monotonic()
        for nproc, epochs in ((3, k), (2, EPOCHS)):
            args = ["--nproc-per-node", str(nproc), "--grace-period", "3", "--", EXAMPLE,
                    "--run-dir", runs] + TRAIN_ARGS
            args[args.index("--epochs") + 1] = str(epochs)
            rc, out, err, _ = T.run(args, self.env(OMP_NUM_THREADS=1), timeout=240)
            self.assertEqual(rc, 0, "reference run, %d ranks:\n%s\n%s" % (nproc, out[-3000:], err[-3000:]))
        print("reference run: %.1f s" % (time.monotonic() - t0), file=sys.stderr)

    def reference(self, k):
        """The clean run's metrics and model.pt bytes for K epochs at three ranks."""
        if k not in self.references:
            ref_runs = os.path.join(self.tmp, "reference")
            self.run_reference(ref_runs, k)
            with open(os.path.join(ref_runs, "job", "model.pt"), "rb") as f:
                self.references[k] = (read_metrics(os.path.join(ref_runs, "job")), f.read())
        else:
            print("reference run: the one with %d epochs at 3 ranks, from an earlier test" % k,
                  file=sys.stderr)
        return self.references[k]

    def assert_same_model(self, a, want):
        """model.pt at path `a` against the bytes `want` of another."""
        with open(a, "rb") as fa:
            if fa.read() == want:
                return
        ra, rb = tensor_records(a), tensor_records(io.BytesIO(want))
        self.assertEqual(list(ra), list(rb), "model.pt files with different keys")
        differ = ["%s (max |diff| %g)" % (key, max_float_diff(ra[key], rb[key]))
                  for key in ra if ra[key] != rb[key]]
        if differ:
            self.fail("the elastic run's model.pt differs from the reference run's at "
                      + ", ".join(differ))

    def test_lost_host_resumes_from_checkpoint(self):
        self.check_lost_node(1)

    def test_lost_node0_a_new_coordinator_goes_on(self):
        """Node 0 (the endpoint's host, and rank 0's) is killed: nodes 1 and 2 hold two of
        the last attempt's three hosts, a majority, so node 1 takes over as the coordinator,
        node 2 rejoins it, and the job ends as a clean run with that schedule does."""
        self.check_lost_node(0)

    def test_two_hosts_without_node0_stop_and_say_how_to_resume(self):
        """With --nnodes 1:2, node 1 alone is half of the last attempt without its group 0:
        it cannot tell node 0's loss from a network split in which node 0 goes on (Note [A
        quorum of the last attempt]), so it stops, naming the cause and the command that
        resumes the job."""
        procs = [self.spawn(h, self.ddprun("1:2", "pair") + ["--no-python", "--", "sleep", "600"],
                            "pair") for h in (0, 1)]
        self.watch(lambda: "starting attempt 0 on 2 node(s)" in read(self.outputs[0][2]), 60,
                   "the two hosts did not start")
        self.watch(lambda: len({HOSTS.host_of(p) for p in T.pids_with_marker(self.marker)}) == 2,
                   30, "the workers did not start on both hosts")
        t_kill = time.monotonic()
        HOSTS.kill_all(0)
        self.watch(lambda: procs[1].poll() is not None, 30, "node 1 did not stop")
        self.assertEqual(procs[1].returncode, 1, self.logs())
        self.assertLess(time.monotonic() - t_kill, 20, self.logs())
        self.watch(lambda: not HOSTS.pids(1), 10, "processes outlived node 1's ddprun")
        err = read(self.outputs[1][2])
        for part in ("ddprun: error: node 0's ddprun at %s:%d closed the connection"
                     % (HOSTS.addrs[0], RDZV_PORT),
                     "not a majority", "network split", "To resume, start the job again on every host",
                     "--nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d"):
            self.assertIn(part, err, self.logs())
        self.assertNotIn("takes over", err, self.logs())

    def test_node0_cut_off_the_majority_goes_on_alone(self):
        """A network split, not a death: node 0's cable is pulled (its port on the bridge
        goes down), so every ddprun only sees silence. After the peer timeout (here
        keep_alive_interval=1 times keep_alive_max_attempt=6: 6 s, where the default is
        30 s) nodes 1 and 2, two of the last attempt's three hosts, go on with node 1 as
        the coordinator and MASTER_ADDR on host 1, while node 0, alone, lacks the quorum
        and stops: never do both sides train."""
        stop_file = os.path.join(self.tmp, "stop")
        report = os.path.join(self.tmp, "workers.txt")
        script = ('echo "$GROUP_RANK $WORLD_SIZE $MASTER_ADDR $TORCHELASTIC_RESTART_COUNT" >> %s; '
                  'while [ ! -e %s ]; do sleep 0.2; done' % (report, stop_file))
        procs = []
        for h in range(3):
            # MIN 1: node 0 alone has enough hosts; only the quorum rule stops it.
            cmd = self.ddprun("1:3", "split", 2) + [
                "--rdzv-conf", "keep_alive_interval=1,keep_alive_max_attempt=6",
                "--no-python", "--", "sh", "-c", script]
            procs.append(self.spawn(h, cmd, "split"))
            if h == 0:  # host 0 serves the endpoint: it is node 0
                self.watch(lambda: "node 0 waiting" in read(self.outputs[0][2]), 30,
                           "host 0 did not listen")
        self.watch(lambda: len(read(report).splitlines()) == 3, 60, "attempt 0 did not start")
        nodes = self.node_ranks()
        self.assertEqual((nodes[0], sorted(nodes)), (0, [0, 1, 2]), self.logs())
        successor = nodes.index(1)  # hosts 1 and 2 join in either order
        # Pull host 0's cable: its port on the bridge goes down, nothing reaches it any more.
        t_cut = time.monotonic()
        N.ip("-n", HOSTS.bridge_ns, "link", "set", "h0", "down")
        self.addCleanup(N.ip, "-n", HOSTS.bridge_ns, "link", "set", "h0", "up")  # the next test's
        self.watch(lambda: len(read(report).splitlines()) == 5, 120,
                   "nodes 1 and 2 did not start attempt 1")
        self.watch(lambda: procs[0].poll() is not None, 30, "node 0 did not stop")
        self.assertEqual(procs[0].returncode, 1, self.logs())
        err0 = read(self.outputs[0][2])
        self.assertIn("not a majority", err0, self.logs())
        attempt1 = sorted(tuple(line.split()) for line in read(report).splitlines()[3:])
        master = HOSTS.addrs[successor]
        self.assertEqual(attempt1, [("0", "2", master, "1"), ("1", "2", master, "1")], self.logs())
        self.assertIn("takes over as the coordinator", read(self.outputs[successor][2]), self.logs())
        self.assertIn("silent for 6 s", read(self.outputs[successor][2]), self.logs())
        with open(stop_file, "w"):
            pass
        for h in (1, 2):
            self.watch(lambda: procs[h].poll() is not None, 30, "node %d did not finish" % h)
            self.assertEqual(procs[h].returncode, 0, self.logs())
        print("\nsplit: node 0 cut off; attempt 1 on nodes 1 and 2 started %.1f s later"
              % (time.monotonic() - t_cut), file=sys.stderr)

    def check_lost_node(self, victim_node):
        runs, logs = (os.path.join(self.tmp, d) for d in ("runs", "logs"))
        k = self.run_elastic(runs, logs, victim_node)
        want, want_model = self.reference(k)
        got = read_metrics(os.path.join(runs, "job"))
        self.assertEqual([m["epoch"] for m in got], list(range(1, EPOCHS + 1)))
        self.assertEqual([m["world_size"] for m in got], [3] * k + [2] * (EPOCHS - k))
        self.assertEqual([m["world_size"] for m in want], [3] * k + [2] * (EPOCHS - k))
        for key in ("train_loss", "test_accuracy"):
            self.assertEqual([m[key] for m in got], [m[key] for m in want], key)
        self.assert_same_model(os.path.join(runs, "job", "model.pt"), want_model)


def main():
    global EXAMPLE
    args = sys.argv[1:]
    if "--example" in args:
        i = args.index("--example")
        EXAMPLE = os.path.abspath(args[i + 1])
        del args[i:i + 2]
    if not args or not os.access(args[0], os.X_OK) or not EXAMPLE or not os.access(EXAMPLE, os.X_OK):
        sys.exit("usage: %s /path/to/ddprun --example /path/to/fashion_mnist [unittest options]"
                 % sys.argv[0])
    T.DDPRUN = os.path.abspath(args[0])
    if not os.path.exists(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz")):
        print("SKIPPED: no Fashion-MNIST in %s (apt-get install dataset-fashion-mnist)" % DATA_DIR)
        sys.exit(SKIP)
    why = HOSTS.setup()
    if why:
        print("SKIPPED: %s" % why)
        sys.exit(SKIP)
    # Stopped by SIGTERM (kill, a CI job cancelled): tear the hosts down all the same.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        prog = unittest.main(argv=[sys.argv[0]] + args[1:], verbosity=2, exit=False)
    finally:
        HOSTS.teardown()
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
