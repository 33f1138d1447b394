"""One rate limiter for the whole service (samples per insert across every collector and learner).

`start_service(..., rate_limiter=SampleToInsertRatio(...))` does not give
each shard a limiter: it starts one `ServiceLimiter` actor holding the same
rule (`tfreplay/_src/rate_limiting/limiter.py`) over the service's capacity. A client asks it
to admit each send of rows, or each sample request, *as a task*: the
admission's ObjectRef is an argument of the shard call, so Ray runs the
call once the limiter admitted it, and the client never blocks on an extra
round trip; only `max_in_flight` admissions wait at once, which is what
holds a collector back. A client's admissions are chained (each waits for
its previous one), so they are given in the order of its calls. The shard settles an insert once its rows are
written; a sample request a shard could not serve is given back. Waiting
happens in the actor's threads (`max_concurrency`), so one waiting call
does not hold up the others.

Like the in-process limiter: timeouts raise `RateLimitTimeoutError`,
`close()` of the owning client ends every wait with `BufferClosedError`,
`clear()` starts the counts again. The limiter actor is not restarted if it
dies (its counts would be wrong).
"""

from __future__ import annotations

from typing import Any

from tfreplay._src.rate_limiting.limiter import RateLimiter

_WHERE = {"insert": "add_batch", "sample": "get_next"}


def limiter_config(limiter: Any) -> dict:
    """The rule of a `RateLimiter` (`MinSize`, `SampleToInsertRatio`) as plain numbers, to rebuild it in an actor."""
    if not isinstance(limiter, RateLimiter):
        raise TypeError(
            f"start_service: rate_limiter ({limiter!r}) must be a RateLimiter (MinSize, SampleToInsertRatio) or None."
        )
    return {
        "samples_per_insert": limiter.samples_per_insert,
        "min_size_to_sample": limiter.min_size_to_sample,
        "min_diff": limiter.min_diff,
        "max_diff": limiter.max_diff,
        "insert_timeout": limiter.insert_timeout,
        "sample_timeout": limiter.sample_timeout,
    }


class ServiceLimiter:
    """The service's limiter, run as a threaded Ray actor.

    Args:
      config: `limiter_config(...)` of the rule.
      capacity: the service's capacity (the limiter's `size` never exceeds it).
      insert_size: rows of a typical send (checked against the error range).
    """

    def __init__(self, config: dict, capacity: int, insert_size: int):
        self._limiter = RateLimiter(**config)
        self._limiter._bind("replay service", capacity, insert_size)

    def admit(self, side: str, n: int, after: Any = None) -> bool:
        """Waits until `n` inserts or samples may go (raises on timeout or close).

        `after` is the client's previous admission on that side: Ray runs this one once that one is
        given, so a client's admissions come in the order of its calls. (Out of order, a later send
        could hold the room its earlier send waits for, while the shard runs that client's calls in
        order: neither would ever run.)
        """
        timeout = self._limiter.insert_timeout if side == "insert" else self._limiter.sample_timeout
        return self._limiter._admit(_WHERE[side], side, int(n), timeout)

    def settle(self, side: str, n: int, ok: bool) -> None:
        """Commits `n` written inserts, or gives back a failed call's items."""
        self._limiter._settle(side, int(n), ok)

    def info(self) -> dict:
        return self._limiter.info()._asdict()

    def reset(self) -> None:
        self._limiter._reset()

    def close(self) -> None:
        self._limiter._close()
