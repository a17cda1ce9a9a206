// Fuzz target: the GPT example's metrics.jsonl reader, read_metrics in
// examples/gpt/report.{h,cpp} (nlohmann-json), and what examples/gpt.cpp does with what
// it reads on --resume: the records are rewritten (write_metrics) and end up in the loss
// plot (write_loss_svg).
//
// read_metrics takes a path: the input is written to one file per process, in a folder
// made once under $TMPDIR (else /dev/shm, else /tmp; fuzz_check.h) and removed at exit. A refusal must
// be a std::runtime_error. What reads must survive write_metrics and read back equal
// (finite numbers only: JSON has no NaN or infinity), and write_loss_svg must finish.
#include "gpt/report.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_check.h"

namespace {

bool same(const std::optional<double>& a, const std::optional<double>& b) {
  return a.has_value() == b.has_value() && (!a || *a == *b);
}

std::string difference(const gpt::StepMetrics& a, const gpt::StepMetrics& b) {
  if (a.step != b.step) return "step";
  if (a.epoch != b.epoch) return "epoch";
  if (!same(a.train_loss, b.train_loss)) return "train_loss";
  if (!same(a.val_loss, b.val_loss)) return "val_loss";
  if (a.tokens_per_s != b.tokens_per_s) return "tokens_per_s";
  if (a.seconds != b.seconds) return "seconds";
  if (a.world_size != b.world_size) return "world_size";
  return "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ddp_fuzz::input_file("metrics.jsonl", data, size);
  std::vector<gpt::StepMetrics> metrics;
  try {
    metrics = gpt::read_metrics(path);
  } catch (const std::runtime_error&) {
    return 0;  // a damaged file, refused with a message: the reader's job
  }

  const std::string rewritten = ddp_fuzz::scratch_dir() + "/rewritten.jsonl";
  gpt::write_metrics(rewritten, metrics);
  std::vector<gpt::StepMetrics> back;
  try {
    back = gpt::read_metrics(rewritten);
  } catch (const std::runtime_error& e) {
    FUZZ_CHECK(false, std::string("read_metrics refused what write_metrics wrote: ") + e.what());
  }
  FUZZ_CHECK(back.size() == metrics.size(), "the rewritten file has another number of records");
  for (size_t i = 0; i < back.size(); ++i) {
    const std::string diff = difference(metrics[i], back[i]);
    FUZZ_CHECK(diff.empty(), "record " + std::to_string(i) + " reads back with another " + diff);
  }

  gpt::write_loss_svg(ddp_fuzz::scratch_dir() + "/loss.svg", metrics, "fuzz <&> run");
  return 0;
}
