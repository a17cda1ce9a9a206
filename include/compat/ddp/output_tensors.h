#pragma once
// 0.1's flat path, kept for existing programs; new code includes <ddp/modules/output_tensors.h>
// or simply <ddp/ddp.h>. See docs/architecture.md.
#include <ddp/modules/output_tensors.h>
