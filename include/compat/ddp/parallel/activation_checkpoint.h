#pragma once
// 0.2's path, kept for existing programs; new code includes <ddp/algorithms/activation_checkpoint.h> or simply
// <ddp/ddp.h>. See docs/architecture.md.
#include <ddp/algorithms/activation_checkpoint.h>
