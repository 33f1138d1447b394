"""The replay-buffer contract, run over all eight public buffers in three modes.

Each buffer (`helpers.KINDS`: uniform, frame, prioritized and prioritized
frame replay, each as a TF and a NumPy twin) is driven through a small
adapter: item batches that carry their global ids in every leaf, a decoder
that checks a sample by value, the documented sample spec, and a model of
which window starts may be drawn. Each mode (`helpers.MODES`): eagerly,
inside `tf.function`, and through `as_dataset`. So every check is by value:
which items come back, in which order, none torn, none across the write head.

A prioritized buffer's new items enter at the largest priority given so far
(1 before any update), so until an update it keeps the uniform contract
exactly; its `update_priorities` cases follow the uniform ones. A
prioritized frame buffer draws transitions only, so its windows here are of
one step (`Kind.window`).

The uniform buffers' own rules (TF-Agents' single-pass order, the NumPy
twin's capacity form, spec kinds, XLA) are in test_uniform.py, the frame
buffers' (episodes, stacks) in test_frames.py, the sum tree's in
test_prioritized.py.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from helpers import (
    KINDS,
    Api,
    assert_nest_equal,
    assert_specs_equal,
    coverage_draws,
    quick,
    shared_api,
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
# One sample batch size: a TF buffer compiles its draw for each sample shape (a frame buffer a second or so,
# per buffer and mode). A sample this large draws every valid start but with probability < 1e-9 (see
# coverage_draws).
SBS = COVER = 400
PRIORITIZED = [k for k in KINDS.values() if k.prioritized]


@pytest.fixture
def api(kind, mode) -> Api:
    return shared_api(kind, mode, B, L)


@pytest.fixture(params=[k.name for k in PRIORITIZED])
def prioritized_api(request, mode) -> Api:
    """Each prioritized buffer in each mode."""
    return shared_api(KINDS[request.param], mode, B, L)


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

# (sample_batch_size, whether a window of `Kind.window` steps, time_stacked). One unstacked window without a
# batch is left out: it is the batch's structure less the outer dimension, and each new sample shape costs a
# TF frame buffer a compile.
SHAPE_CASES = {
    "one": (None, False, True),
    "batch": (SBS, False, True),
    "window": (None, True, True),
    "batch-of-windows": (SBS, True, True),
    "batch-of-windows-unstacked": (SBS, True, False),
}


@pytest.mark.parametrize("case", quick(list(SHAPE_CASES), "one", "batch-of-windows"))
def test_samples_have_the_documented_structure_dtypes_and_shapes(api, case):
    sample_batch_size, windowed, time_stacked = SHAPE_CASES[case]
    num_steps = api.kind.window if windowed else None
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
    assert_probabilities_are_one_over(len(valid), info.probabilities)


def assert_probabilities_are_one_over(count: int, probabilities) -> None:
    """Every probability is exactly `1 / count` (as float32): equal odds, the prioritized buffers' too until an
    update (each weight 1 over a sum of `count` ones)."""
    probabilities = np.asarray(probabilities)
    assert probabilities.dtype == np.float32
    np.testing.assert_array_equal(probabilities, np.full(probabilities.shape, 1 / count, np.float32))


@pytest.mark.parametrize("kind", KINDS.values(), ids=str)
@pytest.mark.parametrize("sample_batch_size", [None, SBS], ids=["one", "batch"])
@pytest.mark.parametrize("windowed", quick([False, True], True), ids=["items", "windows"])
def test_dataset_element_spec_is_static_and_documented(kind, sample_batch_size, windowed):
    num_steps = kind.window if windowed else None
    ds = shared_buffer(kind, B, L).as_dataset(sample_batch_size, num_steps)
    assert isinstance(ds.element_spec[1], BufferInfo)
    assert_specs_equal(ds.element_spec, sample_spec(kind, sample_batch_size, num_steps))


@pytest.mark.parametrize("windowed", [False, True], ids=["items", "windows"])
@pytest.mark.parametrize("num_adds", quick([4, WRAPPED], WRAPPED), ids=["before-wrap", "after-wrap"])
def test_samples_are_valid_windows_drawn_with_their_exact_probability(api, num_adds, windowed):
    num_steps = api.kind.window if windowed else None
    api.add_steps(num_adds)
    valid = api.kind.valid_starts(B, L, num_adds, num_steps)
    assert coverage_draws(len(valid)) <= COVER
    items, info = api.get_next(COVER, num_steps)
    np.testing.assert_array_equal(api.kind.decode(items, B), info.ids)
    windows = window_ids(info.ids, num_steps)
    assert (np.diff(windows, axis=1) == B).all(), "a window is not consecutive steps of one segment"
    assert windows.max() < num_adds * B, "a window reaches past the write head"
    assert set(windows[:, 0].tolist()) == set(valid), "an invalid start was drawn, or a valid one never"
    assert_probabilities_are_one_over(len(valid), info.probabilities)


@pytest.mark.parametrize("kind", KINDS.values(), ids=str)
def test_draws_are_uniform_over_valid_windows(kind):
    """Equal odds for every valid window start, single items and windows: a chi-square test of 24,000 seeded
    draws (which a correct sampler fails with probability 1e-6, for any seed). A buffer that favors or never
    reaches some start fails it by many orders of magnitude."""
    api = shared_api(kind, "eager", B, L)
    api.add_steps(WRAPPED)
    for num_steps in (None, kind.window):
        valid = kind.valid_starts(B, L, WRAPPED, num_steps)
        draws = [window_ids(api.get_next(COVER, num_steps)[1].ids, num_steps)[:, 0] for _ in range(60)]
        counts = {start: 0 for start in valid}
        for start in np.concatenate(draws).tolist():
            counts[start] += 1  # a KeyError would be an invalid start
        assert scipy.stats.chisquare(list(counts.values())).pvalue > 1e-6, (num_steps, counts)


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


def refused_by(api) -> str:
    """Which call names an empty sample's refusal: an eager dataset iterator refuses as it starts."""
    return "as_dataset" if api.mode == "dataset" else "get_next"


def test_clear_really_empties_and_ids_restart(api):
    api.add_steps(WRAPPED)
    api.clear()
    assert api.num_frames() == 0
    assert api.rb.capacity == B * L and api.rb.data_spec == api.kind.data_spec
    np.testing.assert_array_equal(api.kind.decode(api.gather_all(), B), api.kind.all_ids(B, L, 0))
    with pytest.raises(api.error, match=api.kind.empty_message(None, refused_by(api))):
        api.get_next(SBS)
    api.add_steps(4)
    np.testing.assert_array_equal(api.kind.decode(api.gather_all(), B), api.kind.all_ids(B, L, 4))
    items, info = api.get_next(COVER)
    np.testing.assert_array_equal(api.kind.decode(items, B), info.ids)
    assert set(info.ids.tolist()) == set(api.kind.valid_starts(B, L, 4, None))


# --- errors ----------------------------------------------------------------------------------


def test_sampling_before_anything_can_be_drawn_is_an_error(api):
    window = api.kind.window
    where = refused_by(api)
    with pytest.raises(api.error, match=api.kind.empty_message(None, where)):
        api.get_next()
    with pytest.raises(api.error, match=api.kind.empty_message(window, where)):
        api.get_next(SBS, num_steps=window)
    api.add_steps(1)  # one item in each segment (for frames: an episode's first frame)
    with pytest.raises(api.error, match=api.kind.empty_message(window, where)):
        api.get_next(SBS, num_steps=window)
    api.add_steps(2)  # the failed draws left the buffer usable
    items, info = api.get_next(SBS, num_steps=window)
    np.testing.assert_array_equal(api.kind.decode(items, B), info.ids)


def test_an_eager_iterator_with_nothing_to_draw_raises_one_clear_error(kind):
    """As it starts, before tf.data runs anything: tfreplay's error with the fix, no pipeline in its message."""
    api = shared_api(kind, "eager", B, L)
    datasets = {n: api.rb.as_dataset(SBS, num_steps=n) for n in (None, kind.window)}
    for adds, num_steps in [(0, None), (0, kind.window), (1, kind.window)]:
        api.add_steps(adds)
        with pytest.raises(tfreplay.EmptyBufferError, match="^" + kind.empty_message(num_steps, "as_dataset")) as got:
            iter(datasets[num_steps])
        message = str(got.value)
        assert "rate_limiter=tfreplay.MinSize" in message, message  # or wait for items
        assert not re.search(r"Dataset|Iterator|\{\{|\[\[", message), message
    api.add_steps(2)  # the same datasets, once there is something to draw
    for dataset in datasets.values():
        items, info = next(iter(dataset))
        np.testing.assert_array_equal(kind.decode(items, B), info.ids)


@pytest.mark.keras
def test_fit_dataset_of_an_empty_buffer_is_refused_as_iteration_starts():
    """What `model.fit` meets first on an empty buffer: tfreplay's error, not a tf.data pipeline's."""
    import tfreplay.keras

    kind = KINDS["tf-uniform"]
    dataset = tfreplay.keras.fit_dataset(shared_buffer(kind, B, L), SBS, x="obs/vec", y="action")
    with pytest.raises(tfreplay.EmptyBufferError, match="^" + kind.empty_message(None, "as_dataset")):
        iter(dataset)
    shared_api(kind, "eager", B, L).add_steps(1)
    x, y = next(iter(dataset))
    assert x.shape == (SBS, 3) and y.shape == (SBS,)


@pytest.mark.parametrize("kind", [k for k in KINDS.values() if k.is_tf], ids=str)
def test_an_empty_sample_inside_tf_function_shows_the_callers_frames_not_tfreplays(kind):
    """TF prints where the failing assertion was made; that is the caller's line, not tfreplay's internals."""
    rb = shared_buffer(kind, B, L)

    @tf.function
    def sample():  # named: TF lists no frames for a lambda's graph
        return rb.get_next(SBS)

    with pytest.raises(tf.errors.InvalidArgumentError, match=kind.empty_message(None)) as got:
        sample()
    message = str(got.value)
    assert "rate_limiter=tfreplay.MinSize" in message, message
    assert "test_contract.py" in message and f"tfreplay{os.sep}_src" not in message, message


def assert_unchanged_by(api, call, tmp_path):
    """`call()`'s result, after checking it left the buffer exactly as before: rows, counters, priorities,
    generator.

    The state before is kept in a checkpoint; the state after the call (contents, count, sampling mass, the
    next seeded sample) must equal the restored one's. A TF buffer's variables must keep their bytes too.
    """
    checkpoint = tf.train.Checkpoint(buffer=api.rb)
    path = checkpoint.write(str(tmp_path / "before"))
    raw = variables_bytes(api.rb) if api.kind.is_tf else None
    out = call()
    if raw is not None:
        assert variables_bytes(api.rb) == raw
    eager = Api(api.rb, "eager", api.kind)
    after = state(eager, num_steps=api.kind.window, sample_batch_size=SBS)
    checkpoint.read(path)
    assert_nest_equal(after, state(eager, num_steps=api.kind.window, sample_batch_size=SBS))
    return out


def assert_rejected_and_unchanged(api, call, error, match, tmp_path) -> None:
    """`call` raises `error` matching `match`, and the buffer is exactly as before (see `assert_unchanged_by`)."""

    def rejected():
        with pytest.raises(error, match=match):
            call()

    assert_unchanged_by(api, rejected, tmp_path)


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
    message = f"{api.where}: {message}"
    if kwargs is None:
        longest = api.kind.max_window(L)
        kwargs, message = dict(num_steps=longest + 1), api.kind.too_long_message(api.where, longest + 1, L)
    api.add_steps(WRAPPED)
    assert_rejected_and_unchanged(api, lambda: api.get_next(**kwargs), ValueError, message, tmp_path)


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
        # Python lists where the spec has a leaf: one message naming the field, what it got, and the fix.
        "python-list-leaf": (
            mutated("action", lambda x: x.tolist()),
            TypeError,
            rf"add_batch: action \(a Python list of shape \({B},\)\) must be an array or tensor of dtype int32 "
            r"shaped \(batch,\); pass arrays or tensors shaped like the spec, e\.g\. np\.asarray\(\.\.\., "
            r"dtype=np\.int32\) of shape \(batch,\)\.$",
        ),
        "python-nested-list": (
            mutated(shaped, lambda x: x.tolist()),
            TypeError,
            re.escape(
                f"add_batch: {shaped} (a Python list of shape {(B, *spec_shape)}) must be an array or tensor of "
                f"dtype uint8 shaped (batch, {', '.join(map(str, spec_shape))})"
            ),
        ),
        "python-ragged-list": (
            mutated(floats, lambda x: [x[0].tolist(), [x[1].tolist()]]),
            TypeError,
            rf"add_batch: {floats} \(a ragged Python list of length 2\) must be an array or tensor of dtype float32",
        ),
        "python-list-of-items": (
            lambda items: [tf.nest.map_structure(lambda x, i=i: x[i], items) for i in range(B)],
            TypeError,
            rf"add_batch: items \(a Python list of {B} items, each a nest like data_spec\) must be one nest like "
            r"data_spec with a batch dimension on every leaf; stack them first, e\.g\. "
            r"tf\.nest\.map_structure\(lambda \*xs: np\.stack\(xs\), \*items\)\.",
        ),
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
    api = shared_api(kind, add_mode, B, L)
    api.add_steps(WRAPPED)
    mutate, error, message = bad_batches(kind)[case]
    items = mutate(kind.items(WRAPPED * B + np.arange(B), B))
    assert_rejected_and_unchanged(api, lambda: api.add_batch(items), error, message, tmp_path)


@pytest.mark.parametrize("kind", [k for k in KINDS.values() if k.is_tf], ids=str)
def test_runtime_shape_checks_in_a_graph_leave_the_buffer_unchanged(kind):
    """Unknown dimensions are checked when the graph runs; no leaf is written first."""
    api = shared_api(kind, "eager", B, L)
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


# --- priorities: the prioritized buffers' update_priorities -------------------------------------

ALPHA = 0.6  # the buffers' default


def priority_of(ids) -> np.ndarray:
    """The priorities the update cases give, 0.5 to 3.5 by id (an id drawn twice gets one priority)."""
    return 0.5 + (np.asarray(ids, np.int64) % 7) / 2.0


def odds(kind, weights: dict, num_adds: int, num_steps) -> dict:
    """`start -> probability` over the valid window starts: its first item's `priority ** alpha` (`weights`;
    1 where no update gave one) over their sum."""
    valid = kind.valid_starts(B, L, num_adds, num_steps)
    total = sum(weights.get(i, 1.0) for i in valid)
    return {i: weights.get(i, 1.0) / total for i in valid}


def assert_drawn_by(api, want: dict, num_steps) -> None:
    """A large sample draws only starts of positive odds, each reporting exactly its odds; the sampling mass
    is their summed weight."""
    items, info = api.get_next(COVER, num_steps)
    np.testing.assert_array_equal(api.kind.decode(items, B), info.ids)
    starts = window_ids(info.ids, num_steps)[:, 0].tolist()
    assert set(starts) <= {i for i, p in want.items() if p > 0}, "a start of priority 0, or no valid one, drawn"
    np.testing.assert_allclose(info.probabilities, [want[i] for i in starts], rtol=1e-5)


def test_update_priorities_takes_the_ids_of_a_sample(prioritized_api):
    """New priorities set the odds of every later draw (single items and windows, by the window's first
    item); priority 0 is never drawn; new items enter at the largest priority given so far."""
    api, kind = prioritized_api, prioritized_api.kind
    api.add_steps(WRAPPED)
    _, info = api.get_next(SBS)
    ids = np.asarray(info.ids)
    priorities = priority_of(ids)
    priorities[ids == ids[0]] = 0.0
    assert api.update_priorities(ids, priorities) == 0, "every id is live: none is stale"
    weights = {int(i): float(p) ** ALPHA for i, p in zip(ids, priorities)}
    for num_steps in (None, kind.window):
        want = odds(kind, weights, WRAPPED, num_steps)
        assert_drawn_by(api, want, num_steps)
        total = sum(weights.get(i, 1.0) for i in want)
        np.testing.assert_allclose(api.sampling_mass(num_steps), total, rtol=1e-12)
    api.add_steps(1)
    new = (WRAPPED * B + np.arange(B)).tolist()
    weights.update({i: float(priorities.max()) ** ALPHA for i in new})
    want = odds(kind, weights, WRAPPED + 1, None)
    assert set(new) <= set(want)
    assert_drawn_by(api, want, None)


def test_update_priorities_counts_stale_ids_and_leaves_their_items_alone(prioritized_api, tmp_path):
    api, kind = prioritized_api, prioritized_api.kind
    api.add_steps(4)
    _, old = api.get_next(SBS)
    api.add_steps(L)  # overwrites every item drawn above
    stale = assert_unchanged_by(api, lambda: api.update_priorities(old.ids, np.full(SBS, 50.0)), tmp_path)
    assert stale == SBS, "each stale id counts (an id drawn twice, twice)"
    _, live = api.get_next(SBS)
    ids = np.concatenate([old.ids, live.ids])
    assert api.update_priorities(ids, np.full(2 * SBS, 3.0)) == SBS
    want = odds(kind, {int(i): 3.0**ALPHA for i in live.ids}, 4 + L, None)
    assert_drawn_by(api, want, None)


BAD_PRIORITIES = {  # case -> (priorities for two ids, the eager message or None: that of the graph)
    "negative": ([2.0, -1.0], r"\(\[-1.0\] among them\) must be finite and non-negative; nothing was updated"),
    "nan": ([2.0, np.nan], r"\(\[nan\] among them\) must be finite and non-negative; nothing was updated"),
    "inf": ([np.inf, 2.0], r"\(\[inf\] among them\) must be finite and non-negative; nothing was updated"),
    "shape": ([1.0, 2.0, 3.0], None),
}
UPDATE_MODES = [(k.name, "eager") for k in PRIORITIZED] + [(k.name, "function") for k in PRIORITIZED if k.is_tf]


@pytest.mark.parametrize("case", BAD_PRIORITIES)
@pytest.mark.parametrize("kind_name, mode", UPDATE_MODES, ids=[f"{k}-{m}" for k, m in UPDATE_MODES])
def test_bad_priorities_are_refused_and_change_nothing(kind_name, mode, case, tmp_path):
    kind = KINDS[kind_name]
    api = shared_api(kind, mode, B, L)
    api.add_steps(WRAPPED)
    ids = np.asarray(api.get_next(SBS)[1].ids)[:2]
    priorities, message = BAD_PRIORITIES[case]
    error = ValueError
    if case == "shape":  # static shapes: refused when the call is traced, in a graph too
        message = r"update_priorities: priorities \(shape \(3,\)\) must have the shape of ids \(\(2,\)\), one"
    elif mode == "eager":
        message = r"update_priorities: priorities " + message
    else:  # the values are known only when the graph runs
        error, message = tf.errors.InvalidArgumentError, r"update_priorities: every priority must be finite and non"
    call = lambda: api.update_priorities(ids, np.array(priorities))  # noqa: E731
    assert_rejected_and_unchanged(api, call, error, message, tmp_path)


def test_clear_forgets_the_priorities(prioritized_api):
    """After a clear, new items enter at priority 1 again, whatever priorities the cleared ones had."""
    api, kind = prioritized_api, prioritized_api.kind
    api.add_steps(WRAPPED)
    _, info = api.get_next(SBS)
    api.update_priorities(info.ids, np.full(SBS, 5.0))
    api.clear()
    api.add_steps(4)
    valid = kind.valid_starts(B, L, 4, None)
    _, info = api.get_next(COVER)
    assert_probabilities_are_one_over(len(valid), info.probabilities)
    assert api.sampling_mass() == len(valid)


@pytest.mark.parametrize(
    "kind, method",
    [(k, "add_batch") for k in KINDS.values() if not k.is_tf]
    + [(k, "update_priorities") for k in PRIORITIZED if not k.is_tf],
    ids=str,
)
def test_a_numpy_twin_called_in_a_graph_says_to_call_it_eagerly(kind, method):
    """A NumPy buffer stores values: inside `tf.function` its writes are refused with the fix, nothing stored."""
    rb = shared_api(kind, "eager", B, L).rb
    shared_api(kind, "eager", B, L).add_steps(WRAPPED)
    args = {
        "add_batch": lambda: (kind.items(WRAPPED * B + np.arange(B), B),),
        "update_priorities": lambda: (np.arange(B, dtype=np.int64), np.ones(B)),
    }[method]()
    with pytest.raises(TypeError, match=rf"{method}: \S+ is a graph tensor; a NumPy buffer stores values"):
        tf.function(getattr(rb, method))(*args)
    np.testing.assert_array_equal(kind.decode(rb.gather_all(), B), kind.all_ids(B, L, WRAPPED))


def test_the_abstract_base_cannot_be_instantiated():
    with pytest.raises(TypeError, match="abstract"):
        ReplayBuffer({"a": tf.TensorSpec([], tf.int32)}, 10)


# --- as_dataset -----------------------------------------------------------------------------


def test_dataset_sees_items_added_after_it_was_made(kind):
    api = shared_api(kind, "eager", B, L)
    ds = api.rb.as_dataset(SBS, num_steps=kind.window)
    api.add_steps(4)
    iterator = iter(ds)
    items, info = next(iterator)
    assert isinstance(info, BufferInfo)
    assert set(info.ids.numpy()[:, 0].tolist()) <= set(kind.valid_starts(B, L, 4, kind.window))
    api.add_steps(WRAPPED - 4)  # every window drawn so far is overwritten
    # tf.data may have prefetched a few elements drawn before the add.
    fresh = [(info.ids.numpy() >= 4 * B).all() for _, info in (next(iterator) for _ in range(10))]
    assert fresh[-1] and fresh == sorted(fresh), fresh
    items, info = next(iterator)
    np.testing.assert_array_equal(kind.decode(items, B), info.ids.numpy())
    assert set(info.ids.numpy()[:, 0].tolist()) <= set(kind.valid_starts(B, L, WRAPPED, kind.window))


@pytest.mark.parametrize("num_parallel_calls", quick([2, tf.data.AUTOTUNE], tf.data.AUTOTUNE), ids=["2", "autotune"])
def test_dataset_with_parallel_calls_draws_valid_windows(kind, num_parallel_calls):
    api = shared_api(kind, "eager", B, L)
    api.add_steps(WRAPPED)
    valid = set(kind.valid_starts(B, L, WRAPPED, kind.window))
    ds = api.rb.as_dataset(SBS, num_steps=kind.window, num_parallel_calls=num_parallel_calls)
    for items, info in ds.take(8):
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
    api = shared_api(kind, "eager", B, L)
    api.add_steps(WRAPPED)
    seen = []

    def preprocess(items):
        seen.append(items["action"].shape.as_list())
        return {"action": items["action"] * 10, "next_action": items["action"][:, 1:]}

    for items, info in api.rb.as_dataset(SBS, num_steps=kind.window, sequence_preprocess_fn=preprocess).take(2):
        np.testing.assert_array_equal(items["action"], info.ids * 10)
        np.testing.assert_array_equal(items["next_action"], info.ids[:, 1:])
    assert seen == [[SBS, kind.window]]


@pytest.mark.parametrize("kind", [k for k in KINDS.values() if k.has_stateful_dataset], ids=str)
def test_stateful_dataset_tells_tf_data_to_ignore_the_buffer_state(kind):
    policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    stateful, plain = kind.make(B, L, stateful_dataset=True), shared_buffer(kind, B, L)
    assert stateful.stateful_dataset and not plain.stateful_dataset
    for single_pass in (False, True):
        options = stateful.as_dataset(SBS, single_deterministic_pass=single_pass).options()
        assert options.experimental_external_state_policy == policy
        options = plain.as_dataset(SBS, single_deterministic_pass=single_pass).options()
        assert options.experimental_external_state_policy != policy


def test_dataset_iterates_inside_tf_function(kind):
    api = shared_api(kind, "eager", B, L)
    api.add_steps(WRAPPED)
    ds = api.rb.as_dataset(SBS, num_steps=kind.window)

    @tf.function
    def count_fresh_ids():
        total = tf.constant(0, tf.int64)
        for items, info in ds.take(3):
            tf.debugging.assert_equal(tf.cast(items["action"], tf.int64), info.ids)
            total += tf.reduce_sum(tf.cast(info.ids >= (WRAPPED - L) * B, tf.int64))
        return total

    assert count_fresh_ids().numpy() == 3 * SBS * kind.window


# --- single deterministic pass ----------------------------------------------------------


def test_single_pass_yields_every_stored_item_once_in_gather_all_order(kind):
    api = shared_api(kind, "eager", B, L)
    api.add_steps(WRAPPED)
    ds = api.rb.as_dataset(single_deterministic_pass=True)
    elements = list(ds)
    assert [int(info.ids) for _, info in elements] == kind.all_ids(B, L, WRAPPED).ravel().tolist()
    for items, info in elements:
        assert info.probabilities == ()
        np.testing.assert_array_equal(kind.decode(items, B), info.ids.numpy())
    api.add_steps(1)  # the same dataset, iterated again, reads the new state
    assert [int(info.ids) for _, info in ds] == kind.all_ids(B, L, WRAPPED + 1).ravel().tolist()


@pytest.mark.parametrize("sample_batch_size", [None, SBS], ids=["one", "batch"])
@pytest.mark.parametrize("windowed", quick([False, True], True), ids=["items", "windows"])
def test_single_pass_element_spec_keeps_the_item_shapes(kind, sample_batch_size, windowed):
    """Outer dimensions may be unknown (a short last batch or window); an item's own are the spec's."""
    num_steps = kind.window if windowed else None
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
    api = shared_api(kind, "eager", B, length)
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
