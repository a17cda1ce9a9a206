"""Loads a fully_shard model's full state dict and checkpoint in plain PyTorch.

  fsdp_load.py STATE CHECKPOINT OUT

STATE is ddp::save_state_dict(ddp::full_state_dict(model)); CHECKPOINT a ddp::
save_checkpoint of the same sharded model. Both are read with torch.load(weights_only=True)
into fsdp_peer.TinyGpt (a plain nn.Module, strict keys and shapes); writes the
parameters of each, flat float32, to OUT.state.bin and OUT.ckpt.bin.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from fsdp_peer import TinyGpt  # noqa: E402
from weights_only import load  # noqa: E402


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main():
    state_path, ckpt_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    model = TinyGpt()
    model.load_state_dict(load(state_path))
    flat(model).numpy().tofile(out + ".state.bin")
    ckpt = load(ckpt_path)
    model = TinyGpt()
    model.load_state_dict(ckpt["model"])
    flat(model).numpy().tofile(out + ".ckpt.bin")
    # The optimizer's state is the unsharded one: full shapes, one entry per parameter.
    shapes = [tuple(p.shape) for p in model.parameters()]
    for i, entry in ckpt["optimizer"]["state"].items():
        assert tuple(entry["exp_avg"].shape) == shapes[i], (i, entry["exp_avg"].shape, shapes[i])
    print("loaded", len(ckpt["optimizer"]["state"]), "optimizer entries")


if __name__ == "__main__":
    main()
