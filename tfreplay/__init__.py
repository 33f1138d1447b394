"""tfreplay: TensorFlow-native experience replay.

The public API; everything else is an implementation detail.
"""

from tfreplay.experience_replay import ExperienceReplay
from tfreplay.replay_buffer import BufferInfo, ReplayBuffer
from tfreplay.uniform import PyUniformReplayBuffer, TFUniformReplayBuffer

__version__ = "0.1.0"

__all__ = [
    "BufferInfo",
    "ExperienceReplay",
    "PyUniformReplayBuffer",
    "ReplayBuffer",
    "TFUniformReplayBuffer",
]
