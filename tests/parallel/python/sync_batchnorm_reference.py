"""PyTorch's side of SyncBatchNormPythonTest (tests/parallel/sync_batchnorm_test.cpp).

  sync_batchnorm_reference.py STATE_DICT PROBE_BIN OUT_BIN

STATE_DICT is the state dict of a C++ Sequential(Conv2d(2, 3, 3), BatchNorm2d(3), ReLU)
whose BatchNorm2d was converted to ddp::SyncBatchNorm and trained for two steps, written
with torch::pickle_save. It must load, strictly, into the same model built from
nn.BatchNorm2d (and hold the keys of nn.SyncBatchNorm too), and the model in eval mode
must map PROBE_BIN ([2, 2, 6, 6] float32) to OUT_BIN ([2, 3, 4, 4] float32), C++'s
output, within 1e-5. Exits 1 naming the first difference.
"""
import sys

import torch
from torch import nn


def read(path, shape):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.float32).reshape(shape).clone()


def fail(message):
    print("sync_batchnorm_reference: " + message)
    sys.exit(1)


def main(state_path, probe_path, out_path):
    # LibTorch's pickle_save tags its typed dict with torch.jit._pickle.restore_type_tag,
    # a global that the weights-only unpickler does not allow; the file is our own.
    state = torch.load(state_path, weights_only=False)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU())
    model.load_state_dict(state, strict=True)  # raises on a missing or unexpected key

    bn_keys = {k for k in state if k.startswith("1.")}
    sync_keys = {"1." + k for k in nn.SyncBatchNorm(3).state_dict()}
    if bn_keys != sync_keys:
        fail(f"BatchNorm keys {sorted(bn_keys)} != nn.SyncBatchNorm's {sorted(sync_keys)}")
    tracked = state["1.num_batches_tracked"]
    if tracked.dtype != torch.int64 or tracked.dim() != 0 or int(tracked) != 2:
        fail(f"num_batches_tracked should be a 0-dim int64 tensor holding 2, got {tracked!r}")
    if torch.equal(state["1.running_var"], torch.ones(3)):
        fail("running_var still holds its initial value: the C++ side did not train")

    model.eval()
    with torch.no_grad():
        got = model(read(probe_path, (2, 2, 6, 6)))
    want = read(out_path, (2, 3, 4, 4))
    diff = (got - want).abs().max().item()
    if diff > 1e-5:
        fail(f"eval output differs from C++'s by up to {diff}")
    print(f"sync_batchnorm_reference: ok (max difference {diff:.3g})")


if __name__ == "__main__":
    main(*sys.argv[1:])
