#!/usr/bin/env python3
"""The environment each worker sees, for several layouts."""
import glob
import json
import os
import subprocess
import sys

import ddprun_testlib as T


def has_gpu_nodes():
    return bool(glob.glob("/dev/nvidia[0-9]*"))


class EnvTest(T.DdprunTestCase):
    def launch(self, flags, env=None, expect_rc=0, timeout=60):
        out_dir = os.path.join(self.tmp, "env%d" % len(os.listdir(self.tmp)))
        os.mkdir(out_dir)
        rc, out, err, _ = T.run(flags + ["--", sys.executable, T.worker("dump_env.py"), out_dir],
                                env or self.env(), timeout=timeout)
        self.assertEqual(rc, expect_rc, err)
        return self.load(out_dir), out, err

    @staticmethod
    def load(out_dir):
        infos = {}
        for path in glob.glob(os.path.join(out_dir, "rank*.json")):
            with open(path) as f:
                info = json.load(f)
            infos[int(info["RANK"])] = info
        return infos

    def check_layout(self, infos, world, local, node_rank=0, nnodes=1):
        ranks = [node_rank * local + i for i in range(local)]
        self.assertEqual(sorted(infos), ranks)
        for rank, e in infos.items():
            self.assertEqual(e["LOCAL_RANK"], str(rank - node_rank * local))
            self.assertEqual(e["WORLD_SIZE"], str(world))
            self.assertEqual(e["LOCAL_WORLD_SIZE"], str(local))
            self.assertEqual(e["GROUP_RANK"], str(node_rank))
            self.assertEqual(e["GROUP_WORLD_SIZE"], str(nnodes))
            self.assertEqual(e["ROLE_RANK"], str(rank))
            self.assertEqual(e["ROLE_WORLD_SIZE"], str(world))
            self.assertEqual(e["TORCHELASTIC_RESTART_COUNT"], "0")
            self.assertEqual(e["TORCHELASTIC_MAX_RESTARTS"], "0")
            self.assertTrue(e["TORCHELASTIC_RUN_ID"])
            self.assertEqual(e["DDP_RUN_ID"], e["TORCHELASTIC_RUN_ID"])
            self.assertEqual(e["DDPRUN_TEST_MARKER"], self.marker)
            self.assertEqual(e["pgid"], e["pid"], "a worker must lead its own process group")
        self.assertEqual(len({e["TORCHELASTIC_RUN_ID"] for e in infos.values()}), 1)
        self.assertEqual(len({e["MASTER_PORT"] for e in infos.values()}), 1)

    def check_single_host(self, infos):
        dirs = {e["DDP_RENDEZVOUS_DIR"] for e in infos.values()}
        self.assertEqual(len(dirs), 1, "all ranks share one rendezvous folder")
        for e in infos.values():
            self.assertTrue(e["rdzv_is_dir"])
            self.assertEqual(e["rdzv_mode"], 0o700)
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.1")
            self.assertGreater(int(e["MASTER_PORT"]), 0)
        self.assertFalse(os.path.exists(dirs.pop()), "rendezvous folder not removed")

    def test_one_process(self):
        infos, out, err = self.launch([])
        self.check_layout(infos, 1, 1)
        self.check_single_host(infos)
        self.assertIn("[rank 0]: rank 0 wrote", out)

    def test_three_processes(self):
        infos, out, err = self.launch(["--nproc-per-node", "3"])
        self.check_layout(infos, 3, 3)
        self.check_single_host(infos)
        self.assertEqual(len({e["pgid"] for e in infos.values()}), 3)

    def test_random_run_ids_differ(self):
        a, _, _ = self.launch(["--nproc_per_node", "2"])
        b, _, _ = self.launch(["--nproc_per_node", "2"])
        self.assertNotEqual(a[0]["TORCHELASTIC_RUN_ID"], b[0]["TORCHELASTIC_RUN_ID"])

    def test_given_values(self):
        infos, _, _ = self.launch(["--nproc-per-node", "2", "--master-addr", "localhost",
                                   "--master-port", "23456", "--run-id", "job-7", "--max-restarts", "3"])
        for e in infos.values():
            self.assertEqual(e["MASTER_ADDR"], "localhost")
            self.assertEqual(e["MASTER_PORT"], "23456")
            self.assertEqual(e["TORCHELASTIC_RUN_ID"], "job-7")
            self.assertEqual(e["DDP_RUN_ID"], "job-7")
            self.assertEqual(e["TORCHELASTIC_MAX_RESTARTS"], "3")

    def test_standalone(self):
        infos, _, _ = self.launch(["--standalone", "--nproc-per-node", "2", "--master-addr", "10.9.9.9"])
        self.check_layout(infos, 2, 2)
        self.check_single_host(infos)

    def test_nproc_cpu_and_auto(self):
        infos, _, _ = self.launch(["--nproc-per-node", "cpu"])
        self.assertEqual(len(infos), os.cpu_count())
        if has_gpu_nodes():
            self.skipTest("GPU device nodes present; auto depends on them")
        infos, _, _ = self.launch(["--nproc-per-node", "auto"])
        self.assertEqual(len(infos), 1)
        infos, _, _ = self.launch(["--nproc-per-node", "auto"], self.env(CUDA_VISIBLE_DEVICES="0,1"))
        self.assertEqual(len(infos), 2)
        infos, _, _ = self.launch(["--nproc-per-node", "gpu"], self.env(CUDA_VISIBLE_DEVICES="3,4,5"))
        self.assertEqual(len(infos), 3)

    def test_omp_num_threads_default(self):
        cores = len(os.sched_getaffinity(0))
        infos, _, err = self.launch(["--nproc-per-node", "2"])
        want = str(max(1, cores // 2))
        self.assertEqual({e["OMP_NUM_THREADS"] for e in infos.values()}, {want})
        self.assertEqual(err.count("OMP_NUM_THREADS is not set"), 1, err)
        self.assertIn("OMP_NUM_THREADS=%s" % want, err)
        infos, _, err = self.launch(["--nproc-per-node", "%d" % (cores + 1)])
        self.assertEqual({e["OMP_NUM_THREADS"] for e in infos.values()}, {"1"})

    def test_omp_num_threads_kept(self):
        infos, _, err = self.launch(["--nproc-per-node", "2"], self.env(OMP_NUM_THREADS="7"))
        self.assertEqual({e["OMP_NUM_THREADS"] for e in infos.values()}, {"7"})
        self.assertNotIn("OMP_NUM_THREADS", err)

    def test_two_nodes_on_loopback(self):
        held = T.HeldPort()  # node 0 serves the rendezvous on it
        self.addCleanup(held.close)
        port = held.port
        dirs = [os.path.join(self.tmp, "node%d" % n) for n in range(2)]
        procs = []
        for node in (1, 0):  # node 1 first: it must wait for node 0
            os.mkdir(dirs[node])
            handed, pass_fds = held.handover() if node == 0 else ({}, ())
            env = self.env(DDP_RENDEZVOUS_DIR="/should/not/leak", **handed)
            procs.append(T.start(["--nnodes", "2", "--node-rank", str(node), "--master-addr",
                                  "127.0.0.1", "--master-port", str(port), "--rdzv-port", str(port),
                                  "--nproc-per-node", "2", "--rdzv-timeout", "60", "--",
                                  sys.executable, T.worker("dump_env.py"), dirs[node]], env,
                                 pass_fds=pass_fds))
        results = []
        for p in procs:
            try:
                results.append(p.communicate(timeout=90) + (p.returncode,))
            except subprocess.TimeoutExpired:
                p.kill()
                self.fail("a node did not finish: %r" % (p.communicate(),))
        for out, err, rc in results:
            self.assertEqual(rc, 0, err)
        infos = {}
        for node in (0, 1):
            node_infos = self.load(dirs[node])
            self.check_layout(node_infos, 4, 2, node_rank=node, nnodes=2)
            infos.update(node_infos)
        self.assertEqual(sorted(infos), [0, 1, 2, 3])
        self.assertEqual(len({e["TORCHELASTIC_RUN_ID"] for e in infos.values()}), 1,
                         "all nodes must share node 0's run id")
        for e in infos.values():
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.1")
            self.assertEqual(e["MASTER_PORT"], str(port))
            self.assertIsNone(e["DDP_RENDEZVOUS_DIR"], "no FileStore folder across hosts")
            self.assertIsNone(e["DDPRUN_RDZV_LISTEN_FD"], "node 0's handed socket is ddprun's")


if __name__ == "__main__":
    T.main()
