"""Drivers, policies and metric observers, table-driven over envs and autoreset modes."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from gymnasium.vector import AutoresetMode

from tfreplay import PyUniformReplayBuffer, TFUniformReplayBuffer
from tfreplay.rl.drivers import EpisodeDriver, StepDriver, StepType, Transition, make_vector_env, transition_spec
from tfreplay.rl.observers import AverageEpisodeLength, AverageReturn, NumSteps, StepsPerSecond
from tfreplay.rl.policies import EpsilonGreedyPolicy, RandomPolicy


class CountingEnv(gym.Env):
    """A deterministic env whose observation says where it is: [index, episode, t].

    Sub-environment `index` has episodes of `2 + index` steps, so the episodes
    of a vector env end at different steps. `end` chooses how they end:
    "terminate" (the env terminates), "truncate" (a TimeLimit cuts an endless
    episode) or "both" (both at the same step). The reward of a step is its new
    `t`, so an episode of length L returns L (L + 1) / 2.
    """

    def __init__(self, index=0, end="terminate", dict_obs=False, obs_dtype=np.float32, obs_extra=0, reward_shape=()):
        self.index, self.length, self.end, self.dict_obs = index, 2 + index, end, dict_obs
        self.obs_dtype, self.obs_extra, self.reward_shape = obs_dtype, obs_extra, reward_shape
        box = gym.spaces.Box(0.0, 1e6, (3,), np.float32)
        self.observation_space = gym.spaces.Dict({"where": box, "t": gym.spaces.Discrete(100)}) if dict_obs else box
        self.action_space = gym.spaces.Discrete(2)
        self.episode, self.t = -1, 0

    def _obs(self):
        where = np.array([self.index, self.episode, self.t] + [0] * self.obs_extra, self.obs_dtype)
        return {"where": where, "t": np.int64(self.t)} if self.dict_obs else where

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        assert self.t < self.length or self.end == "truncate", "stepped past the end of an episode"
        self.t += 1
        terminated = self.end in ("terminate", "both") and self.t >= self.length
        reward = np.full(self.reward_shape, self.t, np.float32) if self.reward_shape else float(self.t)
        return self._obs(), reward, terminated, False, {}


def counting_env(index=0, end="terminate", **kwargs):
    env = CountingEnv(index, end, **kwargs)
    return gym.wrappers.TimeLimit(env, env.length) if end in ("truncate", "both") else env


def make_env(kind, num_envs, end, mode=AutoresetMode.NEXT_STEP, **kwargs):
    if kind == "single":
        return counting_env(0, end, **kwargs)
    fns = [lambda i=i: counting_env(i, end, **kwargs) for i in range(num_envs)]
    cls = gym.vector.SyncVectorEnv if kind == "sync" else gym.vector.AsyncVectorEnv
    return cls(fns, autoreset_mode=mode)


def where_of(observation):
    return observation["where"] if isinstance(observation, dict) else observation


def check_transitions(batches, end):
    """Every transition is real: continuity, flags, discounts and step types agree."""
    for batch in batches:
        obs, nxt = where_of(batch.observation), where_of(batch.next_observation)
        index, episode, t = obs[:, 0], obs[:, 1], obs[:, 2]
        length = index + 2
        np.testing.assert_array_equal(nxt[:, :2], obs[:, :2])  # same env, same episode: no reset leaked in
        np.testing.assert_array_equal(nxt[:, 2], t + 1)
        assert (t < length).all(), "a transition starts from a terminal observation"
        done = nxt[:, 2] == length
        want_terminated = done if end in ("terminate", "both") else np.zeros_like(done)
        np.testing.assert_array_equal(batch.terminated, want_terminated)
        np.testing.assert_array_equal(batch.truncated, done if end in ("truncate", "both") else ~done & False)
        np.testing.assert_array_equal(batch.discount, np.where(want_terminated, 0.0, 1.0).astype(np.float32))
        np.testing.assert_array_equal(batch.step_type, np.where(t == 0, StepType.FIRST, StepType.MID))
        np.testing.assert_array_equal(batch.reward, (t + 1).astype(np.float32))
        assert episode.dtype == np.float32 and batch.action.dtype == np.int64


ENV_CASES = [
    # kind, num_envs, end, autoreset mode, dict observations
    ("single", 1, "terminate", None, False),
    ("single", 1, "truncate", None, False),
    ("sync", 3, "terminate", AutoresetMode.NEXT_STEP, False),
    ("sync", 3, "truncate", AutoresetMode.NEXT_STEP, False),
    ("sync", 3, "both", AutoresetMode.NEXT_STEP, False),
    ("sync", 3, "terminate", AutoresetMode.SAME_STEP, False),
    ("sync", 3, "truncate", AutoresetMode.SAME_STEP, True),
    ("sync", 2, "truncate", AutoresetMode.DISABLED, False),
    ("sync", 3, "terminate", AutoresetMode.NEXT_STEP, True),
    ("async", 2, "terminate", AutoresetMode.NEXT_STEP, False),
    ("async", 2, "truncate", AutoresetMode.SAME_STEP, True),
]


@pytest.mark.parametrize("kind,num_envs,end,mode,dict_obs", ENV_CASES)
def test_step_driver_episode_boundaries(kind, num_envs, end, mode, dict_obs):
    env = make_env(kind, num_envs, end, mode, dict_obs=dict_obs)
    batches = []
    driver = StepDriver(env, RandomPolicy(CountingEnv().action_space, seed=0), [batches.append], num_steps=30)
    assert driver.run() == 30 + (-30) % num_envs
    env.close()
    check_transitions(batches, end)
    stacked = tf.nest.map_structure(lambda *xs: np.stack(xs, 1), *batches)  # [env, time]
    for i in range(num_envs):
        where = where_of(stacked.observation)[i]
        # Each env's episodes follow each other with nothing skipped: t = 0, 1, .., L-1, 0, 1, ...
        np.testing.assert_array_equal(where[:, 2], np.arange(len(where)) % (2 + i))
        np.testing.assert_array_equal(where[:, 1], np.arange(len(where)) // (2 + i))
    assert driver.num_episodes == int(sum(np.sum(b.terminated | b.truncated) for b in batches))


@pytest.mark.parametrize("kind,num_envs,num_episodes", [("single", 1, 3), ("sync", 3, 4), ("sync", 2, 1)])
def test_episode_driver_stops_after_the_episodes(kind, num_envs, num_episodes):
    env = make_env(kind, num_envs, "terminate")
    batches = []
    driver = EpisodeDriver(
        env, RandomPolicy(CountingEnv().action_space, seed=1), [batches.append], num_episodes=num_episodes
    )
    made = driver.run()
    ends = [int(np.sum(b.terminated)) for b in batches]
    assert made == len(batches) * num_envs
    assert sum(ends) >= num_episodes and sum(ends[:-1]) < num_episodes  # stopped at the first step reaching it
    driver.run(1)  # the next run continues the unfinished episodes
    check_transitions(batches, "terminate")
    assert driver.num_episodes == sum(int(np.sum(b.terminated)) for b in batches)


@pytest.mark.parametrize("buffer_cls", [TFUniformReplayBuffer, PyUniformReplayBuffer])
def test_spec_matches_the_buffer_and_every_transition_is_stored(buffer_cls):
    env = make_env("sync", 3, "truncate", dict_obs=True)
    driver = StepDriver(env, RandomPolicy(CountingEnv().action_space, seed=0), num_steps=12)
    spec = driver.transition_spec
    box = tf.TensorSpec((3,), tf.float32)
    assert spec == transition_spec(env.single_observation_space, env.single_action_space)
    assert spec.observation == {"where": box, "t": tf.TensorSpec((), tf.int64)}
    scalar = tf.TensorSpec((), tf.float32)
    assert (spec.action, spec.reward, spec.discount) == (tf.TensorSpec((), tf.int64), scalar, scalar)
    assert (spec.step_type.dtype, spec.terminated.dtype, spec.truncated.dtype) == (tf.int32, tf.bool, tf.bool)
    rb = buffer_cls(spec, batch_size=3, max_length=10)
    assert tf.nest.map_structure(lambda s: (s.shape, s.dtype), rb.data_spec) == tf.nest.map_structure(
        lambda s: (s.shape, s.dtype), spec
    )
    batches = []
    driver.add_observer(rb)
    driver.add_observer(batches.append)
    driver.run()
    stored = tf.nest.map_structure(np.asarray, rb.gather_all())
    np.testing.assert_array_equal(
        stored.next_observation["where"][:, :, 2], np.stack([b.next_observation["where"][:, 2] for b in batches], 1)
    )
    assert int(rb.num_frames()) == 12


def test_observers_get_the_same_batch_once_per_step():
    env = make_env("sync", 4, "terminate")
    calls = {"a": [], "b": []}
    driver = StepDriver(
        env, RandomPolicy(CountingEnv().action_space, seed=0), [calls["a"].append, calls["b"].append], num_steps=10
    )
    driver.run()
    assert len(calls["a"]) == 3 and all(a is b for a, b in zip(calls["a"], calls["b"]))
    assert all(isinstance(t, Transition) and t.reward.shape == (4,) for t in calls["a"])
    for before, after in zip(calls["a"], calls["a"][1:]):
        going_on = ~before.terminated
        np.testing.assert_array_equal(after.observation[going_on], before.next_observation[going_on])
        np.testing.assert_array_equal(after.step_type, np.where(going_on, StepType.MID, StepType.FIRST))


def batch(rewards, step_types, terminated, truncated=None):
    terminated = np.asarray(terminated, bool)
    truncated = np.zeros_like(terminated) if truncated is None else np.asarray(truncated, bool)
    return Transition(
        None, None, np.asarray(rewards, np.float32), None, None, np.asarray(step_types, np.int32), terminated, truncated
    )


METRIC_CASES = [
    # name, batches, average return, average episode length
    ("nothing finished", [batch([1, 1], [0, 0], [0, 0])], float("nan"), float("nan")),
    ("one env, one episode", [batch([1], [0], [0]), batch([2], [1], [1])], 3.0, 2.0),
    (
        "interleaved episodes",
        [batch([1, 5], [0, 0], [0, 1]), batch([2, 1], [1, 0], [1, 0]), batch([1, 1], [0, 1], [0, 0], [0, 1])],
        (3 + 2) / 2,
        2.0,
    ),  # 5 (1 step) dropped
    ("a FIRST restarts the count", [batch([7], [0], [0]), batch([1], [0], [1])], 1.0, 1.0),
    ("only the last 2 episodes", [batch([1], [0], [1]), batch([2], [0], [1]), batch([3], [0], [1])], 2.5, 1.0),
]


@pytest.mark.parametrize("name,batches,want_return,want_length", METRIC_CASES, ids=[c[0] for c in METRIC_CASES])
def test_episode_metrics(name, batches, want_return, want_length):
    returns, lengths, steps = AverageReturn(buffer_size=2), AverageEpisodeLength(buffer_size=2), NumSteps()
    for b in batches:
        for observer in (returns, lengths, steps):
            observer(b)
    np.testing.assert_allclose([returns.result(), lengths.result()], [want_return, want_length])
    assert steps.result() == sum(len(b.reward) for b in batches)
    returns.reset()
    assert np.isnan(returns.result()) and returns.num_finished == 0


def test_metrics_from_a_driver_and_steps_per_second():
    env = make_env("sync", 2, "terminate")
    returns, lengths, sps = AverageReturn(), AverageEpisodeLength(), StepsPerSecond()
    assert sps.result() == 0.0
    StepDriver(env, RandomPolicy(CountingEnv().action_space), [returns, lengths, sps], num_steps=40).run()
    # Env 0 has episodes of 2 steps (return 3), env 1 of 3 steps (return 6); the last 10 finished are averaged.
    assert returns.num_finished == 10 and lengths.num_finished == 10
    assert 3.0 < returns.result() < 6.0 and 2.0 < lengths.result() < 3.0
    assert sps.result() > 0


def test_policies():
    obs = np.zeros((5, 3), np.float32)
    random = RandomPolicy(gym.spaces.Discrete(3), seed=0)(obs)
    assert random.shape == (5,) and random.dtype == np.int64
    q_network = lambda x, training=False: tf.one_hot([2, 0, 1, 1, 0], 3)  # noqa: E731
    greedy = EpsilonGreedyPolicy(q_network, gym.spaces.Discrete(3, start=1), epsilon=0.0)
    np.testing.assert_array_equal(greedy(obs), [3, 1, 2, 2, 1])
    explorer = EpsilonGreedyPolicy(q_network, 3, epsilon=lambda: 1.0, seed=0)
    draws = np.concatenate([explorer(obs) for _ in range(40)])
    assert set(draws.tolist()) == {0, 1, 2} and draws.dtype == np.int64
    with pytest.raises(ValueError, match=r"EpsilonGreedyPolicy: epsilon \(1.5\) must be in \[0, 1\]"):
        EpsilonGreedyPolicy(q_network, 3, epsilon=1.5)
    with pytest.raises(TypeError, match="action_space .* must be a Discrete space"):
        EpsilonGreedyPolicy(q_network, gym.spaces.Box(0, 1, (2,)))


SPACES = [
    ("discrete", lambda: gym.spaces.Discrete(5)),
    ("box", lambda: gym.spaces.Box(-1.0, 1.0, (2,), np.float32)),
    ("dict", lambda: gym.spaces.Dict({"move": gym.spaces.Discrete(4), "force": gym.spaces.Box(0.0, 1.0, (3,))})),
]


@pytest.mark.parametrize("seed", [None, 0])
@pytest.mark.parametrize("name,make_space", SPACES, ids=[c[0] for c in SPACES])
def test_random_policy_leaves_the_callers_space_alone(name, make_space, seed):
    space, fresh = make_space(), make_space()
    space.seed(7)
    fresh.seed(7)
    space.sample()
    fresh.sample()  # the caller's generator is in use, not just seeded
    policy = RandomPolicy(space, seed=seed)
    policy(np.zeros((4, 3), np.float32))
    for _ in range(5):
        np.testing.assert_equal(space.sample(), fresh.sample())
    # A seeded policy draws the same actions whatever the caller did with its space.
    if seed is not None:
        again = make_space()
        again.sample()
        np.testing.assert_equal(
            RandomPolicy(again, seed=seed)(np.zeros((4, 3))), RandomPolicy(make_space(), seed=seed)(np.zeros((4, 3)))
        )


def fixed_policy(actions):
    return lambda observation: actions


BAD_POLICIES = [
    (
        "wrong dtype",
        np.zeros(3, np.int32),
        TypeError,
        r"StepDriver \(policy output\): action has dtype int32; "
        r"the spec expects int64",
    ),
    ("float actions", np.zeros(3, np.float32), TypeError, "action has dtype float32"),
    ("wrong shape", np.zeros((3, 1), np.int64), ValueError, r"action has shape \(3, 1\); it must be \[batch\] \+ \[\]"),
    (
        "wrong batch",
        np.zeros(2, np.int64),
        ValueError,
        r"action has batch dimension 2; it must equal the number of environments \(3\)",
    ),
    (
        "a dict",
        {"a": np.zeros(3, np.int64)},
        TypeError,
        r"StepDriver \(policy output\): items .*must have the structure of data_spec",
    ),
]


@pytest.mark.parametrize("name,actions,error,match", BAD_POLICIES, ids=[c[0] for c in BAD_POLICIES])
def test_a_bad_policy_fails_at_the_first_step_and_writes_nothing(name, actions, error, match):
    env = make_env("sync", 3, "terminate")
    rb = TFUniformReplayBuffer(transition_spec(env.single_observation_space, env.single_action_space), 3, 10)
    calls = []
    driver = StepDriver(env, fixed_policy(actions), [calls.append, rb], num_steps=3)
    with pytest.raises(error, match=match):
        driver.run()
    assert calls == [] and int(rb.num_frames()) == 0 and driver.num_env_steps == 0


BAD_ENVS = [
    (
        "float64 observations",
        dict(obs_dtype=np.float64),
        TypeError,
        r"StepDriver \(env\): observation has dtype float64; the spec expects float32",
    ),
    (
        "longer observations",
        dict(obs_extra=1),
        ValueError,
        r"StepDriver \(env\): observation has shape \(4,\); the spec expects \(3,\)",
    ),
]


@pytest.mark.parametrize("name,kwargs,error,match", BAD_ENVS, ids=[c[0] for c in BAD_ENVS])
def test_an_env_that_does_not_fit_its_space_fails_clearly(name, kwargs, error, match):
    calls = []
    with pytest.raises(error, match=match):
        env = counting_env(0, "terminate", **kwargs)
        StepDriver(env, RandomPolicy(CountingEnv().action_space), [calls.append]).run()
    assert calls == []


class MangledStep(gym.vector.VectorWrapper):
    """Returns one of `step()`'s per-env arrays with an extra dimension."""

    def __init__(self, env, field):
        super().__init__(env)
        self.position = {"reward": 1, "terminated": 2, "truncated": 3}[field]

    def step(self, actions):
        outputs = list(self.env.step(actions))
        outputs[self.position] = np.asarray(outputs[self.position])[:, None]
        return tuple(outputs)


BAD_STEPS = [
    # name, env, match: every field is checked before the first observer is called
    ("single env reward", lambda: counting_env(reward_shape=(2,)), r"reward has shape \(1, 2\); it must be \[batch\]"),
    ("vector reward", lambda: MangledStep(make_env("sync", 2, "terminate"), "reward"), r"reward has shape \(2, 1\)"),
    ("terminated", lambda: MangledStep(make_env("sync", 2, "terminate"), "terminated"), r"terminated has shape"),
    ("truncated", lambda: MangledStep(make_env("sync", 2, "terminate"), "truncated"), r"truncated has shape"),
]


@pytest.mark.parametrize("name,make,match", BAD_STEPS, ids=[c[0] for c in BAD_STEPS])
def test_a_bad_step_output_fails_before_any_observer_is_called(name, make, match):
    env, calls = make(), []
    driver = StepDriver(env, RandomPolicy(CountingEnv().action_space), [calls.append])
    rb = PyUniformReplayBuffer(driver.transition_spec, batch_size=driver.num_envs, max_length=4)
    driver.add_observer(rb)
    with pytest.raises(ValueError, match=r"StepDriver \(env\): " + match):
        driver.run()
    assert calls == [] and int(rb.num_frames()) == 0


def spec_with(**changes):
    return transition_spec(CountingEnv().observation_space, CountingEnv().action_space)._replace(**changes)


BAD_BUFFERS = [
    (
        "observation shape",
        lambda: TFUniformReplayBuffer(
            spec_with(observation=tf.TensorSpec((4,), tf.float32), next_observation=tf.TensorSpec((4,), tf.float32)), 2
        ),
        ValueError,
        r"StepDriver: TFUniformReplayBuffer.data_spec field observation \(float32\[4\]\) must be "
        r"float32\[3\] as in driver.transition_spec",
    ),
    (
        "action dtype",
        lambda: PyUniformReplayBuffer(spec_with(action=tf.TensorSpec((), tf.int32)), 10),
        TypeError,
        r"data_spec field action \(int32\[\]\) must be int64\[\]",
    ),
    (
        "structure",
        lambda: TFUniformReplayBuffer({"obs": tf.TensorSpec((3,), tf.float32)}, 2),
        TypeError,
        "data_spec must have the structure of driver.transition_spec",
    ),
    (
        "batch size",
        lambda: TFUniformReplayBuffer(spec_with(), 3),
        ValueError,
        r"TFUniformReplayBuffer.batch_size \(3\) must equal the number of environments \(2\)",
    ),
    (
        # One ring takes any number of rows per add, but its windows would join different environments.
        "one ring over a vector env",
        lambda: PyUniformReplayBuffer(spec_with(), 10),
        ValueError,
        r"StepDriver: PyUniformReplayBuffer.batch_size \(1\) must equal the number of environments \(2\).*"
        r"create it with batch_size=2, max_length=",
    ),
    (
        "NumPy segments",
        lambda: PyUniformReplayBuffer(spec_with(), batch_size=3, max_length=5),
        ValueError,
        r"PyUniformReplayBuffer.batch_size \(3\) must equal the number of environments \(2\)",
    ),
]


@pytest.mark.parametrize("given_to", ["constructor", "add_observer"])
@pytest.mark.parametrize("as_method", [True, False])
@pytest.mark.parametrize("name,make_buffer,error,match", BAD_BUFFERS, ids=[c[0] for c in BAD_BUFFERS])
def test_a_buffer_built_from_another_spec_is_rejected(name, make_buffer, error, match, as_method, given_to):
    rb = make_buffer()
    observer = rb.add_batch if as_method else rb
    env, policy, calls = make_env("sync", 2, "terminate"), RandomPolicy(CountingEnv().action_space), []
    if given_to == "constructor":
        with pytest.raises(error, match=match):
            StepDriver(env, policy, [calls.append, observer])
    else:
        driver = StepDriver(env, policy, [calls.append], num_steps=2)
        with pytest.raises(error, match=match):
            driver.add_observer(observer)
        assert driver.observers == (calls.append,)  # the rejected call changed nothing
        driver.run()
        assert len(calls) == 1
    assert int(rb.num_frames()) == 0


@pytest.mark.parametrize("as_method", [True, False])
def test_one_ring_buffer_with_a_single_env_keeps_every_transition_in_order(as_method):
    env = counting_env(0, "terminate")
    driver = StepDriver(env, RandomPolicy(CountingEnv().action_space, seed=0), num_steps=6)
    rb = PyUniformReplayBuffer(driver.transition_spec, 10)
    driver.add_observer(rb.add_batch if as_method else rb)
    driver.run()
    stored = rb.gather_all()
    # Episodes of 2 steps: t = 0, 1, 0, 1, ... and the episode counter every other row.
    np.testing.assert_array_equal(stored.observation[0, :, 1:], [[e, t] for e in range(3) for t in range(2)])


BAD_ARGUMENTS = [
    ("env", lambda: StepDriver("CartPole-v1", print), TypeError, "StepDriver: env .* must be a gymnasium.Env"),
    ("policy", lambda: StepDriver(counting_env(), None), TypeError, r"StepDriver: policy \(None\) must be callable"),
    ("observer", lambda: StepDriver(counting_env(), print, [3]), TypeError, r"observer \(3\) must be callable"),
    (
        "num_steps",
        lambda: StepDriver(counting_env(), print, num_steps=0),
        ValueError,
        r"StepDriver: num_steps \(0\) must be a positive integer",
    ),
    (
        "num_episodes",
        lambda: EpisodeDriver(counting_env(), print, num_episodes=-1),
        ValueError,
        r"EpisodeDriver: num_episodes \(-1\) must be a positive integer",
    ),
    (
        "async next-step without shared memory",
        lambda: StepDriver(gym.vector.AsyncVectorEnv([counting_env] * 2, shared_memory=False), print),
        ValueError,
        "must use shared_memory=True or autoreset_mode",
    ),
]


@pytest.mark.parametrize("name,build,error,match", BAD_ARGUMENTS, ids=[c[0] for c in BAD_ARGUMENTS])
def test_bad_arguments(name, build, error, match):
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize("asynchronous", [False, True])
def test_make_vector_env_uses_same_step_autoreset_on_cartpole(asynchronous):
    env = make_vector_env("CartPole-v1", 2, asynchronous=asynchronous)
    assert isinstance(env, gym.vector.AsyncVectorEnv if asynchronous else gym.vector.SyncVectorEnv)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    batches = []
    StepDriver(env, RandomPolicy(env.single_action_space, seed=0), [batches.append], num_steps=200, seed=0).run()
    done = np.concatenate([b.terminated | b.truncated for b in batches])
    assert done.any()
    # The final observation of a CartPole episode is out of bounds; a reset observation never is.
    env.close()
    finals = np.concatenate([b.next_observation[b.terminated] for b in batches])
    assert len(finals) and ((np.abs(finals[:, 0]) > 2.4) | (np.abs(finals[:, 2]) > 0.2094)).all()


class Flaky:
    """An observer that raises on its first call and records the batches after."""

    def __init__(self):
        self.calls, self.got = 0, []

    def __call__(self, transitions):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("flaky observer: disk full")
        self.got.append(transitions)


OBSERVER_FAILURES = [
    # name, observers ("r": records with list.append, "f": Flaky, "b": a buffer), what the note says
    (
        "first",
        "frr",
        r"observer 0 \(Flaky\) raised on this step\. Observers 1 \(list.append\), 2 \(list.append\) received",
    ),
    (
        "middle",
        "rfr",
        r"observer 1 \(Flaky\) raised on this step\. Observers 0 \(list.append\), 2 \(list.append\) received",
    ),
    (
        "last",
        "rrf",
        r"observer 2 \(Flaky\) raised on this step\. Observers 0 \(list.append\), 1 \(list.append\) received",
    ),
    (
        "after a buffer",
        "bf",
        r"observer 1 \(Flaky\) raised on this step\. Observer 0 \(PyUniformReplayBuffer.add_batch\) received",
    ),
    (
        "two",
        "frf",
        r"observer 0 \(Flaky\) raised on this step\. Observer 2 \(Flaky\) raised too: RuntimeError: flaky observer: "
        r"disk full\. Observer 1 \(list.append\) received",
    ),
    ("the only one", "f", r"observer 0 \(Flaky\) raised on this step\. No other observer received the batch"),
]


@pytest.mark.parametrize("name,layout,match", OBSERVER_FAILURES, ids=[c[0] for c in OBSERVER_FAILURES])
def test_a_failing_observer_does_not_put_the_others_out_of_step(name, layout, match):
    env = make_env("sync", 2, "terminate")
    driver = StepDriver(env, RandomPolicy(CountingEnv().action_space, seed=0), num_steps=2)
    rb = PyUniformReplayBuffer(driver.transition_spec, batch_size=2, max_length=10)
    made = {"r": lambda: [].append, "f": Flaky, "b": lambda: rb.add_batch}
    for kind in layout:
        driver.add_observer(made[kind]())
    note = "flaky observer: disk full\nStepDriver: " + match + r".*The step is counted"
    with pytest.raises(RuntimeError, match=note):
        driver.run()
    recorders = [o.__self__ for o in driver.observers if getattr(o, "__name__", "") == "append"]
    flaky = [o for o in driver.observers if isinstance(o, Flaky)]
    assert driver.num_env_steps == 2  # the env stepped; every observer but the failing ones got the batch
    assert all(len(r) == 1 for r in recorders) and all(f.got == [] for f in flaky)
    assert int(rb.num_frames()) == 2 * ("b" in layout)
    driver.run()
    driver.run()  # no error: the next steps go to every observer, and the failed step is not sent again
    assert driver.num_env_steps == 6
    assert all(len(r) == 3 and r[1:] == f.got for r in recorders for f in flaky)
    assert int(rb.num_frames()) == 6 * ("b" in layout)
    for batches in recorders + [f.got for f in flaky]:
        check_transitions(batches, "terminate")
        for before, after in zip(batches, batches[1:]):
            going_on = ~before.terminated
            np.testing.assert_array_equal(after.observation[going_on], before.next_observation[going_on])
