"""The item store: one table's items, its selectors, its rate limiter and the lock they share.

Items (`items.py`) hold slices of shared steps, as Reverb's chunks, so
overlapping items cost no memory for the steps they share, and removing an
item (by the remover when full, by `max_times_sampled`, by
`mutate_priorities(deletes=)`) frees what no other item holds. The table
counts the episodes its items cover (`num_episodes`) and those whose last
item went (`num_deleted_episodes`).

Every call takes the table's condition variable; a call the rate limiter
does not admit waits on it (with a deadline if given) and every change wakes
the waiters. A writer's items go through a queue instead (`enqueue`): each
goes in as soon as the rate limiter admits it, in order, when a sample or a
removal makes room, and the writer's `flush` waits for its own. A priority,
a key and an item are checked before anything changes. `Server.stop()`
closes the table:
waiting calls then raise and queued items are dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from tfreplay._src import specs
from tfreplay.compat.reverb.engine import items, rate_limiters, selectors
from tfreplay.compat.reverb.engine.items import Column, Item, Ticket, check_columns, check_key, new_key
from tfreplay.compat.reverb.errors import DeadlineExceededError, ServerStoppedError

MAX_DRAWS_PER_CALL = 1024  # the most draws one `sample_many` takes under the lock


@dataclasses.dataclass
class TableInfo:
    """What `Client.server_info()[name]` and `Table.info` report (Reverb's fields)."""

    name: str
    sampler_options: selectors.SelectorOptions
    remover_options: selectors.SelectorOptions
    max_size: int
    max_times_sampled: int
    rate_limiter_info: rate_limiters.RateLimiterInfo
    signature: Any
    current_size: int
    num_episodes: int
    num_deleted_episodes: int
    num_unique_samples: int
    table_worker_time: Any = None


class Table:
    """A table of items: sampled by `sampler`, removed by `remover` when `max_size` is reached.

    Args:
      name: a non-empty name, unique on its server.
      sampler, remover: `reverb.selectors` settings.
      max_size: the most items held.
      rate_limiter: a `reverb.rate_limiters` setting.
      max_times_sampled: an item is removed after this many draws (0: never).
      extensions: not supported (must be empty).
      signature: a nest of `tf.TensorSpec`, each an item column's shape (time axis included) and dtype.
    """

    def __init__(
        self,
        name: str,
        sampler: selectors.Selector,
        remover: selectors.Selector,
        max_size: int,
        rate_limiter: rate_limiters.RateLimiter,
        max_times_sampled: int = 0,
        extensions: Sequence[Any] = (),
        signature: Any = None,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"Table: name ({name!r}) must be a non-empty string.")
        where = f"Table {name!r}"
        self._sampler_setting = selectors.check(where, "sampler", sampler)
        self._remover_setting = selectors.check(where, "remover", remover)
        if not isinstance(rate_limiter, rate_limiters.RateLimiter):
            raise TypeError(f"{where}: rate_limiter ({rate_limiter!r}) must be one of reverb.rate_limiters.")
        specs.check_positive_int(where, "max_size", max_size)
        self.max_size = int(max_size)
        self.max_times_sampled = max(int(max_times_sampled), 0)  # below 1: no limit, as Reverb
        if extensions:
            raise ValueError(f"{where}: extensions ({extensions!r}) are not supported by tfreplay.compat.reverb.")
        if signature is not None:
            for spec in tf.nest.flatten(signature):
                if not isinstance(spec, tf.TensorSpec):
                    raise TypeError(f"{where}: signature leaf ({spec!r}) must be a tf.TensorSpec.")
        self._name, self._limiter, self._signature = name, rate_limiter, signature
        self._cond = threading.Condition()
        self._rng = np.random.default_rng()
        self._closed = False
        self._clear()

    @classmethod
    def queue(cls, name: str, max_size: int, extensions: Sequence[Any] = (), signature: Any = None) -> Table:
        """A queue: Fifo in and out, each item sampled once; inserts wait while `max_size` items are unsampled."""
        return cls(
            name, selectors.Fifo(), selectors.Fifo(), max_size, rate_limiters.Queue(max_size), 1, extensions, signature
        )

    @classmethod
    def stack(cls, name: str, max_size: int, extensions: Sequence[Any] = (), signature: Any = None) -> Table:
        """A stack: Lifo in and out, each item sampled once; inserts wait while `max_size` items are unsampled."""
        return cls(
            name, selectors.Lifo(), selectors.Lifo(), max_size, rate_limiters.Stack(max_size), 1, extensions, signature
        )

    def replace(self, **overrides: Any) -> Table:
        """A new, empty table with this one's settings, some replaced (`name=`, `max_size=`, ...)."""
        settings = dict(
            name=self._name,
            sampler=self._sampler_setting,
            remover=self._remover_setting,
            max_size=self.max_size,
            rate_limiter=self._limiter,
            max_times_sampled=self.max_times_sampled,
            signature=self._signature,
        )
        unknown = set(overrides) - set(settings) - {"extensions"}
        if unknown:
            raise TypeError(f"Table.replace: unknown settings {sorted(unknown)}; valid: {sorted(settings)}.")
        settings.update({k: v for k, v in overrides.items() if v is not None})
        return Table(**settings)

    @property
    def name(self) -> str:
        return self._name

    @property
    def signature(self) -> Any:
        return self._signature

    @property
    def info(self) -> TableInfo:
        with self._cond:
            return TableInfo(
                self._name,
                self._sampler_setting.options,
                self._remover_setting.options,
                self.max_size,
                self.max_times_sampled,
                self._counts.info(),
                self._signature,
                len(self._items),
                len(self._episodes),
                self._deleted_episodes,
                self._unique_samples,
            )

    def can_sample(self, num_samples: int) -> bool:
        """Whether `num_samples` samples would be admitted now."""
        with self._cond:
            return bool(self._items) and self._counts.can_sample(len(self._items), num_samples)

    def can_insert(self, num_inserts: int) -> bool:
        """Whether `num_inserts` inserts would be admitted now."""
        with self._cond:
            return self._counts.can_insert(len(self._items), num_inserts)

    def __repr__(self) -> str:
        return (
            f"Table(name={self._name!r}, sampler={self._sampler_setting!r}, remover={self._remover_setting!r}, "
            f"max_size={self.max_size}, max_times_sampled={self.max_times_sampled}, rate_limiter={self._limiter!r})"
        )

    # The server's side (Client, TFClient, the writers and the datasets call these).
    def _clear(self) -> None:
        self._items: dict[int, Item] = {}
        self._sampler, self._remover = self._sampler_setting.build(), self._remover_setting.build()
        self._counts = self._limiter.build()
        self._unique_samples = 0
        self._episodes: collections.Counter = collections.Counter()  # episode id -> items that cover it
        self._deleted_episodes = 0
        if not hasattr(self, "_pending"):  # a reset keeps the writers' queued items
            self._pending: collections.deque[Ticket] = collections.deque()

    def _wait(self, admitted: Callable[[], bool], timeout: float | None, what: str) -> None:
        """Waits (holding the condition) until `admitted()`; raises on timeout or when the server stops."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                raise ServerStoppedError(f"Table {self._name!r}: the server was stopped; the {what} did not happen.")
            if admitted():
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise DeadlineExceededError(
                    f"Table {self._name!r}: the rate limiter did not admit the {what} within {timeout:g} s "
                    f"(size {len(self._items)}, {self._counts.info()})."
                )
            self._cond.wait(1.0 if left is None else min(left, 1.0))  # wakes to see a stop without a notify

    def checked_priority(self, where: str, priority: Any, name: str = "priority") -> float:
        """`priority` as a float, or ValueError: it must be finite, >= 0, and its selectors' weight finite."""
        return checked_priority(where, priority, name, self._name, (self._sampler_setting, self._remover_setting))

    def insert(self, item: Item, timeout: float | None = None) -> None:
        """Inserts `item` once the rate limiter admits it (an existing key: its priority and data are replaced)."""
        self.checked_priority(f"Table {self._name!r}: insert", item.priority)
        with self._cond:
            self._wait(lambda: not self._pending and self._counts.can_insert(len(self._items), 1), timeout, "insert")
            self._put(item)
            self._changed()

    def enqueue(self, item: Item) -> Ticket:
        """Queues `item` (its priority checked by the caller) to go in when admitted; it may go in at once."""
        with self._cond:
            if self._closed:
                raise ServerStoppedError(f"Table {self._name!r}: the server was stopped; the insert did not happen.")
            ticket = Ticket(item)
            self._pending.append(ticket)
            self._changed()
            return ticket

    def wait_for(self, ticket: Ticket, timeout: float | None, what: str = "insert") -> None:
        """Waits until `ticket`'s item is in (DeadlineExceededError after `timeout` seconds; it stays queued)."""
        with self._cond:
            if not ticket.done:  # an item in before a stop counts as in
                self._wait(lambda: ticket.done, timeout, what)

    def _put(self, item: Item) -> None:
        """Puts `item` in (lock held); past `max_size`, the remover then removes one item, which may be the new one
        (a Lifo remover does)."""
        if item.key in self._items:
            self._drop(item.key)
        self._items[item.key] = item
        self._sampler.insert(item.key, item.priority)
        self._remover.insert(item.key, item.priority)
        self._counts.inserts += 1
        for episode in item.episodes:
            self._episodes[episode] += 1
        if len(self._items) > self.max_size:  # as Reverb: the remover chooses among all, the new item included
            self._drop(self._remover.select(self._rng)[0])

    def _changed(self) -> None:
        """After a change (lock held): queued items the rate limiter now admits go in, and waiters wake."""
        while self._pending and not self._closed and self._counts.can_insert(len(self._items), 1):
            ticket = self._pending.popleft()
            self._put(ticket.item)
            ticket.done = True
        self._cond.notify_all()

    def sample(self, timeout: float | None = None) -> tuple[Item, tuple]:
        """Draws one item: `(item, (key, probability, table_size, priority, times_sampled))`."""
        return self.sample_many(1, timeout)[0]

    def sample_many(self, n: int, timeout: float | None = None) -> list[tuple[Item, tuple]]:
        """Waits for one draw, then takes up to `n - 1` more while the rate limiter admits them at once (a
        dataset's samples in flight, under one lock)."""
        with self._cond:
            self._wait(self._can_draw, timeout, "sample")
            draws = [self._draw()]
            while len(draws) < min(n, MAX_DRAWS_PER_CALL) and self._can_draw():
                draws.append(self._draw())
            self._changed()
            return draws

    def _can_draw(self) -> bool:
        return bool(self._items) and self._counts.can_sample(len(self._items), 1)

    def _draw(self) -> tuple[Item, tuple]:
        key, probability = self._sampler.select(self._rng)
        item = self._items[key]
        item.times_sampled += 1
        self._unique_samples += item.times_sampled == 1
        self._counts.samples += 1
        info = (key, probability, len(self._items), item.priority, item.times_sampled)
        if self.max_times_sampled and item.times_sampled >= self.max_times_sampled:
            self._drop(key)
        return item, info

    def _drop(self, key: int) -> None:
        item = self._items.pop(key)
        self._sampler.delete(key)
        self._remover.delete(key)
        self._counts.deletes += 1
        for episode in item.episodes:
            self._episodes[episode] -= 1
            if not self._episodes[episode]:
                del self._episodes[episode]
                self._deleted_episodes += 1

    def mutate(self, updates: dict, deletes: Sequence[int]) -> None:
        """Sets the priorities of `updates`' keys, then removes `deletes`' keys; unknown keys are ignored. Every
        key and priority is checked first: a refused call changes nothing."""
        where = f"Table {self._name!r}: mutate_priorities"
        weights = {
            check_key(where, key): self.checked_priority(where, priority, f"priority of key {key}")
            for key, priority in updates.items()
        }
        doomed = [check_key(where, key) for key in deletes]
        with self._cond:
            for key, priority in weights.items():
                item = self._items.get(key)
                if item is not None:
                    item.priority = priority
                    self._sampler.update(item.key, item.priority)
                    self._remover.update(item.key, item.priority)
            for key in doomed:
                if key in self._items:
                    self._drop(key)
            self._changed()

    def reset(self) -> None:
        with self._cond:
            self._clear()
            self._changed()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def snapshot(self) -> tuple[list[Item], dict]:
        """The items in insertion order and the counts, for a checkpoint."""
        with self._cond:
            c = self._counts
            counts = {"inserts": c.inserts, "samples": c.samples, "deletes": c.deletes}
            counts.update(deleted_episodes=self._deleted_episodes, unique_samples=self._unique_samples)
            return list(self._items.values()), counts

    def restore(self, items: list[Item], counts: dict) -> None:
        """Replaces the table's items and counts with checked ones (a checkpoint's)."""
        with self._cond:
            self._clear()
            for item in items:
                self._items[item.key] = item
                self._sampler.insert(item.key, item.priority)
                self._remover.insert(item.key, item.priority)
                for episode in item.episodes:
                    self._episodes[episode] += 1
            self._counts.inserts, self._counts.samples = counts["inserts"], counts["samples"]
            self._counts.deletes = counts["deletes"]
            self._deleted_episodes = counts.get("deleted_episodes", 0)
            self._unique_samples = counts.get("unique_samples", 0)
            self._changed()


def checked_priority(where: str, priority: Any, name: str, table: str, settings: Sequence[Any]) -> float:
    """`priority` as a float, or ValueError: finite, >= 0, and a finite weight for each selector of `settings`."""
    if isinstance(priority, np.number):
        priority = priority.item()
    items.check_priority(where, priority, name)
    for selector in settings:
        rule = selector._priority_rule(float(priority))
        if rule is not None:
            raise ValueError(f"{where}: {name} ({priority!r}) must be {rule} (table {table!r}).")
    return float(priority)


def insert_step(
    where: str, targets: Sequence[tuple[Table, Any]], values: Sequence[Any], put: Callable | None = None
) -> None:
    """Inserts one step (`values`: one array a column) as one item, under one key, into each `(table, priority)`
    of `targets` (`Client.insert`, `TFClient.insert`) with `put(table, item)` (None: `table.insert(item)`,
    which waits for the rate limiter). Every signature and priority is checked before the first insert, so a
    refused call changes no table."""
    columns = tuple(Column((np.array(v),), False) for v in values)
    weights = []
    for table, priority in targets:
        check_columns(f"{where} (table {table.name!r})", table.signature, columns, step_shapes=True)
        weights.append(table.checked_priority(f"{where} (table {table.name!r})", priority))
    key, episode = new_key(), new_key()  # one step: an episode of its own, as Reverb's insert
    for (table, _), weight in zip(targets, weights):
        item = Item(key, weight, columns, episodes=(episode,))
        table.insert(item) if put is None else put(table, item)
