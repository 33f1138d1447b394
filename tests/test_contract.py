"""The replay-buffer contract, run over both buffers (and the TF one in tf.function).

Items carry their global id in every leaf (see conftest), so every check is by
value: which items come back, in which order, and that none is torn.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    SPEC,
    Api,
    assert_nest_equal,
    decode,
    make_buffer,
    make_items,
    state,
    to_numpy,
    variables_bytes,
)
from tensorflow.python.framework import tensor_spec  # BoundedTensorSpec has no public alias

from tfreplay import BufferInfo, PyUniformReplayBuffer, ReplayBuffer, TFUniformReplayBuffer


def live_ids(batch_size: int, max_length: int, num_adds: int) -> np.ndarray:
    """The model: global ids stored after `num_adds` adds, `[batch_size, time]`."""
    local = np.arange(max(0, num_adds - max_length), num_adds)
    return local[None, :] * batch_size + np.arange(batch_size)[:, None]


def check_windows(ids: np.ndarray, batch_size: int, max_length: int, num_adds: int) -> None:
    """Each window (last axis) is consecutive in one segment and entirely live."""
    segment, local = ids % batch_size, ids // batch_size
    assert (segment == segment[..., :1]).all(), "a window mixes segments"
    assert (np.diff(local, axis=-1) == 1).all(), "a window is not consecutive"
    assert (local >= max(0, num_adds - max_length)).all() and (local < num_adds).all(), "a window holds a dead item"


# --- add, sample, wrap-around ---------------------------------------------------------


def test_single_sample_has_no_batch_dimension(make_api):
    api = make_api(batch_size=2, max_length=3)
    api.add_steps(2)
    items, info = api.get_next()
    assert items["obs"]["pixels"].shape == (4, 4) and items["id"].shape == ()
    assert decode(items) == info.ids and 0 <= info.ids < 4
    assert info.probabilities == pytest.approx(1 / 4)


def test_batch_samples_are_live_items_with_their_ids(make_api):
    api = make_api(batch_size=2, max_length=3)
    api.add_steps(2)
    items, info = api.get_next(sample_batch_size=50)
    assert items["obs"]["vec"].shape == (50, 3) and info.probabilities.shape == (50,)
    np.testing.assert_array_equal(decode(items), info.ids)
    assert set(info.ids.tolist()) == {0, 1, 2, 3}
    np.testing.assert_allclose(info.probabilities, 1 / 4)


def test_wrap_around_keeps_the_newest_max_length_per_segment(make_api):
    api = make_api(batch_size=2, max_length=3)
    api.add_steps(5)
    assert api.num_frames() == 6
    np.testing.assert_array_equal(decode(api.gather_all()), [[4, 6, 8], [5, 7, 9]])
    items, info = api.get_next(sample_batch_size=300)
    np.testing.assert_array_equal(decode(items), info.ids)
    assert set(info.ids.tolist()) == {4, 5, 6, 7, 8, 9}


def test_num_frames_counts_stored_items_not_added_ones(make_api):
    api = make_api(batch_size=3, max_length=2)
    counts = []
    for _ in range(4):
        counts.append(api.num_frames())
        api.add_steps(1)
    assert counts + [api.num_frames()] == [0, 3, 6, 6, 6]
    assert api.rb.capacity == 6 and api.rb.batch_size == 3 and api.rb.max_length == 2


# --- windows -----------------------------------------------------------------------------


@pytest.mark.parametrize("num_adds", [3, 8], ids=["before-wrap", "after-wrap"])
def test_windows_are_consecutive_in_one_segment_and_never_cross_the_write_head(make_api, num_adds):
    api = make_api(batch_size=3, max_length=5)
    api.add_steps(num_adds)
    items, info = api.get_next(sample_batch_size=400, num_steps=3)
    assert items["obs"]["pixels"].shape == (400, 3, 4, 4) and info.ids.shape == (400, 3)
    np.testing.assert_array_equal(decode(items), info.ids)
    check_windows(info.ids, 3, 5, num_adds)
    starts = live_ids(3, 5, num_adds)[:, :-2]
    assert set(info.ids[:, 0].tolist()) == set(starts.ravel().tolist()), "some valid start is never drawn"
    np.testing.assert_allclose(info.probabilities, 1 / starts.size)


def test_window_without_batch_size_is_time_major(make_api):
    api = make_api(batch_size=2, max_length=4)
    api.add_steps(6)
    items, info = api.get_next(num_steps=4)
    assert items["obs"]["vec"].shape == (4, 3) and info.ids.shape == (4,)
    np.testing.assert_array_equal(decode(items), info.ids)
    check_windows(info.ids, 2, 4, 6)


def test_time_stacked_false_returns_a_tuple_of_items(make_api):
    api = make_api(batch_size=2, max_length=4)
    api.add_steps(6)
    steps, info = api.get_next(sample_batch_size=5, num_steps=3, time_stacked=False)
    assert isinstance(steps, tuple) and len(steps) == 3 and len(info.ids) == 3
    for step, ids in zip(steps, info.ids):
        assert step["obs"]["pixels"].shape == (5, 4, 4)
        np.testing.assert_array_equal(decode(step), ids)
    check_windows(np.stack(info.ids, axis=-1), 2, 4, 6)
    single, info = api.get_next(num_steps=2, time_stacked=False)
    assert len(single) == 2 and single[0]["id"].shape == ()
    assert decode(single[1]) == decode(single[0]) + 2 == info.ids[1]


# --- gather_all, clear ---------------------------------------------------------------------


def test_gather_all_is_batch_major_in_insertion_order(make_api):
    api = make_api(batch_size=2, max_length=4)
    api.add_steps(3)
    everything = api.gather_all()
    assert everything["obs"]["pixels"].shape == (2, 3, 4, 4) and everything["done"].shape == (2, 3)
    np.testing.assert_array_equal(decode(everything), [[0, 2, 4], [1, 3, 5]])
    api.add_steps(3)
    np.testing.assert_array_equal(decode(api.gather_all()), live_ids(2, 4, 6))


def test_clear_really_empties(make_api):
    api = make_api(batch_size=2, max_length=3)
    api.add_steps(5)
    api.clear()
    assert api.num_frames() == 0
    assert api.gather_all()["obs"]["pixels"].shape == (2, 0, 4, 4)
    with pytest.raises(api.error, match="get_next: the buffer is empty; add items before sampling"):
        api.get_next(sample_batch_size=4)
    assert api.rb.capacity == 6 and api.rb.data_spec == SPEC
    api.add_batch(make_items([100, 101]))
    np.testing.assert_array_equal(decode(api.gather_all()), [[100], [101]])
    items, info = api.get_next(sample_batch_size=50)
    assert set(decode(items).tolist()) == {100, 101} and set(info.ids.tolist()) == {0, 1}


# --- errors ---------------------------------------------------------------------------------


def test_sampling_an_empty_buffer_is_an_error(make_api):
    api = make_api(batch_size=2, max_length=3)
    with pytest.raises(api.error, match="get_next: the buffer is empty; add items before sampling"):
        api.get_next()
    api.add_steps(1)
    with pytest.raises(api.error, match=r"no segment holds 2 consecutive items yet \(num_steps=2\)"):
        api.get_next(sample_batch_size=3, num_steps=2)


def test_num_steps_longer_than_max_length_says_so(make_api):
    api = make_api(batch_size=2, max_length=3)
    api.add_steps(5)
    with pytest.raises(ValueError, match=r"get_next: num_steps \(4\) must be at most max_length \(3\)"):
        api.get_next(num_steps=4)
    with pytest.raises(ValueError, match=r"as_dataset: num_steps \(4\) must be at most max_length \(3\)"):
        api.rb.as_dataset(num_steps=4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sample_batch_size=0), r"get_next: sample_batch_size \(0\) must be a positive integer"),
        (dict(sample_batch_size=-2), r"get_next: sample_batch_size \(-2\) must be a positive integer"),
        (dict(sample_batch_size=2.0), r"get_next: sample_batch_size \(2.0\) must be a positive integer"),
        (dict(sample_batch_size=True), r"get_next: sample_batch_size \(True\) must be a positive integer"),
        (dict(num_steps=0), r"get_next: num_steps \(0\) must be a positive integer"),
    ],
    ids=["zero", "negative", "float", "bool", "zero-steps"],
)
def test_non_positive_sample_sizes_are_rejected(make_api, kwargs, message):
    api = make_api(batch_size=2, max_length=3)
    api.add_steps(3)
    with pytest.raises(ValueError, match=message):
        api.get_next(**kwargs)
    with pytest.raises(ValueError, match=message.replace("get_next", "as_dataset")):
        api.rb.as_dataset(**kwargs)


def test_as_dataset_rejects_bad_arguments(buffer_cls):
    rb = buffer_cls(SPEC, batch_size=2, max_length=3)
    with pytest.raises(ValueError, match=r"as_dataset: num_parallel_calls \(0\) must be a positive integer"):
        rb.as_dataset(num_parallel_calls=0)
    with pytest.raises(TypeError, match=r"as_dataset: sequence_preprocess_fn \(3\) must be callable"):
        rb.as_dataset(sequence_preprocess_fn=3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0, max_length=3), r"batch_size \(0\) must be a positive integer"),
        (dict(batch_size=2, max_length=0), r"max_length \(0\) must be a positive integer"),
        (dict(batch_size=2, max_length=-1), r"max_length \(-1\) must be a positive integer"),
        (dict(batch_size=2, max_length=3, dataset_window_shift=0), r"dataset_window_shift \(0\) must be a positive"),
    ],
    ids=["batch_size", "max_length-zero", "max_length-negative", "window_shift"],
)
def test_non_positive_construction_sizes_are_rejected(buffer_cls, kwargs, message):
    with pytest.raises(ValueError, match=f"{buffer_cls.__name__}: {message}"):
        buffer_cls(SPEC, **kwargs)


def _without_done(items):
    del items["done"]


def _with_reward(items):
    items["reward"] = np.zeros(2, np.float32)


def _as_list(items):
    return [items["obs"], items["action"], items["done"], items["id"]]


def _set(path, fn):
    def mutate(items):
        *parents, leaf = path.split("/")
        node = items
        for key in parents:
            node = node[key]
        node[leaf] = fn(node[leaf])

    return mutate


BAD_BATCHES = {
    "missing-leaf": (_without_done, TypeError, r"add_batch: items \(missing \['done'\], unexpected \[\]\) must have"),
    "extra-leaf": (_with_reward, TypeError, r"add_batch: items \(missing \[\], unexpected \['reward'\]\) must have"),
    "renamed-leaf": (
        lambda items: items.update(idx=items.pop("id")),
        TypeError,
        r"add_batch: items \(missing \['id'\], unexpected \['idx'\]\) must have the structure",
    ),
    "wrong-container": (_as_list, TypeError, r"add_batch: items \(.*\) must have the structure of data_spec"),
    "python-list-leaf": (_set("action", list), TypeError, r"unexpected \['action/0', 'action/1'\]"),
    "dtype-float": (
        _set("obs/vec", lambda x: x.astype(np.float64)),
        TypeError,
        r"add_batch: obs/vec has dtype float64; the spec expects float32",
    ),
    "dtype-int": (
        _set("action", lambda x: x.astype(np.int64)),
        TypeError,
        r"add_batch: action has dtype int64; the spec expects int32",
    ),
    "inner-shape": (
        _set("obs/pixels", lambda x: x[:, :3]),
        ValueError,
        r"add_batch: obs/pixels has shape \(3, 4\); the spec expects \(4, 4\) after the batch dimension",
    ),
    "inner-rank": (
        _set("obs/vec", lambda x: x[..., None]),
        ValueError,
        r"add_batch: obs/vec has shape \(2, 3, 1\); it must be \[batch\] \+ \[3\]",
    ),
    "no-batch-dim": (
        _set("id", lambda x: x[0]),
        ValueError,
        r"add_batch: id has shape \(\); it must be \[batch\] \+ \[\] \(an outer batch dimension",
    ),
    "batch-size": (
        lambda items: items.update(make_items([10, 11, 12])),
        ValueError,
        r"add_batch: action has outer \(batch\) dimension 3; it must equal the buffer's batch_size \(2\)",
    ),
    "mismatched-outer": (
        _set("obs/vec", lambda x: x[:1]),
        ValueError,
        r"add_batch: obs/vec has outer \(batch\) dimension 1; it must equal the buffer's batch_size \(2\)",
    ),
}


_REFERENCE_STATES = {}


def filled(variant: str) -> Api:
    """A wrapped buffer (the next write would overwrite a live item), filled eagerly."""
    api = Api(make_buffer(variant, 2, 3, seed=5), False)
    api.add_steps(4)
    return api


def reference_state(variant: str):
    """`state` of an untouched `filled` buffer (the same for every case)."""
    if variant not in _REFERENCE_STATES:
        _REFERENCE_STATES[variant] = state(filled(variant), num_steps=2)
    return _REFERENCE_STATES[variant]


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_a_rejected_batch_names_the_leaf_and_changes_nothing(variant, case):
    mutate, error, message = BAD_BATCHES[case]
    subject = filled(variant)
    raw_before = variables_bytes(subject.rb) if variant != "py" else None
    items = make_items([10, 11])
    items = mutate(items) or items
    with pytest.raises(error, match=message):
        Api(subject.rb, "function" in variant).add_batch(items)
    if raw_before is not None:
        assert variables_bytes(subject.rb) == raw_before
    assert_nest_equal(state(subject, num_steps=2), reference_state(variant))


def test_runtime_shape_checks_in_a_graph_leave_the_buffer_unchanged():
    """Unknown dimensions are checked when the graph runs; no leaf is written first."""
    subject = filled("tf-eager")
    signature = tf.nest.map_structure(lambda s: tf.TensorSpec([None] + s.shape.as_list(), s.dtype), SPEC)
    add = tf.function(subject.rb.add_batch, input_signature=[signature])
    bad_batch = make_items([10, 11, 12])
    torn = make_items([10, 11])
    torn["id"] = torn["id"][:1]  # one short leaf: the others would fit the scatter
    raw_before = variables_bytes(subject.rb)
    for items, leaf in ((bad_batch, "action"), (torn, "id")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"add_batch: {leaf} must have shape \[2\]"):
            add(items)
    assert variables_bytes(subject.rb) == raw_before
    assert_nest_equal(state(subject, num_steps=2), reference_state("tf-eager"))
    add(make_items([8, 9]))
    np.testing.assert_array_equal(decode(subject.gather_all()), [[4, 6, 8], [5, 7, 9]])


def test_the_abstract_base_cannot_be_instantiated():
    with pytest.raises(TypeError, match="abstract"):
        ReplayBuffer(SPEC, 10)


# --- as_dataset -----------------------------------------------------------------------------


@pytest.mark.parametrize("sample_batch_size, num_steps", [(None, None), (6, None), (None, 3), (6, 3)])
def test_dataset_elements_are_items_and_buffer_info(buffer_cls, sample_batch_size, num_steps):
    rb = buffer_cls(SPEC, batch_size=2, max_length=4, seed=1)
    api = Api(rb, False)
    api.add_steps(6)
    ds = rb.as_dataset(sample_batch_size, num_steps)
    outer = [d for d in (sample_batch_size, num_steps) if d is not None]
    items_spec, info_spec = ds.element_spec
    assert isinstance(info_spec, BufferInfo)
    assert items_spec["obs"]["pixels"].shape == outer + [4, 4] and items_spec["done"].dtype == tf.bool
    assert info_spec.ids.shape == outer
    assert info_spec.probabilities.shape == ([] if sample_batch_size is None else [sample_batch_size])
    for items, info in ds.take(3):
        assert isinstance(info, BufferInfo)
        ids = info.ids.numpy()
        np.testing.assert_array_equal(decode(items), ids)
        if num_steps:
            check_windows(ids, 2, 4, 6)
        windows = 2 * (4 - (num_steps or 1) + 1)
        np.testing.assert_allclose(info.probabilities.numpy(), 1 / windows)


def test_dataset_sees_items_added_after_it_was_made(buffer_cls):
    rb = buffer_cls(SPEC, batch_size=2, max_length=3, seed=1)
    api = Api(rb, False)
    ds = rb.as_dataset(8, num_steps=2)
    api.add_steps(2)
    iterator = iter(ds)
    assert set(next(iterator)[1].ids.numpy().ravel().tolist()) <= {0, 1, 2, 3}
    api.add_steps(3)  # every earlier item is overwritten
    # tf.data may have prefetched a few elements drawn before the add.
    fresh = [(info.ids.numpy() >= 4).all() for _, info in (next(iterator) for _ in range(10))]
    assert fresh[-1] and fresh == sorted(fresh), fresh
    items, info = next(iterator)
    np.testing.assert_array_equal(decode(items), info.ids.numpy())
    assert (info.ids.numpy() >= 4).all()


@pytest.mark.parametrize("num_parallel_calls", [2, tf.data.AUTOTUNE])
def test_dataset_with_parallel_calls_draws_valid_windows(buffer_cls, num_parallel_calls):
    rb = buffer_cls(SPEC, batch_size=3, max_length=4, seed=1)
    Api(rb, False).add_steps(7)
    for items, info in rb.as_dataset(16, num_steps=2, num_parallel_calls=num_parallel_calls).take(8):
        np.testing.assert_array_equal(decode(items), info.ids.numpy())
        check_windows(info.ids.numpy(), 3, 4, 7)


def test_sequence_preprocess_fn_sees_stacked_batches(buffer_cls):
    rb = buffer_cls(SPEC, batch_size=2, max_length=4, seed=1)
    Api(rb, False).add_steps(4)
    seen = []

    def preprocess(items):
        seen.append(items["obs"]["pixels"].shape.as_list())
        return {"id": items["id"] * 10, "next_id": items["id"][:, 1:]}

    for items, info in rb.as_dataset(5, num_steps=3, sequence_preprocess_fn=preprocess).take(2):
        np.testing.assert_array_equal(items["id"], info.ids * 10)
        np.testing.assert_array_equal(items["next_id"], info.ids[:, 1:])
    assert seen == [[5, 3, 4, 4]]


def test_stateful_dataset_tells_tf_data_to_ignore_the_buffer_state(buffer_cls):
    policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    for single_pass in (False, True):
        stateful = buffer_cls(SPEC, batch_size=2, max_length=3, stateful_dataset=True)
        assert stateful.stateful_dataset
        options = stateful.as_dataset(2, single_deterministic_pass=single_pass).options()
        assert options.experimental_external_state_policy == policy
        plain = buffer_cls(SPEC, batch_size=2, max_length=3).as_dataset(2, single_deterministic_pass=single_pass)
        assert plain.options().experimental_external_state_policy != policy


def test_dataset_iterates_inside_tf_function():
    rb = TFUniformReplayBuffer(SPEC, batch_size=2, max_length=3, seed=1)
    Api(rb, False).add_steps(5)

    @tf.function
    def total_of_sampled_ids():
        total = tf.constant(0, tf.int64)
        for items, info in rb.as_dataset(4, num_steps=2).take(3):
            tf.debugging.assert_equal(items["id"], info.ids)
            total += tf.reduce_sum(tf.cast(info.ids >= 4, tf.int64))
        return total

    assert total_of_sampled_ids().numpy() == 3 * 4 * 2


# --- single deterministic pass ----------------------------------------------------------


def single_pass_model(batch_size, max_length, num_adds, sample_batch_size, num_steps, shift, drop):
    """Expected ids per element: TF-Agents' order, computed by hand.

    Unbatched: each segment in turn, its live items in windows of `num_steps`
    every `shift` (a short last window unless `drop`). Batched: groups of
    `sample_batch_size` segments (a short last group unless `drop`), each
    yielding its windows side by side; as in TF-Agents, a short last window is
    dropped there (a batch cannot mix window lengths).
    """
    live = live_ids(batch_size, max_length, num_adds).tolist()

    def windows(seq, drop_short):
        if num_steps is None:
            return list(seq)
        out = [seq[i : i + num_steps] for i in range(0, len(seq), shift or num_steps)]
        return [w for w in out if len(w) == num_steps or not drop_short]

    if sample_batch_size is None:
        return [w for segment in live for w in windows(segment, drop)]
    groups = [list(range(g, min(g + sample_batch_size, batch_size))) for g in range(0, batch_size, sample_batch_size)]
    groups = [g for g in groups if len(g) == sample_batch_size or not drop]
    times = list(range(len(live[0])))

    def element(group, window):  # [segments, time] or, without num_steps, [segments]
        return [[live[s][t] for t in window] if num_steps else live[s][window] for s in group]

    return [element(g, w) for g in groups for w in windows(times, True)]


SINGLE_PASS_CASES = {
    "items": (None, None, None, False),
    "windows": (None, 2, None, False),
    "windows-short-last": (None, 3, None, False),
    "windows-drop-short": (None, 3, None, True),
    "windows-shift-1": (None, 2, 1, False),
    "windows-shift-1-drop": (None, 3, 1, True),
    "batched-items": (2, None, None, False),
    "batched-items-drop": (2, None, None, True),
    "batched-windows": (2, 2, None, False),
    "batched-windows-all-segments": (3, 2, None, False),
    "batched-windows-short-dropped": (2, 3, None, False),
    "batched-windows-shift-1": (3, 2, 1, False),
}


@pytest.mark.parametrize("num_adds", [3, 6], ids=["partial", "wrapped"])
@pytest.mark.parametrize("case", sorted(SINGLE_PASS_CASES))
def test_single_deterministic_pass(buffer_cls, case, num_adds):
    sample_batch_size, num_steps, shift, drop = SINGLE_PASS_CASES[case]
    rb = buffer_cls(SPEC, batch_size=3, max_length=4, dataset_window_shift=shift, dataset_drop_remainder=drop)
    Api(rb, False).add_steps(num_adds)
    ds = rb.as_dataset(sample_batch_size, num_steps, num_parallel_calls=2, single_deterministic_pass=True)
    got = []
    for items, info in ds:
        np.testing.assert_array_equal(decode(items), info.ids.numpy())
        assert info.probabilities == ()
        got.append(info.ids.numpy().tolist())
    assert got == single_pass_model(3, 4, num_adds, sample_batch_size, num_steps, shift, drop)


def test_single_pass_yields_every_stored_item_exactly_once_in_order(buffer_cls):
    rb = buffer_cls(SPEC, batch_size=4, max_length=5)
    api = Api(rb, False)
    api.add_steps(13)
    ds = rb.as_dataset(single_deterministic_pass=True)
    ids = [int(info.ids) for _, info in ds]
    assert ids == live_ids(4, 5, 13).ravel().tolist()
    api.add_steps(1)  # the same dataset, iterated again, reads the new state
    assert [int(info.ids) for _, info in ds] == live_ids(4, 5, 14).ravel().tolist()


def test_single_pass_with_every_batch_dropped_is_an_error(buffer_cls):
    rb = buffer_cls(SPEC, batch_size=2, max_length=4, dataset_drop_remainder=True)
    with pytest.raises(ValueError, match=r"as_dataset: sample_batch_size \(3\) must be at most batch_size \(2\)"):
        rb.as_dataset(3, single_deterministic_pass=True)


# --- the NumPy twin's TF-Agents construction --------------------------------------------


def test_py_buffer_built_from_capacity_takes_any_batch_size():
    rb = PyUniformReplayBuffer(SPEC, 4, seed=0)
    assert rb.capacity == 4 and rb.batch_size == 1 and rb.max_length == 4
    rb.add_batch(make_items([0, 1, 2]))
    np.testing.assert_array_equal(decode(rb.gather_all()), [[0, 1, 2]])
    rb.add_batch(make_items(np.arange(3, 13)))  # more rows than the capacity: the newest stay
    rb.add_batch(make_items(np.zeros([0], np.int64)))
    assert rb.num_frames() == 4
    np.testing.assert_array_equal(decode(rb.gather_all()), [[9, 10, 11, 12]])
    rb.add_batch(make_items([13]))
    items, info = rb.get_next(sample_batch_size=40, num_steps=4)
    np.testing.assert_array_equal(decode(items), info.ids)
    np.testing.assert_array_equal(info.ids, np.tile([10, 11, 12, 13], (40, 1)))
    with pytest.raises(ValueError, match=r"add_batch: leaves have different batch sizes \(.*action: 2.*id: 1"):
        bad = make_items([20, 21])
        bad["id"] = bad["id"][:1]
        rb.add_batch(bad)
    assert rb.num_frames() == 4


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((0,), {}, r"capacity \(0\) must be a positive integer"),
        ((2.5,), {}, r"capacity \(2.5\) must be a positive integer"),
        ((), {}, r"capacity \(None\) must be given, or batch_size and max_length"),
        ((10,), dict(max_length=5), r"max_length \(5\) must come with batch_size"),
        ((10,), dict(batch_size=3), r"capacity \(10\) must be a multiple of batch_size \(3\)"),
        ((10,), dict(batch_size=2, max_length=4), r"capacity \(10\) must equal batch_size \(2\) \* max_length \(4\)"),
    ],
    ids=["zero", "float", "missing", "max_length-alone", "not-a-multiple", "conflict"],
)
def test_py_buffer_construction_errors(args, kwargs, message):
    with pytest.raises(ValueError, match=f"PyUniformReplayBuffer: {message}"):
        PyUniformReplayBuffer(SPEC, *args, **kwargs)


def test_py_buffer_capacity_and_batch_size_give_the_segments():
    rb = PyUniformReplayBuffer(SPEC, 6, batch_size=2)
    assert (rb.batch_size, rb.max_length, rb.capacity) == (2, 3, 6)
    assert PyUniformReplayBuffer(SPEC, 6, batch_size=2, max_length=3).capacity == 6


def test_py_buffer_in_a_graph_says_to_call_it_eagerly():
    rb = PyUniformReplayBuffer(SPEC, batch_size=2, max_length=3)
    with pytest.raises(TypeError, match="add_batch: action is a graph tensor; a NumPy buffer stores values"):
        tf.function(rb.add_batch)(make_items([0, 1]))


# --- spec kinds ------------------------------------------------------------------------------

Transition = collections.namedtuple("Transition", ["observation", "action", "reward"])


class ArraySpecLike:
    """Like TF-Agents' ArraySpec: a leaf with `shape` and a NumPy `dtype`."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)


SPEC_KINDS = {
    "bounded-namedtuple": Transition(
        tf.TensorSpec([2], tf.float32),
        tensor_spec.BoundedTensorSpec([], tf.int64, minimum=0, maximum=3),
        tf.TensorSpec([], tf.float32),
    ),
    "tuple": (tf.TensorSpec([2], tf.float32), (tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.float32))),
    "array-spec-like": {"a": ArraySpecLike((2,), np.float32), "b": ArraySpecLike((), np.int64)},
    "single-leaf": tf.TensorSpec([2], tf.float32),
}


def _np_dtype(s):
    return s.dtype.as_numpy_dtype if isinstance(s.dtype, tf.DType) else s.dtype


def _batch_for(spec, values):
    """A batch of `spec`'s structure whose every leaf holds `values`."""
    values = np.asarray(values)

    def leaf(s):
        column = values.reshape((-1,) + (1,) * len(s.shape))
        return np.broadcast_to(column, values.shape + tuple(s.shape)).astype(_np_dtype(s))

    return tf.nest.map_structure(leaf, spec)


@pytest.mark.parametrize("kind", sorted(SPEC_KINDS))
def test_any_nest_of_specs_works(buffer_cls, kind):
    spec = SPEC_KINDS[kind]
    rb = buffer_cls(spec, batch_size=2, max_length=3, seed=0)
    for step in range(4):
        rb.add_batch(_batch_for(spec, [2 * step, 2 * step + 1]))
    tf.nest.assert_same_structure(rb.data_spec, spec)
    assert all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(rb.data_spec))
    everything = rb.gather_all()
    tf.nest.assert_same_structure(everything, spec)  # check_types: the namedtuple stays a namedtuple
    for got in tf.nest.flatten(everything):
        np.testing.assert_array_equal(np.asarray(got).reshape(2, 3, -1)[..., 0], [[2, 4, 6], [3, 5, 7]])
    items, info = rb.get_next(sample_batch_size=5, num_steps=2)
    tf.nest.assert_same_structure(items, spec)
    for got in tf.nest.flatten(items):
        np.testing.assert_array_equal(np.asarray(got).reshape(5, 2, -1)[..., 0], info.ids)


def test_bounded_specs_are_kept_as_they_are(buffer_cls):
    rb = buffer_cls(SPEC_KINDS["bounded-namedtuple"], batch_size=1, max_length=2)
    assert isinstance(rb.data_spec.action, tensor_spec.BoundedTensorSpec)
    assert rb.data_spec.action.maximum == 3


# --- XLA ----------------------------------------------------------------------------------


def test_add_batch_and_get_next_compile_with_xla_and_match_eager():
    eager = TFUniformReplayBuffer(SPEC, batch_size=2, max_length=3, seed=11)
    compiled = TFUniformReplayBuffer(SPEC, batch_size=2, max_length=3, seed=11)
    add = tf.function(compiled.add_batch, jit_compile=True)
    sample = tf.function(lambda: compiled.get_next(sample_batch_size=16, num_steps=2), jit_compile=True)
    sample_one = tf.function(lambda: compiled.get_next(), jit_compile=True)
    for step in range(5):
        items = make_items([2 * step, 2 * step + 1])
        eager.add_batch(items)
        add(items)
    assert_nest_equal(to_numpy(compiled.gather_all()), to_numpy(eager.gather_all()))
    assert int(compiled.num_frames()) == 6
    for _ in range(2):
        assert_nest_equal(to_numpy(sample()), to_numpy(eager.get_next(sample_batch_size=16, num_steps=2)))
        assert_nest_equal(to_numpy(sample_one()), to_numpy(eager.get_next()))
    items, info = to_numpy(sample())
    np.testing.assert_array_equal(decode(items), info.ids)
    check_windows(info.ids, 2, 3, 5)


def test_xla_sampling_of_an_empty_buffer_is_marked_by_zero_probability():
    """XLA drops assertions, so no error can be raised; the sample says it is empty."""
    rb = TFUniformReplayBuffer(SPEC, batch_size=2, max_length=4, seed=0)
    sample = tf.function(lambda: rb.get_next(3, num_steps=2), jit_compile=True)
    _, info = sample()
    np.testing.assert_array_equal(info.probabilities.numpy(), np.zeros(3, np.float32))
    rb.add_batch(make_items([0, 1]))
    rb.add_batch(make_items([2, 3]))
    _, info = sample()
    np.testing.assert_allclose(info.probabilities.numpy(), np.full(3, 0.5, np.float32))


def test_seedless_buffers_under_a_global_seed_are_reproducible_and_distinct():
    def draws():
        tf.random.set_seed(11)
        buffers = [TFUniformReplayBuffer(SPEC, batch_size=1, max_length=64) for _ in range(2)]
        for rb in buffers:
            for i in range(64):
                rb.add_batch(make_items([i]))
        return [rb.get_next(32)[1].ids.numpy() for rb in buffers]

    first, second = draws(), draws()
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    assert not np.array_equal(first[0], first[1])
