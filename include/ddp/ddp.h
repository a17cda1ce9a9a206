#pragma once

// ddp-cpp: PyTorch-style DistributedDataParallel for LibTorch programs.
// One include for everything.

#include <ddp/errors.h>
#include <ddp/process_group.h>
#if __has_include(<ddp/distributed_data_parallel.h>)
#include <ddp/distributed_data_parallel.h>
#endif
#if __has_include(<ddp/sampler.h>)
#include <ddp/sampler.h>
#endif
#if __has_include(<ddp/checkpoint.h>)
#include <ddp/checkpoint.h>
#endif
