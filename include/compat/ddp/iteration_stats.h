#pragma once
// 0.1's flat path, kept for existing programs; new code includes <ddp/parallel/iteration_stats.h>
// or simply <ddp/ddp.h>. See docs/architecture.md.
#include <ddp/parallel/iteration_stats.h>
