#!/usr/bin/env python3
"""torchrun command lines from PyTorch's documentation, run unchanged with ddprun in
torchrun's place: on one host, and on several hosts on loopback (ddprun processes on
127.0.0.1, each running the same command)."""
import glob
import json
import os
import re
import shlex
import subprocess

import ddprun_testlib as T

# The Python with PyTorch that runs the PyTorch DDP programs: the configuration's own
# (CTest sets it), else Debian's python3-torch.
TORCH_PYTHON = os.environ.get("DDPRUN_TEST_TORCH_PYTHON") or "/usr/bin/python3"

RUN_DOC = "https://pytorch.org/docs/stable/elastic/run.html"
QUICKSTART_DOC = "https://pytorch.org/docs/stable/elastic/quickstart.html"

# (source, command line as written there). Placeholders take the values of VALUES; a
# script name (*.py) becomes workers/train_env.py and a -m module becomes train_env.
LINES = [
    (RUN_DOC, "torchrun --standalone --nnodes=1 --nproc-per-node=$NUM_TRAINERS "
              "YOUR_TRAINING_SCRIPT.py --arg1 --arg2"),
    (RUN_DOC, "torchrun --rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1 "
              "--nproc-per-node=$NUM_TRAINERS YOUR_TRAINING_SCRIPT.py"),
    (RUN_DOC, "torchrun --nnodes=$NUM_NODES --nproc-per-node=$NUM_TRAINERS --max-restarts=3 "
              "--rdzv-id=$JOB_ID --rdzv-backend=c10d --rdzv-endpoint=$HOST_NODE_ADDR "
              "YOUR_TRAINING_SCRIPT.py"),
    (QUICKSTART_DOC, "torchrun --nnodes=NUM_NODES --nproc-per-node=TRAINERS_PER_NODE "
                     "--max-restarts=NUM_ALLOWED_FAILURES --rdzv-id=JOB_ID --rdzv-backend=c10d "
                     "--rdzv-endpoint=HOST_NODE_ADDR YOUR_TRAINING_SCRIPT.py"),
    ("https://pytorch.org/tutorials/intermediate/ddp_tutorial.html",
     "torchrun --nnodes=2 --nproc_per_node=8 --rdzv_id=100 --rdzv_backend=c10d "
     "--rdzv_endpoint=$MASTER_ADDR:29400 elastic_ddp.py"),
    ("https://pytorch.org/tutorials/intermediate/ddp_series_multinode.html",
     "torchrun --nproc_per_node=4 --nnodes=2 --node_rank=0 --rdzv_id=456 --rdzv_backend=c10d "
     "--rdzv_endpoint=172.31.43.139:29603 multinode_torchrun.py 50 10"),
    ("https://pytorch.org/tutorials/beginner/ddp_series_fault_tolerance.html",
     "torchrun --standalone --nproc_per_node=4 multigpu_torchrun.py 50 10"),
    ("https://pytorch.org/tutorials/beginner/ddp_series_multigpu.html",
     "torchrun --standalone --nproc_per_node=gpu multigpu_torchrun.py 50 10"),
    ("https://pytorch.org/tutorials/intermediate/FSDP_tutorial.html",
     "torchrun --nnodes 1 --nproc_per_node 2 FSDP_mnist.py"),
    ("https://pytorch.org/tutorials/intermediate/TP_tutorial.html",
     "torchrun --nnodes 1 --nproc-per-node 4 tensor_parallel_example.py"),
    ("https://github.com/pytorch/torchtitan/blob/main/run_train.sh",
     'torchrun --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint="localhost:0" '
     "--local-ranks-filter ${LOG_RANK} --role rank --tee 3 -m torchtitan.train "
     "--job.config_file ${CONFIG_FILE}"),
]

VALUES = {"NUM_TRAINERS": "2", "NUM_NODES": "2", "TRAINERS_PER_NODE": "2", "JOB_ID": "job7",
          "NUM_ALLOWED_FAILURES": "3", "NGPU": "2", "LOG_RANK": "0", "CONFIG_FILE": "train.toml",
          "MASTER_ADDR": "node0.example", "HOST_NODE_ADDR": "node0.example:29400"}
ENDPOINT_FLAGS = ("--rdzv-endpoint", "--rdzv_endpoint")


def flag_value(argv, names):
    """The value of the last of `names` in argv (--flag=value or --flag value), or None."""
    value = None
    for i, word in enumerate(argv):
        for name in names:
            if word.startswith(name + "="):
                value = word.split("=", 1)[1]
            elif word == name and i + 1 < len(argv):
                value = argv[i + 1]
    return value


def translate(line, port, script="train_env.py"):
    """argv for ddprun from a torchrun line: placeholders filled, ddprun for torchrun, our
    script or module for the user's, and the endpoint of a multi-host line on loopback."""
    for name, value in VALUES.items():
        line = re.sub(r"\$\{%s\}|\$%s\b|\b%s\b" % (name, name, name), value, line)
    argv = shlex.split(line)
    assert argv[0] == "torchrun"
    nnodes = int(flag_value(argv, ("--nnodes",)) or "1")
    out = []
    for i, word in enumerate(argv[1:], 1):
        if word.endswith(".py") and not word.startswith("-"):
            word = T.worker(script)
        elif i > 1 and argv[i - 1] in ("-m", "--module"):
            word = script[:-3]
        elif nnodes > 1 and word.startswith(ENDPOINT_FLAGS):
            word = word.split("=", 1)[0] + "=127.0.0.1:%d" % port
        out.append(word)
    return out, nnodes


class TorchrunLinesTest(T.DdprunTestCase):
    def start_hosts(self, argv, nnodes, held, **env):
        """ddprun once per host, all with the same argv; one is handed the endpoint socket
        (as if it ran on the endpoint's host), the others find it taken and join it."""
        procs = []
        for host in range(nnodes):
            extra, pass_fds = held.handover() if host == 0 and nnodes > 1 else ({}, ())
            procs.append(T.start(argv, self.env(OMP_NUM_THREADS=1, PYTHONPATH=T.WORKERS, **extra, **env),
                                 pass_fds=pass_fds))
        return procs

    def finish_all(self, procs, timeout=90):
        results = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                out, err = p.communicate()
                self.fail("ddprun did not finish:\n" + err[-3000:])
            results.append((p.returncode, out, err))
        return results

    def load(self, out_dir):
        infos = {}
        for path in glob.glob(os.path.join(out_dir, "rank*.json")):
            with open(path) as f:
                info = json.load(f)
            infos[int(info["RANK"])] = info
        return infos

    def test_documented_lines(self):
        for source, line in LINES:
            with self.subTest(source=source, line=line):
                held = T.HeldPort()
                try:
                    argv, nnodes = translate(line, held.port)
                    if flag_value(argv, ("--nproc-per-node", "--nproc_per_node")) == "gpu" and \
                            not glob.glob("/dev/nvidia[0-9]*"):
                        argv = [a.replace("=gpu", "=auto") for a in argv]  # no GPU here: one worker
                    out_dir = os.path.join(self.tmp, "out%d" % len(os.listdir(self.tmp)))
                    os.mkdir(out_dir)
                    results = self.finish_all(self.start_hosts(argv, nnodes, held, TRAIN_ENV_OUT=out_dir))
                finally:
                    held.close()
                for rc, out, err in results:
                    self.assertEqual(rc, 0, err)
                self.check_job(argv, nnodes, self.load(out_dir), results)

    def test_documented_lines_with_pytorch_ddp(self):
        # Python PyTorch runs the script (a DDP step over gloo); lines of up to 4
        # workers, as each is a full PyTorch process. test_documented_lines checks every
        # line's environment; here one line of each kind of launch runs PyTorch (hosts,
        # rendezvous, -m, a ranks filter), as lines of one kind differ only in spelling
        # and in the count of workers (which test_documented_lines checks). PyTorch's DDP
        # on two hosts is the multi-node lines' kind.
        kinds = set()
        for source, line in LINES:
            held = T.HeldPort()
            try:
                argv, nnodes = translate(line, held.port, "ddp_gloo.py")
                nproc = flag_value(argv, ("--nproc-per-node", "--nproc_per_node"))
                if nproc == "gpu":
                    continue
                world = nnodes * int(nproc)
                kind = (nnodes, flag_value(argv, ("--rdzv-backend", "--rdzv_backend")),
                        "-m" in argv, flag_value(argv, ("--local-ranks-filter",)))
                if world > 4 or kind in kinds:
                    continue
                kinds.add(kind)
                with self.subTest(source=source, line=line):
                    env = dict(DDPRUN_PYTHON=TORCH_PYTHON, GLOO_SOCKET_IFNAME="lo")
                    # A file names the store (see ddp_gloo.py): ddprun's MASTER_PORT is one it
                    # found free on one host and 29500 on several, which concurrent tests could
                    # take; test_python_ddp_standalone covers env://.
                    env["DDP_TEST_INIT_FILE"] = os.path.join(self.tmp, "store%d" % held.port)
                    results = self.finish_all(self.start_hosts(argv, nnodes, held, **env), timeout=180)
                    shown = flag_value(argv, ("--local-ranks-filter",))
                    out = "".join(r[1] for r in results)
                    for rc, _, err in results:
                        self.assertEqual(rc, 0, err)
                    for rank in range(world):
                        if shown is None or str(rank % int(nproc)) in shown.split(","):
                            self.assertIn("[rank %d]: ddp ok rank %d of %d" % (rank, rank, world), out)
            finally:
                held.close()

    def check_job(self, argv, nnodes, infos, results):
        nproc_text = flag_value(argv, ("--nproc-per-node", "--nproc_per_node"))
        nproc = 1 if nproc_text == "auto" else int(nproc_text)
        world = nnodes * nproc
        self.assertEqual(sorted(infos), list(range(world)))
        self.assertEqual(sorted({int(e["GROUP_RANK"]) for e in infos.values()}), list(range(nnodes)))
        script_args = argv[argv.index(T.worker("train_env.py")) + 1:] if T.worker("train_env.py") in argv \
            else argv[argv.index("train_env") + 1:]
        job_id = flag_value(argv, ("--rdzv-id", "--rdzv_id"))
        for rank, e in infos.items():
            self.assertEqual(e["WORLD_SIZE"], str(world))
            self.assertEqual(e["GROUP_WORLD_SIZE"], str(nnodes))
            self.assertEqual(e["ROLE_WORLD_SIZE"], str(world))
            self.assertEqual(e["LOCAL_WORLD_SIZE"], str(nproc))
            self.assertEqual(int(e["RANK"]), int(e["GROUP_RANK"]) * nproc + int(e["LOCAL_RANK"]))
            self.assertEqual(e["TORCHELASTIC_RESTART_COUNT"], "0")
            self.assertEqual(e["TORCHELASTIC_MAX_RESTARTS"], flag_value(argv, ("--max-restarts",)) or "0")
            self.assertEqual(e["argv"], script_args)
            self.assertEqual(e["as_module"], "train_env" in argv)
            self.assertEqual(e["ROLE_NAME"], flag_value(argv, ("--role",)) or "default")
            if job_id:
                self.assertEqual(e["TORCHELASTIC_RUN_ID"], job_id)
            if nnodes > 1:
                self.assertEqual((e["MASTER_ADDR"], e["MASTER_PORT"]), ("127.0.0.1", "29500"))
        shown = flag_value(argv, ("--local-ranks-filter",))
        out = "".join(r[1] for r in results)
        for rank in range(world):
            visible = shown is None or str(rank % nproc) in shown.split(",")
            self.assertEqual("[rank %d]: rank %d of %d ready" % (rank, rank, world) in out, visible, out)


class HostsTestCase(T.DdprunTestCase):
    """Hosts on loopback running one c10d command; the first one started with serve=True
    is handed the endpoint's socket."""

    def setUp(self):
        super().setUp()
        self.held = T.HeldPort()

    def tearDown(self):
        self.held.close()
        super().tearDown()

    def host(self, cmd, nnodes=3, nproc=2, extra=(), serve=False, **env):
        handed, pass_fds = self.held.handover() if serve else ({}, ())
        p = T.start(["--nnodes=%d" % nnodes, "--nproc-per-node=%d" % nproc, "--rdzv-backend=c10d",
                     "--rdzv-endpoint=127.0.0.1:%d" % self.held.port, "--rdzv-conf=join_timeout=60",
                     "--grace-period=2"] + list(extra) + cmd,
                    self.env(OMP_NUM_THREADS=1, **handed, **env), pass_fds=pass_fds)
        self.procs.append(p)
        return p


class DynamicRanksTest(HostsTestCase):
    def test_same_command_distinct_ranks(self):
        # The serving host starts last: the others wait for it, then get ranks as they joined.
        script = ["bash", "-c", 'echo "group $GROUP_RANK rank $RANK of $WORLD_SIZE"']
        hosts = [self.host(script, extra=["--rdzv-id=42"]) for _ in range(2)]
        hosts.append(self.host(script, extra=["--rdzv-id=42"], serve=True))
        lines = set()
        for p in hosts:
            rc, out, err = self.finish(p)
            self.assertEqual(rc, 0, err)
            groups = {int(l.split()[3]) for l in out.splitlines()}
            self.assertEqual(len(groups), 1, out)  # one node rank per host
            lines |= set(out.splitlines())
        self.assertEqual(lines, {"[rank %d]: group %d rank %d of 6" % (r, r // 2, r) for r in range(6)})

    def test_other_rdzv_id_refused(self):
        n0 = self.host(["true"], nnodes=2, extra=["--rdzv-id=job1", "--rdzv-conf=join_timeout=5"], serve=True)
        other = self.host(["true"], nnodes=2, extra=["--rdzv-id=job2"])
        rc, _, err = self.finish(other)
        self.assertEqual(rc, 2, err)
        self.assertIn("refused this host: this host has --rdzv-id 'job2' but node 0 runs --rdzv-id 'job1'", err)
        rc0, _, err0 = self.finish(n0)
        self.assertEqual(rc0, 1, err0)
        self.assertIn("nodes 1 more host(s) did not join", err0)

    def test_static_host_refused_by_c10d_node0(self):
        n0 = self.host(["true"], nnodes=2, extra=["--rdzv-conf=join_timeout=5"], serve=True)
        static = T.start(["--nnodes=2", "--nproc-per-node=2", "--node-rank=1", "--master-addr=127.0.0.1",
                          "--rdzv-port=%d" % self.held.port, "true"], self.env())
        self.procs.append(static)
        rc, _, err = self.finish(static)
        self.assertEqual(rc, 2, err)
        self.assertIn("node 0 hands out node ranks (--rdzv-backend c10d)", err)
        self.finish(n0)


class ElasticTest(HostsTestCase):
    """--nnodes MIN:MAX: the job goes on without a lost host."""

    def test_lost_host_restarts_the_rest(self):
        marks = os.path.join(self.tmp, "marks")
        os.mkdir(marks)
        # Attempt 0 runs until stopped; attempt 1 reports and ends.
        cmd = ["bash", "-c", 'touch "$MARKS/a$TORCHELASTIC_RESTART_COUNT.r$RANK"; '
               '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exec sleep 1000; '
               'echo "rank $RANK of $WORLD_SIZE group $GROUP_RANK of $GROUP_WORLD_SIZE '
               'restart $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS"']
        extra = ["--nnodes=2:3", "--max-restarts=3", "--rdzv-id=el1", "--rdzv-conf=last_call_timeout=30"]
        hosts = [self.host(cmd, extra=extra, serve=(h == 0), MARKS=marks) for h in range(3)]
        # All three joined before the last call ended: six workers of attempt 0.
        self.assertTrue(T.wait_for(lambda: len(os.listdir(marks)) >= 6, 60), os.listdir(marks))
        self.assertEqual(sorted(os.listdir(marks)), sorted("a0.r%d" % r for r in range(6)))
        hosts[2].kill()  # SIGKILL: its workers die with it
        self.finish(hosts[2])
        out = ""
        for p in hosts[:2]:
            rc, o, err = self.finish(p)
            self.assertEqual(rc, 0, err)
            out += o
            self.assertIn("restarting all workers (restart 1 of 3)", err)
        lines = sorted(l.split("]: ", 1)[1] for l in out.splitlines())
        self.assertEqual(lines, ["rank %d of 4 group %d of 2 restart 1 of 3" % (r, r // 2) for r in range(4)])

    def test_late_host_is_admitted_by_a_restart_at_once(self):
        # torchrun's membership change: a host that joins a running job makes every host
        # restart its workers, now with it, without using --max-restarts (0 here) and
        # without changing TORCHELASTIC_RESTART_COUNT.
        marks = os.path.join(self.tmp, "marks")
        os.mkdir(marks)
        # On 2 hosts (WORLD_SIZE 4) the workers run until stopped; on 3 they report and end.
        cmd = ["bash", "-c", 'touch "$MARKS/w$WORLD_SIZE.r$RANK"; '
               '[ "$WORLD_SIZE" = 4 ] && exec sleep 1000; '
               'echo "rank $RANK of $WORLD_SIZE restart $TORCHELASTIC_RESTART_COUNT"']
        extra = ["--nnodes=2:3", "--max-restarts=0", "--rdzv-conf=last_call_timeout=0.5"]
        hosts = [self.host(cmd, extra=extra, serve=(h == 0), MARKS=marks) for h in range(2)]
        self.assertTrue(T.wait_for(lambda: len(os.listdir(marks)) >= 4, 60), os.listdir(marks))
        late = self.host(cmd, extra=extra, MARKS=marks)
        out, errs = "", []
        for p in hosts + [late]:
            rc, o, err = self.finish(p)
            self.assertEqual(rc, 0, err)
            out += o
            errs.append(err)
        self.assertIn("node 2 joined; restarting the workers to admit it", errs[0])
        self.assertIn("this host is node 2 of 3", errs[2])
        lines = sorted(l.split("]: ", 1)[1] for l in out.splitlines())
        self.assertEqual(lines, sorted("rank %d of 6 restart 0" % r for r in range(6)))
        self.assertEqual(sorted(os.listdir(marks)),
                         sorted(["w4.r%d" % r for r in range(4)] + ["w6.r%d" % r for r in range(6)]))

    def test_other_range_refused(self):
        n0 = self.host(["true"], extra=["--nnodes=2:3", "--rdzv-conf=join_timeout=5"], serve=True)
        other = self.host(["true"], extra=["--nnodes=1:3"])
        rc, _, err = self.finish(other)
        self.assertEqual(rc, 2, err)
        self.assertIn("refused this host: node 0 has --nnodes 2:3 but this host has 1:3", err)
        self.finish(n0)

    def test_starts_with_min_after_last_call(self):
        cmd = ["bash", "-c", 'echo "rank $RANK of $WORLD_SIZE"']
        extra = ["--nnodes=1:3", "--rdzv-conf=last_call_timeout=0.5"]
        rc, out, err = self.finish(self.host(cmd, nproc=1, extra=extra, serve=True))
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "[rank 0]: rank 0 of 1\n")
        self.assertIn("starting in 0.5 s (last_call_timeout)", err)


class PythonProgramsTest(T.DdprunTestCase):
    def test_python_ddp_standalone(self):
        # Python PyTorch: the interpreter for a .py program is DDPRUN_PYTHON here.
        rc, out, err, _ = T.run(["--standalone", "--nproc-per-node=2", T.worker("ddp_gloo.py")],
                                self.env(DDPRUN_PYTHON=TORCH_PYTHON, GLOO_SOCKET_IFNAME="lo",
                                         OMP_NUM_THREADS=1), timeout=120)
        self.assertEqual(rc, 0, err)
        self.assertIn("[rank 1]: ddp ok rank 1 of 2", out)

    def test_module_and_no_python(self):
        out_dir = os.path.join(self.tmp, "m")
        os.mkdir(out_dir)
        env = self.env(PYTHONPATH=T.WORKERS, TRAIN_ENV_OUT=out_dir)
        rc, out, err, _ = T.run(["--nproc-per-node=1", "-m", "train_env", "a", "b"], env)
        self.assertEqual(rc, 0, err)
        with open(os.path.join(out_dir, "rank0.attempt0.json")) as f:
            info = json.load(f)
        self.assertEqual((info["as_module"], info["argv"]), (True, ["a", "b"]))
        # --no-python: the .py program runs directly (through its #! line).
        rc, out, err, _ = T.run(["--no-python", T.worker("train_env.py")], env)
        self.assertEqual(rc, 0, err)
        # --run-path: Python runs a program whatever its name.
        link = os.path.join(self.tmp, "train")
        os.symlink(T.worker("train_env.py"), link)
        rc, out, err, _ = T.run(["--run-path", link], self.env(TRAIN_ENV_OUT=out_dir, PATH="/nonexistent"))
        self.assertNotEqual(rc, 0)  # python3 is not on PATH: the interpreter was asked for
        self.assertIn("python3", err)


# Flags of torchrun that ddprun does not take: each an error naming the flag (exit 2).
UNSUPPORTED = [
    (["--event-log-handler=console"], "'--event-log-handler' is not supported"),
    (["--log-line-prefix-template", "[{rank}]"], "'--log-line-prefix-template' is not supported"),
    (["--local-addr=10.0.0.2"], "'--local-addr' is not supported"),
    (["--local_addr=10.0.0.2"], "'--local_addr' is not supported"),
    (["--numa-binding=node"], "numactl"),
    (["--virtual-local-rank"], "'--virtual-local-rank' is not supported"),
    (["--signals-to-handle=SIGUSR1"], "'--signals-to-handle' is not supported"),
    (["--logs-specs=x"], "'--logs-specs' is not supported"),
    (["--duplicate-stdout-filters=0"], "'--duplicate-stdout-filters' is not supported"),
    (["--use_env"], "'--use_env' is not supported"),
    (["--rdzv-backend=etcd", "--rdzv-endpoint=h:2379"], "--rdzv-backend 'etcd' is not supported"),
    (["--rdzv-backend=c10d", "--nnodes=2"], "needs --rdzv-endpoint HOST[:PORT]"),
    (["--rdzv-backend=c10d", "--rdzv-conf=timeout=9", "--rdzv-endpoint=h"], "--rdzv-conf: unknown key 'timeout'"),
    (["--rdzv-backend=c10d", "--rdzv-conf=keep_alive_interval=0", "--rdzv-endpoint=h"],
     "--rdzv-conf keep_alive_interval expects a number of seconds > 0; got '0'"),
    (["--rdzv-backend=c10d", "--rdzv-conf=keep_alive_max_attempt=2.5", "--rdzv-endpoint=h"],
     "--rdzv-conf keep_alive_max_attempt expects a whole number from 1 to 100000; got '2.5'"),
    (["--rdzv-endpoint=h:1"], "--rdzv-endpoint goes with --rdzv-backend c10d"),
    (["--nnodes=1:4"], "a range of hosts (MIN:MAX) needs --rdzv-backend c10d"),
    (["--nnodes=3:2", "--rdzv-backend=c10d"], "MIN is above MAX"),
    (["--nproc-per-node=xpu"], "does not count Intel XPUs"),
    (["--no-python", "-m"], "--no-python cannot go with -m/--module"),
    (["--start-method=thread"], "--start-method expects spawn, fork or forkserver"),
]


class UnsupportedFlagsTest(T.DdprunTestCase):
    def test_each_is_an_error(self):
        for flags, message in UNSUPPORTED:
            with self.subTest(flags=flags):
                rc, out, err, _ = T.run(flags + ["true"], self.env(), timeout=30)
                self.assertEqual(rc, 2, err)
                self.assertIn(message, err)
                self.assertEqual(out, "")


if __name__ == "__main__":
    T.main()
