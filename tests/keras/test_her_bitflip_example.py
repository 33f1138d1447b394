"""examples/her_bitflip.py: the bit-flipping environment, and a DQN that HER makes solve 5 bits."""

import csv
import importlib.util
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.keras  # about 12 s: two seeded runs of 400 episodes on 5 bits


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(ROOT))
    try:
        from examples import her_bitflip
    finally:
        sys.path.remove(str(ROOT))
    return her_bitflip


def test_an_episode_flips_one_bit_a_step_until_the_goal_or_n_steps(example):
    env = example.BitFlip(3, 2, seed=0)
    env.state[:], env.goal[:] = 0, [[1, 1, 0], [1, 1, 1]]
    steps = [env.step(np.array(action)) for action in ([0, 2], [1, 0])]
    # Environment 0 reaches its goal at its second step: reward 0, terminated, then a new episode.
    np.testing.assert_array_equal(steps[0]["next_observation"], [[1, 0, 0], [0, 0, 1]])
    np.testing.assert_array_equal(steps[1]["next_observation"], [[1, 1, 0], [1, 0, 1]])
    np.testing.assert_array_equal(steps[1]["observation"], steps[0]["next_observation"])
    np.testing.assert_array_equal([s["reward"] for s in steps], [[-1, -1], [0, -1]])
    np.testing.assert_array_equal([s["terminated"] for s in steps], [[False, False], [True, False]])
    np.testing.assert_array_equal([s["first"] for s in steps], [[True, True], [False, False]])
    assert env.t.tolist() == [0, 2] and not (env.state[0] == env.goal[0]).all()  # reset: a goal not at its start
    # Environment 1 has not reached its goal after 3 steps: cut by the time limit, not terminated.
    last = env.step(np.array([0, 0]))
    assert last["first"].tolist() == [True, False] and last["reward"][1] == -1
    assert last["truncated"][1] and not last["terminated"][1] and env.t[1] == 0
    np.testing.assert_array_equal(last["desired_goal"][1], [1, 1, 1])


def test_the_reward_in_tf_ops_is_zero_exactly_at_the_goal(example):
    achieved = tf.constant([[1.0, 0.0], [1.0, 1.0]])
    np.testing.assert_array_equal(example.reached(achieved, tf.constant([[1.0, 0.0], [0.0, 1.0]])), [0.0, -1.0])


@pytest.mark.slow  # two short training runs
def test_with_her_the_greedy_policy_solves_five_bits_and_the_comparison_is_written(example, tmp_path, capsys):
    result = example.main(["--compare", "--bits=5", "--episodes=400", "--seed=0", f"--out={tmp_path}"])
    her, no_her = result["histories"][True], result["histories"][False]
    assert her[0]["episodes"] == 0 and her[-1]["episodes"] >= 400 and no_her[-1]["episodes"] >= 400
    assert her[-1]["success_rate"] >= 0.9  # measured 1.0; the first evaluation, untrained, is about 0.05
    assert no_her[-1]["success_rate"] < 0.7  # measured 0.34: the same budget without HER is far from solved
    out = capsys.readouterr().out
    assert "[her] episodes      0 | success rate" in out and "final success rate: no_her" in out

    with open(tmp_path / "her_bitflip.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["no_her"] * len(no_her) + ["her"] * len(her)
    written = [float(r["success_rate"]) for r in rows if r["run"] == "her"]
    np.testing.assert_allclose(written, [h["success_rate"] for h in her], atol=1e-4)
    if importlib.util.find_spec("matplotlib") is None:
        assert result["png"] is None
    else:
        assert pathlib.Path(result["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_example_refuses_fewer_than_two_bits(example, capsys):
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--bits=1"])
    assert exit_info.value.code == 2
    assert "--bits (1) must be at least 2" in capsys.readouterr().err
