#!/usr/bin/env python3
"""Bad options and unrunnable programs are reported before anything is spawned."""
import os
import stat

import ddprun_testlib as T


class ErrorTest(T.DdprunTestCase):
    def setUp(self):
        super().setUp()
        # A worker that leaves a file behind, to prove nothing was spawned.
        self.touch = os.path.join(self.tmp, "spawned")
        self.worker = ["bash", "-c", 'touch "$SPAWN_FILE"']

    def check_error(self, args, code, *texts):
        rc, out, err, _ = T.run(args, self.env(SPAWN_FILE=self.touch), timeout=30)
        self.assertEqual(rc, code, "stdout:\n%s\nstderr:\n%s" % (out, err))
        for text in texts:
            self.assertIn(text, err)
        self.assertFalse(os.path.exists(self.touch), "a worker was spawned")
        self.assertNotIn("[rank", out + err)
        return err

    def test_missing_program(self):
        err = self.check_error(["--nproc-per-node", "2", "--", "no-such-program-ddprun-test", "x"], 127,
                               "'no-such-program-ddprun-test' was not found in PATH",
                               "No worker was started")
        self.assertEqual(err.count("\n"), 1, "one clear line expected:\n" + err)

    def test_missing_program_path(self):
        self.check_error(["--", os.path.join(self.tmp, "nope.sh")], 127,
                         "nope.sh': No such file or directory")

    def test_not_executable(self):
        path = os.path.join(self.tmp, "plain.sh")
        with open(path, "w") as f:
            f.write("#!/bin/sh\ntouch \"$SPAWN_FILE\"\n")
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)  # no x bit: even root may not run it
        self.check_error(["--", path], 126, "Permission denied")

    def test_bad_nproc(self):
        for value in ["0", "abc", "-1", "2x", ""]:
            with self.subTest(value=value):
                self.check_error(["--nproc-per-node", value] + ["--"] + self.worker, 2,
                                 "--nproc-per-node expects a whole number from 1 to 4096, or one of "
                                 "auto, cpu, gpu; got '%s'" % value,
                                 "Run 'ddprun --help'")

    def test_underscore_alias_checked_too(self):
        self.check_error(["--nproc_per_node=0", "--"] + self.worker, 2, "got '0'")

    def test_bad_numbers(self):
        cases = [
            (["--nnodes", "0"], "--nnodes expects a whole number from 1 to 65536; got '0'"),
            (["--max-restarts", "-2"], "--max-restarts expects a whole number from 0"),
            (["--grace-period", "soon"], "--grace-period expects a number of seconds >= 0; got 'soon'"),
            (["--monitor-interval", "0"], "--monitor-interval expects a number of seconds > 0"),
            (["--master-port", "70000"], "--master-port expects a whole number from 0 to 65535"),
            (["--redirect", "4"], "--redirect expects a whole number from 0 to 3; got '4'"),
            (["--tee", "x"], "Use 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"),
            (["--run-id", "a b"], "--run-id must not hold spaces"),
        ]
        for flags, text in cases:
            with self.subTest(flags=flags):
                self.check_error(flags + ["--"] + self.worker, 2, text)

    def test_unknown_flag(self):
        self.check_error(["--bogus-flag", "1", "--"] + self.worker, 2, "--bogus-flag")

    def test_no_program(self):
        self.check_error(["--nproc-per-node", "2"], 2, "no worker program given")
        self.check_error(["--nproc-per-node", "2", "--"], 2, "no worker program given")

    def test_node_rank_out_of_range(self):
        self.check_error(["--nnodes", "2", "--node-rank", "2", "--"] + self.worker, 2,
                         "--node-rank 2 is out of range for --nnodes 2: expected 0 <= node-rank < nnodes",
                         "from 0 to 1")
        self.check_error(["--node_rank", "1", "--"] + self.worker, 2,
                         "--node-rank 1 is out of range for --nnodes 1")

    def test_standalone_with_nnodes(self):
        self.check_error(["--standalone", "--nnodes", "2", "--"] + self.worker, 2,
                         "--standalone runs one host")

    def test_gpu_without_gpus(self):
        if any(n.startswith("nvidia") and n[6:].isdigit() for n in os.listdir("/dev")):
            self.skipTest("this host has GPUs")
        rc, out, err, _ = T.run(["--nproc-per-node", "gpu", "--"] + self.worker,
                                self.env(SPAWN_FILE=self.touch), timeout=30)
        self.assertEqual(rc, 2, err)
        self.assertIn("--nproc-per-node gpu: no GPU found on this host", err)
        self.assertFalse(os.path.exists(self.touch))

    def test_help_shows_defaults(self):
        rc, out, err, _ = T.run(["--help"], timeout=30)
        self.assertEqual(rc, 0, err)
        for text in ["--nproc-per-node,--nproc_per_node N|auto|cpu|gpu=1", "--nnodes N=1",
                     "--node-rank,--node_rank N=0", "ADDR=127.0.0.1", "--master-port,--master_port PORT=0",
                     "--max-restarts,--max_restarts N=0", "SECONDS=0.1", "--grace-period,--grace_period SECONDS=5",
                     "--rdzv-timeout,--rdzv_timeout SECONDS=300", "--log-dir,--log_dir DIR=none",
                     "--redirects 0-3=0", "--tee 0-3=0", "--standalone", "--no-prefix,--no_prefix",
                     "--run-id,--run_id ID=random", "[default: off]"]:
            self.assertIn(text, out)

    def test_program_flags_are_not_ddprun_flags(self):
        out_dir = os.path.join(self.tmp, "env")
        os.mkdir(out_dir)
        import json
        import sys
        rc, out, err, _ = T.run(["--nproc-per-node", "1", sys.executable, T.worker("dump_env.py"),
                                 out_dir, "--nproc-per-node", "5", "--", "-x"], self.env())
        self.assertEqual(rc, 0, err)
        with open(os.path.join(out_dir, "rank0.attempt0.json")) as f:
            self.assertEqual(json.load(f)["argv"], ["--nproc-per-node", "5", "--", "-x"])


if __name__ == "__main__":
    T.main()
