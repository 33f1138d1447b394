"""tfreplay.datasets: RLDS directories in both conventions into buffers, buffers out to RLDS, and back."""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest
import tensorflow as tf
from helpers import quick

import tfreplay

tfds = pytest.importorskip("tensorflow_datasets")
from tfreplay import datasets  # noqa: E402  (after the skip: the module needs tensorflow_datasets)

OBS = tf.TensorSpec([2], tf.float32)
SCALARS = {
    "action": tf.TensorSpec([], tf.int32),
    "reward": tf.TensorSpec([], tf.float32),
    "discount": tf.TensorSpec([], tf.float32),
    "step_type": tf.TensorSpec([], tf.int32),
    "terminated": tf.TensorSpec([], tf.bool),
    "truncated": tf.TensorSpec([], tf.bool),
}
SPEC = {"observation": OBS, "next_observation": OBS, **SCALARS}


def rlds_features(metadata=True):
    steps = {
        "observation": tfds.features.Tensor(shape=(2,), dtype=np.float32),
        "action": tfds.features.Tensor(shape=(), dtype=np.int32),
        "reward": tfds.features.Tensor(shape=(), dtype=np.float32),
        "discount": tfds.features.Tensor(shape=(), dtype=np.float32),
        **{mark: tfds.features.Tensor(shape=(), dtype=np.bool_) for mark in ("is_first", "is_last", "is_terminal")},
    }
    episode = {"episode_id": tfds.features.Tensor(shape=(), dtype=np.int64)} if metadata else {}
    return tfds.features.FeaturesDict({"steps": tfds.features.Dataset(steps), **episode})


def write_with_tfds(directory, episodes, features=None):
    """Writes episodes with TFDS's own writer (no tfreplay code), as other RLDS producers do."""
    info = tfds.core.DatasetInfo(
        builder=tfds.core.DatasetIdentity(
            name="producer", version=tfds.core.Version("1.0.0"), data_dir=directory, module_name="producer"
        ),
        features=features or rlds_features(),
    )
    os.makedirs(directory, exist_ok=True)
    writer = tfds.core.SequentialWriter(info, max_examples_per_shard=10)
    writer.initialize_splits(["train"])
    writer.add_examples({"train": episodes})
    writer.close_all()
    return directory


def episode_steps(episode_id, start, num, *, convention, terminal, ended=True):
    """RLDS steps whose observation `[v, -v]`, action and reward count up from `start` (float step values)."""
    extra = 1 if convention == "envlogger" and ended else 0
    values = np.arange(start, start + num + extra)
    action, reward = values.astype(np.int32), values.astype(np.float32)
    discount = np.ones(num + extra, np.float32)
    if extra:
        action[-1], reward[-1], discount[-1] = 0, 0.0, 0.0
    if terminal:
        discount[num - 1] = 0.0
    last = np.zeros(num + extra, bool)
    last[-1] = ended
    steps = {
        "observation": np.stack([values, -values], axis=1).astype(np.float32),
        "action": action,
        "reward": reward,
        "discount": discount,
        "is_first": np.arange(num + extra) == 0,
        "is_last": last,
        "is_terminal": last & terminal,
    }
    return {"episode_id": episode_id, "steps": steps}


def gathered(buffer):
    return {k: np.asarray(v) for k, v in buffer.gather_all().items()}


@pytest.fixture
def envlogger_dir(tmp_path):
    episodes = [
        episode_steps(7, 0, 3, convention="envlogger", terminal=True),
        episode_steps(8, 10, 4, convention="envlogger", terminal=False),
    ]
    return write_with_tfds(str(tmp_path / "envlogger"), episodes)


def test_envlogger_directory_gives_transitions_with_next_observations_and_metadata(envlogger_dir):
    rb = tfreplay.PyUniformReplayBuffer({**SPEC, "episode_id": tf.TensorSpec([], tf.int64)}, capacity=20)
    info = datasets.load_rlds(envlogger_dir, rb)
    assert info == datasets.LoadInfo(2, 7, 0, "envlogger")  # detected: the extra last steps hold zeros
    items = {k: v[0] for k, v in gathered(rb).items()}
    np.testing.assert_array_equal(items["action"], [0, 1, 2, 10, 11, 12, 13])
    np.testing.assert_array_equal(items["next_observation"][:, 0], [1, 2, 3, 11, 12, 13, 14])
    np.testing.assert_array_equal(items["step_type"], [0, 1, 1, 0, 1, 1, 1])
    np.testing.assert_array_equal(items["terminated"], [0, 0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(items["truncated"], [0, 0, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(items["episode_id"], [7, 7, 7, 8, 8, 8, 8])


def test_d4rl_directory_every_step_is_a_transition(tmp_path):
    episodes = [
        episode_steps(1, 0, 3, convention="d4rl", terminal=True),
        episode_steps(2, 10, 4, convention="d4rl", terminal=False),
    ]
    directory = write_with_tfds(str(tmp_path / "d4rl"), episodes)
    no_next = {k: v for k, v in SPEC.items() if k != "next_observation"}
    rb = tfreplay.PyUniformReplayBuffer(no_next, capacity=20)
    assert datasets.load_rlds(directory, rb) == datasets.LoadInfo(2, 7, 0, "d4rl")  # detected: nonzero last action
    items = {k: v[0] for k, v in gathered(rb).items()}
    np.testing.assert_array_equal(items["reward"], [0, 1, 2, 10, 11, 12, 13])
    np.testing.assert_array_equal(items["truncated"], [0, 0, 0, 0, 0, 0, 1])
    # With next_observation: the truncated episode's last step has none, so the step before it ends the episode.
    rb = tfreplay.PyUniformReplayBuffer(SPEC, capacity=20)
    assert datasets.load_rlds(directory, rb, convention="d4rl").num_items == 6
    items = {k: v[0] for k, v in gathered(rb).items()}
    np.testing.assert_array_equal(items["reward"], [0, 1, 2, 10, 11, 12])
    np.testing.assert_array_equal(items["next_observation"][:, 0], [1, 2, 2, 11, 12, 13])
    np.testing.assert_array_equal(items["terminated"], [0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(items["truncated"], [0, 0, 0, 0, 0, 1])


def test_a_forced_convention_overrides_detection(envlogger_dir):
    rb = tfreplay.PyUniformReplayBuffer({k: v for k, v in SPEC.items() if k != "next_observation"}, capacity=20)
    info = datasets.load_rlds(envlogger_dir, rb, convention="d4rl")
    assert info.num_items == 9  # the envlogger final steps read as transitions


def test_segments_receive_whole_episodes(tmp_path):
    lengths = [3, 5, 2, 4, 3]
    episodes, start = [], 0
    for i, n in enumerate(lengths):
        episodes.append(episode_steps(i, start, n, convention="envlogger", terminal=True))
        start += 100
    directory = write_with_tfds(str(tmp_path / "e"), episodes)
    rb = tfreplay.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=20)
    info = datasets.load_rlds(directory, rb)
    # Greedy: 3 -> 0, 5 -> 1, 2 -> 0, 4 -> 0 (5 vs 5: the first), 3 -> 1: segment 0 has 9 items, segment 1 has 8.
    assert info == datasets.LoadInfo(5, 16, 1, "envlogger")
    actions = gathered(rb)["action"]
    np.testing.assert_array_equal(actions[0], [0, 1, 2, 200, 201, 300, 301, 302])
    np.testing.assert_array_equal(actions[1], [100, 101, 102, 103, 104, 400, 401, 402])


@pytest.mark.parametrize("kind", ["PyFrameReplayBuffer", "PyPrioritizedFrameReplayBuffer"])
def test_numpy_frame_buffers_with_segments_leave_nothing_out(tmp_path, kind):
    lengths = [3, 5, 2]  # rows 4 and 3 to segment 0, 6 to segment 1: lockstep adds would leave one out
    episodes = [episode_steps(i, 100 * i, n, convention="envlogger", terminal=True) for i, n in enumerate(lengths)]
    directory = write_with_tfds(str(tmp_path / "e"), episodes)
    spec = dict(tfreplay.frame_data_spec((2,)), frame=OBS)
    spec["action"] = tf.TensorSpec([], tf.int32)
    rb = getattr(tfreplay, kind)(spec, batch_size=2, max_length=20, history_len=1, seed=0)
    info = datasets.load_rlds(directory, rb)
    # Each episode goes whole to one segment, as it comes: its first frame, then a row per step.
    assert info == datasets.LoadInfo(3, sum(lengths) + len(lengths), 0, "envlogger")
    assert int(rb.num_transitions()) == sum(lengths)
    np.testing.assert_array_equal(
        np.sort(rb.gather_all()["action"]),
        np.sort(np.concatenate([100 * i + np.arange(n) for i, n in enumerate(lengths)])),
    )


def test_frame_buffer_gets_frame_rows(envlogger_dir):
    spec = dict(tfreplay.frame_data_spec((2,)), frame=OBS)
    spec["action"] = tf.TensorSpec([], tf.int32)
    rb = tfreplay.PyFrameReplayBuffer(spec, capacity=20, history_len=1, seed=0)
    datasets.load_rlds(envlogger_dir, rb)
    assert int(rb.num_transitions()) == 7
    batch = rb.gather_all()
    np.testing.assert_array_equal(batch["action"], [0, 1, 2, 10, 11, 12, 13])
    np.testing.assert_array_equal(batch["next_observation"][:, 0, 0], [1, 2, 3, 11, 12, 13, 14])


def test_to_items_maps_fields(envlogger_dir):
    spec = {"obs": OBS, "r": tf.TensorSpec([], tf.float64), "first": tf.TensorSpec([], tf.bool)}

    def to_items(transitions, metadata):
        return {
            "obs": transitions["observation"],
            "r": transitions["reward"].astype(np.float64),
            "first": transitions["first"],
        }

    rb = tfreplay.PyUniformReplayBuffer(spec, capacity=20, within_episodes=True, seed=0)
    datasets.load_rlds(envlogger_dir, rb, to_items=to_items)
    np.testing.assert_array_equal(gathered(rb)["r"].reshape(-1), [0, 1, 2, 10, 11, 12, 13])
    windows, _ = rb.get_next(sample_batch_size=50, num_steps=3)
    assert all(np.all(np.diff(w) == 1) for w in windows["r"])  # windows never join the two episodes


def make_buffer_with_episodes(buffer):
    """Three episodes (terminated, truncated, terminated) of consistent transitions, and an unfinished one."""
    t = 0
    for length, terminal in [(3, True), (4, False), (2, True), (2, None)]:
        for k in range(length):
            end = k == length - 1 and terminal is not None
            buffer.add_batch(
                {
                    "observation": np.full([1, 2], t, np.float32),
                    "next_observation": np.full([1, 2], t + 1, np.float32),
                    "action": np.array([t], np.int32),
                    "reward": np.array([t / 2], np.float32),
                    "discount": np.array([0.0 if end and terminal else 1.0], np.float32),
                    "step_type": np.array([0 if k == 0 else 1], np.int32),
                    "terminated": np.array([end and bool(terminal)]),
                    "truncated": np.array([end and not terminal]),
                }
            )
            t += 1
        t += 1  # the next episode starts from a fresh observation
    return buffer


@pytest.mark.parametrize("convention", ["envlogger", "d4rl"])
def test_round_trip_keeps_items_and_episodes(tmp_path, convention):
    source = make_buffer_with_episodes(tfreplay.PyUniformReplayBuffer(SPEC, capacity=50))
    directory = str(tmp_path / "out")
    assert datasets.save_rlds(source, directory, convention=convention) == 3  # the unfinished one is left out
    read = tfds.builder_from_directory(directory).as_dataset(split="train")
    lengths = [int(ep["steps"].cardinality()) for ep in read]
    assert lengths == ([4, 5, 3] if convention == "envlogger" else [3, 4, 2])
    target = tfreplay.TFUniformReplayBuffer(SPEC, batch_size=1, max_length=50)
    info = datasets.load_rlds(directory, target)
    assert info.convention == convention  # recorded in the dataset's metadata
    want = {k: v[0, :9] for k, v in gathered(source).items()}
    got = {k: v[0] for k, v in gathered(target).items()}
    if convention == "d4rl":  # the truncated episode's last step has no next observation
        keep = np.arange(9) != 6
        want = {k: v[keep] for k, v in want.items()}
        want["truncated"][5] = True
        ended = want["terminated"]  # a terminated last step keeps its own observation as next_observation
        want["next_observation"][ended] = want["observation"][ended]
    for name in SPEC:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("within_episodes", [False, True])
def test_save_writes_only_whole_episodes_after_overwrites(tmp_path, within_episodes):
    source = tfreplay.PyUniformReplayBuffer(SPEC, capacity=8, within_episodes=within_episodes)
    make_buffer_with_episodes(source)  # 11 added: the first 3 are overwritten
    assert datasets.save_rlds(source, str(tmp_path / "out")) == 2


def test_episode_fields_become_metadata(tmp_path):
    spec = {**SPEC, "seed": tf.TensorSpec([], tf.int64)}
    source = tfreplay.PyUniformReplayBuffer(spec, capacity=50)
    inner = make_buffer_with_episodes(tfreplay.PyUniformReplayBuffer(SPEC, capacity=50))
    items = {k: v[0] for k, v in gathered(inner).items()}
    items["seed"] = np.cumsum(items["step_type"] == 0).astype(np.int64)
    source.add_batch(items)
    directory = str(tmp_path / "out")
    datasets.save_rlds(source, directory, episode_fields=["seed"])
    element_spec = tfds.builder_from_directory(directory).as_dataset(split="train").element_spec
    assert "seed" in element_spec and "seed" not in element_spec["steps"].element_spec
    target = tfreplay.PyUniformReplayBuffer(spec, capacity=50)
    datasets.load_rlds(directory, target)
    np.testing.assert_array_equal(gathered(target)["seed"][0], items["seed"][:9])


def test_writer_observer_writes_each_episode_when_it_ends_and_appends(tmp_path):
    directory = str(tmp_path / "live")
    source = make_buffer_with_episodes(tfreplay.PyUniformReplayBuffer(SPEC, capacity=50))
    rows = {k: v[0] for k, v in gathered(source).items()}
    with datasets.RldsWriter(directory, SPEC) as writer:
        for t in range(len(rows["action"])):  # two environments: the same stream, shifted by 100 in env 1
            batch = {
                k: np.stack([v[t], v[t] + (100 if k in ("action", "observation") else 0)]) for k, v in rows.items()
            }
            writer(batch)
            if t == 2:
                assert writer.num_episodes == 2  # both environments ended their first episode
    assert writer.num_episodes == 6
    with datasets.RldsWriter(directory, SPEC, append=True) as writer:
        writer({k: v[1:4] for k, v in rows.items()})  # three environments: none saw its episode start
        for t in range(3):  # the first episode again, in one environment
            writer({k: v[t : t + 1] for k, v in rows.items()})
    read = tfds.builder_from_directory(directory).as_dataset(split="train")
    assert [int(ep["steps"].cardinality()) for ep in read] == [4, 4, 5, 5, 3, 3, 4]
    rb = tfreplay.PyUniformReplayBuffer(SPEC, capacity=50)
    assert datasets.load_rlds(directory, rb).num_items == 3 + 3 + 4 + 4 + 2 + 2 + 3


def test_missing_field_is_named_and_the_buffer_is_unchanged(tmp_path):
    episodes = [episode_steps(0, 0, 3, convention="envlogger", terminal=True)]
    for episode in episodes:
        del episode["steps"]["reward"]
    features = rlds_features()
    steps = dict(features["steps"].feature)
    del steps["reward"]
    features = tfds.features.FeaturesDict({"steps": tfds.features.Dataset(steps), "episode_id": features["episode_id"]})
    directory = write_with_tfds(str(tmp_path / "no_reward"), episodes, features)
    rb = tfreplay.PyUniformReplayBuffer(SPEC, capacity=20)
    with pytest.raises(ValueError, match=r"load_rlds: the buffer's field 'reward' has no source"):
        datasets.load_rlds(directory, rb)
    assert rb.num_frames() == 0


def test_wrong_dtype_is_named(envlogger_dir):
    spec = {**SPEC, "reward": tf.TensorSpec([], tf.float64)}
    rb = tfreplay.PyUniformReplayBuffer(spec, capacity=20)
    with pytest.raises(TypeError, match=r"load_rlds: reward has dtype float32 .* the spec expects float64"):
        datasets.load_rlds(envlogger_dir, rb)
    assert rb.num_frames() == 0


def test_a_directory_of_another_layout_is_refused(tmp_path):
    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Tensor(shape=(2,), dtype=np.uint8),
            "label": tfds.features.Tensor(shape=(), dtype=np.int64),
        }
    )
    directory = write_with_tfds(str(tmp_path / "images"), [{"image": np.zeros(2, np.uint8), "label": 1}], features)
    rb = tfreplay.PyUniformReplayBuffer(SPEC, capacity=20)
    with pytest.raises(
        ValueError, match=r"must hold RLDS episodes, dicts with a 'steps' dataset; .*\['image', 'label'\]"
    ):
        datasets.load_rlds(directory, rb)
    with pytest.raises(ValueError, match=r"must be a TFDS dataset directory"):
        datasets.load_rlds(str(tmp_path), rb)
    assert rb.num_frames() == 0


def test_save_refuses_an_existing_dataset_and_another_layout(tmp_path, envlogger_dir):
    source = make_buffer_with_episodes(tfreplay.PyUniformReplayBuffer(SPEC, capacity=50))
    with pytest.raises(ValueError, match=r"already holds a dataset; pass append=True"):
        datasets.save_rlds(source, envlogger_dir)
    with pytest.raises(ValueError, match=r"holds dataset 'producer'"):
        datasets.save_rlds(source, envlogger_dir, append=True)
    no_boundaries = tfreplay.PyUniformReplayBuffer({"x": tf.TensorSpec([], tf.int64)}, capacity=4)
    with pytest.raises(ValueError, match=r"must store episode boundaries"):
        datasets.save_rlds(no_boundaries, str(tmp_path / "x"))
    assert not os.path.exists(tmp_path / "x")


def generated_episodes(num_episodes, length, width):
    """A dataset of RLDS episodes made on the fly by tf.data: nothing of it is held in memory at once."""

    def episode(i):
        values = tf.cast(tf.range(length + 1) + tf.cast(i, tf.int32) * 1000, tf.float32)
        last = tf.range(length + 1) == length
        steps = {
            "observation": tf.tile(values[:, None], [1, width]),
            "action": tf.zeros([length + 1], tf.int32),
            "reward": tf.ones([length + 1], tf.float32),
            "discount": tf.ones([length + 1], tf.float32),
            "is_first": tf.range(length + 1) == 0,
            "is_last": last,
            "is_terminal": last,
        }
        return {"steps": tf.data.Dataset.from_tensor_slices(steps)}

    return tf.data.Dataset.range(num_episodes).map(episode)


def test_streaming_memory_is_bounded_by_the_buffer_not_the_dataset():
    width, length, capacity = 256, 100, 2_000
    num_episodes = 3 * capacity // length  # the dataset is 3x the buffer
    obs = tf.TensorSpec([width], tf.float32)
    rb = tfreplay.PyUniformReplayBuffer({**SPEC, "observation": obs, "next_observation": obs}, capacity=capacity)
    dataset_bytes = num_episodes * (length + 1) * width * 4
    tracemalloc.start()
    try:
        info = datasets.load_rlds(generated_episodes(num_episodes, length, width), rb, convention="envlogger")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.num_items == num_episodes * length and rb.num_frames() == capacity
    assert peak < dataset_bytes / 4, (peak, dataset_bytes)  # a few episodes at a time, not the dataset
    newest = rb.gather_all()["observation"][0, -1, 0]
    assert newest == (num_episodes - 1) * 1000 + length - 1


@pytest.mark.parametrize(
    "kind", quick(["TFFrameReplayBuffer", "TFPrioritizedFrameReplayBuffer"], "TFFrameReplayBuffer")
)
def test_tf_frame_buffers_get_the_numpy_twins_rows(envlogger_dir, kind):
    spec = dict(tfreplay.frame_data_spec((2,)), frame=OBS)
    spec["action"] = tf.TensorSpec([], tf.int32)
    numpy_twin = tfreplay.PyFrameReplayBuffer(spec, capacity=20, history_len=1, seed=0)
    datasets.load_rlds(envlogger_dir, numpy_twin)
    rb = getattr(tfreplay, kind)(spec, batch_size=1, max_length=20, history_len=1)
    datasets.load_rlds(envlogger_dir, rb)
    assert int(rb.num_transitions()) == 7
    tf.nest.map_structure(
        lambda want, got: np.testing.assert_array_equal(np.asarray(got).reshape(np.shape(want)), want),
        numpy_twin.gather_all(),
        rb.gather_all(),
    )


def test_tf_prioritized_buffer_loads_every_episode_whole(envlogger_dir):
    rb = tfreplay.TFPrioritizedReplayBuffer(SPEC, batch_size=1, max_length=20)
    info = datasets.load_rlds(envlogger_dir, rb)
    assert info.num_items == int(rb.num_frames()) == 7
    np.testing.assert_array_equal(gathered(rb)["action"].reshape(-1), [0, 1, 2, 10, 11, 12, 13])


def ragged_source(episodes):
    """A `tf.data.Dataset` of RLDS episodes whose observations may differ in width, across and within episodes."""
    steps = [episode["steps"] for episode in episodes]
    bounds = tf.constant(np.cumsum([0, *(len(s["is_first"]) for s in steps)]))
    observation = tf.ragged.constant([np.asarray(o).tolist() for s in steps for o in s["observation"]], tf.float32)
    rest = {name: tf.constant(np.concatenate([s[name] for s in steps])) for name in steps[0] if name != "observation"}
    ids = tf.constant([episode["episode_id"] for episode in episodes], tf.int64)

    def episode(i):
        fields = {name: value[bounds[i] : bounds[i + 1]] for name, value in rest.items()}
        fields["observation"] = observation[bounds[i] : bounds[i + 1]]
        dense = lambda step: dict(step, observation=tf.reshape(step["observation"], [-1]))  # noqa: E731
        return {"episode_id": ids[i], "steps": tf.data.Dataset.from_tensor_slices(fields).map(dense)}

    return tf.data.Dataset.range(len(episodes)).map(episode)


def widen(steps):
    steps["observation"] = np.concatenate([steps["observation"], steps["observation"][:, :1]], 1)


def ragged(first, stop):
    """Steps `[first, stop)` of another width: the steps of one episode cannot be batched, or the batches joined."""

    def malform(steps):
        observations = list(steps["observation"])
        for k in range(first, stop):
            observations[k] = np.zeros(3, np.float32)
        steps["observation"] = observations

    return malform


def set_mark(name, step, value):
    def malform(steps):
        steps[name][step] = value

    return malform


UNREADABLE = r"episode 2 of the RLDS dataset \(.*\): observation must be readable, one shape in every step; .*raised "
# A malformed third episode (index 2, after two good ones): how it is malformed, and what the refusal says.
MALFORMED_RLDS = {
    "wider observations": (widen, r"observation has shape \(3,\) where episode 2 of the RLDS dataset \(.*\) gives"),
    "a step of another width": (ragged(1, 2), UNREADABLE + "InvalidArgumentError"),
    "a chunk of steps of another width": (ragged(2, 4), UNREADABLE + "ValueError"),  # chunk_size=2
    "no is_first": (
        set_mark("is_first", 0, False),
        r"episode 2 of the RLDS dataset \(.*\), step 0: is_first \(False\) must be True at the episode's first step",
    ),
    "a second is_first": (
        set_mark("is_first", 2, True),
        r"episode 2 of the RLDS dataset \(.*\), step 2: is_first \(True\) must be .* False after it",
    ),
    "is_last in the middle": (
        set_mark("is_last", 1, True),
        r"episode 2 of the RLDS dataset \(.*\), step 1: is_last \(True\) must be False before the episode's last step",
    ),
    "is_terminal without is_last": (
        set_mark("is_terminal", 1, True),
        r"episode 2 of the RLDS dataset \(.*\), step 1: is_terminal \(True\) must be False where is_last is False",
    ),
}


@pytest.fixture(params=quick(["PyUniformReplayBuffer", "TFUniformReplayBuffer"], "PyUniformReplayBuffer"))
def prefilled(request, envlogger_dir):
    """A buffer that holds the 7 items of `envlogger_dir`, and what it holds."""
    if request.param == "PyUniformReplayBuffer":
        rb = tfreplay.PyUniformReplayBuffer(SPEC, capacity=50)
    else:
        rb = tfreplay.TFUniformReplayBuffer(SPEC, batch_size=1, max_length=50)
    datasets.load_rlds(envlogger_dir, rb)
    return rb, gathered(rb)


def assert_unchanged(rb, before):
    assert int(rb.num_frames()) == len(before["action"][0]) == 7
    for name, value in gathered(rb).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


@pytest.mark.parametrize("case", sorted(MALFORMED_RLDS))
def test_a_malformed_later_episode_is_refused_and_the_buffer_is_unchanged(prefilled, case):
    malform, message = MALFORMED_RLDS[case]
    episodes = [episode_steps(i, 100 * i, 3, convention="envlogger", terminal=True) for i in range(3)]
    malform(episodes[2]["steps"])
    rb, before = prefilled
    with pytest.raises(ValueError, match=f"load_rlds: {message}"):
        datasets.load_rlds(ragged_source(episodes), rb, chunk_size=2)
    assert_unchanged(rb, before)


TO_ITEMS_REFUSALS = {  # what to_items does wrong for episode 2 only, and what the refusal says
    "a dtype": (
        lambda items: dict(items, reward=items["reward"].astype(np.float64)),
        TypeError,
        r"reward has dtype float64 where to_items, for episode 2 of the RLDS dataset \('.*good'\), gives it",
    ),
    "a field a row short": (
        lambda items: dict(items, next_observation=items["next_observation"][:-1]),
        ValueError,
        r"the items of episode 2 of the RLDS dataset \('.*good'\) \(.*next_observation: 2 rows.*\) must have one "
        "row per item",
    ),
}


@pytest.mark.parametrize("case", sorted(TO_ITEMS_REFUSALS))
def test_to_items_that_fails_on_a_later_episode_leaves_the_buffer_unchanged(tmp_path, prefilled, case):
    spoil, error, message = TO_ITEMS_REFUSALS[case]
    episodes = [episode_steps(i, 100 * i, 3, convention="envlogger", terminal=True) for i in range(3)]
    directory = write_with_tfds(str(tmp_path / "good"), episodes)

    def to_items(transitions, metadata):
        items = {name: transitions[name] for name in SPEC}
        return spoil(items) if metadata["episode_id"] == 2 else items

    rb, before = prefilled
    with pytest.raises(error, match=f"load_rlds: {message}"):
        datasets.load_rlds(directory, rb, to_items=to_items)
    assert_unchanged(rb, before)


def test_a_source_read_in_another_order_the_second_time_is_added_whole(prefilled):
    episodes = [episode_steps(i, 100 * i, 2 + i, convention="envlogger", terminal=True) for i in range(4)]
    source = ragged_source(episodes).shuffle(4, seed=0, reshuffle_each_iteration=True)
    rb, before = prefilled
    assert datasets.load_rlds(source, rb).num_items == 2 + 3 + 4 + 5
    assert int(rb.num_frames()) == 7 + 14
    np.testing.assert_array_equal(np.sort(gathered(rb)["action"][0, 7:]) // 100, np.repeat(np.arange(4), [2, 3, 4, 5]))


def test_a_source_that_changes_between_its_reads_is_named():
    reads = tf.Variable(0)

    def episode(i):
        num = 2 + reads.assign_add(1)  # each episode read is longer than the one before: 3, 4, 5, then 6, ...
        steps = {
            "observation": tf.zeros([num, 2]),
            "is_first": tf.range(num) == 0,
            "is_last": tf.range(num) == num - 1,
            "is_terminal": tf.zeros([num], tf.bool),
        }
        return {"steps": tf.data.Dataset.from_tensor_slices(steps)}

    rb = tfreplay.PyUniformReplayBuffer({"observation": OBS}, capacity=5000)
    source = tf.data.Dataset.range(3).map(episode)
    message = r"load_rlds: the RLDS dataset \(a tf.data.Dataset\) must give the same episodes on each read: .* 5 items"
    with pytest.raises(ValueError, match=message):
        datasets.load_rlds(source, rb, convention="envlogger")
