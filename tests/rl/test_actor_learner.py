"""ActorLearner: collector threads and a learner thread kept at a ratio by the buffer's rate limiter."""

import time

import numpy as np
import pytest
import tensorflow as tf

import tfreplay
from tfreplay.rl.actor_learner import Actor, ActorLearner

SPEC = {"obs": tf.TensorSpec([2], tf.float32)}
ENVS, BATCH, SPI = 4, 8, 2.0  # items per collect call, samples per learn call, samples per inserted item


def make(num_env_steps=None, pull_every=1_000, collect_error=None, learn_error=None, num_actors=1, weights=None):
    """A run over a NumPy buffer: each collect call adds ENVS items, each learn call draws BATCH; returns
    `(run, limiter, buffer, log)` where `log` records what each side saw."""
    limiter = tfreplay.SampleToInsertRatio(SPI, min_size_to_sample=16, error_buffer=32.0)
    rb = tfreplay.PyUniformReplayBuffer(SPEC, batch_size=ENVS, max_length=1_000, rate_limiter=limiter, seed=0)
    log = {"errors": [], "pulls": [], "collected": 0, "calls_at_pull": []}

    def collect():
        if collect_error is not None and log["collected"] >= collect_error:
            raise RuntimeError("collector failed")
        rb.add_batch({"obs": np.zeros([ENVS, 2], np.float32)})
        log["collected"] += ENVS
        return ENVS

    def learn():
        info = limiter.info()
        log["errors"].append(info.error)
        if learn_error is not None and info.samples >= learn_error:
            raise ValueError("learner failed")
        rb.get_next(sample_batch_size=BATCH)
        return info.samples

    actors = [
        Actor(
            collect,
            ENVS,
            set_weights=lambda w: (
                log["pulls"].append((log["collected"], w)) or log["calls_at_pull"].append(len(log["errors"]))
            ),
        )
        for _ in range(num_actors)
    ]
    weights = weights or (lambda: len(log["errors"]))  # the "weights": the learner's call count
    run = ActorLearner(
        rb, limiter, learn, BATCH, actors, weights=weights, pull_every=pull_every, num_env_steps=num_env_steps
    )
    return run, limiter, rb, log


def test_the_learner_keeps_the_ratio_within_the_limiters_error():
    run, limiter, rb, log = make(num_env_steps=2_000)
    with run:
        assert run.wait_for(2_000, timeout=60) == 2_000
        time.sleep(0.2)  # the learner takes what it may of the last inserts
    info = limiter.info()
    assert info.inserts == 2_000 and info.min_diff <= info.error <= info.max_diff
    assert all(info.min_diff <= e <= info.max_diff for e in log["errors"][1:])
    # samples per item after the first 16: SPI, within the error range (32 samples each way)
    assert abs(run.learner_calls * BATCH - (2_000 - 16) * SPI) <= 32 + BATCH
    assert set(run.seconds) == {"collect", "learn", "overlap"} and run.seconds["learn"] > 0
    assert int(rb.num_frames()) == 2_000  # the buffer is not closed: it stays usable
    rb.add_batch({"obs": np.zeros([ENVS, 2], np.float32)})


def test_two_collectors_share_the_ratio():
    run, limiter, _, _ = make(num_env_steps=1_000, num_actors=2)
    with run:
        assert run.wait_for(1_000, timeout=60) >= 1_000
    info = limiter.info()
    assert info.inserts == run.env_steps and info.min_diff <= info.error <= info.max_diff


def test_close_stops_both_sides_promptly_while_they_run():
    run, _, _, _ = make()
    run.start()
    run.wait_for(400, timeout=30)
    start = time.perf_counter()
    run.close()
    assert time.perf_counter() - start < 1.0
    assert not any(t.is_alive() for t in run._threads)  # noqa: SLF001


def test_close_stops_collectors_waiting_for_a_slow_learner_once_its_call_ends():
    run, limiter, _, _ = make()
    learn = run._learn  # noqa: SLF001

    def slow():
        time.sleep(0.3)
        return learn()

    run._learn = slow  # noqa: SLF001
    run.start()
    run.wait_for(40, timeout=30)
    time.sleep(0.5)  # the collectors are ahead, waiting for room
    assert limiter.info().error + SPI * ENVS > limiter.info().max_diff
    start = time.perf_counter()
    run.close()
    assert time.perf_counter() - start < 1.0  # at most one learner call


def test_close_stops_a_learner_waiting_for_collectors_that_stopped():
    run, limiter, _, _ = make(num_env_steps=200)
    run.start()
    assert run.wait_for(10_000, timeout=30) == 200  # the actors stopped at num_env_steps
    time.sleep(0.2)  # the learner has taken its share and waits
    calls = run.learner_calls
    start = time.perf_counter()
    run.close()
    assert time.perf_counter() - start < 1.0
    assert run.learner_calls == calls and not any(t.is_alive() for t in run._threads)  # noqa: SLF001


@pytest.mark.parametrize(
    "side, error, match",
    [("collect", RuntimeError, "collector failed"), ("learn", ValueError, "learner failed")],
)
def test_an_error_on_either_side_stops_both_and_reaches_the_caller(side, error, match):
    kwargs = {"collect_error": 400} if side == "collect" else {"learn_error": 400}
    run, limiter, _, log = make(**kwargs)
    run.start()
    with pytest.raises(error, match=match):
        run.wait_for(10**9, timeout=60)
    run.close()  # raised once: close() does not raise it again
    before = (limiter.info().inserts, limiter.info().samples)
    time.sleep(0.2)
    assert (limiter.info().inserts, limiter.info().samples) == before  # neither side goes on


def test_an_error_is_raised_by_close_when_nobody_waited():
    run, _, _, _ = make(learn_error=100)
    run.start()
    deadline = time.monotonic() + 30
    while run._error is None and time.monotonic() < deadline:  # noqa: SLF001
        time.sleep(0.01)
    with pytest.raises(ValueError, match="learner failed"):
        run.close()


def test_the_actors_pull_fresh_weights_every_pull_every_env_steps_and_the_learner_reads_them_only_then():
    reads = []
    run, _, _, log = make(num_env_steps=1_200, pull_every=100, weights=lambda: reads.append(0) or len(log["errors"]))
    with run:
        run.wait_for(1_200, timeout=60)
    steps = [collected for collected, _ in log["pulls"]]
    versions = [version for _, version in log["pulls"]]
    assert len(steps) >= 3
    assert all(b - a >= 100 for a, b in zip(steps, steps[1:]))  # pulls every 100 env steps at most
    assert versions == sorted(set(versions))  # only newer weights are taken
    # Read once per ask, not after every call: the learner made many more calls than it read weights.
    assert len(reads) <= len(steps) + 1 < run.learner_calls
    # Fresh: between the ask and the take the limiter lets the learner make at most its whole error range
    # (2 * 32 samples, 8 calls of BATCH) more calls, and the call in flight at the ask ends first.
    assert all(calls - version <= 9 for (_, version), calls in zip(log["pulls"], log["calls_at_pull"]))


def test_paused_holds_both_sides():
    run, limiter, _, _ = make()
    with run:
        run.wait_for(200, timeout=30)
        with run.paused():
            before = limiter.info()
            time.sleep(0.2)
            after = limiter.info()
        assert (before.inserts, before.samples) == (after.inserts, after.samples)
        assert run.wait_for(before.inserts + 100, timeout=30) >= before.inserts + 100  # and they go on


def test_bad_arguments_are_refused():
    limiter = tfreplay.SampleToInsertRatio(SPI, min_size_to_sample=16, error_buffer=32.0)
    rb = tfreplay.PyUniformReplayBuffer(SPEC, batch_size=ENVS, max_length=100, rate_limiter=limiter)
    actor = Actor(lambda: 0, ENVS)
    with pytest.raises(TypeError, match=r"ActorLearner: limiter \(None\) must be a tfreplay.RateLimiter"):
        ActorLearner(rb, None, lambda: None, BATCH, [actor])
    with pytest.raises(ValueError, match=r"ActorLearner: actors \(empty\) must hold at least one Actor"):
        ActorLearner(rb, limiter, lambda: None, BATCH, [])
    with pytest.raises(ValueError, match="pull_every"):
        ActorLearner(rb, limiter, lambda: None, BATCH, [actor], pull_every=0)
    with pytest.raises(ValueError, match=r"actors\[0\].inserts_per_call"):
        ActorLearner(rb, limiter, lambda: None, BATCH, [Actor(lambda: 0, 0)])
