#!/usr/bin/env python3
"""--log-dir, --redirect and --tee write <log-dir>/<restart>/rank<N>/{stdout,stderr}.log."""
import glob
import os
import re
import shutil

import ddprun_testlib as T

SCRIPT = 'echo "out of $RANK"; echo "err of $RANK" >&2'


def read(path):
    with open(path) as f:
        return f.read()


class LogTest(T.DdprunTestCase):
    def run_logged(self, flags, script=SCRIPT, nproc=2):
        rc, out, err, _ = T.run(flags + ["--nproc-per-node", str(nproc), "--", "bash", "-c", script],
                                self.env(OMP_NUM_THREADS=1))
        self.assertEqual(rc, 0, err)
        return out, err

    def test_redirect_3_files_only(self):
        logs = os.path.join(self.tmp, "logs")
        out, err = self.run_logged(["--log-dir", logs, "--redirect", "3"])
        self.assertNotIn("of 0", out + err)
        self.assertNotIn("of 1", out + err)
        for r in range(2):
            self.assertEqual(read(os.path.join(logs, "0", "rank%d" % r, "stdout.log")), "out of %d\n" % r)
            self.assertEqual(read(os.path.join(logs, "0", "rank%d" % r, "stderr.log")), "err of %d\n" % r)

    def test_tee_1_stdout_to_both(self):
        logs = os.path.join(self.tmp, "logs")
        out, err = self.run_logged(["--log_dir", logs, "--tee", "1"])
        self.assertIn("[rank 1]: out of 1\n", out)
        self.assertIn("[rank 1]: err of 1\n", err)
        self.assertEqual(read(os.path.join(logs, "0", "rank1", "stdout.log")), "out of 1\n")
        self.assertFalse(os.path.exists(os.path.join(logs, "0", "rank1", "stderr.log")))

    def test_redirect_2_tee_1(self):
        logs = os.path.join(self.tmp, "logs")
        out, err = self.run_logged(["--log-dir", logs, "--redirects", "2", "-t", "1"])
        self.assertIn("[rank 0]: out of 0\n", out)
        self.assertNotIn("err of", err)
        self.assertEqual(read(os.path.join(logs, "0", "rank0", "stdout.log")), "out of 0\n")
        self.assertEqual(read(os.path.join(logs, "0", "rank0", "stderr.log")), "err of 0\n")

    def test_log_dir_alone_tees_both(self):
        logs = os.path.join(self.tmp, "logs")
        out, err = self.run_logged(["--log-dir", logs])
        self.assertIn("[rank 0]: out of 0\n", out)
        self.assertIn("[rank 0]: err of 0\n", err)
        self.assertEqual(sorted(os.path.relpath(p, logs) for p in glob.glob(logs + "/*/*/*.log")),
                         ["0/rank0/stderr.log", "0/rank0/stdout.log",
                          "0/rank1/stderr.log", "0/rank1/stdout.log"])

    def test_redirect_without_log_dir_uses_temp_folder(self):
        out, err = self.run_logged(["--redirect", "1"], nproc=1)
        m = re.search(r"writing worker logs under (\S+)", err)
        self.assertIsNotNone(m, err)
        try:
            self.assertEqual(read(os.path.join(m.group(1), "0", "rank0", "stdout.log")), "out of 0\n")
        finally:
            shutil.rmtree(m.group(1), ignore_errors=True)

    def test_restarts_get_their_own_folders(self):
        logs = os.path.join(self.tmp, "logs")
        script = 'echo "try $TORCHELASTIC_RESTART_COUNT"; [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] || exit 1'
        rc, out, err, _ = T.run(["--log-dir", logs, "--redirect", "3", "--max-restarts", "1", "--",
                                 "bash", "-c", script], self.env(OMP_NUM_THREADS=1))
        self.assertEqual(rc, 0, err)
        self.assertEqual(read(os.path.join(logs, "0", "rank0", "stdout.log")), "try 0\n")
        self.assertEqual(read(os.path.join(logs, "1", "rank0", "stdout.log")), "try 1\n")

    def test_failure_summary_points_to_log(self):
        logs = os.path.join(self.tmp, "logs")
        rc, out, err, _ = T.run(["--log-dir", logs, "--redirect", "2", "--", "bash", "-c",
                                 'echo "bad thing" >&2; exit 4'], self.env(OMP_NUM_THREADS=1))
        self.assertEqual(rc, 4, err)
        self.assertIn("full stderr: %s/0/rank0/stderr.log" % logs, err)
        self.assertIn("  bad thing\n", err)  # the summary still shows the last lines


if __name__ == "__main__":
    T.main()
