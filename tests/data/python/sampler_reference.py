"""Reference orders from PyTorch itself, for tests/data/sampler_python_test.cpp.

Usage: sampler_reference.py SPEC.json OUT.json
SPEC: {"cases": [{"n", "num_replicas", "rank", "shuffle", "seed", "epoch", "drop_last"}],
       "randperm": [{"n", "seed", "path"}]}
OUT:  {"torch_version": str, "cases": [{"len": int, "indices": [int]}]}
Each randperm entry writes torch.randperm(n, generator=g) after g.manual_seed(seed) to
`path` as raw little-endian int64.
"""
import json
import sys

import torch
from torch.utils.data.distributed import DistributedSampler


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out = {"torch_version": torch.__version__, "cases": []}
    for c in spec["cases"]:
        sampler = DistributedSampler(Sized(c["n"]), num_replicas=c["num_replicas"],
                                     rank=c["rank"], shuffle=c["shuffle"], seed=c["seed"],
                                     drop_last=c["drop_last"])
        sampler.set_epoch(c["epoch"])
        out["cases"].append({"len": len(sampler), "indices": list(iter(sampler))})
    for r in spec.get("randperm", []):
        g = torch.Generator()
        g.manual_seed(r["seed"])
        perm = torch.randperm(r["n"], generator=g)
        assert perm.dtype == torch.int64
        with open(r["path"], "wb") as f:
            f.write(perm.numpy().astype("<i8").tobytes())
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
