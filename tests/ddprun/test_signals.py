#!/usr/bin/env python3
"""SIGINT/SIGTERM sent to ddprun reach every worker's process group."""
import os
import signal
import time

import ddprun_testlib as T


class SignalTest(T.DdprunTestCase):
    def start_job(self, nproc, grace, **env):
        self.pid_dir = os.path.join(self.tmp, "pids")
        os.mkdir(self.pid_dir)
        p = T.start(["--nproc-per-node", str(nproc), "--grace-period", str(grace), "--",
                     T.worker("on_signal.sh")], self.env(PID_DIR=self.pid_dir, **env))
        ready = lambda: all(os.path.exists(os.path.join(self.pid_dir, "ready.%d" % r))
                            for r in range(nproc))
        if not T.wait_for(ready, 30):
            p.kill()
            p.communicate()
            self.fail("workers did not get ready")
        return p

    def output_of(self, p, timeout=60):
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        return out, err

    def test_sigint_forwarded_exit_130(self):
        p = self.start_job(2, 20)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = self.output_of(p)
        self.assertEqual(p.returncode, 130, err)
        self.assertLess(time.monotonic() - t0, 10, "ddprun waited for the grace period")
        for r in range(2):
            self.assertTrue(os.path.exists(os.path.join(self.pid_dir, "INT.%d" % r)),
                            "rank %d did not get SIGINT\n%s" % (r, err))
            self.assertFalse(os.path.exists(os.path.join(self.pid_dir, "TERM.%d" % r)))
        self.assertIn("got SIGINT; passing it to the workers", err)
        self.assertIn("stopped by SIGINT; exit code 130", err)
        self.assertNotIn("FAILED", err)
        self.assert_no_survivors(1.0)

    def test_sigterm_forwarded_exit_143(self):
        p = self.start_job(3, 20)
        p.send_signal(signal.SIGTERM)
        out, err = self.output_of(p)
        self.assertEqual(p.returncode, 143, err)
        for r in range(3):
            self.assertTrue(os.path.exists(os.path.join(self.pid_dir, "TERM.%d" % r)), err)
        self.assert_no_survivors(1.0)

    def test_second_sigint_kills_at_once(self):
        # The workers ignore SIGINT; only the second SIGINT's SIGKILL ends them,
        # long before the 60 s grace period.
        p = self.start_job(2, 60, IGNORE_INT=1)
        p.send_signal(signal.SIGINT)
        # Wait until ddprun has handled the first SIGINT, so the second is not merged
        # into it.
        seen = T.read_until(p, "got SIGINT; passing it to the workers", 30)
        self.assertIn("got SIGINT; passing it to the workers", seen)
        self.assertIsNone(p.poll(), "ddprun exited although the workers ignore SIGINT")
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = self.output_of(p, timeout=30)
        err = seen + err
        self.assertEqual(p.returncode, 130, err)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertIn("got SIGINT again; killing the workers", err)
        self.assert_no_survivors(1.0)

    def test_sigint_grace_then_sigkill(self):
        p = self.start_job(2, 1.5, IGNORE_INT=1)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = self.output_of(p, timeout=30)
        took = time.monotonic() - t0
        self.assertEqual(p.returncode, 130, err)
        self.assertGreaterEqual(took, 1.3)
        self.assertLess(took, 1.5 + 3)
        self.assert_no_survivors(1.0)


if __name__ == "__main__":
    T.main()
