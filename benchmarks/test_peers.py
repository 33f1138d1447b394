"""tfreplay beside TF-Agents, cpprb and Reverb on the same workloads (`make bench-peers`, the TF 2.15 lane).

Every buffer full, the workloads of `test_buffers.py`. Each group is one
operation in one mode, every library in it beside the NumPy baseline and,
where it applies, TensorFlow's floor for that kind of call:

* eager; tf.function (the call inside the user's `tf.function`, beside a bare
  `tf.function` with the same inputs and outputs); in-graph (the serialized
  graph loop, per call);
* Py: the NumPy-side buffers: TF-Agents' takes one row per `add_batch` (B
  calls per batch), cpprb has no windows (`sample(B * 2)` single items), Reverb
  writes through one trajectory writer per env;
* as_dataset: `next()` on `as_dataset(B, num_steps=2).prefetch(AUTOTUNE)`
  at steady state (Reverb: `TrajectoryDataset(...).batch(B)`).

A peer that does not import is skipped. tfreplay's cases are also set beside
TF-Agents' (interleaved runs: `make bench-peers`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import pytest
import tensorflow as tf

from benchmarks.common import drained, fill_in_graph, measure

TF_MODES = ["eager", "tf.function", "in-graph"]
# Each TF mode's libraries; the bare tf.function floor belongs to the tf.function mode.
TF_CASES = [
    (m, lib)
    for m in TF_MODES
    for lib in ["NumPy", "floor", "tfreplay", "TF-Agents"]
    if lib != "floor" or m == "tf.function"
]


@pytest.fixture(scope="module")
def tf_agents(subjects) -> Dict[str, Any]:
    """TF-Agents' TF and Py buffers, full."""
    pytest.importorskip("tf_agents")
    from tf_agents.replay_buffers import py_uniform_replay_buffer, tf_uniform_replay_buffer
    from tf_agents.specs import tensor_spec

    w, s = subjects.workload, subjects
    tf_rb = tf_uniform_replay_buffer.TFUniformReplayBuffer(w.spec, w.batch_size, w.max_length)
    fill_in_graph(tf_rb.add_batch, s.tf_batch, w.max_length)
    py_rb = py_uniform_replay_buffer.PyUniformReplayBuffer(tensor_spec.to_nest_array_spec(w.spec), w.capacity)
    rows = [{k: v[i : i + 1] for k, v in s.batch.items()} for i in range(w.batch_size)]
    for _ in range(w.max_length):
        for row in rows:
            py_rb.add_batch(row)
    return {"tf": tf_rb, "py": py_rb, "rows": rows}


@pytest.fixture(scope="module")
def cpprb(subjects) -> Any:
    cpprb = pytest.importorskip("cpprb")
    w = subjects.workload
    env = {k: {"shape": s.shape.as_list() or 1, "dtype": s.dtype.as_numpy_dtype} for k, s in w.spec.items()}
    rb = cpprb.ReplayBuffer(w.capacity, env)
    for _ in range(w.max_length):
        rb.add(**subjects.batch)
    return rb


class Reverb:
    """A uniform Reverb table of `num_steps` windows, one trajectory writer per env, full."""

    def __init__(self, subjects: Any):
        import reverb

        self.w = w = subjects.workload
        signature = {k: tf.TensorSpec([w.num_steps] + s.shape.as_list(), s.dtype) for k, s in w.spec.items()}
        limiter = reverb.rate_limiters.MinSize(1)
        table = reverb.Table(
            "t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), w.capacity, limiter, signature=signature
        )
        self.server = reverb.Server([table])
        self.address = f"localhost:{self.server.port}"
        client = reverb.Client(self.address)
        self.writers = [client.trajectory_writer(num_keep_alive_refs=w.num_steps) for _ in range(w.batch_size)]
        self.rows = [{k: v[i] for k, v in subjects.batch.items()} for i in range(w.batch_size)]
        for _ in range(w.max_length):
            self.add()

    def add(self) -> None:
        for writer, row in zip(self.writers, self.rows):
            writer.append(row)
            if writer.episode_steps >= self.w.num_steps:
                writer.create_item("t", 1.0, {k: writer.history[k][-self.w.num_steps :] for k in row})
        for writer in self.writers:
            writer.flush()

    def dataset(self) -> tf.data.Dataset:
        import reverb

        ds = reverb.TrajectoryDataset.from_table_signature(self.address, "t", 4 * self.w.sample_batch_size)
        return ds.batch(self.w.sample_batch_size)


@pytest.fixture(scope="module")
def reverb(subjects) -> Reverb:
    pytest.importorskip("reverb")
    return Reverb(subjects)


def _versus(library: str, twin: str = "") -> str | None:
    """tfreplay's case is set beside TF-Agents' (its twin of the same name in `as_dataset`)."""
    return f"TF-Agents {twin}".strip() if library == "tfreplay" else None


def _added(add: Callable[[Any], Any], items: Any) -> tf.Tensor:
    """Calls `add`; returns a scalar that depends on it (TF-Agents returns an op, tfreplay a tensor)."""
    with tf.control_dependencies(tf.nest.flatten(add(items))):
        return tf.constant(0, tf.int64)


def _add_baseline(benchmark: Any, s: Any, group: str) -> None:
    measure(
        benchmark, s.numpy.add, group=group, case="NumPy: assign rows", role="baseline", items=s.workload.batch_size
    )


def _gather_baseline(benchmark: Any, s: Any, group: str) -> None:
    w = s.workload
    measure(
        benchmark,
        s.numpy.gather,
        group=group,
        case="NumPy: take window rows",
        role="baseline",
        items=w.items_per_sample,
    )


def _tf_add(request: Any, s: Any, library: str) -> Callable[[Any], Any]:
    return s.tf_buffer.add_batch if library == "tfreplay" else request.getfixturevalue("tf_agents")["tf"].add_batch


def _tf_sample(request: Any, s: Any, library: str) -> Callable[[], Any]:
    w = s.workload
    rb = s.tf_buffer if library == "tfreplay" else request.getfixturevalue("tf_agents")["tf"]
    return lambda: rb.get_next(w.sample_batch_size, w.num_steps)


@pytest.mark.parametrize("mode, library", TF_CASES)
def test_add_batch_tf(benchmark, request, subjects, graph_loop, mode, library):
    s, group = subjects, f"peers {subjects.workload.name} add_batch {mode}"
    if library == "NumPy":
        return _add_baseline(benchmark, s, group)
    if library == "floor":
        floor = tf.function(lambda items: tf.constant(0, tf.int64))
        fn = lambda: floor(s.tf_batch)  # noqa: E731
    else:
        add = _tf_add(request, s, library)
        if mode == "eager":
            fn = lambda: add(s.tf_batch)  # noqa: E731
        elif mode == "tf.function":
            call = tf.function(lambda items: _added(add, items))
            fn = lambda: call(s.tf_batch)  # noqa: E731
        else:
            fn = graph_loop(lambda: _added(add, s.tf_batch))
    role = "floor" if library == "floor" else None
    case = "floor: bare tf.function, same inputs" if library == "floor" else library
    measure(benchmark, fn, group=group, case=case, role=role, items=s.workload.batch_size, versus=_versus(library))


@pytest.mark.parametrize("mode, library", TF_CASES)
def test_get_next_tf(benchmark, request, subjects, graph_loop, mode, library):
    s, group = subjects, f"peers {subjects.workload.name} get_next {mode}"
    if library == "NumPy":
        return _gather_baseline(benchmark, s, group)
    if library == "floor":
        items, info = s.tf_buffer.get_next(s.workload.sample_batch_size, s.workload.num_steps)
        out = (dict(items), info.ids, info.probabilities)
        fn = tf.function(lambda: tf.nest.map_structure(tf.identity, out))
    else:
        sample = _tf_sample(request, s, library)
        fn = {"eager": sample, "tf.function": tf.function(sample)}.get(mode) or graph_loop(lambda: sample()[0])
    role = "floor" if library == "floor" else None
    case = "floor: bare tf.function, same outputs" if library == "floor" else library
    items, versus = s.workload.items_per_sample, _versus(library)
    measure(benchmark, fn, group=group, case=case, role=role, items=items, versus=versus)


@pytest.mark.parametrize("library", ["NumPy", "tfreplay", "TF-Agents", "cpprb", "reverb"])
def test_add_batch_py(benchmark, request, subjects, library):
    s, group = subjects, f"peers {subjects.workload.name} add_batch Py"
    if library == "NumPy":
        return _add_baseline(benchmark, s, group)
    if library == "tfreplay":
        fn = lambda: s.py_buffer.add_batch(s.batch)  # noqa: E731
    elif library == "TF-Agents":
        tfa = request.getfixturevalue("tf_agents")
        fn = lambda: [tfa["py"].add_batch(row) for row in tfa["rows"]]  # noqa: E731
    elif library == "cpprb":
        rb = request.getfixturevalue("cpprb")
        fn = lambda: rb.add(**s.batch)  # noqa: E731
    else:
        fn = request.getfixturevalue("reverb").add
    measure(benchmark, fn, group=group, case=library, items=s.workload.batch_size, versus=_versus(library))


@pytest.mark.parametrize("library", ["NumPy", "tfreplay", "TF-Agents", "cpprb (single items)"])
def test_get_next_py(benchmark, request, subjects, library):
    s, w, group = subjects, subjects.workload, f"peers {subjects.workload.name} get_next Py"
    if library == "NumPy":
        return _gather_baseline(benchmark, s, group)
    if library == "tfreplay":
        fn = lambda: s.py_buffer.get_next(w.sample_batch_size, w.num_steps)  # noqa: E731
    elif library == "TF-Agents":
        rb = request.getfixturevalue("tf_agents")["py"]
        fn = lambda: rb.get_next(w.sample_batch_size, w.num_steps)  # noqa: E731
    else:
        rb = request.getfixturevalue("cpprb")
        fn = lambda: rb.sample(w.items_per_sample)  # noqa: E731
    measure(benchmark, fn, group=group, case=library, items=w.items_per_sample, versus=_versus(library))


@pytest.mark.parametrize(
    "library", ["NumPy", "floor", "tfreplay TF", "TF-Agents TF", "tfreplay Py", "TF-Agents Py", "reverb"]
)
def test_as_dataset(benchmark, request, subjects, library):
    s, w, group = subjects, subjects.workload, f"peers {subjects.workload.name} as_dataset"
    if library == "NumPy":
        return _gather_baseline(benchmark, s, group)
    b, t = w.sample_batch_size, w.num_steps
    if library == "floor":
        items, info = s.tf_buffer.get_next(b, t)
        dataset = tf.data.Dataset.from_tensors((dict(items), info.ids, info.probabilities)).repeat()
    elif library == "reverb":
        dataset = request.getfixturevalue("reverb").dataset()
    else:
        twin = library.split()[1]
        if library.startswith("tfreplay"):
            rb = s.tf_buffer if twin == "TF" else s.py_buffer
        else:
            rb = request.getfixturevalue("tf_agents")[twin.lower()]
        npc = tf.data.AUTOTUNE if library != "TF-Agents Py" else None  # TF-Agents' Py dataset has no parallel calls
        dataset = rb.as_dataset(b, num_steps=t, num_parallel_calls=npc)
    role = "floor" if library == "floor" else None
    case = "floor: next() on a ready element" if library == "floor" else library
    fn = drained(iter(dataset.prefetch(tf.data.AUTOTUNE)))
    versus = _versus(library.split()[0], library.split()[-1])
    measure(benchmark, fn, group=group, case=case, role=role, items=w.items_per_sample, versus=versus)
