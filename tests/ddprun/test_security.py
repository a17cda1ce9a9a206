#!/usr/bin/env python3
"""The job secret and a hostile host (docs/security.md).

    python3 test_security.py /path/to/ddprun [unittest options, e.g. SecretFileTest]

SecretFileTest and WarningTest run anywhere: `ddprun --make-secret` (mode 0600, never
replaces a file), the refusal of a bad secret file (readable by others, too short,
missing), and the one warning line of a multi-host job without a secret.

HostileHostTest needs root and network namespaces (netns_testlib.py; without them it
exits 77, reported as skipped by CTest). Four namespaces on one bridge: hosts 0, 1 and 2
run a job with a secret,

    ddprun --nnodes 2:3 --rdzv-backend c10d --rdzv-endpoint HOST0:29400 --rdzv-secret-file F ...

and host 3 is a stranger on the same network. While node 0 waits for the third host, the
stranger (this file, run with --hostile in host 3's namespace) connects without the
secret, with a wrong one, reflects node 0's own handshake back to it, sends a length bomb,
and opens a flood of 200 connections. To stand for lines captured on the wire it also
plays an attacker who already holds the key (the test hands it the real secret, since
capturing by a man in the middle is more than a test should build): it replays a signed
line, sends a line with a valid MAC under a changed sequence number, alters a signed
line, and replays a line of one connection on another. Node 0 must refuse each, log it
with host 3's address, keep its descriptors and memory bounded during the flood, and the
job must then start on all three hosts and finish with exit code 0 and WORLD_SIZE 3.

With --distributed-tests PATH the job is the library's own rendezvous and a Gloo
all_reduce (distributed_tests' launcher_all_reduce scenario), and host 2's rank waits
while the stranger connects to rank 0's TCPStore without the secret and writes a forged
host identity for it (the store_stranger scenario). Ranks 0 and 1 must refuse it (Note
[Signed store records]), wait, and finish with rank 2's own record.
"""
import glob
import hashlib
import hmac
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
import unittest

import ddprun_testlib as T
import netns_testlib as N

SKIP = 77
HOSTS = None  # netns_testlib.Hosts(4), made in main() when HostileHostTest runs
HOSTS_WHY = None  # why the hosts could not be made
RDZV_PORT = 29400
MASTER_PORT = 29410
# --distributed-tests PATH: the job runs the library's rendezvous and a Gloo all_reduce
# (distributed_tests' launcher_all_reduce) instead of dump_env.py, and a stranger forges
# a record in its TCPStore (store_stranger).
DISTRIBUTED_TESTS = None
MAX_UNJOINED = 32  # control_channel.h: kMaxUnjoined
HANDSHAKE_TIMEOUT = 5.0  # control_channel.h: kHandshakeTimeout
WARNING = "warning: no --rdzv-secret-file"


def read(path):
    return T.read_text(path)


# --- The stranger: runs in host 3's namespace (python3 test_security.py --hostile ...) ---

def mac(key, data):
    return hmac.new(key, data, hashlib.sha256).digest()


class Peer:
    """One connection to node 0, as an agent would make it (Note [Signed lines] in auth.h)."""

    def __init__(self, addr, port):
        self.sock = socket.create_connection((addr, port), timeout=5)
        self.buf = b""

    def line(self, timeout=5.0):
        """The next line from node 0, or None once it closed the connection."""
        self.sock.settimeout(timeout)
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(4096)
            except (ConnectionResetError, socket.timeout):
                return None
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def send(self, data):
        self.sock.sendall(data)

    def closed_by_node0(self, timeout=3.0):
        """Whether node 0 closes the connection within `timeout` (reading what it sends)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not self.sock.recv(65536):
                    return True
            except ConnectionResetError:
                return True
            except socket.timeout:
                return False
        return False

    def handshake(self, key, nonce=None):
        """Authenticates with `key` (right or wrong); returns the session key."""
        hello = self.line()
        theirs = bytes.fromhex(hello.split()[1].decode())
        mine = nonce or os.urandom(32)
        self.send(b"auth-hello %s\n" % mine.hex().encode())
        self.their_proof = self.line()
        proof = mac(key, b"ddprun-auth-v1 proof\0agent\0" + mine + theirs)
        self.send(b"auth-proof %s\n" % proof.hex().encode())
        return mac(key, b"ddprun-auth-v1 session\0" + mine + theirs)

    def close(self):
        self.sock.close()


def seal(session, seq, line):
    m = mac(session, b"ddprun-auth-v1 line\0agent->coordinator\0" + seq.to_bytes(8, "big") + line)
    return b"%d %s %s\n" % (seq, m.hex().encode(), line)


def hostile_attacks(addr, port, key):
    """Each attack's outcome: whether node 0 closed the connection, and what was seen."""
    results = {}

    p = Peer(addr, port)  # no secret: the plain protocol's hello
    p.line()
    p.send(b"hello -1 3 1 hostile\n")
    answer = p.line() or b""
    results["no_secret"] = {"closed": p.closed_by_node0(), "answer": answer.decode(errors="replace")}

    p = Peer(addr, port)  # a wrong secret
    p.handshake(os.urandom(32))
    results["wrong_secret"] = {"closed": p.closed_by_node0()}

    p = Peer(addr, port)  # node 0's own nonce sent back
    theirs = bytes.fromhex(p.line().split()[1].decode())
    p.send(b"auth-hello %s\n" % theirs.hex().encode())
    results["reflected_nonce"] = {"closed": p.closed_by_node0()}

    p = Peer(addr, port)  # a nonce of its own, then node 0's proof as its proof
    p.line()
    p.send(b"auth-hello %s\n" % os.urandom(32).hex().encode())
    their_proof = p.line()
    p.send(their_proof + b"\n")
    results["reflected_proof"] = {"closed": p.closed_by_node0()}

    # With the real key (a stand-in for lines captured on the wire): a valid line is
    # taken, the same line again is a replay.
    p = Peer(addr, port)
    session = p.handshake(key)
    line = seal(session, 0, b"ping")
    p.send(line)
    taken = not p.closed_by_node0(0.3)
    p.send(line)
    results["replay"] = {"first_taken": taken, "closed": p.closed_by_node0()}

    p = Peer(addr, port)  # a valid MAC for line 0, sent as line 1
    session = p.handshake(key)
    p.send(b"1" + seal(session, 0, b"ping")[1:])
    results["changed_seq"] = {"closed": p.closed_by_node0()}

    p = Peer(addr, port)  # a signed hello, altered (another --nproc-per-node)
    session = p.handshake(key)
    p.send(seal(session, 0, b"hello -1 3 1 hostile").replace(b" 1 hostile", b" 2 hostile"))
    results["altered"] = {"closed": p.closed_by_node0()}

    a, b = Peer(addr, port), Peer(addr, port)  # a line of connection a replayed on b
    session_a, session_b = a.handshake(key), b.handshake(key)
    line = seal(session_a, 0, b"ping")
    a.send(line)
    b.send(line)
    results["other_connection"] = {"a_taken": not a.closed_by_node0(0.3), "closed": b.closed_by_node0()}
    a.close()

    p = Peer(addr, port)  # a length bomb: 16 MiB without a line break
    sent = 0
    chunk = b"A" * 65536
    p.sock.settimeout(5)
    try:
        while sent < 16 << 20:
            p.sock.sendall(chunk)
            sent += len(chunk)
        cut = False
    except OSError:
        cut = True
    results["length_bomb"] = {"cut_off": cut or p.closed_by_node0(), "sent_before_cut": sent}
    return results


def hostile_flood(addr, port, count):
    """Opens `count` connections that say nothing; waits for node 0 to close them."""
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect((addr, port))
            socks.append(s)
        except OSError:
            s.close()
    print(json.dumps({"opened": len(socks)}), flush=True)
    sys.stdin.readline()  # the test has measured node 0 meanwhile
    t0 = time.monotonic()
    open_ones = list(socks)
    closed_at = []
    while open_ones and time.monotonic() - t0 < HANDSHAKE_TIMEOUT + 5:
        left = []
        for s in open_ones:
            s.settimeout(0.01)
            try:
                data = s.recv(4096)
                gone = not data
            except socket.timeout:
                gone = False
            except OSError:
                gone = True
            if gone:
                closed_at.append(time.monotonic() - t0)
                s.close()
            else:
                left.append(s)
        open_ones = left
    print(json.dumps({"closed_by_node0": len(closed_at), "still_open": len(open_ones)}), flush=True)


def hostile_main(args):
    what, addr, port = args[0], args[1], int(args[2])
    if what == "attacks":
        key = bytes.fromhex(open(args[3]).read().strip())
        print(json.dumps(hostile_attacks(addr, port, key)), flush=True)
    elif what == "flood":
        hostile_flood(addr, port, int(args[3]))


# --- The tests -------------------------------------------------------------------------

class SecretFileTest(T.DdprunTestCase):
    def test_make_secret(self):
        path = os.path.join(self.tmp, "job.secret")
        rc, out, err, _ = T.run(["--make-secret", path])
        self.assertEqual(rc, 0, err)
        st = os.stat(path)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
        text = read(path)
        self.assertRegex(text, r"^[0-9a-f]{64}\n$")
        self.assertNotIn(text.strip(), out + err)  # never printed
        # Never replaced: the hosts that hold it could no longer join.
        rc, _, err, _ = T.run(["--make-secret", path])
        self.assertEqual(rc, 1, err)
        self.assertIn("already exists", err)
        self.assertEqual(read(path), text)
        other = os.path.join(self.tmp, "other.secret")
        self.assertEqual(T.run(["--make-secret=" + other])[0], 0)
        self.assertNotEqual(read(other), text)
        self.assertEqual([n for n in os.listdir(self.tmp) if n.startswith(".ddprun-secret")], [])
        # It goes alone.
        rc, _, err, _ = T.run(["--nnodes", "2", "--make-secret", path + "2", "--", "true"])
        self.assertEqual(rc, 2, err)
        self.assertIn("--make-secret FILE goes alone", err)
        self.assertFalse(os.path.exists(path + "2"))
        # And the file works.
        rc, _, err, _ = T.run(["--rdzv-secret-file", path, "--", "true"])
        self.assertEqual(rc, 0, err)

    def test_bad_secret_files_are_refused(self):
        def secret(name, text, mode):
            path = os.path.join(self.tmp, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, mode)
            return path

        good = os.urandom(32).hex() + "\n"
        cases = [
            (secret("open", good, 0o644), "has mode 0644", "chmod 600"),
            (secret("group", good, 0o640), "has mode 0640", "chmod 600"),
            (secret("short", os.urandom(16).hex(), 0o600), "too short: it holds 16 byte(s)",
             "at least 32 random bytes"),
            (os.path.join(self.tmp, "missing"), "No such file or directory", "ddprun --make-secret"),
        ]
        pid_dir = os.path.join(self.tmp, "started")
        os.mkdir(pid_dir)
        worker = ["bash", "-c", "touch %s/$RANK" % pid_dir]
        for path, seen, todo in cases:
            for how in ("flag", "env"):
                args = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "29999"]
                env = self.env()
                if how == "flag":
                    args += ["--rdzv-secret-file", path]
                else:
                    env["DDPRUN_SECRET_FILE"] = path
                rc, _, err, _ = T.run(args + ["--"] + worker, env=env)
                self.assertEqual(rc, 2, "%s (%s): %s" % (path, how, err))
                self.assertIn("the secret file '%s'" % path, err)
                self.assertIn(seen, err)
                self.assertIn(todo, err)
                self.assertNotIn(WARNING, err)
        self.assertEqual(os.listdir(pid_dir), [], "a worker started")


class WarningTest(T.DdprunTestCase):
    def test_one_warning_for_a_multi_host_job_without_secret(self):
        # 192.0.2.1 (TEST-NET-1) is no address of this host: node 0 cannot listen there
        # and stops at once (2); an agent gives up after --rdzv-timeout (1).
        for args, code in (
                (["--nnodes", "2", "--node-rank", "0", "--master-addr", "192.0.2.1"], 2),
                (["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "192.0.2.1:29400",
                  "--rdzv-timeout", "0.5"], 1)):
            rc, _, err, _ = T.run(args + ["--", "true"], env=self.env())
            self.assertEqual(rc, code, err)
            lines = [l for l in err.splitlines() if WARNING in l]
            self.assertEqual(len(lines), 1, err)
            self.assertIn("192.0.2.1:29", lines[0])
            self.assertIn("can join this job as a host or give it orders", lines[0])
            self.assertIn("--make-secret", lines[0])

    def test_no_warning_on_one_host_or_with_a_secret(self):
        secret = os.path.join(self.tmp, "s")
        self.assertEqual(T.run(["--make-secret", secret])[0], 0)
        runs = [
            ["--nproc-per-node", "2", "--", "true"],  # one host
            ["--standalone", "--", "true"],
            # several hosts on loopback: nothing reaches it from another machine
            ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
             "29998", "--rdzv-timeout", "0.5", "--", "true"],
            # a secret
            ["--nnodes", "2", "--node-rank", "0", "--master-addr", "192.0.2.1", "--rdzv-secret-file",
             secret, "--", "true"],
        ]
        for args in runs:
            rc, _, err, _ = T.run(args, env=self.env())
            self.assertNotIn(WARNING, err, args)
            self.assertNotIn("warning", err.lower(), args)


class HostileHostTest(T.DdprunTestCase):
    def setUp(self):
        if HOSTS is None:
            self.skipTest(HOSTS_WHY or "network namespaces not set up")
        super().setUp()
        self.outputs = []

    def tearDown(self):
        for host in range(HOSTS.count):
            HOSTS.kill_all(host)
        super().tearDown()

    def spawn(self, host, cmd):
        out, err = (os.path.join(self.tmp, "host%d.%s" % (host, s)) for s in ("out", "err"))
        with open(out, "w") as fo, open(err, "w") as fe:
            p = subprocess.Popen(HOSTS.command(host, cmd), env=self.env(OMP_NUM_THREADS=1),
                                 stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        self.outputs.append((host, out, err))
        return p

    def logs(self):
        return "\n".join("--- host %d stdout\n%s--- host %d stderr\n%s"
                         % (h, read(o)[-3000:], h, read(e)[-6000:]) for h, o, e in self.outputs)

    def wait_for(self, predicate, timeout, what):
        if not T.wait_for(predicate, timeout):
            self.fail("%s within %d s\n%s" % (what, timeout, self.logs()))

    def hostile(self, *args, stdin=None):
        return subprocess.Popen(HOSTS.command(3, [sys.executable, "-B", os.path.abspath(__file__),
                                                  "--hostile"] + [str(a) for a in args]),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=stdin, text=True)

    @staticmethod
    def fds(pid):
        return len(os.listdir("/proc/%d/fd" % pid))

    @staticmethod
    def rss_kib(pid):
        with open("/proc/%d/status" % pid) as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))

    def test_strangers_are_refused_and_the_job_goes_on(self):
        t0 = time.monotonic()
        secret = os.path.join(self.tmp, "job.secret")
        self.assertEqual(T.run(["--make-secret", secret])[0], 0)
        out_dir = os.path.join(self.tmp, "env")
        os.mkdir(out_dir)
        launcher = [T.DDPRUN, "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", "%s:%d" % (HOSTS.addrs[0], RDZV_PORT), "--rdzv-id", "sec",
                    "--rdzv-conf", "join_timeout=60,last_call_timeout=60",
                    "--master-port", str(MASTER_PORT), "--rdzv-secret-file", secret, "--"]
        if DISTRIBUTED_TESTS:
            # The library's rendezvous over rank 0's TCPStore, then a Gloo all_reduce.
            worker = ["env", "DDP_TEST_SCENARIO=launcher_all_reduce", "OMP_NUM_THREADS=1",
                      DISTRIBUTED_TESTS]
        else:
            worker = [sys.executable, T.worker("dump_env.py"), out_dir]
        cmd = launcher + worker
        node0 = self.spawn(0, cmd)
        err0 = self.outputs[0][2]
        self.wait_for(lambda: "node 0 waiting" in read(err0), 30, "node 0 did not listen")
        node1 = self.spawn(1, cmd)
        err1 = self.outputs[1][2]
        self.wait_for(lambda: "this host is node 1 of 3" in read(err1), 30, "host 1 did not join")
        base_fds, base_rss = self.fds(node0.pid), self.rss_kib(node0.pid)
        stranger = HOSTS.addrs[3]

        # Each attack: refused, the connection closed, and logged with the stranger's address.
        p = self.hostile("attacks", HOSTS.addrs[0], RDZV_PORT, secret)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        results = json.loads(out)
        for name, r in results.items():
            self.assertTrue(r.get("closed", r.get("cut_off")), "%s: %r\n%s" % (name, r, self.logs()))
        self.assertTrue(results["replay"]["first_taken"], results)
        self.assertTrue(results["other_connection"]["a_taken"], results)
        # A host without the secret is told what to do.
        self.assertIn("error ", results["no_secret"]["answer"])
        self.assertIn("--rdzv-secret-file", results["no_secret"]["answer"])
        self.assertLess(results["length_bomb"]["sent_before_cut"], 16 << 20)
        expected = {
            "no_secret": "it sent 'hello -1 3 1 hostile' instead of the authentication handshake",
            "wrong_secret": "its proof of the job secret does not match",
            "reflected_nonce": "it sent back this end's own nonce",
            "reflected_proof": "it sent back this end's own proof",
            "replay": "a replayed or reordered line (sequence number 0 where 1 is next)",
            "changed_seq": "its sequence number was changed (sequence number 1 where 0 is next)",
            "altered": "its MAC does not match",
            "other_connection": "signed for another connection",
            "length_bomb": "bytes without a line break before authenticating",
        }
        log = read(err0)
        refusals = [l for l in log.splitlines() if "ddprun: refused a connection from %s:" % stranger in l]
        for name, text in expected.items():
            self.assertTrue(any(text in l for l in refusals), "%s: no refusal saying %r\n%s"
                            % (name, text, self.logs()))
        self.assertEqual(len(refusals), len(expected), "\n".join(refusals))

        # A flood of 200 connections: at most MAX_UNJOINED held at once, each for at most
        # HANDSHAKE_TIMEOUT seconds.
        flood = self.hostile("flood", HOSTS.addrs[0], RDZV_PORT, 200, stdin=subprocess.PIPE)
        opened = json.loads(flood.stdout.readline())
        peak_fds, peak_rss = 0, 0
        for _ in range(20):
            peak_fds = max(peak_fds, self.fds(node0.pid))
            peak_rss = max(peak_rss, self.rss_kib(node0.pid))
            time.sleep(0.05)
        flood.stdin.write("measured\n")
        flood.stdin.flush()
        closed = json.loads(flood.stdout.readline())
        flood.communicate(timeout=30)
        self.assertGreater(opened["opened"], MAX_UNJOINED, opened)
        self.assertLessEqual(peak_fds, base_fds + MAX_UNJOINED + 2, (base_fds, peak_fds))
        self.assertLess(peak_rss, base_rss + 16 * 1024, (base_rss, peak_rss))
        self.assertEqual(closed["still_open"], 0, closed)
        self.wait_for(lambda: self.fds(node0.pid) <= base_fds, 5, "node 0 kept the flood's descriptors")
        log = read(err0)
        self.assertIn("ddprun: refused a connection from %s:" % stranger, log)
        self.assertRegex(log, r"connections are already waiting to authenticate \(at most %d\)|"
                              r"more refusal\(s\)" % MAX_UNJOINED)
        self.assertLess(self.rss_kib(node0.pid), base_rss + 16 * 1024)

        # The job: host 2 joins, all three start, and finish with WORLD_SIZE 3.
        self.assertIsNone(node0.poll(), self.logs())
        self.assertIsNone(node1.poll(), self.logs())
        if not DISTRIBUTED_TESTS:
            node2 = self.spawn(2, cmd)
        else:
            # Note [Signed store records]: host 2's rank waits for a flag while a stranger
            # on host 3 writes a forged identity for it into rank 0's TCPStore. Ranks 0
            # and 1 must refuse it, wait, and go on with rank 2's own once it arrives.
            flag = os.path.join(self.tmp, "rank2.go")
            gate = ["sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.02; done; exec "$@"', flag]
            node2 = self.spawn(2, launcher + gate + worker)
            forger = subprocess.run(
                HOSTS.command(3, ["env", "DDP_TEST_SCENARIO=store_stranger",
                                  "MASTER_ADDR=" + HOSTS.addrs[0], "MASTER_PORT=%d" % MASTER_PORT,
                                  "DDP_TEST_FORGE_RANKS=2", DISTRIBUTED_TESTS]),
                env=self.env(), capture_output=True, text=True, timeout=90)
            self.assertEqual(forger.returncode, 0, forger.stdout + forger.stderr + self.logs())
            self.assertIn("forged 1", forger.stdout)
            refused = "refused the store's record 'ddp/arrived/2'"
            self.wait_for(lambda: refused in read(err0) + read(err1) + read(self.outputs[0][1])
                          + read(self.outputs[1][1]), 30, "no rank refused the forged record")
            open(flag, "w").close()
        for p in (node0, node1, node2):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.fail("the job did not finish\n" + self.logs())
            self.assertEqual(p.returncode, 0, self.logs())
        sizes = {}
        if DISTRIBUTED_TESTS:
            for _, out, _ in self.outputs:
                for m in re.finditer(r"rank (\d+) of (\d+) \(local \d+\): all_reduce ok", read(out)):
                    sizes[int(m.group(1))] = m.group(2)
        for path in glob.glob(os.path.join(out_dir, "rank*.json")):
            with open(path) as f:
                e = json.load(f)
            sizes[int(e["RANK"])] = e["WORLD_SIZE"]
        self.assertEqual(sizes, {0: "3", 1: "3", 2: "3"}, self.logs())
        for _, _, err in self.outputs:
            self.assertNotIn("lost", read(err))
            self.assertNotIn(WARNING, read(err))
        if os.environ.get("DDPRUN_TEST_VERBOSE"):
            sys.stderr.write(self.logs() + "\n")
        sys.stderr.write("hostile host test: %.1f s (fds %d -> peak %d during the flood; "
                         "RSS %d -> peak %d KiB)\n" % (time.monotonic() - t0, base_fds, peak_fds,
                                                       base_rss, peak_rss))


def main():
    global HOSTS, HOSTS_WHY, DISTRIBUTED_TESTS
    if len(sys.argv) > 1 and sys.argv[1] == "--hostile":
        return hostile_main(sys.argv[2:])
    if len(sys.argv) < 2 or not os.access(sys.argv[1], os.X_OK):
        sys.exit("usage: %s /path/to/ddprun [unittest options]" % sys.argv[0])
    T.DDPRUN = os.path.abspath(sys.argv[1])
    if "--distributed-tests" in sys.argv:
        i = sys.argv.index("--distributed-tests")
        DISTRIBUTED_TESTS = os.path.abspath(sys.argv[i + 1])
        del sys.argv[i:i + 2]
    names = [a for a in sys.argv[2:] if not a.startswith("-")]
    wants_hosts = not names or any(n.startswith("HostileHostTest") for n in names)
    only_hosts = names and all(n.startswith("HostileHostTest") for n in names)
    if wants_hosts:
        hosts = N.Hosts(4, tag="ddprun-sec")
        HOSTS_WHY = hosts.setup()
        if HOSTS_WHY and only_hosts:
            print("SKIPPED: %s" % HOSTS_WHY)
            sys.exit(SKIP)
        if not HOSTS_WHY:
            HOSTS = hosts
    try:
        prog = unittest.main(argv=[sys.argv[0]] + sys.argv[2:], verbosity=2, exit=False)
    finally:
        if HOSTS is not None:
            HOSTS.teardown()
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
