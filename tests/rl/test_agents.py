"""DqnAgent: the Double-DQN target, target updates, learning from both buffers' datasets."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from tfreplay import BufferInfo, PyUniformReplayBuffer, TFUniformReplayBuffer
from tfreplay.rl.agents import DqnAgent, make_q_network
from tfreplay.rl.drivers import StepDriver, Transition
from tfreplay.rl.policies import RandomPolicy

pytestmark = pytest.mark.keras  # run under tf-keras and again under Keras 3 (see the Makefile)
OBS = tf.TensorSpec((4,), tf.float32)


def filled_buffer(buffer_cls, num_steps=1200):
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    driver = StepDriver(env, RandomPolicy(env.single_action_space, seed=0), seed=0)
    rb = buffer_cls(driver.transition_spec, batch_size=2, max_length=num_steps // 2)
    driver.add_observer(rb)
    driver.run(num_steps)
    env.close()
    return rb


def weights(model):
    return [w.copy() for w in model.get_weights()]


@pytest.mark.parametrize(
    "buffer_cls", [TFUniformReplayBuffer, pytest.param(PyUniformReplayBuffer, marks=pytest.mark.slow)]
)
def test_a_short_training_run_lowers_the_loss_and_changes_the_q_network(buffer_cls):
    tf.keras.utils.set_random_seed(0)
    rb = filled_buffer(buffer_cls)
    # Targets only move every 10_000 steps: the loss is a regression loss and must fall.
    agent = DqnAgent(OBS, 2, make_q_network(OBS, 2, seed=0), target_update_period=10_000)
    before = weights(agent.q_network)
    dataset = rb.as_dataset(sample_batch_size=64)  # single transitions, as train_dqn reads them
    losses = [float(agent.train(experience).loss) for experience in dataset.take(300)]
    assert np.mean(losses[-30:]) < 0.3 * np.mean(losses[:30])
    assert any(not np.allclose(a, b) for a, b in zip(before, weights(agent.q_network)))
    assert int(agent.train_step_counter) == 300
    for target, initial in zip(weights(agent.target_q_network), before):
        np.testing.assert_array_equal(target, initial)  # no target update yet


def linear_q_network(matrix):
    model = tf.keras.Sequential([tf.keras.layers.Dense(len(matrix[0]), use_bias=False)])
    model.build([None, len(matrix)])
    model.set_weights([np.asarray(matrix, np.float32)])
    return model


def weighted_case(learning_rate: float = 0.1):
    """Two rows, gamma 0.5, observations one-hot (Q(s) = s @ W, so Q-values are rows of W): TD errors 14 and -1.

    Row 0: s' = e1, online picks argmax [3, 0.5] = 0, target values it 30: y = 1 + 0.5 * 30 = 16; Q(s, 1) = 2.
    Row 1: terminated, y = 2; Q(s, 0) = 3.
    """
    online = linear_q_network([[1.0, 2.0], [3.0, 0.5]])
    agent = DqnAgent(tf.TensorSpec((2,), tf.float32), 2, online, tf.keras.optimizers.SGD(learning_rate), gamma=0.5)
    agent.target_q_network.set_weights([np.array([[10.0, 20.0], [30.0, 40.0]], np.float32)])
    eye = np.eye(2, dtype=np.float32)
    items = {
        "observation": eye,
        "action": np.array([1, 0]),
        "reward": np.array([1.0, 2.0], np.float32),
        "discount": np.array([1.0, 0.0], np.float32),
        "next_observation": eye[::-1].copy(),
    }
    return agent, items, np.array([16.0 - 2.0, 2.0 - 3.0])


def test_the_loss_is_keras_huber_of_the_double_dqn_td_error():
    agent, items, errors = weighted_case(learning_rate=0.0)
    expected = np.mean(np.where(np.abs(errors) <= 1, 0.5 * errors**2, np.abs(errors) - 0.5))  # (13.5 + 0.5) / 2
    keras_loss = tf.keras.losses.Huber()(np.zeros((2, 1), np.float32), errors[:, None].astype(np.float32))
    loss = float(agent.train(items).loss)
    np.testing.assert_allclose(loss, float(keras_loss), rtol=1e-6)
    np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_importance_weights_scale_each_samples_loss_and_td_errors_come_back_per_sample():
    weights = np.array([0.25, 2.0], np.float32)
    agent, items, errors = weighted_case()
    info = agent.train(items, weights)
    huber = np.where(np.abs(errors) <= 1, 0.5 * errors**2, np.abs(errors) - 0.5)
    np.testing.assert_allclose(float(info.loss), np.mean(weights * huber), rtol=1e-6)  # (0.25 * 13.5 + 2 * 0.5) / 2
    np.testing.assert_allclose(info.abs_td_errors.numpy(), np.abs(errors), rtol=1e-6)
    assert info.abs_td_errors.shape == (2,)

    # The gradient step is that of the weighted loss: SGD(0.1) on Q(s) = s @ W moves W[s, a] by 0.1 * w * dHuber.
    step = 0.1 * weights * np.clip(errors, -1, 1) / 2
    np.testing.assert_allclose(
        agent.q_network.get_weights()[0], [[1.0, 2.0 + step[0]], [3.0 + step[1], 0.5]], rtol=1e-6
    )


def test_no_weights_is_all_ones():
    (a, items, _), (b, _, _) = weighted_case(), weighted_case()
    assert float(a.train(items).loss) == float(b.train(items, np.ones(2, np.float32)).loss)
    for x, y in zip(weights(a.q_network), weights(b.q_network)):
        np.testing.assert_array_equal(x, y)


def test_train_runs_inside_an_outer_tf_function():
    agent, items, errors = weighted_case()
    step = tf.function(lambda items, w: agent.train(items, w).abs_td_errors)
    np.testing.assert_allclose(step(items, tf.constant([1.0, 1.0])).numpy(), np.abs(errors), rtol=1e-6)
    assert int(agent.train_step_counter) == 1


@pytest.mark.parametrize("bad", [np.ones(3, np.float32), np.ones((2, 1), np.float32), np.float32(1.0)])
def test_weights_of_another_shape_are_rejected_before_training(bad):
    agent, items, _ = weighted_case()
    before = weights(agent.q_network)
    with pytest.raises(ValueError, match=r"DqnAgent.train: weights has shape .*; it must be \[batch\], one weight"):
        agent.train(items, bad)
    assert int(agent.train_step_counter) == 0
    assert all(np.array_equal(a, b) for a, b in zip(before, weights(agent.q_network)))


def test_the_target_network_is_updated_every_period():
    tf.keras.utils.set_random_seed(1)
    rb = filled_buffer(TFUniformReplayBuffer, 200)
    agent = DqnAgent(OBS, 2, make_q_network(OBS, 2, seed=1), target_update_period=3)
    samples = iter(rb.as_dataset(sample_batch_size=8))
    for step in range(1, 7):
        agent.train(next(samples))
        same = all(np.array_equal(a, b) for a, b in zip(weights(agent.q_network), weights(agent.target_q_network)))
        assert same == (step % 3 == 0), step


def test_soft_target_updates_move_part_of_the_way():
    agent = DqnAgent(OBS, 2, make_q_network(OBS, 2, seed=2), target_update_tau=0.25)
    online = weights(agent.q_network)
    agent.target_q_network.set_weights([np.zeros_like(w) for w in online])
    agent.update_target()
    for target, source in zip(weights(agent.target_q_network), online):
        np.testing.assert_allclose(target, 0.25 * source, rtol=1e-6)


def test_train_accepts_samples_bare_items_windows_and_numpy():
    rb = filled_buffer(PyUniformReplayBuffer, 200)
    agent = DqnAgent(OBS, 2, make_q_network(OBS, 2, seed=3))
    items, info = rb.get_next(sample_batch_size=4, num_steps=2)  # NumPy arrays
    assert isinstance(info, BufferInfo) and items.reward.shape == (4, 2)
    agent.train((items, info))
    agent.train(items)
    single, _ = rb.get_next(sample_batch_size=4)  # [B, ...], no time axis
    agent.train(single)
    agent.train(single._asdict())
    assert int(agent.train_step_counter) == 4


def test_a_window_trains_exactly_as_its_first_step_alone():
    # TF-Agents code samples num_steps=2 windows; step 0 holds the whole transition, step 1 is ignored.
    rb = filled_buffer(TFUniformReplayBuffer, 200)
    windows, _ = rb.get_next(sample_batch_size=16, num_steps=2)
    first_steps = tf.nest.map_structure(lambda x: x[:, 0], windows)
    agents = [DqnAgent(OBS, 2, make_q_network(OBS, 2, seed=5), tf.keras.optimizers.SGD(0.1)) for _ in range(2)]
    losses = [float(agents[0].train(windows).loss), float(agents[1].train(first_steps).loss)]
    assert losses[0] == losses[1]
    for a, b in zip(weights(agents[0].q_network), weights(agents[1].q_network)):
        np.testing.assert_array_equal(a, b)


BAD_EXPERIENCE = [
    (
        "missing field",
        {"observation": np.zeros((2, 4), np.float32)},
        TypeError,
        "DqnAgent.train: experience must have a field action",
    ),
    ("not a nest of fields", np.zeros((2, 4)), TypeError, "experience must have a field observation"),
    (
        "reward of rank 3",
        Transition(*[np.zeros((2, 1, 1), np.float32)] * 8),
        ValueError,
        r"DqnAgent.train: reward has shape \(2, 1, 1\); it must be \[batch\] or \[batch, time\]",
    ),
]


@pytest.mark.parametrize("name,experience,error,match", BAD_EXPERIENCE, ids=[c[0] for c in BAD_EXPERIENCE])
def test_bad_experience_is_rejected_before_training(name, experience, error, match):
    agent = DqnAgent(OBS, 2, make_q_network(OBS, 2, seed=4))
    before = weights(agent.q_network)
    with pytest.raises(error, match=match):
        agent.train(experience)
    assert int(agent.train_step_counter) == 0
    assert all(np.array_equal(a, b) for a, b in zip(before, weights(agent.q_network)))


BAD_ARGUMENTS = [
    (dict(target_update_period=0), ValueError, r"DqnAgent: target_update_period \(0\) must be a positive integer"),
    (dict(target_update_tau=1.5), ValueError, r"DqnAgent: target_update_tau \(1.5\) must be in \(0, 1\]"),
    (dict(gamma=-0.1), ValueError, r"DqnAgent: gamma \(-0.1\) must be in \[0, 1\]"),
    (dict(num_actions=0), ValueError, r"DqnAgent: num_actions \(0\) must be a positive integer"),
]


@pytest.mark.parametrize("kwargs,error,match", BAD_ARGUMENTS)
def test_bad_agent_arguments(kwargs, error, match):
    kwargs = {"observation_spec": OBS, "num_actions": 2, **kwargs}
    with pytest.raises(error, match=match):
        DqnAgent(**kwargs)
