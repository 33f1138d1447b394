"""train_dqn and the demo: outputs, checkpoint-and-resume (with small step counts)."""

import json
import os
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfreplay import training
from tfreplay.training import DqnConfig, linear_epsilon, train_dqn

ROOT = pathlib.Path(__file__).resolve().parent.parent
SMALL = dict(
    num_env_steps=480,
    initial_collect_steps=200,
    num_envs=4,
    train_steps_per_env_step=0.5,
    buffer_size=400,
    batch_size=16,
    fc_layer_params=(32, 32),
    num_eval_episodes=3,
    log_interval=100,
    checkpoint_interval=10_000,
    progress=False,
)


def stored(buffer):
    return tf.nest.map_structure(np.asarray, buffer.gather_all())


@pytest.mark.slow
def test_resume_restores_the_buffer_the_counters_and_the_history(tmp_path):
    first = train_dqn(DqnConfig(**SMALL, output_dir=str(tmp_path)))
    # Training starts at the step that brings the buffer to 200 transitions, 2 train steps per 4 env steps.
    assert first.num_env_steps == 480 and first.num_train_steps == ((480 - 200) // 4 + 1) * 2
    assert os.path.exists(tmp_path / "learning_curve.png") and os.path.exists(tmp_path / "history.json")
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))

    # Resuming at the step count already reached trains nothing: everything must be as saved.
    same = train_dqn(DqnConfig(**SMALL, output_dir=str(tmp_path), resume=True))
    assert (same.num_env_steps, same.num_train_steps) == (first.num_env_steps, first.num_train_steps)
    tf.nest.map_structure(np.testing.assert_array_equal, stored(same.buffer), stored(first.buffer))
    for a, b in zip(same.agent.q_network.get_weights(), first.agent.q_network.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert same.eval_returns == first.eval_returns  # greedy policy, same weights, same evaluation seeds
    assert same.history == json.loads((tmp_path / "history.json").read_text())

    # Resuming with more steps continues the counters instead of starting over.
    more = train_dqn(DqnConfig(**{**SMALL, "num_env_steps": 640}, output_dir=str(tmp_path), resume=True))
    assert more.num_env_steps == 640 and more.num_train_steps == first.num_train_steps + (640 - 480) // 2
    assert more.history[: len(first.history)] == first.history
    assert more.history[-1]["env_steps"] == 640
    assert int(more.buffer.num_frames()) == 400


def test_resume_without_a_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"train_dqn: output_dir \(.*\) must hold a checkpoint to resume from"):
        train_dqn(DqnConfig(**SMALL, output_dir=str(tmp_path), resume=True))


EPSILON_CASES = [
    # env steps, epsilon (initial collection 100, then 1.0 -> 0.1 over 200 steps)
    (0, 1.0),
    (99, 1.0),
    (100, 1.0),
    (200, 0.55),
    (300, 0.1),
    (10_000, 0.1),
]


@pytest.mark.parametrize("env_steps,epsilon", EPSILON_CASES)
def test_linear_epsilon(env_steps, epsilon):
    config = DqnConfig(initial_collect_steps=100, epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_steps=200)
    assert linear_epsilon(config, env_steps) == pytest.approx(epsilon)


@pytest.mark.slow
def test_the_demo_prints_a_summary_and_writes_its_outputs(tmp_path, capsys):
    sys.path.insert(0, str(ROOT))
    try:
        from absl import flags

        from examples import demo
    finally:
        sys.path.remove(str(ROOT))
    flags.FLAGS(["demo", "--steps=300", "--buffer_size=400", f"--output_dir={tmp_path}", "--noprogress"])
    try:
        demo.main([])
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr().out
    assert "Greedy evaluation over 20 episodes" in out
    assert "CartPole-v1: average return" in out and "env steps/s" in out and "train steps/s" in out
    assert (tmp_path / "learning_curve.png").stat().st_size > 0
    assert list((tmp_path / "checkpoints").glob("ckpt-300.index"))


@pytest.mark.slow
def test_evaluations_keep_the_best_weights_and_can_stop_early():
    config = DqnConfig(
        **{
            **SMALL,
            "num_env_steps": 2_000,
            "eval_interval": 100,
            "num_interval_eval_episodes": 2,
            "stop_at_return": 0.0,
        }
    )
    result = train_dqn(config)
    assert result.num_env_steps == 200  # the first evaluation, right after initial collection, reaches 0
    assert result.history[-1]["env_steps"] == 200 and result.history[-1]["eval_return"] >= 8
    assert len(result.eval_returns) == 3 and all(1 <= r <= 500 for r in result.eval_returns)

    run = training._Run(DqnConfig(**{**SMALL, "eval_interval": 80, "num_interval_eval_episodes": 2}))
    run.loop()
    evals = [h["eval_return"] for h in run.history if "eval_return" in h]
    assert len(evals) == 4 and run.best_return.numpy() == max(evals)
    run.restore_best()
    for a, b in zip(run.agent.q_network.get_weights(), run.best_q_network.get_weights()):
        np.testing.assert_array_equal(a, b)
