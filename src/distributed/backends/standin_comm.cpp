// The "standin" backend: Note [Device stand-in] in device_standin.h.
//
// Every collective first checks, as NCCL's group does, that each tensor is on this
// rank's device (standin:<local rank>); a host tensor is an error that names the call.
// Then the host group runs it on CPU tensors over the same memory, and the future
// hands back the caller's device tensors, as NCCL's does.

#include "distributed/comm.h"
#include "distributed/backends/device_standin.h"

#include <ATen/core/ivalue.h>

namespace ddp {
namespace detail {
namespace {

std::vector<at::Tensor> host_aliases(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(standin_host_alias(t));
  return out;
}

CommConfig standin_config(CommConfig c) {
  c.backend = "standin";
  return c;
}

class StandinComm final : public Comm {
 public:
  explicit StandinComm(std::unique_ptr<Comm> host)
      : Comm(standin_config(host->config())), host_(std::move(host)) {}

  c10::Device device() const override { return standin_device(config().local_rank); }
  bool trivial() const override { return host_->trivial(); }
  // NCCL's contract: every dtype (the host group is Gloo of LibTorch 2.1 or later).
  bool reduces_dtype(c10::ScalarType) const override { return true; }

  std::shared_ptr<PendingWork> all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op) override {
    check_devices("all_reduce", tensors);
    std::vector<at::Tensor> host = host_aliases(tensors);
    return then_work(host_->all_reduce(host, op), nullptr, tensors);
  }
  std::shared_ptr<PendingWork> broadcast(std::vector<at::Tensor>& tensors, int src) override {
    check_devices("broadcast", tensors);
    std::vector<at::Tensor> host = host_aliases(tensors);
    return then_work(host_->broadcast(host, src), nullptr, tensors);
  }
  std::shared_ptr<PendingWork> all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    check_devices("all_gather", inputs);
    std::vector<std::vector<at::Tensor>> host_outputs;
    for (const auto& out : outputs) {
      check_devices("all_gather (outputs)", out);
      host_outputs.push_back(host_aliases(out));
    }
    std::vector<at::Tensor> host_inputs = host_aliases(inputs);
    return then_work(host_->all_gather(host_outputs, host_inputs), nullptr,
                     outputs.empty() ? inputs : outputs[0]);
  }
  std::shared_ptr<PendingWork> reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                     ReduceOp op) override {
    check_flat("reduce_scatter_tensor", input, output);
    at::Tensor host_output = standin_host_alias(output);
    at::Tensor host_input = standin_host_alias(input);
    return then_work(host_->reduce_scatter_tensor(host_output, host_input, op), nullptr,
                     std::vector<at::Tensor>{output});
  }
  std::shared_ptr<PendingWork> all_gather_into_tensor(at::Tensor& output,
                                                      at::Tensor& input) override {
    check_flat("all_gather_into_tensor", output, input);
    at::Tensor host_output = standin_host_alias(output);
    at::Tensor host_input = standin_host_alias(input);
    return then_work(host_->all_gather_into_tensor(host_output, host_input), nullptr,
                     std::vector<at::Tensor>{output});
  }
  // The rest of torch.distributed's collectives and point to point: the same placement
  // check, then the host group on aliases.
  std::shared_ptr<PendingWork> reduce(std::vector<at::Tensor>& tensors, int dst,
                                      ReduceOp op) override {
    check_devices("reduce", tensors);
    std::vector<at::Tensor> host = host_aliases(tensors);
    return then_work(host_->reduce(host, dst, op), nullptr, tensors);
  }
  std::shared_ptr<PendingWork> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                      std::vector<at::Tensor>& inputs, int dst) override {
    check_devices("gather", inputs);
    std::vector<std::vector<at::Tensor>> host_outputs;
    for (const auto& out : outputs) {
      check_devices("gather (outputs)", out);
      host_outputs.push_back(host_aliases(out));
    }
    std::vector<at::Tensor> host_inputs = host_aliases(inputs);
    return then_work(host_->gather(host_outputs, host_inputs, dst), nullptr,
                     outputs.empty() ? inputs : outputs[0]);
  }
  std::shared_ptr<PendingWork> scatter(std::vector<at::Tensor>& outputs,
                                       std::vector<std::vector<at::Tensor>>& inputs,
                                       int src) override {
    check_devices("scatter", outputs);
    std::vector<std::vector<at::Tensor>> host_inputs;
    for (const auto& in : inputs) {
      check_devices("scatter (inputs)", in);
      host_inputs.push_back(host_aliases(in));
    }
    std::vector<at::Tensor> host_outputs = host_aliases(outputs);
    return then_work(host_->scatter(host_outputs, host_inputs, src), nullptr, outputs);
  }
  std::shared_ptr<PendingWork> reduce_scatter(std::vector<at::Tensor>& outputs,
                                              std::vector<std::vector<at::Tensor>>& inputs,
                                              ReduceOp op) override {
    check_devices("reduce_scatter", outputs);
    std::vector<std::vector<at::Tensor>> host_inputs;
    for (const auto& in : inputs) {
      check_devices("reduce_scatter (inputs)", in);
      host_inputs.push_back(host_aliases(in));
    }
    std::vector<at::Tensor> host_outputs = host_aliases(outputs);
    return then_work(host_->reduce_scatter(host_outputs, host_inputs, op), nullptr, outputs);
  }
  std::shared_ptr<PendingWork> all_to_all(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    check_devices("all_to_all", inputs);
    check_devices("all_to_all (outputs)", outputs);
    std::vector<at::Tensor> host_outputs = host_aliases(outputs);
    std::vector<at::Tensor> host_inputs = host_aliases(inputs);
    return then_work(host_->all_to_all(host_outputs, host_inputs), nullptr, outputs);
  }
  std::shared_ptr<PendingWork> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits) override {
    check_devices("all_to_all_single", {input, output});
    at::Tensor host_output = standin_host_alias(output);
    at::Tensor host_input = standin_host_alias(input);
    return then_work(host_->all_to_all_single(host_output, host_input, output_splits, input_splits),
                     nullptr, std::vector<at::Tensor>{output});
  }
  std::shared_ptr<PendingWork> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    check_devices("send", tensors);
    std::vector<at::Tensor> host = host_aliases(tensors);
    return then_work(host_->send(host, dst, tag), nullptr, tensors);
  }
  std::shared_ptr<PendingWork> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    check_devices("recv", tensors);
    std::vector<at::Tensor> host = host_aliases(tensors);
    return then_work(host_->recv(host, src, tag), nullptr, tensors);
  }
  std::vector<std::shared_ptr<PendingWork>> batch_p2p(std::vector<P2P>& ops) override {
    std::vector<P2P> host_ops = ops;
    for (P2P& op : host_ops) {
      check_devices("batch_isend_irecv", {op.tensor});
      op.tensor = standin_host_alias(op.tensor);
    }
    std::vector<std::shared_ptr<PendingWork>> works = host_->batch_p2p(host_ops);
    for (size_t i = 0; i < works.size(); ++i) {
      works[i] = then_work(std::move(works[i]), nullptr, {ops[i].tensor});
    }
    return works;
  }
  void barrier() override { host_->barrier(); }
  void store_set(const std::string& key, const std::string& value) override {
    host_->store_set(key, value);
  }
  std::optional<std::string> store_try_get(const std::string& key) override {
    return host_->store_try_get(key);
  }
  // NCCL's rule (this rank's device only) is Comm::accepts's for "standin".
  void shutdown() override { host_->shutdown(); }

 private:
  std::unique_ptr<Comm> host_;
};

}  // namespace

std::unique_ptr<Comm> make_standin_comm(std::unique_ptr<Comm> host) {
  return std::make_unique<StandinComm>(std::move(host));
}

}  // namespace detail
}  // namespace ddp
