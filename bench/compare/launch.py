"""Launching ranks and describing the machine, for run.py."""

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time


class RunError(RuntimeError):
    pass


BENCH_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "GLOO_SOCKET_IFNAME", "GLIBC_TUNABLES")


# See docs/benchmarks.md, "Page faults". "tuned": glibc keeps freed memory for reuse
# (no mmap for large blocks, no trimming) and backs it with transparent huge pages, so
# that a steady training loop stops faulting in fresh pages; "hugetlb": huge pages only;
# "default": glibc as it comes. Applies to both sides alike.
MALLOC = {
    "tuned": "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:"
             "glibc.malloc.trim_threshold=17179869184",
    "hugetlb": "glibc.malloc.hugetlb=1",
    "default": None,
}


def bench_env(malloc):
    """The environment every rank of every side runs with."""
    env = dict(os.environ)
    env.update({
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        # Python's Gloo picks an interface from the hostname unless told; the C++ side binds
        # 127.0.0.1 on one host. Both on loopback.
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONUNBUFFERED": "1",
    })
    if MALLOC[malloc]:
        env["GLIBC_TUNABLES"] = MALLOC[malloc]
    else:
        env.pop("GLIBC_TUNABLES", None)
    return env


class Launcher:
    """Runs `cmd` as `nproc` ranks on this host, with ddprun when it is built (the same way
    for C++ and Python), else by setting torchrun's variables itself."""

    def __init__(self, ddprun, env, timeout_s, verbose=False):
        self.ddprun = ddprun if ddprun and os.access(ddprun, os.X_OK) else None
        self.env = env
        self.timeout_s = timeout_s
        self.verbose = verbose

    def describe(self, nproc, cmd):
        if self.ddprun:
            return " ".join([os.path.relpath(self.ddprun), "--nproc-per-node", str(nproc),
                             "--no-prefix", "--"] + [_short(c) for c in cmd])
        return "RANK=.. WORLD_SIZE=%d " % nproc + " ".join(_short(c) for c in cmd)

    def run(self, nproc, cmd, what):
        start = time.monotonic()
        if self.ddprun:
            full = [self.ddprun, "--nproc-per-node", str(nproc), "--no-prefix", "--"] + cmd
            proc = subprocess.run(full, env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=self.timeout_s, text=True)
            rc, output = proc.returncode, proc.stdout
        else:
            rc, output = self._run_builtin(nproc, cmd)
        if rc != 0:
            raise RunError("%s failed (exit %s) after %.1f s:\n  %s\n%s"
                           % (what, rc, time.monotonic() - start, self.describe(nproc, cmd),
                              output[-4000:]))
        if self.verbose and output.strip():
            print(output.rstrip())
        return output

    def _run_builtin(self, nproc, cmd):
        rdzv = tempfile.mkdtemp(prefix="ddp-bench-rdzv-")
        os.chmod(rdzv, 0o700)
        procs = []
        try:
            for r in range(nproc):
                env = dict(self.env)
                env.update({"RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                            "LOCAL_WORLD_SIZE": str(nproc), "DDP_RENDEZVOUS_DIR": rdzv,
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
            outputs, rc = [], 0
            deadline = time.monotonic() + self.timeout_s
            for p in procs:
                try:
                    out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                    out, _ = p.communicate()
                    rc = rc or 124
                outputs.append(out)
                rc = rc or p.returncode
            return rc, "".join(outputs)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            shutil.rmtree(rdzv, ignore_errors=True)


def _short(arg):
    """Paths relative to the current directory, for readable commands in the report."""
    if os.path.isabs(arg) and os.path.exists(arg) and not arg.startswith("/usr/"):
        return os.path.relpath(arg)
    return arg


def read_ranks(out_dir, nproc):
    results = []
    for r in range(nproc):
        path = os.path.join(out_dir, "rank%d.json" % r)
        if not os.path.exists(path):
            raise RunError("rank %d wrote no result file %s" % (r, path))
        with open(path) as f:
            results.append(json.load(f))
    return results


def machine_info():
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gb = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": mem_gb,
        "kernel": platform.release(),
        "os": _os_name(),
    }


def _os_name():
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def load_average():
    try:
        return tuple(os.getloadavg())
    except OSError:
        return None


def command_output(cmd, cwd=None):
    try:
        return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
