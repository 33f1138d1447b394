"""Build a buffer from parts: a storage and a sampler, on `tf.Variable`s or NumPy arrays.

Every public buffer is a `Buffer` assembled this way; `TFUniformReplayBuffer`
is `Buffer(spec, TFTwin(scope, device, seed), batch_size=B, max_length=L,
sampler=UniformSampler())`. A new kind of buffer is a new sampler (the
protocol is in `tfreplay.samplers`) or storage passed the same way, in one
small class:

    from tfreplay import compose

    class RecentReplayBuffer(compose.Buffer):
        def __init__(self, data_spec, batch_size, max_length, recent):
            super().__init__(data_spec, compose.TFTwin("recent", seed=0), batch_size=batch_size,
                             max_length=max_length, sampler=RecentSampler(recent))

`compose.NumpyTwin(seed)` puts the same buffer in NumPy arrays. A buffer whose
sampler keeps priorities gets the public method by assignment,
`update_priorities = compose.update_priorities`; a frame buffer's extras are
`compose.FRAME_MEMBERS`. The ring arithmetic a sampler needs is here too
(`live_range`, `locate`, `local_to_rows`, `window_rows`; see their docstrings).
"""

from tfreplay._src.backends.numpy import NumpyTwin
from tfreplay._src.backends.tf import TFTwin
from tfreplay._src.buffer import Buffer
from tfreplay._src.index.ring import live_range, local_to_rows, locate, window_rows
from tfreplay._src.members import FRAME_MEMBERS, update_priorities
from tfreplay._src.storage import FrameStorage, RowStorage, frames, rows

__all__ = [
    "FRAME_MEMBERS",
    "Buffer",
    "FrameStorage",
    "NumpyTwin",
    "RowStorage",
    "TFTwin",
    "frames",
    "live_range",
    "local_to_rows",
    "locate",
    "rows",
    "update_priorities",
    "window_rows",
]
