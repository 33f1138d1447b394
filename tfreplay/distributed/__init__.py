"""A sharded replay service on Ray: `num_shards` actors, each a NumPy-twin buffer, behind one client.

    import ray, tfreplay
    from tfreplay import distributed

    ray.init()                                     # or ray.init(address="auto") on a cluster
    rb = distributed.start_service(tfreplay.PyUniformReplayBuffer, spec, 100_000, num_shards=4,
                                   checkpoint_dir="/shared/replay", checkpoint_interval=60)
    rb.add_batch(items)                            # batched on the client, sent asynchronously
    items, info = rb.get_next(64)                  # info.ids carry the shard (see ids.py)
    ds = rb.as_dataset(64, num_parallel_calls=4)   # 4 requests in flight, prefetched
    rb.close()

`rate_limiter=` (a `SampleToInsertRatio` or `MinSize`) limits the whole
service at once (`limiter.py`). Collectors that run drivers in Ray actors
and pull policy weights are an RL application's part: `tfreplay.rl.collectors`.
Needs the `ray` extra; `import tfreplay` never imports Ray.
"""

try:
    import ray  # noqa: F401
except ImportError as err:  # pragma: no cover (the ray extra is part of the test extra)
    raise ImportError(
        "tfreplay.distributed needs Ray: install tfreplay with its ray extra (pip install '.[ray]')."
    ) from err

from tfreplay.distributed import ids
from tfreplay.distributed.client import ReplayClient, Shards
from tfreplay.distributed.service import start_service

__all__ = ["ReplayClient", "Shards", "ids", "start_service"]
