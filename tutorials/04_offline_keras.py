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
# # Offline training with Keras: behaviour cloning from an RLDS dataset
#
# Offline reinforcement learning learns from a log of experience that someone else collected, without acting in
# the environment while it learns. The log is usually an [RLDS](https://github.com/google-research/rlds) dataset:
# episodes of steps in a TFDS directory. This tutorial goes the whole way with tfreplay:
#
# 1. **log** CartPole-v1 episodes of a scripted expert, with some random actions mixed in, to an RLDS directory,
#    with `tfreplay.datasets.RldsWriter` as the driver's observer, as a collector would;
# 2. **read** the directory as the TFDS dataset it is;
# 3. **load** its episodes into a `TFUniformReplayBuffer` with `tfreplay.datasets.load_rlds`, streamed;
# 4. **clone** the behaviour: a Keras classifier from observation to action, trained by `model.fit` straight from
#    the buffer through `tfreplay.keras.fit_dataset`;
# 5. **evaluate** the cloned greedy policy against the expert.
#
# ## Setup
#
# The first cell readies the kernel: it keeps TensorFlow's start-up messages out of the outputs and, where this kernel
# cannot import tfreplay (a fresh Colab runtime, say), installs it with its `examples` and `datasets` extras from the
# wheel or checkout that the environment variable `TFREPLAY_WHEEL` names (by default the checkout above `tutorials/`),
# never from a package index. The documentation site hides it; it is the same in every tutorial.

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
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", f"{source}[examples,datasets]"])
    importlib.invalidate_caches()

# %% [markdown]
# The budget of this tutorial: smaller numbers run faster and clone less well.

# %% tags=["parameters"]
num_episodes = 40  # episodes of the expert to log (a few more may end on the last step)
epochs = 5  # behaviour-cloning epochs
steps_per_epoch = 200  # gradient steps per epoch, each on a fresh sample of the buffer
num_eval_episodes = 20  # greedy evaluation episodes of each policy

# %% [markdown]
# Now the imports, with TensorFlow's start-up messages held back. `tfreplay.datasets` needs tensorflow-datasets,
# which `import tfreplay` never loads.

# %%
with start_up_messages_held():
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds

    import tfreplay
    import tfreplay.keras
    from tfreplay import datasets
    from tfreplay.keras import keras_module
    from tfreplay.rl.drivers import EpisodeDriver, make_vector_env
    from tfreplay.rl.training import evaluate

    tf.config.list_physical_devices()  # finds the devices now, and with them their messages

keras = keras_module()  # Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1
keras.utils.set_random_seed(0)

# %% [markdown]
# ## 1. Log an expert's episodes to an RLDS directory
#
# The expert is a scripted controller: it pushes the cart towards the side the pole is falling to, a PD term on
# the pole's angle and angular velocity, plus a small term on the cart's velocity that keeps the cart from
# drifting out of the track. It balances the pole for the whole 500 steps of an episode. The logging policy takes
# a random action instead 20% of the time, as logged data from an exploring agent or an imperfect operator would.
#
# A policy is any callable from a batch of observations (`[num_envs, 4]`: cart position and velocity, pole angle
# and angular velocity) to a batch of actions (0 pushes left, 1 right, int64 as the action space).

# %%
expert_gains = np.array([0.0, 0.5, 10.0, 2.0])  # on (cart position, cart velocity, pole angle, angular velocity)


def expert(observation):
    return (np.asarray(observation) @ expert_gains > 0).astype(np.int64)


def with_random_actions(policy, epsilon, seed):
    """`policy`, with a uniformly random action instead of its own with probability `epsilon`."""
    rng = np.random.default_rng(seed)

    def act(observation):
        action = policy(observation)
        random = rng.random(action.shape) < epsilon
        return np.where(random, rng.integers(0, 2, action.shape), action)

    return act


# %% [markdown]
# An `EpisodeDriver` runs the logging policy in 8 CartPoles until `num_episodes` episodes have ended. Its observer
# is an `RldsWriter` built from `driver.transition_spec`: it keeps each environment's transitions until that
# environment's episode ends, then writes the episode to the directory, so the log holds whole episodes only. A
# collector that logs as it trains calls the same observer beside the buffer's `add_batch`.

# %%
log_dir = os.path.join(tempfile.mkdtemp(), "cartpole_expert")
env = make_vector_env("CartPole-v1", 8)
driver = EpisodeDriver(env, with_random_actions(expert, epsilon=0.2, seed=0), num_episodes=num_episodes, seed=0)
with datasets.RldsWriter(log_dir, driver.transition_spec, name="cartpole_expert") as writer:
    driver.add_observer(writer)
    driver.run()
env.close()
print(f"{writer.num_episodes} episodes written to {log_dir} ({driver.num_env_steps} environment steps)")

# %% [markdown]
# ## 2. The directory is a TFDS dataset
#
# Any RLDS tool reads it with `tfds.builder_from_directory`: one example per episode, each holding a `steps`
# dataset. `RldsWriter` writes the envlogger convention, the default for a spec with `next_observation`: an episode
# of `T` transitions has `T + 1` steps, the last holding only the final observation (`is_last`), with zero action
# and reward. `is_terminal` tells a pole that fell from the 500-step time limit.

# %%
builder = tfds.builder_from_directory(log_dir)
print(builder.info.features)
episodes = builder.as_dataset(split="train")


def summary(episode):
    """(number of steps, return, whether the episode terminated) of one episode."""
    return episode["steps"].reduce(
        (tf.constant(0), tf.constant(0.0), tf.constant(False)),
        lambda total, step: (total[0] + 1, total[1] + step["reward"], total[2] | step["is_terminal"]),
    )


num_steps, returns, terminated = map(np.array, zip(*episodes.map(summary).as_numpy_iterator()))
print(
    f"{builder.info.splits['train'].num_examples} episodes, {num_steps.sum()} steps; the logged returns: mean "
    f"{returns.mean():.1f}, min {returns.min():.0f}; {terminated.sum()} episodes ended with the pole down"
)

# %% [markdown]
# ## 3. Load the episodes into a buffer
#
# Behaviour cloning needs only each step's observation and action, so the buffer's spec names just those two
# fields; `load_rlds` gives a buffer the fields its spec names (by the names of `Transition`). It reads the
# directory's episodes in chunks of steps and adds them whole, so memory holds the buffer and one episode, however
# large the dataset. One segment (`batch_size=1`) takes every episode as it comes; a buffer with several segments
# adds one item to each per `add_batch` and leaves out the steps that cannot be matched at the end
# (`LoadInfo.num_items_left_out`).

# %%
spec = {"observation": driver.transition_spec.observation, "action": driver.transition_spec.action}
print(spec)
buffer = tfreplay.TFUniformReplayBuffer(spec, batch_size=1, max_length=500 * writer.num_episodes, seed=0)
info = datasets.load_rlds(log_dir, buffer)
print(info)
print(f"{int(buffer.num_frames())} items in the buffer")

# %% [markdown]
# ## 4. Behaviour cloning with `model.fit`
#
# Behaviour cloning is supervised learning: a classifier from observation to the logged action, trained with
# cross-entropy. `tfreplay.keras.fit_dataset` turns the buffer into what `model.fit` reads, `(x, y)` batches of
# fresh uniform samples (`x` the observations, `y` the actions), drawn as Keras asks for them; the dataset never
# ends, so `fit` gets its `steps_per_epoch`. The model is built with `keras_module()`, so the same cells run under
# Keras 3 and under tf-keras.
#
# Half of the random actions happen to be the expert's, so about 10% of the labels disagree with the expert: the
# accuracy cannot reach much more than 90%, and the best classifier is the expert itself.

# %%
model = keras.Sequential(
    [
        keras.Input(spec["observation"].shape),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(2),  # one logit per action
    ]
)
model.compile(
    optimizer=keras.optimizers.Adam(1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
dataset = tfreplay.keras.fit_dataset(buffer, 256, x="observation", y="action")
# shuffle=False: every batch already is a fresh uniform sample, and there is no epoch of data to shuffle.
history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, shuffle=False, verbose=2)

# %% [markdown]
# ## 5. Evaluate the clone
#
# The cloned policy acts greedily: the action of the larger logit. `evaluate` plays one episode per environment of
# a vector env, all in parallel, from the same seeds for each policy.

# %%
greedy = tf.function(lambda observation: tf.argmax(model(observation), axis=-1))


def mean_return(policy):
    return np.mean(evaluate("CartPole-v1", policy, num_episodes=num_eval_episodes, seed=1000))


print(f"expert:                      {mean_return(expert):6.1f}")
print(f"logging policy (20% random): {mean_return(with_random_actions(expert, 0.2, seed=1)):6.1f}")
print(f"behaviour cloning (greedy):  {mean_return(greedy):6.1f}")

# %% [markdown]
# With the full budget the clone balances the pole about as long as the expert does: trained on every logged step
# with the same weight, it learns the action the expert takes most often in each state, and the random actions,
# spread over both choices, average out.
#
# ## Next
#
# A clone is only as good as the behaviour most frequent in the data: the log of a poor policy gives a poor clone.
# Offline RL methods learn values from the rewards instead. A buffer built from the whole `driver.transition_spec`
# gets every field from `load_rlds` (`next_observation`, `reward`, `discount`, ...) and feeds `DqnAgent.train` as
# the buffer of the second tutorial does, with no collection between the train steps (offline DQN); conservative
# Q-learning (CQL) adds to that loss a term that keeps the Q-values of actions absent from the data low.
#
# The guide *RLDS datasets* covers `load_rlds`, `save_rlds` and the two step conventions, and *tf.data and Keras*
# covers `fit_dataset`, importance weights and a `train_step` that samples the buffer itself.
