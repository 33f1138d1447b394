"""The replay-buffer contract, run over all four buffers in three modes.

Each buffer (`helpers.KINDS`: TF and NumPy uniform, TF and NumPy frame) is
driven through a small adapter: item batches that carry their global ids in
every leaf, a decoder that checks a sample by value, the documented sample
spec, and a model of which window starts may be drawn. Each mode
(`helpers.MODES`): eagerly, inside `tf.function`, and through `as_dataset`.
So every check is by value: which items come back, in which order, none torn,
none across the write head.

The uniform buffers' own rules (TF-Agents' single-pass order, the NumPy
twin's capacity form, spec kinds, XLA) are in test_uniform.py, the frame
buffers' (episodes, stacks) in test_frames.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    KINDS,
    Api,
    assert_nest_equal,
    assert_specs_equal,
    coverage_draws,
    shared_buffer,
    state,
    to_numpy,
    variables_bytes,
    with_outer,
)

import tfreplay
from tfreplay import BufferInfo, ReplayBuffer

# The layout of every buffer here: 2 segments of 7 rows. After 4 adds nothing
# is overwritten yet; after 11 the ring has wrapped (4 adds overwritten).
B, L = 2, 7
WRAPPED = 11
SBS = 6  # the sample batch size (few distinct sizes: a TF frame buffer compiles each)
COVER = 400  # a sample this large draws every valid start but with probability < 1e-9 (see coverage_draws)


@pytest.fixture
def api(kind, mode) -> Api:
    return Api(shared_buffer(kind, B, L), mode, kind)


def sample_spec(kind, sample_batch_size, num_steps, time_stacked=True):
    """The documented `(items, BufferInfo)` spec of a sample."""
    outer = [] if sample_batch_size is None else [sample_batch_size]
    probabilities = tf.TensorSpec(outer, tf.float32)
    if num_steps is not None and not time_stacked:
        step = with_outer(kind.item_spec(), outer)
        ids = tf.TensorSpec(outer, tf.int64)
        return (step,) * num_steps, BufferInfo(ids=(ids,) * num_steps, probabilities=probabilities)
    outer += [] if num_steps is None else [num_steps]
    return with_outer(kind.item_spec(), outer), BufferInfo(tf.TensorSpec(outer, tf.int64), probabilities)


def assert_values_match(values, spec) -> None:
    """NumPy `values` have `spec`'s structure and, per leaf, its dtype and shape."""
    tf.nest.assert_same_structure(values, spec)
    for value, leaf in zip(tf.nest.flatten(values), tf.nest.flatten(spec)):
        assert value.dtype == leaf.dtype.as_numpy_dtype and list(value.shape) == leaf.shape.as_list(), (value, leaf)


def window_ids(ids, num_steps) -> np.ndarray:
    """`[samples, num_steps or 1]` ids of a sample's windows."""
    return np.asarray(ids).reshape(-1, num_steps or 1)


# --- samples ---------------------------------------------------------------------------

SHAPE_CASES = {
    "one": (None, None, True),
    "batch": (SBS, None, True),
    "window": (None, 2, True),
    "batch-of-windows": (SBS, 2, True),
    "window-unstacked": (None, 2, False),
    "batch-of-windows-unstacked": (SBS, 2, False),
}


@pytest.mark.parametrize("case", SHAPE_CASES)
def test_samples_have_the_documented_structure_dtypes_and_shapes(api, case, request):
    sample_batch_size, num_steps, time_stacked = SHAPE_CASES[case]
    api.add_steps(WRAPPED)
    items, info = api.get_next(sample_batch_size, num_steps, time_stacked)
    want = sample_spec(api.kind, sample_batch_size, num_steps, time_stacked)
    assert_values_match((items, info), want)
    if api.static is not None:  # in a graph, the shapes are known before it runs
        assert_specs_equal(api.static, want)
    steps = items if isinstance(items, tuple) else (items,)
    step_ids = info.ids if isinstance(items, tuple) else (info.ids,)
    for step, ids in zip(steps, step_ids):
        np.testing.assert_array_equal(api.kind.decode(step, B), ids)
    ids = np.stack(step_ids, axis=-1) if isinstance(items, tuple) else info.ids
    valid = api.kind.valid_starts(B, L, WRAPPED, num_steps)
    assert set(window_ids(ids, num_steps)[:, 0].tolist()) <= set(valid)
    np.testing.assert_allclose(info.probabilities, 1 / len(valid), rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS.values(), ids=str)
@pytest.mark.parametrize("sample_batch_size, num_steps", [(None, None), (SBS, None), (None, 2), (SBS, 2)])
def test_dataset_element_spec_is_static_and_documented(kind, sample_batch_size, num_steps, request):
    ds = shared_buffer(kind, B, L).as_dataset(sample_batch_size, num_steps)
    assert isinstance(ds.element_spec[1], BufferInfo)
    assert_specs_equal(ds.element_spec, sample_spec(kind, sample_batch_size, num_steps))


@pytest.mark.parametrize("num_steps", [None, 2])
@pytest.mark.parametrize("num_adds", [4, WRAPPED], ids=["before-wrap", "after-wrap"])
def test_samples_are_valid_windows_drawn_with_their_exact_probability(api, num_adds, num_steps):
    api.add_steps(num_adds)
    valid = api.kind.valid_starts(B, L, num_adds, num_steps)
    assert coverage_draws(len(valid)) <= COVER
    items, info = api.get_next(COVER, num_steps)
    np.testing.assert_array_equal(api.kind.decode(items, B), info.ids)
    windows = window_ids(info.ids, num_steps)
    assert (np.diff(windows, axis=1) == B).all(), "a window is not consecutive steps of one segment"
    assert windows.max() < num_adds * B, "a window reaches past the write head"
    assert set(windows[:, 0].tolist()) == set(valid), "an invalid start was drawn, or a valid one never"
    np.testing.assert_allclose(info.probabilities, 1 / len(valid), rtol=1e-6)


# --- gather_all, num_frames, clear ---------------------------------------------------------


def test_gather_all_has_the_documented_layout(api):
    """Uniform: `[batch_size, time, ...]`, oldest first; frames: `[num_transitions, ...]`,
    segment by segment, oldest first (in dataset mode: the single pass, in that order)."""
    for num_adds in (0, 1, 3, 4, WRAPPED):
        api.add_steps(num_adds - api.num_adds)
        want = api.kind.all_ids(B, L, num_adds)
        everything = api.gather_all()
        assert_values_match(everything, with_outer(api.kind.item_spec(), list(want.shape)))
        np.testing.assert_array_equal(api.kind.decode(everything, B), want)


def test_num_frames_counts_stored_rows_not_added_ones(api):
    counts = []
    for _ in range(WRAPPED):
        counts.append(api.num_frames())
        api.add_steps(1)
    assert counts == [B * min(k, L) for k in range(WRAPPED)]
    assert api.num_frames() == B * L
    assert (api.rb.capacity, api.rb.batch_size, api.rb.max_length) == (B * L, B, L)


def test_clear_really_empties_and_ids_restart(api):
    api.add_steps(WRAPPED)
    api.clear()
    assert api.num_frames() == 0
    assert api.rb.capacity == B * L and api.rb.data_spec == api.kind.data_spec
    np.testing.assert_array_equal(api.kind.decode(api.gather_all(), B), api.kind.all_ids(B, L, 0))
    with pytest.raises(api.error, match=api.kind.empty_message(None)):
        api.get_next(SBS)
    api.add_steps(4)
    np.testing.assert_array_equal(api.kind.decode(api.gather_all(), B), api.kind.all_ids(B, L, 4))
    items, info = api.get_next(COVER)
    np.testing.assert_array_equal(api.kind.decode(items, B), info.ids)
    assert set(info.ids.tolist()) == set(api.kind.valid_starts(B, L, 4, None))


# --- errors ----------------------------------------------------------------------------------


def test_sampling_before_anything_can_be_drawn_is_an_error(api):
    with pytest.raises(api.error, match=api.kind.empty_message(None)):
        api.get_next()
    with pytest.raises(api.error, match=api.kind.empty_message(2)):
        api.get_next(SBS, num_steps=2)
    api.add_steps(1)
    with pytest.raises(api.error, match=api.kind.empty_message(2)):
        api.get_next(SBS, num_steps=2)
    api.add_steps(2)  # the failed draws left the buffer usable
    items, info = api.get_next(SBS, num_steps=2)
    np.testing.assert_array_equal(api.kind.decode(items, B), info.ids)


def assert_rejected_and_unchanged(api, call, error, match, tmp_path) -> None:
    """`call` raises, and the buffer is exactly as before: rows, counters, generator.

    The state before is kept in a checkpoint; the state after the rejected call
    (contents, count, the next seeded sample) must equal the restored one's.
    """
    checkpoint = tf.train.Checkpoint(buffer=api.rb)
    path = checkpoint.write(str(tmp_path / "before"))
    raw = variables_bytes(api.rb) if api.kind.is_tf else None
    with pytest.raises(error, match=match):
        call()
    if raw is not None:
        assert variables_bytes(api.rb) == raw
    eager = Api(api.rb, "eager", api.kind)
    after = state(eager, num_steps=2, sample_batch_size=SBS)
    checkpoint.read(path)
    assert_nest_equal(after, state(eager, num_steps=2, sample_batch_size=SBS))


BAD_SAMPLE_ARGS = {
    "zero": (dict(sample_batch_size=0), r"sample_batch_size \(0\) must be a positive integer"),
    "negative": (dict(sample_batch_size=-2), r"sample_batch_size \(-2\) must be a positive integer"),
    "float": (dict(sample_batch_size=2.0), r"sample_batch_size \(2.0\) must be a positive integer"),
    "bool": (dict(sample_batch_size=True), r"sample_batch_size \(True\) must be a positive integer"),
    "zero-steps": (dict(num_steps=0), r"num_steps \(0\) must be a positive integer"),
    "too-long": (None, None),  # num_steps one longer than a window may be
}


@pytest.mark.parametrize("case", BAD_SAMPLE_ARGS)
def test_bad_sample_arguments_are_rejected_and_change_nothing(api, case, tmp_path):
    kwargs, message = BAD_SAMPLE_ARGS[case]
    if kwargs is None:
        longest = api.kind.max_window(L)
        kwargs, message = dict(num_steps=longest + 1), api.kind.too_long_message(longest + 1, L)
    api.add_steps(WRAPPED)
    assert_rejected_and_unchanged(api, lambda: api.get_next(**kwargs), ValueError, f"{api.where}: {message}", tmp_path)


def test_as_dataset_rejects_bad_arguments(kind):
    rb = shared_buffer(kind, B, L)
    with pytest.raises(ValueError, match=r"as_dataset: num_parallel_calls \(0\) must be a positive integer"):
        rb.as_dataset(num_parallel_calls=0)
    with pytest.raises(TypeError, match=r"as_dataset: sequence_preprocess_fn \(3\) must be callable"):
        rb.as_dataset(sequence_preprocess_fn=3)


def set_leaf(items: dict, path: str, fn) -> None:
    """Replaces the leaf at `path` (`a/b`) by `fn(leaf)`."""
    *parents, leaf = path.split("/")
    node = items
    for key in parents:
        node = node[key]
    node[leaf] = fn(node[leaf])


def get_leaf(items: dict, path: str):
    for key in path.split("/"):
        items = items[key]
    return items


def bad_batches(kind) -> dict:
    """`case -> (mutate(items) -> bad items, error, message)`, naming the adapter's leaves."""
    drop, floats, shaped = kind.dropped_key, kind.float_leaf, kind.shaped_leaf

    def mutated(path, fn):
        def mutate(items):
            set_leaf(items, path, fn)
            return items

        return mutate

    def shape_message(items, path, fn, rule):
        return re.escape(f"add_batch: {path} has shape {tuple(np.shape(fn(get_leaf(items, path))))}; {rule}")

    good = kind.items(np.arange(B), B)
    short = lambda x: x[:, :-1]  # noqa: E731
    spec_shape = tuple(get_leaf(kind.items(np.arange(1), 1), shaped).shape[1:])
    float_shape = list(get_leaf(good, floats).shape[1:])
    return {
        "missing-leaf": (
            lambda items: {k: v for k, v in items.items() if k != drop},
            TypeError,
            rf"add_batch: items \(missing \['{drop}'\], unexpected \[\]\) must have the structure",
        ),
        "extra-leaf": (
            lambda items: {**items, "extra": np.zeros(B, np.float32)},
            TypeError,
            r"add_batch: items \(missing \[\], unexpected \['extra'\]\) must have the structure",
        ),
        "renamed-leaf": (
            lambda items: {(k + "_x" if k == drop else k): v for k, v in items.items()},
            TypeError,
            rf"add_batch: items \(missing \['{drop}'\], unexpected \['{drop}_x'\]\) must have the structure",
        ),
        "wrong-container": (
            lambda items: list(items.values()),
            TypeError,
            r"add_batch: items \(.*\) must have the structure of data_spec",
        ),
        "python-list-leaf": (mutated("action", list), TypeError, r"unexpected \['action/0', 'action/1'\]"),
        "dtype-float": (
            mutated(floats, lambda x: x.astype(np.float64)),
            TypeError,
            rf"add_batch: {floats} has dtype float64; the spec expects float32",
        ),
        "dtype-int": (
            mutated("action", lambda x: x.astype(np.int64)),
            TypeError,
            r"add_batch: action has dtype int64; the spec expects int32",
        ),
        "inner-shape": (
            mutated(shaped, short),
            ValueError,
            shape_message(
                good, shaped, lambda x: x[0, :-1], f"the spec expects {spec_shape} after the batch dimension"
            ),
        ),
        "inner-rank": (
            mutated(floats, lambda x: x[..., None]),
            ValueError,
            shape_message(good, floats, lambda x: x[..., None], f"it must be [batch] + {float_shape}"),
        ),
        "no-batch-dim": (
            mutated("action", lambda x: x[0]),
            ValueError,
            r"add_batch: action has shape \(\); it must be \[batch\] \+ \[\] \(an outer batch dimension",
        ),
        "batch-size": (
            lambda items: kind.items(np.arange(B + 1), B),
            ValueError,
            rf"add_batch: action has outer \(batch\) dimension {B + 1}; it must equal the buffer's batch_size \({B}\)",
        ),
        "mismatched-outer": (
            mutated(floats, lambda x: x[:1]),
            ValueError,
            rf"add_batch: {floats} has outer \(batch\) dimension 1; it must equal the buffer's batch_size \({B}\)",
        ),
    }


# Writes differ between modes only for the TF buffers (the NumPy twins always add eagerly).
ADD_MODES = [(k, "eager") for k in KINDS] + [(k, "function") for k in KINDS if KINDS[k].is_tf]


@pytest.mark.parametrize("case", sorted(bad_batches(KINDS["tf-uniform"])))
@pytest.mark.parametrize("kind_name, add_mode", ADD_MODES, ids=[f"{k}-{m}" for k, m in ADD_MODES])
def test_a_rejected_batch_names_the_leaf_and_changes_nothing(kind_name, add_mode, case, tmp_path):
    kind = KINDS[kind_name]
    api = Api(shared_buffer(kind, B, L), add_mode, kind)
    api.add_steps(WRAPPED)
    mutate, error, message = bad_batches(kind)[case]
    items = mutate(kind.items(WRAPPED * B + np.arange(B), B))
    assert_rejected_and_unchanged(api, lambda: api.add_batch(items), error, message, tmp_path)


@pytest.mark.parametrize("kind", [k for k in KINDS.values() if k.is_tf], ids=str)
def test_runtime_shape_checks_in_a_graph_leave_the_buffer_unchanged(kind):
    """Unknown dimensions are checked when the graph runs; no leaf is written first."""
    api = Api(shared_buffer(kind, B, L), "eager", kind)
    api.add_steps(WRAPPED)
    signature = tf.nest.map_structure(lambda s: tf.TensorSpec([None] + s.shape.as_list(), s.dtype), api.rb.data_spec)
    add = tf.function(api.rb.add_batch, input_signature=[signature])
    good = kind.items(WRAPPED * B + np.arange(B), B)
    torn = kind.items(WRAPPED * B + np.arange(B), B)
    set_leaf(torn, kind.float_leaf, lambda x: x[:1])  # one short leaf: the others would fit the scatter
    float_shape = [B] + list(get_leaf(good, kind.float_leaf).shape[1:])
    raw_before = variables_bytes(api.rb)  # rows, counters and generator
    cases = [
        (kind.items(np.arange(B + 1), B), rf"add_batch: \S+ must have shape \[{B}"),
        (torn, re.escape(f"add_batch: {kind.float_leaf} must have shape {float_shape}")),
    ]
    for items, message in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            add(items)
        assert variables_bytes(api.rb) == raw_before
    add(good)
    api.num_adds += 1
    np.testing.assert_array_equal(kind.decode(api.gather_all(), B), kind.all_ids(B, L, WRAPPED + 1))


def test_the_abstract_base_cannot_be_instantiated():
    with pytest.raises(TypeError, match="abstract"):
        ReplayBuffer({"a": tf.TensorSpec([], tf.int32)}, 10)


# --- as_dataset -----------------------------------------------------------------------------


def test_dataset_sees_items_added_after_it_was_made(kind):
    api = Api(shared_buffer(kind, B, L), "eager", kind)
    ds = api.rb.as_dataset(8, num_steps=2)
    api.add_steps(4)
    iterator = iter(ds)
    items, info = next(iterator)
    assert isinstance(info, BufferInfo)
    assert set(info.ids.numpy()[:, 0].tolist()) <= set(kind.valid_starts(B, L, 4, 2))
    api.add_steps(WRAPPED - 4)  # every window drawn so far is overwritten
    # tf.data may have prefetched a few elements drawn before the add.
    fresh = [(info.ids.numpy() >= 4 * B).all() for _, info in (next(iterator) for _ in range(10))]
    assert fresh[-1] and fresh == sorted(fresh), fresh
    items, info = next(iterator)
    np.testing.assert_array_equal(kind.decode(items, B), info.ids.numpy())
    assert set(info.ids.numpy()[:, 0].tolist()) <= set(kind.valid_starts(B, L, WRAPPED, 2))


@pytest.mark.parametrize("num_parallel_calls", [2, tf.data.AUTOTUNE], ids=["2", "autotune"])
def test_dataset_with_parallel_calls_draws_valid_windows(kind, num_parallel_calls):
    api = Api(shared_buffer(kind, B, L), "eager", kind)
    api.add_steps(WRAPPED)
    valid = set(kind.valid_starts(B, L, WRAPPED, 2))
    for items, info in api.rb.as_dataset(SBS, num_steps=2, num_parallel_calls=num_parallel_calls).take(8):
        np.testing.assert_array_equal(kind.decode(items, B), info.ids.numpy())
        assert set(info.ids.numpy()[:, 0].tolist()) <= valid
        np.testing.assert_array_equal(np.diff(info.ids.numpy(), axis=1), B)


@pytest.mark.parametrize(
    "cls",
    ["TFUniformReplayBuffer", "PyUniformReplayBuffer", "TFPrioritizedReplayBuffer", "PyPrioritizedReplayBuffer"],
)
def test_dataset_elements_are_independent_draws(cls):
    """A dataset may draw several elements per call: each must still be a draw of its own.

    8 items of equal weight: two consecutive elements are equal with probability 1/8, so 800 pairs hold
    50 to 160 equal ones but with probability < 3e-9 (binomial). A stratified draw split into elements
    (each from its own part of the mass) never repeats an item; one draw shared by elements always does.
    """
    rb = getattr(tfreplay, cls)({"x": tf.TensorSpec([], tf.int64)}, batch_size=1, max_length=8, seed=0)
    for i in range(8):
        rb.add_batch({"x": tf.constant([i], tf.int64)})
    drawn = np.array([items["x"] for items, _ in rb.as_dataset().take(801).as_numpy_iterator()])
    assert sorted(set(drawn.tolist())) == list(range(8))
    equal = int(np.sum(drawn[1:] == drawn[:-1]))
    assert 50 <= equal <= 160, equal


def test_sequence_preprocess_fn_sees_stacked_batches(kind):
    api = Api(shared_buffer(kind, B, L), "eager", kind)
    api.add_steps(WRAPPED)
    seen = []

    def preprocess(items):
        seen.append(items["action"].shape.as_list())
        return {"action": items["action"] * 10, "next_action": items["action"][:, 1:]}

    for items, info in api.rb.as_dataset(SBS, num_steps=2, sequence_preprocess_fn=preprocess).take(2):
        np.testing.assert_array_equal(items["action"], info.ids * 10)
        np.testing.assert_array_equal(items["next_action"], info.ids[:, 1:])
    assert seen == [[SBS, 2]]


def test_stateful_dataset_tells_tf_data_to_ignore_the_buffer_state(kind):
    policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    stateful, plain = kind.make(B, L, stateful_dataset=True), kind.make(B, L)
    assert stateful.stateful_dataset and not plain.stateful_dataset
    for single_pass in (False, True):
        options = stateful.as_dataset(2, single_deterministic_pass=single_pass).options()
        assert options.experimental_external_state_policy == policy
        options = plain.as_dataset(2, single_deterministic_pass=single_pass).options()
        assert options.experimental_external_state_policy != policy


def test_dataset_iterates_inside_tf_function(kind):
    api = Api(shared_buffer(kind, B, L), "eager", kind)
    api.add_steps(WRAPPED)
    ds = api.rb.as_dataset(SBS, num_steps=2)

    @tf.function
    def count_fresh_ids():
        total = tf.constant(0, tf.int64)
        for items, info in ds.take(3):
            tf.debugging.assert_equal(tf.cast(items["action"], tf.int64), info.ids)
            total += tf.reduce_sum(tf.cast(info.ids >= (WRAPPED - L) * B, tf.int64))
        return total

    assert count_fresh_ids().numpy() == 3 * SBS * 2


# --- single deterministic pass ----------------------------------------------------------


def test_single_pass_yields_every_stored_item_once_in_gather_all_order(kind):
    api = Api(shared_buffer(kind, B, L), "eager", kind)
    api.add_steps(WRAPPED)
    ds = api.rb.as_dataset(single_deterministic_pass=True)
    elements = list(ds)
    assert [int(info.ids) for _, info in elements] == kind.all_ids(B, L, WRAPPED).ravel().tolist()
    for items, info in elements:
        assert info.probabilities == ()
        np.testing.assert_array_equal(kind.decode(items, B), info.ids.numpy())
    api.add_steps(1)  # the same dataset, iterated again, reads the new state
    assert [int(info.ids) for _, info in ds] == kind.all_ids(B, L, WRAPPED + 1).ravel().tolist()


@pytest.mark.parametrize("sample_batch_size, num_steps", [(None, None), (SBS, None), (None, 2), (SBS, 2)])
def test_single_pass_element_spec_keeps_the_item_shapes(kind, sample_batch_size, num_steps, request):
    """Outer dimensions may be unknown (a short last batch or window); an item's own are the spec's."""
    ds = shared_buffer(kind, B, L).as_dataset(sample_batch_size, num_steps, single_deterministic_pass=True)
    outer = [d for d in (sample_batch_size, num_steps) if d is not None]
    items_spec, info_spec = ds.element_spec
    tf.nest.assert_same_structure(items_spec, kind.item_spec())
    for got, want in zip(tf.nest.flatten(items_spec), tf.nest.flatten(kind.item_spec())):
        assert got.dtype == want.dtype and got.shape.rank == len(outer) + want.shape.rank, (got, want)
        assert got.shape[len(outer) :] == want.shape, (got, want)
        assert all(d in (None, o) for d, o in zip(got.shape[: len(outer)].as_list(), outer)), (got, outer)
    assert info_spec.ids.shape.rank == len(outer)


def test_single_pass_refuses_items_overwritten_while_it_runs(kind):
    """The pass reads its windows when it starts; an element whose items a writer overwrote since raises.

    Elements read before the overwrite (tf.data may read ahead), and those whose items survive it, match
    their ids.
    """
    length = 20
    api = Api(shared_buffer(kind, B, length), "eager", kind)
    api.add_steps(length)
    snapshot = kind.all_ids(B, length, length).ravel().tolist()
    iterator = iter(api.rb.as_dataset(single_deterministic_pass=True))
    elements = [next(iterator)]
    api.add_steps(length // 2)  # overwrites the oldest half of every segment
    ids, refused = [int(elements[0][1].ids)], 0
    while True:
        try:
            items, info = next(iterator)
        except StopIteration:
            break
        except tf.errors.InvalidArgumentError as err:
            assert "a writer overwrote items of this single deterministic pass" in err.message
            refused += 1
            continue
        np.testing.assert_array_equal(kind.decode(to_numpy(items), B), info.ids.numpy())
        ids.append(int(info.ids))
    assert refused > 0
    assert ids == [i for i in snapshot if i in set(ids)]  # the snapshot's order


# --- spec nests ----------------------------------------------------------------------------

AUX = [tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int32)]


def aux_values(ids, container) -> list | tuple:
    """Values of `AUX` for items `ids`, in a list or a tuple."""
    ids = np.asarray(ids)
    return container([np.stack([ids, -ids], axis=-1).astype(np.float32), ids.astype(np.int32)])


def test_a_data_spec_with_python_lists_works_end_to_end(kind):
    """Lists or tuples go in; samples keep the spec's nest, `as_dataset` (which has no lists) tuples."""
    rb = kind.make(B, L, data_spec={**kind.data_spec, "aux": list(AUX)})
    for step in range(WRAPPED):
        ids = step * B + np.arange(B)
        rb.add_batch({**kind.items(ids, B), "aux": aux_values(ids, list if step % 2 else tuple)})

    def check(items, ids):
        items = to_numpy(items)
        assert_nest_equal(tuple(items.pop("aux")), aux_values(ids, tuple))
        np.testing.assert_array_equal(kind.decode(items, B), ids)

    items, info = rb.get_next(SBS)
    tf.nest.assert_same_structure(items, {**kind.item_spec(), "aux": AUX}, check_types=False)
    check(items, info.ids)
    ds = rb.as_dataset(SBS)
    want = with_outer({**kind.item_spec(), "aux": tuple(AUX)}, [SBS])
    tf.nest.assert_same_structure(ds.element_spec[0], want)  # with container types: a tuple, not a list
    assert [s.dtype for s in tf.nest.flatten(ds.element_spec[0])] == [s.dtype for s in tf.nest.flatten(want)]
    items, info = next(iter(ds))
    check(items, info.ids.numpy())
