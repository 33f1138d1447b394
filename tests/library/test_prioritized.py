"""Proportional prioritized replay: the sum-tree sampler on both twins.

A Python model keeps each live item's priority; samples must follow
`p ** alpha / sum` over the items that can start a window (chi-square, for
any seed), report exactly that probability, never draw priority 0, and
ignore updates for items overwritten since.
"""

import itertools
import pathlib
import shutil
import tempfile
import threading

import numpy as np
import pytest
import tensorflow as tf
from helpers import FRAME, SPEC, Reference, decode, make_items, make_stream, quick, row
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from scipy import stats

from tfreplay import (
    PrioritizedSampler,
    PyPrioritizedFrameReplayBuffer,
    PyPrioritizedReplayBuffer,
    TFPrioritizedFrameReplayBuffer,
    TFPrioritizedReplayBuffer,
    compose,
    frame_data_spec,
    importance_weights,
    native,
)

CLASSES = {"tf": TFPrioritizedReplayBuffer, "py": PyPrioritizedReplayBuffer}
B, L, ALPHA = 2, 6, 0.7


def filled(kind, steps=9, seed=0):
    rb = CLASSES[kind](SPEC, batch_size=B, max_length=L, alpha=ALPHA, seed=seed)
    for step in range(steps):
        rb.add_batch(make_items(step * B + np.arange(B)))
    return rb


def live_ids(steps):
    return np.arange(max(steps - L, 0) * B, steps * B)


def expected(priorities: dict, steps: int, num_steps: int):
    """Window starts and their exact probabilities from the model."""
    newest = steps - 1
    starts = [i for i in live_ids(steps) if i // B + num_steps - 1 <= newest]
    weights = np.array([priorities[i] ** ALPHA for i in starts])
    return np.array(starts), weights / weights.sum()


@pytest.mark.parametrize("kind", sorted(CLASSES))
@pytest.mark.parametrize("num_steps", [None, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_samples_follow_the_priorities_exactly(kind, num_steps, seed):
    rng = np.random.default_rng(seed)
    rb = filled(kind, seed=seed)
    priorities = {i: 1.0 for i in live_ids(9)}  # new items enter at the largest priority so far: 1
    ids = live_ids(9)
    new = rng.uniform(0.1, 5.0, size=len(ids))
    new[3] = 0.0  # never drawn
    rb.update_priorities(ids, new)
    priorities.update(zip(ids.tolist(), new.tolist()))
    starts, probs = expected(priorities, 9, num_steps or 1)
    items, info = rb.get_next(sample_batch_size=6000, num_steps=num_steps)
    drawn = decode(items)
    first = drawn if num_steps is None else drawn[:, 0]
    np.testing.assert_array_equal(np.asarray(info.ids), drawn)
    assert ids[3] not in first and set(first) <= set(starts.tolist())
    counts = np.array([np.sum(first == s) for s in starts])
    keep = probs > 0
    assert stats.chisquare(counts[keep], probs[keep] * len(first)).pvalue > 1e-6
    lookup = dict(zip(starts.tolist(), probs))
    np.testing.assert_allclose(np.asarray(info.probabilities), [lookup[s] for s in first], rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_updates_for_overwritten_items_are_ignored_and_counted(kind):
    rb = filled(kind, steps=4)
    _, info = rb.get_next(sample_batch_size=8)
    for step in range(4, 4 + L):  # every sampled item is overwritten
        rb.add_batch(make_items(step * B + np.arange(B)))
    before = rb.get_next(sample_batch_size=4000)[1].probabilities
    stale = rb.update_priorities(np.asarray(info.ids), np.full([8], 50.0))
    assert int(stale) == 8
    np.testing.assert_allclose(np.asarray(rb.get_next(sample_batch_size=4000)[1].probabilities), before)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_new_items_enter_at_the_largest_priority(kind):
    rb = filled(kind, steps=2)
    rb.update_priorities(live_ids(2), np.array([4.0, 1.0, 1.0, 1.0]))
    rb.add_batch(make_items(4 + np.arange(B)))
    items, info = rb.get_next(sample_batch_size=2000)
    drawn, probs = decode(items), np.asarray(info.probabilities)
    weights = np.array([4.0, 1, 1, 1, 4.0, 4.0]) ** ALPHA
    np.testing.assert_allclose(probs[drawn == 4], weights[4] / weights.sum(), rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(CLASSES))
@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_bad_priorities_are_refused_and_change_nothing(kind, bad):
    rb = filled(kind)
    before = np.asarray(rb.get_next(sample_batch_size=50)[1].probabilities)
    with pytest.raises(ValueError, match=r"update_priorities: priorities \(\[.*\] among them\) must be finite"):
        rb.update_priorities(live_ids(9)[:2], np.array([2.0, bad]))
    with pytest.raises(ValueError, match=r"priorities \(shape \(3,\)\) must have the shape of ids \(\(2,\)\)"):
        rb.update_priorities(live_ids(9)[:2], np.ones(3))
    np.testing.assert_array_equal(np.asarray(rb.get_next(sample_batch_size=50)[1].probabilities), before)


def test_tf_updates_and_samples_inside_a_function_and_a_dataset():
    rb = filled("tf")

    @tf.function
    def step(ids):
        return rb.update_priorities(ids, tf.zeros_like(ids, tf.float64))

    step(tf.constant(live_ids(9)[:4], tf.int64))  # four items never drawn again
    items, info = next(iter(rb.as_dataset(sample_batch_size=500)))
    assert not set(decode(items).tolist()) & set(live_ids(9)[:4].tolist())
    bad = tf.function(lambda: rb.update_priorities(tf.constant([6], tf.int64), tf.constant([-1.0], tf.float64)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="every priority must be finite and non-negative"):
        bad()


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_the_sum_tree_is_checkpointed(kind, tmp_path):
    rb = filled(kind, seed=3)
    rb.update_priorities(live_ids(9), np.arange(1, 13, dtype=np.float64))
    path = tf.train.Checkpoint(buffer=rb).write(str(tmp_path / "ckpt"))
    expected_sample = rb.get_next(sample_batch_size=30)
    rb.update_priorities(live_ids(9), np.ones(12))
    tf.train.Checkpoint(buffer=rb).restore(path)
    got = rb.get_next(sample_batch_size=30)
    np.testing.assert_array_equal(decode(got[0]), decode(expected_sample[0]))
    np.testing.assert_allclose(np.asarray(got[1].probabilities), np.asarray(expected_sample[1].probabilities))


def test_importance_weights_follow_the_formula():
    probs = np.array([0.5, 0.25, 0.125], np.float32)
    got = importance_weights(probs, 8, beta=0.5).numpy()
    raw = (8 * probs) ** -0.5
    np.testing.assert_allclose(got, raw / raw.max(), rtol=1e-6)


# --- windows that cannot be drawn -------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_draws_that_keep_landing_on_young_rows_come_from_the_exact_scan(kind):
    """Almost all the mass on rows that cannot start a window: rejection keeps missing, the exact scan draws."""
    rb = filled(kind, steps=3)  # windows of 3: only ids 0 and 1 can start one
    rb.update_priorities(live_ids(3), np.array([1e-4, 3e-4, 1e4, 1e4, 1e4, 1e4]))
    items, info = rb.get_next(sample_batch_size=4000, num_steps=3)
    first = decode(items)[:, 0]
    assert set(first.tolist()) <= {0, 1}
    weights = np.array([1e-4, 3e-4]) ** ALPHA
    counts = np.array([np.sum(first == 0), np.sum(first == 1)])
    assert stats.chisquare(counts, weights / weights.sum() * len(first)).pvalue > 1e-6
    np.testing.assert_allclose(np.asarray(info.probabilities), (weights / weights.sum())[first], rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_all_priorities_zero_is_an_empty_buffer(kind):
    rb = filled(kind, steps=2)
    rb.update_priorities(live_ids(2), np.zeros(4))
    with pytest.raises(ValueError, match="get_next: the buffer is empty"):
        rb.get_next(sample_batch_size=3)


EPISODE_SPEC = {"id": tf.TensorSpec([], tf.int64), "first": tf.TensorSpec([], tf.bool)}


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_windows_inside_episodes_are_refused_beyond_one_step(kind):
    rb = CLASSES[kind](EPISODE_SPEC, batch_size=B, max_length=L, within_episodes=True, seed=0)
    for step in range(4):
        rb.add_batch({"id": step * B + np.arange(B), "first": np.full(B, step == 0)})
    refused = r"num_steps \(2\) must be None or 1 when windows stay inside episodes.*padded windows"
    with pytest.raises(ValueError, match=refused):
        rb.get_next(sample_batch_size=5, num_steps=2)
    items, info = rb.get_next(sample_batch_size=5, num_steps=1)  # single items are exact
    assert set(np.asarray(items["id"]).reshape(-1).tolist()) <= set(range(8))


# --- frames -----------------------------------------------------------------------------------

FRAME_CLASSES = {"tf": TFPrioritizedFrameReplayBuffer, "py": PyPrioritizedFrameReplayBuffer}


def frame_buffer(kind, seed, max_length=10, history_len=3, length=27):
    """A prioritized frame buffer fed `length` rows of two streams (so it wrapped), and the reference."""
    rng = np.random.default_rng(seed)
    streams = [make_stream(rng, s, length, max_episode=5) for s in range(2)]
    rb = FRAME_CLASSES[kind](
        frame_data_spec(FRAME), batch_size=2, max_length=max_length, history_len=history_len, alpha=ALPHA, seed=seed
    )
    for i in range(length):
        rb.add_batch(row(streams, i))
    return rb, Reference(streams, max_length, history_len), rng


@pytest.mark.parametrize("kind", sorted(FRAME_CLASSES))
@pytest.mark.parametrize("seed", quick([0, 1, 2], 0))
def test_frame_transitions_follow_the_priorities_exactly(kind, seed):
    """Every live id is given a priority, first frames and transitions whose history is gone included: only
    valid transitions are drawn, each with priority**alpha over the sum over valid transitions."""
    rb, ref, rng = frame_buffer(kind, seed)
    live = np.arange((27 - 10) * 2, 27 * 2)
    new = rng.uniform(0.2, 5.0, len(live))
    valid = sorted(ref.valid())
    new[live == valid[0]] = 0.0  # never drawn
    rb.update_priorities(live, new)
    priority = dict(zip(live.tolist(), new.tolist()))
    weights = np.array([priority[i] ** ALPHA for i in valid])
    probs = weights / weights.sum()
    items, info = rb.get_next(sample_batch_size=8000)
    ids = np.asarray(info.ids)
    ref.check(tf.nest.map_structure(np.asarray, items), ids)
    assert set(ids.tolist()) <= set(valid) and valid[0] not in ids
    counts = np.array([np.sum(ids == i) for i in valid])
    keep = probs > 0
    assert stats.chisquare(counts[keep], probs[keep] * len(ids)).pvalue > 1e-6
    lookup = dict(zip(valid, probs))
    np.testing.assert_allclose(np.asarray(info.probabilities), [lookup[i] for i in ids], rtol=1e-5)
    assert int(rb.num_transitions()) == len(valid)


@pytest.mark.parametrize("kind", sorted(FRAME_CLASSES))
def test_frame_windows_are_refused_beyond_one_step(kind):
    rb, _, _ = frame_buffer(kind, 0)
    with pytest.raises(ValueError, match=r"num_steps \(2\) must be None or 1 when windows stay inside episodes"):
        rb.get_next(sample_batch_size=4, num_steps=2)


# --- the native sum tree against the array-op fallback -------------------------------------


class Assembled(compose.Buffer):
    """A prioritized buffer assembled from its parts (`tfreplay.compose`)."""

    update_priorities = compose.update_priorities


def assembled(kind, use_native=True, seed=5, length=L, sampler=None):
    """`TFPrioritizedReplayBuffer` / `PyPrioritizedReplayBuffer` assembled with the compiled sum tree on or off."""
    sampler = sampler or PrioritizedSampler(ALPHA, use_native=use_native)
    twin = compose.TFTwin("per", seed=seed) if kind == "tf" else compose.NumpyTwin(seed)
    return Assembled(SPEC, twin, batch_size=B, max_length=length, sampler=sampler, episode_rule=None)


def sum_tree_of(rb, tmp_path) -> np.ndarray:
    """The sum tree as checkpointed (the only place it shows)."""
    path = tf.train.Checkpoint(buffer=rb).write(str(tmp_path / f"tree{next(CHECKPOINTS)}"))
    reader = tf.train.load_checkpoint(path)
    (key,) = [k for k in reader.get_variable_to_shape_map() if "sum_tree" in k]
    return reader.get_tensor(key)


CHECKPOINTS = itertools.count()
needs_native = pytest.mark.skipif(
    native.sum_tree_library() is None or native.sum_tree_ops() is None, reason="no compiled sum tree here"
)


@needs_native
@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_native_and_array_op_paths_draw_the_same_and_build_the_same_tree(kind, tmp_path):
    rng = np.random.default_rng(7)
    fast, slow = assembled(kind, True), assembled(kind, False)
    for step in range(L + 3):  # wraps
        for rb in (fast, slow):
            rb.add_batch(make_items(step * B + np.arange(B)))
        ids = rng.integers(0, (step + 1) * B, 5)
        ids[1] = ids[0]  # a duplicate: the last of its priorities wins on both paths
        new = rng.uniform(0, 4, 5)
        stale = [int(rb.update_priorities(ids, new)) for rb in (fast, slow)]
        assert stale[0] == stale[1]
        np.testing.assert_array_equal(sum_tree_of(fast, tmp_path), sum_tree_of(slow, tmp_path))
        for num_steps in (None, 2) if step else (None,):
            got = [rb.get_next(sample_batch_size=64, num_steps=num_steps, time_stacked=True) for rb in (fast, slow)]
            np.testing.assert_array_equal(np.asarray(got[0][1].ids), np.asarray(got[1][1].ids))
            np.testing.assert_array_equal(np.asarray(got[0][1].probabilities), np.asarray(got[1][1].probabilities))


@pytest.mark.parametrize("use_native", [True, False])
def test_a_bad_priority_in_a_graph_raises_and_changes_nothing(use_native):
    """In a graph the compiled update refuses bad priorities itself (no separate assertion); the array-op path
    keeps its assertion. Either way nothing changes: leaves, sums and the largest priority new items enter at."""
    rb, reference = assembled("tf", use_native), assembled("tf", use_native)
    update = tf.function(lambda ids, priorities: rb.update_priorities(ids, priorities))
    for buffer in (rb, reference):
        for step in range(9):
            buffer.add_batch(make_items(step * B + np.arange(B)))
        buffer.update_priorities(live_ids(9), np.arange(1.0, 13.0))
    ids = tf.constant(live_ids(9)[:3], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="every priority must be finite and non-negative"):
        update(ids, tf.constant([100.0, 2.0, np.nan], tf.float64))
    for buffer in (rb, reference):
        buffer.add_batch(make_items(9 * B + np.arange(B)))  # enters at the largest priority: 12, not 100
    np.testing.assert_array_equal(
        sum_tree_of(rb, pathlib.Path(tempfile.mkdtemp())), sum_tree_of(reference, pathlib.Path(tempfile.mkdtemp()))
    )


class OlderTreeSampler(PrioritizedSampler):
    """A sampler whose checkpoints say nothing of their tree's layout, as those from before the 8-ary tree."""

    checkpoint_record: dict = {}


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_a_checkpoint_of_another_sum_tree_layout_is_refused(kind, tmp_path):
    """Prioritized checkpoints from before the 8-ary tree (no `sum_tree` in their layout record) hold other
    inner sums: they are refused, never restored into wrong draws."""
    old = assembled(kind, seed=3, sampler=OlderTreeSampler(ALPHA))
    for step in range(9):
        old.add_batch(make_items(step * B + np.arange(B)))
    path = tf.train.Checkpoint(buffer=old).write(str(tmp_path / "ckpt"))
    rb = filled(kind, seed=4)
    rb.update_priorities(live_ids(9), np.arange(1.0, 13.0))
    mass = float(rb.sampling_mass())
    with pytest.raises(ValueError, match=r"the checkpoint's sum_tree \(null\) must equal this buffer's \('fanout 8'\)"):
        tf.train.Checkpoint(buffer=rb).restore(path)
    assert float(rb.sampling_mass()) == mass


# --- the sum tree against a model, through every add, update and clear -----------------------


def tree_above(leaves: np.ndarray) -> np.ndarray:
    """A whole tree built from its leaves by the documented layout: a level of `n` nodes is `[n, 2n)`, a node
    `k` of fanout `f` has children `f * k ...`, 8 per node (2, 4 or 8 at the root), each node their sum added
    first to last."""
    tree = np.zeros(2 * len(leaves))
    tree[len(leaves) :] = leaves
    n = len(leaves)
    while n > 1:
        f = min(n, 8)
        children = tree[n : 2 * n].reshape(-1, f)
        sums = children[:, 0]
        for j in range(1, f):
            sums = sums + children[:, j]
        tree[n // f : 2 * n // f] = sums
        n //= f
    return tree


class SumTreeModel(RuleBasedStateMachine):
    """Each live item's priority in a dict; after every step the checkpointed tree must hold `p ** alpha` of
    exactly the live items in its leaves and, in every inner node, the sum of its children."""

    KIND = "py"
    _cached: dict = {}

    @initialize()
    def start(self):
        if self.KIND not in self._cached:  # one TF buffer per run: each traces its functions once
            self._cached[self.KIND] = CLASSES[self.KIND](SPEC, batch_size=B, max_length=L, alpha=ALPHA, seed=0)
        self.rb = self._cached[self.KIND]
        self.rb.clear()
        self.steps, self.priority, self.largest = 0, {}, 0.0
        self.dir = tempfile.mkdtemp()

    @rule(count=st.integers(1, 8))
    def add(self, count):
        for _ in range(count):
            ids = self.steps * B + np.arange(B)
            self.rb.add_batch(make_items(ids))
            self.priority.update({int(i): max(self.largest, 1.0) for i in ids})
            self.steps += 1
        live = set(live_ids(self.steps).tolist())
        self.priority = {i: p for i, p in self.priority.items() if i in live}

    @precondition(lambda self: self.steps > 0)
    @rule(data=st.data())
    def update(self, data):
        ids = data.draw(st.lists(st.integers(0, self.steps * B - 1), min_size=1, max_size=10))
        values = st.one_of(st.sampled_from([0.0, 1.0, 3.0]), st.floats(0.01, 100.0))
        priorities = data.draw(st.lists(values, min_size=len(ids), max_size=len(ids)))
        stale = self.rb.update_priorities(np.array(ids, np.int64), np.array(priorities))
        assert int(stale) == sum(i not in self.priority for i in ids)
        for i, p in zip(ids, priorities):  # of an id given twice, the last priority wins
            if i in self.priority:
                self.priority[i] = p
                self.largest = max(self.largest, p)

    @rule()
    def clear(self):
        self.rb.clear()
        self.steps, self.priority, self.largest = 0, {}, 0.0

    @invariant()
    def the_tree_sums_its_live_leaves(self):
        tree = sum_tree_of(self.rb, pathlib.Path(self.dir))
        leaves = len(tree) // 2
        np.testing.assert_array_equal(tree, tree_above(tree[leaves:]))
        want = np.zeros(leaves)
        for i, p in self.priority.items():
            want[(i // B % L) * B + i % B] = p**ALPHA
        np.testing.assert_allclose(tree[leaves:], want, rtol=1e-12)
        np.testing.assert_allclose(tree[1], want.sum(), rtol=1e-12)

    @invariant()
    def samples_report_their_share(self):
        total = sum(p**ALPHA for p in self.priority.values())
        if total == 0:
            with pytest.raises(ValueError, match="get_next: the buffer is empty"):
                self.rb.get_next(sample_batch_size=4)
            return
        items, info = self.rb.get_next(sample_batch_size=16)
        ids = decode(items)
        assert all(self.priority[i] > 0 for i in ids.tolist())
        want = [self.priority[i] ** ALPHA / total for i in ids.tolist()]
        np.testing.assert_allclose(np.asarray(info.probabilities), want, rtol=1e-5)


MACHINE = settings(
    max_examples=30,
    stateful_step_count=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@MACHINE
class PySumTreeModel(SumTreeModel):
    KIND = "py"


@MACHINE
class TFSumTreeModel(SumTreeModel):
    KIND = "tf"


TestPySumTree = pytest.mark.slow(PySumTreeModel.TestCase)
TestTFSumTree = pytest.mark.slow(TFSumTreeModel.TestCase)


# --- the two twins' trees: the same updates build the same tree -------------------------------------


@needs_native
def test_both_twins_and_both_paths_build_the_same_tree(tmp_path):
    """The same adds and updates on a NumPy and a TF buffer, compiled and in array ops: within a twin one tree,
    bit for bit; every tree holds exactly the documented sums of its leaves; across twins the leaves
    (`priority ** alpha`, which TF computes as `exp(alpha * log(p))`) agree to a few ulps."""
    rng = np.random.default_rng(3)
    updates = [(rng.integers(0, 2 * B * L, 20), rng.uniform(0, 5, 20)) for _ in range(6)]  # duplicates included
    trees = {}
    for kind, use_native in itertools.product(sorted(CLASSES), [True, False]):
        rb = assembled(kind, use_native, length=L)
        for step, (ids, values) in enumerate(updates):
            rb.add_batch(make_items(step * B + np.arange(B)))
            rb.add_batch(make_items((step + 6) * B + np.arange(B)))
            rb.update_priorities(ids, values)
        trees[kind, use_native] = sum_tree_of(rb, tmp_path)
    for (kind, use_native), tree in trees.items():
        np.testing.assert_array_equal(tree, trees[kind, True], err_msg=f"{kind}, compiled: {use_native}")
        np.testing.assert_array_equal(tree, tree_above(tree[len(tree) // 2 :]), err_msg=kind)
        np.testing.assert_allclose(tree, trees["py", True], rtol=1e-14, err_msg=kind)


def test_the_sum_tree_kernels_fall_back_when_they_cannot_be_built(monkeypatch, tmp_path, caplog):
    """A failing compiler: the build says so and leaves nothing to load; TFREPLAY_NATIVE=0: no kernel, no warning."""
    monkeypatch.setenv("TFREPLAY_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", shutil.which("false") or "false")  # a "compiler" that always fails
    [result] = native.build(["sum_tree_ops"])
    assert (result.state, result.path) == ("failed", None)
    assert result.reason.startswith("false failed: ")
    assert list(tmp_path.glob("*.so")) == []  # nothing half-built is left to load later
    monkeypatch.setenv("TFREPLAY_NATIVE", "0")
    caplog.clear()
    assert native.sum_tree_library() is None and native.sum_tree_ops() is None
    assert caplog.records == []


# --- updates beside adds (the TF twin's compiled update takes no buffer lock) ----------------------


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_an_update_racing_an_add_never_lands_on_the_item_that_overwrote_its_own(kind, tmp_path):
    """One thread fills the ring twice while another keeps updating the first lap's items the next adds overwrite
    (priorities below 1, so new items enter at 1). No second-lap item is ever updated: each leaf must still be 1."""
    length, done, added = 64, threading.Event(), [0]
    rb = assembled(kind, seed=1, length=length)

    def updates(ids, priorities):  # many updates per call (in a graph for TF): some land inside an add
        for _ in tf.range(32) if kind == "tf" else range(4):
            rb.update_priorities(ids, priorities)

    repeat = tf.function(updates) if kind == "tf" else updates

    def update():
        while not done.is_set():
            oldest = added[0] - length  # the next add overwrites this item of each segment
            if 0 <= oldest < length:
                ids = np.arange(oldest * B, min(oldest + 2, length) * B)  # first-lap items only
                repeat(tf.constant(ids), tf.constant(np.full(ids.shape, 0.5)))

    updater = threading.Thread(target=update)
    updater.start()
    try:
        for step in range(2 * length):
            rb.add_batch(make_items(step * B + np.arange(B)))
            added[0] = step + 1
    finally:
        done.set()
        updater.join()
    tree = sum_tree_of(rb, tmp_path)
    np.testing.assert_array_equal(tree[len(tree) // 2 :][: B * length], np.ones(B * length))
