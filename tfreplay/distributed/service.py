"""Starting the replay service: `num_shards` shard actors and the client that owns them."""

from __future__ import annotations

import tempfile
import uuid
from typing import Any

import ray

from tfreplay.distributed import ids
from tfreplay.distributed.client import ReplayClient, Shards
from tfreplay.distributed.limiter import ServiceLimiter, limiter_config
from tfreplay.distributed.shard import BUFFER_CLASSES, Shard


def start_service(
    buffer_class: Any,
    *args: Any,
    num_shards: int = 2,
    checkpoint_dir: str | None = None,
    checkpoint_interval: float | None = 60.0,
    resume: bool = False,
    max_restarts: int = -1,
    actor_options: dict | None = None,
    client_options: dict | None = None,
    rate_limiter: Any = None,
    **kwargs: Any,
) -> ReplayClient:
    """Starts a sharded replay service on the connected Ray cluster; returns the client that owns it.

    Every shard is `buffer_class(*args, **kwargs)`: each holds that capacity,
    so the service holds `num_shards` times as much. A `seed` keyword gives
    shard `i` the seed `seed + i` (and the client `seed`).

    Args:
      buffer_class: `PyUniformReplayBuffer`, `PyPrioritizedReplayBuffer` or
        `PyFrameReplayBuffer` (the class or its name).
      num_shards: how many shard actors (1 to 256).
      checkpoint_dir: where shards checkpoint (`shard-<i>/`); on a cluster, a
        folder every node sees. None: no checkpoints (a restarted shard
        starts empty; its epoch is kept in a temporary folder of this node).
      checkpoint_interval: seconds between a shard's checkpoints.
      resume: reload the checkpoints found in `checkpoint_dir` (else a fresh
        start wipes them).
      max_restarts: how often Ray restarts a dead shard (-1: always).
      actor_options: more `ray.remote` options of the shards (default
        `num_cpus=0`: shards are mostly idle between calls); e.g.
        `{"num_cpus": 1, "memory": 8 << 30}` on a cluster.
      client_options: keywords of the owning `ReplayClient`.
      rate_limiter: a `MinSize` or `SampleToInsertRatio` for the whole
        service (not per shard): one limiter actor admits every client's
        sends and sample requests (see `limiter.py`).

    Raises:
      ValueError, TypeError: bad arguments, checked here by building one
      buffer (NumPy zero pages: cheap) before any actor starts.
    """
    name = buffer_class if isinstance(buffer_class, str) else getattr(buffer_class, "__name__", repr(buffer_class))
    if name not in BUFFER_CLASSES:
        raise ValueError(f"start_service: buffer_class ({name}) must be one of {sorted(BUFFER_CLASSES)}.")
    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or not 1 <= num_shards <= ids.MAX_SHARDS:
        raise ValueError(f"start_service: num_shards ({num_shards!r}) must be an integer in [1, {ids.MAX_SHARDS}].")
    if resume and checkpoint_dir is None:
        raise ValueError("start_service: resume (True) needs a checkpoint_dir to resume from.")
    if not ray.is_initialized():
        raise ValueError("start_service: Ray must be initialized first: ray.init() (or ray.init(address=...)).")
    seed = kwargs.get("seed")
    probe = BUFFER_CLASSES[name](*args, **kwargs)
    description = Shard.describe_buffer(probe, kwargs.get("batch_size") is not None)
    config = None if rate_limiter is None else limiter_config(rate_limiter)
    client_options = {"seed": seed, **(client_options or {})}
    limiter, limiter_name = None, None
    if config is not None:
        insert_size = client_options.get("send_batch_size", 64)
        ServiceLimiter(config, probe.capacity * num_shards, insert_size)  # refuses a rule these sizes cannot meet
        limiter_name = f"tfreplay-limiter-{uuid.uuid4().hex}"  # shards look it up by name: no handle to restore
        remote_limiter = ray.remote(ServiceLimiter).options(num_cpus=0, max_concurrency=1000, name=limiter_name)
        limiter = remote_limiter.remote(config, probe.capacity * num_shards, insert_size)
    state_dir = checkpoint_dir or tempfile.mkdtemp(prefix="tfreplay-service-")
    options = {"num_cpus": 0, **(actor_options or {})}
    remote = ray.remote(Shard).options(max_restarts=max_restarts, max_task_retries=-1, **options)
    actors: list[Any] = []
    for i in range(num_shards):
        shard_kwargs = dict(kwargs, seed=None if seed is None else seed + i)
        interval = checkpoint_interval if checkpoint_dir else None
        actors.append(remote.remote(i, name, args, shard_kwargs, state_dir, interval, resume, limiter=limiter_name))
    ray.get([actor.num_frames.remote() for actor in actors])  # every shard is up (or failed) before we return
    return ReplayClient(Shards(actors, description, limiter), owner=True, **client_options)
