// Note [Signed store records]: a job secret (DDP_SECRET_FILE) signs every value the ranks
// put in the store, Gloo's own records included, and a record that does not verify is
// refused. The stranger here is a store client without the secret.

#include "support/harness.h"

#include "distributed/backends/c10d_comm.h"
#include "distributed/comm.h"
#include "distributed/rendezvous/signed_records.h"

#include <ddp/errors.h>
#include <ddp/distributed/process_group.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace signed_store_test {

using ddp::detail::CommConfig;
using ddp::detail::RecordSigner;
using ddp_test::TempDir;

namespace {

const std::string kSecret(32, 's');

// Sets one environment variable for a scope.
class EnvVar {
 public:
  EnvVar(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~EnvVar() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A secret file as ddprun --make-secret writes one: hex digits, mode `mode`.
std::string write_secret(const TempDir& dir, const std::string& name, char fill,
                         mode_t mode = 0600) {
  const std::string path = dir.file(name);
  std::ofstream(path) << std::string(64, fill) << "\n";
  ::chmod(path.c_str(), mode);
  return path;
}

// A FileStore client of `dir`'s store: signed with `signer`, or plain (the stranger).
std::shared_ptr<ddp::detail::Store> file_store(const TempDir& dir,
                                               std::shared_ptr<const RecordSigner> signer) {
  CommConfig c;
  c.store = CommConfig::StoreKind::kFile;
  c.store_path = dir.file("store");
  c.world_size = 2;
  c.timeout = std::chrono::seconds(10);
  c.record_signer = std::move(signer);
  return ddp::detail::open_store(c);
}

// Runs fn(rank) for each rank on its own thread, started by start(rank) in the order the
// test chooses; collects each rank's error text ("" for none).
class Ranks {
 public:
  explicit Ranks(int world) : errors_(world) {}
  ~Ranks() { join(); }
  void start(int rank, const std::function<void(int)>& fn) {
    threads_.emplace_back([this, rank, fn] {
      try {
        fn(rank);
      } catch (const std::exception& e) {
        errors_[rank] = std::string("error: ") + e.what();
      }
    });
  }
  const std::vector<std::string>& join() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    return errors_;
  }

 private:
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
};

}  // namespace

TEST(SignedRecords, OnlyTheSameKeyJobAndAttemptVerify) {
  const auto signer = RecordSigner::for_attempt(kSecret, "run-a", 0);
  const std::string record = signer->seal("ddp/arrived/1", "host identity");
  ASSERT_EQ(record.size(), std::string("host identity").size() + RecordSigner::kSignatureBytes);
  EXPECT_EQ(signer->open("ddp/arrived/1", record), std::optional<std::string>("host identity"));
  EXPECT_EQ(signer->open("ddp/arrived/1", signer->seal("ddp/arrived/1", "")),
            std::optional<std::string>(""));

  // Copied to another key, changed, cut short, or unsigned: refused.
  EXPECT_FALSE(signer->open("ddp/arrived/2", record));
  std::string changed = record;
  changed[0] ^= 1;
  EXPECT_FALSE(signer->open("ddp/arrived/1", changed));
  EXPECT_FALSE(signer->open("ddp/arrived/1", record.substr(1)));
  EXPECT_FALSE(signer->open("ddp/arrived/1", "host identity"));
  EXPECT_FALSE(signer->open("ddp/arrived/1", ""));

  // Another attempt, another job, another secret: refused.
  EXPECT_FALSE(RecordSigner::for_attempt(kSecret, "run-a", 1)->open("ddp/arrived/1", record));
  EXPECT_FALSE(RecordSigner::for_attempt(kSecret, "run-b", 0)->open("ddp/arrived/1", record));
  EXPECT_FALSE(
      RecordSigner::for_attempt(std::string(32, 't'), "run-a", 0)->open("ddp/arrived/1", record));
}

TEST(SignedStore, AForgedRecordIsNotThereUntilASignedOneReplacesIt) {
  TempDir dir;
  const auto signer = RecordSigner::for_attempt(kSecret, "", 0);
  auto rank = file_store(dir, signer);
  auto stranger = file_store(dir, nullptr);

  stranger->set("ddp/arrived/1", "forged identity");
  EXPECT_FALSE(rank->try_get("ddp/arrived/1"));
  EXPECT_TRUE(rank->refused("ddp/arrived/1"));
  EXPECT_FALSE(rank->refused("ddp/arrived/0"));

  rank->set("ddp/arrived/1", "real identity");
  EXPECT_EQ(rank->try_get("ddp/arrived/1"), std::optional<std::string>("real identity"));
  // What the store holds is the value and its signature.
  const auto raw = stranger->try_get("ddp/arrived/1");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->size(), std::string("real identity").size() + RecordSigner::kSignatureBytes);
  EXPECT_EQ(raw->substr(0, 13), "real identity");

  // The stranger copies that signed record to another key: refused there.
  stranger->set("ddp/arrived/2", *raw);
  EXPECT_FALSE(rank->try_get("ddp/arrived/2"));
  // A rank of the next attempt (another key) refuses this attempt's record.
  auto next_attempt = file_store(dir, RecordSigner::for_attempt(kSecret, "", 1));
  EXPECT_FALSE(next_attempt->try_get("ddp/arrived/1"));
}

TEST(SignedStore, PrefixedStoresSignTheFullName) {
  TempDir dir;
  auto rank = file_store(dir, RecordSigner::for_attempt(kSecret, "", 0));
  auto stranger = file_store(dir, nullptr);
  auto group = rank->prefixed("group/3")->prefixed("shm");
  group->set("segment", "name");
  EXPECT_EQ(group->try_get("segment"), std::optional<std::string>("name"));
  EXPECT_EQ(rank->try_get("group/3/shm/segment"), std::optional<std::string>("name"));
  // The same bytes under the bare name do not verify: the prefix is part of what is signed.
  stranger->set("segment", *stranger->try_get("group/3/shm/segment"));
  EXPECT_FALSE(rank->try_get("segment"));
  stranger->prefixed("group/3")->prefixed("shm")->set("segment", "forged");
  EXPECT_FALSE(group->try_get("segment"));
  EXPECT_TRUE(group->refused("segment"));
}

TEST(SignedStore, ASecretFileOthersCanReadIsRefusedAtInit) {
  TempDir dir;
  EnvVar secret("DDP_SECRET_FILE", write_secret(dir, "secret", 'a', 0644));
  const std::string msg = ddp_test::error_of(
      [&] { ddp::ProcessGroup::create(ddp_test::file_init(dir, 1, 2, std::chrono::seconds(5))); });
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(DDP_SECRET_FILE) has mode 0644"), std::string::npos) << msg;
  EXPECT_NE(msg.find("chmod 600"), std::string::npos) << msg;
}

// A job with a secret: the rendezvous, Gloo's records and the collectives work, and
// forged records that a stranger wrote before the ranks' own cost nothing.
TEST(SignedStore, AJobWithASecretIgnoresRecordsForgedBeforeTheRealOnes) {
  TempDir dir;
  EnvVar secret("DDP_SECRET_FILE", write_secret(dir, "secret", 'a'));
  auto stranger = file_store(dir, nullptr);
  for (int r = 0; r < 3; ++r) stranger->set("ddp/arrived/" + std::to_string(r), "forged");
  Ranks ranks(3);
  for (int r = 0; r < 3; ++r) {
    ranks.start(r, [&dir](int rank) {
      auto pg = ddp::ProcessGroup::create(ddp_test::file_init(dir, rank, 3));
      auto t = at::full({5}, static_cast<float>(rank + 1));
      pg->all_reduce(t);
      if (!at::equal(t, at::full({5}, 6.0f))) throw std::runtime_error("wrong sum");
      auto objects = pg->all_gather_bytes("rank" + std::to_string(rank));
      if (objects != std::vector<std::string>{"rank0", "rank1", "rank2"})
        throw std::runtime_error("wrong all_gather_bytes");
    });
  }
  const auto& errors = ranks.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// A record forged after the real one replaces it: the ranks that read it wait for a
// signed one, and their timeout says which record was refused and why.
TEST(SignedStore, ARecordForgedAfterTheRealOneEndsInAClearTimeout) {
  TempDir dir;
  EnvVar secret("DDP_SECRET_FILE", write_secret(dir, "secret", 'a'));
  auto stranger = file_store(dir, nullptr);
  const auto timeout = std::chrono::seconds(3);
  const auto job = [&](int rank) {
    auto pg = ddp::ProcessGroup::create(ddp_test::file_init(dir, rank, 3, timeout));
    auto t = at::ones({2});
    pg->all_reduce(t);
  };
  Ranks ranks(3);
  const auto start = std::chrono::steady_clock::now();
  ranks.start(2, job);
  ASSERT_TRUE(ddp_test::wait_for([&] { return bool(stranger->try_get("ddp/arrived/2")); },
                                 std::chrono::seconds(20)));
  stranger->set("ddp/arrived/2", "forged after the real one");
  ranks.start(0, job);
  ranks.start(1, job);
  const auto& errors = ranks.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("rank(s) 2 never arrived"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("The record(s) of rank(s) 2 were there but refused"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("DDP_SECRET_FILE"), std::string::npos) << errors[r];
  }
  EXPECT_NE(errors[2], "") << "rank 2 cannot finish without ranks 0 and 1";
}

// The stranger of tests/ddprun/test_security.py (HostileHostTest), on a host of its own:
// a client of the job's TCPStore at MASTER_ADDR:MASTER_PORT without the secret, it writes
// a forged host identity for each rank in DDP_TEST_FORGE_RANKS (e.g. "2") and prints
// "forged N". The job must refuse them and finish with the ranks' own records.
DDP_SCENARIO(store_stranger) {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  const char* ranks = std::getenv("DDP_TEST_FORGE_RANKS");
  if (addr == nullptr || port == nullptr || ranks == nullptr) return 2;
  CommConfig c;
  c.store = CommConfig::StoreKind::kTcp;
  c.master_addr = addr;
  c.master_port = std::atoi(port);
  c.rank = 1;  // a client
  c.world_size = 4;
  c.timeout = std::chrono::seconds(60);
  auto store = ddp::detail::open_store(c);
  int forged = 0;
  for (const char* r = ranks; *r != '\0'; ++r) {
    if (*r < '0' || *r > '9') continue;
    store->set(std::string("ddp/arrived/") + *r, "forged by a stranger");
    ++forged;
  }
  std::printf("forged %d\n", forged);
  return 0;
}

}  // namespace signed_store_test
