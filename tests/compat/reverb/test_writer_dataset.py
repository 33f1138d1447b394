"""Trajectory writer slicing, the legacy writer, datasets (shapes, signatures, timeouts), TFClient, checkpoints."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tfreplay.compat import reverb


def fifo(name="t", signature=None, max_times_sampled=1):
    return reverb.Table(
        name,
        reverb.selectors.Fifo(),
        reverb.selectors.Fifo(),
        100,
        reverb.rate_limiters.MinSize(1),
        max_times_sampled=max_times_sampled,
        signature=signature,
    )


def test_columns_slice_with_a_time_axis_and_index_squeezed(serve):
    _, client = serve(fifo())
    with client.trajectory_writer(3) as w:
        for i in range(4):
            w.append({"obs": np.full([2], i, np.float32), "r": np.float32(i)})
        w.create_item("t", 1.0, {"obs": w.history["obs"][-2:], "r": w.history["r"][-1]})
        assert w.history["obs"][-2:].shape == (2, 2) and w.history["r"][-1].shape == ()
        with pytest.raises(ValueError, match=r"older than the last num_keep_alive_refs \(3\)"):
            w.history["obs"][0]
    sample = next(client.sample("t", 1, emit_timesteps=False))
    np.testing.assert_array_equal(sample.data[0], [[2, 2], [3, 3]])
    assert sample.data[1] == 3


def test_overlapping_items_share_the_steps_they_cover(serve):
    t = fifo(max_times_sampled=0)
    _, client = serve(t)
    with client.trajectory_writer(2) as w:
        for i in range(3):
            w.append(np.arange(4) + i)
            if i:
                w.create_item("t", 1.0, w.history[-2:])
    first, second = (item.columns[0].cells for item in t.snapshot()[0])
    assert first[1] is second[0]  # one cell, two items


def test_legacy_writer_items_have_a_time_axis(serve):
    _, client = serve(fifo())
    with client.writer(2) as w:
        w.append([np.int64(1), np.float32(2)])
        w.append([np.int64(3), np.float32(4)])
        w.create_item("t", 2, 1.0)
        with pytest.raises(ValueError, match=r"num_timesteps \(3\) must be an integer in \[1, 2\]"):
            w.create_item("t", 3, 1.0)
    steps = next(client.sample("t", 1))
    assert [int(s.data[0]) for s in steps] == [1, 3]


def test_the_dataset_has_the_signature_and_ends_on_its_timeout(serve):
    signature = {"x": tf.TensorSpec([2], tf.int64)}
    server, client = serve(fifo(signature=signature))
    with client.trajectory_writer(2) as w:
        for i in range(5):
            w.append({"x": i})
            if i:
                w.create_item("t", 1.0, {"x": w.history["x"][-2:]})
    address = f"localhost:{server.port}"
    ds = reverb.TrajectoryDataset.from_table_signature(address, "t", 4, rate_limiter_timeout_ms=50)
    assert isinstance(ds, tf.data.Dataset)
    assert ds.element_spec.data == signature and ds.element_spec.info.key.dtype == tf.uint64
    got = [s.data["x"].numpy().tolist() for s in ds]
    assert got == [[0, 1], [1, 2], [2, 3], [3, 4]]


def test_the_dataset_takes_variable_length_items_and_stops_at_max_samples(serve):
    server, client = serve(fifo(max_times_sampled=0))
    with client.trajectory_writer(5) as w:
        for i in range(5):
            w.append(i)
        w.create_item("t", 1.0, w.history[-3:])
    ds = reverb.TrajectoryDataset(f"localhost:{server.port}", "t", tf.int64, tf.TensorShape([None]), 1, max_samples=3)
    assert [s.data.numpy().tolist() for s in ds] == [[2, 3, 4]] * 3


def test_a_dataset_of_the_wrong_shape_fails_with_invalid_argument(serve):
    server, client = serve(fifo())
    client.insert(np.int64(1), {"t": 1.0})
    ds = reverb.TrajectoryDataset(f"localhost:{server.port}", "t", tf.int64, tf.TensorShape([]), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"column 0 .* has \(dtype, shape\) \(int64, \[1\]\)"):
        next(iter(ds))


def test_a_dataset_refuses_bad_settings_by_name(serve):
    server, _ = serve(fifo())
    with pytest.raises(ValueError, match=r"max_in_flight_samples_per_worker \(0\) must be a positive integer"):
        reverb.TrajectoryDataset(f"localhost:{server.port}", "t", tf.int64, tf.TensorShape([]), 0)
    with pytest.raises(KeyError, match=r"table \('nope'\) is not on the server"):
        reverb.TrajectoryDataset(f"localhost:{server.port}", "nope", tf.int64, tf.TensorShape([]), 1)


def test_tf_client_ops_run_inside_tf_function(serve):
    server, client = serve(
        fifo(signature=tf.TensorSpec([3], tf.float32), max_times_sampled=0),
        reverb.Table(
            "p", reverb.selectors.Prioritized(1.0), reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1)
        ),
    )
    tfc = reverb.TFClient(f"localhost:{server.port}")

    @tf.function
    def put_and_take():
        tfc.insert([tf.constant([1.0, 2.0, 3.0])], tf.constant(["t"]), tf.constant([1.0], tf.float64))
        return tfc.sample("t", [tf.float32])

    sample = put_and_take()
    np.testing.assert_array_equal(sample.data[0], [1.0, 2.0, 3.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="column 0 has dtype int32"):
        tfc.insert([tf.constant([1, 2, 3])], tf.constant(["t"]), tf.constant([1.0], tf.float64))
    client.insert(np.float32(0), {"p": 1.0})
    key = next(client.sample("p", 1, emit_timesteps=False)).info.key
    tf.function(lambda: tfc.update_priorities("p", tf.constant([key], tf.uint64), tf.constant([5.0], tf.float64)))()
    assert next(client.sample("p", 1, emit_timesteps=False)).info.priority == 5.0


def test_a_checkpoint_restores_items_priorities_and_counts(serve, tmp_path):
    def tables():
        return [
            reverb.Table(
                "p",
                reverb.selectors.Prioritized(1.0),
                reverb.selectors.Fifo(),
                10,
                reverb.rate_limiters.MinSize(1),
                signature=tf.TensorSpec([2], tf.int64),
            )
        ]

    server, client = serve(*tables(), checkpointer=reverb.checkpointers.DefaultCheckpointer(tmp_path))
    with client.trajectory_writer(2) as w:
        for i in range(4):
            w.append(np.int64(i))
            if i:
                w.create_item("p", float(i), w.history[-2:])
    next(client.sample("p", 1))
    client.checkpoint()
    before = client.server_info()["p"]
    server.stop()
    _, again = serve(*tables(), checkpointer=reverb.checkpointers.DefaultCheckpointer(tmp_path))
    after = again.server_info()["p"]
    assert after.current_size == 3 and after.rate_limiter_info == before.rate_limiter_info
    items = sorted((s.info.priority, s.data[0].tolist()) for s in again.sample("p", 200, emit_timesteps=False))
    assert {p: d for p, d in items} == {1.0: [0, 1], 2.0: [1, 2], 3.0: [2, 3]}


def test_a_malformed_address_is_refused_and_an_unreachable_one_times_out():
    with pytest.raises(ValueError, match=r"server_address \('example.com'\) must be '<host>:<port>'"):
        reverb.Client("example.com")
    start = time.monotonic()
    with pytest.raises(reverb.errors.DeadlineExceededError, match="no Reverb server answered at localhost:1"):
        reverb.Client("localhost:1").server_info(timeout=1)
    assert 0.9 <= time.monotonic() - start < 10


def test_install_makes_import_reverb_give_the_shim_and_uninstall_undoes_it():
    saved = {k: v for k, v in sys.modules.items() if k == "reverb" or k.startswith("reverb.")}
    try:
        reverb.install()
        import reverb as imported

        assert imported is reverb and sys.modules["reverb.selectors"] is reverb.selectors
        reverb.uninstall()
        assert sys.modules.get("reverb") is not reverb
    finally:
        reverb.uninstall()
        sys.modules.update(saved)
