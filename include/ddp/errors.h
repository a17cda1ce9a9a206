#pragma once

// Exceptions thrown by ddp-cpp. All derive from c10::Error (what TORCH_CHECK throws),
// so a plain `catch (const c10::Error&)` sees them too; catch a narrower type to tell
// them apart.

#include <c10/util/Exception.h>

#include <string>

namespace ddp {

/// A peer did not answer within the timeout (rendezvous, collective, or a DDP check).
/// The message names what was being waited for. The process group may still be usable
/// if the peer was merely slow, but usually a peer has died.
class TimeoutError : public c10::Error {
 public:
  explicit TimeoutError(const std::string& msg)
      : c10::Error(msg, /*backtrace=*/"") {}
};

/// The process group is broken: a collective failed part way or a peer closed its
/// connection. Its state is unknown; destroy it and create a new one.
class ProcessGroupError : public c10::Error {
 public:
  explicit ProcessGroupError(const std::string& msg)
      : c10::Error(msg, /*backtrace=*/"") {}
};

/// Ranks disagree about something that must be identical everywhere (model structure,
/// options). Every rank gets this error; the message names the first difference.
class MismatchError : public c10::Error {
 public:
  explicit MismatchError(const std::string& msg)
      : c10::Error(msg, /*backtrace=*/"") {}
};

} // namespace ddp
