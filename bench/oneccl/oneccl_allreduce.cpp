// oneCCL CPU all-reduce micro-benchmark, in the same form as bench_allreduce: for each
// message size, the median time of a float32 SUM all-reduce, its algorithm bandwidth
// (bytes / time) and bus bandwidth (algbw * 2(n-1)/n), plus the median time of a plain
// memcpy of the same size in the same process for reference.
//
// Standalone (no LibTorch). Every rank is started by hand:
//   RANK=r WORLD_SIZE=n oneccl_allreduce KVS_FILE [MIN_BYTES [MAX_BYTES [REPEATS]]]
// Rank 0 creates the main key-value store and writes its address to KVS_FILE; the
// other ranks wait for that file and attach to it.
//
// With LOOP_FOREVER=1 the program instead all-reduces MAX_BYTES in an endless loop and
// prints one line per second (used to see what a survivor does when its peer dies).

#include <oneapi/ccl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string human(long long bytes) {
  char buf[32];
  if (bytes >= (1 << 20)) {
    std::snprintf(buf, sizeof(buf), "%lld MB", bytes >> 20);
  } else {
    std::snprintf(buf, sizeof(buf), "%lld KB", bytes >> 10);
  }
  return buf;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// Rank 0 publishes the KVS address (written to a temporary name, then renamed, so a
// reader never sees half of it); the others poll for the file for up to 60 s.
ccl::shared_ptr_class<ccl::kvs> make_kvs(int rank, const std::string& path) {
  if (rank == 0) {
    auto kvs = ccl::create_main_kvs();
    const ccl::kvs::address_type addr = kvs->get_address();
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(addr.data(), static_cast<std::streamsize>(addr.size()));
    }
    std::rename(tmp.c_str(), path.c_str());
    return kvs;
  }
  ccl::kvs::address_type addr{};
  const auto start = clock_type::now();
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(addr.data(), static_cast<std::streamsize>(addr.size()))) break;
    if (seconds_since(start) > 60) {
      std::fprintf(stderr, "rank %d: no KVS address in %s after 60 s\n", rank, path.c_str());
      std::exit(2);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ccl::create_kvs(addr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: RANK=r WORLD_SIZE=n %s KVS_FILE [MIN [MAX [REPEATS]]]\n", argv[0]);
    return 1;
  }
  const std::string kvs_file = argv[1];
  long long min_bytes = 4LL << 20, max_bytes = 64LL << 20;
  if (argc > 2) min_bytes = std::atoll(argv[2]);
  if (argc > 3) max_bytes = std::atoll(argv[3]);
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 20;
  // RANK/WORLD_SIZE, or PMI_RANK/PMI_SIZE under Intel MPI's mpiexec (MPI transport).
  const int rank = env_int("RANK", env_int("PMI_RANK", 0));
  const int size = env_int("WORLD_SIZE", env_int("PMI_SIZE", 2));

  ccl::init();
  auto kvs = make_kvs(rank, kvs_file);
  auto comm = ccl::create_communicator(size, rank, kvs);
  const bool leader = rank == 0;

  if (env_int("LOOP_FOREVER", 0)) {
    const size_t count = static_cast<size_t>(max_bytes) / sizeof(float);
    std::vector<float> buf(count, 1.0f);
    // STALL_SECONDS: rank 1 sleeps that long before its first all-reduce (a slow but live
    // peer), to see whether a timeout also fires on a peer that is merely late.
    if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(env_int("STALL_SECONDS", 0)));
    auto last = clock_type::now();
    long long done = 0;
    try {
      for (;;) {
        last = clock_type::now();
        ccl::allreduce(buf.data(), buf.data(), count, ccl::reduction::sum, comm).wait();
        ++done;
        if (done % 100 == 1) {
          std::printf("rank %d: %lld all-reduces\n", rank, done);
          std::fflush(stdout);
        }
      }
    } catch (const std::exception& e) {
      std::printf("rank %d: exception after %lld all-reduces, %.1f s into the last: %s\n", rank,
                  done, seconds_since(last), e.what());
      std::fflush(stdout);
      return 4;
    }
  }

  if (leader) {
    std::printf("# all_reduce (SUM, float32), oneCCL %s, %d ranks; median of %d repeats\n",
                ccl::get_library_version().full, size, repeats);
    std::printf("| size | time (us) | algbw (GB/s) | busbw (GB/s) | memcpy (GB/s) |\n");
    std::printf("|---:|---:|---:|---:|---:|\n");
  }
  for (long long bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const size_t count = static_cast<size_t>(bytes) / sizeof(float);
    std::vector<float> send(count, 1.0f), recv(count, 0.0f);
    for (int i = 0; i < 3; ++i) {
      ccl::allreduce(send.data(), recv.data(), count, ccl::reduction::sum, comm).wait();
    }
    if (recv[0] != static_cast<float>(size) || recv[count - 1] != static_cast<float>(size)) {
      std::fprintf(stderr, "rank %d: wrong sum %g\n", rank, recv[0]);
      return 3;
    }
    std::vector<double> times;
    for (int i = 0; i < repeats; ++i) {
      ccl::barrier(comm).wait();
      const auto start = clock_type::now();
      ccl::allreduce(send.data(), recv.data(), count, ccl::reduction::sum, comm).wait();
      times.push_back(seconds_since(start));
    }
    // Every rank copies at the same time (after a barrier), the way both ranks move
    // memory during an all-reduce.
    std::vector<double> copies;
    for (int i = 0; i < repeats; ++i) {
      if (i == 0) ccl::barrier(comm).wait();
      const auto start = clock_type::now();
      std::memcpy(recv.data(), send.data(), static_cast<size_t>(bytes));
      copies.push_back(seconds_since(start));
    }
    // The slowest rank's medians: a collective ends when the last rank is done.
    double local[2] = {median(times), median(copies)};
    double slowest[2] = {0, 0};
    ccl::allreduce(local, slowest, 2, ccl::datatype::float64, ccl::reduction::max, comm).wait();
    const double algbw = static_cast<double>(bytes) / slowest[0] / 1e9;
    const double busbw = algbw * 2.0 * (size - 1) / size;
    const double copybw = static_cast<double>(bytes) / slowest[1] / 1e9;
    if (leader) {
      std::printf("| %s | %.1f | %.3f | %.3f | %.3f |\n", human(bytes).c_str(), slowest[0] * 1e6,
                  algbw, busbw, copybw);
      std::fflush(stdout);
    }
  }
  ccl::barrier(comm).wait();
  return 0;
}
