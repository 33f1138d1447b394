"""The Ray replay service: exact cross-shard sampling, no lost or doubled inserts, recovery, shutdown.

One local Ray instance (loopback, 2 CPUs) serves the module and is shut
down after it; every test closes its service and is stopped by an alarm if
it runs past its bound.
"""

from __future__ import annotations

import ast
import os
import signal
import sys
import time

import numpy as np
import pytest
import ray
import scipy.stats
import tensorflow as tf

import tfreplay
from tfreplay import distributed
from tfreplay.distributed import ids as service_ids

# Workers cannot import this test module: its functions travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPEC = {"value": tf.TensorSpec([], tf.int64), "obs": tf.TensorSpec([3], tf.float32)}
P_MIN = 1e-6  # a chi-square test fails by chance with at most this probability, whatever the seed


@pytest.fixture(scope="module")
def ray_cluster():
    env = {k: os.environ.get(k, "") for k in ("TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS", "PYTHONPATH")}
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        logging_level="WARNING",
        log_to_driver=False,
        runtime_env={"env_vars": env},
    )
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def time_bound():
    """Fails a test that runs longer than 240 s instead of hanging the suite."""

    def expire(*_):
        raise TimeoutError("test_distributed: a test ran past its 240 s bound")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(240)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# Tests that start services: each takes several seconds (shard processes import TensorFlow).
on_ray = pytest.mark.usefixtures("ray_cluster")


def rows(values) -> dict:
    values = np.asarray(values, np.int64)
    return {"value": values, "obs": np.repeat(values[:, None], 3, axis=1).astype(np.float32)}


def test_ids_carry_shard_and_epoch_and_never_collide():
    buffer_ids = np.arange(0, 1 << 40, (1 << 40) // 7, dtype=np.int64)
    seen = set()
    for shard in (0, 1, 255):
        for epoch in (0, 1, service_ids.MAX_EPOCH):
            encoded = service_ids.encode(buffer_ids, shard, epoch)
            assert (encoded >= 0).all()
            got_shard, got_epoch, got_ids = service_ids.decode(encoded)
            assert (got_shard == shard).all() and (got_epoch == epoch).all()
            np.testing.assert_array_equal(got_ids, buffer_ids)
            seen.update(encoded.tolist())
    assert len(seen) == 3 * 3 * len(buffer_ids)
    with pytest.raises(ValueError, match=r"ids.encode: shard \(256\) must be in \[0, 256\)"):
        service_ids.encode([0], 256, 0)
    with pytest.raises(ValueError, match=r"ids.encode: buffer ids must be in \[0, 2\*\*40\)"):
        service_ids.encode([1 << 40], 0, 0)


def test_sampling_mass_is_what_probabilities_divide_by():
    for rb in (
        tfreplay.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=10, seed=0),
        tfreplay.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=10, seed=0),
    ):
        for t in range(13):  # wrapped around: 10 live items per segment
            rb.add_batch(rows([2 * t, 2 * t + 1]))
        assert int(rb.sampling_mass()) == 20 and int(rb.sampling_mass(num_steps=3)) == 16
        _, info = rb.get_next(4, num_steps=3)
        np.testing.assert_allclose(np.asarray(info.probabilities), 1 / 16, rtol=1e-6)
    episodic = {"value": tf.TensorSpec([], tf.int64), "first": tf.TensorSpec([], tf.bool)}
    rb = tfreplay.PyUniformReplayBuffer(episodic, batch_size=1, max_length=20, within_episodes=True, seed=0)
    for t in range(26):  # episodes of 4 items, wrapped around
        rb.add_batch({"value": np.array([t]), "first": np.array([t % 4 == 0])})
    _, info = rb.get_next(8, num_steps=3)
    np.testing.assert_allclose(info.probabilities, 1 / int(rb.sampling_mass(num_steps=3)), rtol=1e-6)
    rb = tfreplay.PyPrioritizedReplayBuffer(SPEC, 8, alpha=0.5, seed=0)
    rb.add_batch(rows(np.arange(6)))
    rb.update_priorities(np.arange(6), np.array([1.0, 4.0, 9.0, 16.0, 25.0, 36.0]))
    assert rb.sampling_mass() == pytest.approx(21.0) and rb.sampling_mass(num_steps=2) == pytest.approx(15.0)
    items, info = rb.get_next(64)
    np.testing.assert_allclose(info.probabilities, (items["value"] + 1) / 21.0, rtol=1e-6)
    with pytest.raises(ValueError, match=r"sampling_mass: num_steps \(9\) must be at most max_length \(8\)"):
        rb.sampling_mass(num_steps=9)


def test_nothing_outside_the_distributed_package_imports_ray():
    """`import tfreplay` must not import Ray: only `tfreplay/distributed/` and the RL application above it
    (`tfreplay/rl/`, whose collectors feed the service) import it or that package."""
    root = os.path.dirname(tfreplay.__file__)
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            above = [os.path.join(root, "distributed"), os.path.join(root, "rl")]
            if not name.endswith(".py") or any(path.startswith(folder) for folder in above):
                continue
            tree = ast.parse(open(path, encoding="utf-8").read())
            for node in ast.walk(tree):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                bad = [n for n in names if n.split(".")[0] == "ray" or n.startswith("tfreplay.distributed")]
                assert not bad, f"{path} imports {bad}"


def chi_square_p(values: np.ndarray, expected: dict) -> float:
    keys = sorted(expected)
    index = {k: i for i, k in enumerate(keys)}
    observed = np.bincount([index[v] for v in values.tolist()], minlength=len(keys))
    probs = np.array([expected[k] for k in keys])
    return scipy.stats.chisquare(observed, probs / probs.sum() * observed.sum()).pvalue


@ray.remote(num_cpus=0)
def collect(shards, collector_id, num_batches, batch, round_robin, max_in_flight=2):
    client = distributed.ReplayClient(
        shards, collector_id=None if round_robin else collector_id, send_batch_size=7, max_in_flight=max_in_flight
    )
    base = collector_id * 1_000_000
    for b in range(num_batches):
        client.add_batch(rows(base + b * batch + np.arange(batch)))
    client.close()
    return num_batches * batch


@pytest.mark.slow
@on_ray
def test_uniform_service_samples_in_proportion_keeps_concurrent_inserts_and_shuts_down(tmp_path):
    with pytest.raises(ValueError, match=r"start_service: num_shards \(0\) must be an integer in \[1, 256\]"):
        distributed.start_service(tfreplay.PyUniformReplayBuffer, SPEC, 10, num_shards=0)
    with pytest.raises(ValueError, match=r"start_service: buffer_class \(TFUniformReplayBuffer\) must be one of"):
        distributed.start_service(tfreplay.TFUniformReplayBuffer, SPEC, 10)
    with pytest.raises(ValueError, match=r"PyUniformReplayBuffer: capacity \(0\) must be a positive integer"):
        distributed.start_service(tfreplay.PyUniformReplayBuffer, SPEC, 0)
    rb = distributed.start_service(
        tfreplay.PyUniformReplayBuffer, SPEC, 10_000, checkpoint_dir=str(tmp_path), checkpoint_interval=0.2
    )
    try:
        with pytest.raises(ValueError, match=r"get_next: the service is empty; add items before sampling"):
            rb.get_next(4)
        with pytest.raises(TypeError, match=r"add_batch: value"):
            rb.add_batch({"value": np.zeros(2, np.float32), "obs": np.zeros([2, 3], np.float32)})
        assert rb.num_frames() == 0
        with pytest.raises(ValueError, match=r"update_priorities: the shards must be prioritized"):
            rb.update_priorities([0], [1.0])
        small = distributed.ReplayClient(rb.shards, collector_id=1)
        rb_big = distributed.ReplayClient(rb.shards, collector_id=0, send_batch_size=50)
        for start in range(0, 300, 30):
            rb_big.add_batch(rows(np.arange(start, start + 30)))
        small.add_batch(rows(np.arange(1000, 1100)))
        rb_big.close()
        small.close()
        assert rb.num_frames() == 400
        drawn, shards = [], []
        for _ in range(20):
            items, info = rb.get_next(1000)
            np.testing.assert_array_equal(items["obs"][:, 0], items["value"])
            np.testing.assert_allclose(info.probabilities, 1 / 400, rtol=1e-6)
            shard, epoch, _ = service_ids.decode(info.ids)
            assert (epoch == 0).all()
            np.testing.assert_array_equal(shard, (items["value"] >= 1000).astype(int))
            drawn.append(items["value"])
            shards.append(shard)
        drawn = np.concatenate(drawn)
        assert chi_square_p(drawn, {v: 1.0 for v in list(range(300)) + list(range(1000, 1100))}) > P_MIN
        assert scipy.stats.binomtest(int(np.concatenate(shards).sum()), 20_000, 0.25).pvalue > P_MIN

        rb.clear()  # now three writers at once: two collector actors and this process
        tasks = [collect.remote(rb.shards, i, 60, 5, round_robin=i == 1) for i in range(2)]
        mine = distributed.ReplayClient(rb.shards, collector_id=1, send_batch_size=3)
        for b in range(60):
            mine.add_batch(rows(2_000_000 + b * 5 + np.arange(5)))
        mine.close()
        assert sum(ray.get(tasks, timeout=120)) == 600
        everything = rb.gather_all()["value"].reshape(-1)
        expected = np.concatenate([i * 1_000_000 + np.arange(300) for i in range(3)])
        assert len(everything) == 900
        np.testing.assert_array_equal(np.sort(everything), np.sort(expected))
        deadline = time.monotonic() + 30
        while min(s["checkpoints"] for s in rb.stats()["shards"]) < 1:
            assert time.monotonic() < deadline, "no periodic checkpoint within 30 s"
            time.sleep(0.2)
        stats = rb.stats()
        assert sum(s["accepted"] for s in stats["shards"]) == 400 + 900
        assert stats["num_frames"] == 900 and stats["lost"] == 0 and stats["restarts"] == 0
        assert sorted(os.listdir(tmp_path)) == ["shard-0", "shard-1"]
    finally:
        rb.close()
    rb.close()  # twice is fine
    with pytest.raises(tfreplay.BufferClosedError, match=r"get_next: the replay client is closed \(close\(\) was"):
        rb.get_next(1)
    for actor in rb.shards.actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.num_frames.remote(), timeout=30)


@pytest.mark.slow
@on_ray
def test_prioritized_service_is_exact_and_survives_a_shard_kill_with_counted_loss(tmp_path, caplog):
    rb = distributed.start_service(
        tfreplay.PyPrioritizedReplayBuffer, SPEC, 1000, alpha=0.5, checkpoint_dir=str(tmp_path),
        checkpoint_interval=None, seed=1,
    )  # fmt: skip
    try:
        rb.add_batch(rows(np.arange(10)))  # round robin: shard 0
        rb.add_batch(rows(np.arange(10, 16)))  # shard 1
        items, info = rb.get_next(16 * 20)
        values, ids_ = items["value"], info.ids
        first = {int(v): int(i) for v, i in zip(values, ids_)}
        assert set(first) == set(range(16)), "every item is drawn among 320 uniform draws (p of a miss < 1e-8)"
        priority = {v: float(v + 1) for v in range(16)}
        priority[3] = 0.0
        stale = rb.update_priorities(
            np.array([first[v] for v in range(16)]), np.array([priority[v] for v in range(16)])
        )
        assert stale == 0
        total = sum(p**0.5 for p in priority.values())
        drawn = []
        for _ in range(20):
            items, info = rb.get_next(1000)
            expected = np.array([priority[int(v)] ** 0.5 / total for v in items["value"]])
            np.testing.assert_allclose(info.probabilities, expected, rtol=1e-5)
            drawn.append(items["value"])
        drawn = np.concatenate(drawn)
        assert 3 not in drawn
        del priority[3]
        assert chi_square_p(drawn, {v: p**0.5 for v, p in priority.items()}) > P_MIN
        with pytest.raises(ValueError, match=r"update_priorities: priorities \(\[-1.0\] among them\) must be finite"):
            rb.update_priorities(np.array([first[0]]), np.array([-1.0]))
        with pytest.raises(ValueError, match=r"update_priorities: ids \(\[1099511627776000\] among them\) must be"):
            rb.update_priorities(np.array([1000 << 40]), np.array([1.0]))

        rb.clear()  # shard 0 has accepted 10 items so far, shard 1 six
        writer = distributed.ReplayClient(rb.shards, collector_id=0, send_batch_size=10)
        writer.add_batch(rows(np.arange(100)))
        rb.add_batch(rows(np.arange(1000, 1050)))
        rb.add_batch(rows(np.arange(2000, 2050)))  # round robin: shard 1
        writer.flush()
        prefixes = rb.checkpoint()
        assert all(os.path.exists(p + ".index") for p in prefixes)
        writer.add_batch(rows(np.arange(100, 130)))  # acknowledged after the checkpoint: lost in the kill
        writer.flush()
        _, before = rb.get_next(50)
        ray.kill(rb.shards.actors[0], no_restart=False)
        rb.get_next(500)  # no exception while the shard restarts
        while ray.get(rb.shards.actors[0].info.remote((0, 0)), timeout=60)["epoch"] != 1:
            time.sleep(0.1)  # the kill is asynchronous: wait until the restarted shard answers
        writer.add_batch(rows(np.arange(200, 210)))  # its claim tells the shard what it had acknowledged
        writer.flush()
        items, info = rb.get_next(500)
        shard, epoch, _ = service_ids.decode(info.ids)
        assert set(epoch[shard == 0].tolist()) == {1} and set(epoch[shard == 1].tolist()) == {0}
        values = set(rb.gather_all()["value"].reshape(-1).tolist())
        assert values == set(range(100)) | set(range(1000, 1050)) | set(range(2000, 2050)) | set(range(200, 210))
        stats = rb.stats()
        zero = stats["shards"][0]
        assert (zero["epoch"], zero["restored"], zero["lost"]) == (1, 10 + 150, 30)
        assert stats["lost"] == 30 and stats["restarts"] == 1
        old = service_ids.decode(before.ids)[0] == 0
        assert rb.update_priorities(before.ids, np.ones(50)) == old.sum()  # ids from before the restart are stale
        assert any("shard 0 restarted (epoch 1)" in r.getMessage() for r in caplog.records)

        # A second kill before the next checkpoint: both restarts' losses count.
        writer.add_batch(rows(np.arange(300, 320)))  # acknowledged in epoch 1, never checkpointed
        writer.flush()
        ray.kill(rb.shards.actors[0], no_restart=False)
        rb.get_next(500)
        while ray.get(rb.shards.actors[0].info.remote((0, 0)), timeout=60)["epoch"] != 2:
            time.sleep(0.1)
        writer.add_batch(rows(np.arange(400, 410)))
        writer.flush()
        stats = rb.stats()
        zero = stats["shards"][0]
        # Epoch 1 acknowledged 200..209 and 300..319 above the 160 it reloaded, and lost them in the second kill.
        assert (zero["epoch"], zero["restored"], zero["lost"]) == (2, 160, 30 + 30)
        assert stats["lost"] == 60 and stats["restarts"] == 2
    finally:
        rb.close()


@pytest.mark.slow
@on_ray
def test_dataset_keeps_requests_in_flight_and_yields_windows_and_frames():
    rb = distributed.start_service(tfreplay.PyUniformReplayBuffer, SPEC, num_shards=2, batch_size=2, max_length=50)
    try:
        writer = distributed.ReplayClient(rb.shards, collector_id=0)
        for t in range(20):
            writer.add_batch(rows([2 * t, 2 * t + 1]))  # segment s holds s, s + 2, s + 4, ...
        writer.close()
        ds = rb.as_dataset(8, num_steps=3, num_parallel_calls=3)
        for items, info in ds.take(5):
            assert items["value"].shape == (8, 3) and info.ids.shape == (8, 3) and info.probabilities.shape == (8,)
            np.testing.assert_array_equal(np.diff(items["value"].numpy(), axis=1), 2)
            np.testing.assert_allclose(info.probabilities, 1 / (2 * 18), rtol=1e-6)
        ((one, info),) = rb.as_dataset().take(1)
        assert one["obs"].shape == (3,) and info.ids.shape == ()
        steps, info = rb.get_next(4, num_steps=2, time_stacked=False)
        assert len(steps) == 2 and len(info.ids) == 2
        np.testing.assert_array_equal(steps[1]["value"] - steps[0]["value"], 2)
        with pytest.raises(ValueError, match=r"as_dataset: single_deterministic_pass \(True\) must be False"):
            rb.as_dataset(single_deterministic_pass=True)
        with pytest.raises(ValueError, match=r"add_batch: obs has outer \(batch\) dimension 3; it must equal"):
            rb.add_batch(rows([1, 2, 3]))
        assert rb.num_frames() == 40
    finally:
        rb.close()
    spec = tfreplay.frame_data_spec((4, 4))
    frames = distributed.start_service(
        tfreplay.PyFrameReplayBuffer, spec, num_shards=1, batch_size=1, max_length=20, history_len=2
    )
    local = tfreplay.PyFrameReplayBuffer(spec, batch_size=1, max_length=20, history_len=2)
    try:
        writer = distributed.ReplayClient(frames.shards, collector_id=0)
        for t in range(6):
            step = {"frame": np.full([1, 4, 4], t, np.uint8), "first": np.array([t % 3 == 0]),
                    "action": np.zeros(1, np.int32), "reward": np.zeros(1, np.float32),
                    "terminated": np.zeros(1, bool), "truncated": np.zeros(1, bool)}  # fmt: skip
            writer.add_batch(step)
            local.add_batch(step)
        writer.close()
        items, info = frames.get_next(16)
        assert items["observation"].shape == (16, 4, 4, 2)
        np.testing.assert_allclose(info.probabilities, local.get_next(1)[1].probabilities[0], rtol=1e-6)
    finally:
        frames.close()


@pytest.mark.slow
@on_ray
def test_one_rate_limiter_holds_samples_per_insert_across_the_service():
    limiter = tfreplay.SampleToInsertRatio(2.0, 20, (20.0, 100.0), insert_timeout=0, sample_timeout=0)
    with pytest.raises(ValueError, match=r"the rate limiter's error range \(max_diff - min_diff = 80\) must be"):
        distributed.start_service(
            tfreplay.PyUniformReplayBuffer, SPEC, 100, rate_limiter=limiter, client_options={"send_batch_size": 64}
        )
    rb = distributed.start_service(
        tfreplay.PyUniformReplayBuffer, SPEC, 100, rate_limiter=limiter, client_options={"send_batch_size": 5}
    )
    try:
        other = distributed.ReplayClient(rb.shards, collector_id=1, send_batch_size=5)
        for start in range(0, 20, 5):  # round robin here, one shard there: the limiter counts both clients
            rb.add_batch(rows(np.arange(start, start + 5)))
            if start == 5:
                assert rb.num_frames() == 15
                with pytest.raises(tfreplay.RateLimitTimeoutError, match=r"get_next: the rate limiter would wait"):
                    rb.get_next(4)  # fewer than min_size_to_sample (20) items
            other.add_batch(rows(np.arange(100 + start, 105 + start)))
        other.flush()
        assert rb.num_frames() == 40
        rb.get_next(20)  # error = 40 inserts * 2 - 0 samples = 80; 80 - 20 >= min_diff (20)
        rb.get_next(40)
        with pytest.raises(tfreplay.RateLimitTimeoutError, match=r"would wait to admit 1 samples"):
            rb.get_next(1)  # 80 - 60 - 1 < 20
        other.add_batch(rows(np.arange(200, 205)))  # (40 + 5) * 2 - 60 = 30 <= max_diff (100)
        other.flush()
        rb.get_next(10)
        info = rb.stats()["rate_limiter"]
        assert (info["inserts"], info["samples"], info["pending_inserts"]) == (45, 70, 0)
        with pytest.raises(tfreplay.RateLimitTimeoutError, match=r"add_batch: the rate limiter would wait"):
            for start in range(0, 45, 5):  # (45 + 40) * 2 - 70 = 100 fits; the ninth send of 5 rows does not
                other.add_batch(rows(np.arange(300 + start, 305 + start)))
            other.flush()
        assert rb.stats()["rate_limiter"]["inserts"] == 85
        rb.clear()
        assert rb.stats()["rate_limiter"]["inserts"] == 0
    finally:
        rb.close()


@pytest.mark.slow
@on_ray
def test_limited_collectors_and_learner_wait_for_each_other_without_deadlock():
    # Four collectors keep four sends in flight each: their admissions must come in order, or a later send
    # holds the room an earlier one waits for while the shard runs the collector's calls in order.
    limiter = tfreplay.SampleToInsertRatio(8.0, 50, 160.0, sample_timeout=60)
    rb = distributed.start_service(
        tfreplay.PyUniformReplayBuffer, SPEC, 2000, rate_limiter=limiter, client_options={"send_batch_size": 10}
    )
    try:
        tasks = [collect.remote(rb.shards, i, 60, 5, round_robin=False, max_in_flight=4) for i in range(4)]
        elements = iter(rb.as_dataset(8, num_parallel_calls=4))
        # min_diff = 50 * 8 - 160 = 240, max_diff = 560: the last insert needs 1200 * 8 - 560 = 9,040 samples
        # admitted; 1,200 inserts admit at most 1200 * 8 - 240 = 9,360 (with the dataset's read-ahead).
        for _ in range(1140):  # 9,120 samples
            next(elements)
        assert sum(ray.get(tasks, timeout=60)) == 1200
        info = rb.stats()["rate_limiter"]
        assert info["inserts"] == 1200 and info["pending_inserts"] == 0 and 9120 <= info["samples"] <= 9360
    finally:
        rb.close()
