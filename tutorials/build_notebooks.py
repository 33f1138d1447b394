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
from tfreplay.rl.agents import DqnAgent, make_q_network
from tfreplay.rl.drivers import StepDriver, make_vector_env
from tfreplay.rl.observers import AverageReturn, StepsPerSecond
from tfreplay.rl.policies import RandomPolicy
from tfreplay.rl.training import DqnConfig, evaluate, linear_epsilon, train_dqn

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

`tfreplay.rl.training.train_dqn` is the loop above plus greedy evaluations every 2,500 steps
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


PRIORITIZED_AND_SEQUENCES = [
    (
        "md",
        """\
# Prioritized replay, n-step returns and sequences

Three ways to make each sample count for more, all computed inside the TensorFlow graph:

1. **prioritized replay** (Schaul et al. 2016): draw the transitions the agent gets most
   wrong more often, and correct the bias with importance weights;
2. a DQN **train step** that samples, learns and updates the priorities in one `tf.function`;
3. **n-step returns**, summed at sample time, that stop at an episode's end;
4. **sequences** for recurrent agents, with a burn-in, padding past an episode's end and a
   mask, and R2D2's sequence priorities.""",
    ),
    ("code", INSTALL),
    (
        "params",
        """\
# Budget of this notebook (the test suite runs it with much smaller numbers).
num_env_steps = 4_000  # random transitions collected for sections 1 and 2
train_steps = 500  # prioritized train steps in section 2
recipe_env_steps = 100_000  # at most this many steps for train_dqn in section 3 (it usually stops earlier)""",
    ),
    (
        "code",
        """\
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf
import tf_keras

import tfreplay
from tfreplay.rl.agents import DqnAgent, make_q_network
from tfreplay.rl.drivers import StepDriver, make_vector_env
from tfreplay.rl.policies import RandomPolicy
from tfreplay.rl.training import train_dqn

tf_keras.utils.set_random_seed(0)""",
    ),
    (
        "md",
        """\
## 1. Prioritized replay

`TFPrioritizedReplayBuffer` has the API of `TFUniformReplayBuffer` plus
`update_priorities(ids, priorities)`. Item `i` is drawn with probability
`p_i ** alpha / sum_j p_j ** alpha` (`alpha=0` is uniform), from a sum tree kept in a
`tf.Variable`. New items enter at the largest priority given so far (1 to begin with), so
each is seen at least once soon. We fill one with random CartPole transitions.""",
    ),
    (
        "code",
        """\
env = make_vector_env("CartPole-v1", 4)
driver = StepDriver(env, RandomPolicy(env.single_action_space, seed=0), num_steps=4, seed=0)
spec = driver.transition_spec
rb = tfreplay.TFPrioritizedReplayBuffer(spec, batch_size=4, max_length=10_000, alpha=0.6, seed=0)
driver.add_observer(rb.add_batch)
driver.run(num_env_steps)

items, info = rb.get_next(sample_batch_size=5)
num_items = int(rb.num_frames())
print("ids:", info.ids.numpy())
print("probabilities x number of items:", info.probabilities.numpy() * num_items, "(all equal: uniform so far)")""",
    ),
    (
        "md",
        """\
Give these five items new priorities (a learner would use their TD errors) and draw many
samples: each is drawn as often as its exact probability, which `BufferInfo.probabilities`
reports. Priority 0 means never drawn, until raised again.""",
    ),
    (
        "code",
        """\
priorities = np.array([0.0, 0.5, 2.0, 8.0, 32.0])
rb.update_priorities(info.ids, priorities)

num_draws = 100_000
_, many = rb.get_next(sample_batch_size=num_draws)
drawn = many.ids.numpy()
weights = priorities**0.6
exact = weights / (weights.sum() + (num_items - 5))  # the other items kept priority 1
for item, priority, p in zip(info.ids.numpy(), priorities, exact):
    count = np.sum(drawn == item)
    print(f"id {item:5d}  priority {priority:5.1f}  drawn {count:4d} times, expected {num_draws * p:6.1f}")""",
    ),
    (
        "md",
        """\
Drawing some items more often biases the expected gradient. Importance weights
`(N * P(i)) ** -beta`, divided by their maximum, undo it: `beta=1` fully, `beta=0` not at
all. Prioritized DQN anneals `beta` from 0.4 to 1 over training.""",
    ),
    (
        "code",
        """\
for beta in (0.0, 0.4, 1.0):
    w = tfreplay.importance_weights(many.probabilities, rb.num_frames(), beta).numpy()
    print(f"beta {beta}: weights from {w.min():.3f} (the most likely items) to {w.max():.3f}")""",
    ),
    (
        "md",
        """\
## 2. A prioritized DQN train step

`agent.train(items, weights)` scales each sample's Huber loss by its weight and returns
each sample's `|TD error|` in `LossInfo.abs_td_errors`: the new priorities. The whole step
is one graph: weights, gradient step and `update_priorities` (an update for an item that
was overwritten meanwhile is ignored). `tfreplay.rl.learner.prioritized_train_step` is these
lines.""",
    ),
    (
        "code",
        """\
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
print(f"loss: {np.mean(losses[:20]):.3f} at first, {np.mean(losses[-20:]):.3f} at the end")""",
    ),
    (
        "md",
        """\
The priorities now follow the TD errors: a few transitions are drawn far more often than
the rest, and those the agent already predicts well, rarely.""",
    ),
    (
        "code",
        """\
_, after = rb.get_next(sample_batch_size=5_000)
relative = after.probabilities.numpy() * int(rb.num_frames())
plt.figure(figsize=(7, 3.5))
plt.hist(relative, bins=50, log=True)
plt.xlabel("probability of a drawn item, relative to uniform")
plt.ylabel("draws")
plt.show()""",
    ),
    (
        "md",
        """\
## 3. n-step returns

`NStepReturns(n, gamma)` is a *transform*: `get_next(..., transform=...)` and
`as_dataset(..., transform=...)` draw windows of `n` items with the buffer's sampler and
return one transition per window, summed in the graph:

* `reward = sum_{k<m} gamma**k * r_{t+k}`, over its `m <= n` real steps (fewer at an
  episode's end; a window never crosses into another episode or the write head);
* `next_observation` of the last real step;
* `discount = gamma**m * (product of the steps' discounts)`: the whole bootstrap factor, 0
  after a terminated end.

Here, by hand, one segment of a prioritized buffer (every transform works on every
sampler): an episode of 4 steps that terminates, one of 3 that is truncated by a time
limit, and one still running. Each observation is the step's number.""",
    ),
    (
        "code",
        """\
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
    rb_small.add_batch({
        "observation": np.float32([t]),
        "reward": np.float32([1.0]),
        "discount": np.float32([0.0 if end == "terminated" else 1.0]),
        "next_observation": np.float32([t + 1]),
        "terminated": np.array([end == "terminated"]),
        "truncated": np.array([end == "truncated"]),
    })

n_step = tfreplay.NStepReturns(n=3, gamma=0.9)
items, info = rb_small.get_next(sample_batch_size=200, transform=n_step)
first = {int(i): k for k, i in reversed(list(enumerate(info.ids.numpy())))}  # one row per drawn start
print(" t  reward  discount  next_observation")
for t, k in sorted(first.items()):
    print(f"{t:2d}  {items['reward'][k]:6.2f}  {items['discount'][k]:8.3f}  {items['next_observation'][k]:6.0f}")""",
    ),
    (
        "md",
        """\
Step 0 sums three rewards (`1 + 0.9 + 0.81`) and bootstraps with `0.9**3` from step 3.
Steps 1 to 3 reach the terminated end (`discount` 0: nothing to bootstrap from), 2 and 3
with fewer rewards. Steps 5 and 6 stop at the truncated end and still bootstrap, from the
final observation, with `0.9**2` and `0.9`. Steps 7 and 8 are not drawn yet: their episode
goes on, and their 3-step return is not known.

So the TD target is `reward + discount * Q_target(next_observation, argmax)`, with no
further `gamma`: an agent that reads `NStepReturns` items is built with `gamma=1.0`.
`train_dqn(n_step=3, prioritized=True)` (or `python -m examples.demo --prioritized
--n_step=3`) does all of this:""",
    ),
    (
        "code",
        """\
result = train_dqn(num_env_steps=recipe_env_steps, prioritized=True, n_step=3, stop_at_return=475,
                   num_eval_episodes=5, progress=False)
print(result.summary())""",
    ),
    (
        "md",
        """\
## 4. Sequences for recurrent agents

`Sequences(length, burn_in, pad)` draws `burn_in + length` consecutive items and returns
them as a `Window(items, mask)`, time-stacked `[B, burn_in + length, ...]`. The burn-in
warms up a recurrent state without training on it (R2D2). With `pad=False` every sequence
lies inside one episode; with `pad=True` a sequence may run past its episode's end: the
steps after it are zeros and `mask` is False there. A recurrent state stored with each item
is just another field of the spec.""",
    ),
    (
        "code",
        """\
sequences = tfreplay.Sequences(length=3, burn_in=1, pad=True)
window, info = rb_small.get_next(sample_batch_size=6, transform=sequences)
for k in np.argsort(info.ids.numpy()):
    print("observations", window.items["observation"][k].numpy(), "mask", window.mask[k].numpy().astype(int))""",
    ),
    (
        "md",
        """\
Prioritized sequences use R2D2's mix of the per-step TD errors over the valid steps after
the burn-in: `eta * max + (1 - eta) * mean`. `sequence_priorities` computes it. The
priority of a sequence is that of its first item, and `info.ids` are those items' ids: the
priorities go to `update_priorities(info.ids, ...)` as for single transitions. (Here the TD
errors are made up: a recurrent learner would compute them.) A sequence with no valid step
after its burn-in gets priority 0: never drawn again. The prioritized sampler draws padded
sequences (`pad=True`); strict ones (`pad=False`) come from the uniform sampler for now.""",
    ),
    (
        "code",
        """\
td_errors = np.random.default_rng(0).normal(size=window.mask.shape)[:, sequences.burn_in :]
mask = window.mask.numpy()[:, sequences.burn_in :]
priorities = tfreplay.sequence_priorities(td_errors, mask, eta=0.9)
print("sequence priorities, rows as above:", priorities[np.argsort(info.ids.numpy())].round(3))
rb_small.update_priorities(info.ids, priorities)""",
    ),
    (
        "md",
        """\
## Next

The README's *Prioritized replay* section has the sampler's details, and
`python -m examples.compare_replay` runs the comparison of uniform replay against
prioritized replay with 3-step returns on CartPole.""",
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


NOTEBOOKS = {
    "1_replay_buffers.ipynb": REPLAY_BUFFERS,
    "2_collect_and_train.ipynb": COLLECT_AND_TRAIN,
    "3_prioritized_and_sequences.ipynb": PRIORITIZED_AND_SEQUENCES,
}


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(cells), HERE / name)
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
