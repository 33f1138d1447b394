# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Prioritized replay, n-step returns and sequences
#
# Three ways to make each sample count for more, all computed inside the TensorFlow graph:
#
# 1. **prioritized replay** (Schaul et al., 2016): draw the transitions the agent gets most wrong more often, and
#    correct the bias this introduces with importance weights;
# 2. a DQN **train step** that samples, learns and updates the priorities in one `tf.function`;
# 3. **n-step returns**, summed when sampled, that stop at the end of an episode;
# 4. **sequences** for recurrent agents, with a burn-in, padding past the end of an episode and a mask, and R2D2's
#    sequence priorities.
#
# ## Setup
#
# The first cell readies the kernel: it keeps TensorFlow's start-up messages out of the outputs and, where this kernel
# cannot import tfreplay (a fresh Colab runtime, say), installs it with its `examples` extra from the wheel or
# checkout that the environment variable `TFREPLAY_WHEEL` names (by default the checkout above `tutorials/`), never
# from a package index. The documentation site hides it; it is the same in every tutorial.

# %% tags=["setup"]
import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"  # only errors from TensorFlow's C++ code


@contextlib.contextmanager
def start_up_messages_held():
    """Holds back what the process writes to its standard error; shows it only if the block fails."""
    with tempfile.TemporaryFile() as held:
        stderr = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            held.seek(0)
            os.write(stderr, held.read())
            raise
        finally:
            os.dup2(stderr, 2)
            os.close(stderr)


if importlib.util.find_spec("tfreplay") is None:
    source = os.path.abspath(os.environ.get("TFREPLAY_WHEEL", ".."))
    if not (source.endswith(".whl") or os.path.isfile(os.path.join(source, "setup.py"))):
        raise FileNotFoundError(f"{source} is neither a wheel nor a tfreplay checkout: set TFREPLAY_WHEEL to one")
    print("installing tfreplay from", source)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", f"{source}[examples]"])
    importlib.invalidate_caches()

# %% [markdown]
# The budget of this tutorial: smaller numbers run faster and learn less.

# %% tags=["parameters"]
num_env_steps = 4_000  # random transitions collected for sections 1 and 2
train_steps = 500  # prioritized train steps in section 2
recipe_env_steps = 100_000  # at most this many steps for train_dqn in section 3 (it usually stops earlier)

# %% [markdown]
# Now the imports, with TensorFlow's start-up messages held back.

# %%
with start_up_messages_held():
    import matplotlib.pyplot as plt
    import numpy as np
    import tensorflow as tf

    import tfreplay
    from tfreplay.keras import keras_module
    from tfreplay.rl.agents import DqnAgent, make_q_network
    from tfreplay.rl.drivers import StepDriver, make_vector_env
    from tfreplay.rl.policies import RandomPolicy
    from tfreplay.rl.training import train_dqn

    tf.config.list_physical_devices()  # finds the devices now, and with them their messages

keras_module().utils.set_random_seed(0)  # Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1

# %% [markdown]
# ## 1. Prioritized replay
#
# `TFPrioritizedReplayBuffer` has the API of `TFUniformReplayBuffer` plus `update_priorities(ids, priorities)`.
# Item `i` is drawn with probability `p_i ** alpha / sum_j p_j ** alpha` (`alpha=0` is uniform), from a sum tree
# kept in a `tf.Variable`. New items enter at the largest priority given so far (1 to begin with), so that each is
# seen soon at least once. We fill one with random CartPole transitions.

# %%
env = make_vector_env("CartPole-v1", 4)
driver = StepDriver(env, RandomPolicy(env.single_action_space, seed=0), num_steps=4, seed=0)
spec = driver.transition_spec
rb = tfreplay.TFPrioritizedReplayBuffer(spec, batch_size=4, max_length=10_000, alpha=0.6, seed=0)
driver.add_observer(rb.add_batch)
driver.run(num_env_steps)

items, info = rb.get_next(sample_batch_size=5)
num_items = int(rb.num_frames())
print("ids:", info.ids.numpy())
print("probabilities x number of items:", info.probabilities.numpy() * num_items, "(all equal: uniform so far)")

# %% [markdown]
# Give these five items new priorities (a learner would use their TD errors) and draw many samples: each item is
# drawn as often as its exact probability, which `BufferInfo.probabilities` reports. An item of priority 0 is
# never drawn, until its priority is raised again.

# %%
priorities = np.array([0.0, 0.5, 2.0, 8.0, 32.0])
rb.update_priorities(info.ids, priorities)

num_draws = 100_000
_, many = rb.get_next(sample_batch_size=num_draws)
drawn = many.ids.numpy()
weights = priorities**0.6
exact = weights / (weights.sum() + (num_items - 5))  # the other items kept priority 1
for item, priority, p in zip(info.ids.numpy(), priorities, exact):
    count = np.sum(drawn == item)
    print(f"id {item:5d}  priority {priority:5.1f}  drawn {count:4d} times, expected {num_draws * p:6.1f}")

# %% [markdown]
# Drawing some items more often biases the expected gradient. Importance weights `(N * P(i)) ** -beta`, divided by
# their maximum, undo the bias: fully with `beta=1`, not at all with `beta=0`. Prioritized DQN anneals `beta` from
# 0.4 to 1 over training.

# %%
for beta in (0.0, 0.4, 1.0):
    w = tfreplay.importance_weights(many.probabilities, rb.num_frames(), beta).numpy()
    print(f"beta {beta}: weights from {w.min():.3f} (the most likely items) to {w.max():.3f}")

# %% [markdown]
# ## 2. A prioritized DQN train step
#
# `agent.train(items, weights)` scales each sample's Huber loss by its weight and returns each sample's
# `|TD error|` in `LossInfo.abs_td_errors`: the new priorities. The whole step is one graph: the weights, the
# gradient step and `update_priorities` (which ignores an update for an item that was overwritten in the
# meantime). `tfreplay.rl.learner.prioritized_train_step` is these lines.

# %%
agent = DqnAgent(spec.observation, num_actions=2, q_network=make_q_network(spec.observation, 2, seed=0))
samples = iter(rb.as_dataset(sample_batch_size=64))


@tf.function
def train_step(experience, beta):
    items, info = experience
    weights = tfreplay.importance_weights(info.probabilities, rb.num_frames(), beta)
    loss_info = agent.train(items, weights)
    rb.update_priorities(info.ids, tf.cast(loss_info.abs_td_errors, tf.float64) + 1e-6)
    return loss_info.loss


losses = [float(train_step(next(samples), tf.constant(0.4 + 0.6 * i / train_steps))) for i in range(train_steps)]
print(f"loss: {np.mean(losses[:20]):.3f} at first, {np.mean(losses[-20:]):.3f} at the end")

# %% [markdown]
# The priorities now follow the TD errors: a few transitions are drawn far more often than the rest, and those the
# agent already predicts well, rarely.

# %%
_, after = rb.get_next(sample_batch_size=5_000)
relative = after.probabilities.numpy() * int(rb.num_frames())
plt.figure(figsize=(7, 3.5))
plt.hist(relative, bins=50, log=True)
plt.xlabel("probability of a drawn item, relative to uniform")
plt.ylabel("draws")
plt.show()

# %% [markdown]
# ## 3. n-step returns
#
# `NStepReturns(n, gamma)` is a *transform*: `get_next(..., transform=...)` and `as_dataset(..., transform=...)`
# draw windows of `n` items with the buffer's sampler and return one transition per window, summed in the graph:
#
# * `reward = sum_{k<m} gamma**k * r_{t+k}`, over its `m <= n` real steps (fewer at the end of an episode: a window
#   never crosses into another episode or past the newest item);
# * `next_observation` of the last real step;
# * `discount = gamma**m * (product of the steps' discounts)`: the whole bootstrap factor, 0 after an episode that
#   terminated.
#
# Here, written by hand into one segment of a prioritized buffer (every transform works with every sampler): an
# episode of 4 steps that terminates, one of 3 steps that a time limit truncates, and one still running. Each
# observation is the number of its step.

# %%
step_spec = {
    "observation": tf.TensorSpec([], tf.float32),
    "reward": tf.TensorSpec([], tf.float32),
    "discount": tf.TensorSpec([], tf.float32),
    "next_observation": tf.TensorSpec([], tf.float32),
    "terminated": tf.TensorSpec([], tf.bool),
    "truncated": tf.TensorSpec([], tf.bool),
}
rb_small = tfreplay.TFPrioritizedReplayBuffer(step_spec, batch_size=1, max_length=20, seed=0)
ends = {3: "terminated", 6: "truncated"}  # the last step of the first two episodes
for t in range(9):
    end = ends.get(t)
    rb_small.add_batch(
        {
            "observation": np.float32([t]),
            "reward": np.float32([1.0]),
            "discount": np.float32([0.0 if end == "terminated" else 1.0]),
            "next_observation": np.float32([t + 1]),
            "terminated": np.array([end == "terminated"]),
            "truncated": np.array([end == "truncated"]),
        }
    )

n_step = tfreplay.NStepReturns(n=3, gamma=0.9)
items, info = rb_small.get_next(sample_batch_size=200, transform=n_step)
first = {int(i): k for k, i in reversed(list(enumerate(info.ids.numpy())))}  # one row per drawn start
print(" t  reward  discount  next_observation")
for t, k in sorted(first.items()):
    print(f"{t:2d}  {items['reward'][k]:6.2f}  {items['discount'][k]:8.3f}  {items['next_observation'][k]:6.0f}")

# %% [markdown]
# Step 0 sums three rewards (`1 + 0.9 + 0.81`) and bootstraps from step 3 with `0.9**3`. Steps 1 to 3 reach the
# terminated end (`discount` 0: nothing to bootstrap from), 2 and 3 with fewer rewards. Steps 5 and 6 stop at the
# truncated end and still bootstrap, from the final observation, with `0.9**2` and `0.9`. Steps 7 and 8 are not
# drawn yet: their episode goes on, so their 3-step return is not known.
#
# The TD target is therefore `reward + discount * Q_target(next_observation, argmax)`, with no further `gamma`: an
# agent that reads `NStepReturns` items is built with `gamma=1.0`. `train_dqn(n_step=3, prioritized=True)` (or
# `tfreplay-demo --prioritized --n_step=3`) does all of this:

# %%
result = train_dqn(
    num_env_steps=recipe_env_steps,
    prioritized=True,
    n_step=3,
    stop_at_return=475,
    num_eval_episodes=5,
    progress=False,
)
print(result.summary())

# %% [markdown]
# ## 4. Sequences for recurrent agents
#
# `Sequences(length, burn_in, pad)` draws `burn_in + length` consecutive items and returns them as a
# `Window(items, mask)`, time-stacked `[B, burn_in + length, ...]`. The burn-in warms up a recurrent state without
# training on it (as in R2D2). With `pad=False` every sequence lies inside one episode; with `pad=True` a sequence
# may run past the end of its episode: the steps after the end are zeros, and `mask` is False there. A recurrent
# state stored with each item is just another field of the spec.

# %%
sequences = tfreplay.Sequences(length=3, burn_in=1, pad=True)
window, info = rb_small.get_next(sample_batch_size=6, transform=sequences)
for k in np.argsort(info.ids.numpy()):
    print("observations", window.items["observation"][k].numpy(), "mask", window.mask[k].numpy().astype(int))

# %% [markdown]
# Prioritized sequences use R2D2's mix of the per-step TD errors over the valid steps after the burn-in:
# `eta * max + (1 - eta) * mean`, which `sequence_priorities` computes. The priority of a sequence is that of its
# first item, and `info.ids` are those items' ids, so the priorities go to `update_priorities(info.ids, ...)` as
# for single transitions. (The TD errors here are made up: a recurrent learner would compute them.) A sequence
# with no valid step after its burn-in gets priority 0 and is never drawn again. The prioritized sampler draws
# padded sequences (`pad=True`); strict ones (`pad=False`) come from the uniform sampler.

# %%
td_errors = np.random.default_rng(0).normal(size=window.mask.shape)[:, sequences.burn_in :]
mask = window.mask.numpy()[:, sequences.burn_in :]
priorities = tfreplay.sequence_priorities(td_errors, mask, eta=0.9)
print("sequence priorities, rows as above:", priorities[np.argsort(info.ids.numpy())].round(3))
rb_small.update_priorities(info.ids, priorities)

# %% [markdown]
# ## Next
#
# The README's *Prioritized replay* section describes the sampler in detail, and `python -m examples.compare_replay`
# compares uniform replay with prioritized replay and 3-step returns on CartPole.
