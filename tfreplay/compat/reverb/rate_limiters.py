"""Reverb's `rate_limiters`: when a table lets an insert or a sample go.

The engine's rate limiters (`engine/rate_limiters.py`) under Reverb's module name.
"""

from tfreplay.compat.reverb.engine.rate_limiters import (
    MinSize,
    Queue,
    RateLimiter,
    RateLimiterInfo,
    SampleToInsertRatio,
    Stack,
)

__all__ = ["MinSize", "Queue", "RateLimiter", "RateLimiterInfo", "SampleToInsertRatio", "Stack"]
