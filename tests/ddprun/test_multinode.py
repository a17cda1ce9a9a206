#!/usr/bin/env python3
"""Several ddprun agents on one machine (loopback) acting as separate hosts."""
import os
import signal
import subprocess
import sys
import time

import ddprun_testlib as T


class MultiNodeTest(T.DdprunTestCase):
    def setUp(self):
        super().setUp()
        self.held = T.HeldPort()
        self.port = self.held.port

    def tearDown(self):
        self.held.close()
        super().tearDown()

    def node(self, rank, cmd, nnodes=2, nproc=2, extra=(), **env):
        # The held port names the workers' store (a file, on loopback) and is node 0's
        # rendezvous port, served on the socket this test holds.
        pass_fds = ()
        if rank == 0:
            handed, pass_fds = self.held.handover()
            env = dict(env, **handed)
        p = T.start(["--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                     "--master-port", str(self.port), "--rdzv-port", str(self.port),
                     "--nproc-per-node", str(nproc),
                     "--grace-period", "3", "--rdzv-timeout", "60"] + list(extra) + ["--"] + cmd,
                    self.env(OMP_NUM_THREADS=1, **env), pass_fds=pass_fds)
        self.procs.append(p)
        return p

    def test_failure_on_node1_stops_node0(self):
        fail3 = ["bash", "-c", '[ "$RANK" = 3 ] && { sleep 0.5; echo "rank 3 broke" >&2; exit 5; }; sleep 1000']
        n1 = self.node(1, fail3)
        n0 = self.node(0, fail3)
        rc0, out0, err0 = self.finish(n0)
        rc1, out1, err1 = self.finish(n1)
        self.assertEqual(rc1, 5, err1)
        self.assertIn("rank       : 3 (local_rank 1, node_rank 1)", err1)
        self.assertIn("rank 3 broke", err1)
        self.assertEqual(rc0, 5, err0)
        self.assertIn("node 1 failed: rank 3 (pid", err0)
        self.assertIn("exits with code 5 because node 1 failed", err0)
        self.assert_no_survivors(1.0)

    def test_failure_on_node0_stops_node1(self):
        fail0 = ["bash", "-c", '[ "$RANK" = 0 ] && { sleep 0.5; exit 6; }; sleep 1000']
        n0 = self.node(0, fail0)
        n1 = self.node(1, fail0)
        rc1, _, err1 = self.finish(n1)
        rc0, _, err0 = self.finish(n0)
        self.assertEqual(rc0, 6, err0)
        self.assertEqual(rc1, 6, err1)
        self.assertIn("node 0 failed: rank 0 (pid", err1)
        self.assert_no_survivors(1.0)

    def test_success_waits_for_all_nodes(self):
        # Node 0's workers finish first; node 0 still waits for node 1's.
        script = ["bash", "-c", '[ "$GROUP_RANK" = 1 ] && sleep 2; echo "rank $RANK ok"']
        n0 = self.node(0, script)
        n1 = self.node(1, script)
        t0 = time.monotonic()
        rc0, out0, err0 = self.finish(n0)
        self.assertGreater(time.monotonic() - t0, 1.5, "node 0 exited before node 1 finished")
        rc1, out1, err1 = self.finish(n1)
        self.assertEqual((rc0, rc1), (0, 0), err0 + err1)
        self.assertIn("[rank 3]: rank 3 ok", out1)

    def test_sigint_on_node1_stops_node0(self):
        sleeper = ["sleep", "1000"]
        n0 = self.node(0, sleeper)
        n1 = self.node(1, sleeper)
        # Node 1's workers run only after node 0's "go": the link is up.
        self.assertTrue(T.wait_for(lambda: len(T.pids_with_marker(self.marker)) >= 6, 30))
        n1.send_signal(signal.SIGINT)
        rc1, _, err1 = self.finish(n1)
        rc0, _, err0 = self.finish(n0)
        self.assertEqual(rc1, 130, err1)
        self.assertEqual(rc0, 130, err0)
        self.assertIn("node 1 failed: stopped by SIGINT", err0)
        self.assert_no_survivors(1.0)

    def kill_one_node(self, victim):
        """Two nodes of sleepers; SIGKILLs node `victim`'s ddprun (no goodbye; its workers die
        with it, PR_SET_PDEATHSIG) and returns the other's (returncode, stderr)."""
        sleeper = ["sleep", "1000"]
        nodes = [self.node(0, sleeper), self.node(1, sleeper)]
        self.assertTrue(T.wait_for(lambda: len(T.pids_with_marker(self.marker)) >= 6, 30))
        nodes[victim].kill()
        self.finish(nodes[victim])
        rc, _, err = self.finish(nodes[1 - victim])
        return rc, err

    def test_lost_agent_stops_node0(self):
        rc0, err0 = self.kill_one_node(1)
        self.assertEqual(rc0, 1, err0)
        self.assertIn("node 1 failed: its ddprun closed the connection", err0)
        self.assert_no_survivors(2.0)

    def test_lost_node0_stops_node1_with_the_resume_command(self):
        rc1, err1 = self.kill_one_node(0)
        self.assertEqual(rc1, 1, err1)
        for part in ("ddprun: error: node 0's ddprun at 127.0.0.1:%d closed the connection" % self.port,
                     "with a fixed --nnodes every host is needed",
                     "node 0 must run at --master-addr again",
                     "This host's command: %s --nnodes 2 --node-rank 1" % T.DDPRUN):
            self.assertIn(part, err1)
        self.assert_no_survivors(2.0)

    def test_node0_missing_times_out(self):
        self.held.close()  # a port held without listening: node 0 is not there
        self.held = T.HeldPort(listen=False)
        self.port = self.held.port
        n1 = self.node(1, ["true"], extra=["--rdzv-timeout", "2"])
        rc, _, err = self.finish(n1)
        self.assertEqual(rc, 1, err)
        self.assertIn("could not reach node 0's ddprun at 127.0.0.1:%d within --rdzv-timeout 2 s"
                      % self.port, err)

    def test_node1_missing_times_out(self):
        n0 = self.node(0, ["true"], extra=["--rdzv-timeout", "2"])
        rc, _, err = self.finish(n0)
        self.assertEqual(rc, 1, err)
        self.assertIn("nodes 1 did not join within --rdzv-timeout 2 s", err)

    def test_mismatched_nproc_refused(self):
        n0 = self.node(0, ["true"], extra=["--rdzv-timeout", "4"])
        n1 = self.node(1, ["true"], nproc=3)
        rc1, _, err1 = self.finish(n1)
        self.assertEqual(rc1, 2, err1)
        self.assertIn("refused this host: node 0 runs --nproc-per-node 2 workers but this host wants 3",
                      err1)
        rc0, _, err0 = self.finish(n0)
        self.assertNotEqual(rc0, 0)

    def test_restart_across_nodes(self):
        count_file = os.path.join(self.tmp, "runs.txt")
        env = dict(COUNT_FILE=count_file, SUCCEED_FROM=2, FAIL_CODE=4)
        # count_runs.sh fails on rank 1 (node 0) in attempts 0 and 1.
        n0 = self.node(0, [T.worker("count_runs.sh")], extra=["--max-restarts", "2"], **env)
        n1 = self.node(1, [T.worker("count_runs.sh")], extra=["--max-restarts", "2"], **env)
        rc0, _, err0 = self.finish(n0)
        rc1, out1, err1 = self.finish(n1)
        self.assertEqual((rc0, rc1), (0, 0), err0 + err1)
        with open(count_file) as f:
            runs = sorted((int(r), int(a)) for r, a, _ in (l.split() for l in f.read().splitlines()))
        self.assertEqual(runs, [(r, a) for r in range(4) for a in range(3)])
        self.assertIn("node 0 failed: rank 1 (pid", err1)
        self.assertIn("restarting all workers (restart 2 of 2)", err1)
        for attempt in range(3):
            self.assertIn("[rank 3]: rank 3 attempt %d" % attempt, out1)


if __name__ == "__main__":
    T.main()
