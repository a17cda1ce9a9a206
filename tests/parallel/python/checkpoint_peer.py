"""PyTorch's torch.utils.checkpoint.checkpoint(..., use_reentrant=False) on the data of
activation_checkpoint_python_test.cpp.

  checkpoint_peer.py DIR THREADS

With THREADS intra-op threads, the C++ side's (LayerNorm's weight gradient sums over the
batch in an order that depends on it). Reads DIR/params.bin (ddp_test::DropBlockImpl's parameters, float32, in named_parameters
order) and DIR/x.bin (the input, float32, [5, 8]). For each case, x requiring grad ("grad")
or not ("nograd"): torch.manual_seed(123), y = checkpoint(block, x, use_reentrant=False),
(y * y).sum().backward(), then writes DIR/py_<case>.bin: y, x's gradient (grad case only),
the parameters' gradients, and the next six draws of torch.rand (where the recompute left
the generator), float32, flattened and concatenated.
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

DIM, P = 8, 0.3


class DropBlock(nn.Module):
    """ddp_test::DropBlockImpl, parameters registered in the same order."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, 4 * DIM)
        self.fc2 = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return x + self.fc2(F.dropout(F.gelu(self.fc1(self.ln(x))), P, self.training))


def read(path, shape):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.float32).reshape(shape).clone()


def main():
    d = sys.argv[1]
    torch.set_num_threads(int(sys.argv[2]))
    block = DropBlock()
    n = sum(p.numel() for p in block.parameters())
    flat = read(os.path.join(d, "params.bin"), (n,))
    with torch.no_grad():
        offset = 0
        for p in block.parameters():
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    x0 = read(os.path.join(d, "x.bin"), (5, DIM))
    for case in ("grad", "nograd"):
        block.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(case == "grad")
        torch.manual_seed(123)
        y = checkpoint(block, x, use_reentrant=False)
        (y * y).sum().backward()
        parts = [y.detach()]
        if case == "grad":
            parts.append(x.grad)
        parts += [p.grad for p in block.parameters()]
        parts.append(torch.rand(6))
        out = torch.cat([t.reshape(-1) for t in parts])
        out.numpy().tofile(os.path.join(d, "py_%s.bin" % case))


if __name__ == "__main__":
    main()
