"""Checkpoints of format 1 written by an earlier tfreplay restore exactly: the same items, counts and next samples.

The files under `golden/` were written once by `golden/make_golden.py`; see
its docstring. Each restore goes into a newly built buffer of the same layout.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).parent / "golden"))
import make_golden  # noqa: E402

CASES = sorted(make_golden.CASES)


@pytest.mark.parametrize("name", CASES)
def test_a_golden_checkpoint_restores_exactly(name):
    folder = make_golden.HERE / name
    rb = make_golden.CASES[name][0]()
    tf.train.Checkpoint(buffer=rb).read(str(folder / "ckpt")).assert_existing_objects_matched()
    want = dict(np.load(folder / "expected.npz"))
    got = make_golden.observe(rb)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_every_public_buffer_has_a_golden_checkpoint():
    import tfreplay

    buffers = {n for n in tfreplay.__all__ if n.endswith("ReplayBuffer") and n != "ReplayBuffer"}
    covered = {type(make_golden.CASES[name][0]()).__name__ for name in CASES}
    assert buffers <= covered
