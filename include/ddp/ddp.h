#pragma once

// ddp-cpp: PyTorch-style DistributedDataParallel for LibTorch programs.
// One include for everything. The parts, one folder each (docs/architecture.md):
//   distributed/  process groups, collectives, rendezvous
//   parallel/     DistributedDataParallel, fully_shard, its hooks and statistics, Join,
//                 SyncBatchNorm, activation checkpointing
//   amp/          autocast and the gradient scaler
//   data/         DistributedSampler
//   serialize/    checkpoints and state dicts that Python's torch.load reads
//   optim/        ZeroRedundancyOptimizer (ZeRO-1)

#include <ddp/errors.h>

#include <ddp/distributed/device_mesh.h>
#include <ddp/distributed/groups.h>
#include <ddp/distributed/process_group.h>
#include <ddp/distributed/memory.h>

#include <ddp/algorithms/activation_checkpoint.h>
#include <ddp/parallel/comm_hooks.h>
#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/fsdp/fully_shard.h>
#include <ddp/algorithms/join.h>
#include <ddp/parallel/powersgd.h>
#include <ddp/parallel/pipelining.h>
#include <ddp/parallel/tensor_parallel.h>
#include <ddp/nn/sync_batchnorm.h>
#include <ddp/parallel/trace.h>

#include <ddp/amp/autocast.h>
#include <ddp/amp/grad_scaler.h>

#include <ddp/data/distributed_sampler.h>

#include <ddp/serialize/checkpoint.h>
#include <ddp/serialize/dcp.h>

#include <ddp/optim/zero_redundancy_optimizer.h>
