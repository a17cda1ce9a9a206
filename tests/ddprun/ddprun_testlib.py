"""Helpers shared by the ddprun tests (standard library only).

Each test script is run as: python3 test_x.py /path/to/ddprun [unittest args]
"""
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
DDPRUN = None
MARKER_VAR = "DDPRUN_TEST_MARKER"


def worker(name):
    return os.path.join(WORKERS, name)


def main():
    """Takes the ddprun path from argv[1], then runs unittest."""
    global DDPRUN
    if len(sys.argv) < 2 or not os.access(sys.argv[1], os.X_OK):
        sys.exit("usage: %s /path/to/ddprun [unittest options]" % sys.argv[0])
    DDPRUN = os.path.abspath(sys.argv[1])
    unittest.main(argv=[sys.argv[0]] + sys.argv[2:], verbosity=2)


def base_env(**extra):
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env.pop("DDP_RENDEZVOUS_DIR", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start(args, env=None, **kw):
    """Starts ddprun with `args`; output is captured as text."""
    return subprocess.Popen([DDPRUN] + list(args), env=env or base_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def run(args, env=None, timeout=120):
    """Runs ddprun to the end: (returncode, stdout, stderr, seconds)."""
    t0 = time.monotonic()
    p = start(args, env)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError("ddprun did not finish within %ss\nstdout:\n%s\nstderr:\n%s"
                             % (timeout, out[-3000:], err[-3000:]))
    return p.returncode, out, err, time.monotonic() - t0


def new_marker():
    return uuid.uuid4().hex


def pids_with_marker(marker):
    """Live processes whose environment holds DDPRUN_TEST_MARKER=marker."""
    needle = ("%s=%s" % (MARKER_VAR, marker)).encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/stat" % name) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            found.append(int(name))
    return found


def pid_alive(pid):
    """True for a live (non-zombie) process."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_until(p, text, timeout):
    """Reads the running ddprun `p`'s stderr until it contains `text` (or EOF, or
    `timeout` seconds); returns what was read, which communicate() will not return."""
    got = b""
    fd = p.stderr.fileno()
    deadline = time.monotonic() + timeout
    while text.encode() not in got:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        got += chunk
    return got.decode(errors="replace")


def wait_for(predicate, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def read_text(path):
    """The file's text ("" while it does not exist or cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def read_pids(pid_dir):
    pids = {}
    for name in os.listdir(pid_dir):
        if name.endswith(".pid"):
            with open(os.path.join(pid_dir, name)) as f:
                text = f.read().strip()
            if text:
                pids[name[:-4]] = int(text)
    return pids


class HeldPort:
    """A port of 127.0.0.1 held from creation to close(): bound to port 0, so the kernel picks
    a free one, and with listen=True listening. Nothing else can take it meanwhile, so tests
    started at once never collide. A listening one is handed to node 0's ddprun, which
    serves the rendezvous on it (DDPRUN_RDZV_LISTEN_FD); one bound without listening refuses
    every connection."""

    def __init__(self, listen=True):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        if listen:
            self.sock.listen(128)
        self.port = self.sock.getsockname()[1]

    def handover(self):
        """The environment and pass_fds for the ddprun that is to serve on this port."""
        return {"DDPRUN_RDZV_LISTEN_FD": str(self.sock.fileno())}, (self.sock.fileno(),)

    def close(self):
        self.sock.close()


def kill_marked(marker):
    for pid in pids_with_marker(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class DdprunTestCase(unittest.TestCase):
    """Gives each test a temp folder and a marker, and checks nothing marked survives."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun-test-")
        self.marker = new_marker()
        self.procs = []  # ddprun processes that tearDown kills if they still run

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        leftover = pids_with_marker(self.marker)
        kill_marked(self.marker)
        subprocess.run(["rm", "-rf", self.tmp])
        self.assertEqual(leftover, [], "processes left behind by the test")

    def env(self, **extra):
        # TMPDIR: the test's own folder, so that what ddprun and its workers make there (a
        # killed ddprun cannot remove its flight-recorder and log folders) goes with it.
        extra.setdefault("TMPDIR", self.tmp)
        return base_env(**{MARKER_VAR: self.marker}, **extra)

    def finish(self, p, timeout=60):
        """Waits for ddprun `p`: (returncode, stdout, stderr); fails the test on a hang."""
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            self.fail("ddprun did not finish:\n" + err[-3000:])
        return p.returncode, out, err

    def assert_no_survivors(self, timeout=3.0):
        ok = wait_for(lambda: not pids_with_marker(self.marker), timeout)
        left = pids_with_marker(self.marker)
        details = []
        for pid in left:
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    details.append((pid, f.read().replace(b"\0", b" ").decode(errors="replace")))
            except OSError:
                pass
        self.assertTrue(ok, "processes survived ddprun: %r" % details)
