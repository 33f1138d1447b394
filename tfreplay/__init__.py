"""tfreplay: TensorFlow-native experience replay.

The public API. Beside it: `tfreplay.transforms`, `tfreplay.samplers`,
`tfreplay.rate_limiting` and `tfreplay.compose` (a new sampler or storage);
`tfreplay.rl` (drivers, agents, training; the `rl` extra), `tfreplay.compat`
(TF-Agents, tensorpack and fastrl adapters) and `tfreplay.distributed` (the
Ray service; the `ray` extra). `import tfreplay` loads none of those extras.
"""

from typing import Any

from tfreplay._src.api import BufferInfo, ReplayBuffer
from tfreplay._src.episodes import EpisodeRule
from tfreplay._src.storage import frame_data_spec
from tfreplay._src.train_loop import TrainLoop
from tfreplay.buffers import (
    EmptyBufferError,
    PyFrameReplayBuffer,
    PyPrioritizedFrameReplayBuffer,
    PyPrioritizedReplayBuffer,
    PyUniformReplayBuffer,
    TFFrameReplayBuffer,
    TFPrioritizedFrameReplayBuffer,
    TFPrioritizedReplayBuffer,
    TFUniformReplayBuffer,
    importance_weights,
)
from tfreplay.rate_limiting import (
    BufferClosedError,
    MinSize,
    RateLimiter,
    RateLimiterInfo,
    RateLimitTimeoutError,
    SampleToInsertRatio,
)
from tfreplay.samplers import PrioritizedSampler, UniformSampler
from tfreplay.transforms import HindsightRelabel, NStepReturns, Sequences, Transform, sequence_priorities

__version__ = "0.1.0"

__all__ = [
    "BufferClosedError",
    "BufferInfo",
    "EmptyBufferError",
    "EpisodeRule",
    "ExpReplay",
    "ExperienceReplay",
    "HindsightRelabel",
    "MinSize",
    "NStepReturns",
    "PrioritizedSampler",
    "PyFrameReplayBuffer",
    "PyPrioritizedFrameReplayBuffer",
    "PyPrioritizedReplayBuffer",
    "PyUniformReplayBuffer",
    "RateLimitTimeoutError",
    "RateLimiter",
    "RateLimiterInfo",
    "ReplayBuffer",
    "SampleToInsertRatio",
    "Sequences",
    "TFFrameReplayBuffer",
    "TFPrioritizedFrameReplayBuffer",
    "TFPrioritizedReplayBuffer",
    "TFUniformReplayBuffer",
    "TrainLoop",
    "Transform",
    "UniformSampler",
    "frame_data_spec",
    "importance_weights",
    "sequence_priorities",
]

# Errors print, and pickle, as the names users catch them by (`tfreplay.EmptyBufferError`), not their private home.
for _name in __all__:
    _value = globals().get(_name)
    if isinstance(_value, type) and issubclass(_value, BaseException):
        _value.__module__ = __name__
del _name, _value

# The seed adapters load on first use: tensorpack's ExpReplay runs gymnasium environments.
_LAZY = {"ExpReplay": "tfreplay.compat.tensorpack", "ExperienceReplay": "tfreplay.compat.fastrl"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfreplay' has no attribute {name!r}")
