"""tfreplay: TensorFlow-native experience replay.

The public API. Beside it: `tfreplay.transforms`, `tfreplay.samplers`,
`tfreplay.rate_limiting` and `tfreplay.compose` (a new sampler or storage);
`tfreplay.rl` (drivers, agents, training; the `rl` extra), `tfreplay.compat`
(TF-Agents, tensorpack and fastrl adapters) and `tfreplay.distributed` (the
Ray service; the `ray` extra). `import tfreplay` loads none of those extras, nor TensorFlow itself:
each public name (and each submodule) loads on first use, so a command line built on tfreplay can
answer `--help` before TensorFlow starts.
"""

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time each name loads on first use (`__getattr__` below)
    from tfreplay._src.api import BufferInfo, ReplayBuffer
    from tfreplay._src.index.episodes import EpisodeRule
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

# Where each public name lives (the seed adapters too: tensorpack's ExpReplay runs gymnasium environments).
_LAZY = {
    **dict.fromkeys(("BufferInfo", "ReplayBuffer"), "tfreplay._src.api"),
    "EpisodeRule": "tfreplay._src.index.episodes",
    "frame_data_spec": "tfreplay._src.storage",
    "TrainLoop": "tfreplay._src.train_loop",
    **dict.fromkeys(
        (
            "EmptyBufferError",
            "PyFrameReplayBuffer",
            "PyPrioritizedFrameReplayBuffer",
            "PyPrioritizedReplayBuffer",
            "PyUniformReplayBuffer",
            "TFFrameReplayBuffer",
            "TFPrioritizedFrameReplayBuffer",
            "TFPrioritizedReplayBuffer",
            "TFUniformReplayBuffer",
            "importance_weights",
        ),
        "tfreplay.buffers",
    ),
    **dict.fromkeys(
        (
            "BufferClosedError",
            "MinSize",
            "RateLimiter",
            "RateLimiterInfo",
            "RateLimitTimeoutError",
            "SampleToInsertRatio",
        ),
        "tfreplay.rate_limiting",
    ),
    **dict.fromkeys(("PrioritizedSampler", "UniformSampler"), "tfreplay.samplers"),
    **dict.fromkeys(
        ("HindsightRelabel", "NStepReturns", "Sequences", "Transform", "sequence_priorities"), "tfreplay.transforms"
    ),
    "ExpReplay": "tfreplay.compat.tensorpack",
    "ExperienceReplay": "tfreplay.compat.fastrl",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # found directly from now on
        return value
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a submodule (`tfreplay.keras`, say)
    raise AttributeError(f"module 'tfreplay' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
