from .impl import DistributedCommunicator, destroy_distributed
from .info import (
    DistributedInfo,
    get_tp_info,
    reset_tp_info,
    set_tp_info,
    tp_info_or_one,
    try_get_tp_info,
)

__all__ = [
    "DistributedInfo",
    "get_tp_info",
    "set_tp_info",
    "try_get_tp_info",
    "tp_info_or_one",
    "reset_tp_info",
    "DistributedCommunicator",
    "destroy_distributed",
]
