#pragma once
// 0.2's path, kept for existing programs; new code includes <ddp/modules/output_tensors.h> or simply
// <ddp/ddp.h>. See docs/architecture.md.
#include <ddp/modules/output_tensors.h>
