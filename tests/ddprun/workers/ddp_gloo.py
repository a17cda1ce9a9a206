#!/usr/bin/env python3
"""One DistributedDataParallel step with PyTorch's gloo backend, as a torchrun user's
script does it: init_process_group from the launcher's environment (env://). Where
the port could be taken by concurrent tests, the test names a shared file instead
(DDP_TEST_INIT_FILE)."""
import gc
import os

import torch
import torch.distributed as dist

init_file = os.environ.get("DDP_TEST_INIT_FILE")
if init_file:
    dist.init_process_group("gloo", init_method="file://" + init_file,
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
loss = model(torch.full((2, 4), float(rank + 1))).sum()
loss.backward()
# Every rank holds the mean of all ranks' gradients after backward.
grad = model.module.weight.grad.clone()
gathered = [torch.zeros_like(grad) for _ in range(world)]
dist.all_gather(gathered, grad)
assert all(torch.equal(g, grad) for g in gathered), "gradients differ between ranks"
expected = 2.0 * sum(r + 1 for r in range(world)) / world
assert torch.allclose(grad, torch.full_like(grad, expected)), (grad, expected)
print("ddp ok rank %d of %d" % (rank, world), flush=True)
# PyTorch 2.x's Gloo can abort a process ("terminate called without an active
# exception") whose group outlives destroy_process_group or whose peer tears down its
# connections first. So every rank is done before any releases its group, and the DDP
# wrapper, which holds the group, goes first: the group is then released here, while
# the interpreter is whole, not at its exit.
dist.barrier()
del model
gc.collect()
dist.destroy_process_group()
