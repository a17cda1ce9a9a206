"""The worker that bench/run-fsdp-cap has ddprun start on each rank: runs PROGRAM in the
memory cgroup of this rank and reports how it ended and its peak RSS.

  cap_exec.py CGROUP_PREFIX REPORT_DIR -- PROGRAM [ARGS...]

The child joins the cgroup CGROUP_PREFIX + "rank$RANK" (ddprun sets RANK) between fork
and exec, so the cgroup holds PROGRAM alone and is charged for nothing of this wrapper.
After the child has ended, REPORT_DIR/rank$RANK.json says how (exit code or signal) and
its peak resident set (getrusage's ru_maxrss, exact: the kernel keeps it), and this
wrapper ends the same way, so ddprun sees the child's exit code or signal. A signal sent
to the wrapper (ddprun stopping the job) is passed on to the child. Standard library only.
"""

import ctypes
import json
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1


def main():
    args = sys.argv[1:]
    if len(args) < 4 or args[2] != "--":
        sys.exit("usage: cap_exec.py CGROUP_PREFIX REPORT_DIR -- PROGRAM [ARGS...]")
    prefix, report_dir, program = args[0], args[1], args[3:]
    rank = os.environ.get("RANK")
    if rank is None:
        sys.exit("cap_exec.py: RANK is not set; start it with ddprun")
    cgroup = prefix + "rank" + rank
    procs = os.path.join(cgroup, "cgroup.procs")
    if not os.path.isfile(procs):
        sys.exit(f"cap_exec.py: rank {rank}: no cgroup at {cgroup}")

    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: into the rank's cgroup, then the program
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
            try:  # dies with this wrapper, as ddprun's workers die with ddprun
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            except (OSError, AttributeError):
                pass
            os.execvp(program[0], program)
        except OSError as e:
            os.write(2, f"cap_exec.py: rank {rank}: {program[0]}: {e}\n".encode())
        os._exit(127)

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)
    _, status, usage = os.wait4(pid, 0)
    record = {
        "rank": int(rank),
        "pid": pid,
        "cgroup": cgroup,
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "peak_rss_bytes": usage.ru_maxrss * 1024,  # Linux: kilobytes
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": time.monotonic() - start,
    }
    tmp = os.path.join(report_dir, f".rank{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(report_dir, f"rank{rank}.json"))
    sys.stdout.flush()
    sys.stderr.flush()
    if record["signal"] is not None:  # end the way the child ended
        sig = record["signal"]
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        sys.exit(128 + sig)
    sys.exit(record["exit_code"])


if __name__ == "__main__":
    main()
