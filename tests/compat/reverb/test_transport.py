"""A server in another process: writers, samplers, datasets and TF clients reach it over gRPC, with Reverb's
semantics and errors; the standalone server's entry point and config; a server that dies or restarts. The tests
that start processes beyond the one server are marked slow (`make test-slow` runs them, on current TensorFlow)."""

from __future__ import annotations

import json
import pathlib
import signal
import struct
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from processes import ServerProcess, client_process, finish, free_port

from tfreplay.compat import reverb
from tfreplay.compat.reverb import serve

QUEUE = {"sampler": "fifo", "remover": "fifo", "max_times_sampled": 1}
MIN_SIZE_1 = {"kind": "min_size", "min_size_to_sample": 1}
CONFIG = {
    "tables": [
        {
            "name": "replay",
            "max_size": 1000,
            "rate_limiter": MIN_SIZE_1,
            "signature": {"obs": {"shape": [2, 3], "dtype": "float32"}, "step": {"shape": [2], "dtype": "int64"}},
        },
        {"name": "tf", "max_size": 10, "rate_limiter": {"kind": "queue", "size": 10}, **QUEUE},
        {"name": "handoff", "max_size": 10, "rate_limiter": {"kind": "queue", "size": 10}, **QUEUE},
        {"name": "full", "max_size": 1, "rate_limiter": {"kind": "queue", "size": 1}, **QUEUE},
        {"name": "empty", "max_size": 1, "rate_limiter": {"kind": "queue", "size": 1}, **QUEUE},
        {
            "name": "prio",
            "sampler": {"kind": "prioritized", "priority_exponent": 1.0},
            "max_size": 10,
            "rate_limiter": MIN_SIZE_1,
            "max_times_sampled": 2,
        },
        {
            "name": "vars",
            "max_size": 1,
            "rate_limiter": MIN_SIZE_1,
            "signature": {"w": {"shape": [4], "dtype": "float32"}, "version": {"shape": [], "dtype": "int64"}},
        },
    ]
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = ServerProcess(CONFIG, tmp_path_factory.mktemp("server"))
    yield process
    assert process.stop() == 0  # SIGTERM: a clean stop


def consistent(obs: np.ndarray, step: np.ndarray) -> int:
    """The first step of a two-step item whose every field encodes its steps; AssertionError if torn."""
    assert step.tolist() == [step[0], step[0] + 1]
    np.testing.assert_array_equal(obs, np.repeat(step[:, None].astype(np.float32), 3, axis=1))
    return int(step[0])


def test_writers_samplers_and_datasets_reach_a_server_in_another_process(server):
    client = reverb.Client(server.address)
    with client.trajectory_writer(2) as writer:
        for step in range(6):
            writer.append({"obs": np.full(3, step, np.float32), "step": np.int64(step)})
            if step >= 1:
                writer.create_item("replay", 1.0, {k: v[-2:] for k, v in writer.history.items()})
    with client.writer(2) as legacy:
        for step in range(100, 103):
            legacy.append({"obs": np.full(3, step, np.float32), "step": np.int64(step)})
            if step > 100:
                legacy.create_item("replay", 2, 1.0)
    info = client.server_info()["replay"]
    assert (info.current_size, info.rate_limiter_info.inserts, info.num_episodes, info.max_size) == (7, 7, 2, 1000)
    assert info.signature == {
        "obs": tf.TensorSpec([2, 3], tf.float32),
        "step": tf.TensorSpec([2], tf.int64),
    }
    firsts = {consistent(*s.data) for s in client.sample("replay", 40, emit_timesteps=False)}
    assert firsts <= {0, 1, 2, 3, 4, 100, 101} and len(firsts) >= 4
    many = [s.info.key for s in client.sample("replay", 2500, emit_timesteps=False)]  # past one request's draws
    assert len(many) == 2500 and len(set(many)) == 7
    dataset = reverb.TrajectoryDataset.from_table_signature(server.address, "replay", 4)
    drawn = {consistent(s.data["obs"].numpy(), s.data["step"].numpy()) for s in dataset.take(40)}
    assert drawn <= {0, 1, 2, 3, 4, 100, 101} and len(drawn) >= 4
    assert client.server_info()["replay"].rate_limiter_info.samples >= 2580


def test_tf_client_inserts_samples_and_updates_priorities_across_processes(server):
    tf_client = reverb.TFClient(server.address)
    tables, priorities = tf.constant(["tf"]), tf.constant([1.0], tf.float64)
    tf_client.insert([tf.constant(1.5), tf.constant([1, 2])], tables, priorities)
    tf.function(lambda: tf_client.insert([tf.constant(2.5), tf.constant([3, 4])], tables, priorities))()
    first = tf_client.sample("tf", [tf.float32, tf.int32])
    assert first.data[0].numpy() == 1.5 and first.data[1].numpy().tolist() == [1, 2]
    second = tf.function(lambda: tf_client.sample("tf", [tf.float32, tf.int32]))()
    assert second.data[0].numpy() == 2.5 and int(second.info.times_sampled) == 1

    client = reverb.Client(server.address)
    client.insert([np.int64(7)], {"prio": 1.0})
    key = int(tf_client.sample("prio", [tf.int64]).info.key)
    tf_client.update_priorities("prio", tf.constant([key], tf.uint64), tf.constant([5.0], tf.float64))
    assert next(client.sample("prio"))[0].info.priority == 5.0  # its second draw removes it (max_times_sampled)
    assert client.server_info()["prio"].current_size == 0


def test_a_refused_call_across_processes_raises_reverbs_error_and_changes_nothing(server):
    client = reverb.Client(server.address)
    with pytest.raises(ValueError, match=r"priority \(-1.0\) must be a finite number >= 0"):
        client.insert([np.int64(1)], {"prio": 1.0, "tf": -1.0})
    with pytest.raises(reverb.errors.NotFoundError, match=r"table \('nope'\) is not on the server"):
        client.insert([np.int64(1)], {"nope": 1.0})
    with pytest.raises(ValueError, match=r"must keep the dtype|signature expects"):
        with client.trajectory_writer(1) as writer:
            writer.append({"w": np.zeros(4, np.float64), "version": np.int64(0)})
            writer.create_item("vars", 1.0, {k: v[-1] for k, v in writer.history.items()})
    infos = client.server_info()
    assert infos["prio"].current_size == 0 and infos["tf"].current_size == 0 and infos["vars"].current_size == 0


WRITER = """
import sys
import numpy as np
from tfreplay.compat import reverb
with reverb.Client(sys.argv[1]).trajectory_writer(1) as writer:
    writer.append({"x": np.int64(int(sys.argv[2]))})
    writer.create_item("handoff", 1.0, {"x": writer.history["x"][-1]})
"""


@pytest.mark.slow  # more processes: `make test-slow` runs it
def test_a_sampler_waits_for_the_rate_limiter_until_a_writer_process_inserts(server):
    client = reverb.Client(server.address)
    got: list = []
    thread = threading.Thread(target=lambda: got.append(next(client.sample("handoff", emit_timesteps=False))))
    thread.start()
    try:
        thread.join(1.0)
        assert thread.is_alive() and not got  # the queue is empty: the sample waits on the server
        finish(client_process(WRITER, server.address, "42"))
    finally:
        thread.join(60)
    assert not thread.is_alive() and got[0].data[0] == 42


def test_timeouts_across_processes_raise_deadline_exceeded_as_in_process(server):
    client = reverb.Client(server.address)
    client.insert([np.int64(0)], {"full": 1.0})  # the queue of one is full
    with client.trajectory_writer(1) as writer:
        writer.append({"x": np.int64(1)})
        writer.create_item("full", 1.0, [writer.history["x"][-1]])
        start = time.monotonic()
        with pytest.raises(reverb.errors.DeadlineExceededError, match="within 300 ms"):
            writer.flush(timeout_ms=300)
        assert time.monotonic() - start < 10
        assert [s.data[0].tolist() for s in client.sample("full", 2, emit_timesteps=False)] == [[0], 1]
    dataset = reverb.TrajectoryDataset(
        server.address, "empty", tf.int64, tf.TensorShape([]), 1, rate_limiter_timeout_ms=300
    )
    assert list(dataset) == []  # the rate limiter's timeout ends the dataset


LEARNER = """
import sys
import tensorflow as tf
from tfreplay.compat import reverb
client = reverb.TFClient(sys.argv[1])
for version in range(1, 4):  # flattened as the signature: version, then w
    data = [tf.constant(version, tf.int64), tf.fill([4], float(version))]
    client.insert(data, tf.constant(["vars"]), tf.constant([1.0], tf.float64))
"""


@pytest.mark.slow  # more processes: `make test-slow` runs it
def test_a_variable_container_pushed_by_a_learner_process_is_pulled_by_an_actor(server):
    finish(client_process(LEARNER, server.address))
    actor = reverb.TFClient(server.address)
    pull = tf.function(lambda: actor.sample("vars", {"w": tf.float32, "version": tf.int64}).data)
    for _ in range(2):  # pulling leaves the weights in the table
        weights = pull()
        assert int(weights["version"]) == 3 and weights["w"].numpy().tolist() == [3.0] * 4
    info = reverb.Client(server.address).server_info()["vars"]
    assert (info.current_size, info.rate_limiter_info.inserts, info.rate_limiter_info.deletes) == (1, 3, 2)


def checkpointed_config(tmp_path: pathlib.Path, port: int) -> dict:
    table = {"name": "p", "sampler": {"kind": "prioritized", "priority_exponent": 1.0}, "max_size": 10}
    table["rate_limiter"] = MIN_SIZE_1
    return {"port": port, "checkpoint_dir": str(tmp_path / "checkpoints"), "tables": [table]}


@pytest.mark.slow  # more processes: `make test-slow` runs it
def test_a_checkpoint_taken_across_processes_is_served_by_a_restarted_server(tmp_path):
    config = checkpointed_config(tmp_path, free_port())
    first = ServerProcess(config, tmp_path)
    try:
        client = reverb.Client(first.address)
        for i in range(3):
            client.insert([np.int64(i)], {"p": float(i + 1)})
        assert next(client.sample("p", emit_timesteps=False)).info.table_size == 3  # a sample stream, opened
        path = client.checkpoint()
        assert pathlib.Path(path).is_dir() and pathlib.Path(path).parent == tmp_path / "checkpoints"
        client.insert([np.int64(99)], {"p": 1.0})  # after the checkpoint: not in it
    finally:
        assert first.stop() == 0
    second = ServerProcess(config, tmp_path)  # same port: the same client reaches it, on new streams
    try:
        assert client.server_info(timeout=30)["p"].current_size == 3
        drawn = {(int(s.data[0][0]), s.info.priority) for s in client.sample("p", 60, emit_timesteps=False)}
        assert drawn == {(0, 1.0), (1, 2.0), (2, 3.0)}
    finally:
        assert second.stop() == 0


@pytest.mark.slow  # more processes: `make test-slow` runs it
def test_a_killed_server_fails_its_clients_within_their_timeout(tmp_path):
    process = ServerProcess({"tables": [{"name": "q", "max_size": 5, **QUEUE, "rate_limiter": MIN_SIZE_1}]}, tmp_path)
    errors: list = []
    try:
        client = reverb.Client(process.address)

        def sample():
            try:
                next(client.sample("q"))
            except Exception as e:
                errors.append(e)

        thread = threading.Thread(target=sample)
        thread.start()
        thread.join(1.0)
        assert thread.is_alive()  # waiting on the server's rate limiter
    finally:
        process.stop(signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive() and isinstance(errors[0], tf.errors.UnavailableError)
    start = time.monotonic()
    with pytest.raises(reverb.errors.DeadlineExceededError, match="no Reverb server answered"):
        client.server_info(timeout=2)
    assert time.monotonic() - start < 10


@pytest.mark.slow  # more processes: `make test-slow` runs it
def test_a_server_in_this_process_is_reached_by_another_process_and_wait_returns_once_it_stops(serve):
    server, client = serve(reverb.Table.queue("handoff", 10))
    waiter = threading.Thread(target=server.wait)
    waiter.start()
    try:
        finish(client_process(WRITER, f"127.0.0.1:{server.port}", "7"))
        assert next(client.sample("handoff", emit_timesteps=False)).data[0] == 7
        assert waiter.is_alive()
    finally:
        server.stop()
        waiter.join(10)
    assert not waiter.is_alive()
    reverb.Server([reverb.Table.queue("q", 1)], port=server.port).stop()  # the port is free again


def test_a_client_of_a_server_in_its_own_process_calls_its_tables_directly(serve, monkeypatch):
    from tfreplay.compat.reverb.transport import client as transport_client

    monkeypatch.setattr(transport_client, "remote", lambda address: pytest.fail(f"{address} went over the network"))
    server, _ = serve(reverb.Table.queue("q", 10))
    client = reverb.Client(f"127.0.0.1:{server.port}")
    client.insert([np.int64(3)], {"q": 1.0})
    assert next(client.sample("q"))[0].data[0] == 3


def test_the_server_refuses_malformed_messages_and_runs_no_code_from_them(serve):
    server, client = serve(reverb.Table.queue("q", 10))
    call = grpc.insecure_channel(f"127.0.0.1:{server.port}").unary_unary("/tfreplay.reverb.Tables/Call")

    def message(header: dict, payload: bytes = b"") -> bytes:
        text = json.dumps(header).encode()
        return b"TFRV" + struct.pack("<I", len(text)) + text + payload

    insert = {"op": "insert", "targets": [["q", 1.0]]}
    malformed = [
        b"",
        b"\x80\x04\x95 a pickle is not a message",
        message({"op": "info"})[:-3],  # a header cut short
        message(dict(insert, arrays=[["|O8", [1]]]), bytes(8)),  # Python objects: refused
        message(dict(insert, arrays=[["<f4", [2]]]), bytes(4)),  # fewer bytes than the shape needs
        message(dict(insert, arrays=[["<f4", [1]]]), bytes(8)),  # bytes after the last array
        message(dict(insert, arrays=[["<f8", [2**39] * 8]]), bytes(8)),  # a shape whose size overflows int64
        message({"op": "exec", "arrays": []}),
    ]
    for raw in malformed:
        reply = call(raw, timeout=30)
        header_size = struct.unpack("<I", reply[4:8])[0]
        assert json.loads(reply[8 : 8 + header_size])["error"][0] == "Value", raw
    stream = grpc.insecure_channel(f"127.0.0.1:{server.port}").stream_stream("/tfreplay.reverb.Tables/Insert")
    assert list(stream(iter([b"TFRB\xff\xff\xff\x7f", b"more"]), timeout=30)) == []  # ends the stream, no item
    assert client.server_info()["q"].current_size == 0


def test_a_config_with_a_wrong_field_is_refused_naming_it():
    good = {"name": "t", "max_size": 10, "rate_limiter": MIN_SIZE_1}
    tables = serve.tables_from_config({"tables": [dict(good, signature={"x": {"shape": [None, 2], "dtype": "int8"}})]})
    assert tables[0].signature == {"x": tf.TensorSpec([None, 2], tf.int8)}
    with pytest.raises(ValueError, match=r"config: tables\[0\].sampler \('random'\) must be one of"):
        serve.tables_from_config({"tables": [dict(good, sampler="random")]})
    with pytest.raises(ValueError, match=r"config: tables\[0\].rate_limiter .* must be an object whose 'kind'"):
        serve.tables_from_config({"tables": [dict(good, rate_limiter={"kind": "fast"})]})
    with pytest.raises(ValueError, match=r"config: tables\[0\].rate_limiter .* has arguments its kind does not"):
        serve.tables_from_config({"tables": [dict(good, rate_limiter={"kind": "min_size", "size": 3})]})
    with pytest.raises(ValueError, match=r"config: tables \(\[\]\) must be a non-empty list"):
        serve.tables_from_config({"tables": []})


def non_loopback_address() -> str | None:
    """This machine's address on a network interface, or None when it has only the loopback one."""
    import socket

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # picks the outgoing interface; sends nothing
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_a_server_given_a_host_listens_on_that_interface_only(monkeypatch):
    import os
    import socket

    monkeypatch.delenv("TFREPLAY_REVERB_HOST", raising=False)
    with pytest.raises(ValueError, match=r"Server: host \(''\) must be None or an interface's address"):
        reverb.Server([reverb.Table.queue("q", 1)], host="")
    server = serve.serve({"host": "127.0.0.1", "tables": [{"name": "q", "max_size": 1, "rate_limiter": MIN_SIZE_1}]})
    try:
        assert "TFREPLAY_REVERB_HOST" not in os.environ  # the config's host is the server's, not the process's
        socket.create_connection(("127.0.0.1", server.port), timeout=2.0).close()
        other = non_loopback_address()
        if other is not None:
            with pytest.raises(OSError):
                socket.create_connection((other, server.port), timeout=2.0).close()
    finally:
        server.stop()
