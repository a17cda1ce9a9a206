"""fsdp_cap.quick: runs bench/fsdp_cap.py --quick and checks what it claims from its
own figures (its --json) and from the system: the limit it set is the one read back from
every rank's cgroup, the same for DDP and fully_shard and between their measured needs;
DDP was killed by the kernel's OOM killer (its group's oom_kill count and SIGKILL, not
another failure); fully_shard exited 0 on every rank after every step with a falling
loss; each run had a folder of its own; no cgroup it made is left.

  check_fsdp_cap.py FSDP_CAP_PY DDPRUN GPT

Exits 77 (CTest: skipped) where no writable cgroup memory controller exists.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

SKIP = 77


def main():
    driver, ddprun, gpt = sys.argv[1:4]
    work = tempfile.mkdtemp(prefix="fsdp-cap-check-")
    os.environ["TMPDIR"] = work  # what the programs leave in a temp folder goes with it
    try:
        return check(driver, ddprun, gpt, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check(driver, ddprun, gpt, work):
    out, js = os.path.join(work, "fsdp-cap.md"), os.path.join(work, "fsdp-cap.json")
    cmd = [sys.executable, "-B", driver, "--quick", "--skip-code", str(SKIP), "--ddprun", ddprun,
           "--gpt", gpt, "--out", out, "--json", js]
    print("$", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, timeout=220).returncode
    if rc == SKIP:
        print("skipped: no writable cgroup memory controller here (the driver said why above)")
        return SKIP
    failures = []

    def expect(ok, what):
        print(("ok:   " if ok else "FAIL: ") + what, flush=True)
        if not ok:
            failures.append(what)

    if not os.path.exists(js):
        print(f"FAIL: the driver exited {rc} without its figures ({js})")
        return 1
    with open(js) as f:
        r = json.load(f)
    expect(rc == 0, f"the driver exits 0 (it exited {rc}; outcome: {r['outcome']})")
    runs = {(x["phase"], x["mode"]): x for x in r["runs"]}
    cap = r["cap"]
    measured = all(k in runs for k in (("measure", "ddp"), ("measure", "fsdp")))
    capped = all(k in runs for k in (("capped", "ddp"), ("capped", "fsdp")))
    expect(measured, "DDP and fully_shard were measured with no limit")
    expect(capped and cap is not None, "DDP and fully_shard ran under a limit")

    if measured and cap:
        d, f = runs["measure", "ddp"]["needed"], runs["measure", "fsdp"]["needed"]
        expect(f < cap < d, f"the limit ({cap / 1e6:.0f} MB) lies between fully_shard's need "
                            f"({f / 1e6:.0f} MB) and DDP's ({d / 1e6:.0f} MB)")
    if capped:
        dk, fk = runs["capped", "ddp"], runs["capped", "fsdp"]
        for run in (dk, fk):
            limits = {k.get("limit_read") for k in run["ranks"]}
            expect(limits == {cap}, f"{run['mode']}: every rank's cgroup had the limit {cap} "
                                    f"(read back: {sorted(map(str, limits))})")
        # The group's own OOM kill count; a kernel without one (cgroup v1 before Linux
        # 4.13): SIGKILL after the group hit its limit.
        killed = [k for k in dk["ranks"] if k.get("signal") == signal.SIGKILL and (
            k["oom_kills"] > 0 if k.get("oom_kills") is not None else bool(k.get("limit_hits")))]
        how = [(k["rank"], k.get("signal"), k.get("oom_kills")) for k in dk["ranks"]]
        expect(bool(killed), "DDP: a rank was killed by the OOM killer (SIGKILL, and oom_kill "
                             f"in its cgroup; rank, signal, OOM kills: {how})")
        expect(dk["rc"] != 0 and not any(k.get("exit_code") == 0 for k in dk["ranks"]),
               f"DDP did not finish (ddprun exit {dk['rc']})")
        expect(fk["rc"] == 0 and all(k.get("exit_code") == 0 for k in fk["ranks"]),
               f"fully_shard: ddprun and every rank exited 0 ({fk['rc']}, "
               f"{[k.get('exit_code') for k in fk['ranks']]})")
        expect(not any(k.get("oom_kills") for k in fk["ranks"]),
               "fully_shard: no OOM kill in its cgroups")
        expect(fk["steps_done"] == fk["steps"],
               f"fully_shard trained every step ({fk['steps_done']}/{fk['steps']})")
        expect(fk["first_loss"] is not None and fk["last_loss"] is not None
               and fk["last_loss"] < fk["first_loss"],
               f"fully_shard's loss fell ({fk['first_loss']} to {fk['last_loss']})")
    dirs = [x["run_dir"] for x in r["runs"]]
    expect(len(set(dirs)) == len(dirs), "each run had a run folder of its own")
    expect(not any(os.path.exists(d) for d in dirs), "the run folders are gone")
    groups = [g for x in r["runs"] for g in x["cgroups"]] + [r["cgroup_parent"]]
    left = [g for g in groups if os.path.exists(g)]
    expect(r["cgroups_removed"] and not left, f"no cgroup is left behind ({left or 'none'})")
    parent = os.path.dirname(r["cgroup_parent"])
    mine = os.path.basename(r["cgroup_parent"])
    expect(not any(n == mine for n in os.listdir(parent)), f"{mine} is gone from {parent}")
    expect(os.path.exists(out), "the report was written")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
