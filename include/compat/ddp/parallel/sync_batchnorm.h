#pragma once
// 0.2's path, kept for existing programs; new code includes <ddp/nn/sync_batchnorm.h> or simply
// <ddp/ddp.h>. See docs/architecture.md.
#include <ddp/nn/sync_batchnorm.h>
