"""Tables as Reverb's: keys of their own, episode counts, priorities checked before anything changes, bounded
draws per call, and checkpoints loaded whole or not at all."""

from __future__ import annotations

import json
import math
import os
import pathlib
import random
import threading

import numpy as np
import pytest
import tensorflow as tf
from reverb_helpers import insert_ints

from tfreplay.compat import reverb


def table(name="t", sampler=None, remover=None, max_size=100, max_times_sampled=0):
    return reverb.Table(
        name,
        sampler or reverb.selectors.Fifo(),
        remover or reverb.selectors.Fifo(),
        max_size,
        reverb.rate_limiters.MinSize(1),
        max_times_sampled=max_times_sampled,
    )


def test_item_keys_do_not_follow_pythons_global_random(serve):
    t = table()
    _, client = serve(t)
    for _ in range(3):
        random.seed(0)  # user code seeding between episodes (keras.utils.set_random_seed does)
        with client.trajectory_writer(1) as w:
            for i in range(5):
                w.append(np.int64(i))
                w.create_item("t", 1.0, w.history[-1])
        random.seed(0)
        client.insert(np.int64(9), {"t": 1.0})
    assert t.info.current_size == 18


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_writer_process_draws_keys_of_its_own():
    # Collectors forked from one parent (multiprocessing's default on Linux) must not repeat each other's keys.
    from tfreplay.compat.reverb.engine.items import new_key

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child only draws keys and leaves
        os.write(write, json.dumps([new_key() for _ in range(4)]).encode())
        os._exit(0)
    os.close(write)
    theirs = json.loads(os.read(read, 1 << 16))
    os.close(read)
    os.waitpid(child, 0)
    assert not set(theirs) & {new_key() for _ in range(4)}


def test_num_episodes_counts_the_episodes_items_cover_and_those_removed(serve):
    t = table(max_size=3)
    _, client = serve(t)
    with client.trajectory_writer(2) as w:
        for episode in range(2):
            for i in range(2):
                w.append(np.int64(10 * episode + i))
                w.create_item("t", 1.0, w.history[-1])
            w.end_episode()
    info = t.info  # the first item was removed (max_size 3): episode 0 still has one
    assert (info.current_size, info.num_episodes, info.num_deleted_episodes) == (3, 2, 0)
    client.insert(np.int64(7), {"t": 1.0})  # an insert is an episode of its own; episode 0's last item goes
    info = client.server_info()["t"]
    assert (info.num_episodes, info.num_deleted_episodes) == (2, 1)


def prioritized_remover(name="t"):
    return table(name, remover=reverb.selectors.Prioritized(2.0))


def test_a_priority_whose_power_overflows_is_refused_before_the_item_goes_in(serve):
    t = prioritized_remover()
    _, client = serve(t)
    message = r"priority \(1e\+200\) must be small enough that priority \*\* priority_exponent \(2\) is finite"
    with pytest.raises(ValueError, match=message):
        client.insert(np.int64(1), {"t": 1e200})
    with client.trajectory_writer(1) as w:
        w.append(np.int64(1))
        with pytest.raises(ValueError, match=message):
            w.create_item("t", 1e200, w.history[-1])
    info = t.info
    assert (info.current_size, info.rate_limiter_info.inserts) == (0, 0)


def first_priority(client):
    return next(client.sample("t", 1, emit_timesteps=False)).info.priority


@pytest.mark.parametrize(
    "updates, deletes, error",
    [
        ({"first": 5.0, "second": 1e200}, [], r"priority of key \d+ \(1e\+200\) must be small enough"),
        ({"first": 5.0, "second": math.nan}, [], r"priority of key \d+ \(nan\) must be a finite number >= 0"),
        ({"first": 5.0}, ["x"], r"key \('x'\) must be an integer in \[0, 2\*\*64\)"),
        ({"first": 5.0, "y": 1.0}, [], r"key \('y'\) must be an integer"),
    ],
)
def test_mutate_priorities_checks_every_key_and_priority_before_changing_any(serve, updates, deletes, error):
    t = prioritized_remover()
    _, client = serve(t)
    insert_ints(client, "t", [0, 1])
    first, second = (item.key for item in t.snapshot()[0])
    keys = {"first": first, "second": second}
    updates = {keys.get(k, k): v for k, v in updates.items()}
    with pytest.raises(ValueError, match=error):
        client.mutate_priorities("t", updates, deletes)
    assert (first_priority(client), t.info.current_size) == (1.0, 2)


def test_prioritized_with_exponent_zero_draws_positive_priorities_alike_and_zero_ones_never(serve):
    t = table(sampler=reverb.selectors.Prioritized(0.0))  # as dm-reverb 0.14 draws
    _, client = serve(t)
    insert_ints(client, "t", [0, 1, 2], [0.0, 1.0, 5.0])
    draws = list(client.sample("t", 200, emit_timesteps=False))
    assert {int(s.data[0]) for s in draws} == {1, 2}
    assert {s.info.probability for s in draws} == {0.5}


def test_a_huge_max_in_flight_samples_does_not_hold_the_table(serve):
    t = table(sampler=reverb.selectors.Uniform())
    server, client = serve(t)
    insert_ints(client, "t", [0, 1, 2])
    dataset = reverb.TrajectoryDataset(
        f"localhost:{server.port}", "t", tf.int64, tf.TensorShape([]), max_in_flight_samples_per_worker=2**40
    )
    got = []
    reader = threading.Thread(target=lambda: got.extend(int(s.data) for s in dataset.take(5)), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive() and len(got) == 5
    assert t.can_sample(1)  # the lock is free


def saved_checkpoint(serve, tmp_path):
    t = table(max_times_sampled=0)
    checkpointer = reverb.checkpointers.DefaultCheckpointer(str(tmp_path))
    server, client = serve(t, checkpointer=checkpointer)
    insert_ints(client, "t", [0, 1, 2], [1.0, 2.0, 3.0])
    folder = pathlib.Path(client.checkpoint())
    server.stop()
    return folder


def corrupt(record, how):
    rows = record["tables"][0]["items"]
    if how == "nan priority":
        rows[1]["priority"] = math.nan
    elif how == "negative priority":
        rows[1]["priority"] = -1.0
    elif how == "duplicate key":
        rows[2]["key"] = rows[0]["key"]
    elif how == "negative count":
        record["tables"][0]["counts"]["inserts"] = -3
    elif how == "negative times_sampled":
        rows[0]["times_sampled"] = -1
    elif how == "missing cell":
        rows[2]["columns"][0][0] = [99]


@pytest.mark.parametrize(
    "how, error",
    [
        ("nan priority", r"priority \(nan\) must be a finite number >= 0"),
        ("negative priority", r"priority \(-1.0\) must be a finite number >= 0"),
        ("duplicate key", r"key \(\d+\) must be unique"),
        ("negative count", r"counts \(\{.*'inserts': -3.*\}\) must be integers >= 0"),
        ("negative times_sampled", r"times_sampled \(-1\) must be an integer >= 0"),
        ("missing cell", r"cell \(99\) must be one of the checkpoint's 3 cells"),
    ],
)
def test_a_bad_checkpoint_is_refused_and_leaves_the_live_tables_as_they_were(serve, tmp_path, how, error):
    folder = saved_checkpoint(serve, tmp_path)
    path = folder / "tables.json"
    record = json.loads(path.read_text())
    good = dict(json.loads(json.dumps(record["tables"][0])), name="a")
    corrupt(record, how)
    record["tables"].insert(0, good)  # a good table first: it must not be loaded either
    path.write_text(json.dumps(record))
    a, t = table("a"), table("t")
    _, client = serve(a, t)
    insert_ints(client, "a", [7])
    insert_ints(client, "t", [8])
    with pytest.raises(ValueError, match=error):
        reverb.checkpointers.load(folder, {"a": a, "t": t})
    assert (a.info.current_size, t.info.current_size) == (1, 1)
    assert int(next(client.sample("a", 1, emit_timesteps=False)).data[0]) == 7


def test_a_checkpoint_keeps_the_episode_counts(serve, tmp_path):
    checkpointer = reverb.checkpointers.DefaultCheckpointer(str(tmp_path))
    server, client = serve(table(max_size=2), checkpointer=checkpointer)
    for value in range(3):  # three episodes of one item; the first is removed
        client.insert(np.int64(value), {"t": 1.0})
    client.checkpoint()
    server.stop()
    _, restored = serve(table(max_size=2), checkpointer=checkpointer)
    info = restored.server_info()["t"]
    assert (info.current_size, info.num_episodes, info.num_deleted_episodes) == (2, 2, 1)
