"""`tfreplay.TrainLoop`: K iterations of sample -> step -> update_priorities per call, inside one graph.

The loop's contract is the unfused loop's: for the same buffer seed, K fused
steps draw the same samples and give the same results as K separate
`get_next` + step (+ `update_priorities`) calls, over every TF buffer kind,
with windows and transforms, eagerly, inside `tf.function` and (where the
draws agree) under XLA, which a uniform buffer of rows gets by default.
Steps here record what they saw (ids, probabilities, a checksum of every
leaf) and fold it into a variable, so a sample is checked by value and the
state carried from step to step too.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers import KINDS, SPEC, make_items, quick, run_threads, shared_buffer

from tfreplay import (
    BufferClosedError,
    MinSize,
    NStepReturns,
    PyUniformReplayBuffer,
    RateLimitTimeoutError,
    SampleToInsertRatio,
    Sequences,
    TFPrioritizedReplayBuffer,
    TFUniformReplayBuffer,
    TrainLoop,
)
from tfreplay.keras import keras_module

B, L, ADDS, BATCH, K = 2, 12, 10, 8, 4

# name -> (kind, get_next arguments)
CASES = {
    "uniform": ("tf-uniform", {}),
    "uniform-windows": ("tf-uniform", {"num_steps": 2}),
    "uniform-sequences": ("tf-uniform", {"transform": Sequences(3, burn_in=1)}),
    "prioritized": ("tf-prioritized", {}),
    "frame": ("tf-frame", {}),
    "frame-n-step": ("tf-frame", {"transform": NStepReturns(3, 0.9)}),
    "prioritized-frame-n-step": ("tf-prioritized-frame", {"transform": NStepReturns(3, 0.9)}),
}
# Where XLA's draws are the eager ones: uniform integer draws, and windows through the episode index, whose draw
# is XLA-compiled in every mode. A prioritized ring buffer's float draws differ under XLA (tested apart).
XLA_AS_EAGER = {"uniform", "uniform-sequences", "frame-n-step"}


def filled(kind_name: str, seed: int = 3, **kwargs):
    kind = KINDS[kind_name]
    rb = kind.make(B, L, seed=seed, **kwargs)
    return fill(rb, kind)


def fill(rb, kind):
    for step in range(ADDS):
        rb.add_batch(kind.items(step * B + np.arange(B), B))
    return rb


def shared(kind_name: str):
    """The session's buffer of this kind, new again (its compiled draws are kept), then filled."""
    return fill(shared_buffer(KINDS[kind_name], B, L), KINDS[kind_name])


def checksum(items) -> tf.Tensor:
    return tf.add_n([tf.reduce_sum(tf.cast(x, tf.float64)) for x in tf.nest.flatten(items)])


def recording_step(rb):
    """A step that folds each sample's checksum into a variable; with priorities, new ones from the ids."""
    total = tf.Variable(0.0, dtype=tf.float64)

    def step(items, info):
        seen = tf.identity(total.assign(total * 0.5 + checksum(items)))  # the value now (eagerly too)
        metrics = {"ids": info.ids, "probabilities": info.probabilities, "total": seen}
        if not hasattr(rb, "update_priorities"):
            return metrics
        return metrics, tf.cast(info.ids % 7, tf.float64) + 0.5  # later draws depend on these

    return step, total


def unfused(rb, step, steps: int, **sample):
    """`steps` separate eager get_next + step (+ update_priorities) calls, stacked like metrics='stack'."""
    out = []
    for _ in range(steps):
        items, info = rb.get_next(BATCH, **sample)
        metrics = step(items, info)
        if hasattr(rb, "update_priorities"):
            metrics, priorities = metrics
            rb.update_priorities(info.ids, priorities)
        out.append(metrics)
    return tf.nest.map_structure(lambda *x: np.stack(x), *out)


def assert_same_run(fused, reference, rtol: float = 1e-12) -> None:
    np.testing.assert_array_equal(fused["ids"], reference["ids"])
    np.testing.assert_array_equal(fused["probabilities"], reference["probabilities"])
    np.testing.assert_allclose(fused["total"], reference["total"], rtol=rtol)


def fused_calls(loop, calls: int = 2):
    """`calls` calls of a 'stack' loop, joined on the step axis."""
    out = [loop() for _ in range(calls)]
    return tf.nest.map_structure(lambda *x: np.concatenate(x), *out)


# --- the unfused loop's samples and results --------------------------------------------


@pytest.mark.parametrize("case", quick(list(CASES), "uniform", "prioritized", "frame-n-step"))
def test_fused_steps_draw_and_compute_what_separate_get_next_and_step_calls_do(case):
    """Eagerly, and with XLA where its draws are the eager ones (its arithmetic may round otherwise). One buffer
    serves the three runs, put back into its new state before each."""
    kind, sample = CASES[case]
    ref = shared(kind)
    ref_step, ref_total = recording_step(ref)
    reference, after = unfused(ref, ref_step, 2 * K, **sample), ref.get_next(64)[1].ids.numpy()
    rb = shared(kind)
    step, total = recording_step(rb)
    plain = TrainLoop(rb, step, K, BATCH, metrics="stack", jit_compile=False, **sample)
    assert_same_run(fused_calls(plain), reference)
    assert total.numpy() == pytest.approx(ref_total.numpy(), rel=1e-12)
    np.testing.assert_array_equal(rb.get_next(64)[1].ids, after)  # priority updates reached the buffer alike
    if case in XLA_AS_EAGER:
        rb = shared(kind)
        loop = TrainLoop(rb, recording_step(rb)[0], K, BATCH, metrics="stack", jit_compile=True, **sample)
        assert_same_run(fused_calls(loop), reference, rtol=1e-9)


def test_priorities_given_between_fused_steps_change_the_later_draws():
    rb = filled("tf-prioritized")
    by_ids = TrainLoop(rb, lambda items, info: (info.ids, tf.cast(info.ids, tf.float64) ** 4), 6, 64, metrics="stack")
    ids = by_ids().numpy()
    rb2 = filled("tf-prioritized")
    unchanged = TrainLoop(rb2, lambda items, info: (info.ids, None), 6, 64, metrics="stack")
    np.testing.assert_array_equal(ids[0], unchanged().numpy()[0])  # the first draw precedes any update
    assert ids[-1].mean() > ids[0].mean() + 3  # then high ids are drawn far more often


def test_a_fused_loop_called_inside_tf_function_runs_the_same_steps():
    rb, ref = filled("tf-prioritized"), filled("tf-prioritized")
    step, _ = recording_step(rb)
    loop = TrainLoop(rb, step, K, BATCH, metrics="stack")
    outer = tf.function(lambda: loop())
    fused = tf.nest.map_structure(lambda *x: np.concatenate(x), outer(), outer())
    assert_same_run(fused, unfused(ref, recording_step(ref)[0], 2 * K))


def test_iterations_run_one_after_the_other():
    """A step whose increment is a read, then a write: any overlap of iterations would lose or reorder one."""
    rb = filled("tf-uniform")
    counter = tf.Variable(0, dtype=tf.int64)

    def step(items, info):
        value = counter.read_value()
        with tf.control_dependencies([value]):
            return counter.assign(value + 1)

    seen = TrainLoop(rb, step, 50, 4, metrics="stack")()
    np.testing.assert_array_equal(seen, np.arange(1, 51))


def test_the_step_may_branch_on_tensors_in_python():
    """AutoGraph converts the step, as `tf.function` would."""
    rb = shared("tf-uniform")

    def step(items, info):
        if info.ids[0] % 2 == 0:
            return tf.constant(1)
        return tf.constant(2)

    branches = TrainLoop(rb, step, 6, 4, metrics="stack")().numpy()
    ref = shared("tf-uniform")
    np.testing.assert_array_equal(branches, [int(step(*ref.get_next(4))) for _ in range(6)])


# --- metrics ---------------------------------------------------------------------------------


def test_metrics_last_mean_and_stack():
    rb = filled("tf-uniform")

    def step(items, info):
        return {"mean_id": tf.reduce_mean(tf.cast(info.ids, tf.float32)), "ids": info.ids}

    stacked = TrainLoop(rb, step, 3, BATCH, metrics="stack")()
    assert stacked["ids"].shape == (3, BATCH) and stacked["mean_id"].shape == (3,)
    rb2 = filled("tf-uniform")
    last = TrainLoop(rb2, step, 3, BATCH, metrics="last")()
    np.testing.assert_array_equal(last["ids"], stacked["ids"][-1])
    rb3 = filled("tf-uniform")
    mean = TrainLoop(rb3, lambda items, info: step(items, info)["mean_id"], 3, BATCH, metrics="mean")()
    assert float(mean) == pytest.approx(float(np.mean(stacked["mean_id"])), rel=1e-6)


def test_the_default_returns_the_last_step_and_a_single_step_loop_is_one_step():
    rb, ref = filled("tf-uniform"), filled("tf-uniform")
    ids = TrainLoop(rb, lambda items, info: info.ids, 1, BATCH)()
    np.testing.assert_array_equal(ids, ref.get_next(BATCH)[1].ids)


def test_metrics_mean_refuses_an_integer_metric_naming_it():
    loop = TrainLoop(filled("tf-uniform"), lambda items, info: {"ids": info.ids}, 2, BATCH, metrics="mean")
    with pytest.raises(TypeError, match=r"TrainLoop: metrics \('mean'\) averages floating-point metrics; .* ids is"):
        loop()


def test_a_none_metric_is_refused_naming_it():
    loop = TrainLoop(filled("tf-uniform"), lambda items, info: {"loss": None}, 2, BATCH)
    with pytest.raises(TypeError, match=r"TrainLoop: the step's metric loss \(None\) must be a tensor"):
        loop()


def test_a_prioritized_step_must_return_metrics_and_priorities():
    loop = TrainLoop(filled("tf-prioritized"), lambda items, info: {"loss": 1.0}, 2, BATCH)
    with pytest.raises(TypeError, match=r"step must return \(metrics, priorities\), a plain pair, .* returned dict"):
        loop()


# --- arguments, checked once ----------------------------------------------------------------

step_of_ids = lambda items, info: info.ids  # noqa: E731


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"steps_per_call": 0}, ValueError, r"TrainLoop: steps_per_call \(0\) must be a positive integer"),
        ({"steps_per_call": True}, ValueError, r"TrainLoop: steps_per_call \(True\) must be a positive integer"),
        ({"metrics": "sum"}, ValueError, r"TrainLoop: metrics \('sum'\) must be 'last', 'mean' or 'stack'"),
        ({"jit_compile": 1}, TypeError, r"TrainLoop: jit_compile \(1\) must be True, False or None"),
        ({"step": 3}, TypeError, r"TrainLoop: step \(3\) must be callable"),
        ({"sample_batch_size": 0}, ValueError, r"TrainLoop: sample_batch_size \(0\) must be a positive integer"),
        ({"num_steps": 13}, ValueError, r"TrainLoop: num_steps \(13\) must be at most max_length \(12\)"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, error, match):
    args = {"buffer": filled("tf-uniform"), "step": step_of_ids, "steps_per_call": 2, "sample_batch_size": 4}
    with pytest.raises(error, match=match):
        TrainLoop(**{**args, **kwargs})


def test_a_numpy_buffer_is_refused_pointing_to_its_tf_twin():
    rb = PyUniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    twin = r"buffer \(PyUniformReplayBuffer\) must be a TF buffer: .* Use its TF twin, TFUniformReplayBuffer"
    with pytest.raises(TypeError, match=twin):
        TrainLoop(rb, step_of_ids, 2, 4)
    with pytest.raises(TypeError, match=r"TrainLoop: buffer \(list\) must be a TF buffer \(TFUniformReplayBuffer"):
        TrainLoop([], step_of_ids, 2, 4)


@pytest.mark.parametrize("jit_compile", [False, None], ids=["plain", "xla"])
def test_an_empty_buffer_is_refused_before_any_step_runs(jit_compile):
    """The plain loop's draw refuses it; XLA cannot, so the compiled loop is refused by a check under the buffer's
    lock before it runs."""
    rb = KINDS["tf-uniform"].make(B, L)
    steps = tf.Variable(0)
    loop = TrainLoop(rb, lambda items, info: {"steps": steps.assign_add(1)}, 2, 4, jit_compile=jit_compile)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the buffer is empty; add items before sampling"):
        loop()
    assert int(steps.numpy()) == 0
    rb.add_batch(make_items([0, 1]))  # the refused call let the lock go
    loop()
    assert int(steps.numpy()) == 2


# --- XLA -----------------------------------------------------------------------------------------


@pytest.mark.slow  # a compile of each loop; the fused loop under XLA stays in `make test` through the Keras model's
def test_under_xla_a_prioritized_loop_equals_the_unfused_loop_under_xla_and_warns_once(caplog):
    rb, ref = filled("tf-prioritized"), filled("tf-prioritized")
    step, _ = recording_step(rb)
    with caplog.at_level(logging.WARNING, logger="tfreplay"):
        loop = TrainLoop(rb, step, K, BATCH, metrics="stack", jit_compile=True)
    warnings = [r for r in caplog.records if r.name == "tfreplay" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "XLA cannot run the compiled sum-tree op" in warnings[0].getMessage()
    fused = fused_calls(loop)
    ref_step, _ = recording_step(ref)

    @tf.function(jit_compile=True)
    def one_step():
        items, info = ref.get_next(BATCH)
        metrics, priorities = ref_step(items, info)
        ref.update_priorities(info.ids, priorities)
        return metrics

    reference = tf.nest.map_structure(lambda *x: np.stack(x), *[one_step() for _ in range(2 * K)])
    assert_same_run(fused, reference)


@pytest.mark.parametrize(
    "kind_name, asked, compiled",
    [("tf-uniform", None, True), ("tf-prioritized", None, False), ("tf-frame", None, False)]
    + [("tf-uniform", False, False), ("tf-prioritized", True, True)],
)
def test_xla_by_default_where_the_draws_run_the_same_ops(kind_name, asked, compiled):
    """`jit_compile=None` compiles a uniform buffer's loop; prioritized and frame buffers draw with ops of their own
    that XLA would replace, so they run the plain loop unless asked."""
    assert TrainLoop(filled(kind_name), step_of_ids, 2, 4, jit_compile=asked).jit_compile is compiled


@pytest.mark.parametrize("kind_name", ["tf-uniform", "tf-prioritized"])
@pytest.mark.parametrize("asked", [None, True, False], ids=["default", "xla", "plain"])
def test_the_step_is_traced_once_whatever_the_loop_runs(kind_name, asked):
    """Tracing a Keras step costs seconds: the loop traces the step once, and only for what it runs."""
    traced = []

    def step(items, info):
        traced.append(1)
        out = step_of_ids(items, info)
        return (out, None) if kind_name == "tf-prioritized" else out

    loop = TrainLoop(filled(kind_name), step, 2, 4, jit_compile=asked)
    loop(), loop()
    assert len(traced) == 1


def host_step(items, info):
    """A step with an op XLA has no kernel for."""
    return {"ids": info.ids, "host": tf.reshape(tf.py_function(lambda: 1.0, [], tf.float32), [])}


@pytest.mark.parametrize("in_graph", [False, True], ids=["eager", "tf.function"])
def test_a_step_xla_cannot_compile_runs_the_plain_loop_and_warns_once(caplog, in_graph):
    rb = filled("tf-uniform")
    loop = TrainLoop(rb, host_step, 2, 4, metrics="stack")
    call = tf.function(lambda: loop()) if in_graph else loop
    with caplog.at_level(logging.WARNING, logger="tfreplay"):
        first, _ = call(), call()
    warnings = [r.getMessage() for r in caplog.records if r.name == "tfreplay" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "XLA cannot compile this step (no XLA kernel for EagerPyFunc)" in warnings[0]
    assert "jit_compile=False" in warnings[0]
    assert not loop.jit_compile
    np.testing.assert_array_equal(first["host"], [1.0, 1.0])


def test_a_step_xla_cannot_compile_fails_when_xla_is_asked_for():
    rb = filled("tf-uniform")
    mass = float(rb.sampling_mass())
    with pytest.raises(tf.errors.InvalidArgumentError, match="EagerPyFunc"):
        TrainLoop(rb, host_step, 2, 4, jit_compile=True)()
    rb.add_batch(make_items([100, 101]))  # the lock was let go
    assert float(rb.sampling_mass()) > mass


# --- the rate limiter --------------------------------------------------------------------------


def limited(limiter):
    return TFUniformReplayBuffer(SPEC, batch_size=2, max_length=50, seed=0, rate_limiter=limiter)


def add(rb, start: int, count: int = 1) -> None:
    for i in range(start, start + count):
        rb.add_batch(make_items([2 * i, 2 * i + 1]))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_fused_call_is_admitted_as_steps_per_call_samples(jit_compile):
    limiter = SampleToInsertRatio(2.0, 4, (-40.0, 100.0), sample_timeout=0.05)
    rb = limited(limiter)
    loop = TrainLoop(rb, step_of_ids, 5, 4, jit_compile=jit_compile)
    with pytest.raises(RateLimitTimeoutError, match=r"TrainLoop: the rate limiter waited 0.05 s to admit 20 samples"):
        loop()  # nothing stored yet
    add(rb, 0, 2)
    loop()
    assert limiter.info().samples == 20
    tf.function(lambda: loop())()  # inside a graph: the buffer's wait op, for the same 20
    assert limiter.info().samples == 40
    with pytest.raises(RateLimitTimeoutError, match="to admit 20 samples"):
        loop()  # the error, 4 * 2 - 40 - 20, would leave the range
    assert limiter.info().samples == 40


@pytest.mark.slow  # threads and waits
def test_a_fused_call_waits_for_a_collector_on_another_thread():
    limiter = SampleToInsertRatio(1.0, 4, (-8.0, 40.0), sample_timeout=10.0)
    rb = limited(limiter)
    add(rb, 0, 2)
    loop = TrainLoop(rb, step_of_ids, 3, 4)  # 12 samples a call
    first, times = threading.Event(), {}

    def learner():
        loop()  # the error, 4 - 12 = -8: admitted
        first.set()
        loop()  # waits until inserts make room for 12 more
        times["second call"] = time.monotonic()

    def collector():
        first.wait(10)
        time.sleep(0.2)
        times["inserts"] = time.monotonic()
        add(rb, 2, 6)

    run_threads([learner, collector], timeout=60)
    assert times["second call"] > times["inserts"]
    assert limiter.info().samples == 24


@pytest.mark.parametrize("jit_compile", [False, None], ids=["plain", "xla"])
def test_a_failed_fused_call_gives_its_samples_back(jit_compile):
    limiter = MinSize(2)
    rb = limited(limiter)
    add(rb, 0)  # 2 items, one per segment: no window of 2 yet
    loop = TrainLoop(rb, step_of_ids, 3, 4, num_steps=2, jit_compile=jit_compile)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no segment holds 2 consecutive items"):
        loop()
    assert limiter.info().samples == 0
    add(rb, 1)
    loop()  # all three steps ran: 12 samples kept
    assert limiter.info().samples == 12
    rb.clear()  # the limiter's counts start again
    add(rb, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no segment holds 2 consecutive items"):
        loop()  # no step ran: none of its samples kept, though the last call finished three
    assert limiter.info().samples == 0


def test_a_call_whose_step_fails_counts_the_samples_of_the_steps_that_ran():
    """A step that raises at iteration 3 of 5: the two finished iterations' priority updates stay, and so do
    their samples in the rate limiter; the three that did not run are given back."""
    limiter = MinSize(2)
    rb = TFPrioritizedReplayBuffer(SPEC, batch_size=2, max_length=50, seed=0, rate_limiter=limiter)
    add(rb, 0, 4)
    steps = tf.Variable(0)

    def step(items, info):
        done = steps.assign_add(1)
        with tf.control_dependencies([tf.debugging.assert_none_equal(done % 10, 3, message="step 3 fails")]):
            return {"ids": tf.identity(info.ids)}, tf.fill(tf.shape(info.ids), 5.0)

    loop = TrainLoop(rb, step, 5, 4)
    mass = float(rb.sampling_mass())
    with pytest.raises(tf.errors.InvalidArgumentError, match="step 3 fails"):
        loop()
    assert int(steps.numpy()) == 3
    assert limiter.info().samples == 2 * 4  # the two iterations that ran
    assert float(rb.sampling_mass()) > mass  # and their updates (priority 5 for the ids they drew)
    steps.assign(5)
    loop()  # steps 6 to 10: a call that runs through counts all of its samples
    assert limiter.info().samples == 2 * 4 + 5 * 4
    steps.assign(12)
    with pytest.raises(tf.errors.InvalidArgumentError, match="step 3 fails"):
        loop()  # its first step fails: nothing ran
    assert limiter.info().samples == 2 * 4 + 5 * 4


def test_the_error_range_must_hold_a_call_and_a_closed_buffer_is_refused():
    rb = limited(SampleToInsertRatio(1.0, 4, 10.0))
    with pytest.raises(ValueError, match=r"TrainLoop \(steps_per_call \* sample_batch_size per call\): .* \(32\)"):
        TrainLoop(rb, step_of_ids, 8, 4)
    loop = TrainLoop(rb, step_of_ids, 2, 4)
    rb.close()
    with pytest.raises(BufferClosedError, match="TrainLoop: the buffer is closed"):
        loop()


def test_close_ends_a_fused_call_waiting_for_the_limiter():
    rb = limited(MinSize(10))
    loop = TrainLoop(rb, step_of_ids, 2, 4)
    errors = []

    def learner():
        try:
            loop()
        except BufferClosedError as err:
            errors.append(err)

    thread = threading.Thread(target=learner, daemon=True)
    thread.start()
    time.sleep(0.2)
    rb.close()
    thread.join(10)
    assert not thread.is_alive() and errors


# --- a collector thread beside a compiled loop ------------------------------------------------

XLA_CALLS = 60  # compiled calls beside the collector; on a buffer that let them overlap most calls met a tear


@pytest.mark.parametrize("kind_name", ["tf-uniform", "tf-prioritized"])
def test_a_compiled_loop_beside_a_collector_thread_never_reads_a_torn_row(kind_name):
    """XLA has no mutex: the buffer's lock is held around each compiled call's draws (a prioritized loop's
    whole call), so a collector adding on another thread (into a ring small enough to wrap at every call) never
    tears a sample or changes rows under it. Every leaf of a row encodes its write index, so a torn row, or one
    whose id names another write, shows."""
    kind = KINDS[kind_name]
    rb = kind.make(2, 8, seed=0)
    fill_to = [0]

    def add() -> None:
        k = fill_to[0]
        rb.add_batch(kind.items(k * 2 + np.arange(2), 2))
        fill_to[0] = k + 1

    for _ in range(8):
        add()

    def step(items, info):
        metrics = {"items": items, "ids": info.ids}
        return (metrics, None) if kind.prioritized else metrics

    loop = TrainLoop(rb, step, 4, 64, metrics="stack", jit_compile=True)
    in_graph = tf.function(lambda: loop())
    stop, calls = threading.Event(), []

    def collector():
        while not stop.is_set():
            add()

    def learner():
        try:
            for i in range(XLA_CALLS):
                out = loop() if i % 2 else in_graph()  # eagerly and inside a tf.function
                calls.append(tf.nest.map_structure(np.asarray, out))
        finally:
            stop.set()

    def whole(out) -> bool:
        try:
            return np.array_equal(kind.decode(out["items"], 2), out["ids"])  # decode raises on a torn row
        except AssertionError:
            return False

    run_threads([collector, learner], timeout=120)
    assert fill_to[0] > 8 + XLA_CALLS // 4  # the collector ran beside the calls
    torn = [i for i, out in enumerate(calls) if not whole(out)]
    assert not torn, f"{len(torn)} of {len(calls)} compiled calls held torn or misnamed rows"


def test_a_collector_adds_while_a_compiled_uniform_loop_runs_its_steps():
    """A uniform loop draws every iteration's sample first, under the lock, and runs its compiled steps after
    it: a collector thread's adds go on during the steps instead of waiting for the call to end."""
    rb = TFUniformReplayBuffer({"x": tf.TensorSpec([64], tf.float32)}, batch_size=1, max_length=32, seed=0)
    row = {"x": np.ones([1, 64], np.float32)}
    for _ in range(8):
        rb.add_batch(row)
    weights = tf.Variable(tf.eye(64) * 0.5)

    def step(items, info):  # long enough that many adds fit in one call
        x = items["x"]
        for _ in range(400):
            x = tf.tanh(x @ weights)
        return tf.reduce_sum(x)

    loop = TrainLoop(rb, step, 8, 64, jit_compile=True)
    loop()  # compiled
    adds, stop = [0], threading.Event()
    during = []

    def collector():
        while not stop.is_set():
            rb.add_batch(row)
            adds[0] += 1

    def learner():
        try:
            for _ in range(3):
                before = adds[0]
                loop()
                during.append(adds[0] - before)
        finally:
            stop.set()

    run_threads([collector, learner], timeout=120)
    assert max(during) >= 5, f"adds during each compiled call: {during}"


# --- Keras models ----------------------------------------------------------------------------


def regression_buffer(prioritized: bool):
    spec = {"x": tf.TensorSpec([3], tf.float32), "y": tf.TensorSpec([], tf.float32)}
    rng = np.random.default_rng(0)
    cls = TFPrioritizedReplayBuffer if prioritized else TFUniformReplayBuffer
    rb = cls(spec, batch_size=16, max_length=8, seed=5)
    for _ in range(8):
        x = rng.normal(size=(16, 3)).astype(np.float32)
        rb.add_batch({"x": x, "y": x @ np.float32([1.0, -2.0, 0.5])})
    return rb


def keras_step(rb):
    """A Keras model and a fresh optimizer (built on the first step) and their train step."""
    keras = keras_module()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, "relu"), keras.layers.Dense(1)])
    model.set_weights([np.full(w.shape, 0.1 * (i + 1), np.float32) for i, w in enumerate(model.get_weights())])
    optimizer = keras.optimizers.Adam(0.01)
    prioritized = hasattr(rb, "update_priorities")

    def step(items, info):
        with tf.GradientTape() as tape:
            errors = items["y"] - model(items["x"], training=True)[:, 0]
            loss = tf.reduce_mean(errors**2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        metrics = {"loss": loss}
        return (metrics, tf.abs(errors) + 1e-3) if prioritized else metrics

    return model, step


@pytest.mark.keras
@pytest.mark.parametrize("prioritized", quick([False, True], True), ids=["uniform", "prioritized"])
def test_a_keras_model_trains_in_the_fused_loop_as_in_separate_steps(prioritized):
    rb, ref = regression_buffer(prioritized), regression_buffer(prioritized)
    model, step = keras_step(rb)
    ref_model, ref_step = keras_step(ref)
    losses = TrainLoop(rb, step, 10, 32, metrics="stack", jit_compile=False)()["loss"]
    traced = tf.function(ref_step)
    reference = []
    for _ in range(10):
        items, info = ref.get_next(32)
        out = traced(items, info)
        if prioritized:
            out, priorities = out
            ref.update_priorities(info.ids, priorities)
        reference.append(float(out["loss"]))
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    if not prioritized:  # a prioritized sample favours the worst errors: its loss need not fall within 10 steps
        assert losses[-1] < losses[0]
    for w, r in zip(model.get_weights(), ref_model.get_weights()):
        np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6)


@pytest.mark.keras
@pytest.mark.parametrize("jit_compile", [True, None], ids=["asked", "default"])
def test_a_keras_model_trains_in_the_fused_loop_under_xla(jit_compile, caplog):
    rb, ref = regression_buffer(False), regression_buffer(False)
    model, step = keras_step(rb)
    _, ref_step = keras_step(ref)
    loop = TrainLoop(rb, step, 10, 32, metrics="stack", jit_compile=jit_compile)
    with caplog.at_level(logging.WARNING, logger="tfreplay"):
        losses = loop()["loss"]
    assert loop.jit_compile and not caplog.records  # a Keras step compiles: the default keeps XLA
    reference = [float(ref_step(*ref.get_next(32))["loss"]) for _ in range(10)]
    np.testing.assert_allclose(losses, reference, rtol=1e-4)
