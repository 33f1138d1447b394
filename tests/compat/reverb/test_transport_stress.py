"""Several writer processes and a sampling process against one server process: every acknowledged item is stored
once, no item is torn, a killed writer loses only its unflushed items, and a killed server restarted from its
checkpoint serves what it held. Sized by `TFREPLAY_REVERB_STRESS_ITEMS` (items per writer)."""

from __future__ import annotations

import os
import select
import signal
import time

import pytest
from processes import ServerProcess, client_process, end, finish, free_port

from tfreplay.compat import reverb

ITEMS = int(os.environ.get("TFREPLAY_REVERB_STRESS_ITEMS", "150"))
WRITERS = 3
FLUSH_EVERY = 10

WRITER = """
import sys
import numpy as np
from tfreplay.compat import reverb
address, writer, items, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with reverb.Client(address).trajectory_writer(1) as w:
    unflushed = []
    for i in range(items):
        item = writer * 1_000_000 + i
        payload, tag = np.full(256, item, np.int64), np.full((4, 4), item % 251, np.uint8)
        w.append({"id": np.int64(item), "payload": payload, "tag": tag})
        step = {k: v[-1] for k, v in w.history.items()}
        w.create_item("items", 1.0, step)
        w.create_item("log", 1.0, step)
        unflushed.append(item)
        if len(unflushed) == every or i == items - 1:
            w.flush()
            print(" ".join(map(str, unflushed)), flush=True)  # acknowledged: in the tables
            unflushed = []
"""

SAMPLER = """
import sys
from tfreplay.compat import reverb
torn = draws = 0
for sample in reverb.Client(sys.argv[1]).sample("items", int(sys.argv[2]), emit_timesteps=False):
    item, payload, tag = sample.data
    torn += not ((payload == item).all() and (tag == item % 251).all())
    draws += 1
print(draws, torn)
"""


def acknowledged(output: str) -> list[int]:
    return [int(x) for line in output.splitlines() for x in line.split()]


def kill_after_first_ack(process, timeout: float = 120.0) -> str:
    """SIGKILLs `process` once it printed its first acknowledged batch; everything it printed."""
    deadline, first = time.monotonic() + timeout, ""
    while not first and time.monotonic() < deadline and process.poll() is None:
        if select.select([process.stdout], [], [], 1.0)[0]:
            first = process.stdout.readline()
    process.send_signal(signal.SIGKILL)
    rest, _ = process.communicate(timeout=60)
    return first + rest


@pytest.mark.slow
def test_writer_processes_and_a_sampler_against_one_server(tmp_path):
    total = ITEMS * (WRITERS + 1)
    tables = [
        {"name": "items", "max_size": total, "rate_limiter": {"kind": "min_size", "min_size_to_sample": 1}},
        {"name": "log", "sampler": "fifo", "max_size": total, "max_times_sampled": 1},
    ]
    tables[1]["rate_limiter"] = {"kind": "min_size", "min_size_to_sample": 1}
    config = {"port": free_port(), "checkpoint_dir": str(tmp_path / "checkpoints"), "tables": tables}
    server = ServerProcess(config, tmp_path)
    processes = []
    try:
        args = (server.address,)
        writers = [client_process(WRITER, *args, str(w), str(ITEMS), str(FLUSH_EVERY)) for w in range(WRITERS)]
        doomed = client_process(WRITER, *args, str(WRITERS), str(ITEMS), "5")
        sampler = client_process(SAMPLER, *args, str(2 * ITEMS))
        processes = [*writers, doomed, sampler]
        killed_acks = acknowledged(kill_after_first_ack(doomed))
        acks = [acknowledged(finish(w, 600)) for w in writers]
        draws, torn = map(int, finish(sampler, 600).split())
        assert (draws, torn) == (2 * ITEMS, 0)
        client = reverb.Client(server.address)
        client.checkpoint()
    finally:
        for process in processes:
            end(process)
        server.stop(signal.SIGKILL)
    restarted = ServerProcess(config, tmp_path)  # from the checkpoint
    try:
        size = client.server_info(timeout=60)["log"].current_size
        stored = [int(s.data[0]) for s in client.sample("log", size, emit_timesteps=False)]
    finally:
        assert restarted.stop() == 0
    assert len(stored) == len(set(stored))  # each once
    for w, ids in enumerate(acks):
        assert ids == [w * 1_000_000 + i for i in range(ITEMS)]
        assert set(ids) <= set(stored)
    assert killed_acks and set(killed_acks) <= set(stored)  # the killed writer lost only unflushed items
    extra = set(stored) - {i for ids in acks for i in ids} - set(killed_acks)
    assert all(WRITERS * 1_000_000 <= i < WRITERS * 1_000_000 + ITEMS for i in extra)
