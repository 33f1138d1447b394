"""Backends: where a buffer's state lives and how it is reached, as primitives the buffer's paths call.

This module declares the protocol, `Backend`; the rest of the folder implements it: `tf.py` with its torn-read
check `tf_versioned.py`, `numpy.py` with its compiled window planner `numpy_windows.py`, and the NumPy
backend's memory-mapped files (`memmap.py`, `memmap_disk.py`). The backends import the parts, the sample
path, the checkpoint records and the rooms below; never the calls written over them (`calls.py`,
`single_pass.py`), which import this protocol alone.

A buffer is given a backend (`TFTwin`: `tf.Variable`s; `NumpyTwin`: NumPy
arrays) and writes every call once over it (`calls.py`): checking a batch,
the rate limiter, refusing an empty sample, datasets, priorities, clearing.
A backend holds what differs between TF and NumPy and nothing else:

- the array namespace (`ops`) and how state is made (`make`);
- the lock (`exclusive`) and how a change of stored rows is marked (`changing`);
- the random source (`draw`, `uniform`), and a sample's draw rewound when it
  found nothing (inside `read`);
- how a runtime condition is refused (`check`);
- a consistent read: NumPy reads under its lock; TF reads without it and
  reads again if a write tore it (`tf_versioned.py`): `read` for a sample,
  `consistent` for anything else;
- how Python work becomes graph ops (`as_tensors`) and how a call is traced
  once per kind (`compile`);
- what a checkpoint saves, *returned* by `bind` for the buffer to hold.

The buffer calls `bind` once its parts exist. `BackendBase` holds the
defaults of a backend with no traced calls, no device, no v1-graph state and
no files; each backend subclasses it and writes only what differs. Members a
backend has beyond the protocol (`TFTwin.device`, `NumpyTwin.files`) belong
to it alone.
"""

from __future__ import annotations

# No global here may be named `tf` or `numpy`: importing the submodules `tf.py` and `numpy.py` binds those
# names in this module to them.
import contextlib
from typing import Any, Callable, ContextManager, Protocol

from tfreplay._src.parts import Parts, Request


class Backend(Protocol):
    """What a buffer's paths call on its backend (see the module docstring).

    Attributes:
      ops: the array namespace (`ops.NUMPY_OPS` or `ops.TF_OPS`) every part is written over.
      is_tf: state in `tf.Variable`s: calls may be traced into graphs (else every call runs in Python).
      lockstep: each add holds one item per segment (False: a NumPy buffer that is one ring, any rows per add).
    """

    ops: Any
    is_tf: bool
    lockstep: bool

    def module_name(self, name: str) -> str:
        """The buffer's `tf.Module` name for `name`."""
        ...

    def make(self, name: str, shape: list, dtype: Any) -> Any:
        """A zero-filled state array (a `tf.Variable` or a NumPy array) that checkpoints save."""
        ...

    def bind(self, parts: Parts, layout: dict, gate: Any, stored: Callable[[], Any], owner: str) -> dict:
        """Called once the parts exist: returns the trackables a checkpoint saves, by the buffer attribute
        that holds each (checkpoints name them so); `layout`, `gate` and `stored` are what a restore checks
        and sets."""
        ...

    def exclusive(self, fn: Callable[[], Any]) -> Any:
        """`fn()` under the buffer's lock."""
        ...

    def changing(self, parts: Parts, fn: Callable[[], Any], num_new: int | None, segments: Any = None) -> Any:
        """`fn()`, under the lock, which changes stored rows: `num_new` items per segment (or per one of
        `segments`), None for every row (a clear)."""
        ...

    def draw(self, shape: list, total: Any) -> Any:
        """Uniform int64 draws in `[0, total)` (any defined value when `total` is 0)."""
        ...

    def pick(self, shape: list, total: Any) -> tuple[Any, Any]:
        """`draw(shape, total)` and each draw's float32 probability, `1 / total` (0 when `total` is 0)."""
        ...

    def uniform(self, shape: list) -> Any:
        """Uniform float64 draws in `[0, 1)`."""
        ...

    def check(self, ok: Any, value: Any, message: str) -> Any:
        """`value` once `ok` holds; `message` refuses it otherwise (`ValueError`, or a graph assertion)."""
        ...

    def read(self, parts: Parts, req: Request) -> tuple:
        """`(items, BufferInfo, count)`: one consistent draw and read of `req`, time-stacked and packaged;
        `count` is how many windows could be drawn, and a draw with none (0) is rewound (same seed, same
        samples). Eager or NumPy calls; in a graph `count` is a tensor the caller refuses."""
        ...

    def consistent(self, parts: Parts, fn: Callable[[], tuple], where: str, strict: bool = False) -> Any:
        """The outputs of `fn() -> (outputs, rows read, num_adds as read)` from a call no write tore: one
        that no write overlapped (`strict`) or that none of whose rows a write overwrote."""
        ...

    def as_tensors(self, fn: Callable[..., Any], inputs: list, out_specs: Any) -> Any:
        """`fn(*inputs)` as tensors shaped like `out_specs`, usable in a graph or a dataset's map."""
        ...

    def compile(self, key: str, fn: Callable[..., Any], *signature: Any) -> Callable[..., Any]:
        """`fn`, traced once for `key` (TF: a concrete function of `signature`; NumPy: `fn` itself)."""
        ...

    def placement(self) -> ContextManager:
        """Where graph ops the buffer makes go (device and name scope)."""
        ...

    def variables(self) -> tuple:
        """State outside the checkpointed arrays that a v1 graph initializes."""
        ...

    def flush(self) -> None:
        """Makes every change so far durable, where the backend keeps state on disk."""
        ...

    def close(self) -> None:
        """Lets go of what the backend holds (a storage directory)."""
        ...


class BackendBase:
    """Defaults of the protocol for a backend whose calls run as they are, in Python (subclass it)."""

    lockstep = True

    def module_name(self, name: str) -> str:
        return name

    def compile(self, key: str, fn: Callable[..., Any], *signature: Any) -> Callable[..., Any]:
        return fn

    def placement(self) -> ContextManager:
        return contextlib.nullcontext()

    def variables(self) -> tuple:
        return ()

    def flush(self) -> None:
        """Nothing to make durable: the state lives in memory (checkpoint it to keep it)."""

    def close(self) -> None:
        """Nothing to release."""
