// A directory of checkpoints: <prefix>-<step>.pt files or <prefix>-<step>/ DCP folders, a
// `latest` pointer, keep_last.

#include <ddp/serialize/checkpoint.h>

#include "formats/atomic_file.h"
#include "distributed/common/check.h"
#include "serialize/checkpoint_io.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <utility>

namespace ddp {

namespace {

constexpr const char* kLatest = "latest";

void validate(const CheckpointOptions& options) {
  DDP_CHECK(!options.directory().empty(),
            "CheckpointOptions: directory must not be empty; expected a path");
  DDP_CHECK(options.keep_last() >= 0,
            "CheckpointOptions: keep_last must be >= 0 (0 keeps "
            "all), but got ",
            options.keep_last());
  DDP_CHECK(!options.prefix().empty() && options.prefix().find('/') == std::string::npos,
            "CheckpointOptions: prefix must be a non-empty file name without '/', but got '",
            options.prefix(), "'");
}

std::string file_name(const CheckpointOptions& options, int64_t step) {
  return options.prefix() + "-" + std::to_string(step) +
         (options.format() == CheckpointFormat::kDcp ? "" : ".pt");
}

bool is_folder_name(const std::string& name) {
  return name.size() < 3 || name.compare(name.size() - 3, 3, ".pt") != 0;
}

// The step of "<prefix>-<digits>.pt" or "<prefix>-<digits>", or -1 for any other name.
int64_t step_of(const CheckpointOptions& options, const std::string& name) {
  const std::string head = options.prefix() + "-";
  const std::string tail = is_folder_name(name) ? "" : ".pt";
  if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0) {
    return -1;
  }
  const std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c); })) {
    return -1;
  }
  return std::stoll(digits);
}

// Whether `name` in the directory is a complete checkpoint: a file, or a folder with its
// .metadata (Note [DCP save]).
bool complete(const CheckpointOptions& options, const std::string& name) {
  const std::string path = options.directory() + "/" + name;
  return is_folder_name(name) ? detail::file_exists(path + "/.metadata")
                              : detail::file_exists(path);
}

// (step, name) of every complete checkpoint, oldest first (of the same step, the
// folder before the file).
std::vector<std::pair<int64_t, std::string>> checkpoints(const CheckpointOptions& options) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& name : detail::list_directory(options.directory())) {
    const int64_t step = step_of(options, name);
    if (step >= 0 && complete(options, name)) out.emplace_back(step, name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Temporaries left by a writer that crashed (Note [Atomic write]), and folders whose save
// did not finish, other than `written`.
void remove_stale_temporaries(const CheckpointOptions& options, const std::string& written) {
  for (const auto& name : detail::list_directory(options.directory())) {
    const bool ours = name.rfind("." + options.prefix() + "-", 0) == 0 ||
                      name.rfind(std::string(".") + kLatest + ".tmp.", 0) == 0;
    const std::string path = options.directory() + "/" + name;
    if (ours && name.find(".tmp.") != std::string::npos) {
      detail::remove_file(path);
    } else if (name != written && step_of(options, name) >= 0 && is_folder_name(name) &&
               detail::is_directory(path) && !complete(options, name)) {
      detail::remove_tree(path);
    }
  }
}

// Keeps the file just written and the newest keep_last - 1 others.
void remove_old(const CheckpointOptions& options, const std::string& written) {
  if (options.keep_last() == 0) return;
  auto all = checkpoints(options);
  all.erase(std::remove_if(all.begin(), all.end(),
                           [&](const auto& c) { return c.second == written; }),
            all.end());
  const size_t keep = static_cast<size_t>(options.keep_last() - 1);
  for (size_t i = 0; i + keep < all.size(); ++i) {
    detail::remove_tree(options.directory() + "/" + all[i].second);
  }
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

}  // namespace

std::string save_checkpoint(const CheckpointOptions& options, const Checkpoint& checkpoint) {
  validate(options);
  DDP_CHECK(checkpoint.step() >= 0,
            "save_checkpoint: Checkpoint::step must be >= 0 (it "
            "names the file), but got ",
            checkpoint.step());
  const std::string name = file_name(options, checkpoint.step());
  const std::string path = options.directory() + "/" + name;
  // Once the checkpoint is complete: the pointer names it, then the old ones go.
  const auto record = [&] {
    detail::write_file_atomic(options.directory() + "/" + kLatest, name + "\n");
    remove_old(options, name);
    remove_stale_temporaries(options, name);
  };
  if (options.format() == CheckpointFormat::kDcp) {
    detail::save_dcp_checkpoint(path, checkpoint, record);
    return path;
  }
  detail::save_checkpoint_with(
      path, checkpoint,
      /*before=*/
      [&] {
        detail::make_directories(options.directory());
        remove_stale_temporaries(options, name);
      },
      /*after=*/record);
  return path;
}

std::optional<std::string> latest_checkpoint(const CheckpointOptions& options) {
  validate(options);
  const std::string pointer = options.directory() + "/" + kLatest;
  if (detail::file_exists(pointer)) {
    const std::string name = trim(detail::read_file(pointer));
    if (step_of(options, name) >= 0 && complete(options, name)) {
      return options.directory() + "/" + name;
    }
  }
  const auto all = checkpoints(options);
  if (all.empty()) return std::nullopt;
  return options.directory() + "/" + all.back().second;
}

std::optional<std::string> load_latest_checkpoint(const CheckpointOptions& options,
                                                  Checkpoint& checkpoint) {
  validate(options);
  const detail::CheckpointGroup group = detail::checkpoint_group(checkpoint);
  std::string choice;
  if (group.rank == 0) {
    const auto latest = latest_checkpoint(options);
    choice = latest ? *latest : "";
  }
  // Rank 0 decides, so that every rank loads the same file even if a save is racing.
  choice = group.all_gather(choice)[0];
  if (choice.empty()) return std::nullopt;
  load_checkpoint(choice, checkpoint);
  return choice;
}

}  // namespace ddp
