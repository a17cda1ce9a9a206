"""PyTorch's DDP with its powerSGD_hook on the data of powersgd_python_test.cpp.

  powersgd_peer.py DIR WORLD RANK EF_AND_WARM BUCKET_VIEW STEPS [DIR WORLD ...]

For each run (six arguments each; several runs share one start-up of torch), reads DIR/init.bin (flat float32 parameters of the test's MLP 32-64-64-8), DIR/x.bin and
DIR/y.bin (float32, [STEPS, WORLD * 4, 32] and [..., 8]), trains with DDP and
powerSGD_hook (matrix_approximation_rank RANK, start_powerSGD_iter 2, error feedback and
warm start both EF_AND_WARM, random_seed 0) and SGD(lr 0.05) in WORLD processes (Gloo,
FileStore in DIR), and writes rank 0's final parameters to DIR/py.bin and the hook's
compression statistics to DIR/py_stats.txt. Prints "no powerSGD_hook" and exits 3 where
this PyTorch lacks it.
"""

import faulthandler
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

PER_RANK = 4


def read(path, shape):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.float32).reshape(shape).clone()


def worker(r, d, world, rank, ef_warm, bucket_view, steps):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    faulthandler.enable()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "pystore"),
                            rank=r, world_size=world)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 8))
    n = sum(p.numel() for p in model.parameters())
    init = read(os.path.join(d, "init.bin"), (n,))
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            p.copy_(init[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    x = read(os.path.join(d, "x.bin"), (steps, world * PER_RANK, 32))
    y = read(os.path.join(d, "y.bin"), (steps, world * PER_RANK, 8))
    ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=bucket_view)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                   start_powerSGD_iter=2, use_error_feedback=ef_warm,
                                   warm_start=ef_warm, random_seed=0)
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for s in range(steps):
        opt.zero_grad(set_to_none=not bucket_view)
        rows = slice(r * PER_RANK, (r + 1) * PER_RANK)
        F.mse_loss(ddp(x[s, rows]), y[s, rows]).backward()
        opt.step()
    if r == 0:
        torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tofile(
            os.path.join(d, "py.bin.part"))
        os.replace(os.path.join(d, "py.bin.part"), os.path.join(d, "py.bin"))
        rate, before, after = state.compression_stats()
        with open(os.path.join(d, "py_stats.txt"), "w") as f:
            f.write(f"{state.iter} {before} {after}\n")
    dist.barrier()
    # Done and written: leave without PyTorch's teardown (fsdp_peer.py says why).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    args = sys.argv[1:]
    if not args or len(args) % 6:
        sys.exit("usage: powersgd_peer.py DIR WORLD RANK EF_AND_WARM BUCKET_VIEW STEPS [...]")
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook  # noqa: F401
    except Exception as e:
        print(f"no powerSGD_hook in PyTorch {torch.__version__}: {e}")
        sys.exit(3)
    for i in range(0, len(args), 6):
        d = args[i]
        world, rank, ef_warm, bucket_view, steps = (int(a) for a in args[i + 1:i + 6])
        # fork: the ranks inherit the imported torch, where spawn would import it again in
        # each (seconds apiece). Nothing before this line starts a thread of ours.
        mp.start_processes(worker, args=(d, world, rank, bool(ef_warm), bool(bucket_view), steps),
                           nprocs=world, start_method="fork")


if __name__ == "__main__":
    main()
