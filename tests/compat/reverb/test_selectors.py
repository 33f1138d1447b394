"""Selectors: the orders of Fifo, Lifo and the heaps; Uniform and Prioritized by chi-square; max_times_sampled."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from reverb_helpers import draw, insert_ints
from scipy import stats

from tfreplay.compat import reverb


def table(name, sampler, remover=None, max_size=100, **kwargs):
    return reverb.Table(
        name, sampler, remover or reverb.selectors.Fifo(), max_size, reverb.rate_limiters.MinSize(1), **kwargs
    )


@pytest.mark.parametrize(
    "sampler, expected",
    [(reverb.selectors.Fifo(), [0, 1, 2, 3]), (reverb.selectors.Lifo(), [3, 2, 1, 0])],
)
def test_fifo_and_lifo_draw_in_insertion_order_once_each(serve, sampler, expected):
    _, client = serve(table("t", sampler, max_times_sampled=1))
    insert_ints(client, "t", [0, 1, 2, 3])
    assert draw(client, "t", 4) == expected


def test_heaps_draw_by_priority_ties_to_the_first_inserted(serve):
    priorities = [1.0, 1.0, 0.5, 3.0, 0.5]
    _, client = serve(
        table("min", reverb.selectors.MinHeap(), max_times_sampled=1),
        table("max", reverb.selectors.MaxHeap(), max_times_sampled=1),
    )
    insert_ints(client, "min", range(5), priorities)
    insert_ints(client, "max", range(5), priorities)
    assert draw(client, "min", 5) == [2, 4, 0, 1, 3]
    assert draw(client, "max", 5) == [3, 0, 1, 2, 4]


def test_a_heap_follows_priority_updates(serve):
    _, client = serve(table("t", reverb.selectors.MinHeap()))
    insert_ints(client, "t", range(3), [1.0, 2.0, 3.0])
    key = next(client.sample("t", 1, emit_timesteps=False)).info.key
    client.mutate_priorities("t", updates={key: 10.0})
    assert draw(client, "t", 1) == [1]


# The tables draw from the operating system's entropy (unseeded), so a fair selector fails a test at this floor once
# in a million runs; one that draws an item 15% too often (chi-square about 45 over 14,000 draws) is below it.
P_FLOOR = 1e-6


def chi_square_p(counts, probabilities) -> float:
    expected = np.asarray(probabilities) / np.sum(probabilities) * np.sum(counts)
    return stats.chisquare(counts, expected).pvalue


@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0, 2.0])
def test_prioritized_draws_in_proportion_to_priority_to_the_exponent(serve, exponent):
    priorities = np.array([0.5, 1.0, 2.0, 4.0, 0.25])
    _, client = serve(table("t", reverb.selectors.Prioritized(exponent)))
    insert_ints(client, "t", range(5), list(priorities))
    samples = list(client.sample("t", 20000, emit_timesteps=False))
    counts = np.bincount([int(s.data[0]) for s in samples], minlength=5)
    mass = priorities**exponent
    assert chi_square_p(counts, mass) > P_FLOOR
    reported = {int(s.data[0]): s.info.probability for s in samples[:200]}
    for value, probability in reported.items():
        assert probability == pytest.approx(mass[value] / mass.sum())


def test_uniform_draws_each_item_alike_and_reports_one_over_size(serve):
    _, client = serve(table("t", reverb.selectors.Uniform()))
    insert_ints(client, "t", range(7))
    samples = list(client.sample("t", 14000, emit_timesteps=False))
    counts = np.bincount([int(s.data[0]) for s in samples], minlength=7)
    assert chi_square_p(counts, np.ones(7)) > P_FLOOR
    assert all(s.info.probability == pytest.approx(1 / 7) for s in samples)


def test_a_priority_of_zero_is_never_drawn_while_others_are_positive(serve):
    _, client = serve(table("t", reverb.selectors.Prioritized(1.0)))
    insert_ints(client, "t", range(3), [0.0, 1.0, 1.0])
    assert 0 not in draw(client, "t", 500)


def test_a_full_table_removes_by_its_remover(serve):
    _, client = serve(
        table("heap", reverb.selectors.Fifo(), reverb.selectors.MinHeap(), max_size=3, max_times_sampled=1),
        table("fifo", reverb.selectors.Fifo(), reverb.selectors.Fifo(), max_size=3, max_times_sampled=1),
    )
    insert_ints(client, "heap", range(4), [5.0, 1.0, 3.0, 4.0])
    insert_ints(client, "fifo", range(4))
    assert draw(client, "heap", 3) == [0, 2, 3]  # 1, the lowest priority, made room for 3
    assert draw(client, "fifo", 3) == [1, 2, 3]  # 0, the oldest, made room for 3


def test_max_times_sampled_removes_an_item_after_that_many_draws(serve):
    t = table("t", reverb.selectors.Uniform(), max_times_sampled=4)
    _, client = serve(t)
    insert_ints(client, "t", range(3))
    counts = np.bincount(draw(client, "t", 12), minlength=3)
    assert counts.tolist() == [4, 4, 4]
    assert t.info.current_size == 0 and not t.can_sample(1)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: reverb.selectors.Prioritized(-1.0), r"priority_exponent \(-1.0\) must be a non-negative number"),
        (lambda: table("", reverb.selectors.Uniform()), r"name \(''\) must be a non-empty string"),
        (lambda: table("t", reverb.selectors.Uniform(), max_size=0), r"max_size \(0\) must be a positive integer"),
    ],
)
def test_bad_settings_are_refused_by_name(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_sampler_that_is_no_selector_is_a_type_error():
    with pytest.raises(TypeError, match=r"sampler \('uniform'\) must be one of reverb.selectors"):
        reverb.Table("t", "uniform", reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1))


def test_a_negative_priority_is_refused_and_leaves_the_table_as_it_was(serve):
    t = table("t", reverb.selectors.Prioritized(1.0))
    _, client = serve(t)
    insert_ints(client, "t", [0])
    with pytest.raises(ValueError, match=r"priority \(-1.0\) must be a finite number >= 0"):
        insert_ints(client, "t", [1], [-1.0])
    assert t.info.current_size == 1


@pytest.mark.parametrize("client_kind", ["Client", "TFClient"])
def test_an_insert_into_two_tables_with_one_bad_priority_changes_neither(serve, client_kind):
    first, second = table("a", reverb.selectors.Uniform()), table("b", reverb.selectors.Uniform())
    server, client = serve(first, second)
    with pytest.raises(ValueError, match=r"\(table 'b'\): priority \(-1.0\) must be a finite number >= 0"):
        if client_kind == "Client":
            client.insert(np.int64(7), {"a": 1.0, "b": -1.0})
        else:
            reverb.TFClient(f"localhost:{server.port}").insert(
                [np.int64(7)], tf.constant(["a", "b"]), tf.constant([1.0, -1.0], tf.float64)
            )
    assert (first.info.current_size, second.info.current_size) == (0, 0)
    client.insert(np.int64(7), {"a": 1.0, "b": 2.0})  # the same call with good priorities goes into both
    assert (first.info.current_size, second.info.current_size) == (1, 1)
