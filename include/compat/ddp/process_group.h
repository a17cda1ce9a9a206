#pragma once
// 0.1's flat path, kept for existing programs; new code includes <ddp/distributed/process_group.h>
// or simply <ddp/ddp.h>. See docs/architecture.md.
#include <ddp/distributed/process_group.h>
