"""`ExpReplay`: a tensorpack-style replay data source for DQN training loops.

Players (Gymnasium environments) act epsilon-greedily in their own threads
and write every step into one shared `PyFrameReplayBuffer`, one segment per
player, so each frame is stored once. Iterating yields batches
`(state, action, reward, next_state, isOver)`:

* before the first batch, `init_memory_size` steps with a random policy;
* after each batch, `update_frequency` more steps in total, by whichever
  players are free (they run while the training step runs, and the next
  batch waits for them, so the step count is exact);
* `state` stacks the last `history_len` frames on a new last axis, zeros
  before an episode's first frame; `isOver` is `terminated`: a truncated
  episode's last step keeps its real next state and should bootstrap;
* `close()`, or leaving a `with` block, stops the players; so does
  garbage-collecting a replay nobody closed (the threads hold no reference to it).

Example:
  >>> replay = ExpReplay(model, make_env, num_parallel_players=4, state_shape=(84, 84),
  ...                    batch_size=32, memory_size=1_000_000, init_memory_size=50_000,
  ...                    update_frequency=4, history_len=4)
  >>> for state, action, reward, next_state, is_over in replay:
  ...     train_step(...)
  ...     replay.exploration = max(0.1, replay.exploration - 1e-6)
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any, Callable, Iterator

import gymnasium as gym
import numpy as np
import tensorflow as tf

from tfreplay._src import specs
from tfreplay._src.storage import frame_data_spec
from tfreplay.buffers import PyFrameReplayBuffer

_WHERE = "ExpReplay"
Batch = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class _Player:
    """One environment, its thread's random source and its recent frames (for acting)."""

    def __init__(self, index: int, env: gym.Env, history_len: int, seed: int | None):
        self.index, self.env = index, env
        self.num_actions = int(env.action_space.n)  # type: ignore[attr-defined]  # checked Discrete
        self.rng = np.random.default_rng(None if seed is None else [seed, index])
        self.history_len = history_len
        self.frames: list[np.ndarray] = []
        self.episode_return, self.episode_length = 0.0, 0

    def start(self, frame: np.ndarray) -> None:
        self.frames = [frame]

    def push(self, frame: np.ndarray) -> None:
        self.frames = (self.frames + [frame])[-self.history_len :]

    def state(self) -> np.ndarray:
        """The stacked state `[*shape, history_len]`, zeros before the episode's first frame."""
        zeros = [np.zeros_like(self.frames[0])] * (self.history_len - len(self.frames))
        return np.stack(zeros + self.frames, axis=-1)


class _Shared:
    """What the player threads and the consumer share.

    It holds no reference to the `ExpReplay`: the threads run `_work` on it, so a
    replay dropped without `close()` is still collected, and its finalizer stops them.
    """

    def __init__(self, predictor: Callable[[np.ndarray], Any], buffer: PyFrameReplayBuffer, num_players: int):
        self.predictor, self.buffer = predictor, buffer
        self.jobs: queue.Queue = queue.Queue()  # an exploration rate per step to take; None ends a thread
        self.stop = threading.Event()  # set when nobody will sample: pending steps are skipped
        self.lock = threading.Lock()  # guards steps and finished
        self.steps = [0] * num_players
        self.finished: list[tuple[float, int]] = []  # (return, length) of finished episodes
        self.threads: list[threading.Thread] = []
        self.error: BaseException | None = None  # a player's first failure, re-raised to the consumer


class ExpReplay:
    """Parallel epsilon-greedy players filling one frame buffer; yields DQN batches.

    Args:
      predictor: a Keras model or any callable from a batch of stacked states
        `[1, *state_shape, history_len]` to Q-values `[1, num_actions]`. It is
        called from the player threads.
      get_player: a callable returning a fresh `gymnasium.Env` with a
        `Discrete` action space and observations of `state_shape`/`state_dtype`.
      num_parallel_players: environments (and threads) stepping in parallel.
      state_shape: shape of one frame, `(84, 84)` or a low-dim `(4,)`.
      batch_size: transitions per batch; at most `init_memory_size`.
      memory_size: frames the buffer keeps (split evenly among the players).
      init_memory_size: random-policy steps before the first batch.
      update_frequency: environment steps (in total) after each batch.
      history_len: frames per state.
      state_dtype: dtype of a frame, `'uint8'` for images.
      seed: seeds the players' first reset, their exploration and the sampler.

    Raises:
      ValueError, TypeError: a bad argument, or a player whose observations
        do not match `state_shape`/`state_dtype` (checked on its first reset).
    """

    def __init__(
        self,
        predictor: Callable[[np.ndarray], Any],
        get_player: Callable[[], gym.Env],
        num_parallel_players: int,
        state_shape: tuple[int, ...],
        batch_size: int,
        memory_size: int,
        init_memory_size: int,
        update_frequency: int,
        history_len: int,
        state_dtype: Any = "uint8",
        seed: int | None = None,
    ):
        _check_args(
            predictor,
            get_player,
            num_parallel_players,
            state_shape,
            batch_size,
            memory_size,
            init_memory_size,
            update_frequency,
            history_len,
        )
        self.batch_size = int(batch_size)
        self.state_shape, self.state_dtype = tuple(int(d) for d in state_shape), tf.as_dtype(state_dtype)
        self.init_memory_size, self.update_frequency = int(init_memory_size), int(update_frequency)
        self.history_len = int(history_len)
        self._exploration = 1.0
        buffer = PyFrameReplayBuffer(
            frame_data_spec(self.state_shape, self.state_dtype, tf.TensorSpec([], tf.int32, "action")),
            batch_size=num_parallel_players,
            max_length=memory_size // num_parallel_players,
            history_len=history_len,
            seed=seed,
        )
        self._shared = _Shared(predictor, buffer, num_parallel_players)
        self._players = [self._new_player(k, get_player, seed) for k in range(num_parallel_players)]
        self._closed = False
        # Dropped without close(): stop the threads (they would otherwise wait for steps for ever).
        self._finalizer = weakref.finalize(self, _stop_players, self._shared)

    @property
    def predictor(self) -> Callable[[np.ndarray], Any]:
        """The Q-network the players act with; assigning a new one takes effect on the next step."""
        return self._shared.predictor

    @predictor.setter
    def predictor(self, value: Callable[[np.ndarray], Any]) -> None:
        self._shared.predictor = value

    @property
    def buffer(self) -> PyFrameReplayBuffer:
        """The frame buffer the players write to and batches are drawn from."""
        return self._shared.buffer

    @property
    def exploration(self) -> float:
        """Probability of a random action; the training loop anneals it."""
        return self._exploration

    @exploration.setter
    def exploration(self, value: float) -> None:
        if not isinstance(value, (int, float, np.floating)) or isinstance(value, bool) or not 0 <= value <= 1:
            raise ValueError(f"{_WHERE}: exploration ({value!r}) must be a number in [0, 1].")
        self._exploration = float(value)

    @property
    def num_transitions_added(self) -> int:
        """Environment steps taken so far; each step added one transition."""
        with self._shared.lock:
            return sum(self._shared.steps)

    @property
    def steps_per_player(self) -> list[int]:
        with self._shared.lock:
            return list(self._shared.steps)

    def episode_stats(self, reset: bool = True) -> dict[str, float]:
        """Episodes the players finished since the last reset, as tensorpack logs them.

        `{"num_episodes", "mean_return", "max_return", "mean_length"}` (NaN
        when none finished). A training loop reads it every few thousand
        steps to follow learning; `reset=False` keeps counting.
        """
        with self._shared.lock:
            finished = list(self._shared.finished)
            if reset:
                self._shared.finished.clear()
        returns = np.array([r for r, _ in finished], np.float64)
        lengths = np.array([n for _, n in finished], np.float64)
        return {
            "num_episodes": float(len(finished)),
            "mean_return": float(returns.mean()) if finished else float("nan"),
            "max_return": float(returns.max()) if finished else float("nan"),
            "mean_length": float(lengths.mean()) if finished else float("nan"),
        }

    def start(self) -> None:
        """Starts the player threads and fills the initial memory (once; iteration calls it)."""
        self._check_open()
        if self._shared.threads:
            return
        for player in self._players:
            thread = threading.Thread(
                target=_work, args=(self._shared, player), name=f"ExpReplay-player-{player.index}", daemon=True
            )
            thread.start()
            self._shared.threads.append(thread)
        self._request(self.init_memory_size, exploration=1.0)
        self.join()

    def join(self) -> None:
        """Waits until every requested step has run; re-raises a player's failure."""
        self._check_open()
        self._shared.jobs.join()
        error = self._shared.error
        if error is not None:
            raise RuntimeError(f"{_WHERE}: a player failed: {error!r}") from error

    def close(self) -> None:
        """Stops the player threads after the steps already requested, and waits for them.

        Calling it again does nothing. A replay dropped without `close()` stops its
        threads too, once it is garbage collected, skipping the steps still pending.
        """
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        for _ in self._shared.threads:
            self._shared.jobs.put(None)
        for thread in self._shared.threads:
            if thread is not threading.current_thread():
                thread.join()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{_WHERE}: closed; its players have stopped (create a new ExpReplay).")

    def __enter__(self) -> ExpReplay:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[Batch]:
        self.start()
        while True:
            self.join()
            batch = self.sample_batch()
            self._request(self.update_frequency, exploration=self._exploration)
            yield batch

    def sample_batch(self) -> Batch:
        """One batch `(state, action, reward, next_state, isOver)` from the memory as it is."""
        stored = self.buffer.num_transitions()
        if stored < self.batch_size:
            raise ValueError(
                f"{_WHERE}: batch_size ({self.batch_size}) must be at most the number of "
                f"transitions stored ({stored}); collect more before sampling."
            )
        items, _ = self.buffer.get_next(sample_batch_size=self.batch_size)
        return (items["observation"], items["action"], items["reward"], items["next_observation"], items["terminated"])

    def as_dataset(self) -> tf.data.Dataset:
        """The batches as a `tf.data.Dataset` (it shares this object's players and memory).

        TensorFlow keeps a generator dataset's source alive until the process ends,
        so this replay is never collected: call `close()` (or use `with`) when done.
        """
        state = tf.TensorSpec([self.batch_size, *self.state_shape, self.history_len], self.state_dtype)
        signature = (
            state,
            tf.TensorSpec([self.batch_size], tf.int32),
            tf.TensorSpec([self.batch_size], tf.float32),
            state,
            tf.TensorSpec([self.batch_size], tf.bool),
        )
        return tf.data.Dataset.from_generator(self.__iter__, output_signature=signature)

    def _request(self, num_steps: int, exploration: float) -> None:
        for _ in range(num_steps):
            self._shared.jobs.put(exploration)

    def _new_player(self, index: int, get_player: Callable[[], gym.Env], seed: int | None) -> _Player:
        env = get_player()
        if not isinstance(getattr(env, "action_space", None), gym.spaces.Discrete):
            raise TypeError(
                f"{_WHERE}: get_player() action_space ({getattr(env, 'action_space', None)!r}) "
                "must be gymnasium.spaces.Discrete."
            )
        obs, _ = env.reset(seed=None if seed is None else seed + index)
        obs = np.asarray(obs)
        if obs.shape != self.state_shape:
            raise ValueError(
                f"{_WHERE}: get_player() observation shape {obs.shape} must equal state_shape {self.state_shape}."
            )
        if obs.dtype != self.state_dtype.as_numpy_dtype:
            raise TypeError(
                f"{_WHERE}: get_player() observation dtype ({obs.dtype}) must be state_dtype ({self.state_dtype.name})."
            )
        player = _Player(index, env, self.history_len, seed)
        player.start(obs)
        self.buffer.add_sequence({k: v[None] for k, v in _row(obs, True).items()}, segment=index)
        return player


def _stop_players(shared: _Shared) -> None:
    """The finalizer of a dropped `ExpReplay`: skip the pending steps and wake every thread to exit.

    It may run in any thread (whichever collected the replay), so it signals and never joins.
    """
    shared.stop.set()
    for _ in shared.threads:
        shared.jobs.put(None)


def _work(shared: _Shared, player: _Player) -> None:
    """A player thread: takes one step per job until a `None` job."""
    while True:
        exploration = shared.jobs.get()
        try:
            if exploration is None:
                return
            if shared.error is None and not shared.stop.is_set():
                _step(shared, player, exploration)
        except BaseException as err:  # reported to the consumer by join()
            shared.error = shared.error or err
        finally:
            shared.jobs.task_done()


def _step(shared: _Shared, player: _Player, exploration: float) -> None:
    """One environment step, written with its frame (and the next reset frame) in one call."""
    if player.rng.random() < exploration:
        action = int(player.rng.integers(player.num_actions))
    else:
        action = int(np.argmax(np.asarray(shared.predictor(player.state()[None]))[0]))
    obs, reward, terminated, truncated, _ = player.env.step(action)
    rows = [_row(obs, False, action, float(reward), bool(terminated), bool(truncated))]
    player.push(obs)
    player.episode_return += float(reward)
    player.episode_length += 1
    finished = None
    if terminated or truncated:
        finished = (player.episode_return, player.episode_length)
        player.episode_return, player.episode_length = 0.0, 0
        obs, _ = player.env.reset()
        rows.append(_row(obs, True))
        player.start(obs)
    shared.buffer.add_sequence({k: np.stack([r[k] for r in rows]) for k in rows[0]}, segment=player.index)
    with shared.lock:
        shared.steps[player.index] += 1
        if finished is not None:
            shared.finished.append(finished)


def _row(
    obs: Any,
    first: bool,
    action: int = 0,
    reward: float = 0.0,
    terminated: bool = False,
    truncated: bool = False,
) -> dict:
    return {
        "frame": np.asarray(obs),
        "first": np.bool_(first),
        "action": np.int32(action),
        "reward": np.float32(reward),
        "terminated": np.bool_(terminated),
        "truncated": np.bool_(truncated),
    }


def _check_args(
    predictor: Any,
    get_player: Any,
    num_players: Any,
    state_shape: Any,
    batch_size: Any,
    memory_size: Any,
    init_memory_size: Any,
    update_frequency: Any,
    history_len: Any,
) -> None:
    for name, value in (("predictor", predictor), ("get_player", get_player)):
        if not callable(value):
            raise TypeError(f"{_WHERE}: {name} ({value!r}) must be callable.")
    for name, value in (
        ("num_parallel_players", num_players),
        ("batch_size", batch_size),
        ("memory_size", memory_size),
        ("init_memory_size", init_memory_size),
        ("update_frequency", update_frequency),
        ("history_len", history_len),
    ):
        specs.check_positive_int(_WHERE, name, value)
    if not isinstance(state_shape, (tuple, list)) or not 1 <= len(state_shape) <= 3:
        raise ValueError(f"{_WHERE}: state_shape ({state_shape!r}) must be a tuple of 1 to 3 dimensions.")
    if batch_size > init_memory_size:
        raise ValueError(
            f"{_WHERE}: batch_size ({batch_size}) must be at most init_memory_size "
            f"({init_memory_size}); the first batch is drawn from the initial memory."
        )
    least = num_players * (history_len + 1)
    if memory_size < least:
        raise ValueError(
            f"{_WHERE}: memory_size ({memory_size}) must be at least num_parallel_players * "
            f"(history_len + 1) ({least}), so every player keeps a full stack."
        )
