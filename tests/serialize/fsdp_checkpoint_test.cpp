// Checkpoints of a model under ddp::fully_shard (Note [Sharded models in checkpoints]):
// saved at 3 ranks, loaded at 2 and at 1, the parameters and the optimizer state are
// bit-identical to what was saved; and the file is the unsharded model's, which plain
// PyTorch loads.

#include "parallel/fsdp_test_models.h"
#include "formats/pickle_io.h"
#include "serialize/checkpoint_io.h"
#include "support/harness.h"
#include "support/util.h"

#include <ddp/data/distributed_sampler.h>
#include <ddp/fsdp/fully_shard.h>
#include <ddp/serialize/checkpoint.h>
#include <ddp/serialize/dcp.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <fstream>
#include <sstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace fsdp_checkpoint_test {

namespace {

using ddp_test::TinyGptImpl;

struct Sharded {
  std::shared_ptr<TinyGptImpl> model;
  ddp::FullyShard<TinyGptImpl> unit{nullptr};
  std::unique_ptr<torch::optim::Adam> opt;
};

Sharded make_sharded(ddp::ProcessGroup& pg, uint64_t seed) {
  Sharded s;
  s.model = std::make_shared<TinyGptImpl>();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  {
    at::NoGradGuard no_grad;
    for (auto& p : s.model->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.3);
  }
  auto opts = ddp::FullyShardOptions().process_group(ddp_test::borrow(pg));
  for (size_t i = 0; i < s.model->blocks->size(); ++i) {
    ddp::fully_shard(s.model->blocks->ptr<ddp_test::BlockImpl>(i), opts);
  }
  s.unit = ddp::fully_shard(s.model, opts);
  s.opt =
      std::make_unique<torch::optim::Adam>(s.unit->parameters(), torch::optim::AdamOptions(1e-2));
  return s;
}

void train(Sharded& s, int rank, int steps) {
  for (int step = 0; step < steps; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + 10 * step + rank);
    at::Tensor x = at::randint(ddp_test::kVocab, {2, ddp_test::kCtx}, gen, at::kLong);
    at::Tensor y = at::randint(ddp_test::kVocab, {2 * ddp_test::kCtx}, gen, at::kLong);
    at::cross_entropy_loss(s.unit(x).reshape({-1, ddp_test::kVocab}), y).backward();
    s.opt->step();
    s.opt->zero_grad();
  }
}

ddp::Checkpoint checkpoint_of(Sharded& s, ddp::ProcessGroup& pg) {
  return ddp::Checkpoint(*s.model)
      .optimizer(s.opt.get())
      .rng(false)
      .process_group(ddp_test::borrow(pg));
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void expect_same_checkpoint(const std::string& a, const std::string& b) {
  const c10::IValue va = ddp::detail::unpickle(read_all(a), "a");
  const c10::IValue vb = ddp::detail::unpickle(read_all(b), "b");
  for (const char* key : {"model", "optimizer"}) {
    std::string diff;
    EXPECT_TRUE(
        ddp_test::same_value(va.toGenericDict().at(key), vb.toGenericDict().at(key), key, &diff))
        << a << " vs " << b << ": " << diff;
  }
}

TEST(FullyShardCheckpoint, SavedAtThreeRanksLoadsAtTwoAndOneBitIdentical) {
  ddp_test::TempDir dir;
  const std::string saved = dir.file("at3.pt");
  c10::Dict<std::string, at::Tensor> full;
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    Sharded s = make_sharded(pg, 5);
    train(s, pg.rank(), 3);
    ddp::save_checkpoint(saved, checkpoint_of(s, pg).step(3));
    auto state = ddp::full_state_dict(*s.model);
    if (pg.rank() == 0) full = state;
  });
  // The file's model is the full one.
  const auto model_in_file = ddp::read_state_dict(saved);
  ASSERT_EQ(model_in_file.size(), full.size());
  for (const auto& kv : full) {
    EXPECT_TRUE(ddp_test::same_bits(model_in_file.at(kv.key()), kv.value())) << kv.key();
  }

  for (int world : {2, 1}) {
    const std::string again = dir.file("at" + std::to_string(world) + ".pt");
    ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
      Sharded s = make_sharded(pg, 6);  // other weights: the load must replace them all
      train(s, pg.rank(), 1);           // and an optimizer state to overwrite
      auto ckpt = checkpoint_of(s, pg);
      ddp::load_checkpoint(saved, ckpt);
      EXPECT_EQ(ckpt.step(), 3);
      ddp::save_checkpoint(again, ckpt);
      // Training goes on from the loaded state.
      train(s, pg.rank(), 1);
    });
    expect_same_checkpoint(saved, again);
  }
  // And back from 1 rank to 3: each rank's rows again.
  const std::string back = dir.file("back-at3.pt");
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    Sharded s = make_sharded(pg, 7);
    auto ckpt = checkpoint_of(s, pg);
    ddp::load_checkpoint(dir.file("at1.pt"), ckpt);
    ddp::save_checkpoint(back, ckpt);
  });
  expect_same_checkpoint(saved, back);
}

// A DCP folder, nothing gathered: saved at 3 ranks, loaded at 2 and at 1 (sharded), and
// into the plain model; each then saves the usual (gathered) checkpoint, which must equal
// the one saved at 3 ranks bit for bit.
TEST(FullyShardCheckpoint, ShardedFolderLoadsAtAnyWorldSizeBitIdentical) {
  ddp_test::TempDir dir;
  const std::string folder = dir.file("sharded");
  const std::string gathered = dir.file("at3.pt");
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    Sharded s = make_sharded(pg, 11);
    train(s, pg.rank(), 3);
    ddp::save_sharded_checkpoint(folder, checkpoint_of(s, pg).step(3));
    ddp::save_checkpoint(gathered, checkpoint_of(s, pg).step(3));
  });
  for (const char* name : {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp", ".metadata"}) {
    EXPECT_TRUE(ddp_test::run_command("test -f '" + folder + "/" + name + "'") == 0) << name;
  }
  for (int world : {2, 1}) {
    const std::string again = dir.file("from-sharded-at" + std::to_string(world) + ".pt");
    ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
      Sharded s = make_sharded(pg, 12);
      train(s, pg.rank(), 1);
      auto ckpt = checkpoint_of(s, pg);
      ddp::load_sharded_checkpoint(folder, ckpt);
      EXPECT_EQ(ckpt.step(), 3);
      ddp::save_checkpoint(again, ckpt);
    });
    expect_same_checkpoint(gathered, again);
  }
  // A plain model (no fully_shard) takes every row.
  {
    auto plain = std::make_shared<TinyGptImpl>();
    ddp::Checkpoint ckpt(*plain);
    ckpt.rng(false);
    ddp::load_sharded_checkpoint(folder, ckpt);
    const auto want = ddp::read_state_dict(gathered);
    for (const auto& kv : ddp::model_state_dict(*plain)) {
      EXPECT_TRUE(ddp_test::same_bits(kv.value(), want.at(kv.key()))) << kv.key();
    }
  }
  // A folder whose save did not finish is refused, by both loads.
  ASSERT_EQ(ddp_test::run_command("rm '" + folder + "/.metadata'"), 0);
  auto plain = std::make_shared<TinyGptImpl>();
  const auto before = ddp::model_state_dict(*plain);
  ddp::Checkpoint ckpt(*plain);
  EXPECT_ERROR_HAS(ddp_test::error_of([&] { ddp::load_sharded_checkpoint(folder, ckpt); }),
                   "has no .metadata");
  EXPECT_ERROR_HAS(ddp_test::error_of([&] { ddp::load_checkpoint(folder, ckpt); }),
                   "has no .metadata");
  for (const auto& kv : ddp::model_state_dict(*plain)) {
    EXPECT_TRUE(ddp_test::same_bits(kv.value(), before.at(kv.key()))) << kv.key() << " changed";
  }
}

// The first sharded format (one file per rank and a `complete` mark) still loads, through
// both load_sharded_checkpoint and load_checkpoint, at another world size.
TEST(FullyShardCheckpoint, FirstShardedFormatStillLoads) {
  ddp_test::TempDir dir;
  const std::string folder = dir.file("old");
  const std::string gathered = dir.file("at3.pt");
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    Sharded s = make_sharded(pg, 21);
    train(s, pg.rank(), 2);
    ddp::detail::save_legacy_sharded_checkpoint(folder, checkpoint_of(s, pg).step(2));
    ddp::save_checkpoint(gathered, checkpoint_of(s, pg).step(2));
  });
  EXPECT_EQ(ddp_test::run_command("test -f '" + folder + "/complete'"), 0);
  for (int world : {2, 1}) {
    const std::string again = dir.file("again-at" + std::to_string(world) + ".pt");
    ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
      Sharded s = make_sharded(pg, 22);
      auto ckpt = checkpoint_of(s, pg);
      if (world == 2) {
        ddp::load_checkpoint(folder, ckpt);
      } else {
        ddp::load_sharded_checkpoint(folder, ckpt);
      }
      EXPECT_EQ(ckpt.step(), 2);
      ddp::save_checkpoint(again, ckpt);
    });
    expect_same_checkpoint(gathered, again);
  }
}

// The sampler's indices still to come, `batches` batches of 4.
std::vector<size_t> upcoming(ddp::DistributedSampler& sampler, int batches) {
  std::vector<size_t> out;
  for (int b = 0; b < batches; ++b) {
    const auto next = sampler.next(4);
    if (!next) break;
    out.insert(out.end(), next->begin(), next->end());
  }
  return out;
}

// A directory of DCP folders (CheckpointFormat::kDcp): keep_last, `latest`, an unfinished
// folder skipped and then cleared; the sampler's mid-epoch position, the extra values and
// the ZeRO-free Adam state come back at the same world size and, resharded, at another,
// exactly as from the single file saved at the same moment.
TEST(FullyShardCheckpoint, DcpDirectoryEqualsTheFile) {
  ddp_test::TempDir dir;
  const auto folders =
      ddp::CheckpointOptions(dir.file("dcp")).keep_last(2).format(ddp::CheckpointFormat::kDcp);
  const auto files = ddp::CheckpointOptions(dir.file("file"));
  constexpr size_t kSamples = 50;
  std::vector<std::vector<size_t>> next_at3(3);
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    Sharded s = make_sharded(pg, 31);
    ddp::DistributedSampler sampler(
        kSamples, ddp::DistributedSamplerOptions().num_replicas(3).rank(pg.rank()).seed(7));
    for (int64_t step = 2; step <= 6; step += 2) {
      train(s, pg.rank(), 1);
      sampler.set_epoch(1);
      upcoming(sampler, 1);  // mid-epoch: 4 of each rank's 17 samples handed out per step
      auto ckpt = checkpoint_of(s, pg).sampler(&sampler).epoch(1).step(step);
      ckpt.extra().insert("note", std::string("step ") + std::to_string(step));
      if (step == 6 && pg.rank() == 0) {  // a save that died before its .metadata
        ASSERT_EQ(ddp_test::run_command("mkdir -p '" + dir.file("dcp/ckpt-5") + "' && echo x > '" +
                                        dir.file("dcp/ckpt-5/__0_0.distcp") + "'"),
                  0);
        EXPECT_EQ(ddp::latest_checkpoint(folders), dir.file("dcp/ckpt-4"));
      }
      pg.barrier();
      EXPECT_EQ(ddp::save_checkpoint(folders, ckpt), dir.file("dcp/ckpt-" + std::to_string(step)));
      ddp::save_checkpoint(files, ckpt);
    }
    next_at3[static_cast<size_t>(pg.rank())] = upcoming(sampler, 2);
  });
  std::string listing;
  ASSERT_EQ(ddp_test::run_command("ls -A '" + dir.file("dcp") + "'", &listing), 0);
  EXPECT_EQ(listing, "ckpt-4\nckpt-6\nlatest\n") << "old, unfinished or temporary entries left";
  EXPECT_EQ(ddp::latest_checkpoint(folders), dir.file("dcp/ckpt-6"));

  for (int world : {3, 2}) {
    std::vector<std::vector<size_t>> from_folder(world), from_file(world);
    const std::string again = dir.file("again-at" + std::to_string(world) + ".pt");
    const std::string reference = dir.file("reference-at" + std::to_string(world) + ".pt");
    ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
      const auto r = static_cast<size_t>(pg.rank());
      for (bool folder : {true, false}) {
        Sharded s = make_sharded(pg, 32);
        ddp::DistributedSampler sampler(
            kSamples, ddp::DistributedSamplerOptions().num_replicas(world).rank(pg.rank()).seed(7));
        auto ckpt = checkpoint_of(s, pg).sampler(&sampler);
        const auto loaded = ddp::load_latest_checkpoint(folder ? folders : files, ckpt);
        ASSERT_TRUE(loaded.has_value());
        EXPECT_EQ(ckpt.step(), 6);
        EXPECT_EQ(ckpt.epoch(), 1);
        EXPECT_EQ(ckpt.extra().at("note").toStringRef(), "step 6");
        sampler.set_epoch(1);
        (folder ? from_folder : from_file)[r] = upcoming(sampler, 2);
        ddp::save_checkpoint(folder ? again : reference, ckpt);
      }
    });
    expect_same_checkpoint(reference, again);
    EXPECT_EQ(from_folder, from_file) << "world " << world;
    if (world == 3) EXPECT_EQ(from_folder, next_at3);
  }

  // A DCP folder that is not a Checkpoint's (as Python's dcp.save of a model writes) is
  // refused by load_checkpoint, pointing at ddp::dcp::load; nothing changes.
  auto plain = std::make_shared<TinyGptImpl>();
  ddp::dcp::StateDict bare;
  bare.add_model(*plain);
  ddp::dcp::save(bare, dir.file("bare"));
  auto other = std::make_shared<TinyGptImpl>();
  const auto before = ddp::model_state_dict(*other);
  ddp::Checkpoint ckpt(*other);
  const std::string error =
      ddp_test::error_of([&] { ddp::load_checkpoint(dir.file("bare"), ckpt); });
  EXPECT_ERROR_HAS(error, "not a ddp-cpp checkpoint (it has no 'format' key)");
  EXPECT_ERROR_HAS(error, "ddp::dcp::load");
  for (const auto& kv : ddp::model_state_dict(*other)) {
    EXPECT_TRUE(ddp_test::same_bits(kv.value(), before.at(kv.key()))) << kv.key() << " changed";
  }
}

// The full state dict and the checkpoint load into a plain PyTorch module
// (torch.load(weights_only=True), load_state_dict with strict keys and shapes).
TEST(FullyShardCheckpointPython, FullStateDictAndCheckpointLoadInTorch) {
  ddp_test::TempDir dir;
  at::Tensor expected;
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    Sharded s = make_sharded(pg, 8);
    train(s, pg.rank(), 2);
    ddp::save_checkpoint(dir.file("ckpt.pt"), checkpoint_of(s, pg));
    auto state = ddp::full_state_dict(*s.model);
    if (pg.rank() == 0) {
      ddp::save_state_dict(state, dir.file("state.pt"));
      std::vector<at::Tensor> parts;
      for (const auto& item : s.model->named_parameters()) {
        parts.push_back(state.at(item.key()).reshape({-1}));
      }
      expected = at::cat(parts);
    }
  });
  std::string output;
  const int rc =
      ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                "/tests/parallel/python/fsdp_load.py " + dir.file("state.pt") +
                                " " + dir.file("ckpt.pt") + " " + dir.file("py") + " 2>&1",
                            &output);
  ASSERT_EQ(rc, 0) << output;
  for (const char* which : {"state", "ckpt"}) {
    at::Tensor got = at::empty({expected.numel()}, at::kFloat);
    std::ifstream f(dir.file(std::string("py.") + which + ".bin"), std::ios::binary);
    f.read(static_cast<char*>(got.data_ptr()), got.numel() * sizeof(float));
    ASSERT_EQ(f.gcount(), static_cast<std::streamsize>(got.numel() * sizeof(float))) << which;
    EXPECT_TRUE(ddp_test::same_bits(got, expected)) << which;
  }
}

}  // namespace

}  // namespace fsdp_checkpoint_test
