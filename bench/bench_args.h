#pragma once

// Command lines of the small benchmark programs (bench_allreduce, bench_diagnostics,
// bench_zero): positional numbers, --help, and errors that say what was expected, what
// was seen and how to call the program. Under a launcher every rank parses the same
// arguments; rank 0 alone prints, so that each message appears once, and every rank exits
// with the same code.

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace bench {

inline bool speaks() {
  const char* rank = std::getenv("RANK");
  return rank == nullptr || std::string(rank) == "0";
}

/// Prints `what` (a description, then the usage) and exits 0 when an argument is -h or
/// --help.
inline void handle_help(int argc, char** argv, const std::string& what, const std::string& usage) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      if (speaks()) std::printf("%s\n%s", what.c_str(), usage.c_str());
      std::exit(0);
    }
  }
}

/// Exits 2 after "<program>: <problem>" and the usage.
[[noreturn]] inline void usage_error(const std::string& program, const std::string& problem,
                                     const std::string& usage) {
  if (speaks()) std::fprintf(stderr, "%s: %s\n%s", program.c_str(), problem.c_str(), usage.c_str());
  std::exit(2);
}

/// A positive whole number (a multiple of `multiple_of`), or usage_error naming `name`.
inline int64_t positive_arg(const std::string& program, const std::string& name,
                            const std::string& text, const std::string& usage,
                            int64_t multiple_of = 1) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v <= 0 || v % multiple_of != 0) {
    usage_error(program,
                name + " must be a positive whole number" +
                    (multiple_of > 1 ? " divisible by " + std::to_string(multiple_of) : "") +
                    ", got '" + text + "'",
                usage);
  }
  return v;
}

/// Refuses more than `max` positional arguments.
inline void at_most(const std::string& program, int argc, int max, const std::string& usage) {
  if (argc - 1 > max) {
    usage_error(program,
                "at most " + std::to_string(max) + " arguments, got " + std::to_string(argc - 1),
                usage);
  }
}

}  // namespace bench
