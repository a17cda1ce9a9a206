#pragma once

// Files that are never seen half-written. See Note [Atomic write].

#include <string>
#include <string_view>
#include <vector>

namespace ddp {
namespace detail {

/// Replaces `path` with `bytes` so that a crash at any moment leaves either the old
/// file or the new one. Throws (naming the path and the system error) on failure,
/// leaving no temporary file behind.
void write_file_atomic(const std::string& path, std::string_view bytes);

/// The whole file. Throws, naming the path, if it cannot be read.
std::string read_file(const std::string& path);

bool file_exists(const std::string& path);
bool is_directory(const std::string& path);

/// rm -r: removes a folder and everything in it; a missing one is not an error. Returns
/// false on other failures.
bool remove_tree(const std::string& path);

/// mkdir -p. Throws, naming the directory, on failure.
void make_directories(const std::string& directory);

/// Names (not paths) of the entries in `directory`; empty if it does not exist.
std::vector<std::string> list_directory(const std::string& directory);

/// Removes a file; a missing file is not an error. Returns false on other failures.
bool remove_file(const std::string& path);

/// The directory part of a path ("." when there is none).
std::string parent_directory(const std::string& path);

}  // namespace detail
}  // namespace ddp
