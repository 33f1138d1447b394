"""Rate limiters under threads: blocking, wake-ups, timeouts (DeadlineExceededError) and queues."""

from __future__ import annotations

import threading
import time

import pytest
import tensorflow as tf
from reverb_helpers import draw, insert_ints

from tfreplay.compat import reverb


def test_a_sample_waits_for_min_size_and_a_writer_thread_releases_it(serve):
    t = reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(2))
    _, client = serve(t)
    got = []
    sampler = threading.Thread(target=lambda: got.extend(draw(client, "t", 1)))
    sampler.start()
    insert_ints(client, "t", [7])
    time.sleep(0.2)
    assert got == [] and sampler.is_alive()  # one item: below min_size_to_sample
    insert_ints(client, "t", [8])
    sampler.join(5)
    assert got == [7]


def test_a_sample_not_admitted_in_time_raises_deadline_exceeded(serve):
    t = reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1))
    serve(t)
    start = time.monotonic()
    with pytest.raises(reverb.errors.DeadlineExceededError, match="did not admit the sample within 0.2 s"):
        t.sample(timeout=0.2)
    assert 0.15 < time.monotonic() - start < 2
    assert issubclass(reverb.DeadlineExceededError, tf.errors.DeadlineExceededError)


def test_sample_to_insert_ratio_holds_inserts_until_the_learner_samples(serve):
    limiter = reverb.rate_limiters.SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=1, error_buffer=2.0)
    t = reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100, limiter)
    _, client = serve(t)
    insert_ints(client, "t", [0, 1])  # stage 1 (size < 1), then error 2 * 2 = 4 = max_diff
    assert not t.can_insert(1)
    writer = threading.Thread(target=lambda: insert_ints(client, "t", [2]))
    writer.start()
    time.sleep(0.2)
    assert writer.is_alive() and t.info.current_size == 2
    draw(client, "t", 2)  # error 2: room for one insert (2 + 2 <= 4)
    writer.join(5)
    assert t.info.current_size == 3
    info = t.info.rate_limiter_info
    assert (info.inserts, info.samples) == (3, 2)


def test_a_queue_blocks_inserts_when_full_and_samples_when_empty(serve):
    t = reverb.Table.queue("q", 2)
    _, client = serve(t)
    insert_ints(client, "q", [0, 1])
    assert not t.can_insert(1) and t.can_sample(1)
    assert draw(client, "q", 2) == [0, 1]
    assert not t.can_sample(1) and t.info.current_size == 0
    with pytest.raises(reverb.DeadlineExceededError):
        t.sample(timeout=0.05)


def test_a_stack_draws_the_newest_first(serve):
    _, client = serve(reverb.Table.stack("s", 3))
    insert_ints(client, "s", [0, 1, 2])
    assert draw(client, "s", 3) == [2, 1, 0]


def test_stopping_the_server_ends_a_waiting_sample(serve):
    t = reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1))
    server, client = serve(t)
    errors = []

    def wait():
        try:
            draw(client, "t", 1)
        except reverb.ReverbError as e:
            errors.append(e)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.1)
    server.stop()
    thread.join(5)
    assert not thread.is_alive() and "server was stopped" in str(errors[0])


def test_reset_clears_items_and_counts(serve):
    t = reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1))
    _, client = serve(t)
    insert_ints(client, "t", [0, 1])
    draw(client, "t", 1)
    client.reset("t")
    info = t.info
    assert info.current_size == 0 and (info.rate_limiter_info.inserts, info.rate_limiter_info.samples) == (0, 0)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: reverb.rate_limiters.MinSize(0), r"min_size_to_sample \(0\) must be a positive integer"),
        (lambda: reverb.rate_limiters.SampleToInsertRatio(1.0, 10, 0.5), r"error_buffer \(0.5\) gives a range 1 wide"),
        (
            lambda: reverb.rate_limiters.SampleToInsertRatio(0.0, 10, 5.0),
            r"samples_per_insert \(0.0\) must be a positive",
        ),
        (lambda: reverb.rate_limiters.SampleToInsertRatio(1.0, 1, (5.0, 9.0)), r"puts min_diff \(5\) above"),
    ],
)
def test_bad_limiter_settings_are_refused_by_name(make, match):
    with pytest.raises(ValueError, match=match):
        make()
