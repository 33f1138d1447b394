"""tfreplay: TensorFlow-native experience replay.

The public API; everything else is an implementation detail.
"""

from tfreplay.experience_replay import ExperienceReplay
from tfreplay.expreplay import ExpReplay
from tfreplay.frames import frame_data_spec
from tfreplay.frames_py import PyFrameReplayBuffer
from tfreplay.frames_tf import TFFrameReplayBuffer
from tfreplay.replay_buffer import BufferInfo, ReplayBuffer
from tfreplay.uniform_py import PyUniformReplayBuffer
from tfreplay.uniform_tf import TFUniformReplayBuffer

__version__ = "0.1.0"

__all__ = [
    "BufferInfo",
    "ExpReplay",
    "ExperienceReplay",
    "PyFrameReplayBuffer",
    "PyUniformReplayBuffer",
    "ReplayBuffer",
    "TFFrameReplayBuffer",
    "TFUniformReplayBuffer",
    "frame_data_spec",
]
