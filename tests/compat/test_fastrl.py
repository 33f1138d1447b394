"""ExperienceReplay: the checks of fastrl's ExperienceReplay, on a seeded CartPole stream."""

from __future__ import annotations

import collections
import itertools
import threading

import gymnasium as gym
import numpy as np
import pytest
import scipy.stats

from tfreplay import ExperienceReplay

Step = collections.namedtuple("Step", ["state", "action", "reward", "next_state", "done"])
FIELDS = Step._fields


def cartpole_steps(seed=0, n=None):
    """Yields `Step`s of a CartPole-v1 run with random actions, resetting when an episode ends."""
    env = gym.make("CartPole-v1")
    env.action_space.seed(seed)
    state, _ = env.reset(seed=seed)
    for _ in itertools.count() if n is None else range(n):
        action = env.action_space.sample()
        next_state, reward, terminated, truncated, _ = env.step(action)
        done = bool(terminated or truncated)
        yield Step(state, action, float(reward), next_state, done)
        state = env.reset()[0] if done else next_state
    env.close()


def baseline(n, seed=0):
    return list(cartpole_steps(seed, n))


def pull(replay, n):
    """Iterates `replay` for exactly `n` yielded batches (bs=1: `n` pulled steps)."""
    return list(itertools.islice(replay, n))


def assert_same_steps(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert type(g) is Step, i
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(g, field), getattr(w, field), err_msg=f"step {i} {field}")


def counters(replay):
    return replay.size, replay.index, replay.cycle, len(replay)


def test_the_stream_is_deterministic_and_crosses_an_episode_end():
    steps = baseline(60)
    assert_same_steps(steps, baseline(60))
    assert any(s.done for s in steps[:-1])  # the wrap tests below also cover a reset
    assert not np.array_equal(baseline(5, seed=1)[0].state, steps[0].state)


# fastrl: exp_replay_test(..., 0, bs=1) -> len 0.
def test_an_empty_source_stores_nothing():
    replay = ExperienceReplay(cartpole_steps(n=0), bs=1)
    assert list(replay) == []
    assert counters(replay) == (0, 0, 0, 0)
    assert replay.memory == []


# fastrl: exp_replay_test(..., 10, max_sz=20) -> size 10, idx 10, cycle 0; list() consumes the source.
def test_listing_a_finite_source_stores_every_step():
    replay = ExperienceReplay(cartpole_steps(n=10), max_sz=20, seed=0)
    batches = list(replay)
    assert len(batches) == 10
    assert counters(replay) == (10, 10, 0, 10)
    assert_same_steps(replay.memory, baseline(10))


# fastrl: run 10 more, then refill from 20 to 30 and 40 steps; memory equals the baseline run.
@pytest.mark.parametrize(
    "num_steps, expected_counters, slots",
    [
        (10, (10, 10, 0, 10), [range(0, 10)]),
        (20, (20, 20, 0, 20), [range(0, 20)]),
        (30, (20, 10, 1, 20), [range(20, 30), range(10, 20)]),  # slots 0..9 rewritten with steps 20..29
        (40, (20, 20, 1, 20), [range(20, 40)]),
    ],
)
def test_memory_matches_a_run_without_the_buffer(num_steps, expected_counters, slots):
    replay = ExperienceReplay(cartpole_steps(), max_sz=20, seed=0)
    for _ in range(num_steps // 10):  # ten pulls at a time, as the seed does
        assert len(pull(replay, 10)) == 10
    assert counters(replay) == expected_counters
    steps = baseline(num_steps)
    assert_same_steps(replay.memory, [steps[t] for r in slots for t in r])


def test_iterating_again_continues_the_source():
    replay = ExperienceReplay(cartpole_steps(), max_sz=20, seed=0)
    pull(replay, 19)
    for _ in replay:  # a loop that breaks keeps the step it pulled
        break
    assert counters(replay) == (20, 20, 0, 20)
    assert_same_steps(replay.memory, baseline(20))


def test_a_batch_is_the_step_structure_stacked():
    replay = ExperienceReplay(cartpole_steps(n=12), bs=4, max_sz=10, seed=0)
    batch = next(iter(replay))
    assert type(batch) is Step
    shapes = {f: getattr(batch, f).shape for f in FIELDS}
    assert shapes == {"state": (4, 4), "action": (4,), "reward": (4,), "next_state": (4, 4), "done": (4,)}
    dtypes = {f: getattr(batch, f).dtype.name for f in FIELDS}
    assert dtypes == {
        "state": "float32",
        "action": "int64",
        "reward": "float64",
        "next_state": "float32",
        "done": "bool",
    }


def test_sampled_idxs_are_slots_of_memory():
    replay = ExperienceReplay(cartpole_steps(n=25), bs=5, max_sz=10, return_idxs=True, seed=0)
    outputs = list(replay)
    assert len(outputs) == 25 - 5 + 1
    batch, idxs = replay.sample()
    assert idxs.shape == (5,) and idxs.dtype == np.int64
    memory = replay.memory
    assert_same_steps([Step(*(getattr(batch, f)[i] for f in FIELDS)) for i in range(5)], [memory[j] for j in idxs])


def test_a_batch_is_drawn_without_replacement():
    replay = ExperienceReplay(cartpole_steps(n=8), bs=8, max_sz=8, return_idxs=True, seed=0)
    assert len(list(replay)) == 1
    for _ in range(20):
        _, idxs = replay.sample()
        assert sorted(idxs.tolist()) == list(range(8))


def test_sample_takes_a_batch_size_per_call():
    replay = ExperienceReplay(cartpole_steps(n=6), bs=2, max_sz=10, seed=0)
    list(replay)
    assert replay.sample(6).state.shape == (6, 4)
    assert replay.sample().state.shape == (2, 4)


@pytest.mark.parametrize("bs, num_steps, num_batches", [(5, 3, 0), (5, 5, 1), (5, 7, 3), (1, 4, 4)])
def test_iteration_yields_once_bs_steps_are_stored(bs, num_steps, num_batches):
    replay = ExperienceReplay(cartpole_steps(n=num_steps), bs=bs, max_sz=10, seed=0)
    assert len(list(replay)) == num_batches
    assert replay.size == num_steps


# fastrl: bs=300, max_sz=1000; steps of consecutive samples differ. Inside a batch they must (its steps are
# distinct); across batches the whole batches must, not one batch's last step and the next one's first, which are
# the same step with probability 1 / size (in about 1 run of 4 over these 100 batches, whatever the sampler).
def test_consecutive_samples_differ():
    replay = ExperienceReplay(cartpole_steps(n=1000), bs=300, max_sz=1000, seed=0)
    previous_batch = None
    for i, batch in enumerate(replay):
        for previous_state, state in zip(batch.state, batch.state[1:]):
            assert not np.array_equal(state, previous_state)
        if previous_batch is not None:
            assert not np.array_equal(batch.state, previous_batch.state)
        previous_batch = batch
        if i > 100:
            break
    assert replay.size == 300 + 101


# fastrl: bs=1, max_sz=30, return_idxs=True; 150 samples hit every slot. That
# holds for ~82% of seeds only (each slot is missed with probability (29/30)**150),
# so here: enough samples that some slot stays unhit with probability below 1e-9
# (union bound), and counts that fit the uniform distribution, for any seed
# (seed 2 is one where 150 samples miss a slot).
SLOT_DRAWS = 800
assert 30 * (29 / 30) ** SLOT_DRAWS < 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_samples_hit_every_slot_uniformly(seed):
    replay = ExperienceReplay(cartpole_steps(n=1000), bs=1, max_sz=30, return_idxs=True, seed=seed)
    assert len(list(replay)) == 1000
    assert counters(replay) == (30, 10, 33, 30)
    memory = replay.memory
    hits = np.zeros(30, np.int64)
    for _ in range(SLOT_DRAWS):
        batch, idxs = replay.sample()
        assert batch.state.shape == (1, 4) and idxs.shape == (1,)
        np.testing.assert_array_equal(batch.state[0], memory[idxs[0]].state)
        hits[idxs] += 1
    assert (hits > 0).all(), hits
    # A correct sampler fails this with probability 1e-6 (expected count 26.7 per slot).
    assert scipy.stats.chisquare(hits).pvalue > 1e-6, hits


def batches_of(seed, n=40):
    replay = ExperienceReplay(cartpole_steps(n=n), bs=8, max_sz=20, return_idxs=True, seed=seed)
    return np.stack([idxs for _, idxs in replay])


def test_the_same_seed_gives_the_same_batches():
    np.testing.assert_array_equal(batches_of(3), batches_of(3))
    assert not np.array_equal(batches_of(3), batches_of(4))


def test_without_a_seed_the_batches_come_from_fresh_entropy(set_global_seed):
    drawn = []
    for _ in range(2):
        set_global_seed(0)  # would make a seedless buffer repeat itself; the memory's draws do not follow it
        drawn.append(batches_of(None))
    assert not np.array_equal(*drawn)


def test_an_exhausted_source_ends_iteration_and_sample_still_works():
    replay = ExperienceReplay(cartpole_steps(n=5), bs=2, max_sz=10, seed=0)
    assert len(list(replay)) == 4
    assert list(replay) == []
    assert replay.sample().state.shape == (2, 4)
    assert counters(replay) == (5, 5, 0, 5)


def test_dict_steps_give_dict_batches():
    steps = [{"obs": np.full(3, i, np.float32), "extra": {"t": i}} for i in range(4)]
    replay = ExperienceReplay(steps, bs=4, max_sz=4, return_idxs=True, seed=0)
    [(batch, idxs)] = list(replay)
    assert set(batch) == {"obs", "extra"}
    np.testing.assert_array_equal(batch["extra"]["t"], idxs)
    np.testing.assert_array_equal(batch["obs"][:, 0], idxs.astype(np.float32))


def test_sampling_while_another_thread_adds_sees_whole_steps():
    replay = ExperienceReplay([], bs=4, max_sz=50, seed=0)
    for _ in range(4):  # a full batch before the writer starts: the first sample must not race it
        replay.add({"a": np.zeros(64), "b": np.zeros(64)})
    stop, reading = threading.Event(), threading.Event()

    def writer():
        reading.wait(30)  # the writer starts once the reader does, so samples are drawn while it adds
        for i in range(1, 3000):
            replay.add({"a": np.full(64, float(i)), "b": np.full(64, float(i))})
        stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    while not stop.is_set():
        batch = replay.sample()
        reading.set()
        np.testing.assert_array_equal(batch["a"], batch["b"])
        assert (batch["a"] == batch["a"][:, :1]).all()
        reads += 1
    thread.join()
    assert reads > 1 and replay.size == 50


def test_counters_are_read_only():
    replay = ExperienceReplay([])
    for name in ("size", "index", "cycle", "bs", "max_sz"):
        with pytest.raises(AttributeError, match=rf"property '{name}' of 'ExperienceReplay' object has no setter"):
            setattr(replay, name, 3)


# Bad input.


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"bs": 0}, r"ExperienceReplay: bs \(0\) must be a positive integer\."),
        ({"bs": -2}, r"ExperienceReplay: bs \(-2\) must be a positive integer\."),
        ({"bs": 1.5}, r"ExperienceReplay: bs \(1\.5\) must be a positive integer\."),
        ({"bs": True}, r"ExperienceReplay: bs \(True\) must be a positive integer\."),
        ({"max_sz": 0}, r"ExperienceReplay: max_sz \(0\) must be a positive integer\."),
        ({"bs": 21, "max_sz": 20}, r"ExperienceReplay: bs \(21\) must be at most max_sz \(20\); a batch is drawn"),
    ],
)
def test_bad_sizes_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ExperienceReplay([], **kwargs)


def test_return_idxs_must_be_a_bool():
    with pytest.raises(TypeError, match=r"ExperienceReplay: return_idxs \('yes'\) must be a bool\."):
        ExperienceReplay([], return_idxs="yes")


@pytest.mark.parametrize("source", [5, None, object()])
def test_a_non_iterable_source_is_rejected(source):
    with pytest.raises(TypeError, match=r"ExperienceReplay: source \(.*\) must be an iterable of steps"):
        ExperienceReplay(source)


def filled(n=3, **kwargs):
    replay = ExperienceReplay(cartpole_steps(n=n), max_sz=10, seed=0, **kwargs)
    list(replay)
    return replay


@pytest.mark.parametrize(
    "bs, error, match",
    [
        (4, ValueError, r"ExperienceReplay\.sample: bs \(4\) must be at most size \(3\); steps are drawn"),
        (0, ValueError, r"ExperienceReplay\.sample: bs \(0\) must be a positive integer\."),
        (2.0, ValueError, r"ExperienceReplay\.sample: bs \(2\.0\) must be a positive integer\."),
    ],
)
def test_bad_sample_sizes_are_rejected(bs, error, match):
    replay = filled()
    with pytest.raises(error, match=match):
        replay.sample(bs)
    assert counters(replay) == (3, 3, 0, 3)


def test_sampling_an_empty_memory_is_rejected():
    replay = ExperienceReplay([])
    with pytest.raises(ValueError, match=r"ExperienceReplay\.sample: bs \(1\) must be at most size \(0\)"):
        replay.sample()


def good_step(**changes):
    return next(cartpole_steps(seed=7, n=1))._replace(**changes)


@pytest.mark.parametrize(
    "step, error, match",
    [
        (
            good_step(state=np.zeros(3, np.float32)),
            ValueError,
            r"ExperienceReplay\.add: step state has shape \(3,\); it must be \(4,\), the shape of the first step's\.",
        ),
        (
            good_step(state=np.zeros(4, np.float64)),
            TypeError,
            r"ExperienceReplay\.add: step state has dtype float64; the first step's was float32",
        ),
        (
            good_step(action=1.5),
            TypeError,
            r"ExperienceReplay\.add: action \(float64 values\) cannot be stored exactly as int64",
        ),
        (
            good_step(done=np.array([True])),
            ValueError,
            r"ExperienceReplay\.add: step done has shape \(1,\); it must be \(\)",
        ),
        (tuple(good_step()), TypeError, r"ExperienceReplay\.add: step \(.*\) must have the structure of the first"),
        ({"state": np.zeros(4, np.float32)}, TypeError, r"must have the structure of the first step"),
    ],
)
def test_a_mismatching_step_is_rejected_and_changes_nothing(step, error, match):
    replay = filled(return_idxs=True)
    before = replay.memory
    with pytest.raises(error, match=match):
        replay.add(step)
    assert counters(replay) == (3, 3, 0, 3)
    assert_same_steps(replay.memory, before)
    replay.add(good_step())  # still takes the first step's structure
    assert replay.size == 4


def test_a_mismatching_step_ends_the_iteration_that_pulled_it():
    source = [good_step(), good_step(), good_step(state=np.zeros(5, np.float32)), good_step()]
    replay = ExperienceReplay(source, max_sz=10, seed=0)
    batches = []
    with pytest.raises(ValueError, match=r"step state has shape \(5,\)"):
        for batch in replay:
            batches.append(batch)
    assert len(batches) == 2 and replay.size == 2
    assert len(list(replay)) == 1  # the bad step was consumed; the next one is stored
    assert replay.size == 3


@pytest.mark.parametrize(
    "step, match",
    [
        (
            Step("left", 0, 1.0, np.zeros(4), False),
            r"ExperienceReplay\.add: step state \('left'\) must be a number, a bool or a numeric array; "
            r"its dtype is <U4\.",
        ),
        (Step(None, 0, 1.0, np.zeros(4), False), r"ExperienceReplay\.add: step state \(None\) must be a number"),
        ((), r"ExperienceReplay\.add: step \(\(\)\) must have at least one array or number in it\."),
    ],
)
def test_a_bad_first_step_is_rejected_and_changes_nothing(step, match):
    replay = ExperienceReplay([], max_sz=4)
    with pytest.raises(TypeError, match=match):
        replay.add(step)
    assert counters(replay) == (0, 0, 0, 0) and replay.step_spec is None
    replay.add(good_step())
    assert replay.step_spec.state.shape == (4,)
