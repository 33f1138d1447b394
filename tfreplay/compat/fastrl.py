"""`ExperienceReplay`: fastrl's replay memory over a stream of steps, on a `PyUniformReplayBuffer`.

It pulls steps one at a time from any iterable (a driver's step stream, a
generator over a gymnasium env), stores each in a ring of `max_sz` slots and,
when iterated, yields a sampled batch of `bs` steps after every step it pulls.

    memory = ExperienceReplay(steps, bs=32, max_sz=10_000)
    for batch in memory:        # one pulled step, one sampled batch
        train(batch.state, batch.action, batch.reward, batch.next_state, batch.done)

The ring is a `PyUniformReplayBuffer` of capacity `max_sz`, made at the first
step (whose structure, dtypes and shapes it takes) and used through its public
API only, so storage, locking and the random source are the library's. Step `t`
(counting from 0) is the buffer's item `t` and lies in slot `t % max_sz`. The
buffer draws with replacement; fastrl's batches are distinct steps, so
`sample` keeps each slot's first draw (see `draw_distinct`). The adapter adds
fastrl's counters, and checks each step against the first before the buffer
does, so that a refusal names the step's field in fastrl's terms.
"""

from __future__ import annotations

import reprlib
import secrets
import threading
from typing import Any, Iterable, Iterator

import numpy as np
import tensorflow as tf

from tfreplay._src import specs
from tfreplay._src.specs import Nest
from tfreplay.buffers import PyUniformReplayBuffer

_WHERE = "ExperienceReplay"


def infer_step_spec(where: str, step: Nest) -> Nest:
    """Returns a nest of `tf.TensorSpec` with the structure of `step`.

    Raises:
      TypeError: the step has no leaves, or a leaf is not numeric or boolean.
    """
    leaves = tf.nest.flatten(step)
    if not leaves:
        raise TypeError(f"{where}: step ({reprlib.repr(step)}) must have at least one array or number in it.")
    out = []
    for path, leaf in zip(specs.leaf_paths(step), leaves):
        array = np.asarray(leaf)
        if array.dtype.kind not in "biufc":
            raise TypeError(
                f"{where}: step {path} ({reprlib.repr(leaf)}) must be a number, a bool or a numeric "
                f"array; its dtype is {array.dtype}."
            )
        out.append(tf.TensorSpec(array.shape, tf.as_dtype(array.dtype), path))
    return tf.nest.pack_sequence_as(step, out)


def step_to_arrays(where: str, step_spec: Nest, paths: list[str], step: Nest) -> list[np.ndarray]:
    """Checks one step against `step_spec`; returns its leaves as arrays.

    Python numbers take the spec's dtype when that is exact (the rule of
    `specs.to_numpy_leaf`); arrays must already have it.

    Raises:
      TypeError: another structure or dtype.
      ValueError: another shape.
    """
    try:
        tf.nest.assert_same_structure(step_spec, step, check_types=True)
    except (ValueError, TypeError) as err:
        raise TypeError(
            f"{where}: step ({reprlib.repr(step)}) must have the structure of the first step, "
            f"{tf.nest.map_structure(lambda s: s.dtype.name, step_spec)}; {err}"
        ) from None
    arrays = []
    for path, leaf, spec in zip(paths, tf.nest.flatten(step), tf.nest.flatten(step_spec)):
        array = specs.to_numpy_leaf(where, path, leaf, spec)
        if array.dtype != spec.dtype.as_numpy_dtype:
            raise TypeError(
                f"{where}: step {path} has dtype {array.dtype}; the first step's was {spec.dtype.name} "
                "(steps share one dtype per field; tfreplay never casts silently)."
            )
        if array.shape != tuple(spec.shape.as_list()):
            raise ValueError(
                f"{where}: step {path} has shape {array.shape}; it must be {tuple(spec.shape.as_list())}, "
                "the shape of the first step's."
            )
        arrays.append(array)
    return arrays


def ring_counters(num_adds: int, max_sz: int) -> tuple[int, int, int]:
    """Returns `(size, index, cycle)` after `num_adds` steps.

    The wrap is lazy: writing step `num_adds + 1` into a full ring starts a new
    cycle at slot 0, so `index` stays `max_sz` (not 0) until then.
    """
    cycle = max(num_adds - 1, 0) // max_sz
    return min(num_adds, max_sz), num_adds - cycle * max_sz, cycle


def draw_distinct(buffer: PyUniformReplayBuffer, bs: int, size: int) -> tuple[Nest, np.ndarray]:
    """`(batch, slots)`: `bs` distinct stored steps in random order, from the buffer's uniform draws.

    The buffer draws with replacement; keeping each slot's first draw only,
    in draw order, is exactly a draw without replacement (every kept step is
    uniform over those not kept yet), whatever the rounds' sizes. A round asks
    for as many draws as the missing steps take on average: with `bs` small
    beside `size` that is `bs`, and they are nearly always distinct as drawn;
    `bs` close to `size` costs about `size * ln(size)` draws in all.
    """
    rounds: list[list[np.ndarray]] = []
    kept = np.zeros(0, np.int64)  # the kept slots, in draw order
    while len(kept) < bs:
        need = bs - len(kept)
        count = max(need, round(float(np.sum(size / (size - len(kept) - np.arange(need))))))
        items, info = buffer.get_next(count)
        slots = info.ids % buffer.capacity
        if count == bs and len(set(slots.tolist())) == bs:  # the first round, all distinct: the batch as drawn
            return items, slots
        _, first = np.unique(slots, return_index=True)
        new = np.sort(first)  # each slot's first draw in this round, in draw order
        new = new[~np.isin(slots[new], kept, assume_unique=True)][:need]
        rounds.append([leaf[new] for leaf in tf.nest.flatten(items)])
        kept = np.concatenate([kept, slots[new]])
    leaves = [np.concatenate(parts) for parts in zip(*rounds)]
    return tf.nest.pack_sequence_as(items, leaves), kept


class ExperienceReplay:
    """A ring memory of steps pulled from `source`, sampled in batches of `bs`.

    Iterating pulls one step from the source, stores it and, once at least
    `bs` steps are stored, yields `sample()`; before that it pulls without
    yielding. The source is turned into one iterator when the memory is built,
    so iterating again continues where the last iteration stopped (break out
    of a loop freely: a step is stored before its batch is yielded). When the
    source is exhausted the iteration simply ends; `sample()` keeps working on
    what is stored.

    A batch is the step's structure with every leaf stacked on a new leading
    axis of size `bs`: a `Step(state, action, ...)` namedtuple of arrays gives
    a `Step` of arrays shaped `[bs, ...]`. Its steps are drawn uniformly
    without replacement from the stored steps.

    The first step fixes the structure, dtype and shape of every field. A step
    that differs raises `TypeError` (structure, dtype) or `ValueError` (shape),
    naming the field, and is not stored; raised inside an iteration, it ends
    that iteration (the bad step has been consumed from the source).

    Counters follow fastrl's ExperienceReplay: `index` is the slot after the
    newest step and wraps lazily, so it reads `max_sz` right after the ring
    fills and drops to 1 on the next step, when `cycle` goes up by one.

    Reads and writes take a lock, so one thread may iterate while another
    calls `sample()`.

    Args:
      source: an iterable of steps: nests (namedtuples, dicts, tuples) of
        numbers and NumPy arrays.
      bs: steps per sampled batch.
      max_sz: slots in the ring; the oldest step is overwritten when full.
      return_idxs: make `sample()` (and iteration) return `(batch, idxs)`,
        `idxs` being the sampled slots, positions in `memory`.
      seed: seed of the sampling generator (`None`: fresh entropy); the same
        seed and steps give the same batches.

    Raises:
      TypeError: `source` is not iterable, or `return_idxs` is not a bool.
      ValueError: `bs` or `max_sz` is not a positive integer, or `bs > max_sz`.
    """

    def __init__(
        self, source: Iterable[Nest], bs: int = 1, max_sz: int = 100, return_idxs: bool = False, seed: int | None = None
    ):
        specs.check_positive_int(_WHERE, "bs", bs)
        specs.check_positive_int(_WHERE, "max_sz", max_sz)
        if bs > max_sz:
            raise ValueError(
                f"{_WHERE}: bs ({bs}) must be at most max_sz ({max_sz}); a batch is drawn without "
                "replacement from the stored steps."
            )
        if not isinstance(return_idxs, (bool, np.bool_)):
            raise TypeError(f"{_WHERE}: return_idxs ({return_idxs!r}) must be a bool.")
        try:
            self._source = iter(source)
        except TypeError:
            raise TypeError(
                f"{_WHERE}: source ({reprlib.repr(source)}) must be an iterable of steps "
                "(a generator, a list, a driver's step stream)."
            ) from None
        np.random.default_rng(seed)  # a bad seed is refused here, not at the first step
        self._bs = int(bs)
        self._max_sz = int(max_sz)
        self._return_idxs = bool(return_idxs)
        # The buffer takes None as TF's global seed; fastrl's memory draws from fresh entropy then.
        self._seed = secrets.randbits(128) if seed is None else seed
        self._lock = threading.Lock()
        self._step_spec: Nest = None
        self._paths: list[str] = []
        self._buffer: PyUniformReplayBuffer | None = None
        self._num_adds = 0

    @property
    def bs(self) -> int:
        """Steps per sampled batch."""
        return self._bs

    @property
    def max_sz(self) -> int:
        """Slots in the ring."""
        return self._max_sz

    @property
    def step_spec(self) -> Nest:
        """A `tf.TensorSpec` nest of one step, taken from the first step (`None` before)."""
        return self._step_spec

    @property
    def size(self) -> int:
        """How many steps are stored: at most `max_sz`."""
        return ring_counters(self._num_adds, self._max_sz)[0]

    @property
    def index(self) -> int:
        """The slot after the newest step, in `[1, max_sz]` (0 when empty)."""
        return ring_counters(self._num_adds, self._max_sz)[1]

    @property
    def cycle(self) -> int:
        """How many times writing has wrapped around to slot 0."""
        return ring_counters(self._num_adds, self._max_sz)[2]

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"{_WHERE}(size={self.size}, max_sz={self._max_sz}, bs={self._bs}, cycle={self.cycle})"

    def __iter__(self) -> Iterator[Any]:
        for step in self._source:
            self.add(step)
            if self.size >= self._bs:
                yield self.sample()

    def add(self, step: Nest) -> None:
        """Stores one step in the next slot, overwriting the oldest when full.

        Raises:
          TypeError: its structure or a dtype differs from the first step's, or
            (first step) a field is not numeric.
          ValueError: a field's shape differs from the first step's.
        """
        where = f"{_WHERE}.add"
        with self._lock:
            step_spec, paths = self._step_spec, self._paths
            if step_spec is None:
                step_spec = infer_step_spec(where, step)
                paths = specs.leaf_paths(step_spec)
            arrays = step_to_arrays(where, step_spec, paths, step)
            if self._buffer is None:
                # No episode index: fastrl's memory samples single steps, whatever the fields are called.
                self._buffer = PyUniformReplayBuffer(step_spec, self._max_sz, seed=self._seed, episode_rule=None)
                self._step_spec, self._paths = step_spec, paths
            self._buffer.add_batch(tf.nest.pack_sequence_as(step_spec, [a[None] for a in arrays]))
            self._num_adds += 1

    def sample(self, bs: int | None = None) -> Any:
        """Draws `bs` distinct stored steps uniformly at random.

        Args:
          bs: batch size for this call; defaults to the memory's `bs`.

        Returns:
          The batch (a step-structured nest of arrays shaped `[bs, ...]`), or
          `(batch, idxs)` with `return_idxs=True`; `memory[idxs[i]]` is step `i`
          of the batch.

        Raises:
          ValueError: `bs` is not a positive integer or exceeds `size`.
        """
        bs = self._bs if bs is None else bs
        specs.check_positive_int(f"{_WHERE}.sample", "bs", bs)
        with self._lock:
            size = self.size
            if bs > size:
                raise ValueError(
                    f"{_WHERE}.sample: bs ({bs}) must be at most size ({size}); steps are drawn without "
                    "replacement, so pull more steps from the source first."
                )
            assert self._buffer is not None  # size > 0
            batch, idxs = draw_distinct(self._buffer, int(bs), size)
        return (batch, idxs) if self._return_idxs else batch

    @property
    def memory(self) -> list[Nest]:
        """A copy of the stored steps, one per slot, in slot order.

        Slot order is write order until the ring wraps; after that slot
        `index - 1` holds the newest step and slot `index` (if stored) the
        oldest. Each step has the first step's structure, with NumPy leaves.
        """
        with self._lock:
            if self._buffer is None:
                return []
            size = self.size
            oldest_slot = (self._num_adds - size) % self._max_sz
            # `gather_all` is `[1, size, ...]`, oldest first; rolling puts each step at its slot.
            leaves = [np.roll(leaf[0], oldest_slot, axis=0) for leaf in tf.nest.flatten(self._buffer.gather_all())]
            step_spec = self._step_spec
        return [tf.nest.pack_sequence_as(step_spec, [leaf[i] for leaf in leaves]) for i in range(size)]
