"""The client of the replay service: one `ReplayBuffer` over the shard actors.

Inserts: `add_batch` validates the batch here (so a bad one raises at the
caller and reaches no shard), appends it to the routed shard's pending
batch, and sends a shard's pending rows as one call once `send_batch_size`
rows or `send_delay` seconds have gathered. Sends are asynchronous: at most
`max_in_flight` wait for their acknowledgement. `flush()` sends and waits;
every read (`get_next`, `num_frames`, ...) flushes first, so a client reads
its own writes.

Sampling (`sampling.py`): draws split over shards in proportion to their
sampling masses, each sample's probability exact in `BufferInfo.probabilities`.

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

from tfreplay._src import specs
from tfreplay._src.api import ReplayBuffer
from tfreplay._src.rate_limiting.limiter import BufferClosedError
from tfreplay._src.specs import Nest
from tfreplay._src.write import check_priorities
from tfreplay.distributed import ids as service_ids
from tfreplay.distributed.sampling import Sampling

_log = logging.getLogger("tfreplay.distributed")
_RETRIED = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)


class Shards:
    """A picklable handle of a service's shard actors: give it to collectors; each makes its own client.

    Args:
      actors: the shard actor handles, shard `i` at index `i`.
      description: `Shard.describe()` of the shards (all alike).
      limiter: the service's `ServiceLimiter` actor, or None.
    """

    def __init__(self, actors: list, description: dict, limiter: Any = None):
        self.actors = list(actors)
        self.description = description
        self.limiter = limiter

    def __len__(self) -> int:
        return len(self.actors)


class ReplayClient(Sampling, ReplayBuffer):
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
        self._admissions: dict[str, Any] = {}  # the last rate-limiter admission per side
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
        admitted = self._admit("insert", sum(pending["calls"]))
        args = (leaves, pending["calls"], self._seen[shard], priorities, admitted)
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

    def _admit(self, side: str, n: int) -> Any:
        """The limiter's admission of `n` inserts or samples (an ObjectRef), chained after this client's last."""
        limiter = self.shards.limiter
        if limiter is None:
            return None
        ref = limiter.admit.remote(side, n, self._admissions.get(side))
        self._admissions[side] = ref
        return ref

    # Calls and faults.
    def _get(self, ref: Any, shard: int, method: str, args: tuple) -> Any:
        """`ray.get(ref)`; on an actor error, resends `method(*args)` to the shard until `retry_timeout`."""
        deadline = time.monotonic() + self._retry_timeout
        delay = 0.05
        while True:
            try:
                return ray.get(ref)
            except ray.exceptions.RayTaskError as err:  # what the shard or the limiter raised, as it was raised
                self._admissions.clear()  # a failed admission must not fail the next ones of the chain
                raise (err.cause if isinstance(err.cause, Exception) else err) from None
            except _RETRIED:
                if self._closed and self._owner:
                    raise BufferClosedError(f"{method}: the replay client is closed; its shards are stopped.") from None
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
        limiter = self.shards.limiter
        return {
            "rate_limiter": None if limiter is None else ray.get(limiter.info.remote()),
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
        if self.shards.limiter is not None:
            ray.get(self.shards.limiter.reset.remote())

    def close(self) -> None:
        """Sends what is pending; the owning client also stops the shards (and their checkpoint threads)."""
        if self._closed:
            return
        try:
            self.flush(updates=True)
        finally:
            self._closed = True
            if self._owner:
                if self.shards.limiter is not None:  # wakes every admission still waiting
                    ray.get(self.shards.limiter.close.remote())
                    ray.kill(self.shards.limiter, no_restart=True)
                stops = [actor.stop.remote() for actor in self.shards.actors]
                ray.wait(stops, num_returns=len(stops), timeout=30)
                for actor in self.shards.actors:
                    ray.kill(actor, no_restart=True)
                _wait_dead(self.shards.actors, time.monotonic() + 30)

    def _check_open(self, where: str) -> None:
        if self._closed:
            raise BufferClosedError(f"{where}: the replay client is closed (close() was called); nothing was done.")

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _wait_dead(actors: list, deadline: float) -> None:
    """Returns once every actor is gone (`ray.kill` only asks), or at the deadline."""
    for actor in actors:
        while time.monotonic() < deadline:
            try:
                ping = actor.num_frames.options(max_task_retries=0).remote()  # not resent to a dead shard
                ray.get(ping, timeout=max(deadline - time.monotonic(), 0.01))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                break
            time.sleep(0.05)
