"""ringzero's exceptions. They are defined by the native module so that C++ errors arrive as them."""
from .._C import CollectiveMismatch, CommError, CommTimeout

__all__ = ["CommError", "CommTimeout", "CollectiveMismatch"]
