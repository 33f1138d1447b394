"""The trajectory writer's column model (Reverb's TrajectoryWriter): a column per field, `None` cells, partial
steps, one dtype and shape per column, episodes, and items that wait for the rate limiter without blocking."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

from tfreplay.compat import reverb


def fifo(name="t", max_size=100, limiter=None, signature=None):
    return reverb.Table(
        name,
        reverb.selectors.Fifo(),
        reverb.selectors.Fifo(),
        max_size,
        limiter or reverb.rate_limiters.MinSize(1),
        signature=signature,
    )


def sample_data(client, table="t"):
    return next(client.sample(table, 1, emit_timesteps=False)).data


def test_a_field_first_seen_in_a_later_step_gets_a_column_of_its_own(serve):
    _, client = serve(fifo())
    with client.trajectory_writer(5) as w:
        w.append({"x": np.int64(1)})
        w.append({"y": np.int64(2)})
        history = w.history
        assert len(history["x"]) == len(history["y"]) == 2 and w.episode_steps == 2
        with pytest.raises(ValueError, match=r"column x has steps with no value \(None\)"):
            w.create_item("t", 1.0, history["x"][-1])
        with pytest.raises(ValueError, match=r"column y has steps with no value \(None\)"):
            w.create_item("t", 1.0, history["y"][:])
        w.create_item("t", 1.0, {"x": history["x"][0], "y": history["y"][1]})
    assert [int(v) for v in sample_data(client)] == [1, 2]


def test_a_step_may_leave_fields_out_and_nested_fields_keep_their_columns(serve):
    _, client = serve(fifo())
    with client.trajectory_writer(5) as w:
        w.append({"a": np.int64(1), "c": {"d": np.int64(10)}})
        w.append({"a": np.int64(2), "b": np.int64(20), "c": {"d": np.int64(11)}})
        w.append({"a": np.int64(3)})
        h = w.history
        assert sorted(h) == ["a", "b", "c"]
        w.create_item("t", 1.0, [h["a"][:], h["c"]["d"][:2], h["b"][1]])
        with pytest.raises(ValueError, match=r"column c/d has steps with no value"):
            w.create_item("t", 1.0, h["c"]["d"][-1])
    a, d, b = sample_data(client)
    np.testing.assert_array_equal(a, [1, 2, 3])
    np.testing.assert_array_equal(d, [10, 11])
    assert int(b) == 20


def test_partial_steps_fill_one_step_as_acme_adders_write_them(serve):
    _, client = serve(fifo())
    with client.trajectory_writer(3) as w:
        w.append({"observation": np.float32(0)}, partial_step=True)  # add_first
        assert w.episode_steps == 0 and len(w.history["observation"]) == 1  # an open step is not counted yet
        for t in range(1, 4):  # add(action, next_timestep): close the step, open the next
            w.append({"action": np.int64(t), "reward": np.float32(t / 10)})
            w.append({"observation": np.float32(t)}, partial_step=True)
            h = w.history
            if t >= 2:
                w.create_item("t", 1.0, {k: h[k][-3:-1] for k in ("observation", "action", "reward")})
        with pytest.raises(ValueError, match=r"field observation already has a value in this partial step"):
            w.append({"observation": np.float32(9)}, partial_step=True)
        assert w.episode_steps == 3
    first = sample_data(client)
    np.testing.assert_array_equal(first[0], [1, 2])  # action
    np.testing.assert_array_equal(first[1], [0, 1])  # observation
    np.testing.assert_allclose(first[2], [0.1, 0.2])  # reward


def test_a_column_refuses_a_new_dtype_or_shape_and_the_writer_stays_as_it_was(serve):
    _, client = serve(fifo())
    with client.trajectory_writer(3) as w:
        w.append({"obs": np.zeros([2], np.float32), "r": np.float32(0)})
        with pytest.raises(ValueError, match=r"field obs \(dtype float64, shape \(2,\)\) must keep the dtype"):
            w.append({"obs": np.zeros([2], np.float64), "r": np.float32(1), "new": np.int64(1)})
        with pytest.raises(ValueError, match=r"field obs \(dtype float32, shape \(3,\)\) must keep .* shape \(2,\)"):
            w.append({"obs": np.zeros([3], np.float32), "r": np.float32(1)})
        assert w.episode_steps == 1 and sorted(w.history) == ["obs", "r"]
        w.append({"obs": np.ones([2], np.float32), "r": np.float32(1)})
        w.create_item("t", 1.0, w.history["obs"][:])
    np.testing.assert_array_equal(sample_data(client)[0], [[0, 0], [1, 1]])


def test_end_episode_keeps_the_history_unless_it_clears_the_buffers(serve):
    _, client = serve(fifo())
    with client.trajectory_writer(4) as w:
        w.append(np.int64(1))
        w.append(np.int64(2))
        w.end_episode(clear_buffers=False)
        w.append(np.int64(3))
        assert w.episode_steps == 1 and len(w.history) == 3  # steps of this episode; the history goes on
        w.create_item("t", 1.0, w.history[-3:])  # an item across the two episodes
        w.end_episode()
        assert w.episode_steps == 0
        w.append(np.int64(4))
        with pytest.raises(IndexError, match=r"index \(-2\) out of range for a column of 1 steps"):
            w.history[-2]
    np.testing.assert_array_equal(sample_data(client)[0], [1, 2, 3])


def run_bounded(fn, seconds=10.0):
    """Runs `fn` in a thread; fails the test unless it returns within `seconds` (an old blocking call would
    otherwise hang the test; the fixture's server.stop() then ends it)."""
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (handed back to the test)
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} did not return within {seconds} s"
    if "error" in result:
        raise result["error"]
    return result.get("value")


def test_create_item_on_a_full_table_does_not_wait_and_flush_times_out(serve):
    table = reverb.Table.queue("q", 1)
    _, client = serve(table)
    w = client.trajectory_writer(1)

    def write_two():
        for i in range(2):
            w.append(np.int64(i))
            w.create_item("q", 1.0, w.history[-1])

    run_bounded(write_two)  # the second item waits in the table's queue; create_item returns
    assert table.info.current_size == 1
    with pytest.raises(reverb.DeadlineExceededError, match=r"1 items were not taken in .* within 100 ms"):
        run_bounded(lambda: w.flush(timeout_ms=100))
    with pytest.raises(reverb.DeadlineExceededError, match=r"within 50 ms"):
        run_bounded(lambda: w.end_episode(timeout_ms=50))
    assert w.episode_steps == 0  # the episode ended all the same
    assert int(sample_data(client, "q")[0]) == 0  # a sample makes room: the queued item goes in
    run_bounded(lambda: w.flush(timeout_ms=100))
    assert int(sample_data(client, "q")[0]) == 1


def test_the_legacy_writer_checks_chunk_length_and_max_in_flight_items(serve):
    _, client = serve(fifo())
    with pytest.raises(ValueError, match=r"chunk_length \(3\) must be an integer in \[1, 2\]"):
        client.writer(2, chunk_length=3)
    with pytest.raises(ValueError, match=r"chunk_length \(0\) must be an integer in \[1, 2\]"):
        client.writer(2, chunk_length=0)
    with pytest.raises(ValueError, match=r"max_in_flight_items \(0\) must be an integer >= 1"):
        client.writer(2, max_in_flight_items=0)
    client.writer(2, chunk_length=2, max_in_flight_items=None).close()


def test_the_legacy_writer_makes_multi_step_items_for_a_one_step_signature(serve):
    signature = {"obs": tf.TensorSpec([2], tf.float32)}
    _, client = serve(fifo(signature=signature))
    with client.writer(3) as w:
        for i in range(3):
            w.append({"obs": np.full([2], i, np.float32)})
        w.create_item("t", 3, 1.0)
    steps = next(client.sample("t", 1))
    assert [s.data[0].tolist() for s in steps] == [[0, 0], [1, 1], [2, 2]]


def test_queued_items_go_in_once_each_in_order_as_a_sampler_thread_makes_room(serve):
    limiter = reverb.rate_limiters.SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=3.0)
    table = reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 1000, limiter, max_times_sampled=1)
    _, client = serve(table)
    n, got = 200, []
    sampler = threading.Thread(
        target=lambda: got.extend(int(s.data[0]) for s in client.sample("t", n, emit_timesteps=False))
    )
    sampler.start()
    w = client.trajectory_writer(1)

    def write():
        for i in range(n):
            w.append(np.int64(i))
            w.create_item("t", 1.0, w.history[-1])
        w.flush(timeout_ms=10_000)

    run_bounded(write, 20)
    sampler.join(20)
    assert got == list(range(n))  # every item once, in the order created
    assert table.info.rate_limiter_info.inserts == n


def test_many_alike_steps_keep_their_fields_apart_and_a_changed_nest_is_still_refused(serve):
    # Steps of one structure take a shorter path; what they store, and what a changed structure meets, stay the same.
    _, client = serve(reverb.Table.queue("t", 100))
    with client.trajectory_writer(3) as w:
        for i in range(6):
            w.append({"a": np.int64(i), "b": (np.float32(-i), np.int32(10 * i))})
            w.create_item("t", 1.0, {"a": w.history["a"][-2:], "b": w.history["b"][1][-1]} if i else w.history["a"][-1])
        w.append({"a": np.int64(6), "c": np.int64(60)})  # a new field after many alike steps: its own column
        assert w.history["c"][-1].numpy() == 60 and len(w.history["b"][0]) == 7
        with pytest.raises(ValueError, match="cannot become a nest"):
            w.append({"a": {"nested": np.int64(7)}, "b": (np.float32(0), np.int32(0))})
        w.append({"a": np.int64(8), "b": (np.float32(-8), np.int32(80))})  # the refused step left nothing behind
        assert [c.numpy() for c in (w.history["a"][-1], w.history["b"][1][-1])] == [8, 80]
    drawn = [[np.asarray(x).tolist() for x in s.data] for s in client.sample("t", 6, emit_timesteps=False)]
    assert drawn == [[0], [[0, 1], 10], [[1, 2], 20], [[2, 3], 30], [[3, 4], 40], [[4, 5], 50]]
