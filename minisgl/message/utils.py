"""Turning messages into plain data that msgpack can carry, and back.

A message is a dataclass whose fields hold numbers, strings, bytes, lists, dicts, other
dataclasses (`SamplingParams`) and CPU tensors (a prompt's token ids). `serialize_type` maps it
to nested dicts, lists and scalars, writing each object's class name under "__type__" and each
tensor's raw bytes with its dtype and shape. `deserialize_type` rebuilds it, looking the class
names up in a map that the receiving side provides: only the classes in that map can be made,
so a malformed or hostile message cannot construct anything else.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any, Dict, Type

import torch

TYPE_KEY = "__type__"
TENSOR_TYPE = "Tensor"
_PLAIN = (int, float, str, bytes, bool, type(None))


def _serialize_any(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return [_serialize_any(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _serialize_any(v) for k, v in value.items()}
    return serialize_type(value)


def serialize_type(obj: Any) -> Dict[str, Any]:
    """A dataclass instance (or a CPU tensor) as a dict of plain values."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise TypeError(f"only CPU tensors travel in messages, not {obj.device} ones")
        data = obj.contiguous()
        return {
            TYPE_KEY: TENSOR_TYPE,
            "dtype": str(data.dtype).removeprefix("torch."),
            "shape": list(data.shape),
            "buffer": data.view(-1).view(torch.uint8).numpy().tobytes(),
        }
    if not is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"cannot serialise a {type(obj).__name__}: not a dataclass or tensor")
    out: Dict[str, Any] = {TYPE_KEY: type(obj).__name__}
    for f in fields(obj):
        out[f.name] = _serialize_any(getattr(obj, f.name))
    return out


def _deserialize_any(cls_map: Dict[str, Type], data: Any) -> Any:
    if isinstance(data, _PLAIN):
        return data
    if isinstance(data, list):
        return [_deserialize_any(cls_map, v) for v in data]
    if isinstance(data, dict):
        if TYPE_KEY in data:
            return deserialize_type(cls_map, data)
        return {k: _deserialize_any(cls_map, v) for k, v in data.items()}
    raise ValueError(f"cannot deserialise a {type(data).__name__}")


def _make_tensor(data: Dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, data["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {data['dtype']!r}")
    buffer = bytearray(data["buffer"])  # a private, writable copy for the tensor to own
    if not buffer:
        return torch.empty(data["shape"], dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype).view(data["shape"])


def deserialize_type(cls_map: Dict[str, Type], data: Dict[str, Any]) -> Any:
    """Rebuild what `serialize_type` made; class names are looked up in `cls_map`."""
    type_name = data.get(TYPE_KEY)
    if type_name == TENSOR_TYPE:
        return _make_tensor(data)
    cls = cls_map.get(type_name) if isinstance(type_name, str) else None
    if cls is None or not is_dataclass(cls):
        raise ValueError(f"unknown message type {type_name!r}")
    kwargs = {k: _deserialize_any(cls_map, v) for k, v in data.items() if k != TYPE_KEY}
    try:
        return cls(**kwargs)
    except TypeError as e:  # missing or unexpected fields
        raise ValueError(f"malformed {type_name}: {e}") from None
