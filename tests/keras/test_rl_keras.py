"""tfreplay.rl with either Keras: a DqnAgent trains a Keras 3 or a tf-keras network, and never mixes the two."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tfreplay.keras import keras_module
from tfreplay.rl.agents import DqnAgent, make_q_network

pytestmark = pytest.mark.keras  # run under tf-keras and again under Keras 3 (see the Makefile)

OBS = tf.TensorSpec((2,), tf.float32)
KERAS = {"keras": keras, "tf_keras": tf_keras}


def network(package):
    model = package.Sequential([package.layers.Dense(8, "relu"), package.layers.Dense(2)])
    model.build((None, 2))
    return model


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "observation": rng.normal(size=(16, 2)).astype(np.float32),
        "action": rng.integers(0, 2, 16),
        "reward": rng.normal(size=16).astype(np.float32),
        "discount": np.ones(16, np.float32),
        "next_observation": rng.normal(size=(16, 2)).astype(np.float32),
    }


@pytest.mark.parametrize("name", sorted(KERAS))
def test_an_agent_trains_a_network_of_either_keras_with_its_default_optimizer(name):
    package = KERAS[name]
    agent = DqnAgent(OBS, 2, network(package), target_update_period=2)
    assert keras_module(agent.optimizer) is package and keras_module(agent.target_q_network) is package
    before = [w.copy() for w in agent.q_network.get_weights()]
    losses = [float(agent.train(batch()).loss) for _ in range(4)]
    assert np.all(np.isfinite(losses)) and int(agent.train_step_counter) == 4
    assert any(not np.allclose(a, b) for a, b in zip(before, agent.q_network.get_weights()))
    for a, b in zip(agent.q_network.get_weights(), agent.target_q_network.get_weights()):
        np.testing.assert_array_equal(a, b)  # step 4 updated the target


MIXED = [
    ("keras", "tf_keras", r"optimizer \(Adam of tf_keras\) must be of the q_network's Keras \(keras \d"),
    ("tf_keras", "keras", r"optimizer \(Adam of keras\) must be of the q_network's Keras \(tf_keras \d"),
]


@pytest.mark.parametrize("model_keras,optimizer_keras,match", MIXED)
def test_an_optimizer_of_the_other_keras_is_refused(model_keras, optimizer_keras, match):
    with pytest.raises(TypeError, match=r"DqnAgent: " + match):
        DqnAgent(OBS, 2, network(KERAS[model_keras]), KERAS[optimizer_keras].optimizers.Adam())


def test_a_q_network_that_is_no_keras_model_is_refused():
    with pytest.raises(TypeError, match=r"DqnAgent: q_network \(Module\) must be a Keras model"):
        DqnAgent(OBS, 2, tf.Module())


def test_the_default_network_is_of_the_keras_tensorflow_uses():
    agent = DqnAgent(OBS, 2)
    assert keras_module(agent.q_network) is keras_module() is keras_module(agent.optimizer)
    assert keras_module(make_q_network(OBS, 3, (4,), seed=0)) is keras_module()


@pytest.mark.parametrize("name", sorted(KERAS))
def test_a_checkpoint_restores_networks_optimizer_and_counter_of_either_keras(name, tmp_path):
    agent = DqnAgent(OBS, 2, network(KERAS[name]))
    for seed in range(3):
        agent.train(batch(seed))
    path = tf.train.Checkpoint(agent=agent).save(str(tmp_path / "ckpt"))
    fresh = DqnAgent(OBS, 2, network(KERAS[name]))
    tf.train.Checkpoint(agent=fresh).restore(path).assert_existing_objects_matched()
    assert int(fresh.train_step_counter) == 3
    for a, b in zip(agent.q_network.get_weights(), fresh.q_network.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(agent.optimizer.variables, fresh.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The same next step from the same state: the restored agent continues the run.
    assert float(agent.train(batch(9)).loss) == float(fresh.train(batch(9)).loss)
