"""tfreplay.datasets and Minari: datasets written with Minari's own API into buffers, buffers out to Minari and back."""

from __future__ import annotations

import inspect
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfreplay

minari = pytest.importorskip("minari", reason="needs the minari extra: pip install 'tfreplay[minari]'")
pytest.importorskip("PIL", reason="Minari's storages import Pillow")
import gymnasium as gym  # noqa: E402  (a dependency of Minari)
from minari.data_collector import EpisodeBuffer  # noqa: E402

h5py = pytest.importorskip("h5py")

from tfreplay import datasets  # noqa: E402

# Minari reminds the author of every metadata field left out (author, code_permalink, ...).
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:minari")
try:
    import pyarrow  # noqa: F401  (minari[arrow]: the arrow and parquet formats)

    ARROW = True
except ImportError:
    ARROW = False
NEEDS_ARROW = pytest.mark.skipif(not ARROW, reason="the arrow and parquet formats need pyarrow (minari[arrow])")
FORMATS = ["hdf5", pytest.param("arrow", marks=NEEDS_ARROW), pytest.param("parquet", marks=NEEDS_ARROW)]
RAW_IMAGES = "jpeg_encoding" in inspect.signature(minari.create_dataset_from_buffers).parameters  # minari >= 0.5.4

flag = tf.TensorSpec([], tf.bool)
CARTPOLE_OBS = tf.TensorSpec([4], tf.float32)
CARTPOLE = {  # what Minari gives for CartPole: float32 observations, int64 actions, float64 rewards
    "observation": CARTPOLE_OBS,
    "next_observation": CARTPOLE_OBS,
    "action": tf.TensorSpec([], tf.int64),
    "reward": tf.TensorSpec([], tf.float64),
    "discount": tf.TensorSpec([], tf.float32),
    "step_type": tf.TensorSpec([], tf.int32),
    "terminated": flag,
    "truncated": flag,
}


@pytest.fixture(autouse=True)
def minari_datasets(tmp_path, monkeypatch):
    """Minari's local datasets directory, fresh for each test."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    return tmp_path / "minari"


def cartpole_episodes(num, seed=0):
    """Random-policy CartPole episodes cut at 12 steps (so some terminate and some are truncated)."""
    env = gym.make("CartPole-v1", max_episode_steps=12)
    env.action_space.seed(seed)
    out = []
    for i in range(num):
        observation, _ = env.reset(seed=seed + i)
        observations, actions, rewards, terminations, truncations = [observation], [], [], [], []
        while not (terminations[-1:] == [True] or truncations[-1:] == [True]):
            action = env.action_space.sample()
            observation, reward, terminated, truncated, _ = env.step(action)
            observations.append(observation)
            actions.append(action)
            rewards.append(reward)
            terminations.append(terminated)
            truncations.append(truncated)
        out.append(
            EpisodeBuffer(
                observations=np.stack(observations),
                actions=np.array(actions),
                rewards=np.array(rewards),
                terminations=np.array(terminations),
                truncations=np.array(truncations),
            )
        )
    return env, out


def expected_items(episodes):
    """The transitions of Minari episode buffers, per episode, by tfreplay name."""
    out = []
    for ep in episodes:
        num = len(ep.rewards)
        out.append(
            {
                "observation": ep.observations[:-1],
                "next_observation": ep.observations[1:],
                "action": ep.actions,
                "reward": ep.rewards,
                "discount": np.where(ep.terminations, 0.0, 1.0).astype(np.float32),
                "step_type": (np.arange(num) > 0).astype(np.int32),
                "terminated": ep.terminations,
                "truncated": ep.truncations,
            }
        )
    return out


def joined(parts):
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def gathered(buffer):
    return tf.nest.map_structure(np.asarray, buffer.gather_all())


@pytest.fixture
def cartpole():
    """A CartPole dataset written with Minari's own `create_dataset_from_buffers`, and its episodes."""
    env, episodes = cartpole_episodes(5)
    assert any(ep.terminations[-1] for ep in episodes) and any(ep.truncations[-1] for ep in episodes)
    minari.create_dataset_from_buffers("tests/cartpole-v0", episodes, env=env, author="tests")
    return episodes


@pytest.mark.parametrize("data_format", FORMATS)
def test_a_minari_dataset_gives_transitions(data_format):
    env, episodes = cartpole_episodes(3)
    minari.create_dataset_from_buffers("tests/cartpole-v0", episodes, env=env, data_format=data_format)
    rb = tfreplay.PyUniformReplayBuffer(CARTPOLE, capacity=200)
    info = datasets.load_minari("tests/cartpole-v0", rb)
    total = sum(len(ep.rewards) for ep in episodes)
    assert info == datasets.LoadInfo(3, total, 0, "envlogger")
    got = {k: v[0] for k, v in gathered(rb).items()}
    want = joined(expected_items(episodes))
    for name in CARTPOLE:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_sources_a_dataset_an_id_or_a_path(cartpole, minari_datasets):
    total = sum(len(ep.rewards) for ep in cartpole)
    dataset = minari.load_dataset("tests/cartpole-v0")
    for source in (dataset, "tests/cartpole-v0", minari_datasets / "tests/cartpole-v0", dataset.spec.data_path):
        rb = tfreplay.PyUniformReplayBuffer(CARTPOLE, capacity=200)
        assert datasets.load_minari(source, rb).num_items == total, source
    with pytest.raises(ValueError, match=r"no dataset of that id in .* never downloads; .*minari.download_dataset"):
        datasets.load_minari("D4RL/door/human-v2", rb)
    with pytest.raises(ValueError, match=r"must be a Minari dataset directory \(with data/metadata.json\)"):
        datasets.load_minari(minari_datasets, rb)
    with pytest.raises(TypeError, match=r"must be a minari.MinariDataset, a local dataset id or a path"):
        datasets.load_minari(3, rb)


def test_segments_receive_whole_episodes(cartpole):
    rb = tfreplay.TFUniformReplayBuffer(CARTPOLE, batch_size=2, max_length=100)
    info = datasets.load_minari("tests/cartpole-v0", rb)
    episodes = expected_items(cartpole)
    segments, received = [[], []], [0, 0]
    for episode in episodes:  # each goes to the segment that has received the fewest items
        segment = int(np.argmin(received))
        segments[segment].append(episode)
        received[segment] += len(episode["action"])
    num = min(received)
    assert info == datasets.LoadInfo(5, 2 * num, sum(received) - 2 * num, "envlogger")
    got = gathered(rb)
    for b in range(2):
        want = joined(segments[b])
        np.testing.assert_array_equal(got["observation"][b], want["observation"][:num])
        np.testing.assert_array_equal(got["step_type"][b], want["step_type"][:num])


def test_dict_and_tuple_spaces_give_nests_and_infos_give_fields():
    space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-1, 1, (2,), np.float32),
            "extra": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (), np.float64))),
        }
    )
    episodes = []
    for e, num in enumerate([3, 4]):
        steps = np.arange(num + 1)
        observations = {
            "pos": np.stack([steps, -steps], 1).astype(np.float32) + 10 * e,
            "extra": (steps % 3, steps / 10.0),
        }
        episodes.append(
            EpisodeBuffer(
                observations=observations,
                actions=np.arange(num) + 10 * e,
                rewards=np.ones(num, np.float32),
                terminations=steps[1:] == num,
                truncations=np.zeros(num, bool),
                infos={"goal": np.stack([steps, steps], 1).astype(np.float32)},  # one per observation
            )
        )
    minari.create_dataset_from_buffers(
        "tests/dict-v0", episodes, observation_space=space, action_space=gym.spaces.Discrete(20)
    )
    obs = {
        "pos": tf.TensorSpec([2], tf.float32),
        "extra": (tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.float64)),
    }
    spec = {"observation": obs, "next_observation": obs, "action": tf.TensorSpec([], tf.int64), "goal": obs["pos"]}
    rb = tfreplay.PyUniformReplayBuffer(spec, capacity=20)
    assert datasets.load_minari("tests/dict-v0", rb).num_items == 7
    got = tf.nest.map_structure(lambda x: x[0], gathered(rb))
    np.testing.assert_array_equal(got["observation"]["pos"][:, 0], [0, 1, 2, 10, 11, 12, 13])
    np.testing.assert_array_equal(got["next_observation"]["pos"][:, 0], [1, 2, 3, 11, 12, 13, 14])
    np.testing.assert_array_equal(got["observation"]["extra"][0], [0, 1, 2, 0, 1, 2, 0])
    np.testing.assert_array_equal(got["next_observation"]["extra"][1], [0.1, 0.2, 0.3, 0.1, 0.2, 0.3, 0.4])
    np.testing.assert_array_equal(got["goal"][:, 0], [0, 1, 2, 0, 1, 2, 3])  # the info that came with observation


def test_frame_buffer_gets_frame_rows(cartpole):
    spec = dict(tfreplay.frame_data_spec((4,), tf.float32, CARTPOLE["action"]), reward=CARTPOLE["reward"])
    rb = tfreplay.PyFrameReplayBuffer(spec, capacity=200, history_len=1, seed=0)
    datasets.load_minari("tests/cartpole-v0", rb)
    want = joined(expected_items(cartpole))
    assert int(rb.num_transitions()) == len(want["action"])
    batch = rb.gather_all()
    np.testing.assert_array_equal(batch["action"], want["action"])
    np.testing.assert_array_equal(batch["next_observation"][..., 0], want["next_observation"])  # history_len 1


def test_to_items_gets_the_transitions_and_the_episode(cartpole):
    spec = {"obs": CARTPOLE_OBS, "reward": tf.TensorSpec([], tf.float32), "episode": tf.TensorSpec([], tf.int64)}

    def to_items(transitions, episode):
        num = len(transitions["reward"])
        return {
            "obs": transitions["observation"],
            "reward": transitions["reward"].astype(np.float32),
            "episode": np.full([num], episode.id, np.int64),
        }

    rb = tfreplay.PyUniformReplayBuffer(spec, capacity=200)
    datasets.load_minari("tests/cartpole-v0", rb, to_items=to_items)
    lengths = [len(ep.rewards) for ep in cartpole]
    np.testing.assert_array_equal(gathered(rb)["episode"][0], np.repeat(np.arange(5), lengths))


def prefilled(cartpole):
    """A buffer holding the first CartPole episode, and what it holds."""
    minari.create_dataset_from_buffers("tests/first-v0", cartpole[:1], env=gym.make("CartPole-v1"))
    rb = tfreplay.PyUniformReplayBuffer(CARTPOLE, capacity=200)
    datasets.load_minari("tests/first-v0", rb)
    return rb, gathered(rb)


def assert_unchanged(rb, before):
    assert rb.num_frames() == len(before["action"][0])
    for name, value in gathered(rb).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_a_field_the_spec_needs_but_the_episodes_miss_is_named_and_nothing_is_added(cartpole):
    rb, before = prefilled(cartpole)
    needs_goal = {**CARTPOLE, "goal": CARTPOLE_OBS}
    other = tfreplay.PyUniformReplayBuffer(needs_goal, capacity=200)
    with pytest.raises(
        ValueError,
        match=r"load_minari: the buffer's field 'goal' has no source: episode 0 of the Minari dataset "
        r"\('tests/cartpole-v0'\) gives",
    ):
        datasets.load_minari("tests/cartpole-v0", other)
    assert other.num_frames() == 0
    assert_unchanged(rb, before)


@pytest.mark.parametrize(
    "name, spec, error, message",
    [
        ("reward", tf.TensorSpec([], tf.float32), TypeError, r"reward has dtype float64 .* the spec expects float32"),
        ("observation", tf.TensorSpec([5], tf.float32), ValueError, r"observation has shape \(4,\) .* expects \(5,\)"),
    ],
)
def test_a_dtype_or_shape_that_differs_is_named_and_nothing_is_added(cartpole, name, spec, error, message):
    rb, before = prefilled(cartpole)
    wrong = tfreplay.PyUniformReplayBuffer({**CARTPOLE, name: spec}, capacity=200)
    with pytest.raises(error, match=f"load_minari: {message}"):
        datasets.load_minari("tests/cartpole-v0", wrong)
    assert wrong.num_frames() == 0
    assert_unchanged(rb, before)


def malformed(episode, **changes):
    """A copy of a Minari episode buffer with some of its arrays replaced (Minari's storages do not check them)."""
    fields = ("observations", "actions", "rewards", "terminations", "truncations")
    return EpisodeBuffer(**{name: changes.get(name, getattr(episode, name)) for name in fields})


def flag_at(flags, step):
    out = np.array(flags)
    out[step] = True
    return out


# A malformed third episode (index 2, after two good ones): how it is malformed, and what the refusal says.
MALFORMED_MINARI = {
    "wider observations": (
        lambda ep: malformed(ep, observations=np.concatenate([ep.observations, ep.observations[:, :1]], 1)),
        r"observation has shape \(5,\) where episode 2 of the Minari dataset \('tests/bad-v0'\) gives",
    ),
    "no final observation": (
        lambda ep: malformed(ep, observations=ep.observations[:-1]),
        r"episode 2 of the Minari dataset \('tests/bad-v0'\): observations \(\d+ entries\) must hold one more "
        r"entry than rewards \(\d+\)",
    ),
    "an action short": (
        lambda ep: malformed(ep, actions=ep.actions[:-1]),
        r"episode 2 of the Minari dataset \('tests/bad-v0'\): actions \(\d+ entries\) must hold one entry per reward",
    ),
    "a termination in the middle": (
        lambda ep: malformed(ep, terminations=flag_at(ep.terminations, 1)),
        r"episode 2 of the Minari dataset \('tests/bad-v0'\), step 1: terminations \(True\) must be False before "
        r"the episode's last step",
    ),
    "a truncation in the middle": (
        lambda ep: malformed(ep, truncations=flag_at(ep.truncations, 2)),
        r"episode 2 of the Minari dataset \('tests/bad-v0'\), step 2: truncations \(True\) must be False before "
        r"the episode's last step",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_MINARI))
def test_a_malformed_later_episode_is_refused_and_the_buffer_is_unchanged(cartpole, case):
    malform, message = MALFORMED_MINARI[case]
    assert all(len(ep.rewards) > 3 for ep in cartpole[:3])
    episodes = [*cartpole[:2], malform(cartpole[2])]
    minari.create_dataset_from_buffers("tests/bad-v0", episodes, env=gym.make("CartPole-v1"))
    rb, before = prefilled(cartpole)
    with pytest.raises(ValueError, match=f"load_minari: {message}"):
        datasets.load_minari("tests/bad-v0", rb)
    assert_unchanged(rb, before)


def test_a_later_episode_that_lacks_a_field_is_refused_and_the_buffer_is_unchanged(cartpole):
    dataset = minari.create_dataset_from_buffers("tests/bad-v0", cartpole[:3], env=gym.make("CartPole-v1"))
    with h5py.File(os.path.join(dataset.spec.data_path, "main_data.hdf5"), "a") as file:
        del file["episode_2/rewards"]
    rb, before = prefilled(cartpole)
    with pytest.raises(
        ValueError,
        match=r"load_minari: episode 2 of the Minari dataset \('tests/bad-v0'\): rewards must be readable; reading "
        r"the episode raised KeyError",
    ) as raised:
        datasets.load_minari("tests/bad-v0", rb)
    assert isinstance(raised.value.__cause__, KeyError)
    assert_unchanged(rb, before)


OBS = tf.TensorSpec([2], tf.float32)
SPEC = {
    "observation": OBS,
    "next_observation": OBS,
    "action": tf.TensorSpec([], tf.int32),
    "reward": tf.TensorSpec([], tf.float32),
    "discount": tf.TensorSpec([], tf.float32),
    "step_type": tf.TensorSpec([], tf.int32),
    "terminated": flag,
    "truncated": flag,
    "seed": tf.TensorSpec([], tf.int64),  # a field of tfreplay's own: written as a Minari info
}


def make_buffer_with_episodes(buffer, gamma=1.0):
    """Three episodes (terminated, truncated, terminated) of consistent transitions, and an unfinished one."""
    t = 0
    for e, (length, terminal) in enumerate([(3, True), (4, False), (2, True), (2, None)]):
        for k in range(length):
            end = k == length - 1 and terminal is not None
            buffer.add_batch(
                {
                    "observation": np.full([1, 2], t, np.float32),
                    "next_observation": np.full([1, 2], t + 1, np.float32),
                    "action": np.array([t], np.int32),
                    "reward": np.array([t / 2], np.float32),
                    "discount": np.array([0.0 if end and terminal else gamma], np.float32),
                    "step_type": np.array([0 if k == 0 else 1], np.int32),
                    "terminated": np.array([end and bool(terminal)]),
                    "truncated": np.array([end and not terminal]),
                    "seed": np.array([100 + e], np.int64),
                }
            )
            t += 1
        t += 1  # the next episode starts from a fresh observation
    return buffer


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("gamma", [1.0, 0.99])
def test_round_trip_keeps_items_and_episodes(data_format, gamma):
    source = make_buffer_with_episodes(tfreplay.PyUniformReplayBuffer(SPEC, capacity=50), gamma)
    assert datasets.save_minari(source, "tests/round-v0", data_format=data_format, author="tests") == 3
    dataset = minari.load_dataset("tests/round-v0")
    assert dataset.storage.FORMAT == data_format
    assert [len(ep) for ep in dataset.iterate_episodes()] == [3, 4, 2]  # the unfinished one is left out
    first = next(iter(dataset.iterate_episodes()))
    assert first.observations.shape == (4, 2) and ("discount" in first.infos) == (gamma != 1.0)
    target = tfreplay.TFUniformReplayBuffer(SPEC, batch_size=1, max_length=50)
    assert datasets.load_minari(dataset, target) == datasets.LoadInfo(3, 9, 0, "envlogger")
    want = {k: v[0, :9] for k, v in gathered(source).items()}
    got = {k: v[0] for k, v in gathered(target).items()}
    for name in SPEC:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert got[name].dtype == want[name].dtype, name


@pytest.mark.skipif(not RAW_IMAGES, reason="minari < 0.5.4 stores image spaces only as JPEG")
@pytest.mark.parametrize("data_format", FORMATS[:2])
def test_image_observations_stay_raw(data_format):
    pixels = tf.TensorSpec([32, 32, 3], tf.uint8)  # a Minari image space: uint8 in [0, 255], at least 32 x 32
    spec = {**SPEC, "observation": {"pixels": pixels, "speed": tf.TensorSpec([], tf.float32)}}
    spec["next_observation"] = spec["observation"]
    rb = tfreplay.PyUniformReplayBuffer(spec, capacity=10)
    noise = np.random.default_rng(0).integers(0, 256, [6, 32, 32, 3], dtype=np.uint8)  # JPEG would not keep it
    base = gathered(make_buffer_with_episodes(tfreplay.PyUniformReplayBuffer(SPEC, capacity=50)))
    items = {k: v[0, :5] for k, v in base.items()}  # a whole episode of 3 steps, then 2 of an unfinished one
    rb.add_batch(
        {
            **items,
            "observation": {"pixels": noise[:5], "speed": np.arange(5, dtype=np.float32)},
            "next_observation": {"pixels": noise[1:], "speed": np.arange(1, 6, dtype=np.float32)},
        }
    )
    assert datasets.save_minari(rb, "tests/pixels-v0", data_format=data_format) == 1
    dataset = minari.load_dataset("tests/pixels-v0")
    assert dataset.storage.jpeg_encoding is False
    assert minari.dataset.minari_storage.is_image_space(dataset.observation_space["pixels"])
    assert next(iter(dataset.iterate_episodes())).observations["pixels"].tobytes() == noise[:4].tobytes()
    target = tfreplay.PyUniformReplayBuffer(spec, capacity=10)
    datasets.load_minari(dataset, target)
    got = gathered(target)
    np.testing.assert_array_equal(got["observation"]["pixels"][0], noise[:3])
    np.testing.assert_array_equal(got["next_observation"]["pixels"][0], noise[1:4])


@pytest.mark.skipif(RAW_IMAGES, reason="minari >= 0.5.4 stores image spaces raw")
def test_image_spaces_are_refused_where_minari_would_encode_them():
    spec = {
        **SPEC,
        "observation": tf.TensorSpec([32, 32], tf.uint8),
        "next_observation": tf.TensorSpec([32, 32], tf.uint8),
    }
    with pytest.raises(
        ValueError, match=r"observation .* is an image space, which Minari .* stores only as lossy JPEG"
    ):
        datasets.save_minari(tfreplay.PyUniformReplayBuffer(spec, capacity=4), "tests/pixels-v0")


def test_save_refusals_write_nothing(minari_datasets, cartpole):
    source = make_buffer_with_episodes(tfreplay.PyUniformReplayBuffer(SPEC, capacity=50))
    cases = [
        (dict(dataset_id="tests/cartpole-v0"), ValueError, r"dataset_id \('tests/cartpole-v0'\) must be new; .*delete"),
        (
            dict(dataset_id="cartpole"),
            ValueError,
            r"dataset_id \('cartpole'\) must be '\(namespace/\)name-v\(version\)'",
        ),
        (dict(data_format="csv"), ValueError, r"data_format \('csv'\) must be one of 'hdf5', 'arrow', 'parquet'"),
        (dict(env="CartPole-v1"), ValueError, r"observation has shape \(2,\) in the buffer's spec; .* holds \(4,\)"),
        (
            dict(action_space=gym.spaces.Discrete(20)),
            TypeError,
            r"action has dtype int32 in the buffer's spec; the action_space \(Discrete\(20\)\) holds int64",
        ),
    ]
    for kwargs, error, message in cases:
        kwargs = {"dataset_id": "tests/new-v0", **kwargs}
        with pytest.raises(error, match=f"save_minari: {message}"):
            datasets.save_minari(source, **kwargs)
    no_next = tfreplay.PyUniformReplayBuffer({k: v for k, v in SPEC.items() if k != "next_observation"}, capacity=4)
    with pytest.raises(ValueError, match=r"has no 'next_observation' field, which a Minari episode needs"):
        datasets.save_minari(no_next, "tests/new-v0")
    with pytest.raises(ValueError, match=r"must store episode boundaries"):
        datasets.save_minari(tfreplay.PyUniformReplayBuffer({"x": OBS}, capacity=4), "tests/new-v0")
    assert not os.path.exists(minari_datasets / "tests" / "new-v0")


def test_without_minari_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "minari", None)  # `import minari` raises ImportError
    rb = tfreplay.PyUniformReplayBuffer(CARTPOLE, capacity=4)
    with pytest.raises(ImportError, match=r"load_minari needs Minari and Pillow: pip install 'tfreplay\[minari\]'"):
        datasets.load_minari("tests/cartpole-v0", rb)
    with pytest.raises(ImportError, match=r"save_minari needs .*tfreplay\[minari\]"):
        datasets.save_minari(rb, "tests/cartpole-v0")
