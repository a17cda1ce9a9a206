// The shortest complete DDP program. Run it with two processes:
//   build/bin/ddprun --nproc-per-node 2 -- build/bin/minimal
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <iostream>

int main() try {
  // Join the other processes (ddprun says who and where). No backend named: nccl with
  // GPUs; on CPUs shared memory within a host, gloo between hosts.
  // The guard leaves the group at the end, also when an error unwinds.
  ddp::ProcessGroupGuard group;
  const int rank = ddp::get_rank();
  const torch::Device device = ddp::get_device();  // cuda:<local rank>, or the CPU

  // Every rank builds the model; DDP makes rank 0's weights everyone's.
  auto model =
      torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
  model->to(device);
  auto dmodel = ddp::DistributedDataParallel(model);
  torch::optim::SGD optimizer(dmodel->parameters(), /*lr=*/0.05);

  torch::manual_seed(rank);  // each rank draws its own data
  for (int step = 1; step <= 50; ++step) {
    auto x = torch::randn({32, 8}, device);
    auto y = x.sum(/*dim=*/1, /*keepdim=*/true);  // learn to add
    optimizer.zero_grad();
    auto loss = torch::mse_loss(dmodel->forward(x), y);
    loss.backward();  // gradients are averaged across ranks here
    optimizer.step();
    if (rank == 0 && step % 10 == 0)
      std::cout << "step " << step << "  loss " << loss.item<float>() << std::endl;
  }
  ddp::destroy_process_group();  // the guard would also do it
  return 0;
} catch (const c10::Error& e) {  // a mistake in the program or its launch
  std::cerr << "error: " << e.what_without_backtrace() << std::endl;
  return 1;
} catch (const std::exception& e) {  // a peer that died or hung: ddp::TimeoutError, ...
  std::cerr << "error: " << e.what() << std::endl;
  return 1;
}
