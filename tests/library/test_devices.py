"""A TF buffer's `device`: its variables live there, except those whose rows that device cannot write.

TensorFlow's GPU kernels write rows of the float types, int64 and the small
unsigned and signed ints, but not of int32 or bool (TF 2.21): a buffer on a
GPU keeps such fields in host memory, says so once, and behaves as on the CPU.
The GPU test runs where TensorFlow sees a GPU; the rest run anywhere.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import tfreplay
from tfreplay import TFPrioritizedReplayBuffer, TFUniformReplayBuffer

SPEC = {
    "observation": tf.TensorSpec([3], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "step_type": tf.TensorSpec([], tf.int32),
    "terminated": tf.TensorSpec([], tf.bool),
    "frame": tf.TensorSpec([2, 2], tf.uint8),
}
GPUS = tf.config.list_physical_devices("GPU")


def _items(start: int, batch: int) -> dict:
    ids = np.arange(start, start + batch)
    return {
        "observation": np.stack([ids, ids + 0.5, -ids], axis=1).astype(np.float32),
        "action": ids.astype(np.int64),
        "step_type": (ids % 3).astype(np.int32),
        "terminated": ids % 2 == 0,
        "frame": np.broadcast_to((ids % 256).astype(np.uint8)[:, None, None], (batch, 2, 2)).copy(),
    }


def _round_trip(rb) -> None:
    """Adds eagerly and inside tf.function, then checks that every sampled item is one that was added."""
    rb.add_batch(_items(0, 2))
    tf.function(rb.add_batch)(_items(2, 2))
    items, _ = rb.get_next(sample_batch_size=16)
    action = items["action"].numpy()
    expected = _items(0, 4)
    for key, value in items.items():
        np.testing.assert_array_equal(value.numpy(), expected[key][action], err_msg=key)


@pytest.mark.parametrize("kind", [TFUniformReplayBuffer, TFPrioritizedReplayBuffer])
def test_a_gpu_buffer_on_a_machine_without_one_works_on_the_cpu_and_says_nothing(kind, caplog):
    if GPUS:
        pytest.skip("this machine has a GPU")
    with caplog.at_level(logging.WARNING, logger="tfreplay"):
        rb = kind(SPEC, batch_size=2, max_length=8, device="GPU:0", seed=0)
    assert not [r for r in caplog.records if "host memory" in r.getMessage()]
    _round_trip(rb)


@pytest.mark.skipif(not GPUS, reason="needs a GPU TensorFlow sees")
@pytest.mark.parametrize("kind", [TFUniformReplayBuffer, TFPrioritizedReplayBuffer])
def test_on_a_gpu_fields_it_cannot_write_stay_in_host_memory_with_one_warning(kind, caplog):
    with caplog.at_level(logging.WARNING, logger="tfreplay"):
        rb = kind(SPEC, batch_size=2, max_length=8, device="GPU:0", seed=0)
    warnings = [r.getMessage() for r in caplog.records if "host memory" in r.getMessage()]
    assert len(warnings) == 1
    assert "storage/step_type (int32)" in warnings[0] and "storage/terminated (bool)" in warnings[0]
    assert "observation" not in warnings[0] and "action" not in warnings[0]
    devices = {v.name.split("/storage/")[-1].split(":")[0]: v.device for v in rb.variables() if "/storage/" in v.name}
    assert "GPU" in devices["observation"] and "GPU" in devices["action"]
    assert "CPU" in devices["step_type"] and "CPU" in devices["terminated"]
    _round_trip(rb)


def _step(items, info):
    return tf.reduce_sum(items["observation"])


def test_a_gpu_buffer_on_a_machine_without_one_keeps_train_loop_on_xla(caplog):
    if GPUS:
        pytest.skip("this machine has a GPU")
    rb = TFUniformReplayBuffer(SPEC, batch_size=2, max_length=8, device="GPU:0", seed=0)
    rb.add_batch(_items(0, 2))
    with caplog.at_level(logging.WARNING, logger="tfreplay"):
        loop = tfreplay.TrainLoop(rb, _step, steps_per_call=2, sample_batch_size=4)
    assert loop.jit_compile and not caplog.records
    assert np.isfinite(loop().numpy())


@pytest.mark.skipif(not GPUS, reason="needs a GPU TensorFlow sees")
def test_on_a_gpu_train_loop_runs_without_xla_where_fields_live_in_host_memory(caplog):
    rb = TFUniformReplayBuffer(SPEC, batch_size=2, max_length=8, device="GPU:0", seed=0)
    rb.add_batch(_items(0, 2))
    with pytest.raises(ValueError, match=r"jit_compile=True.*storage/step_type \(int32\).*jit_compile=None or False"):
        tfreplay.TrainLoop(rb, _step, steps_per_call=2, sample_batch_size=4, jit_compile=True)
    with caplog.at_level(logging.WARNING, logger="tfreplay"):
        loop = tfreplay.TrainLoop(rb, _step, steps_per_call=2, sample_batch_size=4)
    assert not loop.jit_compile
    assert [r.getMessage() for r in caplog.records if "runs without XLA" in r.getMessage()]
    assert np.isfinite(loop().numpy())
    assert rb.num_frames().numpy() == 2
