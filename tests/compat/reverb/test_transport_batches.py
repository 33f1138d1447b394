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
