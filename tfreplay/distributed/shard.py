"""One shard of the replay service: a NumPy-twin buffer inside a Ray actor.

`Shard` is a plain class; `client.start_service` runs it as a Ray actor
(`ray.remote(Shard).options(max_restarts=..., max_task_retries=-1)`). Every
method takes and returns flat lists of NumPy arrays and plain numbers, so
what crosses processes is array buffers (zero-copy through Ray's object
store when large), never pickled Python objects of the library.

Checkpoints: every `checkpoint_interval` seconds, if anything changed, a
thread writes `tf.train.Checkpoint(buffer=...)` (the pickle-free format of
`tfreplay/_src/checkpoint/`, written under the buffer's lock) to
`<state_dir>/shard-<i>/ckpt-<n>`, then replaces `latest.json`, which names it
and holds the shard's counters as of that write. A restarted actor (Ray
reruns the constructor) reloads it and starts the next *epoch*, kept in
`epoch.json`, so the ids it hands out differ from those of before (see
`ids.py`).

Loss: `accepted` counts the items a shard has taken since the service
started, carried over restarts by the checkpoint. Clients send with every
insert the largest `accepted` they saw from the shard (a *claim*); after a
restart, a claim from the epoch before tells how many acknowledged items
the shard had before it died: `lost = claim - accepted at the checkpoint`.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import threading
import time
import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay import buffers

BUFFER_CLASSES = {
    cls.__name__: cls
    for cls in (buffers.PyUniformReplayBuffer, buffers.PyPrioritizedReplayBuffer, buffers.PyFrameReplayBuffer)
}
_log = logging.getLogger("tfreplay.distributed")


def _write_json(path: str, value: dict) -> None:
    """Writes `value` so a reader sees the old file or the new one, never half of one."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


class Shard:
    """A buffer of class `kind` built from `args`/`kwargs`, checkpointed under `state_dir`.

    Args:
      index: this shard's number (bits 40-47 of its ids).
      kind: a name in `BUFFER_CLASSES`.
      args, kwargs: the buffer's constructor arguments.
      state_dir: where `shard-<index>/` keeps checkpoints and the epoch.
      checkpoint_interval: seconds between checkpoints (None: no checkpoints).
      resume: on the first start, reload a checkpoint left in `state_dir`
        (a restart always reloads; a fresh start otherwise wipes the folder).
      restarted: whether Ray restarted this actor (read from Ray when None).
      limiter: the name of the service's `ServiceLimiter` actor: told of every insert written.
    """

    def __init__(
        self,
        index: int,
        kind: str,
        args: tuple,
        kwargs: dict,
        state_dir: str,
        checkpoint_interval: float | None,
        resume: bool = False,
        restarted: bool | None = None,
        limiter: str | None = None,
    ):
        self._index, self._limiter_name = index, limiter
        self._buffer = BUFFER_CLASSES[kind](*args, **kwargs)
        self._lockstep = kwargs.get("batch_size") is not None
        self._lock = threading.RLock()
        self._dir = os.path.join(state_dir, f"shard-{index}")
        if restarted is None:
            import ray

            with warnings.catch_warnings():  # Ray reads its own deprecated actor_id here
                warnings.simplefilter("ignore", DeprecationWarning)
                restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if not (restarted or resume):
            shutil.rmtree(self._dir, ignore_errors=True)
        os.makedirs(self._dir, exist_ok=True)
        saved_epoch = _read_json(os.path.join(self._dir, "epoch.json")) or {}
        self._epoch = saved_epoch.get("epoch", -1) + 1
        # Every loss known before the last restart (a restart's claims may come after the last checkpoint).
        self._lost_known = int(saved_epoch.get("lost", 0))
        _write_json(os.path.join(self._dir, "epoch.json"), {"epoch": self._epoch, "lost": self._lost_known})
        self._accepted = self._since_clear = self._lost_before = self._saves = 0
        self._restored_at: float | None = None
        self._restore()
        self._lost_before = max(self._lost_before, self._lost_known)
        self._restored = self._accepted
        self._claimed = self._accepted
        self._saved_accepted, self._saved_clears, self._clears = self._accepted, 0, 0
        self._stop = threading.Event()
        self._thread = None
        if checkpoint_interval:
            self._thread = threading.Thread(target=self._checkpoint_loop, args=(checkpoint_interval,), daemon=True)
            self._thread.start()

    def describe(self) -> dict:
        return self.describe_buffer(self._buffer, self._lockstep)

    @staticmethod
    def describe_buffer(b: Any, lockstep: bool) -> dict:
        """What a client needs: specs (picklable `tf.TensorSpec` nests), sizes, kind."""
        frames = isinstance(b, buffers.PyFrameReplayBuffer)
        return {
            "data_spec": b.data_spec,
            "item_spec": b.transition_spec if frames else b.data_spec,
            "capacity": b.capacity,
            "batch_size": b.batch_size,
            "max_window": b.max_length - int(frames),  # a transition also needs the frame before it
            "lockstep": lockstep,
            "prioritized": isinstance(b, buffers.PyPrioritizedReplayBuffer),
        }

    def add(self, leaves: list, calls: list, claim: tuple, priorities: Any = None, admitted: Any = None) -> tuple:
        """Adds rows as `len(calls)` `add_batch` calls of `calls[i]` rows; `(epoch, accepted, lost)`.

        `priorities` (prioritized shards): one per row, set on the new items at once (Ape-X).
        `admitted`: the limiter's admission (Ray ran this call once it was given); the rows are settled here,
        before the call returns, so a client's `flush()` also means the limiter counted them.
        """
        ok = False
        try:
            result = self._add(leaves, calls, claim, priorities)
            ok = True
            return result
        finally:
            if self._limiter_name is not None and admitted is not None:
                import ray

                ray.get(ray.get_actor(self._limiter_name).settle.remote("insert", sum(calls), ok))

    def _add(self, leaves: list, calls: list, claim: tuple, priorities: Any) -> tuple:
        with self._lock:
            self._note_claim(claim)
            start = 0
            for rows in calls:
                batch = [x[start : start + rows] for x in leaves]
                self._buffer.add_batch(tf.nest.pack_sequence_as(self._buffer.data_spec, batch))
                start += rows
            if priorities is not None:
                new_ids = self._since_clear + np.arange(start, dtype=np.int64)
                self._buffer.update_priorities(new_ids, np.asarray(priorities, np.float64))
            self._accepted += start
            self._since_clear += start
            return self._epoch, self._accepted, self.lost()

    def sample(self, size: int, num_steps: int | None, admitted: Any = None) -> tuple:
        """`(leaves, buffer ids, probabilities in this shard, mass, epoch)`; no leaves when nothing can be drawn."""
        mass = float(self._buffer.sampling_mass(num_steps))
        if mass <= 0:
            return [], None, None, 0.0, self._epoch
        items, info = self._buffer.get_next(size, num_steps)
        return tf.nest.flatten(items), info.ids, info.probabilities, mass, self._epoch

    def mass(self, num_steps: int | None) -> float:
        return float(self._buffer.sampling_mass(num_steps))

    def update_priorities(self, buffer_ids: np.ndarray, epochs: np.ndarray, priorities: np.ndarray) -> int:
        """Updates this epoch's items; ids of an earlier epoch count as stale, like overwritten ones."""
        current = epochs == self._epoch
        stale = int((~current).sum())
        if current.any():
            with self._lock:
                stale += int(self._buffer.update_priorities(buffer_ids[current], priorities[current]))
        return stale

    def num_frames(self) -> int:
        return int(self._buffer.num_frames())

    def gather_all(self) -> list:
        return tf.nest.flatten(self._buffer.gather_all())

    def clear(self) -> None:
        with self._lock:
            self._buffer.clear()
            self._since_clear = 0
            self._clears += 1

    def info(self, claim: tuple = (0, 0)) -> dict:
        """The shard's counters: epoch, accepted, restored, lost, num_frames, checkpoints written."""
        with self._lock:
            self._note_claim(claim)
            return {
                "shard": self._index,
                "epoch": self._epoch,
                "accepted": self._accepted,
                "restored": self._restored,
                "restored_at": self._restored_at,
                "lost": self.lost(),
                "num_frames": self.num_frames(),
                "checkpoints": self._saves,
            }

    def lost(self) -> int:
        """Items acknowledged before restarts and not in the checkpoints reloaded (a lower bound)."""
        return self._lost_before + max(self._claimed - self._restored, 0)

    def checkpoint(self) -> str:
        """Writes a checkpoint now; returns its path prefix."""
        with self._lock:
            n = self._saves_total() + 1
            prefix = tf.train.Checkpoint(buffer=self._buffer).write(os.path.join(self._dir, f"ckpt-{n}"))
            meta = {
                "prefix": os.path.basename(prefix),
                "number": n,
                "accepted": self._accepted,
                "since_clear": self._since_clear,
                "lost": self.lost(),
                "time": time.time(),
            }
            _write_json(os.path.join(self._dir, "latest.json"), meta)
            self._saves += 1
            self._saved_accepted, self._saved_clears = self._accepted, self._clears
        for old in glob.glob(os.path.join(self._dir, "ckpt-*")):
            if not os.path.basename(old).startswith(f"ckpt-{n}."):
                os.remove(old)
        return prefix

    def stop(self, final_checkpoint: bool = False) -> None:
        """Stops the checkpoint thread (after a last checkpoint if asked)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if final_checkpoint:
            self.checkpoint()

    def _saves_total(self) -> int:
        meta = _read_json(os.path.join(self._dir, "latest.json"))
        return 0 if meta is None else int(meta["number"])

    def _note_claim(self, claim: tuple) -> None:
        """A client's count of acknowledged items from the epoch before; a new loss is made durable at once, so a
        second restart before the next checkpoint still counts it."""
        epoch, accepted = claim
        if epoch == self._epoch - 1 and int(accepted) > self._claimed:
            self._claimed = int(accepted)
            self._lost_known = self.lost()
            _write_json(os.path.join(self._dir, "epoch.json"), {"epoch": self._epoch, "lost": self._lost_known})

    def _restore(self) -> None:
        meta = _read_json(os.path.join(self._dir, "latest.json"))
        if meta is None:
            return
        path = os.path.join(self._dir, meta["prefix"])
        try:  # the layout record is checked before anything is copied in (tfreplay/_src/checkpoint/layout.py)
            tf.train.Checkpoint(buffer=self._buffer).restore(path).expect_partial()
        except Exception:  # a shard that cannot reload starts empty: its claims then count everything as lost
            _log.exception("shard %d: could not reload %s; starting empty", self._index, path)
            self._buffer.clear()
            return
        self._accepted, self._since_clear = int(meta["accepted"]), int(meta["since_clear"])
        self._lost_before, self._restored_at = int(meta["lost"]), float(meta["time"])

    def _checkpoint_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            if (self._accepted, self._clears) == (self._saved_accepted, self._saved_clears):
                continue
            try:
                self.checkpoint()
            except Exception:  # a full disk must not kill the shard; the next period tries again
                _log.exception("shard %d: checkpoint failed", self._index)
