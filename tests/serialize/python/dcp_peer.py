"""PyTorch's own torch.distributed.checkpoint (DCP) beside ddp::dcp, on the test
transformer of tests/parallel/python/fsdp_peer.py (FSDP2, Gloo on CPUs).

  dcp_peer.py load DIR CKPT WORLD      FSDP2 at WORLD ranks dcp.loads CKPT (keys "model.*")
                                       into the model and writes its full parameters to
                                       DIR/py.bin (float32, named_parameters order)
  dcp_peer.py save DIR CKPT WORLD      FSDP2 at WORLD ranks, parameters from DIR/init.bin,
                                       dcp.saves {"model": ..., "step": 7} to CKPT
  dcp_peer.py to_torch_save CKPT FILE  format_utils.dcp_to_torch_save(CKPT, FILE), then
                                       torch.load(FILE, weights_only=True) must work
  dcp_peer.py optim DIR CKPT WORLD     FSDP2 and AdamW at WORLD ranks dcp.load
                                       {"model", "optim"} of get_state_dict from CKPT,
                                       dcp.save it again to CKPT_py, then train one step on
                                       DIR/x.bin, DIR/y.bin ([WORLD * k, CTX] tokens, k rows
                                       per rank) and write the mean loss to DIR/loss.txt and
                                       the full parameters to DIR/py.bin

Exits 3 (and says why) when this PyTorch has no DCP or no FSDP2.
"""

import faulthandler
import importlib
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "parallel",
                                "python"))
from fsdp_peer import TinyGpt, read  # noqa: E402


def sharded_model(d, rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "pystore"),
                            rank=rank, world_size=world)
    torch.manual_seed(1234)
    model = TinyGpt()
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def leave():
    # Every rank is past its last collective; skip PyTorch's teardown (fsdp_peer.py says why).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def load_worker(rank, d, ckpt, world):
    import torch.distributed.checkpoint as dcp
    faulthandler.enable()
    torch.set_num_threads(1)
    model = sharded_model(d, rank, world)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=ckpt)
    model.load_state_dict(state["model"])
    full = [p.full_tensor().detach().reshape(-1).float() for p in model.parameters()]
    if rank == 0:
        torch.cat(full).numpy().tofile(os.path.join(d, "py.bin.part"))
        os.replace(os.path.join(d, "py.bin.part"), os.path.join(d, "py.bin"))
    dist.barrier()
    leave()


def save_worker(rank, d, ckpt, world):
    import torch.distributed.checkpoint as dcp
    faulthandler.enable()
    torch.set_num_threads(1)
    model = sharded_model(d, rank, world)
    n = sum(p.numel() for p in model.parameters())
    init = read(os.path.join(d, "init.bin"), torch.float32, (n,))
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            full = init[offset:offset + p.numel()].view(p.shape)
            offset += p.numel()
            local = p.to_local()
            rows = local.shape[0]
            chunk = (p.shape[0] + world - 1) // world
            local.copy_(full[rank * chunk: rank * chunk + rows])
    dcp.save({"model": model.state_dict(), "step": 7}, checkpoint_id=ckpt)
    dist.barrier()
    leave()


def optim_worker(rank, d, ckpt, world):
    import torch.distributed.checkpoint as dcp
    import torch.nn.functional as F
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    faulthandler.enable()
    torch.set_num_threads(1)
    model = sharded_model(d, rank, world)
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt + "_py")
    x = torch.from_numpy(__import__("numpy").fromfile(os.path.join(d, "x.bin"), dtype="int64"))
    y = torch.from_numpy(__import__("numpy").fromfile(os.path.join(d, "y.bin"), dtype="int64"))
    from fsdp_peer import CTX, VOCAB
    x, y = x.view(-1, CTX), y.view(-1, CTX)
    rows = x.size(0) // world
    mine = slice(rank * rows, (rank + 1) * rows)
    loss = F.cross_entropy(model(x[mine]).reshape(-1, VOCAB), y[mine].reshape(-1))
    loss.backward()
    opt.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    mean /= world
    full = [p.full_tensor().detach().reshape(-1).float() for p in model.parameters()]
    if rank == 0:
        with open(os.path.join(d, "loss.txt"), "w") as f:
            f.write("%.9g\n" % mean.item())
        torch.cat(full).numpy().tofile(os.path.join(d, "py.bin.part"))
        os.replace(os.path.join(d, "py.bin.part"), os.path.join(d, "py.bin"))
    dist.barrier()
    leave()


def main():
    mode = sys.argv[1]
    try:
        # importlib: an `import torch.distributed...` here would make `torch` a local name
        # of main(), unbound in the message below.
        importlib.import_module("torch.distributed.checkpoint")
        getattr(importlib.import_module("torch.distributed.fsdp"), "fully_shard")
    except Exception as e:
        print(f"PyTorch {torch.__version__} lacks DCP or FSDP2: {type(e).__name__}: {e}")
        sys.exit(3)
    if mode == "to_torch_save":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        ckpt, out = sys.argv[2], sys.argv[3]
        dcp_to_torch_save(ckpt, out)
        state = torch.load(out, weights_only=True)
        print("keys:", sorted(state.keys()))
        return
    d, ckpt, world = sys.argv[2], sys.argv[3], int(sys.argv[4])
    worker = {"load": load_worker, "save": save_worker, "optim": optim_worker}[mode]
    # fork: the ranks inherit the imported torch, where spawn would import it again in
    # each (seconds apiece). Nothing before this line starts a thread of ours.
    mp.start_processes(worker, args=(d, ckpt, world), nprocs=world, start_method="fork")


if __name__ == "__main__":
    main()
