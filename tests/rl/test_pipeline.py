"""Pipeline: collecting ahead on a thread while learning, with the run of taking turns."""

import threading
import time

import numpy as np
import pytest

import tfreplay
from tfreplay.rl.drivers import StepDriver, make_vector_env
from tfreplay.rl.observers import AverageReturn
from tfreplay.rl.pipeline import Pipeline

ENVS = 4


class Recorder:
    """A learner whose "weights" are its call count, and a policy acting on the weights it was last given; both
    record what they saw, so two runs can be compared step by step."""

    def __init__(self, sleep: float = 0.0, fail_at: int | None = None):
        self.version, self.acting = 0, 0
        self.sleep, self.fail_at = sleep, fail_at
        self.calls: list = []  # (env steps, items in the buffer, checksum of a sample)
        self.actions: list = []  # (weights acted with, action)
        self.collect_threads: set = set()
        self.rb = tfreplay.PyUniformReplayBuffer(
            StepDriver(make_vector_env("CartPole-v1", ENVS), self.policy).transition_spec,
            batch_size=ENVS,
            max_length=1_000,
            seed=0,
        )

    def policy(self, observation):
        self.collect_threads.add(threading.get_ident())
        action = ((observation[:, 2] > 0).astype(np.int64) + self.acting) % 2  # depends on the pulled weights
        self.actions.append((self.acting, action.tolist()))
        return action

    def learn(self, env_steps: int, new_steps: int) -> None:
        if env_steps < 40:
            return
        if self.fail_at is not None and env_steps >= self.fail_at:
            raise ValueError("learner failed")
        time.sleep(self.sleep)  # releases the GIL: the collector runs ahead meanwhile
        items, _ = self.rb.get_next(sample_batch_size=8)
        self.calls.append((env_steps, self.rb.num_frames(), float(np.sum(items.observation))))
        self.version += 1

    def set_weights(self, weights: int) -> None:
        self.acting = weights


def run_pipeline(concurrent: bool, recorder: Recorder, num_env_steps: int = 400, **kwargs) -> Pipeline:
    driver = StepDriver(make_vector_env("CartPole-v1", ENVS), recorder.policy, num_steps=ENVS, seed=0)
    returns = AverageReturn(5)
    pipe = Pipeline(
        driver,
        [recorder.rb.add_batch, returns],
        recorder.learn,
        weights=lambda: recorder.version,
        set_weights=recorder.set_weights,
        pull_every=20,
        num_env_steps=num_env_steps,
        concurrent=concurrent,
        **kwargs,
    )
    pipe.run()
    recorder.returns = float(returns.result())
    return pipe


def test_collecting_on_a_thread_gives_the_run_of_taking_turns():
    turns, both = Recorder(), Recorder(sleep=0.002)
    run_pipeline(False, turns)
    pipe = run_pipeline(True, both)
    assert threading.get_ident() not in both.collect_threads  # collected on the pipeline's thread
    assert both.calls == turns.calls  # every learner call saw the same buffer and drew the same sample
    assert both.actions == turns.actions  # every step acted with the same weights
    assert both.returns == turns.returns  # the observers saw the same batches
    assert pipe.env_steps == 400 and len(turns.calls) == (400 - 40) // ENVS + 1
    assert pipe.seconds["overlap"] > 0.0 and pipe.seconds["learn"] > 0.0 and pipe.seconds["collect"] > 0.0


def test_a_pull_hands_over_the_weights_of_the_pull_before():
    recorder = Recorder()
    run_pipeline(False, recorder, num_env_steps=200)
    acted = [weights for weights, _ in recorder.actions]
    # Vector step i acts at 4i env steps. Pulls come at 20, 40, 60, 80, ...; the learner's first call comes after
    # the collect that reaches 40, then one per collect (its count at 40: 1, at 60: 6). The pull at 40 hands
    # over what was read at 20 (0), the one at 60 what was read at 40 (1), the one at 80 what was read at 60 (6).
    assert acted[:15] == [0] * 15
    assert acted[15:20] == [1] * 5
    assert acted[20:25] == [6] * 5
    assert max(acted) < recorder.version


def test_the_collector_runs_ahead_by_at_most_two_pull_intervals():
    recorder = Recorder(sleep=0.003)
    ahead = []
    original = recorder.learn

    def learn(env_steps, new_steps):
        ahead.append(recorder.rb.num_frames())  # nothing added beyond this call's collect
        original(env_steps, new_steps)

    driver = StepDriver(make_vector_env("CartPole-v1", ENVS), recorder.policy, num_steps=ENVS, seed=0)
    steps_seen = []
    pipe = Pipeline(
        driver,
        [recorder.rb.add_batch],
        learn,
        after=lambda env_steps: steps_seen.append((env_steps, driver.num_env_steps)) and False,
        weights=lambda: recorder.version,
        set_weights=recorder.set_weights,
        pull_every=20,
        num_env_steps=300,
    )
    pipe.run()
    assert ahead == [min(e, 1_000 * ENVS) for e, _ in steps_seen]
    assert max(collected - learned for learned, collected in steps_seen) <= 2 * 20 + ENVS
    assert max(collected - learned for learned, collected in steps_seen) > 0  # it did run ahead


@pytest.mark.parametrize("concurrent", [False, True], ids=["turns", "threads"])
def test_after_ends_the_run_at_the_same_step(concurrent):
    recorder = Recorder()
    driver = StepDriver(make_vector_env("CartPole-v1", ENVS), recorder.policy, num_steps=ENVS, seed=0)
    pipe = Pipeline(driver, [recorder.rb.add_batch], recorder.learn, after=lambda n: n >= 100, num_env_steps=10_000,
                    concurrent=concurrent)  # fmt: skip
    assert pipe.run() == 100
    assert recorder.rb.num_frames() == 100


@pytest.mark.parametrize("concurrent", [False, True], ids=["turns", "threads"])
def test_a_learner_error_stops_the_collector_and_is_raised(concurrent):
    recorder = Recorder(fail_at=120)
    before = threading.active_count()
    with pytest.raises(ValueError, match="learner failed"):
        run_pipeline(concurrent, recorder)
    assert threading.active_count() == before  # the collector thread ended
    assert recorder.calls[-1][0] < 120


@pytest.mark.parametrize("concurrent", [False, True], ids=["turns", "threads"])
def test_a_collector_error_is_raised_after_the_collects_before_it_are_learned(concurrent):
    recorder = Recorder()
    policy = recorder.policy

    def failing(observation):
        if len(recorder.actions) == 30:
            raise RuntimeError("env failed")
        return policy(observation)

    driver = StepDriver(make_vector_env("CartPole-v1", ENVS), failing, num_steps=ENVS, seed=0)
    pipe = Pipeline(driver, [recorder.rb.add_batch], recorder.learn, num_env_steps=1_000, concurrent=concurrent)
    with pytest.raises(RuntimeError, match="env failed"):
        pipe.run()
    assert pipe.env_steps == 30 * ENVS == recorder.rb.num_frames()


def test_bad_arguments_are_refused_naming_them():
    recorder = Recorder()
    rb = recorder.rb
    driver = StepDriver(make_vector_env("CartPole-v1", ENVS), recorder.policy, [rb.add_batch], num_steps=ENVS)
    with pytest.raises(ValueError, match=r"driver has observers of its own \(.*add_batch\)"):
        Pipeline(driver, [], recorder.learn, num_env_steps=10)
    plain = StepDriver(make_vector_env("CartPole-v1", ENVS), recorder.policy, num_steps=ENVS)
    with pytest.raises(ValueError, match="weights .* and set_weights .* must be given together"):
        Pipeline(plain, [], recorder.learn, weights=lambda: 0, num_env_steps=10)
    with pytest.raises(ValueError, match="pull_every"):
        Pipeline(plain, [], recorder.learn, pull_every=0, num_env_steps=10)
    with pytest.raises(TypeError, match=r"observers\[0\]"):
        Pipeline(plain, [3], recorder.learn, num_env_steps=10)
    with pytest.raises(ValueError, match="env_steps"):
        Pipeline(plain, [], recorder.learn, num_env_steps=10, env_steps=-1)
    assert plain.observers == ()  # refused: the driver is left as it was
    pipe = Pipeline(plain, [rb.add_batch], recorder.learn, num_env_steps=8, concurrent=False)
    pipe.run()
    with pytest.raises(ValueError, match="runs once"):
        pipe.run()
