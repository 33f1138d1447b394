"""Reverb's error types where user code catches them, table names and addresses as tensors, and one module per
Reverb module name after `install()`."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
import tensorflow as tf
from reverb_helpers import insert_ints

from tfreplay.compat import reverb


def fifo(name="t"):
    return reverb.Table(name, reverb.selectors.Fifo(), reverb.selectors.Fifo(), 100, reverb.rate_limiters.MinSize(1), 1)


def test_an_unknown_table_raises_not_found(serve):
    server, client = serve(fifo())
    message = r"table \('nope'\) is not on the server"
    with pytest.raises(tf.errors.NotFoundError, match=message):
        next(client.sample("nope"))
    with pytest.raises(RuntimeError, match=message):  # what Reverb's Client raises
        client.reset("nope")
    with pytest.raises(tf.errors.NotFoundError, match=message):
        client.mutate_priorities("nope", {1: 1.0})
    tf_client = reverb.TFClient(f"localhost:{server.port}")
    with pytest.raises(tf.errors.NotFoundError, match=message):
        tf_client.sample("nope", [tf.int64])
    with pytest.raises(tf.errors.NotFoundError, match=message):
        reverb.TrajectoryDataset(f"localhost:{server.port}", "nope", tf.int64, tf.TensorShape([]), 1)


def test_tf_client_sample_looks_the_table_up_when_the_op_runs(serve):
    server, client = serve(fifo())
    tf_client = reverb.TFClient(f"localhost:{server.port}")
    graph = tf.Graph()
    with graph.as_default():
        tf_client.sample("nope", [tf.int64])  # building the op does not look the table up


def test_tf_client_sample_with_the_wrong_dtypes_raises_invalid_argument(serve):
    server, client = serve(fifo())
    insert_ints(client, "t", [np.int64(1), np.int64(2)])
    tf_client = reverb.TFClient(f"localhost:{server.port}")
    message = r"table 't' holds dtypes \['int64'\]; data_dtypes asks \['float32'\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):  # as Reverb's op, eagerly
        tf_client.sample("t", [tf.float32])
    with pytest.raises(TypeError, match=message):
        tf_client.sample("t", [tf.float32])


def test_table_names_and_addresses_may_be_tensors(serve):
    server, client = serve(fifo())
    insert_ints(client, "t", [np.int64(k) for k in range(6)])
    address = tf.constant(f"localhost:{server.port}")
    tf_client = reverb.TFClient(address)
    assert int(tf_client.sample(tf.constant("t"), [tf.int64]).data[0]) == 0

    @tf.function
    def draw(name):
        return tf_client.sample(name, [tf.int64]).data[0]

    assert int(draw(tf.constant("t"))) == 1
    tf_client.update_priorities(tf.constant("t"), tf.constant([0], tf.uint64), tf.constant([3.0], tf.float64))

    def dataset(name):
        return reverb.TrajectoryDataset(address, name, tf.int64, tf.TensorShape([]), 1, max_samples=1)

    assert [int(s.data) for s in dataset(tf.constant("t"))] == [2]
    inner = tf.data.Dataset.from_tensor_slices(["t"]).interleave(dataset, cycle_length=1)  # a graph tensor
    assert [int(s.data) for s in inner] == [3]


def test_install_maps_every_reverb_module_name_to_the_shims_module():
    saved = {n: m for n, m in sys.modules.items() if n.split(".")[0] == "reverb"}
    try:
        shim = reverb.install()
        importlib.import_module("reverb.server")
        importlib.import_module("reverb.platform.checkpointers_lib")
        import reverb as imported  # noqa: PLC0415 (the import under test)
        from reverb import item_selectors, replay_sample, trajectory_dataset, trajectory_writer  # noqa: PLC0415

        assert imported is shim and imported.server.Server is shim.Server
        assert imported.client.Client is shim.Client and imported.tf_client.TFClient is shim.TFClient
        assert trajectory_dataset.TrajectoryDataset is shim.TrajectoryDataset
        assert trajectory_writer.TrajectoryWriter is shim.TrajectoryWriter
        assert replay_sample.ReplaySample is shim.ReplaySample and item_selectors.Fifo is shim.selectors.Fifo
        assert sys.modules["reverb.platform.checkpointers_lib"] is shim.checkpointers
        server = imported.server.Server([imported.server.Table.queue("q", 2)])
        try:
            imported.client.Client(f"localhost:{server.port}").server_info()  # the server the shim's clients see
        finally:
            server.stop()
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "reverb"]:
            del sys.modules[name]
        sys.modules.update(saved)


def test_uninstall_removes_every_name_install_added():
    installed = sys.modules.get("reverb") is reverb  # the redirect plugin's lane installs the shim
    reverb.install()
    reverb.uninstall()
    left = [n for n, m in list(sys.modules.items()) if n.split(".")[0] == "reverb" and m is not None]
    assert not [n for n in left if sys.modules[n].__name__.startswith("tfreplay")]
    if installed:
        reverb.install()
