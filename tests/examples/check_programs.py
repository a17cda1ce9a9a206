#!/usr/bin/python3
"""Every program a user runs answers --help, and refuses a bad value with a message.

  check_programs.py BIN_DIR SOURCE_DIR

For each program under tools/, examples/ and bench/ that is built (C++) or runs (Python):
--help exits 0 and prints its usage; one bad value exits non-zero and names what was
wrong; neither prints c10's "Exception raised from" tail, a C++ "terminate called", or a
Python traceback.
"""
import os
import subprocess
import sys
import private_tmp

BAD = "Exception raised from", "terminate called", "Traceback (most recent call last)"


def main():
    bin_dir, src = sys.argv[1], sys.argv[2]
    py = sys.executable
    # (name, command, a bad command, what its message must contain)
    cases = [
        ("ddprun", [os.path.join(bin_dir, "ddprun")],
         ["--nnodes", "x", "--", "true"], "--nnodes"),
        ("fashion_mnist", [os.path.join(bin_dir, "fashion_mnist")], ["--epochs", "0"], "--epochs"),
        ("gpt", [os.path.join(bin_dir, "gpt")], ["--n-layer", "0"], "--n-layer"),
        ("gpu_check", [os.path.join(bin_dir, "gpu_check")], ["--suite", "nope"], "nope"),
        ("bench_allreduce", [os.path.join(bin_dir, "bench_allreduce")], ["7"], "'7'"),
        ("bench_diagnostics", [os.path.join(bin_dir, "bench_diagnostics")], ["x"], "ROUNDS"),
        ("bench_zero", [os.path.join(bin_dir, "bench_zero")], ["0"], "WIDTH"),
        ("bench_fsdp", [os.path.join(bin_dir, "bench_fsdp")], ["nope"], "nope"),
        ("bench_compare", [os.path.join(bin_dir, "bench_compare")],
         ["--model", "nope", "--out", "/nonexistent"], "nope"),
        ("flight_recorder.py", [py, os.path.join(src, "tools", "flight_recorder.py")],
         ["/nonexistent-dir"], "flight_recorder"),
        ("trace_to_svg.py", [py, os.path.join(src, "tools", "trace_to_svg.py")],
         ["--iterations", "x", "-o", "/dev/null", "t.json"], "--iterations"),
        ("gpt.py", [py, os.path.join(src, "examples", "gpt", "gpt.py")],
         ["--n-layer", "x"], "--n-layer"),
        ("gpt --no-save --resume", [os.path.join(bin_dir, "gpt")], ["--no-save", "--resume"],
         "--no-save"),
        ("fsdp_run.py", [py, os.path.join(src, "bench", "fsdp_run.py")],
         ["--build-dir", bin_dir, "--trials", "x"], "--trials"),
        ("fsdp_cap.py", [py, os.path.join(src, "bench", "fsdp_cap.py")],
         ["--timeout", "x"], "--timeout"),
        ("gpt_memory.py", [py, os.path.join(src, "bench", "gpt_memory.py")],
         ["--build-dir", bin_dir, "--trials", "x"], "--trials"),
    ]
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    checked = 0
    for name, cmd, bad, needle in cases:
        if not os.path.exists(cmd[-1]):
            print(f"skip {name}: {cmd[-1]} is not built here")
            continue
        p = subprocess.run(cmd + ["--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=60, env=env)
        if p.returncode != 0 or "usage" not in p.stdout.lower() and "options" not in p.stdout.lower():
            sys.exit(f"FAIL: {name} --help: exit code {p.returncode}, expected 0 and a usage:\n"
                     f"{p.stdout}")
        if any(b in p.stdout for b in BAD):
            sys.exit(f"FAIL: {name} --help printed a backtrace:\n{p.stdout}")
        q = subprocess.run(cmd + bad, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=60, env=env)
        if q.returncode == 0:
            sys.exit(f"FAIL: {name} {' '.join(bad)}: exit code 0, expected an error:\n{q.stdout}")
        if needle not in q.stdout:
            sys.exit(f"FAIL: {name} {' '.join(bad)}: the message should name {needle!r}:\n"
                     f"{q.stdout}")
        if any(b in q.stdout for b in BAD):
            sys.exit(f"FAIL: {name} {' '.join(bad)}: a backtrace or an abort:\n{q.stdout}")
        first = next((l for l in q.stdout.splitlines() if l.strip()), "")
        print(f"OK: {name}: --help, and {' '.join(bad)!r} -> exit {q.returncode}: {first[:120]}")
        checked += 1
    # A flight-recorder dump cut short (its process died while writing it).
    import tempfile
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "flight_recorder.rank0.json"), "w") as f:
        f.write('{"rank": 0, "world_size": 2, "entries": [{"seq": 1, "wh')
    q = subprocess.run([py, os.path.join(src, "tools", "flight_recorder.py"), d],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    for needle in ("flight_recorder.rank0.json", "cut short", "Pass the other ranks' files"):
        if q.returncode != 2 or needle not in q.stdout:
            sys.exit(f"FAIL: flight_recorder.py on a dump cut short: exit {q.returncode}, "
                     f"expected 2 and {needle!r}:\n{q.stdout}")
    print("OK: flight_recorder.py names a dump cut short")
    if checked < 9:
        sys.exit(f"FAIL: only {checked} programs were checked")


if __name__ == "__main__":
    private_tmp.use()
    main()
