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
# # Collect experience and train a DQN agent
#
# The loop of off-policy reinforcement learning has two halves:
#
# 1. a **driver** runs a policy in (vectorized) gymnasium environments and hands every batch of transitions to its
#    **observers**: the replay buffer's `add_batch`, and metrics;
# 2. the agent **trains** on batches it reads from the buffer's `as_dataset`.
#
# Here a Double-DQN agent learns CartPole-v1: balance a pole on a cart. The return of an episode is the number of
# steps the pole stays up, at most 500.
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
num_env_steps = 20_000  # environment steps of our own training loop, over all environments
initial_collect_steps = 1_000  # random steps before training starts
log_interval = 2_000
num_eval_episodes = 20
recipe_env_steps = 100_000  # at most this many steps for train_dqn at the end (it usually stops earlier)

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
    from tfreplay.rl.observers import AverageReturn, StepsPerSecond
    from tfreplay.rl.policies import RandomPolicy
    from tfreplay.rl.training import DqnConfig, evaluate, linear_epsilon, train_dqn

    tf.config.list_physical_devices()  # finds the devices now, and with them their messages

keras_module().utils.set_random_seed(0)  # Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1

# %% [markdown]
# ## The environments and the driver
#
# `make_vector_env` builds a `gymnasium.vector.SyncVectorEnv` of 4 CartPoles. The driver takes any policy, a
# callable from a batch of observations to a batch of actions; we start with random actions.
# `driver.transition_spec` describes one transition: the buffer is created from it.

# %%
num_envs = 4
env = make_vector_env("CartPole-v1", num_envs)
driver = StepDriver(env, RandomPolicy(env.single_action_space, seed=0), num_steps=num_envs, seed=0)
spec = driver.transition_spec
print(spec)

# %% [markdown]
# Each transition holds `observation`, `action`, `reward`, `discount` and `next_observation`, the `step_type` of
# the observation (0 for the first of an episode), and whether the episode ended there:
#
# * `terminated`: the pole fell. `discount` is 0: there is nothing to bootstrap from;
# * `truncated`: the 500-step time limit. `discount` is 1: the value of `next_observation` still counts.
#
# At the end of an episode, `next_observation` is the true final observation, never the first observation of the
# next episode.
#
# ## The buffer as an observer
#
# One segment per environment, so `batch_size=num_envs`. The driver calls its observers in order with every
# batch; metrics are observers too.

# %%
rb = tfreplay.TFUniformReplayBuffer(spec, batch_size=num_envs, max_length=50_000 // num_envs, seed=0)
average_return, steps_per_second = AverageReturn(buffer_size=20), StepsPerSecond()
for observer in (rb.add_batch, average_return, steps_per_second):
    driver.add_observer(observer)

driver.run(initial_collect_steps)
print(
    f"{int(rb.num_frames())} transitions stored; random policy: average return "
    f"{average_return.result():.1f}, {steps_per_second.result():.0f} env steps/s"
)

# %% [markdown]
# ## The agent and the dataset
#
# `DqnAgent` wraps a Keras Q-network (here a 64-64 MLP), its target network, the Huber loss and Adam, with the
# hyper-parameters that `train_dqn` uses. `agent.train(experience)` takes the `(items, BufferInfo)` elements of
# `as_dataset(sample_batch_size)`: batches of single transitions, since each one keeps its `next_observation`
# (TF-Agents' `num_steps=2` windows work too, at twice the reads). For collection, the driver switches to an
# epsilon-greedy policy whose epsilon decays as training goes on.

# %%
config = DqnConfig(initial_collect_steps=initial_collect_steps)  # the tuned hyper-parameters of train_dqn
q_network = make_q_network(spec.observation, num_actions=2, fc_layer_params=config.fc_layer_params)
agent = DqnAgent(
    spec.observation,
    num_actions=2,
    q_network=q_network,
    optimizer=keras_module(q_network).optimizers.Adam(config.learning_rate),
    gamma=config.gamma,
    target_update_period=config.target_update_period,
    gradient_clipping=config.gradient_clipping,
)
driver.policy = agent.policy(epsilon=lambda: linear_epsilon(config, driver.num_env_steps), seed=0)

dataset = rb.as_dataset(sample_batch_size=config.batch_size)  # num_steps=None: single transitions
experience = iter(dataset)
items, info = next(experience)
print("a batch of transitions:", items.observation.shape, "| sampled ids:", info.ids.shape)

# %% [markdown]
# ## The training loop
#
# Collect one step in every environment, then train; every `log_interval` steps, log the average return of the
# recent training episodes.

# %%
history = []
train_steps_per_iteration = max(int(round(config.train_steps_per_env_step * num_envs)), 1)
while driver.num_env_steps < num_env_steps:
    driver.run()  # one step in each environment
    for _ in range(train_steps_per_iteration):
        loss = agent.train(next(experience)).loss
    if driver.num_env_steps % log_interval < num_envs:
        history.append((driver.num_env_steps, average_return.result()))
        print(f"step {driver.num_env_steps:6d}  loss {float(loss):7.3f}  average return {average_return.result():6.1f}")

# %% [markdown]
# ## Evaluate and plot
#
# The greedy policy (epsilon 0) plays fresh episodes, and the learning curve shows the training episodes. After
# 20,000 steps the agent is usually part of the way there. DQN on CartPole is also famously jumpy: the return can
# climb to 500 and drop again a few thousand steps later, which is why the complete recipe below evaluates as it
# goes and keeps the best weights.

# %%
returns = evaluate("CartPole-v1", agent.policy(), num_episodes=num_eval_episodes, seed=1000)
print(f"greedy policy: average return {np.mean(returns):.1f} over {len(returns)} episodes")

steps, values = zip(*history) if history else ((), ())
plt.figure(figsize=(7, 4))
plt.plot(steps, values, label="training episodes (average of the last 20)")
plt.axhline(np.mean(returns), color="C3", linestyle="--", label="final greedy evaluation")
plt.xlabel("environment steps")
plt.ylabel("return")
plt.legend()
plt.show()

# %% [markdown]
# ## The whole recipe in one call
#
# `tfreplay.rl.training.train_dqn` is the loop above plus greedy evaluations every 2,500 steps (keeping the best
# weights, and stopping early once one reaches CartPole's reward threshold of 475), checkpoints to resume from
# (`output_dir=..., resume=True`), TensorBoard summaries and a progress bar. It is what `tfreplay-demo` (`make demo`)
# runs, and it is deterministic: the same seed gives the same run.

# %%
result = train_dqn(
    num_env_steps=recipe_env_steps,
    initial_collect_steps=initial_collect_steps,
    num_eval_episodes=num_eval_episodes,
    stop_at_return=475,
)
print(result.summary())

points = [(h["env_steps"], h["average_return"]) for h in result.history if h["average_return"] is not None]
evaluations = [(h["env_steps"], h["eval_return"]) for h in result.history if "eval_return" in h]
plt.figure(figsize=(7, 4))
if points:
    plt.plot(*zip(*points), label="training episodes (average of the last 20)")
if evaluations:
    plt.plot(*zip(*evaluations), "o--", label="greedy evaluations")
plt.xlabel("environment steps")
plt.ylabel("return")
plt.legend()
plt.show()

# %% [markdown]
# ## Next
#
# The third tutorial, *Prioritized replay, n-step returns and sequences* (`03_prioritized_and_sequences`), makes
# each sample count for more.
