"""bench/run-dcp: ddp::dcp against PyTorch's torch.distributed.checkpoint on the GPT's
sharded state (fully_shard / FSDP2 on each block and the root, AdamW), at 2 ranks on
Gloo: save, load of its own folder, and load of the other side's folder. Alternates the
two sides TRIALS times (each run a median over REPEATS), and writes the medians and their
ratios to bench/results/dcp.md.
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(ddprun, ranks, cmd):
    full = [ddprun, "--nproc-per-node", str(ranks), "--no-prefix", "--"] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env, timeout=900)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        sys.exit(f"failed ({p.returncode}): {' '.join(full)}\n{p.stdout}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--n-embd", type=int, default=512)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "dcp.md"))
    a = ap.parse_args()
    ddprun = os.path.join(a.build_dir, "bin", "ddprun")
    cpp = os.path.join(a.build_dir, "bin", "bench_dcp")
    py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dcp_py.py")
    size = ["--n-layer", str(a.n_layer), "--n-embd", str(a.n_embd)]
    work = tempfile.mkdtemp(prefix="ddp-bench-dcp-")
    try:
        cpp_dir, py_dir = os.path.join(work, "cpp"), os.path.join(work, "py")
        # A first run of each, not counted, so that each side has a folder to load.
        run(ddprun, a.ranks, [cpp, "--dir", cpp_dir, "--repeats", "1"] + size)
        run(ddprun, a.ranks, [a.python, py, "--dir", py_dir, "--repeats", "1"] + size)
        rows = {"cpp": [], "python": []}
        for t in range(a.trials):
            rows["cpp"].append(run(ddprun, a.ranks, [cpp, "--dir", cpp_dir, "--other",
                                                     os.path.join(py_dir, "py-0"), "--repeats",
                                                     str(a.repeats)] + size))
            rows["python"].append(run(ddprun, a.ranks, [a.python, py, "--dir", py_dir, "--other",
                                                        os.path.join(cpp_dir, "cpp-0"),
                                                        "--repeats", str(a.repeats)] + size))
            print(f"trial {t + 1}: cpp {rows['cpp'][-1]}\n         python {rows['python'][-1]}",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(side, key):
        return statistics.median(r[key] for r in rows[side])

    import torch  # the version, for the table
    mb = rows["cpp"][0]["bytes"] / 1e6
    lines = [
        "# DCP save and load: ddp::dcp against torch.distributed.checkpoint",
        "",
        f"`bench/run-dcp`, {datetime.date.today()}: the GPT of examples/gpt ({a.n_layer} layers, "
        f"n_embd {a.n_embd}, vocabulary 65) under fully_shard / FSDP2 on each block and the "
        f"root, AdamW after one step, {a.ranks} ranks on Gloo, one thread each, on this "
        f"machine's 2 cores; PyTorch {torch.__version__}. Folders of {mb:.0f} MB (C++) and "
        f"{rows['python'][0]['bytes'] / 1e6:.0f} MB (Python), in {tempfile.gettempdir()}. "
        f"Medians of {a.trials} alternating runs, each the slowest rank's median of "
        f"{a.repeats} calls. \"Load\" copies into the sharded model and optimizer in place "
        "(Python: dcp.load, then set_state_dict).",
        "",
        "| operation | ddp::dcp (s) | PyTorch (s) | PyTorch / ddp::dcp |",
        "|---|---:|---:|---:|",
    ]
    for label, key in (("save", "save_s"), ("load its own folder", "load_s"),
                       ("load the other side's folder", "load_other_s")):
        c, p = med("cpp", key), med("python", key)
        lines.append(f"| {label} | {c:.3f} | {p:.3f} | {p / c:.2f} |")
    lines += ["", "Each run's figures:", "", "```"]
    for side in ("cpp", "python"):
        for r in rows[side]:
            lines.append(json.dumps(r))
    lines += ["```", ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
