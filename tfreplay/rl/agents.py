"""A Double-DQN agent (Keras 3 or tf-keras) that learns from a replay buffer's dataset.

    dataset = rb.as_dataset(sample_batch_size=64)  # single transitions: num_steps=None
    agent = DqnAgent(driver.transition_spec.observation, num_actions=2)
    for experience in dataset.take(1000):
        loss_info = agent.train(experience)

Drivers store the true next observation in every transition (at an episode's
end, the final observation rather than the next episode's first), so one
transition holds everything a TD target needs: sample single transitions.
Windows of two (`num_steps=2`, what TF-Agents' DQN reads) are accepted too,
for code written for TF-Agents; only their step 0 is used, so they cost twice
the reads and never start at the newest transition of a segment.

Prioritized replay: `train(experience, weights)` scales each sample's loss by
its importance weight and returns each sample's `|TD error|`, the new priority:

    weights = tfreplay.importance_weights(info.probabilities, rb.num_frames(), beta)
    loss_info = agent.train(items, weights)
    rb.update_priorities(info.ids, loss_info.abs_td_errors + 1e-6)

n-step returns: items from `tfreplay.NStepReturns(n, gamma)` carry the whole
bootstrap factor in `discount` (`gamma^m` times the episode's discounts), so
an agent reading them is built with `gamma=1.0`; see `DqnAgent`.

Many train steps per call: `agent.train_loop(rb, 128, steps_per_call=16)` is a
`tfreplay.TrainLoop` that samples, trains (and with priorities, weighs and
updates) 16 times inside one graph call:

    train = agent.train_loop(rb, 128, steps_per_call=16)
    loss_info = train()  # the 16th step's LossInfo
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import tensorflow as tf

from tfreplay import BufferInfo, TrainLoop, importance_weights
from tfreplay._src import specs
from tfreplay.keras import keras_module
from tfreplay.rl.policies import EpsilonGreedyPolicy

Nest = Any  # a tf.nest structure of tensors or arrays

_FIELDS = ("observation", "action", "reward", "discount", "next_observation")


class LossInfo(NamedTuple):
    """What `DqnAgent.train` returns.

    Attributes:
      loss: the scalar loss of the step.
      extra: diagnostics, `q_mean` and `td_error_abs` (batch means).
      abs_td_errors: `|target - Q(s, a)|` of each sample, `[batch]`: the
        priorities to give the sampled items (plus a small epsilon).
    """

    loss: tf.Tensor
    extra: dict
    abs_td_errors: Any = None


def make_q_network(
    observation_spec: tf.TensorSpec,
    num_actions: int,
    fc_layer_params: Sequence[int] = (64, 64),
    seed: int | None = None,
) -> Any:
    """A built MLP from an observation to one Q-value per action, of the Keras `tf.keras` is.

    Args:
      observation_spec: spec of one (flat or flattenable) observation.
      num_actions: number of discrete actions.
      fc_layer_params: widths of the hidden ReLU layers.
      seed: seed of the weight initializers.

    Returns:
      A built `Sequential` of Keras 3, or of tf-keras when TensorFlow uses it
      (`tfreplay.keras.keras_module()`).
    """
    specs.check_positive_int("make_q_network", "num_actions", num_actions)
    keras = keras_module()
    init = lambda i: keras.initializers.GlorotUniform(seed=None if seed is None else seed + i)  # noqa: E731
    layers: list = [keras.layers.Flatten()]
    layers += [keras.layers.Dense(w, "relu", kernel_initializer=init(i)) for i, w in enumerate(fc_layer_params)]
    layers.append(keras.layers.Dense(num_actions, kernel_initializer=init(len(fc_layer_params))))
    model = keras.Sequential(layers, name="q_network")
    model.build([None] + observation_spec.shape.as_list())
    return model


def _keras_of(q_network: Any, optimizer: Any) -> Any:
    """The q_network's Keras, checked against the optimizer's: a Keras 3 model cannot take a tf-keras optimizer."""
    try:
        keras = keras_module(q_network)
    except TypeError:
        raise TypeError(
            f"DqnAgent: q_network ({type(q_network).__name__}) must be a Keras model (Keras 3 or tf-keras)."
        ) from None
    try:
        other = keras_module(optimizer) if optimizer is not None else keras
    except TypeError:
        other = keras  # not a Keras optimizer: anything with apply_gradients
    if other is not keras:
        raise TypeError(
            f"DqnAgent: optimizer ({type(optimizer).__name__} of {other.__name__}) must be of the q_network's "
            f"Keras ({keras.__name__} {keras.__version__}), e.g. "
            "tfreplay.keras.keras_module(q_network).optimizers.Adam(1e-3)."
        )
    return keras


def _field(items: Nest, name: str) -> Any:
    value = items.get(name) if isinstance(items, dict) else getattr(items, name, None)
    if value is None:
        raise TypeError(
            f"DqnAgent.train: experience must have a field {name} (a Transition or a dict with "
            f"{', '.join(_FIELDS)}); got {type(items).__name__}."
        )
    return value


class DqnAgent(tf.Module):
    """Double DQN with a Huber loss and a target network.

    The online network picks the next action, the target network values it:
    `target = r + gamma * discount * Q_target(s', argmax_a Q(s', a))`. The
    target network is updated every `target_update_period` train steps, with
    `target_update_tau` (1 = copy).

    One formula serves one-step and n-step items: `discount` is whatever
    multiplies the bootstrap after `gamma`. A stored `Transition` has
    `discount` 0 or 1, and `gamma` discounts it. `NStepReturns(n, gamma)` has
    already applied `gamma^m` (`m <= n` real steps), so build the agent that
    reads it with `gamma=1.0`: gamma then lives in one place, the transform
    (what `train_dqn` does when `n_step > 1`). Checkpoint it with
    `tf.train.Checkpoint(agent=agent, buffer=rb)`: networks, optimizer and
    `train_step_counter` are tracked.

    Args:
      observation_spec: spec of one observation.
      num_actions: actions are int from 0 to `num_actions - 1`.
      q_network: a built Keras model `[B, *obs] -> [B, num_actions]`, of
        Keras 3 or tf-keras; default `make_q_network(observation_spec,
        num_actions)`, of the Keras `tf.keras` is.
      optimizer: an optimizer of the q_network's Keras; default Adam(1e-3)
        of that Keras. The target network, the loss and the default optimizer
        all come from the q_network's Keras, so the two are never mixed.
      gamma: discount factor applied to each item's `discount` (1.0 for
        `NStepReturns` items, which are discounted already).
      target_update_period: train steps between target updates.
      target_update_tau: weight of the online network in each update.
      gradient_clipping: clip the gradients' global norm to this, if set.
      train_step_counter: an int64 variable to count with; default a new one.

    Raises:
      TypeError: a q_network that is no Keras model, or an optimizer of the
        other Keras (a Keras 3 model with a tf-keras optimizer, say).
      ValueError: a bad number (`num_actions`, `gamma`, target updates).
    """

    def __init__(
        self,
        observation_spec: tf.TensorSpec,
        num_actions: int,
        q_network: Any = None,
        optimizer: Any = None,
        gamma: float = 0.99,
        target_update_period: int = 100,
        target_update_tau: float = 1.0,
        gradient_clipping: float | None = None,
        train_step_counter: tf.Variable | None = None,
        name: str = "DqnAgent",
    ):
        super().__init__(name=name)
        specs.check_positive_int("DqnAgent", "num_actions", num_actions)
        specs.check_positive_int("DqnAgent", "target_update_period", target_update_period)
        if not 0.0 < target_update_tau <= 1.0:
            raise ValueError(f"DqnAgent: target_update_tau ({target_update_tau!r}) must be in (0, 1].")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"DqnAgent: gamma ({gamma!r}) must be in [0, 1].")
        self.num_actions = int(num_actions)
        self.q_network = q_network if q_network is not None else make_q_network(observation_spec, num_actions)
        keras = _keras_of(self.q_network, optimizer)
        self.target_q_network = keras.models.clone_model(self.q_network)
        self.target_q_network.build([None] + observation_spec.shape.as_list())
        self.target_q_network.set_weights(self.q_network.get_weights())
        self.optimizer = optimizer if optimizer is not None else keras.optimizers.Adam(1e-3)
        if hasattr(self.optimizer, "build"):  # slots exist now, so a checkpoint restores them at once
            self.optimizer.build(self.q_network.trainable_variables)
        self.train_step_counter = (
            train_step_counter
            if train_step_counter is not None
            else tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step_counter")
        )
        self._gamma, self._period, self._tau = float(gamma), int(target_update_period), float(target_update_tau)
        self._clip = gradient_clipping
        self._huber = keras.losses.huber
        self._train_fn = tf.function(self._train_step)

    def train(self, experience: Any, weights: Any = None) -> LossInfo:
        """One gradient step on a batch of experience.

        Usable eagerly and inside a `tf.function` (a train step that also
        samples and updates priorities).

        Args:
          experience: an `(items, BufferInfo)` element of `as_dataset` or
            `get_next`, or the items alone: a `Transition` (or a dict with its
            fields) shaped `[B, ...]` (`num_steps=None`), or windows shaped
            `[B, T, ...]` as TF-Agents samples them, of which step 0 is used.
          weights: importance weights, one per sample (`[B]`), e.g. from
            `tfreplay.importance_weights`; the loss is `mean(weights * huber)`
            over the batch. They are not renormalized: weights scaled by their
            maximum shrink the step, as in Schaul et al. (2016). `None`: all 1.

        Returns:
          `LossInfo(loss, extra, abs_td_errors)`; extra holds the mean
          Q-value and absolute TD error, `abs_td_errors` each sample's.

        Raises:
          TypeError: experience without the `Transition` fields.
          ValueError: a reward not `[B]` or `[B, T]`, or weights not `[B]`.
        """
        if isinstance(experience, tuple) and len(experience) == 2 and isinstance(experience[1], BufferInfo):
            experience = experience[0]
        fields = [tf.nest.map_structure(tf.convert_to_tensor, _field(experience, f)) for f in _FIELDS]
        rank = fields[2].shape.rank
        if rank not in (1, 2):
            raise ValueError(
                f"DqnAgent.train: reward has shape {fields[2].shape}; it must be [batch] or [batch, time]."
            )
        if rank == 2:
            fields = [tf.nest.map_structure(lambda x: x[:, 0], f) for f in fields]
        return self._train_fn(*fields, self._weights(weights, fields[2]))

    @staticmethod
    def _weights(weights: Any, reward: tf.Tensor) -> tf.Tensor:
        if weights is None:
            return tf.ones_like(reward, tf.float32)
        weights = tf.cast(tf.convert_to_tensor(weights), tf.float32)
        if weights.shape.rank != 1 or not weights.shape.is_compatible_with(reward.shape):
            raise ValueError(
                f"DqnAgent.train: weights has shape {weights.shape}; it must be [batch], one weight per sample "
                f"(the reward's batch is {reward.shape[:1]})."
            )
        return weights

    def train_loop(
        self,
        buffer: Any,
        sample_batch_size: int,
        steps_per_call: int,
        *,
        transform: Any = None,
        beta: float | tf.Variable | Callable[[], Any] = 0.4,
        priority_eps: float = 1e-6,
        metrics: str = "last",
        jit_compile: bool | None = None,
    ) -> TrainLoop:
        """`steps_per_call` train steps per call, each on a batch sampled inside the same graph.

        A `tfreplay.TrainLoop` whose step trains on `sample_batch_size` single
        transitions (n-step ones with `transform=NStepReturns(n, gamma)`).
        With a prioritized buffer it is `prioritized_train_step`'s step: each
        sample's loss weighed by its importance weight of exponent `beta`,
        then the sampled items' priorities set to `|TD error| + priority_eps`.
        For the same seeds the run is that of `steps_per_call` separate
        `get_next` and `train` calls.

        Args:
          buffer: a TF buffer of `Transition`s (uniform or prioritized).
          sample_batch_size: transitions per step.
          steps_per_call: train steps per call.
          transform: applied at sample time, e.g. `tfreplay.NStepReturns`.
          beta: the importance-weight exponent: a float, a `tf.Variable`, or a
            function of no arguments called in the graph at every step (a
            schedule of a step variable, say); unused with a uniform buffer.
          priority_eps: added to `|TD error|` so that no priority is 0.
          metrics, jit_compile: as `tfreplay.TrainLoop`.

        Returns:
          A `TrainLoop`; each call returns the steps' `LossInfo` as `metrics`
          asks (`"last"`: the last step's).

        Raises:
          ValueError: a non-positive `priority_eps`, or what `TrainLoop` refuses.
        """
        if not priority_eps > 0.0:
            raise ValueError(f"DqnAgent.train_loop: priority_eps ({priority_eps!r}) must be positive.")
        exponent = beta if callable(beta) else lambda: beta

        def uniform(items: Nest, info: BufferInfo) -> LossInfo:
            return self.train(items)

        def prioritized(items: Nest, info: BufferInfo) -> tuple[LossInfo, tf.Tensor]:
            return weighted_train(self, buffer, items, info, exponent(), priority_eps)

        return TrainLoop(
            buffer,
            prioritized if hasattr(buffer, "update_priorities") else uniform,
            steps_per_call,
            sample_batch_size,
            transform=transform,
            metrics=metrics,
            jit_compile=jit_compile,
        )

    @property
    def gamma(self) -> float:
        """The discount applied to each item's `discount` (1.0 for an agent reading `NStepReturns`)."""
        return self._gamma

    def _td_targets(self, reward: tf.Tensor, discount: tf.Tensor, next_observation: Nest) -> tf.Tensor:
        best = tf.argmax(self.q_network(next_observation, training=False), axis=-1, output_type=tf.int32)
        next_q = tf.gather(self.target_q_network(next_observation, training=False), best, batch_dims=1)
        return tf.stop_gradient(reward + self._gamma * discount * next_q)

    def _train_step(
        self,
        observation: Nest,
        action: tf.Tensor,
        reward: tf.Tensor,
        discount: tf.Tensor,
        next_observation: Nest,
        weights: tf.Tensor,
    ) -> LossInfo:
        targets = self._td_targets(reward, discount, next_observation)
        variables = self.q_network.trainable_variables
        with tf.GradientTape() as tape:
            q_values = self.q_network(observation, training=True)
            chosen = tf.gather(q_values, tf.cast(action, tf.int32), batch_dims=1)
            td_errors = targets - chosen
            # Keras' Huber (delta 1) averages over the last axis: [batch, 1] gives one value per sample, which
            # the importance weights scale before the batch mean (a plain Huber mean would ignore them).
            per_sample = self._huber(targets[:, None], chosen[:, None])
            loss = tf.reduce_mean(weights * per_sample)
        grads = tape.gradient(loss, variables)
        if self._clip is not None:
            grads, _ = tf.clip_by_global_norm(grads, self._clip)
        self.optimizer.apply_gradients(zip(grads, variables))
        step = self.train_step_counter.assign_add(1)
        if step % self._period == 0:
            self._update_target()
        abs_td_errors = tf.abs(td_errors)
        extra = {"q_mean": tf.reduce_mean(chosen), "td_error_abs": tf.reduce_mean(abs_td_errors)}
        return LossInfo(loss=loss, extra=extra, abs_td_errors=abs_td_errors)

    def _update_target(self) -> tf.Operation:
        tau = self._tau
        return tf.group(
            *[
                t.assign(tau * s + (1.0 - tau) * t)
                for s, t in zip(self.q_network.variables, self.target_q_network.variables)
            ]
        )

    def update_target(self) -> None:
        """Updates the target network now (with `target_update_tau`)."""
        self._update_target()

    def policy(self, epsilon: Any = 0.0, seed: int | None = None) -> EpsilonGreedyPolicy:
        """An `EpsilonGreedyPolicy` over the online Q-network (greedy by default)."""
        return EpsilonGreedyPolicy(self.q_network, self.num_actions, epsilon=epsilon, seed=seed)


def weighted_train(
    agent: DqnAgent, buffer: Any, items: Nest, info: BufferInfo, beta: Any, priority_eps: float
) -> tuple[LossInfo, tf.Tensor]:
    """A train step on a prioritized sample, weighted by `importance_weights`; returns the `LossInfo` and the
    items' new priorities, `|TD error| + priority_eps` (float64), for the caller to give them."""
    weights = importance_weights(info.probabilities, buffer.num_frames(), beta)
    loss_info = agent.train(items, weights)
    return loss_info, tf.cast(loss_info.abs_td_errors, tf.float64) + priority_eps
