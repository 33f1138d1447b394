"""Double DQN on CartPole-v1 in Keras 3: a `keras.Model` whose `train_step` samples the replay buffer in its graph.

    python -m examples.keras_dqn                          # 20,000 env steps, 4 updates per train_step
    python -m examples.keras_dqn --steps=600 --prioritized
    python -m examples.keras_dqn --train_steps_per_call=1 --checkpoint_dir=runs/keras_dqn

`model.fit` drives the run. Before each of its train steps a callback steps
the collect driver (4 CartPole environments, epsilon-greedy on the model) and
the driver adds the transitions to a `TFUniformReplayBuffer`. The model's
`train_step` is a `tfreplay.TrainLoop`: `--train_steps_per_call` gradient
updates, each on a batch drawn with `get_next` inside the same compiled
function, so no `tf.data` pipeline sits between buffer and model and the
per-call cost of TensorFlow is paid once per K updates. The callback collects
K vector steps before each call, so the ratio of updates to environment steps
is the same for every K. With `--prioritized` the buffer is a
`TFPrioritizedReplayBuffer`: the loss is weighted by the importance weights
and each update gives the items it sampled their new priorities.

At the end, model, optimizer and buffer are saved together with one
`tf.train.Checkpoint` and restored into a fresh model and buffer, which must
give the same Q-values and hold the same transitions. `model.save` alone would
not do: the buffer is no Keras layer, so a `.keras` file has none of its
transitions (see docs/guides/keras.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402  (Keras 3 whatever TF_USE_LEGACY_KERAS says: the example does not go through tf.keras)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfreplay  # noqa: E402
from tfreplay.rl.drivers import StepDriver, make_vector_env, transition_spec  # noqa: E402
from tfreplay.rl.observers import AverageReturn  # noqa: E402
from tfreplay.rl.policies import EpsilonGreedyPolicy, RandomPolicy  # noqa: E402
from tfreplay.rl.training import evaluate  # noqa: E402

ENV_ID = "CartPole-v1"


def q_mlp(num_actions: int, hidden: Sequence[int], num_inputs: int, name: str) -> keras.Sequential:
    layers = [keras.layers.Dense(width, "relu") for width in hidden] + [keras.layers.Dense(num_actions)]
    model = keras.Sequential(layers, name=name)
    model.build((None, num_inputs))
    return model


class DqnModel(keras.Model):
    """Double DQN as a Keras model: `call` is the online Q-network, `train_step` samples `buffer` and learns.

    Args:
      buffer: a `TFUniformReplayBuffer` or `TFPrioritizedReplayBuffer` of `Transition`s.
      num_actions: CartPole's 2.
      num_inputs: the observation's length.
      hidden: widths of the hidden layers.
      gamma: the discount.
      batch_size: transitions per train step.
      target_update_period: train steps between copies of the online network into the target network.
      beta: importance-weight exponent (prioritized buffers only).
      train_steps_per_call: gradient updates per `train_step` (one `TrainLoop` call).
    """

    def __init__(
        self,
        buffer: Any,
        num_actions: int,
        num_inputs: int,
        hidden: Sequence[int] = (128, 128),
        gamma: float = 0.99,
        batch_size: int = 64,
        target_update_period: int = 200,
        beta: float = 0.4,
        train_steps_per_call: int = 4,
    ):
        super().__init__()
        self.buffer = buffer
        self.online = q_mlp(num_actions, hidden, num_inputs, "online")
        self.target = q_mlp(num_actions, hidden, num_inputs, "target")
        self.update_target()
        self.gamma, self.batch_size, self.period, self.beta = gamma, batch_size, target_update_period, beta
        self.prioritized = isinstance(buffer, tfreplay.TFPrioritizedReplayBuffer)
        self.learn = tfreplay.TrainLoop(buffer, self.update, train_steps_per_call, batch_size, metrics="mean")

    def call(self, observation: tf.Tensor, training: bool = False) -> tf.Tensor:
        return self.online(observation, training=training)

    def update_target(self) -> tf.Tensor:
        for target, online in zip(self.target.variables, self.online.variables):
            target.assign(online)
        return tf.constant(True)

    def train_step(self, data: Any) -> dict:
        del data  # the batches come from the buffer, drawn inside this graph
        return self.learn()

    def update(self, items: Any, info: Any) -> Any:
        """One gradient update on `items` (the `TrainLoop`'s step); with a prioritized buffer also the sampled
        items' new priorities, `|TD error| + 1e-6`."""
        best = tf.argmax(self.online(items.next_observation), axis=-1, output_type=tf.int32)
        next_q = tf.gather(self.target(items.next_observation), best, batch_dims=1)
        targets = tf.stop_gradient(items.reward + self.gamma * items.discount * next_q)
        weights = None
        if self.prioritized:
            weights = tfreplay.importance_weights(info.probabilities, self.buffer.num_frames(), self.beta)
        with tf.GradientTape() as tape:
            q_values = self.online(items.observation, training=True)
            chosen = tf.gather(q_values, tf.cast(items.action, tf.int32), batch_dims=1)
            # [batch, 1]: the Huber loss averages its last axis, so each sample keeps its own loss (and weight).
            loss = self.compute_loss(y=targets[:, None], y_pred=chosen[:, None], sample_weight=weights)
        variables = self.online.trainable_variables
        self.optimizer.apply(tape.gradient(loss, variables), variables)
        tf.cond(self.optimizer.iterations % self.period == 0, self.update_target, lambda: tf.constant(False))
        metrics = {"loss": loss, "q": tf.reduce_mean(chosen)}
        if self.prioritized:
            return metrics, tf.cast(tf.abs(targets - chosen), tf.float64) + 1e-6
        return metrics


class Collect(keras.callbacks.Callback):
    """Steps the collect driver before every train step: `num_envs` new transitions per gradient update."""

    def __init__(self, driver: StepDriver, updates_per_call: int):
        super().__init__()
        self.driver, self.num_steps = driver, updates_per_call * driver.num_envs

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.driver.run(self.num_steps)


class Log(keras.callbacks.Callback):
    def __init__(self, driver: StepDriver, returns: AverageReturn):
        super().__init__()
        self.driver, self.returns = driver, returns

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        loss = float((logs or {}).get("loss", float("nan")))
        steps, average = self.driver.num_env_steps, self.returns.result()
        print(f"env steps {steps:6d} | average return {average:6.1f} | loss {loss:.3f}")


def build(spec: Any, num_envs: int, prioritized: bool, seed: int, steps_per_call: int) -> tuple[DqnModel, Any]:
    """A compiled model and its empty buffer (the same calls build the copy a checkpoint is restored into)."""
    if prioritized:
        buffer = tfreplay.TFPrioritizedReplayBuffer(spec, num_envs, max_length=10_000, alpha=0.6, seed=seed)
    else:
        buffer = tfreplay.TFUniformReplayBuffer(spec, num_envs, max_length=10_000, seed=seed)
    model = DqnModel(buffer, 2, spec.observation.shape[0], train_steps_per_call=steps_per_call)
    # jit_compile=False: the buffer's sampling ops run outside XLA.
    model.compile(optimizer=keras.optimizers.Adam(5e-4), loss=keras.losses.Huber(), jit_compile=False)
    model.optimizer.build(model.online.trainable_variables)  # its slots exist now, so a restore fills them at once
    return model, buffer


def checkpoint(model: DqnModel, buffer: Any) -> tf.train.Checkpoint:
    """Network weights (online and target), the optimizer (compile made it an attribute of the model: its slots and
    step count come along) and every stored transition with the buffer's sampling state."""
    return tf.train.Checkpoint(model=model, buffer=buffer)


def train(
    steps: int = 20_000,
    seed: int = 0,
    num_envs: int = 4,
    prioritized: bool = False,
    checkpoint_dir: str | None = None,
    train_steps_per_call: int = 4,
) -> dict:
    """Collects `steps` env steps, one gradient update per vector step after 1,000 random ones, in train steps of
    `train_steps_per_call` updates; saves, restores, checks."""
    keras.utils.set_random_seed(seed)
    env = make_vector_env(ENV_ID, num_envs)
    spec = transition_spec(env.single_observation_space, env.single_action_space)
    model, buffer = build(spec, num_envs, prioritized, seed, train_steps_per_call)
    returns = AverageReturn(20)
    driver = StepDriver(env, RandomPolicy(env.single_action_space, seed=seed), [buffer.add_batch, returns], num_envs)
    driver.run(min(1_000, steps // 2))  # the buffer must hold a batch before the first train step samples it
    decay = max(steps // 2, 1)
    epsilon = lambda: max(0.05, 1.0 - driver.num_env_steps / decay)  # noqa: E731
    driver.policy = EpsilonGreedyPolicy(model, env.single_action_space, epsilon=epsilon, seed=seed)

    num_train_steps = max((steps - driver.num_env_steps) // (num_envs * train_steps_per_call), 1)  # fit's steps
    epochs = min(10, num_train_steps)
    no_data = tf.data.Dataset.from_tensors(tf.zeros([1])).repeat()  # fit needs an x; train_step ignores it
    model.fit(
        no_data, epochs=epochs, steps_per_epoch=num_train_steps // epochs, shuffle=False, verbose=0,
        callbacks=[Collect(driver, train_steps_per_call), Log(driver, returns)],
    )  # fmt: skip
    env.close()
    greedy = evaluate(ENV_ID, EpsilonGreedyPolicy(model, 2, epsilon=0.0), num_episodes=10, seed=seed + 1)

    directory = checkpoint_dir or tempfile.mkdtemp(prefix="keras_dqn_")
    path = checkpoint(model, buffer).save(os.path.join(directory, "ckpt"))
    copy, copy_buffer = build(
        spec, num_envs, prioritized, seed + 1, train_steps_per_call
    )  # other initial weights, an empty buffer
    checkpoint(copy, copy_buffer).restore(path).assert_existing_objects_matched()
    observations = buffer.gather_all().observation[0, :256]
    same_q = np.allclose(model(observations), copy(observations))
    stored, restored = (tf.nest.flatten(b.gather_all()) for b in (buffer, copy_buffer))
    same_buffer = all(np.array_equal(a, b) for a, b in zip(stored, restored))
    same_steps = int(copy.optimizer.iterations) == int(model.optimizer.iterations)
    print(f"greedy return {np.mean(greedy):.1f} over 10 episodes | checkpoint {path}")
    print(f"restored: same Q-values {same_q}, same transitions {same_buffer}, same optimizer step {same_steps}")
    return {
        "num_env_steps": driver.num_env_steps,
        "num_train_steps": int(model.optimizer.iterations),
        "greedy_return": float(np.mean(greedy)),
        "checkpoint": path,
        "restored": same_q and same_buffer and same_steps,
        "model": model,
        "restored_model": copy,
        "restored_buffer": copy_buffer,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="environment steps to collect, over all envs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_envs", type=int, default=4)
    parser.add_argument("--prioritized", action="store_true", help="prioritized replay (alpha 0.6, beta 0.4)")
    parser.add_argument("--checkpoint_dir", default=None, help="where the checkpoint goes (default: a temp dir)")
    parser.add_argument("--train_steps_per_call", type=int, default=4, help="gradient updates per train_step")
    args = parser.parse_args(argv)
    if args.train_steps_per_call < 1:
        parser.error(f"--train_steps_per_call ({args.train_steps_per_call}) must be a positive integer")
    if args.steps < 2 * args.num_envs:
        parser.error(f"--steps ({args.steps}) must be at least 2 * --num_envs ({2 * args.num_envs})")
    return train(args.steps, args.seed, args.num_envs, args.prioritized, args.checkpoint_dir, args.train_steps_per_call)


if __name__ == "__main__":
    main()
