"""Simulated hosts for the ddprun tests: N network namespaces on one Linux bridge
(standard library only; needs root and iproute2's `ip`).

    hosts = netns_testlib.Hosts(3)
    why = hosts.setup()          # None, or why the hosts cannot be made (skip the test)
    try:
        p = subprocess.Popen(hosts.command(0, ["ddprun", ...]))
        ...
    finally:
        hosts.teardown()         # kills every process in the namespaces, deletes them

Host i is namespace <tag>-h<i>-<pid> with interface eth0 at SUBNET.<i+1>/24. Each host's
eth0 is one end of a veth pair whose other end is a port of the bridge br0, which lives in
a namespace of its own (<tag>-br-<pid>). Nothing is created in the host's own network
namespace, so its interfaces, routes and firewall are never touched, and the test's pid
in every name keeps concurrent runs apart. The hosts share the file system, /dev/shm and
the host name: only the network is separate.
"""
import os
import shutil
import signal
import subprocess
import time

IFNAME = "eth0"  # each host's interface (the name is private to its namespace)
BRIDGE = "br0"
NETNS_DIR = "/run/netns"  # where `ip netns add` keeps a namespace (a bind mount)


def ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), check=check, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=30)


def subnet_for(pid):
    """A /24 (its first three octets) picked from the pid, as test_two_hosts.py does."""
    return "10.%d.%d" % (200 + pid % 50, (pid // 50) % 250)


class Hosts:
    """`count` namespaces on one bridge; addrs[i] is host i's address."""

    def __init__(self, count, tag="ddprun"):
        pid = os.getpid()
        self.count = count
        self.names = ["%s-h%d-%d" % (tag, i, pid) for i in range(count)]
        self.bridge_ns = "%s-br-%d" % (tag, pid)
        self.subnet = subnet_for(pid)
        self.addrs = ["%s.%d" % (self.subnet, i + 1) for i in range(count)]

    def setup(self):
        """Creates the bridge and the hosts; returns None, or why it could not (with
        everything made so far removed again)."""
        if os.geteuid() != 0:
            return "network namespaces need root (euid is %d)" % os.geteuid()
        if shutil.which("ip") is None:
            return "the 'ip' command (iproute2) is not installed"
        try:
            ip("netns", "add", self.bridge_ns)
            ip("-n", self.bridge_ns, "link", "add", BRIDGE, "type", "bridge")
            ip("-n", self.bridge_ns, "link", "set", BRIDGE, "up")
            for i, ns in enumerate(self.names):
                port = "h%d" % i
                ip("netns", "add", ns)
                ip("link", "add", IFNAME, "netns", ns, "type", "veth", "peer", "name", port,
                   "netns", self.bridge_ns)
                ip("-n", self.bridge_ns, "link", "set", port, "master", BRIDGE)
                ip("-n", self.bridge_ns, "link", "set", port, "up")
                ip("-n", ns, "link", "set", "lo", "up")
                ip("-n", ns, "addr", "add", self.addrs[i] + "/24", "dev", IFNAME)
                ip("-n", ns, "link", "set", IFNAME, "up")
            subprocess.run(self.command(0, ["true"]), check=True, timeout=30,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except subprocess.CalledProcessError as e:
            self.teardown()
            return "cannot set up network namespaces: %s: %s" % (" ".join(e.cmd), (e.stderr or "").strip())
        except (OSError, subprocess.TimeoutExpired) as e:
            self.teardown()
            return "cannot set up network namespaces: %s" % e
        return None

    def command(self, host, argv):
        """argv run in host `host`'s namespace (`ip netns exec` execs it: the process
        started is the program itself, not a wrapper)."""
        return ["ip", "netns", "exec", self.names[host]] + list(argv)

    def pids(self, host):
        """Every process whose network namespace is host `host`'s."""
        return [int(p) for p in ip("netns", "pids", self.names[host], check=False).stdout.split()]

    def host_of(self, pid):
        """The index of the host whose namespace process `pid` runs in, or None."""
        try:
            ns = os.stat("/proc/%d/ns/net" % pid).st_ino
        except OSError:
            return None
        for host, name in enumerate(self.names):
            try:
                if os.stat(os.path.join(NETNS_DIR, name)).st_ino == ns:
                    return host
            except OSError:
                pass
        return None

    def kill_all(self, host, timeout=10.0):
        """SIGKILLs every process of host `host` until none is left (or `timeout`);
        returns whether none is left."""
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids(host)
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)

    def teardown(self):
        """Kills every process in the hosts' namespaces and deletes all of them (those
        that exist: it also cleans up after a setup that stopped half way)."""
        existing = set(ip("netns", "list", check=False).stdout.split())
        for host, ns in enumerate(self.names):
            if ns in existing:
                self.kill_all(host)
                ip("netns", "del", ns, check=False)
        if self.bridge_ns in existing:
            ip("netns", "del", self.bridge_ns, check=False)
