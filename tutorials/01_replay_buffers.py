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
# # Replay buffers with tfreplay
#
# A *replay buffer* stores what an agent experienced so that it can learn from it later, many times and in random
# order. This tutorial tours tfreplay's uniform buffers:
#
# 1. describe one item with a **spec**;
# 2. write batches with **`add_batch`**;
# 3. read with **`get_next`**, **`as_dataset`** and **`gather_all`**, and empty with **`clear`**;
# 4. the NumPy twin, **`PyUniformReplayBuffer`**;
# 5. save and restore a buffer with a **checkpoint**.
#
# If you know TF-Agents: the classes and methods have the same names and arguments, so switching is a change of
# import.
#
# ## Setup
#
# The first cell readies the kernel: it keeps TensorFlow's start-up messages out of the outputs and, where this kernel
# cannot import tfreplay (a fresh Colab runtime, say), installs it from the wheel or checkout that the environment
# variable `TFREPLAY_WHEEL` names (by default the checkout above `tutorials/`), never from a package index. The
# documentation site hides it; it is the same in every tutorial.

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
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", source])
    importlib.invalidate_caches()

# %% [markdown]
# The sizes used below. Larger buffers or more batches change nothing but the numbers printed.

# %% tags=["parameters"]
max_length = 100  # rows kept per segment
num_adds = 30  # batches added

# %% [markdown]
# Now the imports, with TensorFlow's start-up messages held back.

# %%
with start_up_messages_held():
    import collections

    import numpy as np
    import tensorflow as tf

    import tfreplay

    tf.config.list_physical_devices()  # finds the devices now, and with them their messages

print("tfreplay", tfreplay.__version__, "| TensorFlow", tf.__version__)

# %% [markdown]
# ## 1. Describe one item with a spec
#
# A spec is a nest (dicts, tuples, named tuples) of `tf.TensorSpec`: the shape and dtype of **one** item, without
# a batch dimension. The buffer allocates its storage from it and checks every write against it.

# %%
data_spec = {
    "observation": tf.TensorSpec([3], tf.float32),
    "action": tf.TensorSpec([], tf.int32),
    "reward": tf.TensorSpec([], tf.float32),
}
print(data_spec)

# %% [markdown]
# ## 2. Create a buffer and add batches
#
# `TFUniformReplayBuffer(data_spec, batch_size, max_length)` keeps its items in `tf.Variable`s. `batch_size` is the
# number of parallel **segments**, typically one per environment: each `add_batch` call writes one row to every
# segment. Each segment keeps its newest `max_length` rows, so the buffer holds at most
# `batch_size * max_length` items, its `capacity`.

# %%
batch_size = 2
rb = tfreplay.TFUniformReplayBuffer(data_spec, batch_size=batch_size, max_length=max_length, seed=0)


def make_batch(step):
    # One row per segment. The observation is (segment, step, 0), so that we can recognize items later.
    return {
        "observation": tf.constant([[s, step, 0.0] for s in range(batch_size)], tf.float32),
        "action": tf.fill([batch_size], step % 4),
        "reward": tf.fill([batch_size], float(step)),
    }


for step in range(num_adds):
    rb.add_batch(make_batch(step))
print("items stored:", int(rb.num_frames()), "of", rb.capacity)

# %% [markdown]
# A batch that does not fit the spec is refused with a message that names the field, and the buffer stays exactly
# as it was: tfreplay never casts silently.

# %%
bad = make_batch(0)
bad["action"] = tf.cast(bad["action"], tf.int64)
try:
    rb.add_batch(bad)
except TypeError as error:
    print("TypeError:", error)
print("still", int(rb.num_frames()), "items")

# %% [markdown]
# ## 3. Read: `get_next`, `as_dataset`, `gather_all`, `clear`
#
# `get_next(sample_batch_size, num_steps)` draws items uniformly at random. It returns them with a `BufferInfo`
# holding each sample's `ids` (the order in which items were added) and `probabilities`. With `num_steps=N`, each
# sample is a window of `N` consecutive items of one segment, stacked on a time axis: `[sample_batch_size, N, ...]`.

# %%
items, info = rb.get_next(sample_batch_size=4)
print("observations:\n", items["observation"].numpy())
print("ids:", info.ids.numpy(), "probabilities:", info.probabilities.numpy())

windows, _ = rb.get_next(sample_batch_size=2, num_steps=3)
print("a window of 3 steps, each (segment, step, 0):\n", windows["observation"].numpy()[0])

# %% [markdown]
# For training, `as_dataset` gives a `tf.data.Dataset` whose every element is a fresh sample, drawn when the
# iterator asks for it, so it also sees the items added in the meantime. This is what an agent's training loop
# reads: single items when each holds all the agent needs (tfreplay's transitions keep their `next_observation`),
# or windows such as the `[B, 2, ...]` of `num_steps=2` that TF-Agents' DQN expects.

# %%
dataset = rb.as_dataset(sample_batch_size=8, num_steps=2, num_parallel_calls=2).prefetch(2)
for items, info in dataset.take(2):
    print("rewards, transposed to [2, 8]:\n", items["reward"].numpy().T)
    print("ids of the first window:", info.ids.numpy()[0])

# %% [markdown]
# `as_dataset(single_deterministic_pass=True)` reads every stored item exactly once, in order: handy for
# evaluation or export. `gather_all()` returns everything at once, shaped `[batch_size, time, ...]`, and `clear()`
# empties the buffer.

# %%
in_order = rb.as_dataset(single_deterministic_pass=True)
print("first items of segment 0:", [int(x["reward"]) for x, _ in in_order.take(5)])

everything = rb.gather_all()
print("gather_all observation shape:", everything["observation"].shape)
rb.clear()
print("after clear:", int(rb.num_frames()), "items")

# %% [markdown]
# ## 4. The NumPy twin: `PyUniformReplayBuffer`
#
# The same API and behaviour with NumPy arrays inside: handy when your environment loop is plain Python. Create it
# the TF-Agents way with a `capacity` (one ring that takes batches of any size), or like the TF buffer with
# `batch_size` and `max_length`. Its `get_next` returns NumPy arrays; its `as_dataset` still yields tensors.

# %%
Step = collections.namedtuple("Step", ["observation", "action", "reward"])
py_spec = Step(tf.TensorSpec([3], tf.float32), tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32))
py_rb = tfreplay.PyUniformReplayBuffer(py_spec, capacity=max_length, seed=0)

rows = num_adds // 3
py_rb.add_batch(
    Step(
        observation=np.zeros([rows, 3], np.float32),
        action=np.arange(rows, dtype=np.int32),
        reward=np.ones(rows, np.float32),
    )
)
sample, _ = py_rb.get_next(sample_batch_size=3)
print(type(sample.action).__name__, sample.action)
twin = tfreplay.PyUniformReplayBuffer(py_spec, batch_size=2, max_length=max_length)
print("capacity:", py_rb.capacity, "and", twin.capacity)

# %% [markdown]
# ## 5. Checkpoints
#
# Both buffers are trackable: put them in a `tf.train.Checkpoint`, next to your agent, and the stored items, the
# write position and the sampler's random state are saved and restored with it.

# %%
for step in range(num_adds):
    rb.add_batch(make_batch(step))
directory = tempfile.mkdtemp()
path = tf.train.Checkpoint(buffer=rb, numpy_buffer=py_rb).save(os.path.join(directory, "ckpt"))

restored = tfreplay.TFUniformReplayBuffer(data_spec, batch_size=batch_size, max_length=max_length)
restored_py = tfreplay.PyUniformReplayBuffer(py_spec, capacity=max_length)
tf.train.Checkpoint(buffer=restored, numpy_buffer=restored_py).restore(path)
print("restored", int(restored.num_frames()), "and", int(restored_py.num_frames()), "items")
assert np.array_equal(restored.gather_all()["reward"], rb.gather_all()["reward"])

# %% [markdown]
# ## Next
#
# The next tutorial, *Collect experience and train a DQN agent* (`02_collect_and_train`), fills a buffer from
# gymnasium environments with a driver and trains a DQN agent from `as_dataset`.
