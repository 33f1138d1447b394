"""The transport's wire format: a JSON header and raw NumPy buffers, nothing that runs code when read.

A message is `b"TFRV"`, the header's length (4 bytes, little endian), the
header (UTF-8 JSON, an object) and the arrays' bytes one after another. The
header's `"arrays"` lists each array's dtype (`np.dtype.str` of a number,
a bool or a fixed-width string: `DTYPES`) and shape; the bytes that follow
must be exactly what they add up to. Signatures travel as TensorFlow's
`StructuredValue` protocol buffer (what SavedModel stores), as a `uint8`
array. Errors travel by kind (`ERRORS`), so the far side raises Reverb's
error class. Nothing here imports gRPC: the server and client modules do.
"""

from __future__ import annotations

import functools
import json
import math
import re
import struct
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tfreplay.compat.reverb import errors
from tfreplay.compat.reverb.engine import rate_limiters, selectors
from tfreplay.compat.reverb.engine.items import Column, Item

SERVICE = "tfreplay.reverb.Tables"  # the gRPC service both sides name
MAX_MESSAGE = 1 << 30
# gRPC options both sides set: a message of up to MAX_MESSAGE either way.
MESSAGE_LIMITS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
]
MAGIC = b"TFRV"
MAX_HEADER = 16 << 20
MAX_RANK = 32
DTYPES = re.compile(r"^[<>|=]?(b1|i1|i2|i4|i8|u1|u2|u4|u8|f2|f4|f8|c8|c16|S\d{1,6}|U\d{1,6})$")


class WireError(ValueError):
    """A message that is not one of this format's."""


def encode(header: dict, arrays: Sequence[np.ndarray] = ()) -> bytes:
    """`header` (JSON-able) and `arrays` as one message."""
    arrays = [_plain(a) for a in arrays]
    head = dict(header, arrays=[[a.dtype.str, list(a.shape)] for a in arrays])
    text = json.dumps(head, separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<I", len(text)), text, *(a.reshape(-1).view(np.uint8).data for a in arrays)])


def decode(message: bytes) -> tuple[dict, list[np.ndarray]]:
    """The header and arrays of `message`; `WireError` for anything out of the format."""
    if len(message) < 8 or message[:4] != MAGIC:
        raise WireError("wire: the message does not start with the transport's magic bytes.")
    (size,) = struct.unpack("<I", message[4:8])
    if size > MAX_HEADER or 8 + size > len(message):
        raise WireError(f"wire: the header's length ({size}) must fit the message ({len(message)} bytes).")
    try:
        header = json.loads(message[8 : 8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"wire: the header must be JSON ({e}).") from None
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list):
        raise WireError("wire: the header must be a JSON object with an 'arrays' list.")
    arrays, offset = [], 8 + size
    for entry in header.pop("arrays"):
        dtype, shape = _array_entry(entry)
        count = math.prod(shape)  # a Python int: no overflow
        nbytes = dtype.itemsize * count
        if offset + nbytes > len(message):
            raise WireError(f"wire: array {entry!r} needs {nbytes} bytes; the message has {len(message) - offset}.")
        arrays.append(np.frombuffer(message, dtype, count, offset).reshape(shape).copy())
        offset += nbytes
    if offset != len(message):
        raise WireError(f"wire: {len(message) - offset} bytes follow the last array; the message must end there.")
    return header, arrays


def _plain(array: Any) -> np.ndarray:
    """`array` as an array of an allowed dtype (Python strings and bytes as fixed-width strings)."""
    array = np.asarray(array)
    if array.dtype == object:
        flat = array.reshape(-1).tolist()
        if all(isinstance(x, bytes) for x in flat):
            array = np.array(flat, dtype=bytes).reshape(array.shape)
    check_sendable(array.dtype)
    return array if array.flags.c_contiguous else array.copy(order="C")


@functools.lru_cache(maxsize=256)
def check_sendable(dtype: np.dtype) -> None:
    """`TypeError` unless arrays of `dtype` can be sent (numbers, bools, fixed-width strings)."""
    if not DTYPES.match(dtype.str):
        raise TypeError(f"wire: an array of dtype {dtype} cannot be sent; use numbers, bools or strings.")


def _array_entry(entry: Any) -> tuple[np.dtype, tuple]:
    ok = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], list)
    if not ok or not DTYPES.match(entry[0]) or len(entry[1]) > MAX_RANK:
        raise WireError(f"wire: array entry ({entry!r}) must be [dtype of {DTYPES.pattern}, shape].")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in entry[1]):
        raise WireError(f"wire: array entry ({entry!r}) must have a shape of integers in [0, 2**40).")
    return np.dtype(entry[0]), tuple(entry[1])


def field(header: dict, name: str, kind: Any, where: str = "wire") -> Any:
    """`header[name]`, checked to be of `kind` (bools are not ints); `WireError` otherwise."""
    value = header.get(name)
    if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        value = None
    if not isinstance(value, kind):
        raise WireError(f"{where}: field {name!r} ({value!r}) must be {kind}.")
    return value


# Errors: the far side raises the class of the kind.
ERRORS: dict[str, Any] = {
    "DeadlineExceeded": errors.DeadlineExceededError,
    "Stopped": errors.ServerStoppedError,
    "NotFound": errors.NotFoundError,
    "InvalidArgument": errors.SignatureError,
    "Value": ValueError,
    "Type": TypeError,
}


def error_header(exc: BaseException) -> dict:
    for kind, cls in ERRORS.items():
        if isinstance(exc, cls):
            return {"error": [kind, getattr(exc, "message", None) or str(exc)]}
    return {"error": ["Internal", f"{type(exc).__name__}: {exc}"]}


def raise_error(header: dict) -> None:
    """Raises the error `header` carries, if any."""
    error = header.get("error")
    if error is None:
        return
    if not (isinstance(error, list) and len(error) == 2 and all(isinstance(x, str) for x in error)):
        raise WireError(f"wire: error ({error!r}) must be [kind, message].")
    cls = ERRORS.get(error[0])
    if cls is None:
        raise tf.errors.InternalError(None, None, f"the Reverb server failed: {error[1]}")
    raise cls(error[1])


# Items and draws.
def columns_out(columns: Sequence[Column], arrays: list) -> list:
    """Column descriptions `[squeeze, array index]`, their values appended to `arrays`."""
    described = []
    for column in columns:
        described.append([bool(column.squeeze), len(arrays)])
        arrays.append(column.value())
    return described


def columns_in(described: Any, arrays: list, where: str) -> tuple:
    """The `Column`s of `columns_out`'s descriptions (a column with a time axis needs at least one step)."""
    if not isinstance(described, list) or not described:
        raise WireError(f"{where}: columns ({described!r}) must be a non-empty list.")
    return tuple(_column(squeeze, value, where) for squeeze, value in _column_values(described, arrays, where))


def _column_values(described: list, arrays: list, where: str) -> list:
    """`[squeeze, array index]` entries as `(squeeze, array)` pairs."""
    out = []
    for entry in described:
        ok = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], bool)
        if not ok or not isinstance(entry[1], int) or isinstance(entry[1], bool) or not 0 <= entry[1] < len(arrays):
            raise WireError(f"{where}: column ({entry!r}) must be [squeeze, array index].")
        out.append((entry[0], arrays[entry[1]]))
    return out


def _column(squeeze: bool, value: np.ndarray, where: str) -> Column:
    if squeeze:
        return Column((value,), True)
    if value.ndim == 0 or value.shape[0] == 0:
        raise WireError(f"{where}: a column with a time axis (shape {value.shape}) needs at least one step.")
    return Column(tuple(np.asarray(step) for step in value), False)  # 0-d arrays, not NumPy scalars


def _kind(column: Column) -> tuple:
    return column.squeeze, column.shape(), column.cells[0].dtype


def draws_out(draws: Sequence[tuple], arrays: list) -> dict:
    """The header of a batch of draws `(item, info)`, their values appended to `arrays`: the keys and the other
    infos as two arrays and, when every draw's columns agree in dtype and shape (`"stacked"`), one array per
    column with a row per draw, else each draw's `columns_out`. A batch of small items is a few arrays, not one
    per item and column."""
    header = {"keys": len(arrays), "stats": len(arrays) + 1}
    arrays.append(np.array([info[0] for _, info in draws], np.uint64))
    arrays.append(np.array([info[1:] for _, info in draws], np.float64).reshape(len(draws), 4))
    kinds = {tuple(_kind(c) for c in item.columns) for item, _ in draws}
    if len(kinds) != 1:
        return dict(header, columns=[columns_out(item.columns, arrays) for item, _ in draws])
    stacked = []
    for c, (squeeze, shape, _) in enumerate(kinds.pop()):
        stacked.append([squeeze, len(arrays)])
        cells = [cell for item, _ in draws for cell in item.columns[c].cells]
        arrays.append(np.stack(cells).reshape((len(draws),) + shape))
    return dict(header, stacked=stacked)


def draws_in(header: dict, arrays: list, where: str) -> list:
    """The draws `(Item, info)` of `draws_out`'s header and arrays."""
    keys, stats = (arrays[_index(header, name, arrays, where)] for name in ("keys", "stats"))
    n = len(keys) if keys.ndim == 1 else -1
    if keys.dtype != np.uint64 or stats.dtype != np.float64 or stats.shape != (n, 4):
        raise WireError(f"{where}: draws need keys u8[n] and stats f8[n, 4]; got {keys.shape}, {stats.shape}.")
    stacked = None
    if "stacked" in header:
        values = _column_values(field(header, "stacked", list, where), arrays, where)
        if not values or any(v.ndim == 0 or v.shape[0] != n for _, v in values):
            raise WireError(f"{where}: each stacked column must have a row for each of the {n} draws.")
        columns = [tuple(_column(squeeze, v[j], where) for squeeze, v in values) for j in range(n)]
        stacked = [v for _, v in values]
    else:
        described = field(header, "columns", list, where)
        if len(described) != n:
            raise WireError(f"{where}: columns ({len(described)} draws) must describe each of the {n} draws.")
        columns = [columns_in(d, arrays, where) for d in described]
    draws = Draws()
    for key, (probability, size, priority, times), cols in zip(keys.tolist(), stats.tolist(), columns):
        draws.append((Item(key, priority, cols, int(times)), (key, probability, int(size), priority, int(times))))
    draws.stacked = stacked
    return draws


class Draws(list):
    """Draws `(item, info)`; `stacked`: each column's values with a row per draw, when the answer carried them so
    (a dataset batches those as they are, not its items' cells again)."""

    stacked: list | None = None


def _index(header: dict, name: str, arrays: list, where: str) -> int:
    index = field(header, name, int, where)
    if not 0 <= index < len(arrays):
        raise WireError(f"{where}: field {name!r} ({index}) must index one of the {len(arrays)} arrays.")
    return index


def keys(values: Any, where: str, name: str) -> list:
    if not isinstance(values, list) or not all(
        isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 2**64 for k in values
    ):
        raise WireError(f"{where}: {name} ({values!r}) must be a list of integers in [0, 2**64).")
    return values


# Table settings and infos.
def selector_out(options: selectors.SelectorOptions) -> dict:
    out: dict = {"deterministic": options.is_deterministic}
    if options.prioritized is not None:
        return dict(out, kind="prioritized", exponent=options.prioritized.priority_exponent)
    if options.heap is not None:
        return dict(out, kind="heap", min_heap=options.heap.min_heap)
    return dict(out, kind="fifo" if options.fifo else "lifo" if options.lifo else "uniform")


def selector_in(described: dict) -> selectors.Selector:
    """The selector setting `selector_out` described (its priority rule is checked on the client too)."""
    kind = described.get("kind")
    if kind == "prioritized":
        return selectors.Prioritized(float(described["exponent"]))
    if kind == "heap":
        return selectors.MinHeap() if described["min_heap"] else selectors.MaxHeap()
    return {"fifo": selectors.Fifo, "lifo": selectors.Lifo}.get(str(kind), selectors.Uniform)()


def signature_out(signature: Any, arrays: list) -> int | None:
    if signature is None:
        return None
    from tensorflow.python.saved_model import nested_structure_coder

    arrays.append(np.frombuffer(nested_structure_coder.encode_structure(signature).SerializeToString(), np.uint8))
    return len(arrays) - 1


def signature_in(index: Any, arrays: list) -> Any:
    if index is None:
        return None
    from tensorflow.core.protobuf import struct_pb2
    from tensorflow.python.saved_model import nested_structure_coder

    proto = struct_pb2.StructuredValue()
    proto.ParseFromString(arrays[index].tobytes())
    signature = nested_structure_coder.decode_proto(proto)
    if not all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(signature)):
        raise WireError("wire: a table signature must be a nest of tf.TensorSpec.")
    return signature


def info_out(info: Any, arrays: list) -> dict:
    limiter = info.rate_limiter_info
    return {
        "name": info.name,
        "sampler": selector_out(info.sampler_options),
        "remover": selector_out(info.remover_options),
        "max_size": info.max_size,
        "max_times_sampled": info.max_times_sampled,
        "limiter": [limiter.samples_per_insert, limiter.min_size_to_sample, limiter.min_diff, limiter.max_diff],
        "counts": [limiter.inserts, limiter.samples, limiter.deletes],
        "signature": signature_out(info.signature, arrays),
        "sizes": [info.current_size, info.num_episodes, info.num_deleted_episodes, info.num_unique_samples],
    }


def info_in(described: dict, arrays: list) -> Any:
    from tfreplay.compat.reverb.engine.table import TableInfo

    spi, min_size, min_diff, max_diff = described["limiter"]
    inserts, samples, deletes = described["counts"]
    limiter = rate_limiters.RateLimiterInfo(spi, min_size, min_diff, max_diff, inserts, samples, deletes)
    return TableInfo(
        described["name"],
        selector_in(described["sampler"]).options,
        selector_in(described["remover"]).options,
        described["max_size"],
        described["max_times_sampled"],
        limiter,
        signature_in(described["signature"], arrays),
        *described["sizes"],
    )
