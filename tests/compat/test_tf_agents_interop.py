"""TF-Agents code running on tfreplay's compat buffers: a DQN agent trained from them, checkpoints, migration.

Runs only in the compatibility lane (`make test-compat`: TF 2.15, TF-Agents 0.19).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

tf_agents = pytest.importorskip("tf_agents")

from redirect import original  # noqa: E402
from tf_agents.agents.dqn import dqn_agent  # noqa: E402
from tf_agents.drivers import dynamic_step_driver, py_driver  # noqa: E402
from tf_agents.environments import batched_py_environment, suite_gym, tf_py_environment  # noqa: E402
from tf_agents.networks import q_network  # noqa: E402
from tf_agents.policies import py_tf_eager_policy, random_py_policy  # noqa: E402
from tf_agents.specs import tensor_spec  # noqa: E402
from tf_agents.utils import common  # noqa: E402

from tfreplay.compat.tf_agents import restore_tf_agents_checkpoint  # noqa: E402
from tfreplay.compat.tf_agents.replay_buffers import (  # noqa: E402
    py_uniform_replay_buffer,
    tf_uniform_replay_buffer,
)

ITERATIONS = 300


def make_agent(time_step_spec, action_spec) -> dqn_agent.DqnAgent:
    """A small DQN whose target net never updates during the test: the loss is a regression that must fall."""
    tf.random.set_seed(0)
    net = q_network.QNetwork(time_step_spec.observation, action_spec, fc_layer_params=(64,))
    agent = dqn_agent.DqnAgent(
        time_step_spec,
        action_spec,
        q_network=net,
        optimizer=tf.keras.optimizers.Adam(1e-3),
        td_errors_loss_fn=common.element_wise_squared_loss,
        target_update_period=10_000,
        train_step_counter=tf.Variable(0),
    )
    agent.initialize()
    agent.train = common.function(agent.train)
    return agent


def train(agent, collect, next_experience) -> list:
    losses = []
    for _ in range(ITERATIONS):
        collect()
        losses.append(float(agent.train(next_experience()).loss))
    return losses


def check_falls(losses: list) -> None:
    first, last = np.mean(losses[:50]), np.mean(losses[-50:])
    assert last < 0.5 * first, (first, last)


def contents(rb):
    return tf.nest.map_structure(np.asarray, rb.gather_all())


def check_checkpointer_round_trip(rb, make_buffer, tmp_path) -> None:
    before = contents(rb)
    checkpointer = common.Checkpointer(str(tmp_path / "ckpt"), max_to_keep=1, replay_buffer=rb)
    checkpointer.save(tf.constant(1, tf.int64))
    restored = make_buffer()
    common.Checkpointer(str(tmp_path / "ckpt"), max_to_keep=1, replay_buffer=restored).initialize_or_restore()
    tf.nest.map_structure(np.testing.assert_array_equal, contents(restored), before)


def test_dqn_trains_from_the_tf_buffer_fed_by_a_dynamic_step_driver(tmp_path):
    env = tf_py_environment.TFPyEnvironment(suite_gym.load("CartPole-v0"))
    agent = make_agent(env.time_step_spec(), env.action_spec())

    def make_buffer():
        return tf_uniform_replay_buffer.TFUniformReplayBuffer(agent.collect_data_spec, env.batch_size, 10_000)

    rb = make_buffer()
    driver = dynamic_step_driver.DynamicStepDriver(env, agent.collect_policy, observers=[rb.add_batch], num_steps=1)
    run = common.function(driver.run)
    for _ in range(500):
        run()
    iterator = iter(rb.as_dataset(sample_batch_size=64, num_steps=2, num_parallel_calls=2).prefetch(2))
    check_falls(train(agent, run, lambda: next(iterator)[0]))  # the TF buffer yields (experience, BufferInfo)
    check_checkpointer_round_trip(rb, make_buffer, tmp_path)


def test_dqn_trains_from_the_numpy_buffer_fed_by_a_py_driver(tmp_path):
    env = batched_py_environment.BatchedPyEnvironment([suite_gym.load("CartPole-v0")])
    time_step_spec = tensor_spec.from_spec(env.time_step_spec())
    agent = make_agent(time_step_spec, tensor_spec.from_spec(env.action_spec()))
    data_spec = tensor_spec.to_nest_array_spec(agent.collect_data_spec)

    def make_buffer():
        return py_uniform_replay_buffer.PyUniformReplayBuffer(data_spec, 10_000)

    rb = make_buffer()
    random_policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), outer_dims=(1,))
    py_driver.PyDriver(env, random_policy, [rb.add_batch], max_steps=500).run(env.reset())
    policy = py_tf_eager_policy.PyTFEagerPolicy(agent.collect_policy, use_tf_function=True, batch_time_steps=False)
    driver = py_driver.PyDriver(env, policy, [rb.add_batch], max_steps=1)
    state = {"time_step": env.current_time_step()}

    def collect():
        state["time_step"], _ = driver.run(state["time_step"])

    iterator = iter(rb.as_dataset(sample_batch_size=64, num_steps=2).prefetch(2))
    check_falls(train(agent, collect, lambda: next(iterator)))  # the NumPy buffer yields experience alone
    check_checkpointer_round_trip(rb, make_buffer, tmp_path)


SPEC = {"obs": tf.TensorSpec([3], tf.float32), "action": tf.TensorSpec([], tf.int64)}


def tf_agents_run(tmp_path, num_adds: int):
    """A TF-Agents buffer (2 segments of 5) after `num_adds` adds, saved by its Checkpointer."""
    rb = original("tf_uniform_replay_buffer").TFUniformReplayBuffer(SPEC, batch_size=2, max_length=5)
    for i in range(num_adds):
        rb.add_batch({"obs": tf.fill([2, 3], float(i)), "action": tf.constant([i, 100 + i], tf.int64)})
    common.Checkpointer(str(tmp_path), max_to_keep=1, replay_buffer=rb).save(tf.constant(0, tf.int64))
    return rb


@pytest.mark.parametrize("num_adds", [0, 3, 12])
@pytest.mark.parametrize("twin", ["tf", "py"])
def test_a_tf_agents_checkpoint_migrates_with_its_items_in_order(tmp_path, num_adds, twin):
    theirs = tf_agents_run(tmp_path, num_adds)
    if twin == "tf":
        ours = tf_uniform_replay_buffer.TFUniformReplayBuffer(SPEC, 2, 5)
    else:
        import tfreplay

        ours = tfreplay.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=5)
    assert restore_tf_agents_checkpoint(ours, str(tmp_path)) == 2 * min(num_adds, 5)
    tf.nest.map_structure(np.testing.assert_array_equal, contents(ours), contents(theirs))
    ours.add_batch({"obs": np.zeros([2, 3], np.float32), "action": np.array([-1, -2])})  # the run goes on
    assert int(ours.num_frames()) == 2 * min(num_adds + 1, 5)


@pytest.mark.parametrize("twin", ["tf", "py"])
def test_a_tf_agents_checkpoint_migrates_into_a_rate_limited_buffer(tmp_path, twin):
    """The limiter does not hold the loading back (here it would refuse the 4th add at once), and afterwards
    counts the items as a restore without counts does: the warm-up is over, a sample goes at once."""
    import tfreplay

    tf_agents_run(tmp_path, 12)
    limiter = tfreplay.SampleToInsertRatio(1.0, 4, 4.0, insert_timeout=0, sample_timeout=0)
    cls = tfreplay.TFUniformReplayBuffer if twin == "tf" else tfreplay.PyUniformReplayBuffer
    ours = cls(SPEC, batch_size=2, max_length=5, rate_limiter=limiter)
    assert restore_tf_agents_checkpoint(ours, str(tmp_path)) == 10
    info = limiter.info()
    assert (info.size, info.inserts, info.samples) == (10, 4, 0)
    ours.get_next(sample_batch_size=4)


def test_a_tf_agents_checkpoint_of_another_layout_is_refused_and_changes_nothing(tmp_path):
    tf_agents_run(tmp_path, 7)
    ours = tf_uniform_replay_buffer.TFUniformReplayBuffer(SPEC, 5, 2)
    ours.add_batch({"obs": np.ones([5, 3], np.float32), "action": np.arange(5)})
    with pytest.raises(ValueError, match=r"restore_tf_agents_checkpoint: the checkpoint's id table must place"):
        restore_tf_agents_checkpoint(ours, str(tmp_path))
    assert int(ours.num_frames()) == 5


def test_a_plain_restore_of_a_tf_agents_checkpointer_directory_points_to_the_migration(tmp_path):
    tf_agents_run(tmp_path, 3)
    ours = tf_uniform_replay_buffer.TFUniformReplayBuffer(SPEC, 2, 5)
    with pytest.raises(ValueError, match=r"TF-Agents replay buffer's checkpoint: .*restore_tf_agents_checkpoint"):
        common.Checkpointer(str(tmp_path), max_to_keep=1, replay_buffer=ours)
    assert int(ours.num_frames()) == 0
