"""The public buffers: each a storage and a sampler assembled on a twin.

| class | twin | storage | sampler |
|---|---|---|---|
| `TFUniformReplayBuffer` | `tf.Variable`s | rows | uniform |
| `PyUniformReplayBuffer` | NumPy arrays | rows | uniform |
| `TFFrameReplayBuffer` | `tf.Variable`s | frames (each once) | uniform over valid transitions |
| `PyFrameReplayBuffer` | NumPy arrays | frames (each once) | uniform over valid transitions |
| `TFPrioritizedReplayBuffer` | `tf.Variable`s | rows | proportional prioritized (sum tree) |
| `PyPrioritizedReplayBuffer` | NumPy arrays | rows | proportional prioritized (sum tree) |
| `TFPrioritizedFrameReplayBuffer` | `tf.Variable`s | frames (each once) | prioritized over valid transitions |
| `PyPrioritizedFrameReplayBuffer` | NumPy arrays | frames (each once) | prioritized over valid transitions |

Each is a thin subclass of the one `Buffer` class (`tfreplay.compose.Buffer`):
its constructor picks the twin, storage and sampler. A new kind of buffer is
a new sampler or storage passed the same way (see `tfreplay.compose`).
"""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

from tfreplay._src.backends.numpy import NumpyTwin, numpy_layout
from tfreplay._src.backends.tf import TFTwin
from tfreplay._src.buffer import Buffer
from tfreplay._src.index.episodes import EpisodeRule
from tfreplay._src.members import FRAME_MEMBERS, NUMPY_MEMBERS, TF_MEMBERS, update_priorities
from tfreplay._src.rate_limiting.limiter import EmptyBufferError as EmptyBufferError  # what sampling nothing raises
from tfreplay._src.rate_limiting.limiter import RateLimiter
from tfreplay._src.samplers.prioritized import PrioritizedSampler
from tfreplay._src.samplers.uniform import UniformSampler
from tfreplay._src.specs import Nest
from tfreplay._src.storage import frames


class TFUniformReplayBuffer(Buffer):
    """A uniform replay buffer in `tf.Variable`s: graph-, XLA- and checkpoint-friendly.

    `batch_size` segments of `max_length` rows; `add_batch` writes row `b` of
    its batch to segment `b`, overwriting the oldest when full. Checkpoint it
    with `tf.train.Checkpoint(buffer=rb)`: rows, counters and the random
    generator are variables.

    Args:
      data_spec: a nest of `tf.TensorSpec`.
      batch_size: number of segments (parallel environments).
      max_length: rows per segment.
      scope: name scope of its variables and ops (any string).
      device: where the variables live.
      dataset_drop_remainder: drop incomplete batches/windows in the single pass.
      dataset_window_shift: window shift in the single pass (default: num_steps).
      stateful_dataset: mark datasets as carrying external state.
      seed: seed of the sampling generator; default TF's global seed if set
        (`tf.random.set_seed`, with an op seed so buffers draw apart), else nondeterministic.
      within_episodes: `num_steps` windows never cross an episode boundary
        (items must carry `step_type`, `first`, `terminated` or `truncated`).
      episode_rule: which fields mark boundaries (default: detected from the spec).
      rate_limiter: a `MinSize` or `SampleToInsertRatio` (one per buffer):
        `get_next`/`as_dataset` wait for collectors and `add_batch` waits for
        the learner; `close()` ends every wait.
    """

    device = TF_MEMBERS["device"]
    scope = TF_MEMBERS["scope"]

    def __init__(
        self,
        data_spec: Nest,
        batch_size: int,
        max_length: int = 1000,
        scope: str = "TFUniformReplayBuffer",
        device: str = "cpu:*",
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
        seed: int | list[int] | None = None,
        *,
        within_episodes: bool = False,
        episode_rule: EpisodeRule | str | None = "auto",
        rate_limiter: RateLimiter | None = None,
    ):
        super().__init__(
            data_spec,
            TFTwin(scope, device, seed),
            batch_size=batch_size,
            max_length=max_length,
            sampler=UniformSampler(within_episodes),
            episode_rule=episode_rule,
            rate_limiter=rate_limiter,
            window_shift=dataset_window_shift,
            drop_remainder=dataset_drop_remainder,
            stateful_dataset=stateful_dataset,
        )


class PyUniformReplayBuffer(Buffer):
    """The NumPy twin of `TFUniformReplayBuffer`: same API, same semantics.

    Construct it the TF-Agents way, `PyUniformReplayBuffer(data_spec, capacity)`
    (one ring; `add_batch` takes any number of rows, appended in order), or
    like the TF twin, `PyUniformReplayBuffer(data_spec, batch_size=B,
    max_length=L)` (B segments; each batch must have B rows). Thread-safe.
    `get_next` and `gather_all` return NumPy arrays; `as_dataset` yields
    tensors. Checkpointable with `tf.train.Checkpoint`.

    With `storage_dir=path` the items live in memory-mapped files in that
    directory, so the buffer may be larger than RAM (the page cache keeps
    the rows in use). `flush()` (and `close()`) makes every add so far
    durable; building the buffer again on the directory resumes it from its
    last flush without copying, after checking it holds a buffer of this
    spec and layout. Every NumPy buffer takes `storage_dir`
    (see the memmap guide).
    """

    size = NUMPY_MEMBERS["size"]

    def __init__(
        self,
        data_spec: Nest,
        capacity: int | None = None,
        *,
        batch_size: int | None = None,
        max_length: int | None = None,
        seed: int | None = None,
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
        name: str = "PyUniformReplayBuffer",
        within_episodes: bool = False,
        episode_rule: EpisodeRule | str | None = "auto",
        rate_limiter: RateLimiter | None = None,
        storage_dir: str | os.PathLike | None = None,
    ):
        segments, length, lockstep = numpy_layout(type(self).__name__, capacity, batch_size, max_length)
        super().__init__(
            data_spec,
            NumpyTwin(seed, lockstep, storage_dir),
            batch_size=segments,
            max_length=length,
            sampler=UniformSampler(within_episodes),
            episode_rule=episode_rule,
            rate_limiter=rate_limiter,
            name=name,
            window_shift=dataset_window_shift,
            drop_remainder=dataset_drop_remainder,
            stateful_dataset=stateful_dataset,
        )


FRAMES_DOC = """Frame replay: each frame stored once, history stacks assembled at sample time.

`add_batch` takes a mapping (see `frame_data_spec`) with `"frame"`, the
newest frame the environment returned, `"first"`, True when that frame came
from a reset (the row's other entries are then ignored), and the step that
produced the frame (`action`, `reward`, `terminated`, `truncated`, ...).
Sampling returns `{"observation", "next_observation", **the step's other
entries}`, the stacks shaped `frame_shape + (history_len,)`. Frames older
than an episode's first are zeros; no stack mixes episodes or reads across
the write head; `num_steps` windows stay inside one episode. `gather_all()`
returns every valid transition, `[num_transitions, ...]`, segment by
segment, oldest first.
"""


class TFFrameReplayBuffer(Buffer):
    __doc__ = (
        FRAMES_DOC
        + """
    Frames live in `tf.Variable`s; stacks come from the native kernel on the
    CPU (`tfreplay.native`), else from XLA.

    Args:
      data_spec: a mapping with `"frame"`, `"first"` and the step's other entries.
      batch_size: number of segments (parallel environments).
      max_length: rows (frames) per segment.
      history_len: frames per stacked observation.
      scope, device, dataset_drop_remainder, stateful_dataset, seed, rate_limiter: as `TFUniformReplayBuffer`.
    """
    )

    history_len = FRAME_MEMBERS["history_len"]
    transition_spec = FRAME_MEMBERS["transition_spec"]
    num_transitions = FRAME_MEMBERS["num_transitions"]

    device = TF_MEMBERS["device"]
    scope = TF_MEMBERS["scope"]

    def __init__(
        self,
        data_spec: Nest,
        batch_size: int,
        max_length: int = 1000,
        history_len: int = 4,
        scope: str = "TFFrameReplayBuffer",
        device: str = "cpu:*",
        dataset_drop_remainder: bool = False,
        stateful_dataset: bool = False,
        seed: int | None = None,
        *,
        rate_limiter: RateLimiter | None = None,
    ):
        super().__init__(
            data_spec,
            TFTwin(scope, device, seed),
            batch_size=batch_size,
            max_length=max_length,
            storage=frames(history_len),
            sampler=UniformSampler(),
            episode_rule=EpisodeRule(start="first"),
            rate_limiter=rate_limiter,
            drop_remainder=dataset_drop_remainder,
            stateful_dataset=stateful_dataset,
        )


class PyFrameReplayBuffer(Buffer):
    __doc__ = (
        FRAMES_DOC
        + """
    Frames live in NumPy arrays. Construct it with one ring,
    `PyFrameReplayBuffer(data_spec, capacity)` (`add_batch` appends any
    number of rows of one environment), or with segments,
    `PyFrameReplayBuffer(data_spec, batch_size=B, max_length=L)`;
    `add_sequence(items, segment)` lets environments advance at their own pace.
    """
    )

    history_len = FRAME_MEMBERS["history_len"]
    transition_spec = FRAME_MEMBERS["transition_spec"]
    num_transitions = FRAME_MEMBERS["num_transitions"]

    size = NUMPY_MEMBERS["size"]

    def __init__(
        self,
        data_spec: Nest,
        capacity: int | None = None,
        *,
        batch_size: int | None = None,
        max_length: int | None = None,
        history_len: int = 4,
        seed: int | None = None,
        dataset_drop_remainder: bool = False,
        stateful_dataset: bool = False,
        name: str = "PyFrameReplayBuffer",
        rate_limiter: RateLimiter | None = None,
        storage_dir: str | os.PathLike | None = None,
    ):
        segments, length, lockstep = numpy_layout(type(self).__name__, capacity, batch_size, max_length)
        super().__init__(
            data_spec,
            NumpyTwin(seed, lockstep, storage_dir),
            batch_size=segments,
            max_length=length,
            storage=frames(history_len),
            sampler=UniformSampler(),
            episode_rule=EpisodeRule(start="first"),
            rate_limiter=rate_limiter,
            name=name,
            drop_remainder=dataset_drop_remainder,
            stateful_dataset=stateful_dataset,
        )

    def add_sequence(self, items: Nest, segment: int = 0) -> None:
        """Appends rows (a leading time axis, oldest first) to one segment, so environments may advance at
        their own pace.

        Raises:
          ValueError: `segment` is not in `[0, batch_size)`, or a bad batch.
          TypeError: a batch of the wrong structure or dtype.
        """
        self.front_door.add_sequence("add_sequence", items, segment)


def importance_weights(probabilities: Any, num_items: Any, beta: Any) -> Any:
    """Importance-sampling weights `(N * P(i)) ** -beta`, divided by their maximum (Schaul et al. 2016).

    Args:
      probabilities: `BufferInfo.probabilities` of a sample.
      num_items: the number of items it was drawn from (`num_frames()`).
      beta: 0 (no correction) to 1 (full correction); a float or a scalar tensor (annealed in a graph).
    """
    weights = (tf.cast(num_items, tf.float32) * tf.cast(probabilities, tf.float32)) ** -tf.cast(beta, tf.float32)
    return weights / tf.reduce_max(weights)


class TFPrioritizedReplayBuffer(Buffer):
    """Proportional prioritized replay in `tf.Variable`s: the API of `TFUniformReplayBuffer` plus priorities.

    A window is drawn with probability `priority ** alpha / sum` of its first
    item (`BufferInfo.probabilities` holds it exactly), from a sum tree kept in
    a variable, so the sample and the update are one vectorised pass each (in
    compiled code on the CPU, see `tfreplay.native`).

    Args:
      data_spec, batch_size, max_length, scope, device, seed, rate_limiter: as `TFUniformReplayBuffer`.
      alpha: how much priorities count (0: uniform over stored items).
      within_episodes: items must carry episode boundaries; prioritized
        windows inside episodes are single items (`num_steps` None or 1).
      episode_rule: which fields mark boundaries (default: detected from the spec).
    """

    update_priorities = update_priorities

    device = TF_MEMBERS["device"]
    scope = TF_MEMBERS["scope"]

    def __init__(
        self,
        data_spec: Nest,
        batch_size: int,
        max_length: int = 1000,
        alpha: float = 0.6,
        scope: str = "TFPrioritizedReplayBuffer",
        device: str = "cpu:*",
        seed: int | list[int] | None = None,
        stateful_dataset: bool = False,
        *,
        within_episodes: bool = False,
        episode_rule: EpisodeRule | str | None = "auto",
        rate_limiter: RateLimiter | None = None,
    ):
        super().__init__(
            data_spec,
            TFTwin(scope, device, seed),
            batch_size=batch_size,
            max_length=max_length,
            sampler=PrioritizedSampler(alpha, within_episodes),
            episode_rule=episode_rule,
            rate_limiter=rate_limiter,
            stateful_dataset=stateful_dataset,
        )


class PyPrioritizedReplayBuffer(Buffer):
    """The NumPy twin of `TFPrioritizedReplayBuffer`.

    Built as `(data_spec, capacity)` (one ring) or `(data_spec, batch_size=B, max_length=L)`, like
    `PyUniformReplayBuffer`; `storage_dir` keeps the items in memory-mapped files, as there.
    """

    update_priorities = update_priorities

    size = NUMPY_MEMBERS["size"]

    def __init__(
        self,
        data_spec: Nest,
        capacity: int | None = None,
        *,
        batch_size: int | None = None,
        max_length: int | None = None,
        alpha: float = 0.6,
        seed: int | None = None,
        name: str = "PyPrioritizedReplayBuffer",
        within_episodes: bool = False,
        episode_rule: EpisodeRule | str | None = "auto",
        rate_limiter: RateLimiter | None = None,
        storage_dir: str | os.PathLike | None = None,
    ):
        segments, length, lockstep = numpy_layout(type(self).__name__, capacity, batch_size, max_length)
        super().__init__(
            data_spec,
            NumpyTwin(seed, lockstep, storage_dir),
            batch_size=segments,
            max_length=length,
            sampler=PrioritizedSampler(alpha, within_episodes),
            episode_rule=episode_rule,
            rate_limiter=rate_limiter,
            name=name,
        )


PRIORITIZED_FRAMES_DOC = """
    Prioritized: a transition is drawn with probability `priority ** alpha /
    sum` over the transitions that can be drawn now (`BufferInfo.probabilities`
    holds it exactly); an episode's first frame is never drawn (it ends no
    transition) and keeps priority 0. Transitions only (`num_steps` None or 1):
    windows of several steps inside one episode cannot keep exact
    probabilities. `update_priorities` takes the sampled `BufferInfo.ids`.
"""


class TFPrioritizedFrameReplayBuffer(Buffer):
    __doc__ = (
        FRAMES_DOC
        + PRIORITIZED_FRAMES_DOC
        + """
    Args:
      data_spec, batch_size, max_length, history_len, scope, device, seed, rate_limiter: as `TFFrameReplayBuffer`.
      alpha: how much priorities count (0: uniform over transitions).
    """
    )

    history_len = FRAME_MEMBERS["history_len"]
    transition_spec = FRAME_MEMBERS["transition_spec"]
    num_transitions = FRAME_MEMBERS["num_transitions"]

    update_priorities = update_priorities

    device = TF_MEMBERS["device"]
    scope = TF_MEMBERS["scope"]

    def __init__(
        self,
        data_spec: Nest,
        batch_size: int,
        max_length: int = 1000,
        history_len: int = 4,
        alpha: float = 0.6,
        scope: str = "TFPrioritizedFrameReplayBuffer",
        device: str = "cpu:*",
        seed: int | None = None,
        stateful_dataset: bool = False,
        *,
        rate_limiter: RateLimiter | None = None,
    ):
        super().__init__(
            data_spec,
            TFTwin(scope, device, seed),
            batch_size=batch_size,
            max_length=max_length,
            storage=frames(history_len),
            sampler=PrioritizedSampler(alpha),
            episode_rule=EpisodeRule(start="first"),
            rate_limiter=rate_limiter,
            stateful_dataset=stateful_dataset,
        )


class PyPrioritizedFrameReplayBuffer(Buffer):
    __doc__ = (
        FRAMES_DOC
        + PRIORITIZED_FRAMES_DOC
        + """
    The NumPy twin of `TFPrioritizedFrameReplayBuffer`, built like `PyFrameReplayBuffer`.
    """
    )

    history_len = FRAME_MEMBERS["history_len"]
    transition_spec = FRAME_MEMBERS["transition_spec"]
    num_transitions = FRAME_MEMBERS["num_transitions"]

    update_priorities = update_priorities

    size = NUMPY_MEMBERS["size"]

    def __init__(
        self,
        data_spec: Nest,
        capacity: int | None = None,
        *,
        batch_size: int | None = None,
        max_length: int | None = None,
        history_len: int = 4,
        alpha: float = 0.6,
        seed: int | None = None,
        stateful_dataset: bool = False,
        name: str = "PyPrioritizedFrameReplayBuffer",
        rate_limiter: RateLimiter | None = None,
        storage_dir: str | os.PathLike | None = None,
    ):
        segments, length, lockstep = numpy_layout(type(self).__name__, capacity, batch_size, max_length)
        super().__init__(
            data_spec,
            NumpyTwin(seed, lockstep, storage_dir),
            batch_size=segments,
            max_length=length,
            storage=frames(history_len),
            sampler=PrioritizedSampler(alpha),
            episode_rule=EpisodeRule(start="first"),
            rate_limiter=rate_limiter,
            name=name,
            stateful_dataset=stateful_dataset,
        )
