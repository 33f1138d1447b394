"""What a DQN learner reads from a replay buffer and writes back to it.

`experience_dataset` is the stream of batches (stored transitions, or n-step
returns with `n_step_transform`); `prioritized_train_step` is the train step
of prioritized replay: importance weights, the gradient step and the new
priorities, inside one `tf.function`; `beta_schedule` anneals the weights'
exponent (Keras' linear decay, so it runs in that function too). `train_dqn`
(`tfreplay.rl.training`) puts them together.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from tfreplay import NStepReturns, ReplayBuffer
from tfreplay.keras import keras_module
from tfreplay.rl.agents import DqnAgent, LossInfo, weighted_train


def beta_schedule(config: Any) -> Callable[[Any], tf.Tensor]:
    """The importance-weight exponent against env steps: `beta` until learning starts, then linear to 1.

    Keras' `PolynomialDecay` of power 1 from `beta` to 1 over the env steps
    after `initial_collect_steps` (it holds 1 from `num_env_steps` on). The
    returned function takes an int or an integer tensor (the run's env-step
    variable), so a train step's `tf.function` computes beta in its graph.
    """
    span = max(config.num_env_steps - config.initial_collect_steps, 1)
    decay = keras_module().optimizers.schedules.PolynomialDecay(config.beta, span, 1.0, power=1.0)
    return lambda env_steps: decay(tf.maximum(env_steps - config.initial_collect_steps, 0))


def linear_beta(config: Any, env_steps: int) -> float:
    """The importance-weight exponent at `env_steps`, as a float: see `beta_schedule`."""
    return float(beta_schedule(config)(env_steps))


def prioritized_train_step(
    agent: DqnAgent, buffer: Any, experience: tuple, beta: Any, priority_eps: float = 1e-6
) -> LossInfo:
    """Trains on a prioritized sample and gives its items their new priorities; call it inside a `tf.function`.

    Args:
      agent: the agent to train.
      buffer: the prioritized buffer the sample came from.
      experience: `(items, BufferInfo)` from its `as_dataset` or `get_next`.
      beta: the importance-weight exponent (a float or a scalar tensor).
      priority_eps: added to `|TD error|` so no item's priority is 0.

    Returns:
      The agent's `LossInfo`.
    """
    items, info = experience
    loss_info, priorities = weighted_train(agent, buffer, items, info, beta, priority_eps)
    buffer.update_priorities(info.ids, priorities)
    return loss_info


def experience_dataset(buffer: ReplayBuffer, sample_batch_size: int, transform: Any = None) -> tf.data.Dataset:
    """What the learner reads: batches of single transitions (n-step ones with `transform`), each drawn when asked.

    A `Transition` holds its own `next_observation`, so a TD target needs no
    window of two: `num_steps=None` reads one row per sample instead of two,
    and can draw the newest transition of every environment (a window of two
    never starts there). Without prefetching, a sample is drawn at the
    learner's `next`, after the collection step before it: the draws, and so
    the run, are the same for the same seed.

    Args:
      buffer: a replay buffer of `Transition`s.
      sample_batch_size: transitions per element.
      transform: applied at sample time, e.g. `NStepReturns(n, gamma)`.

    Returns:
      A dataset of `(Transition [sample_batch_size, ...], BufferInfo)`.
    """
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # a prefetch thread would race the collector
    options.autotune.enabled = False  # nothing to tune (no parallel calls), and no model thread to join at exit
    if transform is None:
        dataset = buffer.as_dataset(sample_batch_size=sample_batch_size, num_steps=None)
    else:
        dataset = buffer.as_dataset(sample_batch_size=sample_batch_size, transform=transform)
    return dataset.with_options(options)


def n_step_transform(config: Any) -> Any:
    """`NStepReturns(n_step, gamma)` when `n_step > 1`, else None (stored transitions, discounted by the agent)."""
    if config.n_step == 1:
        return None
    return NStepReturns(n=config.n_step, gamma=config.gamma)
