"""Rate limiting: Reverb's samples-per-insert rule, in process, for one buffer (`rate_limiter=`).

`MinSize` makes samples wait until the buffer holds enough items;
`SampleToInsertRatio` keeps the learner's samples near a ratio to the
collectors' inserts; `RateLimiter` takes the rule's parameters directly.
`close()` on the buffer ends every wait (`BufferClosedError`); a call not
admitted in time raises `RateLimitTimeoutError`. `RateLimiterInfo` is a
snapshot of a limiter's counts (`limiter.info()`).
"""

from tfreplay._src.rate_limiting.limiter import (
    BufferClosedError,
    MinSize,
    RateLimiter,
    RateLimiterInfo,
    RateLimitTimeoutError,
    SampleToInsertRatio,
)

__all__ = [
    "BufferClosedError",
    "MinSize",
    "RateLimitTimeoutError",
    "RateLimiter",
    "RateLimiterInfo",
    "SampleToInsertRatio",
]
