#pragma once
// 0.1's flat path, kept for existing programs; new code includes <ddp/data/distributed_sampler.h>
// or simply <ddp/ddp.h>. See docs/architecture.md.
#include <ddp/data/distributed_sampler.h>
