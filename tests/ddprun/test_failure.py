#!/usr/bin/env python3
"""A failing or killed worker stops the whole job; nothing is left behind."""
import os
import re
import signal
import socket
import time

import ddprun_testlib as T


class FailureTest(T.DdprunTestCase):
    def failing_job(self, nproc, grace, **env):
        pid_dir = os.path.join(self.tmp, "pids")
        os.mkdir(pid_dir)
        args = ["--nproc-per-node", str(nproc), "--grace-period", str(grace), "--",
                T.worker("fail_or_sleep.sh")]
        rc, out, err, _ = T.run(args, self.env(PID_DIR=pid_dir, **env), timeout=90)
        end = time.time()
        return rc, out, err, end, pid_dir

    def check_all_dead(self, pid_dir):
        pids = T.read_pids(pid_dir)
        self.assertTrue(pids)
        alive = {name: pid for name, pid in pids.items() if T.pid_alive(pid)}
        self.assertEqual(alive, {}, "workers or grandchildren still running")
        self.assert_no_survivors(1.0)

    def test_exit_code_3_stops_others_within_grace(self):
        # Rank 2 ignores SIGTERM, so ddprun must SIGKILL it once the grace period ends.
        grace = 2.0
        rc, out, err, end, pid_dir = self.failing_job(
            3, grace, FAIL_RANK=1, FAIL_CODE=3, FAIL_LINES=12, IGNORE_TERM_RANKS="2")
        self.assertEqual(rc, 3, err)
        with open(os.path.join(pid_dir, "fail_time")) as f:
            failed_at = float(f.read())
        took = end - failed_at
        self.assertGreaterEqual(took, grace - 0.3, "SIGKILL came before the grace period ended")
        self.assertLess(took, grace + 1 + 1.5, "ddprun took too long to stop the job")
        self.check_all_dead(pid_dir)
        pids = T.read_pids(pid_dir)
        self.assertIn("rank       : 1 (local_rank 1, node_rank 0)", err)
        self.assertIn("cause      : exit code 3", err)
        self.assertIn("pid        : %d" % pids["rank1"], err)
        self.assertIn("host       : %s" % socket.gethostname(), err)
        self.assertIn("then SIGKILL after the 2 s grace period", err)
        self.assertIn("ddprun exits with code 3", err)
        summary = err[err.index("first failure:"):]
        for i in range(3, 13):  # the last 10 of 12 stderr lines
            self.assertIn("  rank 1 error line %d\n" % i, summary)
        self.assertNotIn("rank 1 error line 2\n", summary)
        for r in range(3):
            self.assertIn("[rank %d]: rank %d is up" % (r, r), out)

    def test_sigterm_is_enough_without_waiting_for_grace(self):
        rc, out, err, end, pid_dir = self.failing_job(2, 30, FAIL_RANK=0, FAIL_CODE=9)
        self.assertEqual(rc, 9, err)
        with open(os.path.join(pid_dir, "fail_time")) as f:
            took = end - float(f.read())
        self.assertLess(took, 2.5, "ddprun waited for the grace period although SIGTERM worked")
        self.check_all_dead(pid_dir)
        self.assertNotIn("SIGKILL", err)

    def test_kill_9_of_one_worker(self):
        pid_dir = os.path.join(self.tmp, "pids")
        os.mkdir(pid_dir)
        p = T.start(["--nproc-per-node", "3", "--grace-period", "3", "--",
                     T.worker("fail_or_sleep.sh")], self.env(PID_DIR=pid_dir, ESCAPE=1))
        try:
            self.assertTrue(T.wait_for(lambda: len(T.read_pids(pid_dir)) == 12, 30),
                            "workers did not start")
            victim = T.read_pids(pid_dir)["rank1"]
            os.kill(victim, signal.SIGKILL)
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        self.assertEqual(p.returncode, 137, err)
        self.assertIn("rank 1 (pid %d on %s) failed with signal SIGKILL (9)"
                      % (victim, socket.gethostname()), err)
        self.assertIn("rank       : 1 (local_rank 1, node_rank 0)", err)
        self.assertIn("cause      : signal SIGKILL (9)", err)
        self.assertIn("pid        : %d" % victim, err)
        self.check_all_dead(pid_dir)

    def test_success_cleans_background_grandchildren(self):
        pid_dir = os.path.join(self.tmp, "pids")
        os.mkdir(pid_dir)
        script = ('sleep 1000 & echo $! > "$PID_DIR/bg$RANK.pid"; '
                  'setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "$PID_DIR/esc$RANK.pid"; '
                  'echo "rank $RANK done"')
        rc, out, err, _ = T.run(["--nproc-per-node", "2", "--grace-period", "2", "--",
                                 "bash", "-c", script], self.env(PID_DIR=pid_dir), timeout=60)
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(re.findall(r"^\[rank (\d)\]: rank \1 done$", out, re.M)), ["0", "1"])
        self.assertEqual(len(T.read_pids(pid_dir)), 4)
        self.check_all_dead(pid_dir)
        self.assertNotIn("FAILED", err)

    def test_all_succeed_exit_0(self):
        rc, out, err, _ = T.run(["--nproc-per-node", "3", "--", "bash", "-c", "exit 0"], self.env())
        self.assertEqual(rc, 0, err)
        self.assertNotIn("FAILED", err)

    def test_worker_killed_by_its_own_signal(self):
        rc, out, err, _ = T.run(["--nproc-per-node", "2", "--", "bash", "-c",
                                 '[ "$RANK" = 1 ] && kill -SEGV $$; sleep 100'], self.env())
        self.assertEqual(rc, 128 + signal.SIGSEGV, err)
        self.assertIn("cause      : signal SIGSEGV (11)", err)


if __name__ == "__main__":
    T.main()
