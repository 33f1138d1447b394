"""train_dqn and the demo: outputs, checkpoint-and-resume (with small step counts)."""

import importlib
import json
import os
import pathlib
import re
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from helpers import quick

from tfreplay import PyUniformReplayBuffer, TFPrioritizedReplayBuffer, TFUniformReplayBuffer
from tfreplay.rl import training
from tfreplay.rl.agents import DqnAgent, make_q_network
from tfreplay.rl.drivers import transition_spec
from tfreplay.rl.training import (
    DqnConfig,
    beta_schedule,
    experience_dataset,
    linear_beta,
    linear_epsilon,
    prioritized_train_step,
    train_dqn,
)

# The tests marked `keras` run under tf-keras and again under Keras 3 (see the Makefile): each way training touches
# Keras (the train steps, weights kept and restored, seeds, the fused and concurrent loops, the demo) once. The other
# training runs go through the same Keras code, and the schedules, flags and learner's draws use none: they run once.
ROOT = pathlib.Path(__file__).resolve().parents[2]
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


@pytest.mark.keras
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


def transitions(spec, num_envs, step):
    """One step of `num_envs` environments whose observations read (env, step)."""
    batch = tf.nest.map_structure(lambda s: np.zeros([num_envs] + s.shape.as_list(), s.dtype.as_numpy_dtype), spec)
    observation = np.float32([[env, step] for env in range(num_envs)])
    return batch._replace(observation=observation, next_observation=observation + np.float32([0, 1]))


@pytest.mark.parametrize("buffer_cls", [TFUniformReplayBuffer, PyUniformReplayBuffer])
def test_the_learner_draws_single_transitions_the_newest_of_every_env_included(buffer_cls):
    # 2 envs x 6 steps into 4 rows each: steps 2..5 are live. A window of 2 could never start at step 5.
    spec = transition_spec(gym.spaces.Box(-10, 10, (2,)), gym.spaces.Discrete(2))
    rb = buffer_cls(spec, batch_size=2, max_length=4, seed=0)
    for step in range(6):
        rb.add_batch(transitions(spec, 2, step))
    drawn = set()
    for items, _ in experience_dataset(rb, sample_batch_size=16).take(10):
        assert items.observation.shape == (16, 2) and items.reward.shape == (16,)  # no time axis
        np.testing.assert_array_equal(items.next_observation, items.observation + np.float32([0, 1]))
        drawn |= {(int(env), int(step)) for env, step in items.observation.numpy()}
    # 160 uniform draws over 8 live transitions: one is missed with probability below 8 * (7/8)**160 < 1e-8.
    assert drawn == {(env, step) for env in range(2) for step in range(2, 6)}


@pytest.mark.keras
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


@pytest.mark.keras
@pytest.mark.slow
def test_the_demo_prints_a_summary_and_writes_its_outputs(tmp_path, capsys):
    sys.path.insert(0, str(ROOT))
    try:
        from absl import flags

        from examples import demo
    finally:
        sys.path.remove(str(ROOT))
    flags.FLAGS(["demo", "--steps=320", "--buffer_size=400", f"--output_dir={tmp_path}", "--noprogress"])
    try:
        demo.main([])
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr().out
    assert "Greedy evaluation over 20 episodes" in out
    assert "CartPole-v1: average return" in out and "env steps/s" in out and "train steps/s" in out
    time_line = r"^Time: collect \d+\.\d s, learn \d+\.\d s, evaluate \d+\.\d s \(of \d+\.\d s\)$"
    assert re.search(time_line, out, re.M)  # taking turns by default: no overlap
    assert (tmp_path / "learning_curve.png").stat().st_size > 0
    assert f"\nLearning curve: {tmp_path / 'learning_curve.png'}\n" in out  # where to open it
    assert list((tmp_path / "checkpoints").glob("ckpt-320.index"))


@pytest.mark.keras
@pytest.mark.slow
def test_evaluations_keep_the_best_weights_and_can_stop_early(capsys):
    config = DqnConfig(
        **{
            **SMALL,
            "num_env_steps": 2_000,
            "eval_interval": 100,
            "num_interval_eval_episodes": 2,
            "stop_at_return": 0.0,
            "progress": True,
        }
    )
    result = train_dqn(config)
    assert result.num_env_steps == 200  # the first evaluation, right after initial collection, reaches 0
    assert result.history[-1]["env_steps"] == 200 and result.history[-1]["eval_return"] >= 8
    reached = result.history[-1]["eval_return"]
    stopped = f"stopped early at 200 of 2,000 environment steps: an evaluation's return ({reached:.1f}) reached "
    assert stopped + "stop_at_return (0)." in capsys.readouterr().out.splitlines()  # a run cut short says so
    assert len(result.eval_returns) == 3 and all(1 <= r <= 500 for r in result.eval_returns)

    run = training._Run(DqnConfig(**{**SMALL, "eval_interval": 80, "num_interval_eval_episodes": 2}))
    run.loop()
    evals = [h["eval_return"] for h in run.history if "eval_return" in h]
    assert len(evals) == 4 and run.best_return.numpy() == max(evals)
    run.restore_best()
    for a, b in zip(run.agent.q_network.get_weights(), run.best_q_network.get_weights()):
        np.testing.assert_array_equal(a, b)


def run_fingerprint(seed, train_steps_per_call=1, **overrides):
    sizes = {"num_env_steps": 320, "initial_collect_steps": 100, "log_interval": 20}
    config = DqnConfig(**{**SMALL, **sizes, **overrides}, seed=seed, train_steps_per_call=train_steps_per_call)
    result = train_dqn(config)
    return {
        "seconds": result.seconds,
        "train_steps": result.num_train_steps,
        "losses": [h["loss"] for h in result.history],
        "returns": [h["average_return"] for h in result.history],
        "eval_returns": result.eval_returns,
        "weights": result.agent.q_network.get_weights(),
        "buffer": stored(result.buffer),
    }


def assert_same_run(run, reference):
    """The same losses, returns, evaluations, weights and buffer."""
    assert (run["losses"], run["returns"], run["eval_returns"]) == (
        reference["losses"],
        reference["returns"],
        reference["eval_returns"],
    )
    for a, b in zip(run["weights"], reference["weights"]):
        np.testing.assert_array_equal(a, b)
    tf.nest.map_structure(np.testing.assert_array_equal, run["buffer"], reference["buffer"])


@pytest.mark.keras
@pytest.mark.slow
@pytest.mark.parametrize("train_steps_per_call", [1, 4], ids=["dataset", "fused-xla"])
def test_the_same_seed_gives_the_same_run_and_another_seed_another(train_steps_per_call):
    """One step per call reads `as_dataset`; four per call run the agent's `TrainLoop`, compiled with XLA (there the
    other seed is left out: it would check the seeding again, not the loop)."""
    first, again = run_fingerprint(0, train_steps_per_call), run_fingerprint(0, train_steps_per_call)
    assert len(first["losses"]) == 16 and all(loss is not None for loss in first["losses"][5:])
    assert_same_run(again, first)
    if train_steps_per_call > 1:
        return
    other = run_fingerprint(1)
    assert other["losses"] != first["losses"]
    assert not any(np.array_equal(a, b) for a, b in zip(other["weights"], first["weights"]))
    assert not np.array_equal(other["buffer"].observation, first["buffer"].observation)


BETA_CASES = [
    # env steps, beta (learning from 100 to 1100 steps, beta 0.4 -> 1)
    (0, 0.4),
    (100, 0.4),
    (600, 0.7),
    (1100, 1.0),
    (5000, 1.0),
]


@pytest.mark.parametrize("env_steps,beta", BETA_CASES)
def test_linear_beta_anneals_to_one_over_the_run(env_steps, beta):
    config = DqnConfig(initial_collect_steps=100, num_env_steps=1100, beta=0.4)
    assert linear_beta(config, env_steps) == pytest.approx(beta)


def test_the_beta_schedule_runs_in_a_graph_on_the_env_step_variable():
    config = DqnConfig(initial_collect_steps=100, num_env_steps=1100, beta=0.4)
    env_steps = tf.Variable(0, dtype=tf.int64)
    beta = tf.function(lambda: beta_schedule(config)(env_steps))
    for steps, expected in BETA_CASES:
        env_steps.assign(steps)
        assert float(beta()) == pytest.approx(expected)


BAD_CONFIGS = [
    (dict(n_step=0), r"DqnConfig: n_step \(0\) must be a positive integer"),
    (dict(beta=1.5), r"DqnConfig: beta \(1.5\) must be in \[0, 1\]"),
    (dict(priority_eps=0.0), r"DqnConfig: priority_eps \(0.0\) must be positive"),
    (dict(train_steps_per_call=0), r"DqnConfig: train_steps_per_call \(0\) must be a positive integer"),
    (dict(pull_every=0), r"DqnConfig: pull_every \(0\) must be a positive integer"),
]


@pytest.mark.parametrize("kwargs,match", BAD_CONFIGS)
def test_bad_configs_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DqnConfig(**kwargs)


def random_transitions(spec, num_envs, rng):
    batch = tf.nest.map_structure(lambda s: np.zeros([num_envs] + s.shape.as_list(), s.dtype.as_numpy_dtype), spec)
    return batch._replace(
        observation=rng.normal(size=(num_envs, 2)).astype(np.float32),
        next_observation=rng.normal(size=(num_envs, 2)).astype(np.float32),
        action=rng.integers(0, 2, num_envs).astype(batch.action.dtype),
        reward=rng.normal(size=num_envs).astype(np.float32),
        discount=np.ones(num_envs, np.float32),
    )


@pytest.mark.keras
def test_one_tf_function_samples_trains_and_gives_the_sampled_items_their_td_errors_as_priorities():
    spec = transition_spec(gym.spaces.Box(-10, 10, (2,)), gym.spaces.Discrete(2))
    rb = TFPrioritizedReplayBuffer(spec, batch_size=2, max_length=8, alpha=0.6, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(8):
        rb.add_batch(random_transitions(spec, 2, rng))  # ids 0..15, all at priority 1
    agent = DqnAgent(spec.observation, 2, make_q_network(spec.observation, 2, (8,), seed=0))

    @tf.function
    def step(beta):
        experience = rb.get_next(sample_batch_size=6)
        return experience[1].ids, prioritized_train_step(agent, rb, experience, beta, priority_eps=0.01)

    ids, loss_info = step(tf.constant(0.4))
    priorities = np.ones(16)
    priorities[ids.numpy()] = loss_info.abs_td_errors.numpy().astype(np.float64) + 0.01
    assert len(set(ids.numpy())) > 1 and not np.allclose(priorities, 1.0)  # the test can see a change

    # The next draws come with probability priority ** alpha / sum, the new priorities included.
    _, info = rb.get_next(sample_batch_size=2000)
    expected = priorities**0.6 / np.sum(priorities**0.6)
    np.testing.assert_allclose(info.probabilities.numpy(), expected[info.ids.numpy()], rtol=1e-5)
    assert int(agent.train_step_counter) == 1

    step(tf.constant(0.7))  # another beta: the same graph
    assert step.experimental_get_tracing_count() == 1 and int(agent.train_step_counter) == 2


@pytest.mark.keras
def test_the_prioritized_step_weighs_the_loss_by_the_importance_weights():
    spec = transition_spec(gym.spaces.Box(-10, 10, (2,)), gym.spaces.Discrete(2))
    rb = TFPrioritizedReplayBuffer(spec, batch_size=2, max_length=8, seed=1)
    rng = np.random.default_rng(1)
    for _ in range(8):
        rb.add_batch(random_transitions(spec, 2, rng))
    rb.update_priorities(np.arange(16), rng.uniform(0.1, 3.0, 16))
    experience = rb.get_next(sample_batch_size=8)
    probabilities = experience[1].probabilities.numpy().astype(np.float64)
    weights = (probabilities / probabilities.min()) ** -0.5  # (N P)^-beta over its maximum
    agents = [DqnAgent(spec.observation, 2, make_q_network(spec.observation, 2, (8,), seed=2)) for _ in range(2)]
    got = float(prioritized_train_step(agents[0], rb, experience, 0.5).loss)
    direct = float(agents[1].train(experience[0], weights.astype(np.float32)).loss)
    assert got == pytest.approx(direct, rel=1e-5) and got != pytest.approx(float(agents[1].train(experience).loss))


@pytest.mark.slow
def test_a_short_prioritized_run_trains_and_moves_the_priorities():
    result = train_dqn(DqnConfig(**SMALL, prioritized=True))
    assert isinstance(result.buffer, TFPrioritizedReplayBuffer)
    assert result.num_train_steps == ((480 - 200) // 4 + 1) * 2 and np.isfinite(result.history[-1]["loss"])
    _, info = result.buffer.get_next(sample_batch_size=500)
    assert np.ptp(info.probabilities.numpy()) > 0  # no longer the uniform 1 / 400
    # Where the time went: each part measured, together within the run's wall time.
    assert list(result.seconds) == ["collect", "learn", "evaluate"] and min(result.seconds.values()) > 0
    assert sum(result.seconds.values()) <= result.wall_time


def test_the_demo_flags_choose_the_replay():
    sys.path.insert(0, str(ROOT))
    try:
        from absl import flags

        from examples import demo
    finally:
        sys.path.remove(str(ROOT))
    flags.FLAGS(["demo", "--prioritized", "--n_step=3", "--steps=1000", "--noearly_stop"])
    try:
        config = demo.config_from_flags()
    finally:
        flags.FLAGS.unparse_flags()
    assert (config.prioritized, config.n_step, config.num_env_steps, config.stop_at_return) == (True, 3, 1000, None)
    flags.FLAGS(["demo"])
    try:
        config = demo.config_from_flags()
    finally:
        flags.FLAGS.unparse_flags()
    assert (config.prioritized, config.n_step, config.stop_at_return) == (False, 3, 475.0)  # 3-step returns
    assert config.train_steps_per_call == 16  # the demo learns through the fused loop
    assert not config.concurrent  # takes turns: a second thread saves a few percent on two cores (Benchmarks)
    flags.FLAGS(["demo", "--concurrent", "--pull_every=50"])
    try:
        config = demo.config_from_flags()
    finally:
        flags.FLAGS.unparse_flags()
    assert (config.concurrent, config.pull_every) == (True, 50)
    with pytest.raises(flags.IllegalFlagValueError, match="n_step"):
        flags.FLAGS(["demo", "--n_step=0"])
    flags.FLAGS.unparse_flags()


def import_example(name):
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module(f"examples.{name}")
    finally:
        sys.path.remove(str(ROOT))


@pytest.mark.parametrize("help_flag", ["--help", "-?", "--helpshort", "--helpfull"])
def test_asking_an_example_for_help_prints_the_usage_and_exits_0(help_flag, capsys):
    cli, _ = import_example("cli"), import_example("demo")  # demo defines the flags
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_flags(["demo", "--steps=5", help_flag])
    assert exit_info.value.code == 0  # absl's own help exits 1
    out = capsys.readouterr().out
    assert out.strip()  # the usage, on stdout (the short one lists __main__'s flags: pytest's here, see below)
    if help_flag == "--helpfull":
        assert "--steps: Total environment steps" in out


def test_examples_parse_other_arguments_as_absl_does():
    from absl import flags

    cli, _ = import_example("cli"), import_example("demo")
    try:
        assert cli.parse_flags(["demo", "--steps=5", "--", "--help"]) == ["demo", "--help"]  # after --: an argument
        assert flags.FLAGS.steps == 5
    finally:
        flags.FLAGS.unparse_flags()


@pytest.mark.slow
def test_the_demo_help_exits_0_from_the_command_line():
    run = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "--steps: Total environment steps" in run.stdout


def test_the_comparison_table_reads_runs_that_missed_the_threshold_as_lower_bounds():
    sys.path.insert(0, str(ROOT))
    try:
        from examples import compare_replay
    finally:
        sys.path.remove(str(ROOT))
    record = lambda variant, seed, reached, ret: {  # noqa: E731
        "variant": variant,
        "seed": seed,
        "budget": 100_000,
        "steps_to_threshold": reached,
        "final_return": ret,
        "train_steps_per_sec": 200.0,
    }
    records = [record("uniform", 1, 50_000, 480.0), record("uniform", 0, 40_000, 500.0)]
    records += [record("PER + 3-step", 0, None, 300.0), record("PER + 3-step", 1, 20_000, 490.5)]
    lines = compare_replay.table(records).splitlines()
    assert lines[2] == "| uniform (seeds 0, 1) | 40,000, 50,000 | 45,000 | 500.0, 480.0 | 200 |"
    assert lines[3] == "| PER + 3-step (seeds 0, 1) | not in 100,000, 20,000 | > 60,000 | 300.0, 490.5 | 200 |"


@pytest.mark.parametrize(
    "buffer_cls", quick([TFUniformReplayBuffer, TFPrioritizedReplayBuffer], TFPrioritizedReplayBuffer)
)
def test_n_step_training_targets_are_the_n_step_returns_of_the_stored_episodes(buffer_cls):
    # One segment: an episode terminated at t=3, one truncated at t=6, one still running (t=7, 8).
    spec = transition_spec(gym.spaces.Box(-10, 10, (2,)), gym.spaces.Discrete(2))
    rng = np.random.default_rng(3)
    observations = rng.normal(size=(10, 2)).astype(np.float32)
    rewards = rng.normal(size=9).astype(np.float32)
    terminated, truncated = np.arange(9) == 3, np.arange(9) == 6
    rb = buffer_cls(spec, batch_size=1, max_length=16, seed=3)
    for t in range(9):
        batch = tf.nest.map_structure(lambda s: np.zeros([1] + s.shape.as_list(), s.dtype.as_numpy_dtype), spec)
        rb.add_batch(
            batch._replace(
                observation=observations[t : t + 1],
                next_observation=observations[t + 1 : t + 2],
                action=np.array([t % 2], batch.action.dtype),
                reward=rewards[t : t + 1],
                discount=np.float32([0.0 if terminated[t] else 1.0]),
                terminated=terminated[t : t + 1],
                truncated=truncated[t : t + 1],
                step_type=np.int32([0 if t in (0, 4, 7) else 1]),  # FIRST, else MID
            )
        )
    config = DqnConfig(n_step=3, gamma=0.9)
    online = [[1.0, -2.0], [0.5, 3.0]]
    agent = DqnAgent(spec.observation, 2, linear_q_network(online), tf.keras.optimizers.SGD(0.0), gamma=1.0)
    agent.target_q_network.set_weights([np.float32([[2.0, 1.0], [-1.0, 4.0]])])
    items, info = next(iter(experience_dataset(rb, 256, training.n_step_transform(config))))
    got = agent.train(items).abs_td_errors.numpy()

    q, q_target = (lambda x: x @ np.float64(online)), (lambda x: x @ np.float64([[2.0, 1.0], [-1.0, 4.0]]))
    ends = [3, 3, 3, 3, 6, 6, 6]  # each start's episode end (starts 7 and 8 cannot be drawn yet)
    for k, t in enumerate(info.ids.numpy()):
        m = min(3, ends[t] - t + 1)
        ret = sum(0.9**i * rewards[t + i] for i in range(m))
        bootstrap = 0.0 if terminated[t + m - 1] else 0.9**m
        last = observations[t + m]
        target = ret + bootstrap * q_target(last)[np.argmax(q(last))]
        np.testing.assert_allclose(got[k], abs(target - q(observations[t])[t % 2]), rtol=1e-5, atol=1e-5)
    # 256 uniform draws over 7 starts: one is missed with probability below 7 * (6/7)**256 < 1e-16.
    assert set(info.ids.numpy()) == set(range(7))


def linear_q_network(matrix):
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, use_bias=False)])
    model.build([None, 2])
    model.set_weights([np.asarray(matrix, np.float32)])
    return model


@pytest.mark.slow
def test_a_short_prioritized_n_step_run_trains_with_the_transform_discounting():
    result = train_dqn(DqnConfig(**SMALL, prioritized=True, n_step=3))
    assert result.agent.gamma == 1.0  # NStepReturns applied gamma already
    assert result.num_train_steps == ((480 - 200) // 4 + 1) * 2 and np.isfinite(result.history[-1]["loss"])
    _, info = result.buffer.get_next(sample_batch_size=500)
    assert np.ptp(info.probabilities.numpy()) > 0


def test_the_n_step_transform_is_used_from_two_steps_on():
    assert training.n_step_transform(DqnConfig(n_step=1)) is None
    transform = training.n_step_transform(DqnConfig(n_step=3, gamma=0.9))
    assert (transform.n, transform.gamma) == (3, 0.9)


# --- many train steps per call (DqnAgent.train_loop, a tfreplay.TrainLoop) ------------------------------


@pytest.mark.parametrize("buffer_cls", quick([TFUniformReplayBuffer, TFPrioritizedReplayBuffer], TFUniformReplayBuffer))
def test_the_agents_train_loop_runs_the_steps_of_separate_get_next_and_train_calls(buffer_cls):
    spec = transition_spec(gym.spaces.Box(-10, 10, (2,)), gym.spaces.Discrete(2))
    prioritized = buffer_cls is TFPrioritizedReplayBuffer
    runs = []
    for fused in (True, False):
        rb = buffer_cls(spec, batch_size=2, max_length=8, seed=3)
        rng = np.random.default_rng(3)
        for _ in range(8):
            rb.add_batch(random_transitions(spec, 2, rng))
        agent = DqnAgent(spec.observation, 2, make_q_network(spec.observation, 2, (8,), seed=4))
        if fused:
            losses = agent.train_loop(rb, 6, 3, beta=0.5, metrics="stack")().loss.numpy()
        else:
            step = tf.function(lambda experience, a=agent, b=rb: prioritized_train_step(a, b, experience, 0.5, 1e-6))
            train = step if prioritized else agent.train
            losses = [float(train(rb.get_next(6)).loss) for _ in range(3)]
        runs.append((losses, int(agent.train_step_counter), agent.q_network.get_weights(), rb.get_next(32)[1].ids))
    (fused_losses, fused_steps, fused_weights, fused_ids), (losses, steps, weights, ids) = runs
    np.testing.assert_allclose(fused_losses, losses, rtol=1e-5)
    assert fused_steps == steps == 3
    for a, b in zip(fused_weights, weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(fused_ids, ids)  # the same draws next: the same priorities given


@pytest.mark.keras
@pytest.mark.slow
@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_a_short_run_with_four_train_steps_per_call_trains(prioritized):
    result = train_dqn(DqnConfig(**SMALL, prioritized=prioritized, train_steps_per_call=4))
    # 71 vector steps after the initial collection earn 2 train steps each; the loop takes them 4 at a time.
    assert result.num_train_steps == ((480 - 200) // 4 + 1) * 2 // 4 * 4
    assert np.isfinite(result.history[-1]["loss"]) and result.history[-1]["train_steps"] % 4 == 0
    if prioritized:
        _, info = result.buffer.get_next(sample_batch_size=500)
        assert np.ptp(info.probabilities.numpy()) > 0


@pytest.mark.keras
@pytest.mark.parametrize(
    "prioritized", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["uniform", "prioritized"]
)
def test_a_concurrent_run_is_the_run_of_taking_turns(prioritized):
    """The collector on a thread of its own changes the time, not the run: the same losses, returns, weights and
    buffer as the sequential loop with the same seed."""
    turns = run_fingerprint(0, 4, prioritized=prioritized, pull_every=40)
    both = run_fingerprint(0, 4, prioritized=prioritized, pull_every=40, concurrent=True)
    assert turns["train_steps"] == both["train_steps"] == (320 - 100 + 4) // 4 * 2 // 4 * 4
    assert_same_run(both, turns)
    assert list(both["seconds"]) == ["collect", "learn", "overlap", "evaluate"]
    assert 0 < both["seconds"]["overlap"] <= min(both["seconds"]["collect"], both["seconds"]["learn"])
    assert "overlap" not in turns["seconds"]
