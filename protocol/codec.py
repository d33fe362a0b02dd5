"""The one codec: a message is msgpack [tag, [field, ...]]; nested messages are positional lists too.

No pickle anywhere. Decoding is driven by the dataclasses' type hints, so a peer can only ever
produce the types listed in MESSAGE_TYPES, and every size is bounded.
"""
import dataclasses
import types
import typing

import msgpack

from tinyvllm.protocol import messages as m
from tinyvllm.protocol.sampling import SamplingParams

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# The tag is the wire identity of a type: append new types, never renumber.
MESSAGE_TYPES: tuple[type, ...] = (
    m.AddRequest, m.AbortRequests, m.StepOutputs, m.EngineReady, m.Shutdown,
    m.WorkerHello, m.InitWorker, m.WorkerReady, m.StepPlan, m.StepResult, m.WorkerError,
    m.SchedulerChallenge, m.WorkerProof, m.WorkerRefused,
)
_TAG_OF = {cls: tag for tag, cls in enumerate(MESSAGE_TYPES)}


class CodecError(ValueError):
    pass


def _to_wire(value):
    if dataclasses.is_dataclass(value):
        return [_to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)]
    if isinstance(value, (list, tuple)):
        return [_to_wire(v) for v in value]
    return value


def encode(msg) -> bytes:
    tag = _TAG_OF.get(type(msg))
    if tag is None:
        raise CodecError(f"not a protocol message: {type(msg).__name__}")
    return msgpack.packb([tag, _to_wire(msg)], use_bin_type=True)


def _from_wire(tp, value):
    """Rebuilds `value` as type `tp`, checking the shape as it goes."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _from_wire(inner[0], value)
    if origin is list:
        if not isinstance(value, list):
            raise CodecError(f"expected a list, got {type(value).__name__}")
        (item_tp,) = typing.get_args(tp)
        return [_from_wire(item_tp, v) for v in value]
    if dataclasses.is_dataclass(tp):
        fields = _fields_of(tp)
        if not isinstance(value, list) or len(value) != len(fields):
            raise CodecError(f"{tp.__name__}: expected {len(fields)} fields")
        return tp(*[_from_wire(ftp, v) for (_, ftp), v in zip(fields, value)])
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise CodecError(f"expected {tp.__name__}, got {type(value).__name__}")
    return value


_FIELDS_CACHE: dict[type, list[tuple[str, type]]] = {}


def _fields_of(cls) -> list[tuple[str, type]]:
    if cls not in _FIELDS_CACHE:
        hints = typing.get_type_hints(cls)
        _FIELDS_CACHE[cls] = [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]
    return _FIELDS_CACHE[cls]


def decode(data: bytes):
    if len(data) > MAX_MESSAGE_BYTES:
        raise CodecError("message too large")
    try:
        tag, payload = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise CodecError(f"undecodable message: {e}") from None
    if not isinstance(tag, int) or not 0 <= tag < len(MESSAGE_TYPES):
        raise CodecError(f"unknown message tag {tag!r}")
    return _from_wire(MESSAGE_TYPES[tag], payload)


__all__ = ["encode", "decode", "CodecError", "MESSAGE_TYPES", "MAX_MESSAGE_BYTES", "SamplingParams"]
