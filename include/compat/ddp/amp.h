#pragma once
// 0.1's flat path, kept for existing programs; new code includes <ddp/amp/autocast.h> and
// <ddp/amp/grad_scaler.h>, or simply <ddp/ddp.h>. See docs/architecture.md.
#include <ddp/amp/autocast.h>
#include <ddp/amp/grad_scaler.h>
