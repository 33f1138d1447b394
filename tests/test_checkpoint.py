"""`tf.train.Checkpoint` saves and restores both buffers exactly, mid-wrap-around.

Exactly means: the same rows, the same ring counter and the same random state,
so a resumed run stores and samples what the uninterrupted one would.
"""

import numpy as np
import tensorflow as tf
from helpers import SPEC, Api, assert_nest_equal, decode, make_items, state

from tfreplay import TFUniformReplayBuffer


def filled(buffer_cls, seed=3) -> Api:
    api = Api(buffer_cls(SPEC, batch_size=3, max_length=4, seed=seed))
    api.add_steps(6)  # wrapped: the write head is mid-segment
    api.get_next(sample_batch_size=5, num_steps=2)  # the generator has moved on from its seed
    return api


def test_restore_undoes_later_adds_clears_and_samples(buffer_cls, tmp_path):
    subject, twin = filled(buffer_cls), filled(buffer_cls)
    checkpoint = tf.train.Checkpoint(buffer=subject.rb)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    subject.add_steps(3)
    subject.get_next(sample_batch_size=9)
    subject.clear()
    subject.add_batch(make_items([50, 51, 52]))
    checkpoint.restore(path).assert_existing_objects_matched()
    assert_nest_equal(state(subject, num_steps=2), state(twin, num_steps=2))
    for api in (subject, twin):
        api.num_adds = 6
        api.add_steps(2)  # the resumed ring writes where the uninterrupted one does
    assert_nest_equal(state(subject, num_steps=3), state(twin, num_steps=3))
    np.testing.assert_array_equal(decode(subject.gather_all())[:, 0], [12, 13, 14])


def test_restore_into_a_new_buffer_resumes_the_same_run(buffer_cls, tmp_path):
    saved, twin = filled(buffer_cls), filled(buffer_cls)
    path = tf.train.Checkpoint(buffer=saved.rb).save(str(tmp_path / "ckpt"))
    fresh = Api(buffer_cls(SPEC, batch_size=3, max_length=4, seed=99))
    tf.train.Checkpoint(buffer=fresh.rb).restore(path).assert_existing_objects_matched()
    assert fresh.num_frames() == 12
    assert_nest_equal(state(fresh, num_steps=2), state(twin, num_steps=2))
    ds_ids = [info.ids.numpy().tolist() for _, info in fresh.rb.as_dataset(single_deterministic_pass=True)]
    assert ds_ids == decode(twin.gather_all()).ravel().tolist()


def test_restore_replays_the_same_draws(buffer_cls, tmp_path):
    api = filled(buffer_cls)
    path = tf.train.Checkpoint(buffer=api.rb).save(str(tmp_path / "ckpt"))
    expected = api.get_next(sample_batch_size=20, num_steps=2)
    tf.train.Checkpoint(buffer=api.rb).restore(path)
    assert_nest_equal(api.get_next(sample_batch_size=20, num_steps=2), expected)


def test_tf_buffer_state_is_plain_variables(tmp_path):
    """Rows (one variable per leaf), the ring counter and the generator's state."""
    api = filled(TFUniformReplayBuffer)
    path = tf.train.Checkpoint(buffer=api.rb).save(str(tmp_path / "ckpt"))
    names = [name for name, _ in tf.train.list_variables(path) if name.startswith("buffer/")]
    assert sum("/_storage/" in n for n in names) == len(tf.nest.flatten(SPEC)), names
    assert any("_num_adds" in n for n in names) and any("_rng" in n for n in names), names
