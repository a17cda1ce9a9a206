#!/usr/bin/python3
"""Checks examples/fashion_mnist from the outside, with PyTorch as the reference.

  check_examples.py run DDPRUN FASHION_MNIST WORKDIR
      Trains 1 epoch on a few hundred images with 2 ranks under ddprun, then checks:
      the program ran end to end; model.pt and the latest checkpoint load with
      torch.load and hold the keys and shapes of the same CNN written in Python; the
      test accuracy it reported equals what PyTorch computes with the saved weights on
      the same test images (so each test image was counted exactly once); the metrics
      file parses; --resume continues with epoch 2, keeps epoch 1's record and ends with
      the model an uninterrupted 2-epoch run (with --trace) ends with.

  check_examples.py amp DDPRUN FASHION_MNIST WORKDIR
      --amp (bfloat16 autocast on this CPU) with 2 ranks: 1 epoch then --resume for epoch
      2 ends with exactly the model of an uninterrupted 2-epoch --amp run; the checkpoint
      holds the (disabled) scaler's state as Python's GradScaler.state_dict() would; the
      weights are float32 and finite.

  check_examples.py standin DDPRUN FASHION_MNIST WORKDIR
      The GPU path on a CPU: 2 ranks with DDP_DEVICE_STANDIN=1 (NCCL's rules on a
      stand-in device) train 1 epoch with --sync-bn and must end normally.

  check_examples.py metrics-window DDPRUN FASHION_MNIST WORKDIR
      A kill between an epoch's metrics record and its checkpoint loses nothing: after 2
      epochs, the second epoch's checkpoint is removed (and `latest` with it), which is
      the state such a kill leaves; --resume then redoes epoch 2 and ends with the records
      and the model of an uninterrupted 2-epoch run.

  check_examples.py minimal DDPRUN MINIMAL
      examples/minimal.cpp under ddprun with 2 ranks: exits 0, rank 0 alone prints its
      loss, and the loss falls.

  check_examples.py data-errors FASHION_MNIST WORKDIR
      A missing data folder, a truncated file and a corrupt gzip stream each stop the
      program with an error naming the file and the package to install.

  check_examples.py backend-help FASHION_MNIST [HEADER]
      --help's --backend entry states what an empty backend becomes in the words of the
      "Empty: ..." sentence of InitOptions::backend's doc comment in HEADER (default:
      include/ddp/distributed/options.h), and names each backend listed before it.
      Needs no data and no torch in Python.
"""
import gzip
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import private_tmp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
PROCESS_GROUP_H = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include",
                               "ddp", "distributed", "options.h")

PACKAGE_HINT = "apt-get install dataset-fashion-mnist"
DATA_DIR = "/usr/share/datasets/fashion-mnist"
TRAIN_SAMPLES, TEST_SAMPLES, LR = 384, 201, 0.002


def fail(msg, output=""):
    print("FAIL:", msg)
    if output:
        print("---- program output ----\n" + output)
    sys.exit(1)


def run(cmd, timeout):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout


def with_option(args, flag, value):
    """args with the value after `flag` replaced."""
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def python_net():
    """The example's CNN, written independently in Python."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3)
            self.conv2 = nn.Conv2d(32, 64, 3)
            self.fc1 = nn.Linear(64 * 5 * 5, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = F.relu(self.fc1(x.flatten(1)))
            return self.fc2(x)

    return Net()


def check_state_dict(state, what):
    import torch
    expected = {k: tuple(v.shape) for k, v in python_net().state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if list(got) != list(expected):
        fail(f"{what}: keys {list(got)}, expected {list(expected)} (in this order)")
    for k in expected:
        if got[k] != expected[k]:
            fail(f"{what}: {k} has shape {got[k]}, expected {expected[k]}")
        if not torch.isfinite(state[k]).all():
            fail(f"{what}: {k} holds non-finite values")


def test_images(n):
    import numpy as np
    import torch
    with gzip.open(os.path.join(DATA_DIR, "t10k-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:n]
    with gzip.open(os.path.join(DATA_DIR, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    x = (torch.tensor(images.copy()).float() / 255 - 0.2860) / 0.3530
    return x, torch.tensor(labels.copy()).long()


def read_metrics(path):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    keys = ["epoch", "train_loss", "test_accuracy", "samples_per_s", "seconds", "world_size"]
    for r in records:
        if sorted(r) != sorted(keys):
            fail(f"{path}: record {r} has keys {sorted(r)}, expected {sorted(keys)}")
    return records


def cmd_metrics_window(ddprun, binary, work):
    import torch
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    base = [ddprun, "--nproc-per-node", "2", "--", binary, "--epochs", "2", "--train-samples",
            str(TRAIN_SAMPLES), "--test-samples", str(TEST_SAMPLES), "--batch-size", "32",
            "--lr", str(LR), "--threads", "1", "--run-dir", work, "--progress", "none"]
    for name in ("straight", "killed"):
        code, out = run(base + ["--name", name], timeout=200)
        if code != 0:
            fail(f"{name}: exit code {code}, expected 0", out)
    killed = os.path.join(work, "killed")
    ckpts = os.path.join(killed, "checkpoints")
    files = sorted((f for f in os.listdir(ckpts) if f.endswith(".pt")),
                   key=lambda f: int(f.split("-")[1].split(".")[0]))
    if len(files) != 2:
        fail(f"expected one checkpoint per epoch, found {files}")
    # The order itself: the record first, then the checkpoint. (The other way round, a
    # kill between them left a checkpoint saying epoch 2 was done and no record of it.)
    metrics_time = os.stat(os.path.join(killed, "metrics.jsonl")).st_mtime_ns
    ckpt_time = os.stat(os.path.join(ckpts, files[-1])).st_mtime_ns
    if metrics_time > ckpt_time:
        fail(f"metrics.jsonl was written {(metrics_time - ckpt_time) / 1e6:.1f} ms after epoch "
             "2's checkpoint: a kill between them loses the record")
    # The state a kill leaves between epoch 2's record and its checkpoint: the record is
    # written, the checkpoint is not, `latest` still names epoch 1's.
    os.remove(os.path.join(ckpts, files[-1]))
    with open(os.path.join(ckpts, "latest"), "w") as f:
        f.write(files[0] + "\n")
    if [m["epoch"] for m in read_metrics(os.path.join(killed, "metrics.jsonl"))] != [1, 2]:
        fail("the metrics record of epoch 2 should be written before its checkpoint")
    code, out = run(base + ["--name", "killed", "--resume"], timeout=200)
    if code != 0 or "resuming from" not in out:
        fail(f"--resume: exit code {code}, expected 0 and 'resuming from'", out)
    straight = read_metrics(os.path.join(work, "straight", "metrics.jsonl"))
    resumed = read_metrics(os.path.join(killed, "metrics.jsonl"))
    if [m["epoch"] for m in resumed] != [1, 2]:
        fail(f"after --resume: records of epochs {[m['epoch'] for m in resumed]}, expected "
             "[1, 2] (none lost, none twice)", out)
    for a, b in zip(straight, resumed):
        for key in ("train_loss", "test_accuracy"):
            if abs(a[key] - b[key]) > 1e-6 * max(1.0, abs(a[key])):
                fail(f"epoch {a['epoch']}: {key} {b[key]} after the resume, {a[key]} straight")
    m1 = torch.load(os.path.join(work, "straight", "model.pt"), weights_only=True)
    m2 = torch.load(os.path.join(killed, "model.pt"), weights_only=True)
    for k in m1:
        if not torch.equal(m1[k], m2[k]):
            fail(f"model.pt after the resume differs from the uninterrupted run's at {k}")
    print("OK: a kill between epoch 2's record and its checkpoint loses nothing")


def cmd_run(ddprun, binary, work):
    import torch
    import weights_only
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    args = [ddprun, "--nproc-per-node", "2", "--", binary, "--epochs", "1",
            "--train-samples", str(TRAIN_SAMPLES), "--test-samples", str(TEST_SAMPLES),
            "--batch-size", "32", "--lr", str(LR), "--threads", "1", "--run-dir", work,
            "--name", "t", "--progress", "plain"]
    code, out = run(args, timeout=150)
    if code != 0:
        fail(f"exit code {code}, expected 0", out)
    for needle in ["[rank 0]: epoch 1/1  train loss", "test accuracy", "[rank 0]: done:"]:
        if needle not in out:
            fail(f"output lacks {needle!r}", out)
    if "[rank 1]: epoch" in out:
        fail("rank 1 printed an epoch line; only rank 0 should", out)

    run_dir = os.path.join(work, "t")
    metrics = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    if [m["epoch"] for m in metrics] != [1] or metrics[0]["world_size"] != 2:
        fail(f"metrics.jsonl: {metrics}, expected one record for epoch 1, world_size 2")

    # The saved model: Python's keys and shapes, and the accuracy the program reported.
    state = torch.load(os.path.join(run_dir, "model.pt"), weights_only=True)
    check_state_dict(state, "model.pt")
    net = python_net()
    net.load_state_dict(state)
    net.eval()
    x, y = test_images(TEST_SAMPLES)
    with torch.no_grad():
        correct = int((net(x).argmax(1) == y).sum())
    reported = metrics[0]["test_accuracy"] * TEST_SAMPLES
    if abs(reported - correct) > 1e-6:
        fail(f"the program reported test accuracy {metrics[0]['test_accuracy']} "
             f"({reported:.3f} of {TEST_SAMPLES}); PyTorch counts {correct} correct with the "
             f"saved weights", out)

    # The checkpoint: a plain dict with the same model and Adam's state.
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    with open(os.path.join(ckpt_dir, "latest")) as f:
        latest = f.read().strip()
    ckpt = weights_only.load(os.path.join(ckpt_dir, os.path.basename(latest)))
    check_state_dict(ckpt["model"], "checkpoint['model']")
    if ckpt["epoch"] != 1 or ckpt["world_size"] != 2:
        fail(f"checkpoint: epoch {ckpt['epoch']}, world_size {ckpt['world_size']}; "
             "expected 1 and 2")
    lr = ckpt["optimizer"]["param_groups"][0]["lr"]
    if abs(lr - LR) > 1e-12:
        fail(f"checkpoint: optimizer lr {lr}, expected {LR}")
    for k in state:
        if not torch.equal(state[k], ckpt["model"][k]):
            fail(f"model.pt and the final checkpoint differ at {k}")

    # --resume: continues with epoch 2 and keeps epoch 1's record.
    code, out = run(with_option(args, "--epochs", "2") + ["--resume"], timeout=150)
    if code != 0:
        fail(f"--resume: exit code {code}, expected 0", out)
    if "resuming from" not in out or "epoch 1/2  train" in out or "epoch 2/2  train" not in out:
        fail("--resume: expected 'resuming from ...' and only epoch 2 to run", out)
    resumed = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    if [m["epoch"] for m in resumed] != [1, 2] or resumed[0] != metrics[0]:
        fail(f"--resume: metrics {resumed}, expected epoch 1's record {metrics[0]} then epoch 2")
    # ... and ends where an uninterrupted 2-epoch run ends: the checkpoint restored the
    # optimizer state, the sampler's order and every rank's RNG (dropout).
    # (With --trace too: tracing must not change the numbers, and each rank writes one.)
    code, out = run(with_option(with_option(args, "--epochs", "2"), "--name", "straight")
                    + ["--trace"], timeout=150)
    if code != 0:
        fail(f"2 epochs straight: exit code {code}, expected 0", out)
    for r in range(2):
        with open(os.path.join(work, "straight", f"trace-rank{r}.json")) as f:
            trace = json.load(f)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        if not any(e.get("name") == "all_reduce" for e in events):
            fail(f"trace-rank{r}.json has no all_reduce event")
    straight = read_metrics(os.path.join(work, "straight", "metrics.jsonl"))
    for key in ["train_loss", "test_accuracy"]:
        if abs(straight[1][key] - resumed[1][key]) > 1e-6 * max(1.0, abs(straight[1][key])):
            fail(f"epoch 2's {key}: {resumed[1][key]} after --resume, {straight[1][key]} "
                 "without a stop; expected the same")
    a = torch.load(os.path.join(run_dir, "model.pt"), weights_only=True)
    b = torch.load(os.path.join(work, "straight", "model.pt"), weights_only=True)
    for k in a:
        if not torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6):
            fail(f"model.pt after --resume differs from 2 epochs straight at {k}: max diff "
                 f"{(a[k] - b[k]).abs().max().item()}")

    with open(os.path.join(run_dir, "curves.svg")) as f:
        svg = f.read()
    if not svg.startswith("<svg") or svg.count("<polyline") != 2:
        fail("curves.svg: expected an <svg> with two series")
    print("OK")


def cmd_amp(ddprun, binary, work):
    import torch
    import weights_only
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    args = [ddprun, "--nproc-per-node", "2", "--", binary, "--amp", "--epochs", "1",
            "--train-samples", str(TRAIN_SAMPLES), "--test-samples", str(TEST_SAMPLES),
            "--batch-size", "32", "--lr", str(LR), "--threads", "1", "--run-dir", work,
            "--name", "t", "--progress", "none"]
    code, out = run(args, timeout=150)
    if code != 0 or "mixed precision (bfloat16)" not in out:
        fail(f"--amp: exit code {code}, expected 0 and a line naming bfloat16", out)
    code, out = run(with_option(args, "--epochs", "2") + ["--resume"], timeout=150)
    if code != 0 or "resuming from" not in out:
        fail(f"--amp --resume: exit code {code}, expected 0 and 'resuming from'", out)
    code, out = run(with_option(with_option(args, "--epochs", "2"), "--name", "straight"),
                    timeout=150)
    if code != 0:
        fail(f"--amp, 2 epochs straight: exit code {code}, expected 0", out)
    a = torch.load(os.path.join(work, "t", "model.pt"), weights_only=True)
    b = torch.load(os.path.join(work, "straight", "model.pt"), weights_only=True)
    check_state_dict(a, "model.pt (--amp)")
    for k in a:
        if a[k].dtype != torch.float32:
            fail(f"--amp: {k} is {a[k].dtype}; the weights should stay float32")
        if not torch.equal(a[k], b[k]):
            fail(f"--amp: model.pt after --resume differs from 2 epochs straight at {k}: max "
                 f"diff {(a[k] - b[k]).abs().max().item()}")
    ckpt_dir = os.path.join(work, "t", "checkpoints")
    with open(os.path.join(ckpt_dir, "latest")) as f:
        ckpt = weights_only.load(os.path.join(ckpt_dir, os.path.basename(f.read().strip())))
    if ckpt.get("scaler") != {}:
        fail(f"--amp on a CPU: checkpoint['scaler'] is {ckpt.get('scaler')!r}; expected {{}}, "
             "the state_dict() of a disabled GradScaler")
    print("OK")


def cmd_standin(ddprun, binary, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    args = [ddprun, "--nproc-per-node", "2", "--", binary, "--epochs", "1", "--sync-bn",
            "--train-samples", "256", "--test-samples", "64", "--batch-size", "32",
            "--threads", "1", "--run-dir", work, "--name", "t", "--progress", "none"]
    env = dict(os.environ, DDP_DEVICE_STANDIN="1")
    print("$ DDP_DEVICE_STANDIN=1", " ".join(args), flush=True)
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240, env=env)
    if p.returncode != 0:
        fail(f"exit code {p.returncode}, expected 0", p.stdout)
    for needle in ["backend standin, device standin:0", "[rank 0]: epoch 1/1  train loss",
                   "[rank 0]: done:"]:
        if needle not in p.stdout:
            fail(f"output lacks {needle!r}", p.stdout)
    metrics = read_metrics(os.path.join(work, "t", "metrics.jsonl"))
    if [m["epoch"] for m in metrics] != [1] or metrics[0]["world_size"] != 2:
        fail(f"metrics.jsonl: {metrics}, expected one record for epoch 1, world_size 2")
    # PowerSGD on the stand-in: every factor on the rank's device; its state checkpointed.
    args = with_option([a for a in args if a != "--sync-bn"], "--name", "p") + [
        "--powersgd-rank", "2", "--powersgd-start", "2"]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240, env=env)
    if p.returncode != 0 or "[rank 0]: done:" not in p.stdout:
        fail(f"--powersgd-rank 2 on the stand-in: exit code {p.returncode}", p.stdout)
    print("OK")


def cmd_minimal(ddprun, binary):
    code, out = run([ddprun, "--nproc-per-node", "2", "--", binary], timeout=80)
    if code != 0:
        fail(f"exit code {code}, expected 0", out)
    losses = [float(line.split("loss")[1]) for line in out.splitlines()
              if line.startswith("[rank 0]: step")]
    if len(losses) != 5 or "[rank 1]: step" in out:
        fail("expected 5 loss lines, all from rank 0", out)
    if not losses[-1] < 0.5 * losses[0]:
        fail(f"the loss did not fall: {losses}", out)
    print("OK", losses)

    # A misconfigured launch: the message, then a clean exit 1 (no terminate, no trace).
    env = dict(os.environ, RANK="3", WORLD_SIZE="3", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    p = subprocess.run([binary], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=30, env=env)
    if p.returncode != 1:
        fail(f"RANK=3 WORLD_SIZE=3: exit code {p.returncode}, expected 1", p.stdout)
    if "error: RANK=3 must be < WORLD_SIZE=3" not in p.stdout:
        fail("RANK=3 WORLD_SIZE=3: the message is missing", p.stdout)
    for noise in ("terminate called", "Exception raised from", "frame #"):
        if noise in p.stdout:
            fail(f"RANK=3 WORLD_SIZE=3: the output has '{noise}'", p.stdout)
    print("OK: a bad launch ends with", p.stdout.strip().splitlines()[-1])


def expect_data_error(binary, data_dir, work, bad_file, also=()):
    code, out = run([binary, "--data-dir", data_dir, "--run-dir", work, "--epochs", "1",
                     "--progress", "none"], timeout=60)
    if code == 0:
        fail(f"--data-dir {data_dir}: exit code 0, expected an error", out)
    for needle in [PACKAGE_HINT, os.path.join(data_dir, bad_file), *also]:
        if needle not in out:
            fail(f"--data-dir {data_dir}: the error lacks {needle!r}", out)
    error = [line for line in out.splitlines() if "error:" in line]
    print("ok:", error[0] if error else out.strip().splitlines()[0], flush=True)


def cmd_data_errors(binary, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    images, labels = "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"

    # 1. An empty folder.
    empty = os.path.join(work, "empty")
    os.makedirs(empty)
    expect_data_error(binary, empty, work, images, also=["No such file"])

    # 2. A well-formed gzip whose header promises 60000 images but holds 10.
    truncated = os.path.join(work, "truncated")
    os.makedirs(truncated)
    with gzip.open(os.path.join(truncated, images), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, 60000, 28, 28) + bytes(10 * 28 * 28))
    expect_data_error(binary, truncated, work, images, also=["truncated"])

    # 3. A gzip stream cut in the middle (a download that stopped).
    cut = os.path.join(work, "cut")
    os.makedirs(cut)
    payload = struct.pack(">IIII", 0x803, 100, 28, 28) + os.urandom(100 * 28 * 28)
    blob = gzip.compress(payload)
    with open(os.path.join(cut, images), "wb") as f:
        f.write(blob[: len(blob) // 2])
    expect_data_error(binary, cut, work, images)

    # 4. Good images, but a label file with the wrong magic number.
    magic = os.path.join(work, "magic")
    os.makedirs(magic)
    with gzip.open(os.path.join(magic, images), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, 2, 28, 28) + bytes(2 * 28 * 28))
    with gzip.open(os.path.join(magic, labels), "wb") as f:
        f.write(struct.pack(">II", 0x803, 2) + bytes(2))
    expect_data_error(binary, magic, work, labels, also=["magic number 0x00000803"])
    print("OK")


def backend_doc(header):
    """InitOptions::backend's doc comment in `header`, on one line: (the backends it lists
    before the rule, the rule's sentence "Empty: ...")."""
    with open(header) as f:
        lines = f.read().splitlines()
    struct_at = next((i for i, line in enumerate(lines) if line.startswith("struct InitOptions")),
                     None)
    member_at = next((i for i in range(struct_at or 0, len(lines))
                      if re.match(r"\s*TORCH_ARG\(std::string, backend\)", lines[i])), None)
    if struct_at is None or member_at is None:
        fail(f"{header}: no InitOptions::backend (TORCH_ARG(std::string, backend) in struct "
             "InitOptions); update check_examples.py")
    comment = []
    for line in reversed(lines[struct_at + 1:member_at]):
        if not line.strip().startswith("///"):
            break
        comment.insert(0, line.strip()[3:])
    text = " ".join(" ".join(comment).split())
    rule = re.search(r"\bEmpty: .*?\.(?=\s|$)", text)
    if not rule:
        fail(f"{header}: InitOptions::backend's doc comment has no sentence \"Empty: ...\"; "
             "update check_examples.py", text)
    return re.findall(r'"(\w+)"', text[:rule.start()]), rule.group(0)


def option_entry(help_text, flag):
    """The entry of `flag` in CLI11's --help output on one line (whitespace collapsed), or
    None. A long description goes on under the option's line, indented."""
    lines = help_text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*(-\w,\s*)?%s\b" % re.escape(flag), line):
            entry = [line]
            for more in lines[i + 1:]:
                if not more.strip() or re.match(r"\s*-", more):
                    break
                entry.append(more)
            return " ".join(" ".join(entry).split())
    return None


def cmd_backend_help(binary, header=PROCESS_GROUP_H):
    backends, rule = backend_doc(header)
    code, out = run([binary, "--help"], timeout=60)
    if code != 0:
        fail(f"--help: exit code {code}", out)
    entry = option_entry(out, "--backend")
    if entry is None:
        fail("--help has no --backend option", out)
    if rule not in entry:
        fail(f"--help's --backend does not state the rule of InitOptions::backend ({header}):\n"
             f"  rule : {rule}\n  help : {entry}\n"
             "Copy the rule's sentence into the option's help in examples/fashion_mnist.cpp.")
    named = entry[:entry.index(rule)]
    missing = [b for b in backends if not re.search(r"\b%s\b" % re.escape(b), named)]
    if missing:
        fail(f"--help's --backend does not name {missing}, which InitOptions::backend lists "
             f"({header})", entry)
    print("OK:", entry)


if __name__ == "__main__":
    private_tmp.use()
    if len(sys.argv) == 5 and sys.argv[1] == "run":
        cmd_run(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "amp":
        cmd_amp(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "metrics-window":
        cmd_metrics_window(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "standin":
        cmd_standin(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "minimal":
        cmd_minimal(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "data-errors":
        cmd_data_errors(*sys.argv[2:])
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "backend-help":
        cmd_backend_help(*sys.argv[2:])
    else:
        sys.exit(__doc__)
