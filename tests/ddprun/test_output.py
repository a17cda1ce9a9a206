#!/usr/bin/env python3
"""Worker output reaches ddprun's stdout/stderr as whole, prefixed lines."""
import os
import re
import sys

import ddprun_testlib as T

sys.path.insert(0, T.WORKERS)
from chatter import expected_line  # noqa: E402

LINE = re.compile(r"^\[rank (\d+)\]: (.*)$")


class OutputTest(T.DdprunTestCase):
    def check_stream(self, text, stream, nproc, count, prefixed=True):
        self.assertTrue(text.endswith("\n"))
        next_index = [0] * nproc
        for n, line in enumerate(text.split("\n")[:-1]):
            if not prefixed:
                m = re.match(r"^r(\d+) ", line)
                self.assertIsNotNone(m, "torn or foreign line %d: %r" % (n, line[:200]))
                rank, content = int(m.group(1)), line
            else:
                m = LINE.match(line)
                if m is None and stream == "err" and line.startswith("ddprun: "):
                    continue  # ddprun's own notes
                self.assertIsNotNone(m, "line %d has no [rank N]: prefix: %r" % (n, line[:200]))
                rank, content = int(m.group(1)), m.group(2)
            self.assertLess(rank, nproc)
            i = next_index[rank]
            self.assertLess(i, count, "extra line for rank %d" % rank)
            want = expected_line(rank, stream, i)
            if content != want:
                self.fail("line %d (rank %d, #%d) torn or wrong:\n got %r\nwant %r"
                          % (n, rank, i, content[:300], want[:300]))
            next_index[rank] += 1
        self.assertEqual(next_index, [count] * nproc, "missing lines")

    def test_heavy_concurrent_printing(self):
        nproc, n_out, n_err = 4, 20000, 5000
        rc, out, err, _ = T.run(["--nproc-per-node", str(nproc), "--", sys.executable,
                                 T.worker("chatter.py"), str(n_out), str(n_err)],
                                self.env(OMP_NUM_THREADS=1), timeout=240)
        self.assertEqual(rc, 0, err[-2000:])
        self.check_stream(out, "out", nproc, n_out)
        self.check_stream(err, "err", nproc, n_err)
        self.assertGreater(max(len(l) for l in out.split("\n")), 4096)

    def test_no_prefix_keeps_lines_whole(self):
        nproc, n_out, n_err = 3, 5000, 1000
        rc, out, err, _ = T.run(["--no-prefix", "--nproc-per-node", str(nproc), "--", sys.executable,
                                 T.worker("chatter.py"), str(n_out), str(n_err)],
                                self.env(OMP_NUM_THREADS=1), timeout=240)
        self.assertEqual(rc, 0, err[-2000:])
        self.check_stream(out, "out", nproc, n_out, prefixed=False)
        self.assertNotIn("[rank", out)

    def test_partial_last_line_gets_newline(self):
        rc, out, err, _ = T.run(["--nproc-per-node", "2", "--", "bash", "-c",
                                 'printf "a\\nb-$RANK"; printf "e-$RANK" >&2'],
                                self.env(OMP_NUM_THREADS=1))
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(out.splitlines()),
                         ["[rank 0]: a", "[rank 0]: b-0", "[rank 1]: a", "[rank 1]: b-1"])
        self.assertTrue(out.endswith("\n"))
        self.assertIn("[rank 0]: e-0\n", err)
        self.assertIn("[rank 1]: e-1\n", err)

    def test_streams_stay_apart_and_empty_lines_kept(self):
        rc, out, err, _ = T.run(["--", "bash", "-c", 'echo out; echo; echo err >&2'],
                                self.env(OMP_NUM_THREADS=1))
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "[rank 0]: out\n[rank 0]: \n")
        self.assertEqual(err, "[rank 0]: err\n")

    def test_stdin_is_dev_null(self):
        out_dir = os.path.join(self.tmp, "env")
        os.mkdir(out_dir)
        rc, out, err, _ = T.run(["--", sys.executable, T.worker("dump_env.py"), out_dir],
                                self.env(OMP_NUM_THREADS=1))
        self.assertEqual(rc, 0, err)
        import json
        with open(os.path.join(out_dir, "rank0.attempt0.json")) as f:
            self.assertTrue(json.load(f)["stdin_is_devnull"])


if __name__ == "__main__":
    T.main()
