"""Sampling across shards, for `ReplayClient`: the split of draws, their exact probabilities, `as_dataset`.

Shard `k` is chosen with probability `w_k / W`, where `w_k` is its sampling
mass (number of valid windows, or summed `priority ** alpha`) as the client
last heard it; it then draws inside itself with its probability `p_k`, so a
sample's probability is exactly `w_k / W * p_k`, the value in
`BufferInfo.probabilities`. A batch's draws are split over shards by a
multinomial and the union is shuffled. Every request also asks the shards
it does not sample for their mass, so weights stay one request fresh.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import ray
import tensorflow as tf

from tfreplay._src.api import BufferInfo
from tfreplay._src.arrays import py_calls
from tfreplay._src.specs import Nest
from tfreplay.distributed import ids as service_ids

_REDRAWS = 16  # requests redrawn when a chosen shard had nothing left to draw


class Sampling:
    """The sampling half of `ReplayClient` (a mixin: it uses the client's shards, calls and state)."""

    shards: Any
    _d: dict
    _rng: np.random.Generator
    _masses: dict
    _max_in_flight: int
    _get: Any
    _call_all: Any
    _note_epoch: Any
    _admit: Any
    _admissions: dict
    flush: Any
    _check_open: Any

    def _weights(self, num_steps: int | None, refresh: bool = False) -> np.ndarray:
        if refresh or num_steps not in self._masses:
            self._masses[num_steps] = np.asarray(self._call_all("mass", num_steps), np.float64)
        return self._masses[num_steps]

    def _request(self, size: int, num_steps: int | None, refresh: bool = False) -> tuple:
        """Sends one sample request: `size` draws split over shards in proportion to their weights."""
        self.flush()
        limiter = self.shards.limiter
        admitted = self._admit("sample", size)
        weights = self._weights(num_steps, refresh).copy()
        if weights.sum() <= 0 and not refresh:
            weights = self._weights(num_steps, True).copy()
        if weights.sum() <= 0 and admitted is not None:  # as a limited buffer: wait for admission, not "empty"
            try:
                _admission(admitted)
            except Exception:
                self._admissions.clear()  # a failed admission must not fail the next ones of the chain
                raise
            weights = self._weights(num_steps, True).copy()
        if weights.sum() <= 0:
            if admitted is not None:
                ray.get(limiter.settle.remote("sample", size, False))
            raise ValueError(self._empty_message("get_next", num_steps))
        counts = self._rng.multinomial(size, weights / weights.sum())
        refs = {}
        for k, actor in enumerate(self.shards.actors):
            if counts[k]:
                refs[k] = actor.sample.remote(int(counts[k]), num_steps, admitted)
            else:
                refs[k] = actor.mass.remote(num_steps)
        return size, num_steps, weights, counts, refs

    def _collect(self, request: tuple) -> tuple | None:
        """`(leaves, ids, probabilities)` of a request, shuffled; None if a chosen shard had nothing."""
        size, num_steps, weights, counts, refs = request
        parts, empty = [], False
        for k, ref in refs.items():
            if not counts[k]:
                self._masses.setdefault(num_steps, weights.copy())[k] = self._get(ref, k, "mass", (num_steps,))
                continue
            leaves, bids, probs, mass, epoch = self._get(ref, k, "sample", (int(counts[k]), num_steps, None))
            self._masses.setdefault(num_steps, weights.copy())[k] = mass
            self._note_epoch(k, epoch)
            if not leaves:
                empty = True
                continue
            share = weights[k] / weights.sum()
            parts.append((leaves, service_ids.encode(bids, k, epoch), (probs * share).astype(np.float32)))
        if empty:  # the whole request is drawn again: its samples are given back to the limiter
            if self.shards.limiter is not None:
                ray.get(self.shards.limiter.settle.remote("sample", size, False))  # counted before the redraw
            return None
        order = self._rng.permutation(size)
        leaves = [np.concatenate(column)[order] for column in zip(*[p[0] for p in parts])]
        return leaves, np.concatenate([p[1] for p in parts])[order], np.concatenate([p[2] for p in parts])[order]

    def _draw(self, size: int, num_steps: int | None) -> tuple:
        for attempt in range(_REDRAWS):
            drawn = self._collect(self._request(size, num_steps, refresh=attempt > 0))
            if drawn is not None:
                return drawn
        raise ValueError(self._empty_message("get_next", num_steps))

    def _sample(self, request: Any) -> tuple:
        sample_batch_size, num_steps, time_stacked, transform = request
        self._check_open("get_next")
        _no_transform("get_next", transform)
        leaves, ids, probs = self._draw(sample_batch_size or 1, num_steps)
        return self._package(leaves, ids, probs, sample_batch_size is not None, num_steps, time_stacked)

    def _package(self, leaves: list, ids: Any, probs: Any, batched: bool, num_steps: Any, time_stacked: bool) -> tuple:
        items = tf.nest.pack_sequence_as(self._d["item_spec"], leaves)
        if not batched:
            items, ids, probs = tf.nest.map_structure(lambda x: x[0], (items, ids, probs))
        if num_steps is None or time_stacked:
            return items, BufferInfo(ids=ids, probabilities=probs)
        axis = 1 if batched else 0
        steps = tuple(tf.nest.map_structure(lambda x, t=t: np.take(x, t, axis), items) for t in range(num_steps))
        return steps, BufferInfo(ids=tuple(np.take(ids, t, axis) for t in range(num_steps)), probabilities=probs)

    def _out_specs(self, sample_batch_size: int | None, num_steps: int | None) -> tuple:
        outer = [sample_batch_size or 1] + ([] if num_steps is None else [num_steps])
        leaves = [tf.TensorSpec(outer + s.shape.as_list(), s.dtype) for s in tf.nest.flatten(self._d["item_spec"])]
        return leaves, tf.TensorSpec(outer, tf.int64), tf.TensorSpec(outer[:1], tf.float32)

    def _sample_dataset(self, request: Any, num_parallel_calls: int | None) -> tf.data.Dataset:
        """Requests kept `num_parallel_calls` (default `max_in_flight`) deep; each reply one element."""
        sample_batch_size, num_steps, _, transform = request
        _no_transform("as_dataset", transform)
        depth = num_parallel_calls if isinstance(num_parallel_calls, int) and num_parallel_calls > 0 else None
        depth = depth or self._max_in_flight
        size = sample_batch_size or 1

        def generate() -> Any:
            pending: collections.deque = collections.deque()
            attempts = 0
            while True:
                while len(pending) < depth:
                    pending.append(self._request(size, num_steps, refresh=attempts > 0))
                drawn = self._collect(pending.popleft())
                attempts = 0 if drawn is not None else attempts + 1
                if attempts > _REDRAWS:
                    raise ValueError(self._empty_message("as_dataset", num_steps))
                if drawn is not None:
                    yield tuple(drawn[0]) + (drawn[1], drawn[2])

        leaf_specs, ids_spec, probs_spec = self._out_specs(sample_batch_size, num_steps)
        flat = tuple(leaf_specs) + (ids_spec, probs_spec)

        def pack(*tensors: tf.Tensor) -> tuple:
            items = tf.nest.pack_sequence_as(self._d["item_spec"], list(tensors[:-2]))
            info = BufferInfo(ids=tensors[-2], probabilities=tensors[-1])
            if sample_batch_size is None:
                items, info = tf.nest.map_structure(lambda x: x[0], (items, info))
            return items, info

        ds = tf.data.Dataset.from_generator(generate, output_signature=flat)
        return ds.map(pack).prefetch(depth)

    def _sample_tensors(self, request: Any) -> tuple[Nest, BufferInfo]:
        sample_batch_size, num_steps, _, transform = request
        _no_transform("as_dataset", transform)
        leaf_specs, ids_spec, probs_spec = self._out_specs(sample_batch_size, num_steps)

        def draw() -> list:
            leaves, ids, probs = self._draw(sample_batch_size or 1, num_steps)
            return leaves + [ids, probs]

        specs_ = leaf_specs + [ids_spec, probs_spec]
        out = py_calls.numpy_function(draw, [], [s.dtype for s in specs_])
        for tensor, spec in zip(out, specs_):
            tensor.set_shape(spec.shape)
        items = tf.nest.pack_sequence_as(self._d["item_spec"], out[:-2])
        info = BufferInfo(ids=out[-2], probabilities=out[-1])
        if sample_batch_size is None:
            items, info = tf.nest.map_structure(lambda x: x[0], (items, info))
        return items, info

    def _single_pass_dataset(self, request: Any, num_parallel_calls: Any) -> Any:
        raise ValueError(
            "as_dataset: single_deterministic_pass (True) must be False for a sharded service, whose shards "
            "have no common order; read everything with gather_all()."
        )

    def _empty_message(self, where: str, num_steps: int | None) -> str:
        n = num_steps or 1
        what = "the service is empty" if n == 1 else f"no shard holds {n} consecutive items yet (num_steps={n})"
        return f"{where}: {what}; add items before sampling."


def _admission(ref: Any) -> None:
    """Waits for a limiter's admission; raises what the limiter raised (timeout, closed)."""
    try:
        ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        raise (err.cause if isinstance(err.cause, Exception) else err) from None


def _no_transform(where: str, transform: Any) -> None:
    if transform is not None:
        raise ValueError(
            f"{where}: transform ({type(transform).__name__}) must be None for the sharded service; "
            "apply it to the samples in the learner."
        )
