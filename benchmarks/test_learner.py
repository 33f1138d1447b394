"""The learner at full speed: replay-to-update pipelines side by side, each group beside its constant-batch floor.

Learners (`benchmarks/learners.py`): Double DQN on a 256x256 Q-network from a
uniform and from a prioritized buffer, and the DDPG example's update, each from
a full 50,000-item buffer. Cases, per train step (the same update in each):

* floor: the update fed one fixed batch (constants), 64 updates in one
  serialized graph loop: the update alone, no buffer, no call per step; and
  the same loop compiled with XLA (floor + XLA);
* numpy + convert_to_tensor: the common Keras pattern, indices drawn with
  NumPy, every field `tf.convert_to_tensor`-ed, then the update's `tf.function`
  (uniform learners);
* as_dataset + tf.function: `as_dataset(batch).prefetch(AUTOTUNE)` read by
  Python, one `tf.function` call per batch (uniform learners);
* get_next in tf.function: one `tf.function` per step that samples, updates
  (and gives priorities);
* TrainLoop K: `tfreplay.TrainLoop(buffer, step, K, batch)`, one call per K
  steps, K = 1, 4, 16, 64 with `jit_compile=False`, and with XLA (K = 16, 64;
  what `jit_compile=None`, the default, picks for a uniform buffer).

The prioritized learner's cases are also set beside the uniform learner's same
case (interleaved runs: `make bench-learner`).

The `tf-agents dqn` group (where `tf_agents` imports: `make bench-peers`, the
TF 2.15 lane) trains one TF-Agents `DqnAgent` (256x256 `QNetwork`, CartPole
shapes, batch 128) from 50,000 items: TF-Agents' own loop,
`as_dataset(num_parallel_calls=3, sample_batch_size=128, num_steps=2).prefetch(3)`
and `agent.train`, beside tfreplay's `as_dataset` with the same arguments and
`TrainLoop` on the same agent (K = 1 and 16 without XLA, 16 and 64 with it),
and the floors of the same update without and with XLA.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import learners
from benchmarks.common import GraphLoop, fill_in_graph, measure, size
from tfreplay import TFUniformReplayBuffer, TrainLoop
from tfreplay.rl.drivers import Transition

FLOOR_STEPS = size(64, 2)
TRAIN_LOOPS = [(1, False), (4, False), (16, False), (64, False), (16, True), (64, True)]
if learners.ITEMS < 50_000:  # TFREPLAY_BENCH_TINY: one loop of each kind
    TRAIN_LOOPS = [(4, False), (4, True)]


def synced(call: Callable[[], Any]) -> Callable[[], Any]:
    """`call()`, its first result read back so the timing includes the work it started."""
    return lambda: np.asarray(tf.nest.flatten(call())[0])


@pytest.fixture(scope="module", params=learners.NAMES)
def learner(request: pytest.FixtureRequest) -> learners.Learner:
    return learners.learner(request.param)


def _time(benchmark: Any, w: learners.Learner, case: str, call: Callable[[], Any], steps: int, **kwargs: Any) -> None:
    # The prioritized learner's cases beside the uniform one's: what prioritized replay adds to the same update.
    versus = ("learner dqn", case) if w.name == "dqn-prioritized" and "role" not in kwargs else None
    group = f"learner {w.name}"
    measure(benchmark, synced(call), group=group, case=case, ops=steps, items=w.batch, versus=versus, **kwargs)


@pytest.mark.parametrize("xla", [False, True], ids=["plain", "xla"])
def test_floor_fixed_batch(benchmark, learner, xla):
    """The update alone; compiled with XLA, what XLA makes of it, beside the compiled `TrainLoop`."""
    fixed = tf.nest.map_structure(tf.identity, learner.buffer.get_next(learner.batch))  # sampled once
    loop = GraphLoop(lambda: learner.update(*fixed)[0], calls=FLOOR_STEPS, jit_compile=xla)
    case = f"floor{' + XLA' if xla else ''}: fixed batch, in-graph"
    _time(benchmark, learner, case, loop, FLOOR_STEPS, **({} if xla else {"role": "baseline"}))


def test_numpy_convert_to_tensor(benchmark, learner):
    if learner.prioritized:
        pytest.skip("a NumPy buffer is uniform replay")
    update = tf.function(lambda items: learner.update(items, None)[0])
    flat = [np.reshape(x, (learners.ITEMS,) + x.shape[2:]) for x in learner.steps]
    rng = np.random.default_rng(0)

    def step() -> Any:
        ids = rng.integers(0, learners.ITEMS, learner.batch)
        return update(Transition(*(tf.convert_to_tensor(x[ids]) for x in flat)))

    _time(benchmark, learner, "NumPy buffer + convert_to_tensor + tf.function", step, 1)


def test_as_dataset_tf_function(benchmark, learner):
    if learner.prioritized:
        pytest.skip("a dataset read without priorities is uniform replay")
    update = tf.function(lambda items: learner.update(items, None)[0])
    dataset = iter(learner.buffer.as_dataset(sample_batch_size=learner.batch).prefetch(tf.data.AUTOTUNE))
    _time(benchmark, learner, "as_dataset().prefetch + tf.function", lambda: update(next(dataset)[0]), 1)


def test_get_next_in_tf_function(benchmark, learner):
    rb = learner.buffer

    @tf.function
    def step() -> tf.Tensor:
        items, info = rb.get_next(learner.batch)
        loss, priorities = learner.update(items, info)
        if priorities is not None:
            rb.update_priorities(info.ids, priorities)
        return loss

    _time(benchmark, learner, "get_next inside the step's tf.function", step, 1)


@pytest.mark.parametrize("k, xla", TRAIN_LOOPS, ids=[f"K{k}{'-xla' if x else ''}" for k, x in TRAIN_LOOPS])
def test_train_loop(benchmark, learner, k, xla):
    if learner.prioritized:
        step = learner.update  # (loss, priorities): TrainLoop updates them
    else:
        step = lambda items, info: learner.update(items, info)[0]  # noqa: E731
    loop = TrainLoop(learner.buffer, step, k, learner.batch, jit_compile=xla)
    _time(benchmark, learner, f"TrainLoop K={k}{' + XLA' if xla else ''}", loop, k)


# TF-Agents' DqnAgent (the TF 2.15 lane): its own replay loop beside tfreplay's on the same agent.
TFA_BATCH, TFA_STEPS = 128, 2


@pytest.fixture(scope="module")
def tfa() -> Any:
    pytest.importorskip("tf_agents")
    from tf_agents.agents.dqn import dqn_agent
    from tf_agents.networks import q_network
    from tf_agents.replay_buffers import tf_uniform_replay_buffer
    from tf_agents.specs import tensor_spec
    from tf_agents.trajectories import time_step
    from tf_agents.utils import common

    observation_spec = tensor_spec.TensorSpec([4], tf.float32, "observation")
    action_spec = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1, "action")
    network = q_network.QNetwork(observation_spec, action_spec, fc_layer_params=(256, 256))
    agent = dqn_agent.DqnAgent(
        time_step.time_step_spec(observation_spec),
        action_spec,
        q_network=network,
        optimizer=tf.keras.optimizers.Adam(5e-4),
        td_errors_loss_fn=common.element_wise_huber_loss,
        target_update_period=500,
        gradient_clipping=10.0,
    )
    agent.initialize()
    spec = agent.collect_data_spec
    length = learners.ITEMS // learners.SEGMENTS
    rng = np.random.default_rng(0)

    def leaf(s: tf.TensorSpec) -> tf.Tensor:
        shape = [learners.SEGMENTS] + s.shape.as_list()
        if s.dtype == tf.float32:
            return tf.constant(rng.normal(size=shape).astype(np.float32))
        high = 2 if s.dtype == tf.int64 else 1  # actions 0 or 1; step types MID (1) below
        return tf.constant(rng.integers(0, high, shape), s.dtype)

    batch = tf.nest.map_structure(leaf, spec)
    batch = batch._replace(step_type=tf.ones_like(batch.step_type), next_step_type=tf.ones_like(batch.step_type))
    theirs = tf_uniform_replay_buffer.TFUniformReplayBuffer(spec, learners.SEGMENTS, length)
    ours = TFUniformReplayBuffer(spec, learners.SEGMENTS, length, seed=0)
    for rb in (theirs, ours):
        fill_in_graph(rb.add_batch, batch, length)
    return agent, theirs, ours


def _tfa_time(benchmark: Any, case: str, call: Callable[[], Any], steps: int, **kwargs: Any) -> None:
    measure(benchmark, synced(call), group="learner tf-agents dqn", case=case, ops=steps, items=TFA_BATCH, **kwargs)


def _dataset_train(agent: Any, rb: Any) -> Callable[[], Any]:
    dataset = rb.as_dataset(num_parallel_calls=3, sample_batch_size=TFA_BATCH, num_steps=TFA_STEPS).prefetch(3)
    iterator, train = iter(dataset), tf.function(agent.train)
    return lambda: train(next(iterator)[0]).loss


@pytest.mark.parametrize("xla", [False, True], ids=["plain", "xla"])
def test_tf_agents_floor_fixed_batch(benchmark, tfa, xla):
    agent, _, ours = tfa
    fixed, _ = tf.nest.map_structure(tf.identity, ours.get_next(TFA_BATCH, num_steps=TFA_STEPS))
    loop = GraphLoop(lambda: agent.train(fixed).loss, calls=FLOOR_STEPS, jit_compile=xla)
    case = f"floor{' + XLA' if xla else ''}: fixed batch, in-graph"
    _tfa_time(benchmark, case, loop, FLOOR_STEPS, **({} if xla else {"role": "baseline"}))


TFA_LOOP = "TF-Agents: as_dataset(npc=3).prefetch(3) + agent.train"


def test_tf_agents_own_loop(benchmark, tfa):
    agent, theirs, _ = tfa
    _tfa_time(benchmark, TFA_LOOP, _dataset_train(agent, theirs), 1)


def test_tf_agents_tfreplay_dataset(benchmark, tfa):
    agent, _, ours = tfa
    case = "tfreplay: as_dataset(npc=3).prefetch(3) + agent.train"
    _tfa_time(benchmark, case, _dataset_train(agent, ours), 1, versus=TFA_LOOP)


TFA_TRAIN_LOOPS = [(1, False), (16, False), (16, True), (64, True)] if learners.ITEMS == 50_000 else [(4, True)]


@pytest.mark.parametrize("k, xla", TFA_TRAIN_LOOPS, ids=[f"K{k}{'-xla' if x else ''}" for k, x in TFA_TRAIN_LOOPS])
def test_tf_agents_tfreplay_train_loop(benchmark, tfa, k, xla):
    agent, _, ours = tfa
    step = lambda items, info: agent.train(items).loss  # noqa: E731
    loop = TrainLoop(ours, step, k, TFA_BATCH, num_steps=TFA_STEPS, jit_compile=xla)
    case = f"tfreplay: TrainLoop K={k}{' + XLA' if xla else ''} + agent.train"
    _tfa_time(benchmark, case, loop, k, versus=TFA_LOOP)
