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

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # what every socket accepts: ZMQ drops a peer that sends more (MAXMSGSIZE)
# What this process sends at most (protocol/transport.py): the engine's processes set it from their configuration
# (max_message_bytes, which tests lower to make messages split without sending 64 MiB).
MAX_SEND_BYTES = MAX_MESSAGE_BYTES


def set_send_bound(max_bytes: int) -> None:
    """Lowers what this process sends, never raises it past MAX_MESSAGE_BYTES: whatever a peer's setting, it accepts
    what we send."""
    global MAX_SEND_BYTES
    MAX_SEND_BYTES = max(1, min(MAX_MESSAGE_BYTES, max_bytes))

# The tag is the wire identity of a type: append new types, never renumber.
MESSAGE_TYPES: tuple[type, ...] = (
    m.AddRequest, m.AbortRequests, m.StepOutputs, m.EngineReady, m.Shutdown,
    m.WorkerHello, m.InitWorker, m.WorkerReady, m.StepPlan, m.StepResult, m.WorkerError,
    m.SchedulerChallenge, m.WorkerProof, m.WorkerRefused,
    m.KVReleased, m.KVPull, m.KVBlockData, m.KVRelease,
)
_TAG_OF = {cls: tag for tag, cls in enumerate(MESSAGE_TYPES)}


class CodecError(ValueError):
    pass


class MessageTooLarge(ValueError):
    """A message that encodes to more than MAX_SEND_BYTES: sent, its peer would drop it and never answer."""

    def __init__(self, type_name: str, size: int, limit: int, detail: str = ""):
        super().__init__(f"{type_name} of {size} bytes is over the {limit}-byte message bound{detail}")
        self.type_name, self.size, self.limit = type_name, size, limit


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


def encode_to_send(msg) -> bytes:
    """encode(msg), or MessageTooLarge when it is over MAX_SEND_BYTES."""
    data = encode(msg)
    if len(data) > MAX_SEND_BYTES:
        raise MessageTooLarge(type(msg).__name__, len(data), MAX_SEND_BYTES)
    return data


def fits_in_a_message(msg) -> bool:
    return len(encode(msg)) <= MAX_SEND_BYTES


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


__all__ = ["encode", "encode_to_send", "fits_in_a_message", "decode", "CodecError", "MessageTooLarge", "MESSAGE_TYPES",
           "MAX_MESSAGE_BYTES", "MAX_SEND_BYTES", "SamplingParams"]
