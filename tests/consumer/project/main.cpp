#include <ddp/ddp.h>
#include <ddp/sampler.h>  // 0.1's flat path still compiles (include/compat)

#include <ATen/ATen.h>

#include <iostream>

int main() {
  ddp::ProcessGroupGuard guard(ddp::InitOptions().rank(0).world_size(1));
  auto t = at::ones({3});
  ddp::all_reduce(t, ddp::ReduceOp::AVG);
  std::cout << "consumer ok: rank " << ddp::get_rank() << " of " << ddp::get_world_size()
            << ", sum " << t.sum().item<float>() << "\n";
  return t.sum().item<float>() == 3.0f ? 0 : 1;
}
