"""The trajectory writer's step structure: the union of every step's fields, each field a column by its path.

A step is a nest (dicts, lists, tuples, namedtuples). Its leaves are named
by their paths (`("obs", 0)`); the writer numbers each path once, in the
order it first sees it, so a column always holds one field however the
structure grows. `union` grows the structure (a nest with `None` leaves) by
the fields of a new step; `flatten_into` lays a step (possibly a subset of
the fields) out by column number, `None` where a field is missing.
"""

from __future__ import annotations

from typing import Any, Mapping

from tensorflow.python.util import nest


def path_name(path: tuple) -> str:
    """`obs/0` for the path `("obs", 0)`; `0` for the root."""
    return "/".join(map(str, path)) or "0"


def skeleton(data: Any) -> Any:
    """`data`'s structure with `None` leaves."""
    return nest.map_structure(lambda _: None, data)


def union(where: str, old: Any, new: Any) -> Any:
    """The structure holding the fields of both `old` and `new` (nests with `None` leaves); ValueError when a
    path is a field in one and a sub-structure in the other."""
    if old is None and new is None:
        return None
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        merged = dict(old)
        for key, value in new.items():
            merged[key] = union(where, old[key], value) if key in old else value
        return merged if type(old) is dict else type(old)(merged)  # type: ignore[call-arg]
    if _is_sequence(old) and _is_sequence(new):
        longer = old if len(old) >= len(new) else new
        items = [
            union(where, old[i], new[i]) if i < len(old) and i < len(new) else longer[i] for i in range(len(longer))
        ]
        if hasattr(old, "_fields"):
            return type(old)(*items)
        return type(old)(items)
    raise ValueError(
        f"{where}: the step's structure ({new!r}) must agree with the fields appended before ({old!r}): a field "
        "cannot become a nest, nor a nest a field."
    )


def _is_sequence(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def paths(data: Any) -> list[tuple]:
    return [tuple(p) for p, _ in nest.flatten_with_tuple_paths(data)]


def flatten_into(index: Mapping[tuple, int], data: Any) -> list:
    """`data`'s leaves by column number (`index`: path -> column), `None` for the columns it leaves out."""
    flat: list = [None] * len(index)
    for path, value in nest.flatten_with_tuple_paths(data):
        flat[index[tuple(path)]] = value
    return flat
