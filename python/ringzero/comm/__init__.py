"""Layer 5: the HostGroup and Communicator per ProcessGroup, the configuration and the public collectives."""
from .api import (all_gather_into_tensor, all_gather_single, all_gather_v, all_reduce, all_to_all, all_to_all_single,
                  barrier, broadcast, gather, reduce, reduce_scatter_single, reduce_scatter_tensor, scatter)
from .communicator import Communicator, comm_seconds, destroy_communicators, get_communicator
from .config import Config, from_env
from .host_group import HostGroup
from .topology import Topology, host_id
from .errors import CollectiveMismatch, CommError, CommTimeout
from .types import ReduceOp
from .work import Work
from .registered import empty, flat_zeros, is_registered
from .group_info import GroupInfo, group_info
from .quantized import all_gather_dequantize
from .backend import backend_stats, register as register_backend
from .patch import is_patched, patch, unpatch
