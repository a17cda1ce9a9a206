"""torch.load as current PyTorch does it: weights_only=True, no safe globals added.

PyTorch 1.13's weights-only unpickler has no BINFLOAT opcode, so on 1.13 it refuses any
file that holds a Python float, Python's own torch.save({"lr": 0.5}) included. load()
then proves that limit on a file Python itself wrote, and only then reads `path` with
weights_only=False. A file that 1.13 refuses for any other reason, and every refusal on
2.x, still fails the test.
"""
import io
import pickle

import torch


def _refuses_python_floats():
    buf = io.BytesIO()
    torch.save({"lr": 0.5}, buf)
    buf.seek(0)
    try:
        torch.load(buf, weights_only=True)
        return False
    except pickle.UnpicklingError:
        return True


def load(path):
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported operand 71" in str(e) and _refuses_python_floats():
            return torch.load(path, weights_only=False)
        raise
