#!/usr/bin/python3
"""Checks examples/gpt from the outside, with PyTorch as the reference.

  check_gpt.py python DDPRUN GPT GPT_PY WORKDIR [--grad-accum K]
      2 ranks, 20 steps on a small text (more than one epoch, so set_epoch and the
      epoch's last, short step are in it): the C++ program under ddprun and its Python
      twin (examples/gpt/gpt.py, PyTorch's DDP under torchrun), from the C++ program's
      initial weights (--save-init), give the same training loss at every step and the
      same validation losses within 1e-5 relative, and the same final parameters within
      1e-5.

  check_gpt.py variants DDPRUN GPT WORKDIR
      3 ranks: --zero (ZeroRedundancyOptimizer) and --fsdp (fully_shard), the latter also
      with --grad-accum 2, end with the parameters and losses of plain DDP.

  check_gpt.py tp DDPRUN GPT GPT_PY WORKDIR
      Tensor parallelism, 20 steps from the same initial weights: --tp 2 at 2 ranks
      equals the 1-rank run (losses within 1e-5 relative; --save-init gathers the same
      weights bit for bit), PyTorch's own parallelize_module on the Python twin
      (gpt.py --tp 2, Gloo) gives the same losses and parameters within 1e-5, and
      --tp 2 --fsdp at 4 ranks (a 2 x 2 mesh) equals DDP at 2 ranks. The --tp run's last
      checkpoint is a DCP folder that PyTorch's dcp_to_torch_save reads as model.pt.

  check_gpt.py pp DDPRUN GPT WORKDIR
      Pipeline parallelism, 20 steps: --pp 2 (1F1B, 2 microbatches) and --pp 2
      --microbatches 4 --schedule gpipe at 2 ranks equal the 1-rank run (losses within
      1e-5 relative), and --pp 2 at 4 ranks (two pipelines) equals DDP at 2 ranks.

  check_gpt.py activation-checkpointing DDPRUN GPT WORKDIR
      2 ranks with dropout, 8 steps: --activation-checkpointing gives the losses and the
      final parameters of the same run without it, bit for bit (the recompute replays
      the forward's dropout masks and autocast), under DDP, under --fsdp, and with
      --amp --grad-accum 2.

  check_gpt.py resume DDPRUN GPT WORKDIR [FLAG...]
      2 ranks with dropout, checkpoints every 3 steps: every worker is killed with
      SIGKILL in the middle of an epoch; --resume then ends with exactly the model
      (bit for bit) and the records of an uninterrupted run. With --fsdp the checkpoints
      are DCP folders: the last one, read by PyTorch's dcp_to_torch_save, holds the final
      model.pt bit for bit and the optimizer's state by parameter name.

  check_gpt.py standin DDPRUN GPT WORKDIR
      The GPU path on a CPU: 2 ranks with DDP_DEVICE_STANDIN=1 (NCCL's rules on a
      stand-in device) train a few steps with DDP, with --zero and with --fsdp, each with
      --grad-accum 2, sample at the end and exit normally.

  check_gpt.py torn-metrics DDPRUN GPT WORKDIR
      A metrics.jsonl whose last line was cut short: --resume stops with the file, the
      line and what to do.

  check_gpt.py data-errors GPT WORKDIR
      A missing, empty, too short and non-UTF-8 --data file, and a --prompt with a
      character the text lacks, each stop the program with exit code 1 and a message
      that names the problem and what to do.
"""
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import private_tmp

SMALL = ["--block-size", "16", "--n-layer", "2", "--n-head", "2", "--n-embd", "32",
         "--batch-size", "4", "--learning-rate", "3e-3", "--sample-length", "0"]


def fail(msg, output=""):
    print("FAIL:", msg)
    if output:
        print("---- program output ----\n" + output[-20000:])
    sys.exit(1)


def run(cmd, timeout, env=None):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout


def write_text(path, chars, seed=7):
    """Deterministic English-like text: words from a fixed list, lines of 4-9 words."""
    words = ("the quick brown fox jumps over a lazy dog and sings of rivers mountains "
             "stars under moonlight while old sailors dream about home").split()
    rng = random.Random(seed)
    out = []
    n = 0
    while n < chars:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(4, 9))).capitalize() + ".\n"
        out.append(line)
        n += len(line)
    with open(path, "w") as f:
        f.write("".join(out)[:chars])


def read_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def close(a, b, rel):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def compare_records(got, expected, rel, what):
    if [r["step"] for r in got] != [r["step"] for r in expected]:
        fail(f"{what}: records at steps {[r['step'] for r in got]}, expected "
             f"{[r['step'] for r in expected]}")
    worst = 0.0
    for g, e in zip(got, expected):
        for key in ("train_loss", "val_loss"):
            if (key in g) != (key in e):
                fail(f"{what}: step {g['step']}: {key} in one record only: {g} vs {e}")
            if key in g:
                worst = max(worst, abs(g[key] - e[key]) / max(abs(e[key]), 1e-12))
                if not close(g[key], e[key], rel):
                    fail(f"{what}: step {g['step']}: {key} {g[key]!r}, expected {e[key]!r} "
                         f"(relative tolerance {rel})")
    return worst


def compare_models(path, expected_path, rel, what):
    import torch
    got = torch.load(path)
    expected = torch.load(expected_path)
    if list(got) != list(expected):
        fail(f"{what}: keys {list(got)}, expected {list(expected)}")
    worst = 0.0
    for k in expected:
        a, b = got[k].double(), expected[k].double()
        if a.shape != b.shape:
            fail(f"{what}: {k} has shape {tuple(a.shape)}, expected {tuple(b.shape)}")
        scale = max(b.abs().max().item(), 1e-12)
        diff = (a - b).abs().max().item() / scale
        worst = max(worst, diff)
        if rel == 0 and not torch.equal(got[k], expected[k]):
            fail(f"{what}: {k} differs (max abs diff {(a - b).abs().max().item():.3g}); "
                 "expected bit-identical")
        if diff > rel:
            fail(f"{what}: {k} differs by {diff:.3g} relative to its largest entry (> {rel})")
    return worst


def cpp_run(ddprun, gpt, work, name, nproc, extra, timeout=300):
    cmd = [ddprun, "--nproc-per-node", str(nproc), "--", gpt, "--run-dir", work, "--name", name,
           "--data", os.path.join(work, "text.txt")] + SMALL + extra
    code, out = run(cmd, timeout)
    if code != 0:
        fail(f"{name}: exit code {code}, expected 0", out)
    return os.path.join(work, name)


def fresh(work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    write_text(os.path.join(work, "text.txt"), 2200)


def check_python(ddprun, gpt, gpt_py, work, extra):
    fresh(work)
    common = ["--max-steps", "20", "--log-every", "1", "--dropout", "0"] + extra
    init = os.path.join(work, "init.pt")
    run_dir = cpp_run(ddprun, gpt, work, "cpp", 2, common + ["--save-init", init, "--save-every",
                                                             "0"])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    py_metrics, py_model = os.path.join(work, "py.jsonl"), os.path.join(work, "py.pt")
    import torch
    if int(torch.__version__.split(".")[0]) >= 2:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", "2"]
    else:
        # Debian's torchrun 1.13 fails on Python 3.11 before it starts a worker
        # (AttributeError in its --redirects parsing); ddprun sets the same environment.
        launcher = [ddprun, "--nproc-per-node", "2", "--", sys.executable]
    for attempt in range(2):
        code, out = run(launcher + [gpt_py, "--data", os.path.join(work, "text.txt"),
                                    "--init", init, "--metrics", py_metrics, "--out", py_model]
                        + [a for a in SMALL if a not in ("--sample-length", "0")] + common,
                        timeout=300, env=env)
        # PyTorch 2.x's Gloo has been seen to abort a rank in its teardown after a complete
        # run ("terminate called without an active exception"); such a run says nothing
        # about either side, so it is repeated once. Any other failure counts at once.
        if code == 0 or "terminate called without an active exception" not in out:
            break
        print(f"PyTorch's twin aborted in its teardown (attempt {attempt + 1}); again", flush=True)
    if code != 0:
        fail(f"gpt.py under {os.path.basename(launcher[0])}: exit code {code}, expected 0", out)
    cpp = read_records(os.path.join(run_dir, "metrics.jsonl"))
    py = read_records(py_metrics)
    if len([r for r in cpp if "train_loss" in r]) != 20:
        fail(f"expected a training loss at each of 20 steps, got {cpp}")
    if not any(r.get("val_loss") is not None and r["step"] < 20 for r in cpp):
        fail(f"20 steps should cross an epoch's end (a validation before step 20): {cpp}")
    worst_loss = compare_records(cpp, py, 1e-5, "C++ against Python")
    worst_param = compare_models(os.path.join(run_dir, "model.pt"), py_model, 1e-5,
                                 "C++ model.pt against Python's")
    print(f"OK: 20 steps{' ' + ' '.join(extra) if extra else ''}: losses within "
          f"{worst_loss:.2g}, parameters within {worst_param:.2g} (relative) of PyTorch's DDP")


# Parameters of --zero and --fsdp against DDP's, relative to each tensor's largest entry.
# The three average gradients over 3 ranks in different orders (DDP divides before or after
# the sum, fully_shard as FSDP2 with a pre- and post-divide where the backend has no
# average), so gradients differ in their last bits; AdamW divides each gradient by its
# own running magnitude, which lets an entry whose gradient hovers around 0 move by up to
# lr per step either way. 12 steps at lr 3e-3 leave such entries within 1e-4 (LibTorch
# 1.13, Gloo without AVG: 5e-5; 2.x: 1e-6), where a wrong gradient would be off by O(1).
VARIANT_TOLERANCE = 1e-4


def check_variants(ddprun, gpt, work):
    fresh(work)
    common = ["--max-steps", "12", "--log-every", "1", "--dropout", "0", "--save-every", "0"]
    base = cpp_run(ddprun, gpt, work, "ddp", 3, common)
    base_accum = None
    for name, extra in (("zero", ["--zero"]), ("fsdp", ["--fsdp"]),
                        ("fsdp_accum", ["--fsdp", "--grad-accum", "2"]),
                        ("ddp_accum", ["--grad-accum", "2"])):
        d = cpp_run(ddprun, gpt, work, name, 3, common + extra)
        if name == "ddp_accum":
            base_accum = d
            continue
        ref = base if "accum" not in name else None
        if ref:
            compare_records(read_records(os.path.join(d, "metrics.jsonl")),
                            read_records(os.path.join(ref, "metrics.jsonl")), 1e-5, name)
            w = compare_models(os.path.join(d, "model.pt"), os.path.join(ref, "model.pt"),
                               VARIANT_TOLERANCE, name)
            print(f"OK: {name} at 3 ranks: parameters within {w:.2g} of DDP's")
    d = os.path.join(work, "fsdp_accum")
    compare_records(read_records(os.path.join(d, "metrics.jsonl")),
                    read_records(os.path.join(base_accum, "metrics.jsonl")), 1e-5, "fsdp_accum")
    w = compare_models(os.path.join(d, "model.pt"), os.path.join(base_accum, "model.pt"),
                       VARIANT_TOLERANCE, "fsdp --grad-accum 2")
    print(f"OK: --fsdp --grad-accum 2 at 3 ranks: parameters within {w:.2g} of DDP's")


def check_tp(ddprun, gpt, gpt_py, work):
    import torch
    fresh(work)
    common = ["--max-steps", "20", "--log-every", "1", "--dropout", "0"]
    init = os.path.join(work, "init.pt")
    one = cpp_run(ddprun, gpt, work, "one", 1, common + ["--save-init", init, "--save-every", "0"])
    tp_init = os.path.join(work, "tp_init.pt")
    tp = cpp_run(ddprun, gpt, work, "tp", 2, common + ["--tp", "2", "--save-init", tp_init])
    compare_models(tp_init, init, 0, "--tp 2 --save-init (gathered) against 1 rank's")
    worst = compare_records(read_records(os.path.join(tp, "metrics.jsonl")),
                            read_records(os.path.join(one, "metrics.jsonl")), 1e-5, "--tp 2")
    w = compare_models(os.path.join(tp, "model.pt"), os.path.join(one, "model.pt"),
                       VARIANT_TOLERANCE, "--tp 2 against 1 rank")
    print(f"OK: --tp 2 at 2 ranks: losses within {worst:.2g}, parameters within {w:.2g} of "
          "1 rank's")
    check_dcp_folder(tp)

    if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 4):
        py_metrics, py_model = os.path.join(work, "py.jsonl"), os.path.join(work, "py.pt")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", "2"]
        code, out = run(launcher + [gpt_py, "--data", os.path.join(work, "text.txt"),
                                    "--init", init, "--metrics", py_metrics, "--out", py_model,
                                    "--tp", "2"]
                        + [a for a in SMALL if a not in ("--sample-length", "0")] + common,
                        timeout=300, env=env)
        if code != 0:
            fail(f"gpt.py --tp 2 under torchrun: exit code {code}, expected 0", out)
        worst = compare_records(read_records(os.path.join(tp, "metrics.jsonl")),
                                read_records(py_metrics), 1e-5, "C++ --tp 2 against Python's")
        w = compare_models(os.path.join(tp, "model.pt"), py_model, 1e-5,
                           "C++ --tp 2 model.pt against PyTorch's parallelize_module")
        print(f"OK: --tp 2 against PyTorch's parallelize_module (Gloo): losses within "
              f"{worst:.2g}, parameters within {w:.2g}")
    else:
        print(f"(PyTorch {torch.__version__} has no torch.distributed.tensor.parallel: the "
              "Python twin's --tp is not run)")

    ddp2 = cpp_run(ddprun, gpt, work, "ddp2", 2, common + ["--save-every", "0"])
    tp_fsdp = cpp_run(ddprun, gpt, work, "tp_fsdp", 4,
                      common + ["--tp", "2", "--fsdp", "--save-every", "0"])
    worst = compare_records(read_records(os.path.join(tp_fsdp, "metrics.jsonl")),
                            read_records(os.path.join(ddp2, "metrics.jsonl")), 1e-5,
                            "--tp 2 --fsdp at 4 ranks")
    w = compare_models(os.path.join(tp_fsdp, "model.pt"), os.path.join(ddp2, "model.pt"),
                       VARIANT_TOLERANCE, "--tp 2 --fsdp at 4 ranks against DDP at 2")
    print(f"OK: --tp 2 --fsdp at 4 ranks: losses within {worst:.2g}, parameters within "
          f"{w:.2g} of DDP at 2 ranks")


def check_pp(ddprun, gpt, work):
    fresh(work)
    common = ["--max-steps", "20", "--log-every", "1", "--dropout", "0", "--save-every", "0"]
    one = cpp_run(ddprun, gpt, work, "one", 1, common)
    for name, extra in (("pp_1f1b", ["--pp", "2"]),
                        ("pp_gpipe", ["--pp", "2", "--microbatches", "4", "--schedule",
                                      "gpipe"])):
        d = cpp_run(ddprun, gpt, work, name, 2, common + extra)
        worst = compare_records(read_records(os.path.join(d, "metrics.jsonl")),
                                read_records(os.path.join(one, "metrics.jsonl")), 1e-5, name)
        w = compare_models(os.path.join(d, "model.pt"), os.path.join(one, "model.pt"),
                           VARIANT_TOLERANCE, name)
        print(f"OK: {' '.join(extra)} at 2 ranks: losses within {worst:.2g}, parameters "
              f"within {w:.2g} of 1 rank's")
    ddp2 = cpp_run(ddprun, gpt, work, "ddp2", 2, common)
    d = cpp_run(ddprun, gpt, work, "pp_dp", 4, common + ["--pp", "2"])
    worst = compare_records(read_records(os.path.join(d, "metrics.jsonl")),
                            read_records(os.path.join(ddp2, "metrics.jsonl")), 1e-5, "pp_dp")
    w = compare_models(os.path.join(d, "model.pt"), os.path.join(ddp2, "model.pt"),
                       VARIANT_TOLERANCE, "--pp 2 at 4 ranks against DDP at 2")
    print(f"OK: --pp 2 at 4 ranks (two pipelines): losses within {worst:.2g}, parameters "
          f"within {w:.2g} of DDP at 2 ranks")


def check_activation_checkpointing(ddprun, gpt, work):
    fresh(work)
    common = ["--max-steps", "8", "--log-every", "1", "--save-every", "0"]  # dropout 0.1
    for name, extra in (("ddp", []), ("fsdp", ["--fsdp"]),
                        ("amp_accum", ["--amp", "--grad-accum", "2"])):
        ref = cpp_run(ddprun, gpt, work, name, 2, common + extra)
        cmd = [ddprun, "--nproc-per-node", "2", "--", gpt, "--run-dir", work, "--name",
               name + "_ac", "--data", os.path.join(work, "text.txt")] + SMALL + common + extra
        code, out = run(cmd + ["--activation-checkpointing"], 300)
        if code != 0 or "activation checkpointing" not in out:
            fail(f"{name} --activation-checkpointing: exit code {code}, expected 0 and the "
                 "banner to say 'activation checkpointing'", out)
        got = os.path.join(work, name + "_ac")
        compare_records(read_records(os.path.join(got, "metrics.jsonl")),
                        read_records(os.path.join(ref, "metrics.jsonl")), 0, name)
        compare_models(os.path.join(got, "model.pt"), os.path.join(ref, "model.pt"), 0, name)
        print(f"OK: --activation-checkpointing {' '.join(extra)}: the same losses and "
              "parameters, bit for bit")


def children(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def check_dcp_folder(run_dir):
    """The last checkpoint of a sharded run is a DCP folder that PyTorch reads."""
    import torch
    ckpts = os.path.join(run_dir, "checkpoints")
    with open(os.path.join(ckpts, "latest")) as f:
        latest = os.path.join(ckpts, f.read().strip())
    if not os.path.isfile(os.path.join(latest, ".metadata")):
        fail(f"{latest}: expected a DCP folder with .metadata (--fsdp writes DCP checkpoints)")
    try:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    except ImportError:  # PyTorch before 2.3 has no format_utils
        print(f"(PyTorch {torch.__version__} has no dcp_to_torch_save: folder not read)")
        return
    whole = os.path.join(run_dir, "from_dcp.pt")
    dcp_to_torch_save(latest, whole)
    state = torch.load(whole, weights_only=True)
    final = torch.load(os.path.join(run_dir, "model.pt"), weights_only=True)
    if list(state["model"]) != list(final):
        fail(f"dcp_to_torch_save({latest})['model'] has keys {list(state['model'])}, "
             f"model.pt {list(final)}")
    for k, v in final.items():
        if not torch.equal(state["model"][k], v):
            fail(f"dcp_to_torch_save({latest})['model'][{k!r}] differs from model.pt")
    names = set(state["optimizer"]["state"])
    if names != set(final):
        fail(f"the DCP optimizer state is keyed {sorted(names)}, expected the parameter names")
    print(f"OK: PyTorch's dcp_to_torch_save reads {os.path.basename(latest)}: model.pt's "
          "weights bit for bit, AdamW's state by name")


def check_resume(ddprun, gpt, work, *flags):
    fresh(work)
    # 15 steps per epoch (120 training windows, 2 ranks, 4 per batch), 3 epochs; dropout
    # on, so each rank's RNG state must come back too.
    common = ["--max-epochs", "3", "--log-every", "1", "--save-every", "3",
              "--dropout", "0.1"] + list(flags)
    straight = cpp_run(ddprun, gpt, work, "straight", 2, common)

    name = "killed"
    cmd = [ddprun, "--nproc-per-node", "2", "--", gpt, "--run-dir", work, "--name", name,
           "--data", os.path.join(work, "text.txt")] + SMALL + common
    print("$", " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    killed_after = None
    deadline = time.time() + 240
    for line in p.stdout:
        seen.append(line)
        # Rank 0 prints a record per step: kill every worker once step 7 is done (a
        # checkpoint was written at step 6; epoch 1 ends at step 15).
        if killed_after is None and line.startswith("[rank 0]: step      7 "):
            workers = children(p.pid)
            for w in workers:
                os.kill(w, signal.SIGKILL)
            killed_after = 7
            print(f"killed workers {workers} with SIGKILL after step 7", flush=True)
        if time.time() > deadline:
            p.kill()
            fail("the run to be killed did not reach step 7 in time", "".join(seen))
    code = p.wait()
    out = "".join(seen)
    if killed_after is None:
        fail("never saw step 7 to kill the run after", out)
    if code == 0 or "done:" in out:
        fail(f"the killed run finished anyway (exit code {code}): the kill came too late", out)

    code, out = run([ddprun, "--nproc-per-node", "2", "--", gpt, "--run-dir", work, "--name",
                     name, "--data", os.path.join(work, "text.txt"), "--resume"] + SMALL + common,
                    timeout=300)
    if code != 0:
        fail(f"--resume: exit code {code}, expected 0", out)
    marker = "resuming from "
    line = next((l for l in out.splitlines() if marker in l), None)
    if line is None:
        fail("--resume: expected 'resuming from ... step N'", out)
    resumed_step = int(line.split("step ")[1].split(",")[0])
    if resumed_step % 15 == 0 or resumed_step < 6:
        fail(f"--resume continued from step {resumed_step}: expected a step in the middle of "
             "epoch 1 (6, 9 or 12)", out)
    compare_records(read_records(os.path.join(work, name, "metrics.jsonl")),
                    read_records(os.path.join(straight, "metrics.jsonl")), 1e-12,
                    "records after kill -9 and --resume")
    compare_models(os.path.join(work, name, "model.pt"), os.path.join(straight, "model.pt"), 0,
                   "model.pt after kill -9 and --resume")
    print(f"OK: killed after step 7, resumed from step {resumed_step}: bit-identical model")
    if "--fsdp" in flags:
        check_dcp_folder(os.path.join(work, name))


def check_standin(ddprun, gpt, work):
    fresh(work)
    env = dict(os.environ, DDP_DEVICE_STANDIN="1")
    for name, extra in (("ddp", []), ("zero", ["--zero"]), ("fsdp", ["--fsdp"])):
        cmd = [ddprun, "--nproc-per-node", "2", "--", gpt, "--run-dir", work, "--name", name,
               "--data", os.path.join(work, "text.txt"), "--max-steps", "6", "--log-every", "2",
               "--save-every", "3", "--grad-accum", "2"] + SMALL[:-1] + ["20"] + extra
        print("$ DDP_DEVICE_STANDIN=1", " ".join(cmd), flush=True)
        code, out = run(cmd, 240, env=env)
        if code != 0:
            fail(f"{name}: exit code {code}, expected 0", out)
        for needle in ["backend standin, device standin:0", "[rank 0]: step      6",
                       "---- sample ----", "[rank 0]: done: 6 steps"]:
            if needle not in out:
                fail(f"{name}: output lacks {needle!r}", out)
        print(f"OK: {name} on the stand-in device")


def check_data_errors(gpt, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    empty = os.path.join(work, "empty.txt")
    open(empty, "w").close()
    short = os.path.join(work, "short.txt")
    with open(short, "w") as f:
        f.write("Too short for a block of sixteen and its validation.\n")
    latin1 = os.path.join(work, "latin1.txt")
    with open(latin1, "wb") as f:
        f.write(("Caf\u00e9 " * 400).encode("latin-1"))
    good = os.path.join(work, "good.txt")
    write_text(good, 2200)
    cases = [
        ("missing", ["--data", os.path.join(work, "nope.txt")],
         ["cannot open --data", "nope.txt", "fortunes"]),
        ("empty", ["--data", empty], ["empty.txt", "is empty"]),
        ("short", ["--data", short], ["short.txt", "block_size + 1 = 17", "--block-size"]),
        ("not UTF-8", ["--data", latin1], ["latin1.txt", "not UTF-8", "0xe9", "iconv"]),
        ("prompt", ["--data", good, "--max-steps", "1", "--prompt", "the \u00e9"],
         ["--prompt", "U+00E9", "not in the corpus"]),
    ]
    # A text file cut short inside a multi-byte character.
    cut = os.path.join(work, "cut.txt")
    with open(cut, "wb") as f:
        f.write(("caf\u00e9 " * 400).encode("utf-8")[:-2])
    cases.append(("cut short", ["--data", cut], ["cut.txt", "not UTF-8", "0xc3", "byte offset"]))
    for what, args, needles in cases:
        code, out = run([gpt, "--run-dir", work, "--name", "err"] + SMALL[:-2] + args,
                        timeout=120)
        if code != 1:
            fail(f"{what}: exit code {code}, expected 1", out)
        for n in needles:
            if n not in out:
                fail(f"{what}: the error should mention {n!r}", out)
        if "error:" not in out:
            fail(f"{what}: expected 'gpt: error: ...'", out)
        print(f"OK: {what}: {[l for l in out.splitlines() if 'error:' in l][0][:160]}")


def check_torn_metrics(ddprun, gpt, work):
    """A metrics.jsonl whose last line was cut short stops --resume with a message that
    names the file and line and says what to do, before any training."""
    fresh(work)
    common = ["--max-steps", "4", "--log-every", "1", "--save-every", "2"]
    run_dir = cpp_run(ddprun, gpt, work, "torn", 2, common)
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path) as f:
        lines = f.readlines()
    with open(path, "w") as f:
        f.writelines(lines[:-1] + [lines[-1][:len(lines[-1]) // 2]])
    cmd = [ddprun, "--nproc-per-node", "2", "--", gpt, "--run-dir", work, "--name", "torn",
           "--data", os.path.join(work, "text.txt"), "--resume"] + SMALL + common
    code, out = run(cmd, 120)
    if code == 0:
        fail("--resume with a torn metrics.jsonl: exit code 0, expected an error", out)
    for needle in ["metrics.jsonl:%d" % len(lines), "expected one JSON record per line",
                   "delete this line"]:
        if needle not in out:
            fail(f"torn metrics.jsonl: the error should mention {needle!r}", out)
    if "Exception raised from" in out:
        fail("the error carries c10's backtrace", out)
    print("OK: " + next(l for l in out.splitlines() if "error:" in l)[:200])


def main():
    if len(sys.argv) < 2:
        fail(__doc__)
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "python":
        extra = args[4:]
        check_python(args[0], args[1], args[2], args[3], extra)
    elif mode == "variants":
        check_variants(*args)
    elif mode == "tp":
        check_tp(*args)
    elif mode == "pp":
        check_pp(*args)
    elif mode == "activation-checkpointing":
        check_activation_checkpointing(*args)
    elif mode == "resume":
        check_resume(*args)
    elif mode == "standin":
        check_standin(*args)
    elif mode == "data-errors":
        check_data_errors(*args)
    elif mode == "torn-metrics":
        check_torn_metrics(*args)
    else:
        fail(f"unknown mode {mode}\n{__doc__}")


if __name__ == "__main__":
    private_tmp.use()
    main()
