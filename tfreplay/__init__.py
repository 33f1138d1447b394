"""tfreplay: TensorFlow-native experience replay.

The public API; everything else is an implementation detail.
"""

from tfreplay.buffers import (
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
from tfreplay.core.api import BufferInfo, ReplayBuffer
from tfreplay.core.episodes import EpisodeRule
from tfreplay.core.rate_limiter import (
    BufferClosedError,
    MinSize,
    RateLimiter,
    RateLimiterInfo,
    RateLimitTimeoutError,
    SampleToInsertRatio,
)
from tfreplay.core.samplers.prioritized import PrioritizedSampler
from tfreplay.core.samplers.uniform import UniformSampler
from tfreplay.core.storage import frame_data_spec
from tfreplay.experience_replay import ExperienceReplay
from tfreplay.expreplay import ExpReplay
from tfreplay.transforms import NStepReturns, Sequences, Transform, sequence_priorities

__version__ = "0.1.0"

__all__ = [
    "BufferClosedError",
    "BufferInfo",
    "EpisodeRule",
    "ExpReplay",
    "ExperienceReplay",
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
    "Transform",
    "UniformSampler",
    "frame_data_spec",
    "importance_weights",
    "sequence_priorities",
]
