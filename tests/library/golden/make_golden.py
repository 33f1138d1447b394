"""Writes the golden checkpoints of format 1 (`python tests/golden/make_golden.py`), once per format.

Each public buffer is filled past wrap-around (frame buffers with several
episodes, prioritized ones with updated priorities), saved with
`tf.train.Checkpoint(buffer=rb).write`, and what it shows is recorded beside
the checkpoint: `gather_all`, `num_frames`, and the samples it draws next (the
generator is part of the checkpoint). `test_golden_checkpoints.py` restores each
into a new buffer and expects exactly the recorded values, so a change that
breaks format 1 or the meaning of a seed fails there. Only the public API is used.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfreplay  # noqa: E402

HERE = pathlib.Path(__file__).parent
SPEC = {
    "observation": tf.TensorSpec([3], tf.float32),
    "action": tf.TensorSpec([], tf.int32),
    "step_type": tf.TensorSpec([], tf.int32),
    "id": tf.TensorSpec([], tf.int64),
}
FRAME_SPEC = tfreplay.frame_data_spec((2, 3))
BATCH, LENGTH, ADDS = 2, 8, 13  # 13 adds into 8 rows per segment: wrapped around


def rows(k: int, batch: int) -> dict:
    """Add `k` of a rows buffer: ids `k * batch + [0, batch)`, an episode start every 4 steps."""
    ids = k * batch + np.arange(batch, dtype=np.int64)
    return {
        "observation": np.stack([ids, -ids, ids * 0.5], -1).astype(np.float32),
        "action": (ids % 5).astype(np.int32),
        "step_type": np.full([batch], 0 if k % 4 == 0 else 1, np.int32),
        "id": ids,
    }


def frames(k: int, batch: int) -> dict:
    """Add `k` of a frame buffer: an episode starts every 5 steps; frames tell segment and step."""
    segment = np.arange(batch)
    frame = np.zeros([batch, 2, 3], np.uint8)
    frame[:, 0, 0], frame[:, 0, 1], frame[:, 1, :] = segment + 1, k + 1, (k * 7 + segment[:, None] * 3) % 250
    first = np.full([batch], k % 5 == 0)
    return {
        "frame": frame,
        "first": first,
        "action": np.where(first, 0, (k + segment) % 4).astype(np.int32),
        "reward": np.where(first, 0.0, k * 0.25 + segment).astype(np.float32),
        "terminated": np.full([batch], k % 5 == 4),
        "truncated": np.zeros([batch], bool),
    }


# name -> (constructor, add, prioritized)
CASES = {
    "tf_uniform": (lambda: tfreplay.TFUniformReplayBuffer(SPEC, BATCH, LENGTH, seed=7), rows, False),
    "py_uniform": (
        lambda: tfreplay.PyUniformReplayBuffer(SPEC, batch_size=BATCH, max_length=LENGTH, seed=7),
        rows,
        False,
    ),
    "tf_uniform_episodes": (
        lambda: tfreplay.TFUniformReplayBuffer(
            SPEC, BATCH, LENGTH, seed=7, within_episodes=True, rate_limiter=tfreplay.MinSize(3)
        ),
        rows,
        False,
    ),
    "py_uniform_one_ring": (lambda: tfreplay.PyUniformReplayBuffer(SPEC, 16, seed=7), rows, False),
    "tf_prioritized": (lambda: tfreplay.TFPrioritizedReplayBuffer(SPEC, BATCH, LENGTH, alpha=0.7, seed=7), rows, True),
    "py_prioritized": (
        lambda: tfreplay.PyPrioritizedReplayBuffer(SPEC, batch_size=BATCH, max_length=LENGTH, alpha=0.7, seed=7),
        rows,
        True,
    ),
    "tf_frames": (
        lambda: tfreplay.TFFrameReplayBuffer(FRAME_SPEC, BATCH, LENGTH, history_len=2, seed=7),
        frames,
        False,
    ),
    "py_frames": (
        lambda: tfreplay.PyFrameReplayBuffer(FRAME_SPEC, batch_size=BATCH, max_length=LENGTH, history_len=2, seed=7),
        frames,
        False,
    ),
    "tf_prioritized_frames": (
        lambda: tfreplay.TFPrioritizedFrameReplayBuffer(FRAME_SPEC, BATCH, LENGTH, history_len=2, alpha=0.7, seed=7),
        frames,
        True,
    ),
    "py_prioritized_frames": (
        lambda: tfreplay.PyPrioritizedFrameReplayBuffer(
            FRAME_SPEC, batch_size=BATCH, max_length=LENGTH, history_len=2, alpha=0.7, seed=7
        ),
        frames,
        True,
    ),
}


def fill(name: str):
    make, add, prioritized = CASES[name]
    rb = make()
    batch = 1 if name.endswith("one_ring") else BATCH
    for k in range(ADDS if batch > 1 else 2 * ADDS):
        rb.add_batch(add(k, batch))
    if prioritized:
        _, info = rb.get_next(6)
        ids = np.asarray(info.ids)
        rb.update_priorities(ids, np.linspace(0.5, 3.0, ids.size))
    return rb


def observe(rb) -> dict:
    """What a restored buffer must show: every stored item, the count, and the next samples."""
    out = {"num_frames": np.asarray(rb.num_frames())}
    for path, x in zip(_paths(rb.gather_all()), tf.nest.flatten(rb.gather_all())):
        out[f"all/{path}"] = np.asarray(x)
    for i, num_steps in enumerate([None, None, 2]):
        if isinstance(rb, (tfreplay.TFPrioritizedFrameReplayBuffer, tfreplay.PyPrioritizedFrameReplayBuffer)):
            num_steps = None  # transitions only
        items, info = rb.get_next(4, num_steps=num_steps)
        for path, x in zip(_paths(items), tf.nest.flatten(items)):
            out[f"sample{i}/{path}"] = np.asarray(x)
        out[f"sample{i}/ids"] = np.asarray(info.ids)
        out[f"sample{i}/probabilities"] = np.asarray(info.probabilities)
    return out


def _paths(nest) -> list:
    """Leaf names in `tf.nest.flatten` order (sorted keys), so an item's structure is pinned too."""
    if isinstance(nest, dict):
        return [f"{k}/{p}" if p else str(k) for k in sorted(nest) for p in _paths(nest[k])]
    if isinstance(nest, (tuple, list)):
        return [f"{i}/{p}" if p else str(i) for i, x in enumerate(nest) for p in _paths(x)]
    return [""]


def main() -> None:
    for name in CASES:
        folder = HERE / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        rb = fill(name)
        tf.train.Checkpoint(buffer=rb).write(str(folder / "ckpt"))
        np.savez(folder / "expected.npz", **observe(rb))
        print(f"wrote {folder}")


if __name__ == "__main__":
    sys.exit(main())
