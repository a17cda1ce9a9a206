#pragma once

// Exceptions that tell a peer problem apart from a caller mistake. Caller mistakes
// (bad options, bad environment, misuse) are c10::Error, as TORCH_CHECK throws. These
// four derive from std::runtime_error, whose constructor is the same in every
// LibTorch version (c10::Error's changed in 2.x); catch std::exception to get both.

#include <stdexcept>
#include <string>

namespace ddp {

/// A peer did not answer within the timeout (rendezvous, collective, or a DDP check).
/// The message names what was being waited for. The process group may still be usable
/// if the peer was merely slow, but usually a peer has died.
class TimeoutError : public std::runtime_error {
 public:
  explicit TimeoutError(const std::string& msg) : std::runtime_error(msg) {}
};

/// The process group is broken: a collective failed part way or a peer closed its
/// connection. Its state is unknown; destroy it and create a new one.
class ProcessGroupError : public std::runtime_error {
 public:
  explicit ProcessGroupError(const std::string& msg) : std::runtime_error(msg) {}
};

/// Ranks disagree about something that must be identical everywhere (model structure,
/// options). Every rank gets this error; the message names the first difference.
class MismatchError : public std::runtime_error {
 public:
  explicit MismatchError(const std::string& msg) : std::runtime_error(msg) {}
};

/// ddp::join with throw_on_early_termination: a rank ran out of inputs, so every rank
/// stops. The message names the ranks that ran out.
class EarlyTerminationError : public std::runtime_error {
 public:
  explicit EarlyTerminationError(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace ddp
