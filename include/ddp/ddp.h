#pragma once

// ddp-cpp: PyTorch-style DistributedDataParallel for LibTorch programs.
// One include for everything.

#include <ddp/amp.h>
#include <ddp/checkpoint.h>
#include <ddp/comm_hooks.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/errors.h>
#include <ddp/join.h>
#include <ddp/optim/zero_redundancy_optimizer.h>
#include <ddp/process_group.h>
#include <ddp/sampler.h>
#include <ddp/sync_batchnorm.h>
#include <ddp/trace.h>
