"""PyTorch's side of bench/run-dcp: the GPT of examples/gpt (its Python twin, gpt.py) under
FSDP2 (fully_shard on each block and the root) with AdamW after one step, saved with
torch.distributed.checkpoint.save and loaded with dcp.load (then set_state_dict), as
bench_dcp does with ddp::dcp. Run one process per rank under a launcher that sets
torchrun's variables:

  ddprun --nproc-per-node 2 --no-prefix -- python bench/dcp_py.py --dir DIR [--other DIR2]

Prints bench_dcp's line of JSON on rank 0 ("side": "python").
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "gpt"))
from gpt import Gpt  # noqa: E402


def timed(repeats, call):
    """The slowest rank's median seconds of `call`, each after a barrier."""
    times = []
    for i in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - t0)
    m = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    return m.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--other", default="")
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--n-embd", type=int, default=512)
    ap.add_argument("--n-head", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    vocab, block = 65, 64
    model = Gpt(vocab, block, a.n_layer, a.n_head, a.n_embd, 0.0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(vocab, (4, block))
    y = torch.randint(vocab, (4 * block,))
    torch.nn.functional.cross_entropy(model(x).reshape(-1, vocab), y).backward()
    opt.step()
    opt.zero_grad()

    def save(i):
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(a.dir, f"py-{i}"))

    def load_from(path):
        def load(_):
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=path)
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        return load

    save_s = timed(a.repeats, save)
    load_s = timed(a.repeats, load_from(os.path.join(a.dir, "py-0")))
    load_other_s = timed(a.repeats, load_from(a.other)) if a.other else 0.0
    if dist.get_rank() == 0:
        folder = os.path.join(a.dir, "py-0")
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        print(json.dumps({"side": "python", "ranks": dist.get_world_size(), "save_s": save_s,
                          "load_s": load_s, "load_other_s": load_other_s, "bytes": size}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
