"""ExpReplay: parallel players, exact step counts, stacks equal to what the envs showed."""

from __future__ import annotations

import contextlib
import gc
import itertools
import threading
import time
import weakref

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from tfreplay import ExpReplay

SHAPE = (5, 6)
NUM_ACTIONS = 3


def episode_length(player: int, episode: int) -> int:
    return 2 + (3 * player + 5 * episode) % 7


def frame(player: int, episode: int, t: int) -> np.ndarray:
    """A frame that encodes (player, episode, t) and is never all zero."""
    out = ((np.arange(np.prod(SHAPE)) * 3 + player * 7 + episode * 11 + t * 13) % 250 + 1).reshape(SHAPE)
    out[0, :4] = [player + 1, episode % 256, episode // 256, t + 1]
    return out.astype(np.uint8)


def decode(image: np.ndarray) -> tuple[int, int, int] | None:
    if not image.any():
        return None
    p, lo, hi, t = (int(v) for v in image[0, :4])
    return p - 1, lo + 256 * hi, t - 1


class Tracker:
    """Counts players stepping at the same time, and which threads step."""

    def __init__(self):
        self.lock, self.active, self.most, self.threads = threading.Lock(), 0, 0, set()

    def __enter__(self):
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
            self.threads.add(threading.current_thread().name)

    def __exit__(self, *exc):
        with self.lock:
            self.active -= 1


class CounterEnv(gym.Env):
    """Episode e of player p lasts `episode_length(p, e)` steps; even episodes
    terminate, odd ones are truncated. The reward tells the step and action."""

    def __init__(self, player: int, tracker: Tracker, delay: float = 0.0, fail_at: int | None = None):
        self.player, self.tracker, self.delay, self.fail_at = player, tracker, delay, fail_at
        self.observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(NUM_ACTIONS)
        self.episode, self.t, self.steps = -1, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return frame(self.player, self.episode, 0), {}

    def step(self, action):
        with self.tracker:
            time.sleep(self.delay)  # a slow simulator, releasing the GIL as real ones do
            self.steps += 1
            if self.fail_at is not None and self.steps == self.fail_at:
                raise RuntimeError("simulator crashed")
            self.t += 1
            over = self.t == episode_length(self.player, self.episode)
            reward = self.t + action / 10
            return (
                frame(self.player, self.episode, self.t),
                reward,
                over and self.episode % 2 == 0,
                over and self.episode % 2 == 1,
                {},
            )


def factory(tracker: Tracker | None = None, **kwargs):
    players = itertools.count()
    tracker = tracker or Tracker()
    return lambda: CounterEnv(next(players), tracker, **kwargs)


def q_model(history_len: int) -> tf.keras.Model:
    return tf.keras.Sequential(
        [
            tf.keras.Input(SHAPE + (history_len,)),
            tf.keras.layers.Rescaling(1 / 255),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(NUM_ACTIONS),
        ]
    )


def replay(predictor=None, get_player=None, **overrides) -> ExpReplay:
    args = dict(
        num_parallel_players=4,
        state_shape=SHAPE,
        batch_size=16,
        memory_size=4000,
        init_memory_size=64,
        update_frequency=8,
        history_len=4,
        seed=0,
    )
    args.update(overrides)
    predictor = predictor or (lambda states: np.zeros((len(states), NUM_ACTIONS), np.float32))
    return ExpReplay(predictor, get_player or factory(), **args)


def test_players_step_in_parallel_threads():
    tracker = Tracker()
    with replay(get_player=factory(tracker, delay=0.005)) as er:
        batches = iter(er)
        for _ in range(4):
            next(batches)
        er.join()
        assert tracker.most > 1  # steps overlapped in time
        assert len(tracker.threads) > 1
        assert sum(n > 0 for n in er.steps_per_player) > 1


def test_step_count_is_init_plus_k_update_frequency():
    with replay(get_player=factory(delay=0.002), init_memory_size=37, update_frequency=5) as er:
        at_sampling = []
        get_next = er.buffer.get_next

        def counting_get_next(*args, **kwargs):
            at_sampling.append((er.num_transitions_added, er.buffer.num_transitions()))
            return get_next(*args, **kwargs)

        er.buffer.get_next = counting_get_next
        er.start()
        assert er.num_transitions_added == 37
        batches = iter(er)
        for _ in range(5):
            next(batches)
        # Batch k is drawn once exactly 37 + (k - 1) * 5 steps are stored (nothing overwritten).
        assert at_sampling == [(37 + k * 5,) * 2 for k in range(5)]
        er.join()
        assert er.num_transitions_added == 37 + 5 * 5


def test_episode_stats_follow_the_episodes_the_envs_finished():
    envs, make_env = [], factory()

    def get_player():
        envs.append(make_env())
        return envs[-1]

    with replay(get_player=get_player, init_memory_size=60, update_frequency=10) as er:
        assert er.episode_stats()["num_episodes"] == 0
        batches = iter(er)
        for _ in range(4):
            next(batches)
        er.join()
        stats = er.episode_stats()
    # The envs' own record: episode e of player p lasted episode_length(p, e) steps.
    lengths = [episode_length(env.player, e) for env in envs for e in range(env.episode)]
    assert stats["num_episodes"] == len(lengths) > 5
    assert stats["mean_length"] == pytest.approx(np.mean(lengths))
    # Rewards are t + action / 10, so a return lies between sum(t) and sum(t) + 0.2 * length.
    low = [n * (n + 1) / 2 for n in lengths]
    assert max(low) <= stats["max_return"] <= max(low) + 0.2 * max(lengths)
    assert np.mean(low) <= stats["mean_return"] <= np.mean(low) + 0.2 * np.mean(lengths)
    assert er.episode_stats()["num_episodes"] == 0  # reset by the read above


def check_batch(batch, history_len: int) -> dict:
    """Checks every transition against the frames its env produced; returns what it saw."""
    state, action, reward, next_state, is_over = (np.asarray(x) for x in batch)
    seen = {"zeros": 0, "terminated": 0, "truncated": 0}
    for b in range(len(action)):
        player, episode, t = decode(next_state[b, ..., -1])
        assert t >= 1
        for k in range(history_len):
            for stack, newest in ((next_state, t), (state, t - 1)):
                j = newest - (history_len - 1) + k
                want = frame(player, episode, j) if j >= 0 else np.zeros(SHAPE, np.uint8)
                np.testing.assert_array_equal(stack[b, ..., k], want)
        assert reward[b] == pytest.approx(t + action[b] / 10)
        last = t == episode_length(player, episode)
        assert is_over[b] == (last and episode % 2 == 0)
        seen["zeros"] += t < history_len
        seen["terminated"] += bool(is_over[b])
        seen["truncated"] += last and episode % 2 == 1
    return seen


def test_stacks_match_the_frames_the_envs_produced():
    with replay(q_model(4), batch_size=64) as er:
        batches = iter(er)
        seen = {"zeros": 0, "terminated": 0, "truncated": 0}
        for i in range(6):
            er.exploration = 1.0 - i / 5  # greedy steps through the Keras model at the end
            for key, count in check_batch(next(batches), 4).items():
                seen[key] += count
        assert all(count > 0 for count in seen.values()), seen


def test_exploration_is_annealed_by_the_training_loop():
    calls, envs = [], []
    make_env = factory()

    def get_player():
        envs.append(make_env())
        return envs[-1]

    def predictor(states):
        calls.append(states.shape)
        player, episode, t = decode(states[0, ..., -1])  # the player's current stack, zeros before its episode
        assert (episode, t) == (envs[player].episode, envs[player].t)
        for k in range(4):
            j = t - 3 + k
            np.testing.assert_array_equal(states[0, ..., k], frame(player, episode, j) if j >= 0 else 0)
        return np.tile(np.arange(NUM_ACTIONS, dtype=np.float32), (len(states), 1))

    with replay(predictor, get_player, update_frequency=6) as er:
        batches = iter(er)
        next(batches)
        er.join()
        assert calls == []  # the initial memory is random
        er.exploration = 0.0
        next(batches)
        er.join()
        assert calls == [(1,) + SHAPE + (4,)] * 6
        next(batches)
        er.join()
        assert len(calls) == 12
        _, action, _, _, _ = er.sample_batch()
        assert (action[-12:] == NUM_ACTIONS - 1).any()  # greedy actions were stored
    with pytest.raises(ValueError, match=r"ExpReplay: exploration \(1.5\) must be a number in \[0, 1\]"):
        er.exploration = 1.5


def test_low_dim_states():
    envs = iter(range(10))

    def cartpole():
        env = gym.make("CartPole-v1")
        env.action_space.seed(next(envs))
        return env

    with replay(get_player=cartpole, state_shape=(4,), state_dtype="float32", history_len=2) as er:
        state, action, reward, next_state, is_over = next(iter(er))
        assert state.shape == next_state.shape == (16, 4, 2) and state.dtype == np.float32
        np.testing.assert_array_equal(next_state[..., 0], state[..., 1])  # shifted by one frame
        assert action.dtype == np.int32 and reward.dtype == np.float32 and is_over.dtype == bool


def test_dataset_view():
    with replay(batch_size=8) as er:
        ds = er.as_dataset()
        assert ds.element_spec[0] == tf.TensorSpec((8,) + SHAPE + (4,), tf.uint8)
        for batch in ds.take(3):
            check_batch(tuple(x.numpy() for x in batch), 4)


def test_a_closed_replay_refuses_to_run():
    er = replay()
    batches = iter(er)
    next(batches)
    er.close()
    for iterator in (batches, iter(er)):  # the open iterator, and a new one
        with pytest.raises(RuntimeError, match="ExpReplay: closed; its players have stopped"):
            next(iterator)


def test_a_failing_player_is_reported():
    with replay(get_player=factory(fail_at=5)) as er:
        with pytest.raises(RuntimeError, match="ExpReplay: a player failed: RuntimeError\\('simulator crashed'\\)"):
            next(iter(er))


def still_running(threads: list[threading.Thread], timeout: float = 10.0) -> list[threading.Thread]:
    """The threads still alive after waiting at most `timeout` seconds for all of them."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [thread for thread in threads if thread.is_alive()]


def run_and_drop(how: str, num_batches: int = 2, **overrides) -> list[threading.Thread]:
    """Takes `num_batches` from a replay, lets it go `how`, and returns the threads it had started."""
    before = set(threading.enumerate())
    er = replay(**overrides)
    with er if how == "with" else contextlib.nullcontext():
        batches = iter(er)
        for _ in range(num_batches):
            next(batches)
        started = [t for t in threading.enumerate() if t not in before]
        assert len(started) >= 4  # one thread per player
    if how == "close":
        er.close()
        er.close()  # idempotent
    alive = weakref.ref(er)
    del er, batches
    gc.collect()
    if how == "del":
        assert alive() is None  # nothing the players hold keeps it alive
    return started


@pytest.mark.parametrize("how", ["del", "close", "with"])
def test_the_players_stop_once_the_replay_is_dropped_or_closed(how):
    baseline = threading.active_count()
    started = run_and_drop(how)
    assert still_running(started) == []
    assert threading.active_count() <= baseline


def test_a_dropped_replay_skips_the_steps_nobody_will_sample():
    # The first batch requests 20,000 more steps; taking them at 10 ms each would take 50 s.
    started = run_and_drop("del", num_batches=1, get_player=factory(delay=0.01), update_frequency=20_000)
    assert still_running(started, timeout=5.0) == []


def test_a_failed_player_is_reported_on_every_call_and_its_replay_still_stops():
    before = set(threading.enumerate())
    er = replay(get_player=factory(fail_at=5))
    message = "ExpReplay: a player failed: RuntimeError\\('simulator crashed'\\)"
    for _ in range(2):  # the first call that waits for the players, and every later one
        with pytest.raises(RuntimeError, match=message):
            next(iter(er))
        with pytest.raises(RuntimeError, match=message):
            er.join()
    started = [t for t in threading.enumerate() if t not in before]
    del er
    gc.collect()
    assert still_running(started) == []


class BoxActions(CounterEnv):
    def __init__(self):
        super().__init__(0, Tracker())
        self.action_space = gym.spaces.Box(-1, 1, (2,))


BAD = [
    (dict(history_len=0), ValueError, r"ExpReplay: history_len \(0\) must be a positive integer"),
    (dict(batch_size=65), ValueError, r"ExpReplay: batch_size \(65\) must be at most init_memory_size \(64\)"),
    (
        dict(memory_size=12),
        ValueError,
        r"ExpReplay: memory_size \(12\) must be at least num_parallel_players \* "
        r"\(history_len \+ 1\) \(20\)",
    ),
    (dict(num_parallel_players=0), ValueError, r"ExpReplay: num_parallel_players \(0\) must be a positive integer"),
    (dict(state_shape=(1, 2, 3, 4)), ValueError, r"ExpReplay: state_shape \(\(1, 2, 3, 4\)\) must be a tuple"),
    (
        dict(state_shape=(6, 5)),
        ValueError,
        r"ExpReplay: get_player\(\) observation shape \(5, 6\) must equal "
        r"state_shape \(6, 5\)",
    ),
    (
        dict(state_dtype="float32"),
        TypeError,
        r"ExpReplay: get_player\(\) observation dtype \(uint8\) must be "
        r"state_dtype \(float32\)",
    ),
    (dict(predictor="model"), TypeError, r"ExpReplay: predictor \('model'\) must be callable"),
    (
        dict(get_player=BoxActions),
        TypeError,
        r"ExpReplay: get_player\(\) action_space .* must be "
        r"gymnasium.spaces.Discrete",
    ),
]


@pytest.mark.parametrize("overrides, error, message", BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_arguments(overrides, error, message):
    with pytest.raises(error, match=message):
        replay(**overrides)


def test_a_batch_larger_than_the_memory_is_refused():
    with replay(batch_size=8) as er:
        with pytest.raises(
            ValueError,
            match=r"ExpReplay: batch_size \(8\) must be at most the number of "
            r"transitions stored \(0\)",
        ):
            er.sample_batch()
