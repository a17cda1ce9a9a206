// Facts about this host that ddprun needs before it spawns workers.
#pragma once

#include <string>
#include <vector>

namespace ddprun {

int online_cpu_count();    // like Python's os.cpu_count()
int affinity_cpu_count();  // cores this process may run on (sched_getaffinity)

// GPUs this host offers: CUDA_VISIBLE_DEVICES entries when it is set (capped by
// the /dev/nvidiaN device nodes when any exist), else the number of those nodes.
int gpu_count();

std::string host_name();
std::string random_hex_id(int bytes);
// argv as one line that a shell reads back into the same words.
std::string shell_quoted(int argc, char** argv);

// Binds port 0 on 127.0.0.1 and returns the port the kernel chose (0 on error).
int pick_free_port();

// Looks for `program` the way execvp does. Returns the path found, or an empty
// string with `why` and `exit_code` (126 or 127) set.
std::string find_program(const std::string& program, std::string& why, int& exit_code);

// Removes a folder and everything in it; errors are ignored.
void remove_tree(const std::string& path);

// The flight recorder files (flight_recorder.rank<r>.json) in `dir`, sorted by rank;
// whole dumps that record no collective are left out (nothing to line up).
std::vector<std::string> flight_recorder_files(const std::string& dir);

// Creates a folder and its missing parents; returns false with errno set.
bool make_dirs(const std::string& path, int mode = 0755);

double now_seconds();  // monotonic clock

}  // namespace ddprun
