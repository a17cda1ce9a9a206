#!/usr/bin/env python3
"""--max-restarts restarts all workers after a failure, with a new restart count."""
import collections
import os

import ddprun_testlib as T


class RestartTest(T.DdprunTestCase):
    def run_job(self, succeed_from, fail_code=5, max_restarts=2, nproc=2):
        count_file = os.path.join(self.tmp, "runs.txt")
        rc, out, err, _ = T.run(["--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
                                 "--grace-period", "3", "--", T.worker("count_runs.sh")],
                                self.env(COUNT_FILE=count_file, SUCCEED_FROM=succeed_from,
                                         FAIL_CODE=fail_code), timeout=120)
        with open(count_file) as f:
            runs = [line.split() for line in f.read().splitlines()]
        return rc, out, err, runs

    def test_succeeds_on_third_attempt(self):
        rc, out, err, runs = self.run_job(succeed_from=2)
        self.assertEqual(rc, 0, err)
        attempts = collections.defaultdict(list)
        for rank, attempt, _ in runs:
            attempts[int(rank)].append(int(attempt))
        self.assertEqual({r: sorted(a) for r, a in attempts.items()}, {0: [0, 1, 2], 1: [0, 1, 2]})
        self.assertIn("restarting all workers (restart 1 of 2)", err)
        self.assertIn("restarting all workers (restart 2 of 2)", err)
        self.assertNotIn("restart 3", err)
        self.assertNotIn("FAILED", err)
        for attempt in range(3):
            self.assertIn("[rank 1]: rank 1 attempt %d" % attempt, out)
        # Each attempt gets its own private rendezvous folder, removed afterwards.
        dirs = {(int(a), d) for _, a, d in runs}
        self.assertEqual(len({d for _, d in dirs}), 3, dirs)
        self.assertEqual(len(dirs), 3, "ranks of one attempt saw different folders: %r" % dirs)
        for _, d in dirs:
            self.assertFalse(os.path.exists(d), "rendezvous folder %s left behind" % d)

    def test_always_failing_gives_worker_code_after_restarts(self):
        rc, out, err, runs = self.run_job(succeed_from="never", fail_code=7)
        self.assertEqual(rc, 7, err)
        self.assertEqual(sorted(int(a) for r, a, _ in runs if r == "1"), [0, 1, 2])
        self.assertEqual(err.count("restarting all workers"), 2)
        self.assertIn("restarts   : 2 of --max-restarts 2 used", err)
        self.assertIn("cause      : exit code 7", err)
        self.assertIn("rank 1 fails in attempt 2", err[err.index("first failure:"):])
        self.assert_no_survivors(1.0)

    def test_no_restart_by_default(self):
        count_file = os.path.join(self.tmp, "runs.txt")
        rc, out, err, _ = T.run(["--nproc-per-node", "2", "--", T.worker("count_runs.sh")],
                                self.env(COUNT_FILE=count_file, SUCCEED_FROM=1, FAIL_CODE=4))
        self.assertEqual(rc, 4, err)
        with open(count_file) as f:
            self.assertEqual(len(f.read().splitlines()), 2)
        self.assertNotIn("restarting", err)


if __name__ == "__main__":
    T.main()
