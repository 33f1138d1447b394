"""The sampler interface: a new sampler is one class, assembled with a storage on a twin in one line.

`RecentSampler` draws uniformly among the windows that end in the newest
`recent` items of each segment. It is written once over the `ops` namespace
and runs unchanged on both twins, eagerly, inside `tf.function` and through
`as_dataset`, with rows and frames alike: nothing in the core knows it.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, decode, make_items

from tfreplay._src import ring
from tfreplay._src.samplers import View
from tfreplay._src.twin_py import PyBuffer
from tfreplay._src.twin_tf import TFBuffer
from tfreplay.buffers import rows_storage


class RecentSampler:
    """Uniform over the windows ending in the newest `recent` items of each segment (segments advance together)."""

    within_episodes = False

    def __init__(self, recent: int):
        self.recent = recent

    def bind(self, make, num_rows):
        return self

    def on_write(self, ops, rows, startable):
        return []

    def update(self, view, ids, priorities):
        return [], 0

    def clear(self, ops):
        return []

    def sample(self, view: View, size: int, num_steps):
        ops, n = view.ops, num_steps or 1
        min_id, num_live = ring.live_range(view.num_adds[0], view.max_length, ops)
        per = ops.maximum(ops.minimum(num_live, self.recent) - n + 1, 0)
        count = per * view.num_segments
        draws = view.draw([size], count)
        first = view.num_adds[0] - ops.minimum(num_live, self.recent)
        t = first + draws % ops.maximum(per, 1)
        return draws // ops.maximum(per, 1), t, ops.probability([size], count), count


def assemble(twin: str, recent: int):
    if twin == "tf":
        return TFBuffer(SPEC, 3, 8, rows_storage, RecentSampler(recent), "auto", scope="recent", device="cpu:*", seed=0)
    sampler = RecentSampler(recent)
    return PyBuffer(SPEC, rows_storage, sampler, "auto", batch_size=3, max_length=8, seed=0, name="recent")


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
