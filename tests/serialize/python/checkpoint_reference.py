"""PyTorch's side of tests/serialize/checkpoint_python_test.cpp.

  checkpoint_reference.py continue CKPT KIND OUT_STATE_DICT REPORT_JSON
      Loads a ddp-cpp checkpoint with torch.load, loads its model and optimizer state
      into the Python twin of the C++ test model and a torch.optim optimizer of KIND
      ("sgd" or "adam"), takes one training step on extra["x"], extra["y"], saves the
      model's state_dict and reports what it saw.
  checkpoint_reference.py scaler CKPT REPORT_JSON
      Reads a checkpoint saved with a GradScaler: reports ckpt["scaler"] as torch.load
      returns it, and what torch.amp.GradScaler("cpu").load_state_dict makes of it (where
      this torch has a CPU GradScaler; 1.13 has none: "grad_scaler" is then null).
  checkpoint_reference.py export OUT_STATE_DICT OUT_IO OUT_SINGLE
      Saves a trained-looking twin's state_dict, an input with the model's output in
      eval mode, and a one-entry dict (pickled with SETITEM), for the C++ side to load.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import weights_only  # noqa: E402


class Net(nn.Module):
    """The twin of ddp_test::NetImpl (tests/serialize/checkpoint_test_util.h)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        self.head = nn.Sequential(nn.Linear(4 * 4 * 4, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        return self.head(x.flatten(1))


def to_json(value):
    if isinstance(value, torch.Tensor):
        return {"tensor": list(value.shape)}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def continue_training(ckpt_path, kind, out_path, report_path):
    ckpt = weights_only.load(ckpt_path)  # torch.load as 2.6+ does by default
    net = Net()
    python_sd = net.state_dict()
    report = {
        "type": type(ckpt).__name__,
        "top_keys": list(ckpt.keys()),
        "model_keys": list(ckpt["model"].keys()),
        "python_keys": list(python_sd.keys()),
        "shapes_match": all(list(ckpt["model"][k].shape) == list(v.shape)
                            for k, v in python_sd.items() if k in ckpt["model"]),
        "epoch": ckpt["epoch"],
        "step": ckpt["step"],
        "world_size": ckpt["world_size"],
        "note": ckpt["extra"]["note"],
        "rng_cpu_bytes": ckpt["rng"][0]["cpu"].numel(),
        "rng_cpu_matches_format": ckpt["rng"][0]["cpu"].numel() == torch.get_rng_state().numel(),
        "sampler": to_json(ckpt["sampler"]),
        "optimizer_type": ckpt["optimizer"]["type"],
        "param_names": ckpt["optimizer"]["param_names"],
        "python_param_names": [n for n, _ in net.named_parameters()],
    }
    net.load_state_dict(ckpt["model"])  # strict: same keys, same shapes
    if kind == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=123.0)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=123.0)
    opt.load_state_dict(ckpt["optimizer"])
    report["lr"] = opt.param_groups[0]["lr"]
    report["state_entries"] = len(opt.state_dict()["state"])
    net.train()
    opt.zero_grad()
    F.mse_loss(net(ckpt["extra"]["x"]), ckpt["extra"]["y"]).backward()
    opt.step()
    torch.save(net.state_dict(), out_path, _use_new_zipfile_serialization=True)
    with open(report_path, "w") as f:
        json.dump(report, f)


def scaler(ckpt_path, report_path):
    ckpt = weights_only.load(ckpt_path)
    saved = ckpt["scaler"]
    report = {
        "type": type(saved).__name__,
        "keys": list(saved.keys()),
        "types": {k: type(v).__name__ for k, v in saved.items()},
        "values": saved,
        "torch": torch.__version__,
        "grad_scaler": None,
    }
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        s = torch.amp.GradScaler("cpu")
        s.load_state_dict(saved)
        # The scale lives on the first scaled tensor's device; use it once, as training would.
        s.scale(torch.ones(()))
        report["grad_scaler"] = {"get_scale": s.get_scale(), "state_dict": s.state_dict()}
    with open(report_path, "w") as f:
        json.dump(report, f)


def export(out_path, io_path, single_path):
    torch.manual_seed(0)
    net = Net()
    net.train()
    net(torch.randn(8, 1, 6, 6))  # moves the BatchNorm running statistics
    net.eval()
    x = torch.randn(2, 1, 6, 6)
    with torch.no_grad():
        y = net(x)
    torch.save(net.state_dict(), out_path, _use_new_zipfile_serialization=True)
    torch.save({"x": x, "y": y}, io_path, _use_new_zipfile_serialization=True)
    torch.save({"only": torch.arange(5)}, single_path, _use_new_zipfile_serialization=True)


if __name__ == "__main__":
    if sys.argv[1] == "continue":
        continue_training(*sys.argv[2:6])
    elif sys.argv[1] == "scaler":
        scaler(*sys.argv[2:4])
    elif sys.argv[1] == "export":
        export(*sys.argv[2:5])
    else:
        sys.exit("unknown mode " + sys.argv[1])
