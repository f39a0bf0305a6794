// Error types of the core. Layer 4 maps them to ringzero.CommTimeout, ringzero.CollectiveMismatch and
// ValueError; messages already name the rank, the op and its sequence number.
#pragma once
#include <stdexcept>
#include <string>

namespace ringzero {

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A wait ran out, or a peer died or aborted while we waited for it.
struct CommTimeoutError : CommError {
  using CommError::CommError;
};
// Ranks called different collectives (op, dtype, count or root differ) at the same sequence number.
struct CollectiveMismatchError : CommError {
  using CommError::CommError;
};
// Bad arguments that reached the core (Python validates first; this is the hard check).
struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

}  // namespace ringzero
