"""PyTorch's torch.distributed.pipelining on the data of pipeline_test.cpp.

  pipeline_peer.py DIR STAGES MICROBATCHES BATCH

Reads DIR/init.bin (the test model's parameters, float32, in named_parameters order),
DIR/x.bin and DIR/y.bin ([BATCH, 6] and [BATCH, 3] float32), cuts the model into STAGES
stages as ddp::pipeline_slice does (the first stages one layer more when the 8 layers do
not divide), and runs one step of ScheduleGPipe, then, gradients zeroed, one of
Schedule1F1B, with the mean squared error, in STAGES processes (Gloo on CPUs, FileStore in
DIR). Each rank writes its stage's gradients (float32, in the model's parameter order) to
DIR/py_<schedule>_<rank>.bin, and the last stage the microbatches' losses to
DIR/py_<schedule>_losses.bin. Exits 3 (and says why) when this PyTorch has no
torch.distributed.pipelining.
"""

import faulthandler
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def make_model():
    """pipeline_test.cpp's make_model(): 8 layers, the Linear ones with parameters."""
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 10), nn.Tanh(),
                         nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 10), nn.Linear(10, 3))


def read(path, shape):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.float32).reshape(shape).clone()


def write(path, t):
    t.detach().to(torch.float32).numpy().tofile(path + ".part")
    os.replace(path + ".part", path)


def worker(rank, d, stages, n, batch):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    faulthandler.enable()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "pystore"),
                            rank=rank, world_size=stages)
    model = make_model()
    count = sum(p.numel() for p in model.parameters())
    init = read(os.path.join(d, "init.bin"), (count,))
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            p.copy_(init[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    layers, begin = len(model), 0
    bounds = []
    for s in range(stages):
        size = layers // stages + (1 if s < layers % stages else 0)
        bounds.append((begin, begin + size))
        begin += size
    lo, hi = bounds[rank]
    part = nn.Sequential(*[model[i] for i in range(lo, hi)])
    x = read(os.path.join(d, "x.bin"), (batch, 6))
    y = read(os.path.join(d, "y.bin"), (batch, 3))

    def loss(out, target):
        return ((out - target) ** 2).mean()

    for name, kind in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        for p in part.parameters():
            p.grad = None
        stage = PipelineStage(part, rank, stages, torch.device("cpu"))
        schedule = kind(stage, n, loss_fn=loss)
        losses = []
        if rank == 0:
            schedule.step(x)
        elif rank == stages - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        grads = [p.grad.reshape(-1) for p in part.parameters()]
        write(os.path.join(d, f"py_{name}_{rank}.bin"), torch.cat(grads))
        if rank == stages - 1:
            write(os.path.join(d, f"py_{name}_losses.bin"),
                  torch.stack([l.detach() for l in losses]))
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as fsdp_peer.py: no Gloo teardown at interpreter exit


def main():
    d, stages, n, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    try:
        from torch.distributed.pipelining import PipelineStage  # noqa: F401
    except Exception as e:
        print(f"PyTorch {torch.__version__} has no torch.distributed.pipelining: "
              f"{type(e).__name__}: {e}")
        sys.exit(3)
    # fork: the ranks inherit the imported torch, where spawn would import it again in
    # each (seconds apiece). Nothing before this line starts a thread of ours.
    mp.start_processes(worker, args=(d, stages, n, batch), nprocs=stages, start_method="fork")


if __name__ == "__main__":
    main()
