"""Frame replay (issue 4): memory per transition, and sampling speed against
the uniform buffer holding pre-stacked observations.

Run: `python -m benchmarks.frames [--quick] [--repeats N] [--block SECONDS]`.
A full run allocates one real 1M-frame Atari buffer (about 7.1 GB) and takes
a few minutes; `--quick` skips it.

Memory
  `TFFrameReplayBuffer(frame_data_spec((84, 84)), batch_size=1, max_length=1_000_000, history_len=4)`:
  `nbytes / capacity` (bytes per stored frame) and the process's RSS growth
  while it is built (after, and the peak sampled every millisecond). A
  transition costs one row, plus one row per episode for its first frame:
  bytes per transition = bytes per row * (1 + 1 / episode length). The
  pre-stacked alternative's size is computed from its spec, not allocated.

Sampling (batches of 32 transitions, history_len=4, times per `get_next` call)
  baseline  `TFUniformReplayBuffer` with `{observation: u8[84,84,4],
            next_observation: u8[84,84,4], action, reward, terminated, truncated}`,
            4 segments x 5,000 rows, filled with `add_batch`;
  subject   `TFFrameReplayBuffer` with `frame_data_spec((84, 84))`, 4 segments
            x 5,000 rows, filled with `add_batch` (episodes of 500 steps).
  Both are timed in alternating blocks (`benchmarks.timing.compare`), so load
  from other processes hits both; "x" is baseline time / subject time (above 1:
  the frame buffer is faster). Also: the NumPy twins, `num_steps=2` windows,
  a dataset's `next()`, and the 1M
  buffer (its counters set directly, frames left zero: that measures sampling
  over 7 GB of real pages without a 1M-call fill). A last row times NumPy's
  random reads alone (`read_floors`): what any frame sampler must read,
  against what the uniform buffer reads.
"""

from __future__ import annotations

import argparse
import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.memory import PeakSampler, rss_bytes  # noqa: E402
from benchmarks.timing import Bench, compare  # noqa: E402
from tfreplay import (  # noqa: E402
    PyFrameReplayBuffer,
    PyUniformReplayBuffer,
    TFFrameReplayBuffer,
    TFUniformReplayBuffer,
    frame_data_spec,
)
from tfreplay._src.episodes import POS_BINS  # noqa: E402

SEGMENTS, ROWS, BATCH, HISTORY, EPISODE = 4, 5_000, 32, 4, 500
GB = 1e9


def stacked_spec() -> dict:
    stack = tf.TensorSpec([84, 84, HISTORY], tf.uint8)
    rest = {k: v for k, v in frame_data_spec().items() if k not in ("frame", "first")}
    return {"observation": stack, "next_observation": stack, **rest}


def step_rows(rng: np.random.Generator, i: int, stacked: bool) -> dict:
    """Row `i` of every segment: a frame (or two stacks) and the step's entries."""
    rows = {
        "action": rng.integers(0, 6, SEGMENTS).astype(np.int32),
        "reward": rng.normal(size=SEGMENTS).astype(np.float32),
        "terminated": np.full(SEGMENTS, i % EPISODE == EPISODE - 1),
        "truncated": np.zeros(SEGMENTS, bool),
    }
    if stacked:
        stacks = rng.integers(0, 256, (2, SEGMENTS, 84, 84, HISTORY), dtype=np.uint8)
        return {"observation": stacks[0], "next_observation": stacks[1], **rows}
    first = np.full(SEGMENTS, i % EPISODE == 0)
    frame = rng.integers(0, 256, (SEGMENTS, 84, 84), dtype=np.uint8)
    return {"frame": frame, "first": first, **rows}


def filled(make, stacked: bool):
    rb = make()
    rng = np.random.default_rng(0)
    for i in range(ROWS):
        rb.add_batch(step_rows(rng, i, stacked))
    return rb


def sampling_rows(repeats: int, block: float) -> list:
    frames_tf = filled(lambda: TFFrameReplayBuffer(frame_data_spec(), SEGMENTS, ROWS, HISTORY, seed=0), False)
    uniform_tf = filled(lambda: TFUniformReplayBuffer(stacked_spec(), SEGMENTS, ROWS, seed=0), True)
    frames_py = filled(
        lambda: PyFrameReplayBuffer(
            frame_data_spec(), batch_size=SEGMENTS, max_length=ROWS, history_len=HISTORY, seed=0
        ),
        False,
    )
    uniform_py = filled(
        lambda: PyUniformReplayBuffer(stacked_spec(), batch_size=SEGMENTS, max_length=ROWS, seed=0), True
    )
    frames_ds = iter(frames_tf.as_dataset(BATCH).prefetch(0))
    uniform_ds = iter(uniform_tf.as_dataset(BATCH).prefetch(0))
    cases = [
        ("TF get_next(32)", lambda: frames_tf.get_next(BATCH), lambda: uniform_tf.get_next(BATCH)),
        (
            "TF get_next(32, num_steps=2)",
            lambda: frames_tf.get_next(BATCH, num_steps=2),
            lambda: uniform_tf.get_next(BATCH, num_steps=2),
        ),
        ("TF dataset next()", lambda: next(frames_ds), lambda: next(uniform_ds)),
        ("Py get_next(32)", lambda: frames_py.get_next(BATCH), lambda: uniform_py.get_next(BATCH)),
    ]
    out = []
    for name, subject, baseline in cases:
        ours, base = compare(Bench(subject), Bench(baseline), repeats, block)
        out.append((name, ours.median, base.median, ours.spread))
    return out, uniform_tf


def read_floors(repeats: int, block: float) -> list:
    """NumPy's random reads alone: the frames a batch shows against the uniform buffer's rows.

    A batch of 32 shows 160 frames of 7 KB (history_len + 1 per transition);
    the uniform buffer reads 64 rows of 28 KB (observation and next
    observation). Fresh random rows every call, from arrays the size of the
    benchmark's buffers, so the reads come from memory, not cache.
    """
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (SEGMENTS * ROWS + 1, 84, 84), dtype=np.uint8)
    stacks = rng.integers(0, 256, (SEGMENTS * ROWS, 84, 84, HISTORY), dtype=np.uint8)
    frame_rows = BATCH * (HISTORY + 1)
    ours, base = compare(
        Bench(lambda: frames.take(rng.integers(0, len(frames), frame_rows), axis=0)),
        Bench(lambda: stacks.take(rng.integers(0, len(stacks), 2 * BATCH), axis=0)),
        repeats,
        block,
    )
    return [(f"NumPy take: {frame_rows} frames vs {2 * BATCH} stacks", ours.median, base.median, ours.spread)]


def big_buffer(repeats: int, block: float, baseline) -> tuple[list, list]:
    """Allocates the 1M-frame buffer once: its memory, then its sampling speed."""
    gc.collect()
    before = rss_bytes()
    with PeakSampler() as sampler:
        rb = TFFrameReplayBuffer(frame_data_spec(), batch_size=1, max_length=1_000_000, history_len=HISTORY, seed=0)
    created, peak = rss_bytes() - before, sampler.peak - before
    # Counters as if every row had been added in episodes of EPISODE steps (frames stay zero).
    pos = (np.arange(1_000_000) % (EPISODE + 1)).astype(np.int32)
    rb._pos.assign(pos)
    rb._num_adds.assign([1_000_000])
    rb._pos_counts.assign([np.bincount(np.minimum(pos, POS_BINS - 1), minlength=POS_BINS)])
    rb._newest.assign([[pos[-1], 0]])
    per_row = rb.nbytes / rb.capacity
    memory = [
        ("frame buffer, bytes per row (nbytes / capacity)", f"{per_row:,.1f}"),
        (f"bytes per transition, episodes of {EPISODE} steps", f"{per_row * (1 + 1 / EPISODE):,.1f}"),
        (f"1M transitions (episodes of {EPISODE}), GB", f"{per_row * (1 + 1 / EPISODE) * 1e6 / GB:.3f}"),
        ("1M-frame buffer nbytes, GB", f"{rb.nbytes / GB:.3f}"),
        ("RSS growth while building it, GB (after / peak)", f"{created / GB:.3f} / {peak / GB:.3f}"),
        ("pre-stacked obs + next_obs, bytes per transition", f"{_spec_bytes(stacked_spec()):,}"),
        ("pre-stacked obs + next_obs, 1M transitions, GB", f"{_spec_bytes(stacked_spec()) * 1e6 / GB:.1f}"),
    ]
    ours, base = compare(Bench(lambda: rb.get_next(BATCH)), Bench(lambda: baseline.get_next(BATCH)), repeats, block)
    speed = [("TF get_next(32), 1M-frame buffer", ours.median, base.median, ours.spread)]
    return memory, speed


def _spec_bytes(spec: dict) -> int:
    return sum(s.shape.num_elements() * s.dtype.size for s in tf.nest.flatten(spec))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 1M-frame buffer")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--block", type=float, default=0.3, help="seconds per timed block")
    args = parser.parse_args()
    speed, baseline = sampling_rows(args.repeats, args.block)
    speed += read_floors(args.repeats, args.block)
    memory = []
    if not args.quick:
        memory, big = big_buffer(args.repeats, args.block, baseline)
        speed += big
    print(
        f"Sampling {BATCH} transitions, history_len={HISTORY}; baseline: the uniform buffer of the same "
        "family (TF or Py) on pre-stacked observation and next_observation."
    )
    print(f"{'case':<36} {'frames µs':>10} {'uniform µs':>11} {'x (uniform/frames)':>19} {'noise':>7}")
    for name, ours, base, spread in speed:
        print(f"{name:<36} {ours * 1e6:>10.0f} {base * 1e6:>11.0f} {base / ours:>19.2f} {spread / 2:>6.0%}")
    if memory:
        print("\nMemory (Atari frames u8[84, 84], history_len=4)")
        for name, value in memory:
            print(f"{name:<52} {value:>16}")


if __name__ == "__main__":
    main()
