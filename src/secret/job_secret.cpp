#include "secret/job_secret.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace ddp::secret {

Bytes hmac_sha256(const Bytes& key, const std::string& data) {
  Bytes out(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &len))
    throw std::runtime_error("OpenSSL's HMAC-SHA256 failed");
  out.resize(len);
  return out;
}

bool same_mac(const Bytes& a, const Bytes& b) {
  return a.size() == b.size() && !a.empty() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Bytes random_bytes(size_t n) {
  Bytes out(n);
  if (n > 0 && RAND_bytes(out.data(), static_cast<int>(n)) != 1)
    throw std::runtime_error("OpenSSL's RAND_bytes could not produce random bytes");
  return out;
}

std::string to_hex(const Bytes& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * bytes.size());
  for (unsigned char b : bytes) {
    text += digits[b >> 4];
    text += digits[b & 15];
  }
  return text;
}

bool from_hex(const std::string& text, Bytes& out) {
  const auto value = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (text.size() % 2 != 0) return false;
  Bytes bytes(text.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int hi = value(text[2 * i]), lo = value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    bytes[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  out = std::move(bytes);
  return true;
}

std::string printable(const std::string& text, size_t max) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?';
  }
  if (text.size() > max) out += "...";
  return out;
}

// --- The secret file --------------------------------------------------------

namespace {

const char kMakeHint[] =
    "Make one with 'ddprun --make-secret FILE' (or '(umask 077; openssl rand -hex 32 > FILE)'), "
    "copy it to every host of the job out of band (e.g. scp), keep it mode 0600, and give every "
    "host --rdzv-secret-file FILE (docs/security.md).";

std::string octal_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

}  // namespace

bool load_secret_file(const std::string& path, Bytes& secret, std::string& error,
                      const std::string& source) {
  const std::string what = "the secret file '" + path + "' (" + source + ")";
  error.clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    error = what + " cannot be read: " + std::strerror(errno) + ". " + kMakeHint;
    return false;
  }
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) != 0) {
    error = what + ": " + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    error = what + " is not a regular file. " + kMakeHint;
  } else if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    error = what + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
            std::to_string(::geteuid()) +
            "), who could then read or change it. Expected a file of this user with mode 0600: "
            "copy it, then 'chmod 600 FILE'.";
  } else if ((st.st_mode & 077) != 0) {
    error = what + " has mode " + octal_mode(st.st_mode) +
            ": other users may read or change it, and whoever reads it can join this job or "
            "give it orders. Expected mode 0600 (only its owner): run 'chmod 600 " +
            path + "', and make a new secret if others may have read this one.";
  } else {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) != 0) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error = what + " cannot be read: " + std::strerror(errno);
        break;
      }
      text.append(buf, static_cast<size_t>(n));
      if (text.size() > 4 * kMaxSecretBytes) break;
    }
  }
  ::close(fd);
  if (!error.empty()) return false;
  const size_t first = text.find_first_not_of(" \t\r\n");
  const size_t last = text.find_last_not_of(" \t\r\n");
  const std::string hex = first == std::string::npos ? "" : text.substr(first, last - first + 1);
  Bytes bytes;
  if (hex.size() > 2 * kMaxSecretBytes) {
    error = what + " is too long: expected " + std::to_string(2 * kMinSecretBytes) + " to " +
            std::to_string(2 * kMaxSecretBytes) + " hex digits. " + kMakeHint;
    return false;
  }
  if (!from_hex(hex, bytes)) {
    size_t bad = 0;
    while (bad < hex.size() && std::isxdigit(static_cast<unsigned char>(hex[bad]))) ++bad;
    error = what + " must hold the secret as hex digits (at least " +
            std::to_string(2 * kMinSecretBytes) + ", for " + std::to_string(kMinSecretBytes) +
            " bytes), but " +
            (bad < hex.size()
                 ? "it has '" + printable(hex.substr(bad, 1)) + "' at offset " +
                       std::to_string(first + bad) +
                       " (raw bytes are not taken: write them as hex, e.g. "
                       "'xxd -p -c 256')"
                 : "it has an odd number of hex digits (" + std::to_string(hex.size()) + ")") +
            ". " + kMakeHint;
    return false;
  }
  if (bytes.size() < kMinSecretBytes) {
    error = what + " is too short: it holds " + std::to_string(bytes.size()) + " byte(s) (" +
            std::to_string(hex.size()) + " hex digits), and a secret needs at least " +
            std::to_string(kMinSecretBytes) + " random bytes (" +
            std::to_string(2 * kMinSecretBytes) + " hex digits). " + kMakeHint;
    return false;
  }
  secret = std::move(bytes);
  return true;
}

bool make_secret_file(const std::string& path, std::string& error) {
  struct stat st {};
  const std::string exists = "'" + path +
                             "' already exists, and ddprun --make-secret never replaces a "
                             "secret (hosts that hold the old one could no longer join). Remove "
                             "it first, or give another name.";
  if (path.empty() || path.back() == '/') {
    error = "--make-secret expects a file name; got '" + path + "'";
    return false;
  }
  if (::lstat(path.c_str(), &st) == 0) {
    error = exists;
    return false;
  }
  Bytes secret;
  try {
    secret = random_bytes(kMinSecretBytes);
  } catch (const std::exception& e) {
    error = e.what();
    return false;
  }
  const std::string text = to_hex(secret) + "\n";
  // Written in full to a private temporary file beside it, then linked to its name:
  // link() never replaces a file, so it fails (EEXIST) if one appeared meanwhile.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  std::string tmp = dir + "/.ddprun-secret-XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    error = "cannot write a new secret in '" + dir + "': " + std::strerror(errno);
    return false;
  }
  bool ok = ::fchmod(fd, 0600) == 0 &&
            ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd) == 0;
  if (!ok) error = "cannot write '" + tmp + "': " + std::strerror(errno);
  ::close(fd);
  if (ok && ::link(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    if (errno == EEXIST) {
      error = exists;
    } else if (errno == EPERM || errno == ENOTSUP || errno == EOPNOTSUPP) {
      // A file system without hard links: O_EXCL still never replaces a file.
      const int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      ok = out >= 0 &&
           ::write(out, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
           ::fsync(out) == 0;
      if (!ok)
        error = errno == EEXIST ? exists : "cannot write '" + path + "': " + std::strerror(errno);
      if (out >= 0) ::close(out);
      if (!ok && out >= 0) ::unlink(path.c_str());
    } else {
      error = "cannot create '" + path + "': " + std::strerror(errno);
    }
  }
  ::unlink(tmp.c_str());
  return ok;
}

}  // namespace ddp::secret
