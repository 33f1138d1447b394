"""Writes the tutorial notebooks from the cells below: `python tutorials/build_notebooks.py`.

Edit the cells here, not the .ipynb files, then run this script; the notebooks
are committed without outputs. `tests/test_notebooks.py` executes them and
checks that they match this script.
"""

from __future__ import annotations

import pathlib

import nbformat

HERE = pathlib.Path(__file__).resolve().parent

INSTALL = """\
# On Colab (or wherever tfreplay is missing) this installs it; elsewhere it does nothing.
try:
    import tfreplay
except ImportError:
    %pip install -q tfreplay"""

REPLAY_BUFFERS = [
    (
        "md",
        """\
# Replay buffers with tfreplay

A *replay buffer* stores what an agent experienced so that it can learn from it
later, many times, in random order. This notebook tours tfreplay's buffers:

1. describe one item with a **spec**,
2. write with **`add_batch`**,
3. read with **`get_next`**, **`as_dataset`** and **`gather_all`**, empty with **`clear`**,
4. the NumPy twin **`PyUniformReplayBuffer`**,
5. **checkpointing** a buffer.

If you used TF-Agents: the classes and methods have the same names and arguments,
so switching is a change of import.""",
    ),
    ("code", INSTALL),
    (
        "params",
        """\
# Sizes used below (the test suite runs this notebook with smaller ones).
max_length = 100  # rows per segment
num_adds = 30  # how many batches we add""",
    ),
    (
        "code",
        """\
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import collections
import tempfile

import numpy as np
import tensorflow as tf

import tfreplay

print("tfreplay", tfreplay.__version__, "| TensorFlow", tf.__version__)""",
    ),
    (
        "md",
        """\
## 1. Describe one item with a spec

A spec is a nest (dicts, tuples, named tuples) of `tf.TensorSpec`: the shape and
dtype of **one** item, without a batch dimension. The buffer preallocates storage
from it, and checks every write against it.""",
    ),
    (
        "code",
        """\
data_spec = {
    "observation": tf.TensorSpec([3], tf.float32),
    "action": tf.TensorSpec([], tf.int32),
    "reward": tf.TensorSpec([], tf.float32),
}
data_spec""",
    ),
    (
        "md",
        """\
## 2. Create a buffer and add batches

`TFUniformReplayBuffer(data_spec, batch_size, max_length)` keeps its items in
`tf.Variable`s. `batch_size` is the number of parallel **segments**, typically one per
environment: each `add_batch` call writes one row to every segment. Each segment keeps
its newest `max_length` rows, so the capacity is `batch_size * max_length`.""",
    ),
    (
        "code",
        """\
batch_size = 2
rb = tfreplay.TFUniformReplayBuffer(data_spec, batch_size=batch_size, max_length=max_length, seed=0)


def make_batch(step):
    # One row per segment; the observation stores (segment, step, 0) so we can recognize items later.
    return {
        "observation": tf.constant([[s, step, 0.0] for s in range(batch_size)], tf.float32),
        "action": tf.fill([batch_size], step % 4),
        "reward": tf.fill([batch_size], float(step)),
    }


for step in range(num_adds):
    rb.add_batch(make_batch(step))
print("items stored:", int(rb.num_frames()), "of", rb.capacity)""",
    ),
    (
        "md",
        """\
A batch that does not fit the spec is rejected with a message naming the field, and
the buffer is left exactly as it was (tfreplay never casts silently):""",
    ),
    (
        "code",
        """\
bad = make_batch(0)
bad["action"] = tf.cast(bad["action"], tf.int64)
try:
    rb.add_batch(bad)
except TypeError as error:
    print("TypeError:", error)
print("still", int(rb.num_frames()), "items")""",
    ),
    (
        "md",
        """\
## 3. Read: `get_next`, `as_dataset`, `gather_all`, `clear`

`get_next(sample_batch_size, num_steps)` draws uniformly. It returns the items and a
`BufferInfo` with each sample's `ids` (insertion order) and `probabilities`.
With `num_steps=N` each sample is a window of `N` consecutive items of one segment,
stacked on a time axis: `[sample_batch_size, N, ...]`.""",
    ),
    (
        "code",
        """\
items, info = rb.get_next(sample_batch_size=4)
print("observations:\\n", items["observation"].numpy())
print("ids:", info.ids.numpy(), "probabilities:", info.probabilities.numpy())

windows, _ = rb.get_next(sample_batch_size=2, num_steps=3)
print("a window of 3 steps (segment, step, 0):\\n", windows["observation"].numpy()[0])""",
    ),
    (
        "md",
        """\
For training, `as_dataset` gives a `tf.data.Dataset` whose every element is a fresh
sample, drawn when the iterator asks for it (so it sees items added meanwhile). This is
what an agent's training loop reads: single items when each holds all the agent needs
(tfreplay's transitions keep their `next_observation`), or windows such as the
`[B, 2, ...]` of `num_steps=2` that TF-Agents' DQN expects.""",
    ),
    (
        "code",
        """\
dataset = rb.as_dataset(sample_batch_size=8, num_steps=2, num_parallel_calls=2).prefetch(2)
for items, info in dataset.take(2):
    print("rewards, transposed to [2, 8]:\\n", items["reward"].numpy().T)
    print("ids of the first window:", info.ids.numpy()[0])""",
    ),
    (
        "md",
        """\
`single_deterministic_pass=True` reads every stored item exactly once, in order (handy
for evaluation or exporting). `gather_all()` returns everything at once, shaped
`[batch_size, time, ...]`; `clear()` empties the buffer.""",
    ),
    (
        "code",
        """\
in_order = rb.as_dataset(single_deterministic_pass=True)
print("first items of segment 0:", [int(x["reward"]) for x, _ in in_order.take(5)])

everything = rb.gather_all()
print("gather_all observation shape:", everything["observation"].shape)
rb.clear()
print("after clear:", int(rb.num_frames()), "items")""",
    ),
    (
        "md",
        """\
## 4. The NumPy twin: `PyUniformReplayBuffer`

Same API and semantics, NumPy arrays inside: handy when your environment loop is plain
Python. Build it the TF-Agents way with a `capacity` (one ring that takes batches of any
size), or like the TF buffer with `batch_size` and `max_length`. `get_next` returns NumPy
arrays; `as_dataset` still yields tensors.""",
    ),
    (
        "code",
        """\
Step = collections.namedtuple("Step", ["observation", "action", "reward"])
py_spec = Step(tf.TensorSpec([3], tf.float32), tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32))
py_rb = tfreplay.PyUniformReplayBuffer(py_spec, capacity=max_length, seed=0)

rows = num_adds // 3
py_rb.add_batch(Step(
    observation=np.zeros([rows, 3], np.float32),
    action=np.arange(rows, dtype=np.int32),
    reward=np.ones(rows, np.float32),
))
sample, _ = py_rb.get_next(sample_batch_size=3)
print(type(sample.action).__name__, sample.action)
twin = tfreplay.PyUniformReplayBuffer(py_spec, batch_size=2, max_length=max_length)
print("capacity:", py_rb.capacity, "and", twin.capacity)""",
    ),
    (
        "md",
        """\
## 5. Checkpointing

Both buffers are trackable: put them in a `tf.train.Checkpoint` (next to your agent) and
the stored items, the write position and the sampler's random state are saved and
restored.""",
    ),
    (
        "code",
        """\
for step in range(num_adds):
    rb.add_batch(make_batch(step))
directory = tempfile.mkdtemp()
path = tf.train.Checkpoint(buffer=rb, numpy_buffer=py_rb).save(os.path.join(directory, "ckpt"))

restored = tfreplay.TFUniformReplayBuffer(data_spec, batch_size=batch_size, max_length=max_length)
restored_py = tfreplay.PyUniformReplayBuffer(py_spec, capacity=max_length)
tf.train.Checkpoint(buffer=restored, numpy_buffer=restored_py).restore(path)
print("restored", int(restored.num_frames()), "and", int(restored_py.num_frames()), "items")
assert np.array_equal(restored.gather_all()["reward"], rb.gather_all()["reward"])""",
    ),
    (
        "md",
        """\
## Next

[2_collect_and_train.ipynb](2_collect_and_train.ipynb) fills a buffer from gymnasium
environments with a driver and trains a DQN agent from `as_dataset`.""",
    ),
]

COLLECT_AND_TRAIN = [
    (
        "md",
        """\
# Collect experience and train a DQN agent

The usual loop of off-policy reinforcement learning:

1. a **driver** runs a policy in (vectorised) gymnasium environments and hands every
   batch of transitions to its **observers**: the replay buffer's `add_batch`, and metrics;
2. the agent **trains** on batches it reads from the buffer's `as_dataset`.

We train a Double-DQN agent on CartPole-v1 (balance a pole on a cart; the return is the
number of steps it stays up, at most 500).""",
    ),
    ("code", INSTALL),
    (
        "params",
        """\
# Budget of this notebook (the test suite runs it with much smaller numbers).
num_env_steps = 20_000  # environment steps of our own training loop, over all environments
initial_collect_steps = 1_000  # random steps before training starts
log_interval = 2_000
num_eval_episodes = 20
recipe_env_steps = 100_000  # at most this many steps for train_dqn at the end (it usually stops earlier)""",
    ),
    (
        "code",
        """\
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import matplotlib.pyplot as plt
import numpy as np
import tf_keras

import tfreplay
from tfreplay.agents import DqnAgent, make_q_network
from tfreplay.drivers import StepDriver, make_vector_env
from tfreplay.observers import AverageReturn, StepsPerSecond
from tfreplay.policies import RandomPolicy
from tfreplay.training import DqnConfig, evaluate, linear_epsilon, train_dqn

tf_keras.utils.set_random_seed(0)""",
    ),
    (
        "md",
        """\
## The environment and the driver

`make_vector_env` builds a `gymnasium.vector.SyncVectorEnv` of 4 CartPoles. The driver
takes any policy, a callable from a batch of observations to a batch of actions; we start
with random actions. `driver.transition_spec` describes one transition: create the buffer
from it.""",
    ),
    (
        "code",
        """\
num_envs = 4
env = make_vector_env("CartPole-v1", num_envs)
driver = StepDriver(env, RandomPolicy(env.single_action_space, seed=0), num_steps=num_envs, seed=0)
spec = driver.transition_spec
spec""",
    ),
    (
        "md",
        """\
Each transition holds `observation, action, reward, discount, next_observation`, the
`step_type` of the observation (0 for the first of an episode) and whether the episode
`terminated` (the pole fell: `discount` 0, nothing to bootstrap from) or was `truncated`
(the 500-step time limit: `discount` 1, the value of `next_observation` still counts).
At an episode's end `next_observation` is the true final observation, never the first
observation of the next episode.

## The buffer as an observer

One segment per environment, so `batch_size=num_envs`. Observers are called in order with
every batch; metrics are observers too.""",
    ),
    (
        "code",
        """\
rb = tfreplay.TFUniformReplayBuffer(spec, batch_size=num_envs, max_length=50_000 // num_envs, seed=0)
average_return, steps_per_second = AverageReturn(buffer_size=20), StepsPerSecond()
for observer in (rb.add_batch, average_return, steps_per_second):
    driver.add_observer(observer)

driver.run(initial_collect_steps)
print(f"{int(rb.num_frames())} transitions stored; random policy: average return "
      f"{average_return.result():.1f}, {steps_per_second.result():.0f} env steps/s")""",
    ),
    (
        "md",
        """\
## The agent and the dataset

`DqnAgent` wraps a Keras Q-network (here a 256-256 MLP), its target network, Huber loss
and Adam; the hyper-parameters are those `train_dqn` uses.
`agent.train(experience)` takes the `(items, BufferInfo)` elements of
`as_dataset(sample_batch_size)`: batches of single transitions, since each one keeps its
`next_observation` (the `num_steps=2` windows of TF-Agents work too, at twice the reads).
For collection we switch the driver to an epsilon-greedy policy whose epsilon decays as
training goes.""",
    ),
    (
        "code",
        """\
config = DqnConfig(initial_collect_steps=initial_collect_steps)  # the tuned hyper-parameters of train_dqn
q_network = make_q_network(spec.observation, num_actions=2, fc_layer_params=config.fc_layer_params)
agent = DqnAgent(spec.observation, num_actions=2, q_network=q_network,
                 optimizer=tf_keras.optimizers.Adam(config.learning_rate), gamma=config.gamma,
                 target_update_period=config.target_update_period, gradient_clipping=config.gradient_clipping)
driver.policy = agent.policy(epsilon=lambda: linear_epsilon(config, driver.num_env_steps), seed=0)

dataset = rb.as_dataset(sample_batch_size=config.batch_size)  # num_steps=None: single transitions
experience = iter(dataset)
items, info = next(experience)
print("a batch of transitions:", items.observation.shape, "| sampled ids:", info.ids.shape)""",
    ),
    (
        "md",
        """\
## The training loop

Collect one step in every environment, then train; log the average return of recent
training episodes.""",
    ),
    (
        "code",
        """\
history = []
train_steps_per_iteration = max(int(round(config.train_steps_per_env_step * num_envs)), 1)
while driver.num_env_steps < num_env_steps:
    driver.run()  # one step in each environment
    for _ in range(train_steps_per_iteration):
        loss = agent.train(next(experience)).loss
    if driver.num_env_steps % log_interval < num_envs:
        history.append((driver.num_env_steps, average_return.result()))
        print(f"step {driver.num_env_steps:6d}  loss {float(loss):7.3f}  "
              f"average return {average_return.result():6.1f}")""",
    ),
    (
        "md",
        """\
## Evaluate and plot

The greedy policy (epsilon 0) on fresh episodes, and the learning curve. After 20,000 steps
the agent is usually part of the way there; DQN on CartPole also is famously jumpy (the
return can climb to 500 and drop again a few thousand steps later), which is why the
complete recipe below evaluates as it goes and keeps the best weights.""",
    ),
    (
        "code",
        """\
returns = evaluate("CartPole-v1", agent.policy(), num_episodes=num_eval_episodes, seed=1000)
print(f"greedy policy: average return {np.mean(returns):.1f} over {len(returns)} episodes")

steps, values = zip(*history) if history else ((), ())
plt.figure(figsize=(7, 4))
plt.plot(steps, values, label="training episodes (average of the last 20)")
plt.axhline(np.mean(returns), color="C3", linestyle="--", label="final greedy evaluation")
plt.xlabel("environment steps")
plt.ylabel("return")
plt.legend()
plt.show()""",
    ),
    (
        "md",
        """\
## The whole recipe in one call

`tfreplay.training.train_dqn` is the loop above plus greedy evaluations every 2,500 steps
(keeping the best weights, and stopping early once one reaches CartPole's reward threshold
of 475), checkpoints you can resume from (`output_dir=..., resume=True`), TensorBoard
summaries and a progress bar. It is what `python -m examples.demo` runs, and it is
deterministic: the same seed gives the same run.""",
    ),
    (
        "code",
        """\
result = train_dqn(num_env_steps=recipe_env_steps, initial_collect_steps=initial_collect_steps,
                   num_eval_episodes=num_eval_episodes, stop_at_return=475)
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
plt.show()""",
    ),
]


def build(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "colab": {"provenance": []},
    }
    for i, (kind, source) in enumerate(cells):
        if kind == "md":
            cell = nbformat.v4.new_markdown_cell(source)
        else:
            cell = nbformat.v4.new_code_cell(source)
            if kind == "params":
                cell.metadata["tags"] = ["parameters"]
        cell["id"] = f"cell-{i}"  # stable ids keep the files reproducible
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


NOTEBOOKS = {"1_replay_buffers.ipynb": REPLAY_BUFFERS, "2_collect_and_train.ipynb": COLLECT_AND_TRAIN}


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(cells), HERE / name)
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
