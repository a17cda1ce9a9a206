"""Python's side of py_pickle_test.cpp: pickles written by Python's own pickler and by
torch.distributed.checkpoint for the C++ reader, and checks of pickles written by the C++
writer with Python's own pickle.loads.

  py_pickle_peer.py dumps DIR         DIR/plain_p{0..5}.pkl: pickle.dumps(plain(), protocol)
  py_pickle_peer.py dcp DIR           DIR/.metadata from torch.distributed.checkpoint.save
  py_pickle_peer.py loads KIND FILE   pickle.loads(FILE) must equal expected_KIND()
                                      (KIND: plain or dcp); prints why not and exits 1

Exits 77, saying why on stdout, where this Python lacks what a command needs (PyTorch, or
its torch.distributed.checkpoint), so that the test can skip with that reason.
"""

import collections
import dataclasses
import datetime
import math
import os
import pickle
import sys


@dataclasses.dataclass
class Point:
    x: int
    y: list


def plain():
    """What the C++ test expects to read from DIR/plain_p*.pkl (see PythonWritesCppReads)."""
    shared = [1, 2]
    return {
        "ints": [0, 255, 256, 65535, 65536, -1, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1,
                 2**63 - 1, -(2**63)],
        "floats": [1.5, -0.0, math.inf, -math.inf, 1e-310],
        "str": "h\u00e9llo \u2713 \U0001F600",
        "bytes": b"a\x00b\xff",
        "none": None,
        "bools": (True, False),
        "tuples": ((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)),
        "nested": [[], {}, [[1]]],
        "shared": [shared, shared],
        "point": Point(3, [4]),
        "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
        7: "int key",
    }


def expected_plain():
    """What C++'s WritesWhatPythonReads test writes."""
    shared = [1]
    return {
        "ints": [0, 1, 255, 256, 65535, 65536, -1, -256, -(2**31), 2**31 - 1, 2**31,
                 -(2**31) - 1, 2**40, -(2**40), 2**63 - 1, -(2**63)],
        "floats": (1.5, -0.0, math.inf, -math.inf, math.nan),
        "str": "h\u00e9llo \u2713 \U0001F600",
        "long": "x" * 300,
        "bytes": b"a\x00b\xff",
        "long_bytes": bytes(range(256)) * 2,
        "none": None,
        "bools": [True, False],
        "tuples": ((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)),
        "nested": [[], {}, (), [[1]]],
        "shared": [shared, shared],
        "point": Point(1, [2]),
        "date": datetime.date(2024, 1, 31),
        5: "int key",
    }


def expected_dcp():
    import torch
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, TensorProperties,
                                                       TensorStorageMetadata)
    props = TensorProperties(dtype=torch.float32, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False,
                             strides=(3, 1))
    chunk = ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([2, 3]))
    return {"chunk": chunk,
            "tensor": TensorStorageMetadata(properties=props, size=torch.Size([2, 3]),
                                            chunks=[chunk]),
            "dtype": torch.int64}


def need_dcp():
    try:
        import torch
        import torch.distributed.checkpoint  # noqa: F401
    except Exception as e:  # ImportError, or a torch built without distributed
        print(f"this Python has no torch.distributed.checkpoint ({type(e).__name__}: {e})")
        sys.exit(77)
    return torch


def main(argv):
    cmd = argv[1]
    if cmd == "dumps":
        for protocol in range(6):
            with open(os.path.join(argv[2], f"plain_p{protocol}.pkl"), "wb") as f:
                f.write(pickle.dumps(plain(), protocol=protocol))
    elif cmd == "dcp":
        torch = need_dcp()
        import warnings
        import torch.distributed.checkpoint as dcp
        state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                 "b": torch.zeros(4, dtype=torch.int64), "step": 7, "name": "hi"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
            dcp.save(state, checkpoint_id=argv[2])
    elif cmd == "loads":
        kind, path = argv[2], argv[3]
        if kind == "dcp":
            need_dcp()
        with open(path, "rb") as f:
            got = pickle.loads(f.read())
        want = expected_plain() if kind == "plain" else expected_dcp()
        # repr tells a tuple from a list, 1 from 1.0 and True, -0.0 from 0.0 and shows nan.
        if repr(got) != repr(want):
            print(f"pickle.loads gave\n  {got!r}\nbut expected\n  {want!r}")
            return 1
        if kind == "plain" and got["shared"][0] is not got["shared"][1]:
            print("the two references to one list became two lists")
            return 1
        if kind == "dcp" and (got["chunk"] != want["chunk"] or got["tensor"] != want["tensor"]):
            print(f"equal reprs but != : {got!r}")
            return 1
        print("equal")
    else:
        print(f"unknown command {cmd!r}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
