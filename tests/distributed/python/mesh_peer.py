"""PyTorch's DeviceMesh on Gloo, for device_mesh_test.cpp.

  mesh_peer.py DIR D0 D1

Makes init_device_mesh("cpu", (D0, D1), mesh_dim_names=("dp", "tp")) in D0 * D1
processes (a FileStore in DIR) and writes, for each rank, one line to DIR/mesh_<rank>.txt:
each dimension's group ranks, the local ranks, the coordinate and each 1-D submesh, in
the form device_mesh_test.cpp builds with ddp-cpp. Exits 3 where this PyTorch has no
init_device_mesh.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def csv(values):
    return ",".join(str(v) for v in values)


def worker(r, d, shape):
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    world = shape[0] * shape[1]
    dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "pystore"),
                            rank=r, world_size=world)
    mesh = init_device_mesh("cpu", tuple(shape), mesh_dim_names=("dp", "tp"))
    parts = []
    for name in ("dp", "tp"):
        parts.append("%s:%s" % (name, csv(dist.get_process_group_ranks(mesh.get_group(name)))))
        parts.append("lr_%s:%d" % (name, mesh.get_local_rank(name)))
        parts.append("sub_%s:%s" % (name, csv(mesh[name].mesh.tolist())))
    parts.append("coord:%s" % csv(mesh.get_coordinate()))
    with open(os.path.join(d, "mesh_%d.txt" % r), "w") as f:
        f.write("|".join(parts))
    dist.barrier()
    dist.destroy_process_group()


def main():
    d, shape = sys.argv[1], [int(sys.argv[2]), int(sys.argv[3])]
    try:
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    except ImportError:
        print("this PyTorch (%s) has no init_device_mesh" % torch.__version__)
        sys.exit(3)
    # fork: the ranks inherit the imported torch, where spawn would import it again in
    # each (seconds apiece). Nothing before this line starts a thread of ours.
    mp.start_processes(worker, args=(d, shape), nprocs=shape[0] * shape[1], start_method="fork")


if __name__ == "__main__":
    main()
