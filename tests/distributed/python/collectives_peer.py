"""torch.distributed's collectives on Gloo, for collectives_python_test.cpp.

  collectives_peer.py DIR WORLD

Runs the cases of collectives_python_test.cpp (the same loops, the same inputs) in WORLD
processes (Gloo, a FileStore in DIR) and writes what each rank received, as float64, to
DIR/py_<WORLD>_<rank>.bin. Outputs of over 4096 elements are written as every 997th
element and their sum. Prints why and exits 3 where this PyTorch lacks something the
cases need.
"""

import faulthandler
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BIG = 1000003
SIZES = [0, 1, 7]
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.bfloat16]
COLS = 3


def val(n, dtype, r, salt):
    """((5 i + 11 r + 3 salt) mod 13), centred and quartered for floats: exact values, so
    that every order of summation gives the same bits."""
    a = (torch.arange(n, dtype=torch.int64) * 5 + r * 11 + salt * 3) % 13
    if dtype.is_floating_point:
        return ((a - 6).to(torch.float64) / 4).to(dtype)
    if dtype == torch.uint8:
        return a.to(dtype)
    return (a - 6).to(dtype)


def ops_for(dtype):
    ops = [("sum", dist.ReduceOp.SUM), ("product", dist.ReduceOp.PRODUCT),
           ("min", dist.ReduceOp.MIN), ("max", dist.ReduceOp.MAX)]
    if not dtype.is_floating_point:
        ops += [("band", dist.ReduceOp.BAND), ("bor", dist.ReduceOp.BOR),
                ("bxor", dist.ReduceOp.BXOR)]
    return ops


def split(r, s, salt):
    return (r * 3 + s * 5 + salt) % 4


def record(out, t):
    t = t.detach().to(torch.float64).reshape(-1)
    if t.numel() > 4096:
        out.append(t[::997].clone())
        out.append(t.sum().reshape(1))
    else:
        out.append(t.clone())


def cases(world, r, out):
    salt = 0
    for dtype in DTYPES:
        for n in SIZES:
            for _, op in ops_for(dtype):
                salt += 1
                dst = salt % world
                t = val(n, dtype, r, salt)
                dist.reduce(t, dst, op)
                if r == dst:
                    record(out, t)
                salt += 1
                o = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(o, [val(n, dtype, r, salt + k) for k in range(world)], op)
                record(out, o)
            salt += 1
            lst = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(lst, val(n, dtype, r, salt))
            for t in lst:
                record(out, t)
            salt += 1
            dst = salt % world
            lst = [torch.empty(n, dtype=dtype) for _ in range(world)] if r == dst else None
            dist.gather(val(n, dtype, r, salt), lst, dst)
            if r == dst:
                for t in lst:
                    record(out, t)
            salt += 1
            src = salt % world
            o = torch.empty(n, dtype=dtype)
            lst = [val(n, dtype, k, salt) for k in range(world)] if r == src else None
            dist.scatter(o, lst, src)
            record(out, o)
            salt += 1
            ins = [split(r, s, salt) for s in range(world)]
            outs = [split(s, r, salt) for s in range(world)]
            inp = val(sum(ins) * COLS * max(n, 1), dtype, r, salt).reshape(-1, COLS * max(n, 1))
            o = torch.empty(sum(outs), COLS * max(n, 1), dtype=dtype)
            dist.all_to_all_single(o, inp, outs, ins)
            record(out, o)
    # One large size, float32.
    salt += 1
    dst = salt % world
    t = val(BIG, torch.float32, r, salt)
    dist.reduce(t, dst, dist.ReduceOp.SUM)
    if r == dst:
        record(out, t)
    salt += 1
    o = torch.empty(BIG)
    dist.reduce_scatter(o, [val(BIG, torch.float32, r, salt + k) for k in range(world)])
    record(out, o)
    salt += 1
    lst = [torch.empty(BIG) for _ in range(world)]
    dist.all_gather(lst, val(BIG, torch.float32, r, salt))
    for t in lst:
        record(out, t)
    salt += 1
    ins = [BIG // world + (1 if s < BIG % world else 0) for s in range(world)]
    outs = [BIG // world + (1 if r < BIG % world else 0) for _ in range(world)]
    o = torch.empty(sum(outs))
    dist.all_to_all_single(o, val(BIG, torch.float32, r, salt), outs, ins)
    record(out, o)


def worker(r, d, world):
    faulthandler.enable()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "pystore"),
                            rank=r, world_size=world)
    out = []
    cases(world, r, out)
    flat = torch.cat(out) if out else torch.empty(0, dtype=torch.float64)
    with open(os.path.join(d, "py_%d_%d.bin" % (world, r)), "wb") as f:
        f.write(flat.numpy().tobytes())
    dist.barrier()
    dist.destroy_process_group()


def main():
    d, world = sys.argv[1], int(sys.argv[2])
    if int(torch.__version__.split(".")[0]) < 2:
        # 1.13's Gloo has no reduce_scatter and no bfloat16 reductions.
        print("PyTorch %s: the cases need PyTorch 2's Gloo" % torch.__version__)
        sys.exit(3)
    # fork: the ranks inherit the imported torch, where spawn would import it again in
    # each (seconds apiece). Nothing before this line starts a thread of ours.
    mp.start_processes(worker, args=(d, world), nprocs=world, start_method="fork")


if __name__ == "__main__":
    main()
