"""examples/keras_ddpg.py: DDPG on Pendulum from a TFUniformReplayBuffer, K updates per TrainLoop call."""

import pathlib
import sys

import numpy as np
import pytest

from tfreplay.rl.drivers import Transition

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.keras, pytest.mark.slow]  # training runs: about 10 s each, a few hundred env and train steps


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(ROOT))
    try:
        from examples import keras_ddpg
    finally:
        sys.path.remove(str(ROOT))
    return keras_ddpg


def test_a_short_run_takes_k_updates_per_call_and_says_where_its_time_went(example, capsys):
    argv = ["--steps=600", "--initial-steps=200", "--num-envs=2", "--train-steps-per-call=4"]
    result = example.main(argv + ["--log-interval=200", "--eval-episodes=2"])
    # 200 random steps, then 200 vector steps of 2 transitions: 400 steps' credit, 100 calls of 4 updates.
    assert result["num_env_steps"] == 600 and result["num_train_steps"] == 400
    agent = result["agent"]
    assert int(agent.actor_optimizer.iterations) == 400  # critic and actor: one update each per train step
    assert int(result["buffer"].num_frames()) == 600
    assert np.isfinite(result["greedy_return"]) and result["greedy_return"] < 0  # Pendulum's rewards are <= 0
    assert all(result["seconds"][part] > 0 for part in ("collect", "learn", "evaluate"))
    out = capsys.readouterr().out.splitlines()
    progress = [line for line in out if line.startswith("env steps")]
    assert len(progress) == 2 and progress[-1].startswith("env steps    600 | episodes    2 |")
    assert "(collect " in progress[-1] and ", learn " in progress[-1] and ", evaluate " in progress[-1]
    assert out[-2].startswith("greedy return ") and "over 2 episodes | 400 train steps" in out[-2]
    assert out[-1].startswith("time: ")


def test_the_targets_follow_the_online_networks_softly(example):
    agent = example.Ddpg(3, 1, 2.0, hidden=(8,), tau=0.5)
    before = [w.copy() for w in agent.target_critic.get_weights()]
    agent.critic.set_weights([w + 1.0 for w in agent.critic.get_weights()])
    batch = Transition(*(np.zeros((4,) + shape, np.float32) for shape in [(3,), (1,), (), (), (3,)]), None, None, None)
    agent.train_step(batch)
    online = agent.critic.get_weights()
    for t, b, o in zip(agent.target_critic.get_weights(), before, online):
        np.testing.assert_allclose(t, 0.5 * b + 0.5 * o, rtol=1e-5, atol=1e-6)


def test_the_example_refuses_a_non_positive_k(example, capsys):
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--train-steps-per-call=0"])
    assert exit_info.value.code == 2
    assert "--train-steps-per-call (0) must be a positive integer" in capsys.readouterr().err


def test_a_concurrent_run_is_the_run_of_taking_turns(example, capsys):
    argv = ["--steps=600", "--initial-steps=200", "--num-envs=2", "--train-steps-per-call=4", "--log-interval=200"]
    argv += ["--eval-episodes=2", "--pull-every=50"]
    turns = example.main(argv)
    both = example.main(argv + ["--concurrent"])
    assert both["num_env_steps"] == 600 and both["num_train_steps"] == turns["num_train_steps"] == 400
    assert both["greedy_return"] == turns["greedy_return"]
    for mine, theirs in zip(both["agent"].actor.get_weights(), turns["agent"].actor.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
    assert list(both["seconds"]) == ["collect", "learn", "overlap", "evaluate"]
    out = capsys.readouterr().out.splitlines()
    progress = [line for line in out if line.startswith("env steps")]
    assert len(progress) == 4 and progress[-1].startswith("env steps    600 |")
    assert progress[-1].split("| critic")[0] == progress[1].split("| critic")[0]  # the same returns, step for step
    assert ", overlap " in progress[-1] and out[-1].startswith("time: ")
