"""The sampler protocol: a new sampler is one class, assembled with a storage on a twin in one line.

`RecentSampler` draws uniformly among the windows that end in the newest
`recent` items of each segment. It is written once over the `ops` namespace
with the public composition API (`tfreplay.compose`, `tfreplay.samplers`)
and runs unchanged on both twins, eagerly, inside `tf.function` and through
`as_dataset`: nothing in the core knows it.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, decode, make_items

from tfreplay import compose
from tfreplay.samplers import SamplerBase, View


class RecentSampler(SamplerBase):
    """Uniform over the windows ending in the newest `recent` items of each segment (segments advance together)."""

    def __init__(self, recent: int):
        self.recent = recent

    def sample(self, view: View, size: int, num_steps):
        ops, n = view.ops, num_steps or 1
        min_id, num_live = compose.live_range(view.num_adds[0], view.max_length, ops)
        per = ops.maximum(ops.minimum(num_live, self.recent) - n + 1, 0)
        count = per * view.num_segments
        draws, probs = view.pick([size], count)
        first = view.num_adds[0] - ops.minimum(num_live, self.recent)
        t = first + draws % ops.maximum(per, 1)
        return draws // ops.maximum(per, 1), t, probs, count

    def mass(self, view: View, num_steps):
        _, num_live = compose.live_range(view.num_adds[0], view.max_length, view.ops)
        return view.ops.maximum(view.ops.minimum(num_live, self.recent) - (num_steps or 1) + 1, 0) * view.num_segments


def assemble(twin: str, recent: int):
    made = compose.TFTwin("recent", seed=0) if twin == "tf" else compose.NumpyTwin(seed=0)
    return compose.Buffer(SPEC, made, batch_size=3, max_length=8, sampler=RecentSampler(recent))


@pytest.mark.parametrize("twin", ["tf", "py"])
@pytest.mark.parametrize("mode", ["eager", "function", "dataset"])
def test_a_new_sampler_plugs_into_every_twin_and_mode(twin, mode):
    rb = assemble(twin, recent=3)
    for step in range(11):  # wrapped
        rb.add_batch(make_items(step * 3 + np.arange(3)))
    if mode == "eager":
        items, info = rb.get_next(sample_batch_size=600, num_steps=2)
    elif mode == "function" and twin == "tf":
        items, info = tf.function(lambda: rb.get_next(sample_batch_size=600, num_steps=2))()
    else:
        items, info = next(iter(rb.as_dataset(sample_batch_size=600, num_steps=2)))
    ids = decode(items)
    np.testing.assert_array_equal(ids, np.asarray(info.ids))
    # The newest 3 items of each segment are ids 24..32: windows of 2 start at 24..29.
    assert set(ids[:, 0].tolist()) == set(range(24, 30))
    np.testing.assert_array_equal(ids[:, 1] - ids[:, 0], 3)
    np.testing.assert_allclose(np.asarray(info.probabilities), 1 / 6)


@pytest.mark.parametrize("twin", ["tf", "py"])
def test_a_composed_buffer_reports_its_mass_and_restores_from_a_checkpoint(twin, tmp_path):
    rb = assemble(twin, recent=3)
    for step in range(11):
        rb.add_batch(make_items(step * 3 + np.arange(3)))
    assert int(rb.sampling_mass(num_steps=2)) == 6  # 2 windows of 2 in each segment's newest 3
    path = tf.train.Checkpoint(buffer=rb).write(str(tmp_path / "ckpt"))
    restored = assemble(twin, recent=3)
    tf.train.Checkpoint(buffer=restored).read(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(decode(restored.gather_all()), decode(rb.gather_all()))
    a, b = (buffer.get_next(sample_batch_size=50, num_steps=2)[1].ids for buffer in (rb, restored))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the generator's state came back too


def test_binding_a_sampler_leaves_it_as_given():
    """`bind` returns the sampler a buffer uses; the one given is unchanged, so it can serve another buffer."""
    from tfreplay import PrioritizedSampler

    sampler = PrioritizedSampler(alpha=1.0)

    class PER(compose.Buffer):
        update_priorities = compose.update_priorities

    first, second = (
        PER(SPEC, compose.NumpyTwin(seed=0), batch_size=3, max_length=8, sampler=sampler) for _ in range(2)
    )
    for rb in (first, second):
        rb.add_batch(make_items(np.arange(3)))
    first.update_priorities(np.array([0, 1]), np.array([0.0, 0.0]))
    assert not hasattr(sampler, "tree")
    _, info = first.get_next(sample_batch_size=20)
    np.testing.assert_array_equal(np.asarray(info.ids), 2)  # only item 2 keeps a priority in the first
    _, info = second.get_next(sample_batch_size=300)
    assert set(np.asarray(info.ids).tolist()) == {0, 1, 2}
