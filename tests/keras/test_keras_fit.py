"""tfreplay.keras: `model.fit` from a buffer (x, y and importance weights), and which Keras is used."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tfreplay
import tfreplay.keras
from tfreplay.keras import fit_dataset, fit_map, keras_module

pytestmark = pytest.mark.keras  # run under tf-keras and again under Keras 3 (see the Makefile)

SPEC = {
    "obs": {"vec": tf.TensorSpec((3,), tf.float32), "id": tf.TensorSpec((), tf.int64)},
    "target": tf.TensorSpec((), tf.float32),
}
TRUE_W = np.float32([1.0, -2.0, 0.5])


def filled(buffer_cls=tfreplay.TFUniformReplayBuffer, n=64, **kwargs):
    """`n` items, id i at row i; the target is a linear function of the vector."""
    rb = buffer_cls(SPEC, batch_size=1, max_length=n, seed=0, **kwargs)
    vec = np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32)
    for i in range(n):
        rb.add_batch({"obs": {"vec": vec[i : i + 1], "id": np.int64([i])}, "target": vec[i : i + 1] @ TRUE_W})
    return rb


def linear_model():
    keras = keras_module()
    model = keras.Sequential([keras.layers.Dense(1, use_bias=False)])
    model.build((None, 3))
    return model


def test_the_keras_is_the_one_tensorflow_routes_tf_keras_to():
    legacy = os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")  # TensorFlow's own reading
    keras = keras_module()
    assert keras.__name__ == ("tf_keras" if legacy else "keras")
    assert legacy or keras.__version__.startswith("3.")
    assert isinstance(tf.keras.layers.Dense(1), keras.layers.Layer)


def test_keras_module_tells_the_keras_of_an_object():
    import keras
    import tf_keras

    assert keras_module(keras.layers.Dense(1)) is keras
    assert keras_module(keras.optimizers.Adam()) is keras
    assert keras_module(tf_keras.optimizers.Adam()) is tf_keras
    assert keras_module(tf_keras.Sequential()) is tf_keras
    with pytest.raises(TypeError, match=r"keras_module: like \(ResourceVariable\) must be an object of Keras 3"):
        keras_module(tf.Variable(1.0))


def test_model_fit_learns_a_regression_from_the_buffer():
    tf.keras.utils.set_random_seed(0)
    model = linear_model()
    model.compile(optimizer=keras_module().optimizers.SGD(0.1), loss="mse")
    dataset = fit_dataset(filled(), 32, x="obs/vec", y="target")
    history = model.fit(dataset, epochs=3, steps_per_epoch=40, verbose=0, shuffle=False)
    assert history.history["loss"][-1] < 1e-3 * history.history["loss"][0]
    np.testing.assert_allclose(model.get_weights()[0][:, 0], TRUE_W, atol=1e-2)


def test_elements_are_what_the_keys_name():
    rb = filled()
    x, y = next(iter(fit_dataset(rb, 8, x="obs/vec", y="target")))
    assert x.shape == (8, 3) and y.shape == (8,)
    np.testing.assert_allclose(x.numpy() @ TRUE_W, y.numpy(), rtol=1e-5)

    (vec, ids), y = next(iter(fit_dataset(rb, 8, x=("obs/vec", "obs/id"), y="target")))
    np.testing.assert_allclose(vec.numpy() @ TRUE_W, y.numpy(), rtol=1e-5)
    assert ids.dtype == tf.int64 and ids.shape == (8,)

    x, y = next(iter(fit_dataset(rb, 8, x={"inputs": "obs/vec"}, y=lambda items: 2.0 * items["target"])))
    assert list(x) == ["inputs"]
    np.testing.assert_allclose(x["inputs"].numpy() @ (2 * TRUE_W), y.numpy(), rtol=1e-5)

    element = next(iter(fit_dataset(rb, 8, x="obs")))
    assert len(element) == 1 and set(element[0]) == {"vec", "id"}  # (x,): Keras reads x alone


def test_windows_and_transforms_pass_through():
    x, y = next(iter(fit_dataset(filled(), 4, x="obs/vec", y="target", num_steps=3)))
    assert x.shape == (4, 3, 3) and y.shape == (4, 3)


def prioritized(priorities):
    rb = filled(tfreplay.TFPrioritizedReplayBuffer, n=len(priorities), alpha=0.5)
    rb.update_priorities(np.arange(len(priorities)), np.asarray(priorities, np.float64))
    return rb


def test_sample_weights_are_the_normalized_importance_weights_of_each_sampled_item():
    priorities = np.linspace(0.1, 4.0, 16)
    probabilities = priorities**0.5 / np.sum(priorities**0.5)
    dataset = fit_dataset(prioritized(priorities), 32, x="obs/id", y="target", beta=0.6)
    for ids, _, weights in dataset.take(3):
        p = probabilities[ids.numpy()]
        want = (len(p) * p) ** -0.6 / np.max((len(p) * p) ** -0.6)  # (N P)^-beta over the batch maximum
        np.testing.assert_allclose(weights.numpy(), want, rtol=1e-5)
        assert weights.numpy().max() == pytest.approx(1.0) and len(set(ids.numpy())) > 1


def test_the_weights_equal_tfreplays_importance_weights_and_beta_can_be_annealed():
    rb = prioritized(np.linspace(0.1, 4.0, 16))
    beta = tf.Variable(0.4)
    to_fit = fit_map("obs/vec", "target", beta=beta)
    items, info = rb.get_next(sample_batch_size=32)
    for value in (0.4, 1.0, 0.0):
        beta.assign(value)
        _, _, weights = to_fit(items, info)
        want = tfreplay.importance_weights(info.probabilities, rb.num_frames(), value)
        np.testing.assert_allclose(weights.numpy(), want.numpy(), rtol=1e-5)
    np.testing.assert_array_equal(weights.numpy(), np.ones(32))  # beta 0: no correction
    _, _, uniform = fit_map("obs/vec", "target", beta=1.0)(*filled().get_next(sample_batch_size=8))
    np.testing.assert_allclose(uniform.numpy(), np.ones(8))  # equal probabilities: equal weights


def test_keras_reads_the_third_element_as_sample_weight():
    model = linear_model()
    model.compile(optimizer="sgd", loss="mse")
    x, y, w = next(iter(fit_dataset(prioritized(np.linspace(0.1, 4.0, 16)), 16, x="obs/vec", y="target", beta=1.0)))
    assert np.ptp(w.numpy()) > 0.1  # unequal weights: a test that ignored them would fail
    squared = (model.predict_on_batch(x)[:, 0] - y.numpy()) ** 2
    loss = model.evaluate(tf.data.Dataset.from_tensors((x, y, w)), verbose=0)
    np.testing.assert_allclose(loss, np.mean(w.numpy() * squared), rtol=1e-4)
    assert not np.isclose(np.mean(squared), np.mean(w.numpy() * squared), rtol=1e-3)


NO_FIELD = r"fit_dataset: x \('{}'\) names no field: "
BAD_KEYS = [
    (dict(x="obz", y="target"), ValueError, NO_FIELD.format("obz") + "'obz' is not one of obs, target"),
    (dict(x="obs/pix", y="target"), ValueError, NO_FIELD.format("obs/pix") + "'pix' is not one of vec, id under 'obs'"),
    (dict(x="obs/vec/a", y="target"), ValueError, NO_FIELD.format("obs/vec/a") + r"'obs/vec' is a leaf \(a tensor\)"),
    (dict(x="obs/vec", y=("target", "rewards")), ValueError, r"fit_dataset: y \('rewards'\) names no field"),
    (dict(x="", y="target"), ValueError, r"fit_dataset: x \(''\) must name a field"),
    (dict(x=3, y="target"), TypeError, r"fit_dataset: x \(3\) must be a field path such as 'observation'"),
    (dict(x="obs/vec", y=[]), TypeError, r"fit_dataset: y \(\[\]\) must be a field path"),
    (dict(x="obs/vec", y="target", beta=1.5), ValueError, r"fit_dataset: beta \(1.5\) must be in \[0, 1\]"),
    (dict(x="obs/vec", beta=0.5), ValueError, r"fit_dataset: beta \(0.5\) needs y"),
    (dict(x="obs/vec", y="target", sample_batch_size=0), ValueError, r"fit_dataset: sample_batch_size \(0\) must be"),
]


@pytest.mark.parametrize("kwargs,error,match", BAD_KEYS)
def test_bad_arguments_are_refused_at_once_naming_the_argument(kwargs, error, match):
    kwargs = {"sample_batch_size": 8, **kwargs}
    with pytest.raises(error, match=match):
        fit_dataset(filled(n=8), **kwargs)


def test_fit_map_refuses_weights_for_a_pass_that_draws_nothing():
    dataset = filled(n=8).as_dataset(sample_batch_size=4, single_deterministic_pass=True)
    xs = [x for x, _ in dataset.map(fit_map("obs/vec", "target"))]  # without beta, the pass maps fine
    assert sum(len(x) for x in xs) == 8 and xs[0].shape[1:] == (3,)
    with pytest.raises(ValueError, match=r"fit_map: beta \(0.5\) needs the probabilities of a sample"):
        dataset.map(fit_map("obs/vec", "target", beta=0.5))
    with pytest.raises(ValueError, match=r"fit_map: x \('o'\) names no field: 'o' is not one of obs, target"):
        dataset.map(fit_map("o", "target"))
