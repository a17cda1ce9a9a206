#!/usr/bin/env python3
"""Two 'hosts' made of two network namespaces joined by a veth pair.

    python3 test_two_hosts.py /path/to/ddprun [--worker-cmd "CMD ARGS"]
                              [--distributed-tests PATH] [--parallel-tests PATH]
                              [unittest options]

Each namespace runs its own ddprun (--nnodes 2, node 0 in A, node 1 in B,
--nproc-per-node 2). By default the worker dumps its environment, which is
checked (RANK 0..3, WORLD_SIZE 4, ...); --worker-cmd swaps in another worker
(e.g. a real 4-rank all_reduce), which then only has to exit 0 on all ranks.
--distributed-tests runs the library's distributed_tests binary without ddprun, two
ranks per namespace, meeting through init_method file:// in a folder both see (the
namespaces share the filesystem, as hosts share a network filesystem).
--parallel-tests does the same with parallel_tests' HSDP scenario.

The addresses (10.x.y.1 and .2) exist only inside the two namespaces; the
host's own interfaces are never touched. Without root, `ip`, or namespace
support, the script says why and exits 77 (reported as skipped by CTest).
"""
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import unittest

import ddprun_testlib as T

SKIP = 77
PID = os.getpid()
NS = ["ddprun-a-%d" % PID, "ddprun-b-%d" % PID]
VETH = ["dra%d" % (PID % 10**8), "drb%d" % (PID % 10**8)]
SUBNET = "10.%d.%d" % (200 + PID % 50, (PID // 50) % 250)
ADDR = [SUBNET + ".1", SUBNET + ".2"]
WORKER_CMD = None
DISTRIBUTED_TESTS = None
PARALLEL_TESTS = None


def ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), check=check, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=30)


def teardown_namespaces():
    for ns in NS:
        pids = ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass
        ip("netns", "del", ns, check=False)


def setup_namespaces():
    """Creates both namespaces; returns None, or why it could not."""
    if os.geteuid() != 0:
        return "network namespaces need root (euid is %d)" % os.geteuid()
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    try:
        for ns in NS:
            ip("netns", "add", ns)
        ip("link", "add", VETH[0], "netns", NS[0], "type", "veth", "peer", "name", VETH[1], "netns", NS[1])
        for i, ns in enumerate(NS):
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "addr", "add", ADDR[i] + "/24", "dev", VETH[i])
            ip("-n", ns, "link", "set", VETH[i], "up")
        subprocess.run(["ip", "netns", "exec", NS[0], "true"], check=True, timeout=30,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except subprocess.CalledProcessError as e:
        teardown_namespaces()
        return "cannot set up network namespaces: %s: %s" % (" ".join(e.cmd), (e.stderr or "").strip())
    except (OSError, subprocess.TimeoutExpired) as e:
        teardown_namespaces()
        return "cannot set up network namespaces: %s" % e
    return None


class TwoHostTest(T.DdprunTestCase):
    def run_pair(self, worker_for_node, port, extra=(), timeout=120):
        procs = []
        try:
            for node in (1, 0):
                cmd = ["ip", "netns", "exec", NS[node], T.DDPRUN, "--nnodes", "2", "--node-rank",
                       str(node), "--master-addr", ADDR[0], "--master-port", str(port),
                       "--nproc-per-node", "2", "--rdzv-timeout", "60", "--grace-period", "3"]
                cmd += list(extra) + ["--"] + worker_for_node(node)
                procs.append((node, subprocess.Popen(cmd, env=self.env(), stdout=subprocess.PIPE,
                                                     stderr=subprocess.PIPE, text=True)))
            results = {}
            deadline = time.monotonic() + timeout
            for node, p in procs:
                out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
                results[node] = (p.returncode, out, err)
            return results
        finally:
            for _, p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()

    def test_four_ranks_on_two_hosts(self):
        if WORKER_CMD:
            results = self.run_pair(lambda node: list(WORKER_CMD), 29500)
            for node, (rc, out, err) in sorted(results.items()):
                sys.stderr.write("--- node %d stdout\n%s--- node %d stderr\n%s" % (node, out, node, err))
                self.assertEqual(rc, 0, "node %d failed:\n%s" % (node, err))
            return
        out_dir = os.path.join(self.tmp, "env")
        os.mkdir(out_dir)
        worker = [sys.executable, T.worker("dump_env.py"), out_dir]
        results = self.run_pair(lambda node: worker, 29500)
        for node, (rc, out, err) in results.items():
            self.assertEqual(rc, 0, "node %d:\n%s" % (node, err))
        infos = {}
        for path in glob.glob(os.path.join(out_dir, "rank*.json")):
            with open(path) as f:
                e = json.load(f)
            infos[int(e["RANK"])] = e
        self.assertEqual(sorted(infos), [0, 1, 2, 3])
        for rank, e in infos.items():
            self.assertEqual(e["WORLD_SIZE"], "4")
            self.assertEqual(e["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(e["LOCAL_RANK"], str(rank % 2))
            self.assertEqual(e["GROUP_RANK"], str(rank // 2))
            self.assertEqual(e["MASTER_ADDR"], ADDR[0])
            self.assertEqual(e["MASTER_PORT"], "29500")
            self.assertIsNone(e["DDP_RENDEZVOUS_DIR"])
        self.assertEqual(len({e["TORCHELASTIC_RUN_ID"] for e in infos.values()}), 1)
        self.assertIn("[rank 3]: rank 3 wrote", results[1][1])
        self.assertIn("[rank 0]: rank 0 wrote", results[0][1])

    def test_same_c10d_command_on_both(self):
        # torchrun's multi-host line: no --node-rank. A serves the endpoint (its own
        # address); in B that address is not local, so B joins and is given node 1.
        out_dir = os.path.join(self.tmp, "c10d")
        os.mkdir(out_dir)
        cmd = [T.DDPRUN, "--nnodes=2", "--nproc-per-node=2", "--rdzv-id=100", "--rdzv-backend=c10d",
               "--rdzv-endpoint=%s:29400" % ADDR[0], "--rdzv-conf=join_timeout=60", "--",
               sys.executable, T.worker("dump_env.py"), out_dir]
        procs = [subprocess.Popen(["ip", "netns", "exec", NS[node]] + cmd, env=self.env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for node in (1, 0)]
        try:
            results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        for out, err, rc in results:
            self.assertEqual(rc, 0, err)
        self.assertIn("this host is node 1 of 2", results[0][1])
        infos = {}
        for path in glob.glob(os.path.join(out_dir, "rank*.json")):
            with open(path) as f:
                e = json.load(f)
            infos[int(e["RANK"])] = e
        self.assertEqual(sorted(infos), [0, 1, 2, 3])
        for rank, e in infos.items():
            self.assertEqual((e["WORLD_SIZE"], e["GROUP_RANK"]), ("4", str(rank // 2)))
            self.assertEqual((e["MASTER_ADDR"], e["TORCHELASTIC_RUN_ID"]), (ADDR[0], "100"))
        self.assertIn("[rank 0]: rank 0 wrote", results[1][0])  # A is node 0

    def run_file_store_ranks(self, backend, env_extra=None, timeout=120, private_shm=False,
                             scenario="file_store_hosts", binary=None):
        """Four ranks, two per namespace, no launcher: [(output, returncode)] by rank.
        private_shm: each namespace also gets its own /dev/shm (a mount namespace with a
        fresh tmpfs, shared by the two ranks there), so that the namespaces are different
        hosts for shared memory too. Each rank runs `scenario` of `binary` (a test
        binary; default --distributed-tests)."""
        binary = binary or DISTRIBUTED_TESTS
        name = "%s-%s-%d" % (backend or "auto", "private" if private_shm else "shared",
                             len(os.listdir(self.tmp)))
        store_dir = os.path.join(self.tmp, "store-" + name)
        logs = os.path.join(self.tmp, "logs-" + name)
        os.mkdir(store_dir)
        os.mkdir(logs)
        env = T.base_env(WORLD_SIZE=4, OMP_NUM_THREADS=1, DDP_TEST_SCENARIO=scenario,
                         DDP_TEST_INIT_METHOD="file://%s/store" % store_dir,
                         DDP_TEST_BACKEND=backend, DDP_TEST_LOCAL_WORLD_SIZE=2)
        for var in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "GLOO_SOCKET_IFNAME"):
            env.pop(var, None)
        env.update({k: str(v) for k, v in (env_extra or {}).items()})
        procs = []
        try:
            for host in range(2):
                lines = ["set -u"]
                if private_shm:
                    lines.append("mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm || exit 99")
                for rank in (2 * host, 2 * host + 1):
                    lines.append('RANK=%d "$0" > %s/rank%d.log 2>&1 & p%d=$!'
                                 % (rank, logs, rank, rank))
                for rank in (2 * host, 2 * host + 1):
                    lines.append("wait $p%d; echo $? > %s/rank%d.rc" % (rank, logs, rank))
                cmd = ["ip", "netns", "exec", NS[host]]
                if private_shm:
                    cmd += ["unshare", "--mount", "--propagation", "private"]
                cmd += ["bash", "-c", "\n".join(lines), binary]
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
            deadline = time.monotonic() + timeout
            for p in procs:
                out = p.communicate(timeout=max(1, deadline - time.monotonic()))[0]
                self.assertEqual(p.returncode, 0, "namespace script failed:\n" + out)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        results = []
        for rank in range(4):
            with open(os.path.join(logs, "rank%d.log" % rank)) as f:
                out = f.read()
            with open(os.path.join(logs, "rank%d.rc" % rank)) as f:
                results.append((out, int(f.read())))
        return results

    def test_file_store_across_hosts(self):
        # init_method file:// on a shared folder: Gloo binds the veth interface that
        # reaches the other namespace (not 127.0.0.1), and local ranks come from the
        # host identities the ranks exchange, since no launcher sets LOCAL_*.
        if not DISTRIBUTED_TESTS:
            self.skipTest("needs --distributed-tests PATH")
        # The namespaces share /dev/shm, so an empty backend finds one shared-memory host;
        # with a /dev/shm of their own they are two, and it picks the hierarchy (shared
        # memory within each, Gloo between the leaders).
        for backend, private_shm, chosen in (("gloo", False, "gloo"), ("", False, "shm"),
                                              ("", True, "hier")):
            results = self.run_file_store_ranks(backend, private_shm=private_shm)
            for rank, (out, rc) in enumerate(results):
                self.assertEqual(rc, 0, "backend %r, rank %d:\n%s" % (backend, rank, out))
                self.assertIn("rank %d of 4 (local %d of 2, %s)" % (rank, rank % 2, chosen), out)
        # "shm" asked for across hosts is an error on every rank that names both hosts.
        results = self.run_file_store_ranks("shm", private_shm=True, timeout=90)
        for rank, (out, rc) in enumerate(results):
            self.assertNotEqual(rc, 0, out)
            self.assertIn("shared memory needs every rank of the group on one host", out)
            self.assertIn("rank 0 is on", out)
        # A named interface that does not exist is Gloo's error, on every rank, not a hang.
        results = self.run_file_store_ranks("gloo", {"GLOO_SOCKET_IFNAME": "nosuch0"}, timeout=90)
        for rank, (out, rc) in enumerate(results):
            self.assertNotEqual(rc, 0, out)
            self.assertIn("nosuch0", out)

    def test_hsdp_across_hosts(self):
        # HSDP on a 2 x 2 mesh (replicate, shard) whose rows are the hosts: each host
        # shards over shared memory, the hosts all-reduce over Gloo, and the result
        # equals one process training on every rank's batches (the scenario checks both).
        if not PARALLEL_TESTS:
            self.skipTest("needs --parallel-tests PATH")
        results = self.run_file_store_ranks("", private_shm=True, scenario="hsdp_hosts",
                                            binary=PARALLEL_TESTS)
        for rank, (out, rc) in enumerate(results):
            self.assertEqual(rc, 0, "rank %d:\n%s" % (rank, out))
            self.assertIn("rank %d: shard group shm, replicate group gloo" % rank, out)
            self.assertIn("rank %d: HSDP across hosts equals one process" % rank, out)

    def test_failure_in_b_stops_a(self):
        def worker(node):
            if node == 1:
                return ["bash", "-c", '[ "$RANK" = 3 ] && { sleep 1; echo "rank 3 broke" >&2; exit 5; }; '
                                      'sleep 1000']
            return ["sleep", "1000"]
        results = self.run_pair(worker, 29600)
        rc0, _, err0 = results[0]
        rc1, _, err1 = results[1]
        self.assertEqual(rc1, 5, err1)
        self.assertIn("rank 3 broke", err1)
        self.assertNotEqual(rc0, 0, err0)
        self.assertEqual(rc0, 5, err0)
        self.assertIn("node 1 failed: rank 3", err0)
        self.assert_no_survivors(2.0)


def main():
    global WORKER_CMD, DISTRIBUTED_TESTS, PARALLEL_TESTS
    args = sys.argv[1:]
    if "--worker-cmd" in args:
        i = args.index("--worker-cmd")
        WORKER_CMD = shlex.split(args[i + 1])
        del args[i:i + 2]
    if "--distributed-tests" in args:
        i = args.index("--distributed-tests")
        DISTRIBUTED_TESTS = os.path.abspath(args[i + 1])
        del args[i:i + 2]
    if "--parallel-tests" in args:
        i = args.index("--parallel-tests")
        PARALLEL_TESTS = os.path.abspath(args[i + 1])
        del args[i:i + 2]
    sys.argv = [sys.argv[0]] + args
    why = setup_namespaces()
    if why:
        print("SKIPPED: %s" % why)
        sys.exit(SKIP)
    try:
        T.DDPRUN = os.path.abspath(sys.argv[1])
        prog = unittest.main(argv=[sys.argv[0]] + sys.argv[2:], verbosity=2, exit=False)
    finally:
        teardown_namespaces()
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
