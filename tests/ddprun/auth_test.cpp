// The control channel's authentication (tools/ddprun/auth.h, Note [Signed lines]):
// OpenSSL's HMAC-SHA256 against a known answer, the handshake (and the ways a stranger
// can try to pass it), the signed lines (and each way a line can be forged, altered,
// replayed or moved), and the secret file.
#include "auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::auth {
namespace {

Bytes bytes_of(const std::string& text) { return Bytes(text.begin(), text.end()); }

Bytes secret_a() { return Bytes(32, 0x5a); }
Bytes secret_b() { return Bytes(32, 0xa5); }

// Runs the handshake between an agent and a coordinator; true when both are done.
bool shake(Handshake& agent, Handshake& coordinator, std::string& error) {
  std::string agent_proof, coordinator_proof;
  if (agent.take(coordinator.hello(), agent_proof, error) != Handshake::Step::Continue)
    return false;
  if (coordinator.take(agent.hello(), coordinator_proof, error) != Handshake::Step::Continue)
    return false;
  std::string none;
  if (coordinator.take(agent_proof, none, error) != Handshake::Step::Done) return false;
  return agent.take(coordinator_proof, none, error) == Handshake::Step::Done;
}

TEST(AuthHmac, Rfc4231TestCase2) {
  // RFC 4231, 4.3: key "Jefe", data "what do ya want for nothing?".
  EXPECT_EQ(to_hex(hmac_sha256(bytes_of("Jefe"), "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(AuthHmac, HexAndComparison) {
  Bytes b;
  ASSERT_TRUE(from_hex("00ff10Ab", b));
  EXPECT_EQ(b, (Bytes{0x00, 0xff, 0x10, 0xab}));
  EXPECT_EQ(to_hex(b), "00ff10ab");
  EXPECT_FALSE(from_hex("abc", b));  // odd
  EXPECT_FALSE(from_hex("zz", b));
  EXPECT_TRUE(same_mac(Bytes{1, 2, 3}, Bytes{1, 2, 3}));
  EXPECT_FALSE(same_mac(Bytes{1, 2, 3}, Bytes{1, 2, 4}));
  EXPECT_FALSE(same_mac(Bytes{1, 2, 3}, Bytes{1, 2}));
  EXPECT_FALSE(same_mac(Bytes{}, Bytes{}));
  EXPECT_EQ(random_bytes(32).size(), 32u);
  EXPECT_NE(random_bytes(32), random_bytes(32));
}

TEST(AuthHandshake, BothEndsProveTheSecretAndSignLines) {
  Handshake agent(secret_a(), Role::Agent), coordinator(secret_a(), Role::Coordinator);
  EXPECT_EQ(agent.hello().rfind("auth-hello ", 0), 0u);
  EXPECT_NE(agent.nonce(), coordinator.nonce());
  std::string error;
  ASSERT_TRUE(shake(agent, coordinator, error)) << error;
  Channel a = agent.channel(), c = coordinator.channel();
  std::string line;
  for (const std::string text : {"hello -1 3 1 job", "", "ping", "fail 0 3 rank 2 exited 3"}) {
    ASSERT_TRUE(c.open(a.seal(text), line, error)) << error;
    EXPECT_EQ(line, text);
    ASSERT_TRUE(a.open(c.seal(text), line, error)) << error;
    EXPECT_EQ(line, text);
  }
  EXPECT_EQ(a.sent(), 4u);
  EXPECT_EQ(c.received(), 4u);
}

TEST(AuthHandshake, SignedLineFormat) {
  Channel a(Bytes(32, 1), Role::Agent);
  const std::string first = a.seal("ping"), second = a.seal("ping");
  EXPECT_EQ(first.substr(0, 2), "0 ");
  EXPECT_EQ(second.substr(0, 2), "1 ");
  EXPECT_EQ(first.size(), 2 + 64 + 1 + 4u);
  EXPECT_EQ(first.substr(2 + 64), " ping");
  EXPECT_NE(first.substr(2, 64), second.substr(2, 64));  // the sequence number is signed
}

class AuthLines : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    ASSERT_TRUE(shake(agent_, coordinator_, error)) << error;
    a_.emplace(agent_.channel());
    c_.emplace(coordinator_.channel());
  }
  // Whether the coordinator takes `wire`; `error_` says why not.
  bool takes(const std::string& wire) {
    error_.clear();
    return c_->open(wire, line_, error_);
  }

  Handshake agent_{secret_a(), Role::Agent}, coordinator_{secret_a(), Role::Coordinator};
  std::optional<Channel> a_, c_;
  std::string line_, error_;
};

TEST_F(AuthLines, TamperedByteIsRefused) {
  std::string wire = a_->seal("finished 0");
  wire.back() = '1';  // "finished 1"
  EXPECT_FALSE(takes(wire));
  EXPECT_NE(error_.find("MAC does not match"), std::string::npos) << error_;
  std::string mac_changed = a_->seal("finished 0");
  mac_changed[5] = mac_changed[5] == 'a' ? 'b' : 'a';
  EXPECT_FALSE(takes(mac_changed));
}

TEST_F(AuthLines, WrongSequenceNumberIsRefused) {
  // A valid MAC for line 0, sent as line 1: the sequence number is part of what is signed.
  const std::string wire = a_->seal("ping");
  EXPECT_FALSE(takes("1" + wire.substr(1)));
  EXPECT_NE(error_.find("sequence number was changed"), std::string::npos) << error_;
  EXPECT_NE(error_.find("sequence number 1 where 0 is next"), std::string::npos) << error_;
  // A line that skips one (line 1 while 0 is next, e.g. line 0 dropped) is refused too.
  EXPECT_FALSE(takes(a_->seal("ping")));
  EXPECT_NE(error_.find("replayed or reordered"), std::string::npos) << error_;
}

TEST_F(AuthLines, ReplayedLineIsRefused) {
  const std::string wire = a_->seal("finished 0");
  ASSERT_TRUE(takes(wire)) << error_;
  EXPECT_FALSE(takes(wire));
  EXPECT_NE(error_.find("replayed or reordered line (sequence number 0 where 1 is next)"),
            std::string::npos)
      << error_;
}

TEST_F(AuthLines, ReflectedLineIsRefused) {
  // The coordinator's own line sent back to it: signed for the other direction.
  const std::string wire = c_->seal("done");
  EXPECT_FALSE(takes(wire));
  EXPECT_NE(error_.find("MAC does not match"), std::string::npos) << error_;
}

TEST_F(AuthLines, LineOfAnotherConnectionIsRefused) {
  // The same secret, but another handshake: another session key.
  Handshake agent2(secret_a(), Role::Agent), coordinator2(secret_a(), Role::Coordinator);
  std::string error;
  ASSERT_TRUE(shake(agent2, coordinator2, error)) << error;
  EXPECT_FALSE(takes(agent2.channel().seal("ping")));
  EXPECT_NE(error_.find("MAC does not match"), std::string::npos) << error_;
}

TEST_F(AuthLines, UnsignedLineIsRefused) {
  const std::vector<std::string> lines = {
      "ping",   "hello -1 3 1 job", "",
      "0 ping", "0 zz ping",        "00000000000000000000000 " + std::string(64, 'a') + " ping"};
  for (const std::string& wire : lines) {
    EXPECT_FALSE(takes(wire)) << wire;
    EXPECT_NE(error_.find("not a signed line"), std::string::npos) << error_;
  }
}

TEST(AuthHandshake, WrongKeyFailsBothWays) {
  Handshake agent(secret_a(), Role::Agent), coordinator(secret_b(), Role::Coordinator);
  std::string agent_proof, coordinator_proof, error, none;
  ASSERT_EQ(agent.take(coordinator.hello(), agent_proof, error), Handshake::Step::Continue);
  ASSERT_EQ(coordinator.take(agent.hello(), coordinator_proof, error), Handshake::Step::Continue);
  EXPECT_EQ(coordinator.take(agent_proof, none, error), Handshake::Step::Failed);
  EXPECT_NE(error.find("does not match"), std::string::npos) << error;
  EXPECT_EQ(agent.take(coordinator_proof, none, error), Handshake::Step::Failed);
  EXPECT_FALSE(agent.done());
  // Once failed, it stays so.
  EXPECT_EQ(agent.take(coordinator_proof, none, error), Handshake::Step::Failed);
}

TEST(AuthHandshake, ReflectedHandshakeFails) {
  // A stranger without the secret sends the coordinator its own nonce back ...
  Handshake coordinator(secret_a(), Role::Coordinator);
  std::string reply, error;
  EXPECT_EQ(coordinator.take(coordinator.hello(), reply, error), Handshake::Step::Failed);
  EXPECT_NE(error.find("own nonce"), std::string::npos) << error;
  // ... or a nonce of its own, and then the coordinator's proof as its proof.
  Handshake coordinator2(secret_a(), Role::Coordinator);
  const std::string stranger_hello = "auth-hello " + to_hex(random_bytes(kNonceBytes));
  ASSERT_EQ(coordinator2.take(stranger_hello, reply, error), Handshake::Step::Continue);
  ASSERT_EQ(reply.rfind("auth-proof ", 0), 0u);
  std::string none;
  EXPECT_EQ(coordinator2.take(reply, none, error), Handshake::Step::Failed);
  EXPECT_NE(error.find("own proof"), std::string::npos) << error;
  // The roles differ in what is signed: the coordinator's proof is not the agent's.
  const Bytes n1 = random_bytes(kNonceBytes), n2 = random_bytes(kNonceBytes);
  EXPECT_NE(handshake_proof(secret_a(), Role::Agent, n1, n2),
            handshake_proof(secret_a(), Role::Coordinator, n1, n2));
}

TEST(AuthHandshake, PlainOrMalformedPeerFails) {
  Handshake coordinator(secret_a(), Role::Coordinator);
  std::string reply, error;
  EXPECT_EQ(coordinator.take("hello -1 3 1 job", reply, error), Handshake::Step::Failed);
  EXPECT_TRUE(coordinator.peer_is_plain());
  EXPECT_NE(error.find("instead of the authentication handshake"), std::string::npos) << error;
  Handshake c2(secret_a(), Role::Coordinator);
  EXPECT_EQ(c2.take("auth-hello 1234", reply, error), Handshake::Step::Failed);
  EXPECT_FALSE(c2.peer_is_plain());
  Handshake c3(secret_a(), Role::Coordinator);
  EXPECT_EQ(c3.take("auth-proof " + std::string(64, '0'), reply, error), Handshake::Step::Failed);
  // A stranger's bytes are shown printable only.
  EXPECT_EQ(printable("a\x1b[2Jb\x7f"), "a?[2Jb?");
  EXPECT_EQ(printable(std::string(100, 'x'), 4), "xxxx...");
}

// --- The secret file ---------------------------------------------------------

class SecretFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/ddprun-auth-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string write(const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST_F(SecretFile, MadeFileLoads) {
  const std::string path = dir_ + "/job.secret";
  std::string error;
  ASSERT_TRUE(make_secret_file(path, error)) << error;
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 65);
  Bytes secret;
  ASSERT_TRUE(load_secret_file(path, secret, error)) << error;
  EXPECT_EQ(secret.size(), 32u);
  EXPECT_FALSE(make_secret_file(path, error));  // never replaced
  EXPECT_NE(error.find("already exists"), std::string::npos) << error;
  Bytes again;
  ASSERT_TRUE(load_secret_file(path, again, error));
  EXPECT_EQ(again, secret);
}

TEST_F(SecretFile, BadFilesAreRefused) {
  Bytes secret;
  std::string error;
  const std::string good = std::string(64, 'a');
  EXPECT_TRUE(load_secret_file(write("ok", "  " + good + "\n\n", 0600), secret, error)) << error;
  EXPECT_FALSE(load_secret_file(write("open", good, 0644), secret, error));
  EXPECT_NE(error.find("has mode 0644"), std::string::npos) << error;
  EXPECT_FALSE(load_secret_file(write("group", good, 0640), secret, error));
  EXPECT_FALSE(load_secret_file(write("short", std::string(62, 'a'), 0600), secret, error));
  EXPECT_NE(error.find("too short: it holds 31 byte(s)"), std::string::npos) << error;
  EXPECT_FALSE(load_secret_file(write("raw", std::string(40, '\x01'), 0600), secret, error));
  EXPECT_NE(error.find("raw bytes are not taken"), std::string::npos) << error;
  EXPECT_FALSE(load_secret_file(write("odd", std::string(65, 'a'), 0600), secret, error));
  EXPECT_FALSE(load_secret_file(dir_ + "/missing", secret, error));
  EXPECT_NE(error.find("No such file"), std::string::npos) << error;
  EXPECT_NE(error.find("ddprun --make-secret"), std::string::npos) << error;
  EXPECT_FALSE(load_secret_file(dir_, secret, error));  // a folder
}

}  // namespace
}  // namespace ddprun::auth
