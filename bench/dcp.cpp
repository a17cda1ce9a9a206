// ddp::dcp::save and ddp::dcp::load of the GPT's sharded state (examples/gpt: fully_shard
// on each block and the root, AdamW after one step), for bench/run-dcp, which runs
// PyTorch's dcp.save and dcp.load on the same state (bench/dcp_py.py) beside it.
//
//   ddprun --nproc-per-node 2 --no-prefix -- bench_dcp --dir DIR [--other DIR2]
//       [--n-layer L] [--n-embd E] [--n-head H] [--repeats R]
//
// Saves R times into DIR/cpp-<i> and loads R times from DIR/cpp-0 (into the same
// modules: in place), then, with --other, loads Python's folder R times. Prints one line
// of JSON on rank 0: the slowest rank's median seconds of each, and the bytes saved.

#include <ddp/distributed/default_group.h>
#include <ddp/distributed/process_group.h>
#include <ddp/fsdp/fully_shard.h>
#include <ddp/serialize/dcp.h>

#include "../examples/gpt/model.h"
#include "bench_timing.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <filesystem>
#include <string>

int main(int argc, char** argv) {
  CLI::App app("ddp::dcp save and load of the GPT's sharded state");
  std::string dir, other;
  gpt::GptConfig config;
  config.vocab_size = 65;
  config.block_size = 64;
  config.n_layer = 8;
  config.n_head = 8;
  config.n_embd = 512;
  config.dropout = 0.0;
  int repeats = 5;
  app.add_option("--dir", dir, "Folder for the checkpoints")->required();
  app.add_option("--other", other, "A folder that Python's dcp.save wrote, to load too");
  app.add_option("--n-layer", config.n_layer)->capture_default_str();
  app.add_option("--n-embd", config.n_embd)->capture_default_str();
  app.add_option("--n-head", config.n_head)->capture_default_str();
  app.add_option("--repeats", repeats)->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  ddp::init_process_group(ddp::InitOptions().backend("gloo"));
  auto pg = ddp::default_group();
  at::manual_seed(0);
  auto model = gpt::Gpt(config);
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    ddp::fully_shard(model->blocks->ptr<gpt::BlockImpl>(i));
  }
  auto root = ddp::fully_shard(model.ptr());
  torch::optim::AdamW optimizer(root->parameters(), torch::optim::AdamWOptions(1e-3));
  {  // one step, so that AdamW has its state
    const at::Tensor x = at::randint(config.vocab_size, {4, config.block_size}, at::kLong);
    const at::Tensor y = at::randint(config.vocab_size, {4 * config.block_size}, at::kLong);
    at::cross_entropy_loss(root(x).reshape({-1, config.vocab_size}), y).backward();
    optimizer.step();
    optimizer.zero_grad();
  }
  ddp::dcp::StateDict state;
  state.add_model(*model);
  state.add_optimizer(optimizer, *model);

  int i = 0;
  const double save_s = bench::time_calls(
      *pg, repeats, [&] { ddp::dcp::save(state, dir + "/cpp-" + std::to_string(i++)); }, 0);
  const double load_s = bench::time_calls(
      *pg, repeats, [&] { ddp::dcp::load(state, dir + "/cpp-0"); }, 0);
  double load_other_s = 0.0;
  if (!other.empty()) {
    // Python's keys: {"model": ..., "optim": ...}, the same as add_model/add_optimizer's.
    load_other_s = bench::time_calls(
        *pg, repeats, [&] { ddp::dcp::load(state, other); }, 0);
  }
  if (pg->rank() == 0) {
    int64_t bytes = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir + "/cpp-0")) {
      bytes += static_cast<int64_t>(entry.file_size());
    }
    int64_t parameters = 0;
    for (const auto& p : model->parameters()) parameters += p.numel();  // this rank's rows
    std::printf("{\"side\": \"cpp\", \"ranks\": %d, \"save_s\": %.5f, \"load_s\": %.5f, "
                "\"load_other_s\": %.5f, \"bytes\": %lld}\n",
                pg->size(), save_s, load_s, load_other_s, static_cast<long long>(bytes));
    std::fflush(stdout);
  }
  ddp::destroy_process_group();
  return 0;
}
