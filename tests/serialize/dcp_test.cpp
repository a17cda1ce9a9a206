// ddp::dcp (PyTorch's Distributed Checkpoint format): fully_shard at 3 ranks saves and
// fully_shard at 2 ranks, a plain model and to_torch_save read it back bit for bit;
// objects round-trip; and damaged checkpoints are refused with their messages, leaving the
// model as it was.

#include "serialize/dcp_test_models.h"
#include "formats/atomic_file.h"
#include "formats/dcp_metadata.h"
#include "formats/pickle_io.h"
#include "formats/py_pickle.h"
#include "support/harness.h"
#include "support/util.h"

#include <ddp/distributed/device_mesh.h>
#include <ddp/fsdp/fully_shard.h>
#include <ddp/optim/zero_redundancy_optimizer.h>
#include <ddp/serialize/dcp.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <thread>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>

namespace dcp_test {

namespace {

namespace md = ddp::detail::dcp;
using ddp_test::TinyGptImpl;

using ddp_test::make_tiny_gpt;
using ddp_test::shard_tiny_gpt;

// Saves the model of seed 5 (sharded at `world` ranks, or plain at 0) to `dir`, with two
// objects; returns its full parameters.
std::map<std::string, at::Tensor> save_model(const std::string& dir, int world) {
  std::map<std::string, at::Tensor> full;
  auto body = [&](ddp::ProcessGroup* pg) {
    auto model = make_tiny_gpt(5);
    for (const auto& p : model->named_parameters()) {
      if (!pg || pg->rank() == 0) full[p.key()] = p.value().detach().clone();
    }
    ddp::FullyShard<TinyGptImpl> unit{nullptr};
    if (pg) unit = shard_tiny_gpt(model, *pg);
    ddp::dcp::StateDict state;
    state.add_model(*model).add_object("step", int64_t{42}).add_object("tag", std::string("dcp"));
    ddp::dcp::save(state, dir,
                   ddp::dcp::SaveOptions().process_group(pg ? ddp_test::borrow(*pg) : nullptr));
  };
  if (world == 0) {
    body(nullptr);
  } else {
    ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) { body(&pg); });
  }
  return full;
}

void expect_params(const torch::nn::Module& model, const std::map<std::string, at::Tensor>& want,
                   const std::string& what) {
  for (const auto& p : model.named_parameters()) {
    ASSERT_TRUE(want.count(p.key())) << what << ": " << p.key();
    EXPECT_TRUE(ddp_test::same_bits(p.value().detach(), want.at(p.key())))
        << what << ": " << p.key() << " differs";
  }
}

}  // namespace

TEST(Dcp, FullyShardAtThreeLoadsAtTwoAndIntoAPlainModel) {
  ddp_test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const auto full = save_model(ckpt, 3);
  // The files DCP names: one per rank, and .metadata.
  for (const char* f : {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp", ".metadata"}) {
    EXPECT_TRUE(ddp::detail::file_exists(ckpt + "/" + f)) << f;
  }
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(9);  // other values, replaced by the load
    auto unit = shard_tiny_gpt(model, pg);
    ddp::dcp::StateDict state;
    state.add_model(*model).add_object("step", int64_t{0}).add_object("tag", std::string());
    ddp::dcp::load(state, ckpt);
    EXPECT_EQ(state.object("step").toInt(), 42);
    EXPECT_EQ(state.object("tag").toStringRef(), "dcp");
    const auto got = ddp::full_state_dict(*model);
    if (pg.rank() == 0) {
      for (const auto& kv : full) {
        ASSERT_TRUE(got.contains(kv.first)) << kv.first;
        EXPECT_TRUE(ddp_test::same_bits(got.at(kv.first), kv.second)) << kv.first;
      }
    }
  });
  auto plain = make_tiny_gpt(9);
  ddp::dcp::StateDict state;
  state.add_model(*plain);
  ddp::dcp::load(state, ckpt);
  expect_params(*plain, full, "plain model");
}

TEST(Dcp, APlainModelSavesAndToTorchSaveNestsTheKeys) {
  ddp_test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const auto full = save_model(ckpt, 0);
  const auto keys = ddp::dcp::checkpoint_keys(ckpt);
  EXPECT_EQ(keys.front(), "model.wte.weight");
  ddp::dcp::to_torch_save(ckpt, dir.file("whole.pt"));
  const c10::IValue v =
      ddp::detail::unpickle(ddp::detail::read_file(dir.file("whole.pt")), "whole");
  const auto root = v.toGenericDict();
  EXPECT_EQ(root.at("step").toInt(), 42);
  const auto model = root.at("model").toGenericDict();
  EXPECT_EQ(model.size(), full.size());
  for (const auto& kv : full) {
    EXPECT_TRUE(ddp_test::same_bits(model.at(kv.first).toTensor(), kv.second)) << kv.first;
  }
}

// AdamW's state in get_optimizer_state_dict's keys: saved at 3 ranks after two steps,
// loaded at 2 into a fresh model and optimizer, saved again: every tensor and value of the
// two checkpoints is the same, so the state survived the resharding whole.
TEST(Dcp, OptimizerStateSurvivesResharding) {
  ddp_test::TempDir dir;
  const std::string first = dir.file("at3"), second = dir.file("at2");
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(5);
    auto unit = shard_tiny_gpt(model, pg);
    torch::optim::AdamW opt(unit->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 2; ++step) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + 10 * step + pg.rank());
      at::Tensor x = at::randint(ddp_test::kVocab, {2, ddp_test::kCtx}, gen, at::kLong);
      at::Tensor y = at::randint(ddp_test::kVocab, {2 * ddp_test::kCtx}, gen, at::kLong);
      at::cross_entropy_loss(unit(x).reshape({-1, ddp_test::kVocab}), y).backward();
      opt.step();
      opt.zero_grad();
    }
    ddp::dcp::StateDict state;
    state.add_model(*model).add_optimizer(opt, *model);
    ddp::dcp::save(state, first, ddp::dcp::SaveOptions().process_group(ddp_test::borrow(pg)));
  });
  const auto keys = ddp::dcp::checkpoint_keys(first);
  for (const char* k :
       {"optim.state.wte.weight.exp_avg", "optim.state.wte.weight.step", "optim.param_groups.0.lr",
        "optim.param_groups.0.params", "optim.param_groups.0.decoupled_weight_decay"}) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
  }
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(9);
    auto unit = shard_tiny_gpt(model, pg);
    torch::optim::AdamW opt(unit->parameters(), torch::optim::AdamWOptions(0.5));
    {
      ddp::dcp::StateDict state;
      state.add_model(*model).add_optimizer(opt, *model);
      ddp::dcp::load(state, first);
    }
    EXPECT_EQ(opt.param_groups()[0].options().get_lr(), 1e-2);
    ddp::dcp::StateDict again;
    again.add_model(*model).add_optimizer(opt, *model);
    ddp::dcp::save(again, second, ddp::dcp::SaveOptions().process_group(ddp_test::borrow(pg)));
  });
  ddp::dcp::to_torch_save(first, dir.file("first.pt"));
  ddp::dcp::to_torch_save(second, dir.file("second.pt"));
  const auto a = ddp::detail::unpickle(ddp::detail::read_file(dir.file("first.pt")), "first");
  const auto b = ddp::detail::unpickle(ddp::detail::read_file(dir.file("second.pt")), "second");
  std::string diff;
  EXPECT_TRUE(ddp_test::same_value(a, b, "", &diff)) << diff;
  const auto exp_avg = a.toGenericDict()
                           .at("optim")
                           .toGenericDict()
                           .at("state")
                           .toGenericDict()
                           .at("wte.weight")
                           .toGenericDict()
                           .at("exp_avg")
                           .toTensor();
  EXPECT_GT(exp_avg.abs().max().item<double>(), 0);  // the state is not all zeros
}

// ZeroRedundancyOptimizer at 2 ranks saves (each state tensor whole, by the rank that
// steps it); fully_shard with Adam at 4 ranks loads (the state resharded into rows) and
// saves again: the same bits.
TEST(Dcp, ZeroAtTwoSavesAndFullyShardAtFourLoads) {
  ddp_test::TempDir dir;
  const std::string first = dir.file("zero"), second = dir.file("fsdp");
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(5);
    ddp::ZeroRedundancyOptimizer zero(model->parameters(), torch::optim::AdamOptions(1e-2),
                                      ddp::ZeroRedundancyOptimizerOptions().process_group(
                                          ddp_test::borrow(pg)));
    for (int step = 0; step < 2; ++step) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + step);  // the same on every rank
      at::Tensor x = at::randint(ddp_test::kVocab, {2, ddp_test::kCtx}, gen, at::kLong);
      at::Tensor y = at::randint(ddp_test::kVocab, {2 * ddp_test::kCtx}, gen, at::kLong);
      at::cross_entropy_loss(model->forward(x).reshape({-1, ddp_test::kVocab}), y).backward();
      zero.step();
      zero.zero_grad();
    }
    ddp::dcp::StateDict state;
    state.add_model(*model).add_optimizer(zero, *model);
    ddp::dcp::save(state, first, ddp::dcp::SaveOptions().process_group(ddp_test::borrow(pg)));
  });
  ddp_test::run_thread_groups(4, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(9);
    auto unit = shard_tiny_gpt(model, pg);
    torch::optim::Adam opt(unit->parameters(), torch::optim::AdamOptions(0.5));
    {
      ddp::dcp::StateDict state;
      state.add_model(*model).add_optimizer(opt, *model);
      ddp::dcp::load(state, first);
    }
    ddp::dcp::StateDict again;
    again.add_model(*model).add_optimizer(opt, *model);
    ddp::dcp::save(again, second, ddp::dcp::SaveOptions().process_group(ddp_test::borrow(pg)));
  });
  // The reference: one process, plain Adam, the same steps.
  {
    auto model = make_tiny_gpt(5);
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
    for (int step = 0; step < 2; ++step) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + step);
      at::Tensor x = at::randint(ddp_test::kVocab, {2, ddp_test::kCtx}, gen, at::kLong);
      at::Tensor y = at::randint(ddp_test::kVocab, {2 * ddp_test::kCtx}, gen, at::kLong);
      at::cross_entropy_loss(model->forward(x).reshape({-1, ddp_test::kVocab}), y).backward();
      opt.step();
      opt.zero_grad();
    }
    ddp::dcp::StateDict state;
    state.add_model(*model).add_optimizer(opt, *model);
    ddp::dcp::save(state, dir.file("plain"));
  }
  ddp::dcp::to_torch_save(dir.file("plain"), dir.file("plain.pt"));
  ddp::dcp::to_torch_save(first, dir.file("first.pt"));
  ddp::dcp::to_torch_save(second, dir.file("second.pt"));
  const auto ref = ddp::detail::unpickle(ddp::detail::read_file(dir.file("plain.pt")), "plain");
  const auto a = ddp::detail::unpickle(ddp::detail::read_file(dir.file("first.pt")), "first");
  const auto b = ddp::detail::unpickle(ddp::detail::read_file(dir.file("second.pt")), "second");
  std::string diff;
  EXPECT_TRUE(ddp_test::same_value(ref, a, "", &diff))
      << "ZeRO's checkpoint against plain Adam's: " << diff;
  EXPECT_TRUE(ddp_test::same_value(a, b, "", &diff)) << diff;
  // And back: ZeRO at 3 ranks loads the fully_shard checkpoint; each rank steps its part.
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(9);
    ddp::ZeroRedundancyOptimizer zero(model->parameters(), torch::optim::AdamOptions(0.5),
                                      ddp::ZeroRedundancyOptimizerOptions().process_group(
                                          ddp_test::borrow(pg)));
    ddp::dcp::StateDict state;
    state.add_model(*model).add_optimizer(zero, *model);
    ddp::dcp::load(state, second);
    EXPECT_EQ(zero.param_groups()[0].options().get_lr(), 1e-2);
    const std::string third = dir.file("zero3");
    ddp::dcp::StateDict again;
    again.add_model(*model).add_optimizer(zero, *model);
    ddp::dcp::save(again, third, ddp::dcp::SaveOptions().process_group(ddp_test::borrow(pg)));
  });
  ddp::dcp::to_torch_save(dir.file("zero3"), dir.file("third.pt"));
  const auto c = ddp::detail::unpickle(ddp::detail::read_file(dir.file("third.pt")), "third");
  EXPECT_TRUE(ddp_test::same_value(a, c, "", &diff)) << diff;
}

// HSDP (2 x 2): the second replica holds the same rows as the first and does not write
// them again; the checkpoint loads into a plain model whole.
TEST(Dcp, HsdpWritesEachShardOnce) {
  ddp_test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  ddp_test::run_thread_groups(4, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(5);
    ddp::DeviceMesh mesh("cpu", at::arange(4, at::kLong).view({2, 2}), {"replicate", "shard"},
                         ddp_test::borrow(pg));
    const auto opts = ddp::FullyShardOptions().mesh(mesh);
    for (size_t i = 0; i < model->blocks->size(); ++i) {
      ddp::fully_shard(model->blocks->ptr<ddp_test::BlockImpl>(i), opts);
    }
    ddp::fully_shard(model, opts);
    ddp::dcp::StateDict state;
    state.add_model(*model);
    ddp::dcp::save(state, ckpt, ddp::dcp::SaveOptions().process_group(ddp_test::borrow(pg)));
  });
  // Ranks 2 and 3 (the second replica) wrote nothing but their empty files.
  EXPECT_EQ(ddp::detail::read_file(ckpt + "/__2_0.distcp").size(), 0u);
  EXPECT_GT(ddp::detail::read_file(ckpt + "/__1_0.distcp").size(), 0u);
  auto plain = make_tiny_gpt(9);
  ddp::dcp::StateDict state;
  state.add_model(*plain);
  ddp::dcp::load(state, ckpt);
  std::map<std::string, at::Tensor> want;
  for (const auto& p : make_tiny_gpt(5)->named_parameters()) want[p.key()] = p.value().detach();
  expect_params(*plain, want, "hsdp");
}

// async_save copies the state at the call: the model changes at once (as the next step
// would), and the checkpoint still holds the values of the call. Two in a row: the
// second waits for the first; both are whole.
TEST(Dcp, AsyncSaveHoldsTheValuesOfTheCall) {
  ddp_test::TempDir dir;
  std::map<std::string, at::Tensor> want;
  for (const auto& p : make_tiny_gpt(5)->named_parameters()) want[p.key()] = p.value().detach();
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(5);
    shard_tiny_gpt(model, pg);
    ddp::dcp::StateDict state;
    state.add_model(*model);
    const auto options = ddp::dcp::SaveOptions().process_group(ddp_test::borrow(pg));
    ddp::dcp::AsyncSaveHandle first = ddp::dcp::async_save(state, dir.file("a"), options);
    {
      at::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.fill_(7);
    }
    // The training's own collectives go on beside the save's.
    at::Tensor t = at::ones({1000});
    pg.all_reduce(t);
    EXPECT_EQ(t[0].item<float>(), 2.0f);
    ddp::dcp::AsyncSaveHandle second = ddp::dcp::async_save(state, dir.file("b"), options);
    EXPECT_TRUE(first.done());  // waited for by the second
    second.wait();
    first.wait();
  });
  auto from_a = make_tiny_gpt(9);
  ddp::dcp::StateDict a;
  a.add_model(*from_a);
  ddp::dcp::load(a, dir.file("a"));
  expect_params(*from_a, want, "async save a");
  auto from_b = make_tiny_gpt(9);
  ddp::dcp::StateDict b;
  b.add_model(*from_b);
  ddp::dcp::load(b, dir.file("b"));
  for (const auto& p : from_b->parameters()) {
    EXPECT_TRUE(p.eq(7).all().item<bool>()) << "async save b";
  }
}

// Async saves of a 32 MB model into step-<n>, one per step, every parameter filled with
// the step; at step 4 a watcher SIGKILLs the process as soon as the save's data file has
// bytes in it.
DDP_SCENARIO(dcp_async_kill) {
  torch::set_num_threads(1);
  const std::string dir = ddp_test::env_or("DDP_DCP_DIR", "");
  torch::nn::Linear big(4096, 2048);
  ddp::dcp::StateDict state;
  state.add_model(*big, "model");
  for (int64_t step = 1;; ++step) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : big->parameters()) p.fill_(static_cast<double>(step));
    }
    const std::string target = dir + "/step-" + std::to_string(step);
    if (step == 4) {
      std::thread([target] {
        const std::string data = target + "/__0_0.distcp";
        while (true) {
          struct stat st {};
          if (::stat(data.c_str(), &st) == 0 && st.st_size > 0) ::raise(SIGKILL);
        }
      }).detach();
    }
    ddp::dcp::async_save(state, target).wait();
  }
}

TEST(DcpMultiProcTest, AKillDuringAnAsyncSaveLeavesTheLastCheckpointWhole) {
  ddp_test::TempDir tmp;
  ddp_test::ProcessOptions o;
  o.launcher_env = false;
  o.env["DDP_DCP_DIR"] = tmp.path();
  o.timeout = std::chrono::seconds(90);
  const auto results = ddp_test::run_processes(1, "dcp_async_kill", o);
  ASSERT_EQ(results[0].exit_code, 128 + SIGKILL) << results[0].output;
  for (int step : {3, 4}) {
    torch::nn::Linear big(4096, 2048);
    ddp::dcp::StateDict state;
    state.add_model(*big);
    const std::string where = tmp.file("step-" + std::to_string(step));
    const std::string msg = ddp_test::error_of([&] { ddp::dcp::load(state, where); });
    if (step == 4) {
      std::printf("the save killed at step 4: %s\n",
                  msg == "<no exception>" ? "had finished (whole)" : "refused as unfinished");
    }
    if (step == 4 && msg != "<no exception>") {
      // Killed before .metadata: refused as unfinished, nothing loaded.
      EXPECT_NE(msg.find("has no .metadata"), std::string::npos) << msg;
      continue;
    }
    ASSERT_EQ(msg, "<no exception>") << "step " << step;
    for (const auto& p : big->parameters()) {
      EXPECT_TRUE(p.eq(static_cast<double>(step)).all().item<bool>()) << "step " << step;
    }
  }
}

// ---- damaged checkpoints -------------------------------------------------------------

namespace {

struct Damage {
  std::string name;
  std::function<void(const std::string& dir)> apply;
  std::string expect;  // a part of the message
};

void edit_metadata(const std::string& dir, const std::function<void(md::Metadata&)>& edit) {
  md::Metadata m = md::read_metadata(ddp::detail::read_file(dir + "/.metadata"), "test");
  edit(m);
  ddp::detail::write_file_atomic(dir + "/.metadata", md::write_metadata(m));
}

void edit_file(const std::string& path, const std::function<void(std::string&)>& edit) {
  std::string bytes = ddp::detail::read_file(path);
  edit(bytes);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

md::Entry& entry(md::Metadata& m, const std::string& key) { return m.entries.at(key); }

std::vector<Damage> damages() {
  const std::string w = "model.wte.weight";
  std::vector<Damage> d;
  d.push_back({"no_metadata",
               [](const std::string& dir) { ddp::detail::remove_file(dir + "/.metadata"); },
               "has no .metadata"});
  for (size_t cut : {0, 1, 2, 40, 400}) {
    d.push_back({"metadata_cut_at_" + std::to_string(cut),
                 [cut](const std::string& dir) {
                   edit_file(dir + "/.metadata", [cut](std::string& b) { b.resize(cut); });
                 },
                 ".metadata"});
  }
  d.push_back({"metadata_cut_before_stop",
               [](const std::string& dir) {
                 edit_file(dir + "/.metadata", [](std::string& b) { b.pop_back(); });
               },
               ".metadata"});
  d.push_back({"foreign_class",
               [](const std::string& dir) {
                 namespace py = ddp::detail::py;
                 ddp::detail::write_file_atomic(dir + "/.metadata",
                                                py::write(py::call(py::global("os", "system"),
                                                                   {py::str("true")})));
               },
               "os"});
  d.push_back({"not_metadata",
               [](const std::string& dir) {
                 namespace py = ddp::detail::py;
                 ddp::detail::write_file_atomic(dir + "/.metadata", py::write(py::list({})));
               },
               "not torch.distributed.checkpoint.metadata.Metadata"});
  d.push_back({"path_climbs_out",
               [w](const std::string& dir) {
                 edit_metadata(dir, [w](md::Metadata& m) {
                   entry(m, w).chunk_storage[0].relative_path = "../__0_0.distcp";
                 });
               },
               "not a plain name inside the checkpoint folder"});
  d.push_back({"absolute_path",
               [w](const std::string& dir) {
                 edit_metadata(dir, [w](md::Metadata& m) {
                   entry(m, w).chunk_storage[0].relative_path = "/etc/passwd";
                 });
               },
               "not a plain name inside the checkpoint folder"});
  d.push_back({"missing_data_file",
               [](const std::string& dir) { ddp::detail::remove_file(dir + "/__1_0.distcp"); },
               "cannot be opened"});
  d.push_back({"truncated_data_file",
               [](const std::string& dir) {
                 edit_file(dir + "/__2_0.distcp", [](std::string& b) { b.resize(b.size() / 2); });
               },
               "truncated"});
  d.push_back({"flipped_data_bytes",
               [](const std::string& dir) {
                 edit_file(dir + "/__0_0.distcp", [](std::string& b) {
                   for (size_t i = 0; i < 64 && i < b.size(); ++i) b[i] = static_cast<char>(~b[i]);
                 });
               },
               "model.wte.weight"});
  d.push_back(
      {"wrong_dtype",
       [w](const std::string& dir) {
         edit_metadata(dir, [w](md::Metadata& m) { entry(m, w).dtype = c10::ScalarType::Double; });
       },
       "but the metadata says Double"});
  d.push_back({"chunk_sizes_disagree",
               [w](const std::string& dir) {
                 edit_metadata(dir, [w](md::Metadata& m) {
                   auto& e = entry(m, w);
                   e.chunks[0].sizes[0] -= 1;
                 });
               },
               "but the metadata says"});
  d.push_back({"missing_chunk",
               [w](const std::string& dir) {
                 edit_metadata(dir, [w](md::Metadata& m) {
                   auto& e = entry(m, w);
                   e.chunks.pop_back();
                   e.chunk_storage.pop_back();
                 });
               },
               "missing a part of this tensor"});
  d.push_back({"overlapping_chunks",
               [w](const std::string& dir) {
                 edit_metadata(dir, [w](md::Metadata& m) {
                   auto& e = entry(m, w);
                   e.chunks[1].offsets[0] = e.chunks[0].offsets[0];
                 });
               },
               "that overlap"});
  d.push_back({"chunk_outside_tensor",
               [w](const std::string& dir) {
                 edit_metadata(dir,
                               [w](md::Metadata& m) { entry(m, w).chunks[0].offsets[0] = 1000; });
               },
               "reaches outside the tensor"});
  d.push_back({"key_missing",
               [w](const std::string& dir) {
                 edit_metadata(dir, [w](md::Metadata& m) {
                   m.entries.erase(w);
                   m.keys.erase(std::find(m.keys.begin(), m.keys.end(), w));
                 });
               },
               "has no key 'model.wte.weight'"});
  d.push_back({"other_size",
               [w](const std::string& dir) {
                 edit_metadata(dir, [w](md::Metadata& m) {
                   auto& e = entry(m, w);
                   e.size[1] += 1;
                   for (auto& c : e.chunks) c.sizes[1] += 1;
                 });
               },
               "Build the same model before loading"});
  d.push_back({"tensor_became_object",
               [w](const std::string& dir) {
                 edit_metadata(dir, [w](md::Metadata& m) {
                   auto& e = entry(m, w);
                   e.is_tensor = false;
                   e.object_storage = e.chunk_storage[0];
                 });
               },
               "is an object in the checkpoint, not a tensor"});
  d.push_back({"offset_past_end",
               [w](const std::string& dir) {
                 edit_metadata(dir, [w](md::Metadata& m) {
                   entry(m, w).chunk_storage[0].offset = int64_t{1} << 40;
                 });
               },
               "truncated or the metadata damaged"});
  d.push_back({"object_not_a_tensor",
               [w](const std::string& dir) {
                 edit_metadata(dir, [w](md::Metadata& m) {
                   entry(m, w).chunk_storage[0] = m.entries.at("step").object_storage;
                 });
               },
               "not a tensor"});
  return d;
}

}  // namespace

class DcpDamageTest : public ::testing::TestWithParam<Damage> {};

TEST_P(DcpDamageTest, IsRefusedAndTheModelStaysAsItWas) {
  const Damage& damage = GetParam();
  ddp_test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  save_model(ckpt, 3);
  damage.apply(ckpt);
  auto model = make_tiny_gpt(9);
  std::map<std::string, at::Tensor> before;
  for (const auto& p : model->named_parameters()) before[p.key()] = p.value().detach().clone();
  ddp::dcp::StateDict state;
  state.add_model(*model).add_object("step", int64_t{0});
  const std::string msg = ddp_test::error_of([&] { ddp::dcp::load(state, ckpt); });
  EXPECT_NE(msg.find(damage.expect), std::string::npos) << damage.name << ": " << msg;
  EXPECT_NE(msg, "<no exception>") << damage.name;
  expect_params(*model, before, damage.name);
  EXPECT_EQ(state.object("step").toInt(), 0) << damage.name;
}

INSTANTIATE_TEST_SUITE_P(Kinds, DcpDamageTest, ::testing::ValuesIn(damages()),
                         [](const auto& info) { return info.param.name; });

}  // namespace dcp_test
