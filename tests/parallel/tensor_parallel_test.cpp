// ddp::parallelize_module against the unsharded module in one process: the same outputs,
// the same input gradient, and each rank's parameter gradients equal to its chunk of the
// unsharded ones, for ColwiseParallel and RowwiseParallel on Linear and Embedding, the
// Megatron MLP (colwise then rowwise), sequence parallelism around it, at 2, 3 and 4
// ranks with dimensions that do not divide (torch.chunk's uneven chunks, empty ones
// included). Also the refusals.

#include "support/harness.h"
#include "support/util.h"

#include <ddp/distributed/device_mesh.h>
#include <ddp/fsdp/fully_shard.h>
#include <ddp/parallel/tensor_parallel.h>
#include <ddp/serialize/checkpoint.h>
#include <ddp/serialize/dcp.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

namespace tensor_parallel_test {

namespace {

constexpr double kTol = 1e-5;  // float32 sums in another order (OpenBLAS, MKL): up to ~1e-6

// torch.chunk's piece `r` of `n` along `dim`, computed here independently of the library.
at::Tensor chunk(const at::Tensor& t, int64_t dim, int64_t n, int64_t r) {
  const auto pieces = t.chunk(n, dim);
  if (r < static_cast<int64_t>(pieces.size())) return pieces[static_cast<size_t>(r)];
  std::vector<int64_t> shape = t.sizes().vec();
  shape[static_cast<size_t>(dim)] = 0;
  return at::empty(shape, t.options());
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  if (want.numel() == 0) return;
  // Relative to the largest entry: the sums run in another order.
  const double scale = std::max(1.0, want.abs().max().item<double>());
  const double diff = (got - want).abs().max().item<double>();
  EXPECT_LE(diff, kTol * scale) << what << ": max |difference| " << diff << " (largest entry "
                                << scale << ")";
}

void fill(torch::nn::Module& m, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.5);
}

at::Tensor input(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen);
}

// Linear(12, 10) colwise, GELU, Linear(10, 7) rowwise, Linear(7, 9) colwise gathered,
// Linear(9, 4) rowwise from a whole input: every layout of the two styles.
torch::nn::Sequential linear_stack() {
  torch::nn::Sequential s(torch::nn::Linear(12, 10), torch::nn::Functional(at::gelu, "none"),
                          torch::nn::Linear(10, 7), torch::nn::Linear(7, 9),
                          torch::nn::Functional(at::tanh), torch::nn::Linear(9, 4));
  fill(*s, 7);
  return s;
}

ddp::ParallelizePlan linear_plan() {
  return {{"0", ddp::ColwiseParallel()},
          {"2", ddp::RowwiseParallel()},
          {"3", ddp::ColwiseParallel().output_layouts(ddp::Replicate())},
          {"5", ddp::RowwiseParallel().input_layouts(ddp::Replicate())}};
}

// The split dimension of each styled weight (Linear: colwise 0, rowwise 1; bias: colwise
// 0, rowwise whole).
struct Split {
  std::string key;
  int64_t dim;  // -1: whole
};

void check_stack(int world) {
  const at::Tensor x0 = input({5, 12}, 11);
  auto ref = linear_stack();
  at::Tensor xr = x0.clone().requires_grad_(true);
  const at::Tensor yr = ref->forward(xr);
  (yr * yr).sum().backward();
  std::map<std::string, at::Tensor> ref_grads;
  for (const auto& p : ref->named_parameters()) ref_grads[p.key()] = p.value().grad();
  const std::vector<Split> splits = {{"0.weight", 0}, {"0.bias", 0},   {"2.weight", 1},
                                     {"2.bias", -1},  {"3.weight", 0}, {"3.bias", 0},
                                     {"5.weight", 1}, {"5.bias", -1}};
  ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    auto model = linear_stack();
    ddp::parallelize_module(*model, ddp_test::borrow(pg), linear_plan());
    at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor y = model->forward(x);
    expect_close(y, yr, "output on rank " + std::to_string(pg.rank()));
    (y * y).sum().backward();
    expect_close(x.grad(), xr.grad(), "input gradient on rank " + std::to_string(pg.rank()));
    const auto params = model->named_parameters();
    for (const Split& s : splits) {
      const at::Tensor& p = params[s.key];
      const at::Tensor want =
          s.dim < 0 ? ref_grads.at(s.key) : chunk(ref_grads.at(s.key), s.dim, world, pg.rank());
      expect_close(p.grad().defined() ? p.grad() : at::zeros_like(p), want,
                   s.key + " gradient on rank " + std::to_string(pg.rank()));
      const auto shard = ddp::tensor_parallel_shard(p);
      EXPECT_EQ(shard.has_value(), s.dim >= 0) << s.key;
      if (shard) {
        EXPECT_EQ(shard->dim, s.dim) << s.key;
        EXPECT_EQ(shard->full_size, ref_grads.at(s.key).sizes().vec()) << s.key;
      }
    }
  });
}

}  // namespace

TEST(TensorParallel, LinearStackAtTwoRanks) { check_stack(2); }
// 10 and 7 over 3 ranks: chunks 4, 4, 2 and 3, 3, 1.
TEST(TensorParallel, LinearStackAtThreeRanksUneven) { check_stack(3); }
// 7 over 4: 2, 2, 2, 1; 9 over 4: 3, 3, 3, 0 (an empty chunk).
TEST(TensorParallel, LinearStackAtFourRanksWithAnEmptyChunk) { check_stack(4); }

TEST(TensorParallel, EmbeddingRowwiseAndColwise) {
  for (int world : {2, 3, 4}) {
    auto make = [] {
      torch::nn::Sequential s(torch::nn::Embedding(11, 6), torch::nn::Embedding(13, 5));
      fill(*s, 3);
      return s;
    };
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    const at::Tensor idx_a = at::randint(11, {3, 4}, gen, at::kLong);
    const at::Tensor idx_b = at::randint(13, {3, 4}, gen, at::kLong);
    auto ref = make();
    auto* ra = ref[0]->as<torch::nn::EmbeddingImpl>();
    auto* rb = ref[1]->as<torch::nn::EmbeddingImpl>();
    const at::Tensor ya = ra->forward(idx_a), yb = rb->forward(idx_b);
    ((ya * ya).sum() + (yb * yb).sum()).backward();
    ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
      auto model = make();
      // Rowwise: rows of the 11 split (3 ranks: 4, 4, 3), indices whole, output summed.
      // Colwise: the 5 columns split (4 ranks: 2, 2, 1, 0), output gathered.
      ddp::parallelize_module(*model, ddp_test::borrow(pg),
                              {{"0", ddp::RowwiseParallel()},
                               {"1", ddp::ColwiseParallel().output_layouts(ddp::Replicate())}});
      const at::Tensor a =
          model[0]->as<ddp::TensorParallelImpl<torch::nn::EmbeddingImpl>>()->forward(idx_a);
      const at::Tensor b =
          model[1]->as<ddp::TensorParallelImpl<torch::nn::EmbeddingImpl>>()->forward(idx_b);
      const std::string at =
          " at " + std::to_string(world) + " ranks, rank " + std::to_string(pg.rank());
      expect_close(a, ya, "rowwise embedding output" + at);
      expect_close(b, yb, "colwise embedding output" + at);
      ((a * a).sum() + (b * b).sum()).backward();
      const auto params = model->named_parameters();
      expect_close(params["0.weight"].grad(), chunk(ra->weight.grad(), 0, world, pg.rank()),
                   "rowwise embedding gradient" + at);
      expect_close(params["1.weight"].grad(), chunk(rb->weight.grad(), 1, world, pg.rank()),
                   "colwise embedding gradient" + at);
    });
  }
}

namespace {

// The Megatron MLP with fields declared for tensor parallelism, and a LayerNorm before it.
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : ln(register_module("ln", ddp::TensorParallel<torch::nn::LayerNormImpl>(
                                     torch::nn::LayerNormOptions({8})))),
        fc(register_module("fc", ddp::TensorParallel<torch::nn::LinearImpl>(8, 14))),
        proj(register_module("proj", ddp::TensorParallel<torch::nn::LinearImpl>(14, 8))) {}
  at::Tensor forward(const at::Tensor& x) { return proj(at::gelu(fc(ln(x)))); }
  ddp::TensorParallel<torch::nn::LayerNormImpl> ln;
  ddp::TensorParallel<torch::nn::LinearImpl> fc, proj;
};
TORCH_MODULE(Mlp);

struct BlocksImpl : torch::nn::Module {
  BlocksImpl() : blocks(register_module("blocks", torch::nn::ModuleList(Mlp(), Mlp()))) {
    fill(*this, 17);
  }
  at::Tensor forward(at::Tensor x) {
    for (const auto& b : *blocks) {
      // A block under fully_shard is its unit (Note [Units take their module's place]).
      auto* unit = b->as<ddp::FullyShardImpl<MlpImpl>>();
      x = x + (unit ? unit->forward(x) : b->as<MlpImpl>()->forward(x));
    }
    return x;
  }
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(Blocks);

}  // namespace

// Fields declared as ddp::TensorParallel<M>, a wildcard plan, and with sequence
// parallelism: the LayerNorm on each rank's slice of the sequence (Shard(1)), fc
// all-gathering it, proj reduce-scattering back (7 positions over 2 and 3 ranks).
TEST(TensorParallel, MegatronMlpWithAndWithoutSequenceParallel) {
  const at::Tensor x0 = input({2, 7, 8}, 23);
  Blocks ref;
  at::Tensor xr = x0.clone().requires_grad_(true);
  const at::Tensor yr = ref->forward(xr);
  (yr * yr).sum().backward();
  std::map<std::string, at::Tensor> g;
  for (const auto& p : ref->named_parameters()) g[p.key()] = p.value().grad();
  for (bool sequence_parallel : {false, true}) {
    for (int world : {2, 3}) {
      ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
        Blocks model;
        ddp::ParallelizePlan plan;
        if (sequence_parallel) {
          plan = {{"blocks.*.ln", ddp::SequenceParallel()},
                  {"blocks.*.fc", ddp::ColwiseParallel().input_layouts(ddp::Shard(1))},
                  {"blocks.*.proj", ddp::RowwiseParallel().output_layouts(ddp::Shard(1))}};
        } else {
          plan = {{"blocks.*.fc", ddp::ColwiseParallel()},
                  {"blocks.*.proj", ddp::RowwiseParallel()}};
        }
        ddp::parallelize_module(*model, ddp_test::borrow(pg), plan);
        const int64_t n = world, r = pg.rank();
        at::Tensor x = (sequence_parallel ? chunk(x0, 1, n, r) : x0).clone().requires_grad_(true);
        const at::Tensor y = model->forward(x);
        const std::string at = std::string(sequence_parallel ? " (sequence parallel)" : "") +
                               " at " + std::to_string(world) + " ranks, rank " + std::to_string(r);
        expect_close(y, sequence_parallel ? chunk(yr, 1, n, r) : yr, "output" + at);
        (y * y).sum().backward();
        expect_close(x.grad(), sequence_parallel ? chunk(xr.grad(), 1, n, r) : xr.grad(),
                     "input gradient" + at);
        for (const auto& p : model->named_parameters()) {
          const std::string& k = p.key();
          const bool fc = k.find(".fc.") != std::string::npos;
          const bool proj_w = k.find(".proj.weight") != std::string::npos;
          const at::Tensor want = fc       ? chunk(g.at(k), 0, n, r)
                                  : proj_w ? chunk(g.at(k), 1, n, r)
                                           : g.at(k);  // LayerNorm, proj.bias: whole
          expect_close(p.value().grad(), want, k + " gradient" + at);
        }
      });
    }
  }
}

TEST(TensorParallel, RefusesWhatItCannotDo) {
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    const auto group = ddp_test::borrow(pg);
    // A typed field of type torch::nn::Linear cannot hold the wrapper.
    struct Typed : torch::nn::Module {
      Typed() : fc(register_module("fc", torch::nn::Linear(4, 4))) {}
      torch::nn::Linear fc;
    };
    auto typed = std::make_shared<Typed>();
    const at::Tensor before = typed->fc->weight.clone();
    EXPECT_ERROR_HAS(ddp_test::error_of([&] {
                       ddp::parallelize_module(*typed, group, {{"fc", ddp::ColwiseParallel()}});
                     }),
                     "Declare the field as ddp::TensorParallel<");
    EXPECT_TRUE(ddp_test::same_bits(typed->fc->weight, before)) << "changed before refusing";

    auto stack = linear_stack();
    EXPECT_ERROR_HAS(ddp_test::error_of([&] {
                       ddp::parallelize_module(*stack, group, {{"7", ddp::ColwiseParallel()}});
                     }),
                     "matches no submodule");
    EXPECT_ERROR_HAS(ddp_test::error_of([&] {
                       ddp::parallelize_module(*stack, group,
                                               {{"0", ddp::ColwiseParallel()},
                                                {"?", ddp::RowwiseParallel()}});
                     }),
                     "is named by the plan twice");
    EXPECT_ERROR_HAS(ddp_test::error_of([&] {
                       ddp::parallelize_module(*stack, group, {{"1", ddp::ColwiseParallel()}});
                     }),
                     "a styled module must be a torch::nn::Linear");
    EXPECT_ERROR_HAS(ddp_test::error_of([&] {
                       ddp::parallelize_module(*stack, group,
                                               {{"0",
                                                 ddp::ColwiseParallel().use_local_output(false)}});
                     }),
                     "plain tensors");
    // A rowwise layer fed a whole input without saying so.
    auto row = linear_stack();
    ddp::parallelize_module(*row, group, {{"0", ddp::RowwiseParallel()}});
    EXPECT_ERROR_HAS(ddp_test::error_of([&] {
                       row->forward(input({2, 12}, 1));
                     }),
                     "input_layouts(ddp::Replicate())");
  });
}

}  // namespace tensor_parallel_test

namespace tensor_parallel_test {

namespace {

void expect_same_state(const c10::Dict<std::string, at::Tensor>& got,
                       const c10::Dict<std::string, at::Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& kv : want) {
    ASSERT_TRUE(got.contains(kv.key())) << what << ": no " << kv.key();
    EXPECT_TRUE(ddp_test::same_bits(got.at(kv.key()), kv.value())) << what << ": " << kv.key();
  }
}

at::Tensor batch(int step, int replica) { return input({2, 7, 8}, 100 * step + replica); }

}  // namespace

// full_state_dict gathers the chunks (bit for bit the unsharded model's tensors), and
// load_full_state_dict cuts them out again, at 3 ranks (uneven chunks).
TEST(TensorParallelState, FullStateDictRoundTrip) {
  Blocks ref;
  const auto want = ddp::model_state_dict(*ref);
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    const ddp::ParallelizePlan plan = {{"blocks.*.fc", ddp::ColwiseParallel()},
                                       {"blocks.*.proj", ddp::RowwiseParallel()}};
    Blocks model;
    ddp::parallelize_module(*model, ddp_test::borrow(pg), plan);
    const auto full = ddp::full_state_dict(*model);
    if (pg.rank() == 0) expect_same_state(full, want, "full_state_dict");
    if (pg.rank() != 0) EXPECT_EQ(full.size(), 0u);

    Blocks other;
    {
      at::NoGradGuard no_grad;
      for (auto& p : other->parameters()) p.zero_();
    }
    ddp::parallelize_module(*other, ddp_test::borrow(pg), plan);
    ddp::load_full_state_dict(*other, want);
    const auto again = ddp::full_state_dict(*other);
    if (pg.rank() == 0) expect_same_state(again, want, "after load_full_state_dict");
  });
}

// A tensor-parallel model and its AdamW in DCP: saved at 3 ranks, loaded into the plain
// model in one process and at 2 ranks, bit for bit.
TEST(TensorParallelState, DcpSavedAtThreeLoadsWholeAndAtTwo) {
  ddp_test::TempDir dir;
  const ddp::ParallelizePlan plan = {{"blocks.*.fc", ddp::ColwiseParallel()},
                                     {"blocks.*.proj", ddp::RowwiseParallel()}};
  c10::Dict<std::string, at::Tensor> saved;
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    Blocks model;
    ddp::parallelize_module(*model, ddp_test::borrow(pg), plan);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    const at::Tensor y = model->forward(batch(0, 0));
    (y * y).mean().backward();
    opt.step();
    ddp::dcp::StateDict state;
    state.add_model(*model).add_optimizer(opt, *model);
    ddp::dcp::save(state, dir.file("tp"),
                   ddp::dcp::SaveOptions().process_group(ddp_test::borrow(pg)));
    const auto full = ddp::full_state_dict(*model);
    if (pg.rank() == 0) saved = full;
  });
  Blocks whole;
  torch::optim::AdamW whole_opt(whole->parameters(), torch::optim::AdamWOptions(1e-2));
  ddp::dcp::StateDict whole_state;
  whole_state.add_model(*whole).add_optimizer(whole_opt, *whole);
  ddp::dcp::load(whole_state, dir.file("tp"));
  expect_same_state(ddp::model_state_dict(*whole), saved, "loaded whole");
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    Blocks model;
    ddp::parallelize_module(*model, ddp_test::borrow(pg), plan);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    ddp::dcp::StateDict state;
    state.add_model(*model).add_optimizer(opt, *model);
    ddp::dcp::load(state, dir.file("tp"));
    const auto full = ddp::full_state_dict(*model);
    if (pg.rank() == 0) expect_same_state(full, saved, "loaded at 2 ranks");
    // The optimizer's chunks came back too: one more step on both sides agrees.
    const at::Tensor y = model->forward(batch(1, 0));
    (y * y).mean().backward();
    opt.step();
  });
}

// 2-D: tensor parallel over "tp", fully_shard over "dp" (torchtitan's order), on a 2 x 2
// mesh; three Adam steps on two replicas' batches equal one process on both.
TEST(TensorParallelState, TwoDimensionalWithFullyShardMatchesOneProcess) {
  Blocks ref;
  torch::optim::Adam ref_opt(ref->parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    at::Tensor loss;
    for (int replica = 0; replica < 2; ++replica) {
      const at::Tensor y = ref->forward(batch(step, replica));
      const at::Tensor l = (y * y).mean() / 2;
      loss = loss.defined() ? loss + l : l;
    }
    loss.backward();
    ref_opt.step();
    ref_opt.zero_grad();
  }
  const auto want = ddp::model_state_dict(*ref);
  ddp_test::run_thread_groups(4, [&](ddp::ProcessGroup& pg) {
    ddp::DeviceMesh mesh("cpu", at::arange(4, at::kLong).view({2, 2}), {"dp", "tp"},
                         ddp_test::borrow(pg));
    Blocks model;
    ddp::parallelize_module(*model, mesh["tp"],
                            {{"blocks.*.fc", ddp::ColwiseParallel()},
                             {"blocks.*.proj", ddp::RowwiseParallel()}});
    const auto opts = ddp::FullyShardOptions().process_group(mesh.get_group("dp"));
    for (size_t i = 0; i < model->blocks->size(); ++i) {
      ddp::fully_shard(model->blocks->ptr<MlpImpl>(i), opts);
    }
    auto root = ddp::fully_shard(model.ptr(), opts);
    torch::optim::Adam opt(root->parameters(), torch::optim::AdamOptions(1e-2));
    const int replica = static_cast<int>(mesh.get_local_rank("dp"));
    for (int step = 0; step < 3; ++step) {
      const at::Tensor y = root->forward(batch(step, replica));
      (y * y).mean().backward();
      opt.step();
      opt.zero_grad();
    }
    const auto full = ddp::full_state_dict(*root);
    if (pg.rank() != 0) return;
    ASSERT_EQ(full.size(), want.size());
    for (const auto& kv : want) expect_close(full.at(kv.key()), kv.value(), "2-D " + kv.key());
  });
}

}  // namespace tensor_parallel_test
