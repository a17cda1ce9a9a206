#!/usr/bin/env python3
"""The flight recorder folder (Note [Flight recorder]): ddprun makes one per attempt unless
DDP_FLIGHT_RECORDER_DIR is set, keeps it only when a failure left files in it, and lists
those files in the failure summary."""
import os
import re

import ddprun_testlib as T

SUMMARY = "flight recorder (the last collectives of each rank that wrote one):"


class FlightRecorderTest(T.DdprunTestCase):
    def run_job(self, nproc=2, max_restarts=0, flight_dir=None, **env):
        """Runs workers/flight_recorder.sh: (rc, err, {(rank, attempt): (dir, state)})."""
        count_file = os.path.join(self.tmp, "runs.txt")
        tmpdir = os.path.join(self.tmp, "tmpdir")
        os.makedirs(tmpdir, exist_ok=True)
        environment = self.env(COUNT_FILE=count_file, TMPDIR=tmpdir, **env)
        environment.pop("DDP_FLIGHT_RECORDER_DIR", None)
        if flight_dir is not None:
            environment["DDP_FLIGHT_RECORDER_DIR"] = flight_dir
        rc, out, err, _ = T.run(["--nproc-per-node", str(nproc), "--max-restarts",
                                 str(max_restarts), "--run-id", "fr-job", "--grace-period", "3",
                                 "--", T.worker("flight_recorder.sh")], environment, timeout=90)
        runs = {}
        with open(count_file) as f:
            for line in f.read().splitlines():
                rank, attempt, d, state = line.split()
                runs[(int(rank), int(attempt))] = (d, state)
        return rc, err, runs

    def attempt_dir(self, runs, attempt):
        """The one folder every rank of `attempt` was given, which existed while they ran."""
        seen = {v for (_, a), v in runs.items() if a == attempt}
        self.assertEqual(len(seen), 1, "ranks of attempt %d saw different folders: %r"
                         % (attempt, runs))
        d, state = seen.pop()
        self.assertEqual(state, "dir", "the flight recorder folder %s did not exist" % d)
        return d

    def check_own(self, d, attempt):
        name = os.path.basename(d)
        self.assertTrue(re.fullmatch(r"ddprun-flight-fr-job-%d-\w{6}" % attempt, name), d)
        self.assertEqual(os.path.dirname(d), os.path.join(self.tmp, "tmpdir"))

    def test_own_folder_removed_after_success(self):
        rc, err, runs = self.run_job(nproc=2)
        self.assertEqual(rc, 0, err)
        d = self.attempt_dir(runs, 0)
        self.check_own(d, 0)
        self.assertFalse(os.path.exists(d), "flight recorder folder %s left behind" % d)
        self.assertNotIn(SUMMARY, err)

    def test_own_folder_kept_when_the_failure_left_files(self):
        rc, err, runs = self.run_job(nproc=3, FAIL_RANK=1, WRITE_RANKS="0 2")
        self.assertEqual(rc, 3, err)
        d = self.attempt_dir(runs, 0)
        self.check_own(d, 0)
        self.assertEqual(sorted(os.listdir(d)),
                         ["flight_recorder.rank0.json", "flight_recorder.rank2.json"])
        summary = err[err.index("first failure:"):]
        self.assertIn(SUMMARY + "\n  %s/flight_recorder.rank0.json\n"
                      "  %s/flight_recorder.rank2.json\n" % (d, d), summary)
        self.assertIn("line them up: python3 tools/flight_recorder.py %s\n" % d, summary)

    def test_own_folder_removed_when_the_failure_left_none(self):
        rc, err, runs = self.run_job(nproc=2, FAIL_RANK=1)
        self.assertEqual(rc, 3, err)
        d = self.attempt_dir(runs, 0)
        self.check_own(d, 0)
        self.assertFalse(os.path.exists(d), "empty flight recorder folder %s left behind" % d)
        self.assertNotIn(SUMMARY, err)

    def test_dumps_without_collectives_are_left_out(self):
        # A rank that stopped before its first collective writes a dump with no entries at
        # shutdown: nothing to line up, so the summary leaves it out ...
        rc, err, runs = self.run_job(nproc=3, FAIL_RANK=1, WRITE_RANKS="0", EMPTY_RANKS="1 2")
        self.assertEqual(rc, 3, err)
        d = self.attempt_dir(runs, 0)
        summary = err[err.index("first failure:"):]
        self.assertIn(SUMMARY + "\n  %s/flight_recorder.rank0.json\n  line them up" % d, summary)

    def test_only_dumps_without_collectives_leave_no_folder(self):
        rc, err, runs = self.run_job(nproc=2, FAIL_RANK=1, EMPTY_RANKS="0 1")
        self.assertEqual(rc, 3, err)
        d = self.attempt_dir(runs, 0)
        self.assertNotIn(SUMMARY, err)
        self.assertFalse(os.path.exists(d), "flight recorder folder %s left behind" % d)

    def test_one_folder_per_attempt(self):
        # Attempt 0 fails with files (kept); attempt 1 succeeds (its folder removed).
        rc, err, runs = self.run_job(nproc=2, max_restarts=1, FAIL_RANK=1, WRITE_RANKS="1",
                                     SUCCEED_FROM=1)
        self.assertEqual(rc, 0, err)
        first, second = self.attempt_dir(runs, 0), self.attempt_dir(runs, 1)
        self.check_own(first, 0)
        self.check_own(second, 1)
        self.assertEqual(os.listdir(first), ["flight_recorder.rank1.json"])
        self.assertFalse(os.path.exists(second), "flight recorder folder %s left behind" % second)

    def test_empty_variable_counts_as_unset(self):
        rc, err, runs = self.run_job(nproc=2, flight_dir="")
        self.assertEqual(rc, 0, err)
        d = self.attempt_dir(runs, 0)
        self.check_own(d, 0)
        self.assertFalse(os.path.exists(d), "flight recorder folder %s left behind" % d)

    def test_users_folder_is_passed_on_and_kept(self):
        mine = os.path.join(self.tmp, "mine")
        os.mkdir(mine)
        rc, err, runs = self.run_job(nproc=2, flight_dir=mine, FAIL_RANK=0, WRITE_RANKS="1",
                                     max_restarts=1, SUCCEED_FROM=1)
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.attempt_dir(runs, 0), mine)
        self.assertEqual(self.attempt_dir(runs, 1), mine)
        self.assertEqual(os.listdir(mine), ["flight_recorder.rank1.json"])
        self.assertEqual(os.listdir(os.path.join(self.tmp, "tmpdir")), [],
                         "ddprun made a flight recorder folder of its own")

    def test_users_folder_in_the_failure_summary(self):
        mine = os.path.join(self.tmp, "mine")
        os.mkdir(mine)
        rc, err, runs = self.run_job(nproc=2, flight_dir=mine, FAIL_RANK=0, WRITE_RANKS="0 1")
        self.assertEqual(rc, 3, err)
        self.assertEqual(self.attempt_dir(runs, 0), mine)
        summary = err[err.index("first failure:"):]
        self.assertIn(SUMMARY + "\n  %s/flight_recorder.rank0.json\n"
                      "  %s/flight_recorder.rank1.json\n" % (mine, mine), summary)
        self.assertIn("line them up: python3 tools/flight_recorder.py %s\n" % mine, summary)
        self.assertEqual(sorted(os.listdir(mine)),
                         ["flight_recorder.rank0.json", "flight_recorder.rank1.json"])


if __name__ == "__main__":
    T.main()
