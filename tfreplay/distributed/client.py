"""The client of the replay service: one `ReplayBuffer` over the shard actors.

Inserts: `add_batch` validates the batch here (so a bad one raises at the
caller and reaches no shard), appends it to the routed shard's pending
batch, and sends a shard's pending rows as one call once `send_batch_size`
rows or `send_delay` seconds have gathered. Sends are asynchronous: at most
`max_in_flight` wait for their acknowledgement. `flush()` sends and waits;
every read (`get_next`, `num_frames`, ...) flushes first, so a client reads
its own writes.

Sampling: shard `k` is chosen with probability `w_k / W`, where `w_k` is its
sampling mass (number of valid windows, or summed `priority ** alpha`) as
the client last heard it, then draws inside itself with its probability
`p_k`: a sample's probability is exactly `w_k / W * p_k`, the value in
`BufferInfo.probabilities`. Every request also asks the shards it does not
sample for their mass, so the weights stay one round trip fresh.

Faults: shard actors are created with `max_task_retries=-1`, so Ray resends
calls to a restarting shard; the client also resends on an actor error until
`retry_timeout`. A restart is logged with the items it lost (`stats()`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import numpy as np
import ray
import tensorflow as tf

from tfreplay.core import specs
from tfreplay.core.api import BufferInfo, ReplayBuffer
from tfreplay.core.buffer import check_priorities
from tfreplay.core.specs import Nest
from tfreplay.distributed import ids as service_ids

_log = logging.getLogger("tfreplay.distributed")
_RETRIED = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)
_REDRAWS = 16  # requests redrawn when a chosen shard had nothing left to draw


class Shards:
    """A picklable handle of a service's shard actors: give it to collectors; each makes its own client.

    Args:
      actors: the shard actor handles, shard `i` at index `i`.
      description: `Shard.describe()` of the shards (all alike).
    """

    def __init__(self, actors: list, description: dict):
        self.actors = list(actors)
        self.description = description

    def __len__(self) -> int:
        return len(self.actors)


class ReplayClient(ReplayBuffer):
    """A replay buffer whose items live in `len(shards)` Ray actors.

    Args:
      shards: the service's `Shards` (`start_service(...).shards`).
      collector_id: route every insert to shard `collector_id % num_shards`,
        so a collector's stream stays in one shard and `num_steps` windows
        are real; None: round robin over shards, one `add_batch` each (use it
        for single transitions, `num_steps=None`).
      send_batch_size: rows gathered per shard before a send.
      send_delay: seconds after which pending rows are sent anyway.
      max_in_flight: unacknowledged sends (and sample requests of
        `as_dataset` when `num_parallel_calls` is not given).
      seed: seed of the shard choice.
      retry_timeout: seconds a call is resent to a shard that is down.
      owner: `close()` also stops the shards (the client `start_service` returns).
    """

    def __init__(
        self,
        shards: Shards,
        *,
        collector_id: int | None = None,
        send_batch_size: int = 64,
        send_delay: float = 0.5,
        max_in_flight: int = 4,
        seed: int | None = None,
        retry_timeout: float = 300.0,
        owner: bool = False,
    ):
        d = shards.description
        super().__init__(d["data_spec"], d["capacity"] * len(shards), stateful_dataset=True, name="ReplayClient")
        specs.check_positive_int("ReplayClient", "send_batch_size", send_batch_size)
        specs.check_positive_int("ReplayClient", "max_in_flight", max_in_flight)
        self.shards, self._d, self._owner = shards, d, owner
        self._route = None if collector_id is None else int(collector_id) % len(shards)
        self._send_rows, self._send_delay, self._max_in_flight = send_batch_size, send_delay, max_in_flight
        self._retry_timeout = retry_timeout
        self._rng = np.random.default_rng(seed)
        self._next_shard = 0 if self._route is None else self._route
        self._pending: dict[int, dict] = {}
        self._in_flight: collections.deque = collections.deque()  # sends not yet acknowledged
        self._updates: collections.deque = collections.deque()  # priority updates sent with wait=False
        self._seen = [(0, 0)] * len(shards)  # per shard: the newest (epoch, accepted) acknowledged
        self._masses: dict[Any, np.ndarray] = {}
        self._closed = False
        self.stale_updates = 0
        # add_batch and flush may run in the learner's thread while as_dataset's generator flushes in tf.data's.
        self._lock = threading.RLock()

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # a client holds no TF state: no tracking, no list wrappers

    @property
    def batch_size(self) -> int:
        """Rows per `add_batch` (the shards' `batch_size`; 1 for one-ring shards, which take any number)."""
        return int(self._d["batch_size"])

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    # Inserts.
    def add_batch(self, items: Nest, priorities: Any = None) -> None:
        """Queues a batch for its shard (see the module docstring).

        Args:
          items: a nest like `data_spec` with an outer batch dimension.
          priorities: prioritized shards only: one initial priority per row
            (Ape-X: collectors compute them), else the largest so far.
        """
        with self._lock:
            self._add_locked(items, priorities)

    def _add_locked(self, items: Nest, priorities: Any) -> None:
        self._check_open("add_batch")
        rows = self.batch_size if self._d["lockstep"] else None
        leaves = specs.validate_numpy_batch("add_batch", self._data_spec, self._leaf_paths, items, rows)
        if priorities is not None:
            if not self._d["prioritized"]:
                raise ValueError("add_batch: priorities (given) must be None; the shards are not prioritized.")
            priorities = np.asarray(priorities, np.float64)
            check_priorities((leaves[0].shape[0],), priorities.shape, priorities)
        shard = self._next_shard
        if self._route is None:
            self._next_shard = (shard + 1) % self.num_shards
        pending = self._pending.setdefault(
            shard, {"leaves": [], "calls": [], "priorities": [], "since": time.monotonic()}
        )
        pending["leaves"].append(leaves)
        pending["calls"].append(leaves[0].shape[0])
        pending["priorities"].append(priorities)
        if sum(pending["calls"]) >= self._send_rows or time.monotonic() - pending["since"] >= self._send_delay:
            self._send(shard)

    def _add_batch(self, items: Nest) -> None:
        self.add_batch(items)

    def flush(self, updates: bool = False) -> None:
        """Sends every pending row and waits until the shards acknowledged all of them (and the
        priority updates sent with `wait=False`, if `updates`)."""
        with self._lock:
            for shard in list(self._pending):
                self._send(shard)
            while self._in_flight:
                self._settle(self._in_flight.popleft())
        while updates and self._updates:
            self._settle(self._updates.popleft())

    def _send(self, shard: int) -> None:
        pending = self._pending.pop(shard)
        leaves = [np.concatenate(column) for column in zip(*pending["leaves"])]
        given = pending["priorities"]
        priorities = None
        if any(p is not None for p in given):  # rows without priorities enter at the largest so far
            priorities = np.concatenate(
                [np.full(c, np.nan) if p is None else p for p, c in zip(given, pending["calls"])]
            )
            priorities = np.where(np.isnan(priorities), np.nanmax(priorities), priorities)
        args = (leaves, pending["calls"], self._seen[shard], priorities)
        self._in_flight.append(("add", shard, self.shards.actors[shard].add.remote(*args), args))
        while len(self._in_flight) > self._max_in_flight:
            self._settle(self._in_flight.popleft())

    def _settle(self, entry: tuple) -> None:
        method, shard, ref, args = entry
        result = self._get(ref, shard, method, args)
        if method == "update_priorities":
            self.stale_updates += result
            return
        epoch, accepted, _ = result
        self._note_epoch(shard, epoch)
        if epoch == self._seen[shard][0]:
            self._seen[shard] = (epoch, max(accepted, self._seen[shard][1]))

    # Calls and faults.
    def _get(self, ref: Any, shard: int, method: str, args: tuple) -> Any:
        """`ray.get(ref)`; on an actor error, resends `method(*args)` to the shard until `retry_timeout`."""
        deadline = time.monotonic() + self._retry_timeout
        delay = 0.05
        while True:
            try:
                return ray.get(ref)
            except _RETRIED:
                if self._closed and self._owner:
                    raise RuntimeError(f"{method}: the replay client is closed; its shards are stopped.") from None
                if time.monotonic() > deadline:
                    raise
                _log.warning("shard %d is down; resending %s", shard, method)
                time.sleep(delay)
                delay = min(2 * delay, 2.0)
                ref = getattr(self.shards.actors[shard], method).remote(*args)

    def _call(self, shard: int, method: str, *args: Any) -> Any:
        return self._get(getattr(self.shards.actors[shard], method).remote(*args), shard, method, args)

    def _call_all(self, method: str, *args: Any) -> list:
        refs = [getattr(actor, method).remote(*args) for actor in self.shards.actors]
        return [self._get(ref, k, method, args) for k, ref in enumerate(refs)]

    def _note_epoch(self, shard: int, epoch: int) -> None:
        """Logs a shard's restart (once per client), with the items it lost."""
        if epoch <= self._seen[shard][0]:
            return
        claim = self._seen[shard]
        self._seen[shard] = (epoch, 0)
        info = self._call(shard, "info", claim)
        _log.warning(
            "shard %d restarted (epoch %d): it reloaded %d items from its last checkpoint; "
            "%d acknowledged items were lost in all (stats() has the counts)",
            shard,
            epoch,
            info["restored"],
            info["lost"],
        )

    def stats(self) -> dict:
        """Per-shard counters (`epoch`, `accepted`, `restored`, `lost`, `num_frames`, `checkpoints`) and totals."""
        self._check_open("stats")
        self.flush(updates=True)
        shards = [self._call(k, "info", self._seen[k]) for k in range(self.num_shards)]
        total = lambda key: sum(s[key] for s in shards)  # noqa: E731
        return {
            "shards": shards,
            "lost": total("lost"),
            "restarts": total("epoch"),
            "num_frames": total("num_frames"),
            "stale_updates": self.stale_updates,
        }

    def checkpoint(self) -> list[str]:
        """Checkpoints every shard now; returns the path prefixes."""
        self.flush()
        return self._call_all("checkpoint")

    # Sampling.
    def _weights(self, num_steps: int | None, refresh: bool = False) -> np.ndarray:
        if refresh or num_steps not in self._masses:
            self._masses[num_steps] = np.asarray(self._call_all("mass", num_steps), np.float64)
        return self._masses[num_steps]

    def _request(self, size: int, num_steps: int | None, refresh: bool = False) -> tuple:
        """Sends one sample request: `size` draws split over shards in proportion to their weights."""
        self.flush()
        weights = self._weights(num_steps, refresh).copy()
        if weights.sum() <= 0 and not refresh:
            weights = self._weights(num_steps, True).copy()
        if weights.sum() <= 0:
            raise ValueError(self._empty_message("get_next", num_steps))
        counts = self._rng.multinomial(size, weights / weights.sum())
        refs = {}
        for k, actor in enumerate(self.shards.actors):
            refs[k] = actor.sample.remote(int(counts[k]), num_steps) if counts[k] else actor.mass.remote(num_steps)
        return size, num_steps, weights, counts, refs

    def _collect(self, request: tuple) -> tuple | None:
        """`(leaves, ids, probabilities)` of a request, shuffled; None if a chosen shard had nothing."""
        size, num_steps, weights, counts, refs = request
        parts, empty = [], False
        for k, ref in refs.items():
            if not counts[k]:
                self._masses.setdefault(num_steps, weights.copy())[k] = self._get(ref, k, "mass", (num_steps,))
                continue
            leaves, bids, probs, mass, epoch = self._get(ref, k, "sample", (int(counts[k]), num_steps))
            self._masses.setdefault(num_steps, weights.copy())[k] = mass
            self._note_epoch(k, epoch)
            if not leaves:
                empty = True
                continue
            share = weights[k] / weights.sum()
            parts.append((leaves, service_ids.encode(bids, k, epoch), (probs * share).astype(np.float32)))
        if empty:
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

    def _get_next(self, sample_batch_size: int | None, num_steps: int | None, time_stacked: bool) -> tuple:
        self._check_open("get_next")
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

    def _sample_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        """Requests kept `num_parallel_calls` (default `max_in_flight`) deep; each reply one element."""
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

    def _sample_tensors(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Nest, BufferInfo]:
        leaf_specs, ids_spec, probs_spec = self._out_specs(sample_batch_size, num_steps)

        def draw() -> list:
            leaves, ids, probs = self._draw(sample_batch_size or 1, num_steps)
            return leaves + [ids, probs]

        specs_ = leaf_specs + [ids_spec, probs_spec]
        out = tf.numpy_function(draw, [], [s.dtype for s in specs_], stateful=True)
        for tensor, spec in zip(out, specs_):
            tensor.set_shape(spec.shape)
        items = tf.nest.pack_sequence_as(self._d["item_spec"], out[:-2])
        info = BufferInfo(ids=out[-2], probabilities=out[-1])
        if sample_batch_size is None:
            items, info = tf.nest.map_structure(lambda x: x[0], (items, info))
        return items, info

    def _single_pass_dataset(self, sample_batch_size: Any, num_steps: Any, num_parallel_calls: Any) -> Any:
        raise ValueError(
            "as_dataset: single_deterministic_pass (True) must be False for a sharded service, whose shards "
            "have no common order; read everything with gather_all()."
        )

    def _empty_message(self, where: str, num_steps: int | None) -> str:
        n = num_steps or 1
        what = "the service is empty" if n == 1 else f"no shard holds {n} consecutive items yet (num_steps={n})"
        return f"{where}: {what}; add items before sampling."

    def update_priorities(self, ids: Any, priorities: Any, wait: bool = True) -> int | None:
        """New priorities for sampled items (their service ids); returns how many ids were stale.

        Ids of items overwritten since, or of a shard epoch before its last
        restart, are ignored and counted. With `wait=False` the updates are
        sent and the call returns None at once (at most `max_in_flight` wait);
        their stale count is added to `stale_updates` as they are acknowledged.

        Raises:
          ValueError: priorities of another shape than `ids`, negative, NaN
            or infinite ones, or ids of no shard of this service; nothing is sent.
        """
        self._check_open("update_priorities")
        if not self._d["prioritized"]:
            raise ValueError("update_priorities: the shards must be prioritized (PyPrioritizedReplayBuffer).")
        ids = np.asarray(ids.numpy() if isinstance(ids, tf.Tensor) else ids, np.int64)
        values = np.asarray(priorities.numpy() if isinstance(priorities, tf.Tensor) else priorities, np.float64)
        check_priorities(ids.shape, values.shape, values)
        shard, epoch, bid = service_ids.decode(ids.reshape(-1))
        if ids.size and (ids.min() < 0 or shard.max() >= self.num_shards):
            raise ValueError(
                f"update_priorities: ids ({ids.reshape(-1)[:3].tolist()} among them) must be ids this service's "
                f"samples returned (shards 0 to {self.num_shards - 1}); nothing was updated."
            )
        values = values.reshape(-1)
        refs = []
        for k in np.unique(shard):
            m = shard == k
            args = (bid[m], epoch[m], values[m])
            refs.append(("update_priorities", int(k), self.shards.actors[k].update_priorities.remote(*args), args))
        if not wait:
            self._updates.extend(refs)
            while len(self._updates) > self._max_in_flight:
                self._settle(self._updates.popleft())
            return None
        stale = sum(self._get(ref, k, method, args) for method, k, ref, args in refs)
        self._masses.clear()  # the shards' masses changed: the next request asks for them
        return stale

    # The rest of the API.
    def _max_window(self) -> int:
        return int(self._d["max_window"])

    def _num_frames(self) -> int:
        self._check_open("num_frames")
        self.flush()
        return int(sum(self._call_all("num_frames")))

    def _gather_all(self) -> Nest:
        """Every stored item, shard after shard along the time axis: `[batch_size, time, ...]`."""
        self._check_open("gather_all")
        self.flush()
        parts = self._call_all("gather_all")
        return tf.nest.pack_sequence_as(self._d["item_spec"], [np.concatenate(c, axis=1) for c in zip(*parts)])

    def _clear(self) -> None:
        self._check_open("clear")
        self.flush()
        self._call_all("clear")
        self._masses.clear()

    def close(self) -> None:
        """Sends what is pending; the owning client also stops the shards (and their checkpoint threads)."""
        if self._closed:
            return
        try:
            self.flush(updates=True)
        finally:
            self._closed = True
            if self._owner:
                stops = [actor.stop.remote() for actor in self.shards.actors]
                ray.wait(stops, num_returns=len(stops), timeout=30)
                for actor in self.shards.actors:
                    ray.kill(actor, no_restart=True)

    def _check_open(self, where: str) -> None:
        if self._closed:
            raise RuntimeError(f"{where}: the replay client is closed; start a new service or client.")

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
