#pragma once
// 0.1's flat path, kept for existing programs; new code includes <ddp/parallel/distributed_data_parallel.h>
// or simply <ddp/ddp.h>. See docs/architecture.md.
#include <ddp/parallel/distributed_data_parallel.h>
