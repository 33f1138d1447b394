"""Drivers: run a policy in gymnasium environments and hand transitions to observers.

A driver steps a single `gymnasium.Env` (seen as a batch of one) or a
`gymnasium.vector.VectorEnv`, asks a policy for a batch of actions, and calls
every observer with the batch of `Transition`s that step produced. A buffer's
`add_batch` (or the buffer itself) is an observer; so are the metrics in
`tfreplay.rl.observers`. Create the buffer from `driver.transition_spec`:

    env = make_vector_env("CartPole-v1", num_envs=4)
    driver = StepDriver(env, RandomPolicy(env.single_action_space), num_steps=64)
    rb = TFUniformReplayBuffer(driver.transition_spec, batch_size=4)
    driver.add_observer(rb.add_batch)
    driver.run()

Episode boundaries: every stored transition is real. A terminated episode
ends with `discount` 0 (no bootstrap); a truncated one (a time limit) keeps
`discount` 1, and its `next_observation` is the true final observation, never
the observation of the next episode. All three gymnasium autoreset modes work:
`SAME_STEP` (what `make_vector_env` builds) reads the final observation from
`info["final_obs"]`; with `NEXT_STEP` (gymnasium's default) or `DISABLED` the
driver resets finished sub-environments itself (`reset_mask`), so the wasted
"reset step" of `NEXT_STEP` never happens and no fake transition exists.

A step is as close to all-or-nothing across observers as it can be. Whatever
the driver can check is checked before the first observer is called: a buffer
observer's spec and `batch_size` when it is added, the policy's actions and
every field of the env's outputs at each step; a failure there reaches no
observer and leaves the counters as they were. Then every observer is called,
in order, with the same batch, even if one raises (what an observer took
cannot be taken back, so the others take it too): the first error is re-raised
with a note naming the observers that raised and those that received the
batch. The env did step, so the counters (`num_env_steps`, `num_episodes`,
updated before the observers run) include the step and the next `run()`
continues with the next one, never sending this batch again.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import gymnasium as gym
import numpy as np
import tensorflow as tf
from gymnasium.vector import AutoresetMode

from tfreplay import ReplayBuffer
from tfreplay._src import specs
from tfreplay.rl.observers import call_observers

Nest = Any  # a tf.nest structure of arrays or tensors
Policy = Callable[[Nest], Any]
Observer = Callable[[Any], Any]


class StepType:
    """Where a transition's `observation` sits in its episode (as in TF-Agents).

    A stored transition always starts from a non-terminal observation, so its
    `step_type` is `FIRST` (the observation came from a reset) or `MID`; the
    episode's end is told by `terminated`/`truncated`.
    """

    FIRST = 0
    MID = 1
    LAST = 2


class Transition(NamedTuple):
    """One environment step; drivers hand observers a batch of these.

    Attributes:
      observation: the observation the policy acted on.
      action: the action taken.
      reward: float32 reward.
      discount: float32; 0 when the episode terminated, else 1 (a truncated
        episode bootstraps from `next_observation`).
      next_observation: the observation the step produced (the true final one
        at an episode's end).
      step_type: int32 `StepType` of `observation`.
      terminated: the episode ended in a terminal state.
      truncated: the episode was cut short (a time limit); not terminal.
    """

    observation: Any
    action: Any
    reward: Any
    discount: Any
    next_observation: Any
    step_type: Any
    terminated: Any
    truncated: Any


def space_spec(space: gym.Space) -> Nest:
    """The `tf.TensorSpec` nest of one element of a gymnasium space.

    Raises:
      TypeError: a space with no fixed shape (Text, Graph, Sequence...).
    """
    if isinstance(space, gym.spaces.Dict):
        return {key: space_spec(sub) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(space_spec(sub) for sub in space.spaces)
    if isinstance(space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return tf.TensorSpec(space.shape, tf.as_dtype(space.dtype))
    raise TypeError(
        f"space_spec: space ({space!r}) must be a Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple."
    )


def transition_spec(observation_space: gym.Space, action_space: gym.Space) -> Transition:
    """The spec of one `Transition` for the given (single-environment) spaces."""
    observation = space_spec(observation_space)
    scalar = tf.TensorSpec((), tf.float32)
    flag = tf.TensorSpec((), tf.bool)
    return Transition(
        observation=observation,
        action=space_spec(action_space),
        reward=scalar,
        discount=scalar,
        next_observation=observation,
        step_type=tf.TensorSpec((), tf.int32),
        terminated=flag,
        truncated=flag,
    )


def make_vector_env(
    env_id: str, num_envs: int, *, asynchronous: bool = False, **env_kwargs: Any
) -> gym.vector.VectorEnv:
    """`gymnasium.make_vec` with same-step autoreset, the mode drivers read fastest.

    Args:
      env_id: a registered gymnasium id, e.g. "CartPole-v1".
      num_envs: number of sub-environments.
      asynchronous: one process per sub-environment (`AsyncVectorEnv`).
      **env_kwargs: passed to each `gymnasium.make`.
    """
    specs.check_positive_int("make_vector_env", "num_envs", num_envs)
    mode = "async" if asynchronous else "sync"
    return gym.make_vec(
        env_id,
        num_envs,
        vectorization_mode=mode,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        **env_kwargs,
    )


def _copy(nest: Nest) -> Nest:
    # Vector envs built with copy=False reuse their arrays on the next step.
    return tf.nest.map_structure(np.array, nest)


class _BatchedEnv:
    """One interface over single and vector envs in every autoreset mode.

    `step` returns the true next observations and the observations to act on
    next (equal except where an episode ended and a new one began).
    """

    def __init__(self, env: Any, where: str):
        if isinstance(env, gym.vector.VectorEnv):
            self.num_envs = env.num_envs
            self.observation_space = env.single_observation_space
            self.action_space = env.single_action_space
            self._mode: AutoresetMode | None = AutoresetMode(
                env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
            )
            base = env.unwrapped
            if (
                self._mode == AutoresetMode.NEXT_STEP
                and isinstance(base, gym.vector.AsyncVectorEnv)
                and not base.shared_memory
            ):
                # gymnasium's worker then ignores a partial reset and wastes the next step on another reset.
                raise ValueError(
                    f"{where}: env (AsyncVectorEnv, autoreset_mode=NEXT_STEP, shared_memory=False) must use "
                    "shared_memory=True or autoreset_mode=SAME_STEP (see make_vector_env)."
                )
        elif isinstance(env, gym.Env):
            self.num_envs = 1
            self.observation_space, self.action_space = env.observation_space, env.action_space
            self._mode = None
        else:
            raise TypeError(f"{where}: env ({env!r}) must be a gymnasium.Env or gymnasium.vector.VectorEnv.")
        self.env = env

    def reset(self, seed: int | None) -> Nest:
        observation, _ = self.env.reset(seed=seed)
        return _copy(observation) if self._mode else tf.nest.map_structure(lambda x: np.asarray(x)[None], observation)

    def step(self, actions: Nest) -> tuple[Nest, np.ndarray, np.ndarray, np.ndarray, Nest]:
        if self._mode is None:
            return self._step_single(actions)
        observation, reward, terminated, truncated, info = self.env.step(actions)
        observation, done = _copy(observation), np.logical_or(terminated, truncated)
        if not done.any():
            return observation, reward, terminated, truncated, observation
        if self._mode == AutoresetMode.SAME_STEP:
            final = _copy(observation)
            for i in np.flatnonzero(done):
                for array, value in zip(tf.nest.flatten(final), tf.nest.flatten(info["final_obs"][i])):
                    array[i] = value
            return final, reward, terminated, truncated, observation
        reset, _ = self.env.reset(options={"reset_mask": done})
        mask = lambda x: done.reshape((-1,) + (1,) * (np.ndim(x) - 1))  # noqa: E731
        restarted = tf.nest.map_structure(lambda new, old: np.where(mask(old), new, old), _copy(reset), observation)
        return observation, reward, terminated, truncated, restarted

    def _step_single(self, actions: Nest) -> tuple[Nest, np.ndarray, np.ndarray, np.ndarray, Nest]:
        observation, reward, terminated, truncated, _ = self.env.step(tf.nest.map_structure(lambda a: a[0], actions))
        batch = lambda x: np.asarray(x)[None]  # noqa: E731
        following = observation
        if terminated or truncated:
            following, _ = self.env.reset()
        return (
            tf.nest.map_structure(batch, observation),
            batch(reward),
            batch(bool(terminated)),
            batch(bool(truncated)),
            tf.nest.map_structure(batch, following),
        )


def _prefixed_paths(field: str, spec: Nest) -> list[str]:
    return [field if p == "<item>" else f"{field}/{p}" for p in specs.leaf_paths(spec)]


class _Driver:
    """Shared stepping; `StepDriver` and `EpisodeDriver` only choose when to stop."""

    def __init__(self, env: Any, policy: Policy, observers: Sequence[Observer], seed: int | None):
        where = type(self).__name__
        self._where = where
        self._env = _BatchedEnv(env, where)
        if not callable(policy):
            raise TypeError(f"{where}: policy ({policy!r}) must be callable: a batch of observations -> actions.")
        self.policy = policy
        self._spec = transition_spec(self._env.observation_space, self._env.action_space)
        self._paths = {f: _prefixed_paths(f, getattr(self._spec, f)) for f in Transition._fields}
        self._observers: list[Observer] = []
        for observer in observers:
            self.add_observer(observer)
        self._seed = seed
        self._observation: Nest = None
        self._first = np.ones(self._env.num_envs, bool)
        self.num_env_steps = 0
        self.num_episodes = 0

    @property
    def transition_spec(self) -> Transition:
        """The spec of one transition: create the buffer from it."""
        return self._spec

    @property
    def env(self) -> Any:
        return self._env.env

    @property
    def num_envs(self) -> int:
        """Transitions per step: the batch size of every observer call."""
        return self._env.num_envs

    def reset(self, seed: int | None = None) -> None:
        """Starts new episodes in every sub-environment on the next step."""
        self._observation, self._seed = None, seed

    @property
    def observers(self) -> tuple[Observer, ...]:
        """The observers, called in order with every batch of transitions."""
        return tuple(self._observers)

    def add_observer(self, observer: Any) -> None:
        """Appends an observer: a callable, or a buffer (its `add_batch`).

        Raises:
          TypeError/ValueError: a buffer whose `data_spec` differs from
            `transition_spec` (naming the field), or whose `batch_size` is not
            the number of environments: a one-ring
            `PyUniformReplayBuffer(spec, capacity)` (batch_size 1) only fits a
            single env, since its `num_steps` windows would otherwise join
            different environments. The observers are then left unchanged.
        """
        self._observers.append(self._check_observer(observer))

    def _check_observer(self, observer: Any) -> Observer:
        if isinstance(observer, ReplayBuffer):
            observer = observer.add_batch
        if not callable(observer):
            raise TypeError(f"{self._where}: observer ({observer!r}) must be callable with a batch of transitions.")
        buffer = getattr(observer, "__self__", None)
        if isinstance(buffer, ReplayBuffer) and getattr(observer, "__name__", "") == "add_batch":
            self._check_buffer(buffer)
        return observer

    def _check_buffer(self, buffer: ReplayBuffer) -> None:
        name = type(buffer).__name__
        try:
            tf.nest.assert_same_structure(buffer.data_spec, self._spec, check_types=False)
        except (ValueError, TypeError):
            raise TypeError(
                f"{self._where}: {name}.data_spec must have the structure of driver.transition_spec "
                f"({', '.join(Transition._fields)}); create the buffer from driver.transition_spec."
            ) from None
        for path, got, want in zip(
            specs.leaf_paths(self._spec), tf.nest.flatten(buffer.data_spec), tf.nest.flatten(self._spec)
        ):
            if got.dtype != want.dtype or got.shape != want.shape:
                error = TypeError if got.dtype != want.dtype else ValueError
                raise error(
                    f"{self._where}: {name}.data_spec field {path} ({got.dtype.name}{got.shape.as_list()}) must be "
                    f"{want.dtype.name}{want.shape.as_list()} as in driver.transition_spec; create the buffer from it."
                )
        # Any segmented buffer, including a one-ring `PyUniformReplayBuffer(spec, capacity)` (batch_size 1, any
        # rows per add): fed several environments' rows, its num_steps windows would join different environments.
        batch_size = getattr(buffer, "batch_size", None)
        if batch_size is not None and batch_size != self.num_envs:
            raise ValueError(
                f"{self._where}: {name}.batch_size ({batch_size}) must equal the number of environments "
                f"({self.num_envs}): each environment writes to its own segment, so num_steps windows stay within "
                f"one environment; create it with batch_size={self.num_envs}, max_length=..."
            )

    def _validate(self, source: str, field: str, value: Nest) -> Nest:
        where = f"{self._where} ({source})"
        spec_field = "observation" if field == "next_observation" else field
        paths = [field + p[len(spec_field) :] for p in self._paths[spec_field]]
        spec = getattr(self._spec, spec_field)
        arrays = specs.validate_numpy_batch(where, spec, paths, value, None)
        for path, array in zip(paths, arrays):
            if array.shape[0] != self.num_envs:
                raise ValueError(
                    f"{where}: {path} has batch dimension {array.shape[0]}; it must equal the number of "
                    f"environments ({self.num_envs})."
                )
        return tf.nest.pack_sequence_as(spec, arrays)

    def _step(self) -> Transition:
        """One step of every sub-environment; calls the observers; returns the batch.

        Every check (the policy's actions, every field of the env's outputs)
        runs before the first observer is called. The env cannot step back, so
        the driver's state follows it before the observers run;
        `observers.call_observers` then gives the batch to every observer even
        if one raises.
        """
        if self._observation is None:
            self._observation = self._validate("env", "observation", self._env.reset(self._seed))
            self._first[:] = True
        action = self._validate("policy output", "action", self.policy(self._observation))
        next_obs, reward, terminated, truncated, following = self._env.step(action)
        env_field = lambda field, value: self._validate("env", field, value)  # noqa: E731
        terminated = env_field("terminated", np.asarray(terminated, bool))
        truncated = env_field("truncated", np.asarray(truncated, bool))
        transition = Transition(
            observation=self._observation,
            action=action,
            reward=env_field("reward", np.asarray(reward, np.float32)),
            discount=np.where(terminated, 0.0, 1.0).astype(np.float32),
            next_observation=env_field("next_observation", next_obs),
            step_type=np.where(self._first, StepType.FIRST, StepType.MID).astype(np.int32),
            terminated=terminated,
            truncated=truncated,
        )
        following = env_field("observation", following)
        done = np.logical_or(terminated, truncated)
        self._observation, self._first = following, done
        self.num_env_steps += self.num_envs
        self.num_episodes += int(done.sum())
        call_observers(self._where, self._observers, transition)
        return transition


class StepDriver(_Driver):
    """Runs a policy for a number of environment steps (summed over sub-envs).

    Args:
      env: a `gymnasium.Env` or `gymnasium.vector.VectorEnv`.
      policy: a callable from a batch of observations to a batch of actions
        (NumPy arrays or tensors with the action space's dtype).
      observers: callables taking a batch of `Transition`s, e.g. `rb.add_batch`
        or a buffer itself. A buffer whose spec differs from
        `transition_spec`, or whose `batch_size` is not `num_envs`, is
        rejected here (see `add_observer`).
      num_steps: transitions per `run()`; a vector env contributes `num_envs`
        per step, so a run takes `ceil(num_steps / num_envs)` steps.
      seed: seed of the first reset (`seed + i` for sub-environment `i`).

    Raises:
      TypeError/ValueError: in `run()`, at the first step, when the policy's
        actions or the env's outputs do not fit the spec (naming the field);
        observers are not called for that step.
      Exception: in `run()`, what an observer raised, once every other
        observer has received the batch; a note names who raised and who
        received it (see the module docstring). The next `run()` continues.
    """

    def __init__(
        self, env: Any, policy: Policy, observers: Sequence[Observer] = (), num_steps: int = 1, seed: int | None = None
    ):
        super().__init__(env, policy, observers, seed)
        specs.check_positive_int(self._where, "num_steps", num_steps)
        self.num_steps = num_steps

    def run(self, num_steps: int | None = None) -> int:
        """Steps until at least `num_steps` transitions were made; returns how many."""
        num_steps = self.num_steps if num_steps is None else num_steps
        specs.check_positive_int(f"{self._where}.run", "num_steps", num_steps)
        made = 0
        while made < num_steps:
            self._step()
            made += self.num_envs
        return made


class EpisodeDriver(_Driver):
    """Runs a policy until a number of episodes end (counted over sub-envs).

    Same arguments as `StepDriver`, with `num_episodes` instead of
    `num_steps`. In a vector env the other sub-environments keep stepping
    until the count is reached; their unfinished episodes continue in the
    next `run()`.
    """

    def __init__(
        self,
        env: Any,
        policy: Policy,
        observers: Sequence[Observer] = (),
        num_episodes: int = 1,
        seed: int | None = None,
    ):
        super().__init__(env, policy, observers, seed)
        specs.check_positive_int(self._where, "num_episodes", num_episodes)
        self.num_episodes_per_run = num_episodes

    def run(self, num_episodes: int | None = None) -> int:
        """Steps until `num_episodes` episodes ended; returns the transitions made."""
        num_episodes = self.num_episodes_per_run if num_episodes is None else num_episodes
        specs.check_positive_int(f"{self._where}.run", "num_episodes", num_episodes)
        target, made = self.num_episodes + num_episodes, 0
        while self.num_episodes < target:
            self._step()
            made += self.num_envs
        return made
