"""examples/keras_dqn.py: a Keras 3 model whose train_step is a TrainLoop on a prioritized buffer, saved and restored
with it."""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytest.importorskip("keras", minversion="3", reason="a Keras 3 example (the TF 2.15 lane has Keras 2)")

pytestmark = pytest.mark.keras  # about 5 s: a few hundred env steps


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(ROOT))
    try:
        from examples import keras_dqn
    finally:
        sys.path.remove(str(ROOT))
    return keras_dqn


@pytest.mark.slow  # a training run
def test_a_short_prioritized_run_trains_in_fit_and_restores_model_and_buffer_together(example, tmp_path, capsys):
    result = example.main(["--steps=600", "--prioritized", f"--checkpoint_dir={tmp_path}"])
    # 300 random steps, then 4 updates per fit step and 4 env steps per update: 300 // 16 = 18 fit steps, run as
    # 10 epochs of 1 (fit runs whole epochs), so 40 updates after 160 more env steps.
    assert result["num_env_steps"] == 300 + 4 * 40 and result["num_train_steps"] == 40
    assert result["restored"] is True
    assert "restored: same Q-values True, same transitions True, same optimizer step True" in capsys.readouterr().out
    assert pathlib.Path(result["checkpoint"]).parent == tmp_path

    model, copy, buffer = result["model"], result["restored_model"], result["restored_buffer"]
    assert int(buffer.num_frames()) == result["num_env_steps"]
    _, info = buffer.get_next(sample_batch_size=500)
    assert np.ptp(info.probabilities.numpy()) > 0  # train_step gave the sampled items new priorities
    # The restored model is a model of its own, with the saved weights and optimizer step.
    observations = tf.constant(np.zeros((1, 4), np.float32))
    np.testing.assert_allclose(model(observations), copy(observations), rtol=1e-6)
    assert int(copy.optimizer.iterations) == 40


def test_one_update_per_train_step_is_the_unfused_model(example, tmp_path):
    result = example.main(["--steps=600", "--train_steps_per_call=1", f"--checkpoint_dir={tmp_path}"])
    # 300 random steps, then 4 env steps per train step: 75 train steps in 10 epochs of 7.
    assert result["num_env_steps"] == 300 + 4 * 70 and result["num_train_steps"] == 70
    assert result["restored"] is True


def test_the_example_refuses_too_few_steps(example, capsys):
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--steps=4"])
    assert exit_info.value.code == 2
    assert "--steps (4) must be at least 2 * --num_envs (8)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        example.main(["--train_steps_per_call=0"])
    assert "--train_steps_per_call (0) must be a positive integer" in capsys.readouterr().err
