"""Batches over the transport: a writer's items sent several to a request and a sample's draws answered together
arrive exactly as written, whether the draws agree in shape (one array per column) or not (one per item)."""

from __future__ import annotations

import numpy as np
import pytest
from processes import ServerProcess

from tfreplay.compat import reverb

MIN_SIZE_1 = {"kind": "min_size", "min_size_to_sample": 1}
QUEUE = {"sampler": "fifo", "remover": "fifo", "max_times_sampled": 1, "rate_limiter": MIN_SIZE_1}
CONFIG = {"tables": [{"name": "mixed", "max_size": 100, **QUEUE}, {"name": "alike", "max_size": 100, **QUEUE}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = ServerProcess(CONFIG, tmp_path_factory.mktemp("server"))
    yield process
    assert process.stop() == 0


def write(client, table: str, lengths: list) -> list:
    """Items of the last `length` steps, step t being {"obs": [t, t], "t": t}; their (priority, steps)."""
    written = []
    with client.trajectory_writer(max(lengths)) as writer:
        for t in range(max(lengths) - 1):
            writer.append({"obs": np.full(2, t, np.float32), "t": np.int32(t)})
        for i, length in enumerate(lengths):
            t = max(lengths) - 1 + i
            writer.append({"obs": np.full(2, t, np.float32), "t": np.int32(t)})
            writer.create_item(table, 0.5 + i, {k: v[-length:] for k, v in writer.history.items()})
            written.append((0.5 + i, list(range(t - length + 1, t + 1))))
    return written


@pytest.mark.parametrize("table, lengths", [("mixed", [1, 3, 2, 1, 3]), ("alike", [2] * 40)])
def test_a_sample_batch_arrives_as_written(server, table, lengths):
    client = reverb.Client(server.address)
    written = write(client, table, lengths)
    samples = list(client.sample(table, len(lengths), emit_timesteps=False))
    assert [(s.info.priority, s.data[1].tolist()) for s in samples] == written  # FIFO: in the order written
    for sample, (_, steps) in zip(samples, written):
        np.testing.assert_array_equal(sample.data[0], np.repeat(np.array(steps, np.float32)[:, None], 2, axis=1))
        assert sample.data[1].dtype == np.int32 and sample.info.times_sampled == 1
    assert len({s.info.key for s in samples}) == len(lengths)
    assert [s.info.table_size for s in samples] == list(range(len(lengths), 0, -1))


def test_a_cell_crosses_an_insert_stream_once_and_is_forgotten_once_let_go():
    import gc

    from tfreplay.compat.reverb.engine.items import Column, Item
    from tfreplay.compat.reverb.transport import cells, wire

    out, held = cells.CellsOut(), cells.CellsIn()
    frames = [np.full([84, 84, 4], t, np.uint8) for t in range(3)]
    first = Item(1, 1.0, (Column((frames[0], frames[1]), False),))
    second = Item(2, 2.0, (Column((frames[1], frames[2]), False), Column((frames[2],), True)))
    requests = [out.encode([("t", first)]), out.encode([("t", second)])]
    assert len(requests[0]) > 2 * frames[0].nbytes and len(requests[1]) < 1.5 * frames[0].nbytes  # frame 1 once
    (a,), (b,) = (held.read(r, "test") for r in requests)
    assert a[:3] == ("t", 1.0, []) and b[:3] == ("t", 2.0, [])
    for column, expected in zip(a[3] + b[3], [frames[:2], frames[1:], frames[2:]]):
        assert len(column.cells) == len(expected)
        for cell, frame in zip(column.cells, expected):
            np.testing.assert_array_equal(cell, frame)
    assert b[3][0].cells[0] is a[3][0].cells[1] and b[3][1].squeeze  # the server's items share the cell too

    del first
    frames[0] = None
    gc.collect()
    third = out.encode([("t", Item(3, 1.0, (Column((frames[2],), True),)))])
    assert wire.decode(third)[0]["forget"] == [0]  # frame 0, let go on the client, is dropped on the server
    (c,) = held.read(third, "test")
    assert c[3][0].cells[0] is b[3][1].cells[0]

    def request(blocks: list, runs: list, arrays: list) -> bytes:
        return wire.encode({"tables": ["t"], "blocks": blocks, "runs": runs, "forget": []}, arrays)

    def run(layout: list, numbers: list, table: int = 0) -> tuple[list, list]:  # one item of `layout`
        arrays = [
            np.array([table], np.int32),
            np.ones(1),
            np.array([numbers]),
            np.ones(1, np.int32),
            np.ones(1, np.uint64),
        ]
        return [[layout, 0]], arrays

    refused = {
        "names cell 0; the stream does not hold it": request([], *run([[False, 1]], [0])),
        "is already held": request([[0, 1]], [], [np.array([1], np.int64), np.zeros([1, 2])]),
        "with 1 cell if squeezed": request([], *run([[True, 2]], [1, 2])),
        "must name one of its 1 tables": request([], *run([[False, 1]], [1], table=3)),
        "must be i4\\[n\\], f8\\[n\\], i8\\[n, cells\\]": request([], *run([[False, 2]], [1])),
        "needs int64\\[n\\] numbers and n values": request([[0, 1]], [], [np.array([7, 8]), np.zeros([1, 2])]),
    }
    for rule, message in refused.items():
        with pytest.raises(wire.WireError, match=rule):
            held.read(message, "test")
