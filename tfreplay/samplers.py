"""Samplers: which stored windows a buffer draws, and with what probability.

`UniformSampler` and `PrioritizedSampler` are the two a public buffer uses.
A new sampler implements the protocol (`Sampler`, bound once per buffer into
a `BoundSampler`, which reads the buffer through a `View`); `SamplerBase`
gives the defaults of a sampler without state or priorities, so a new one
overrides `sample` and `mass`. Pass it to `tfreplay.compose.Buffer`.
"""

from tfreplay._src.samplers import BoundSampler, Sampler, SamplerBase, View
from tfreplay._src.samplers.prioritized import PrioritizedSampler
from tfreplay._src.samplers.uniform import UniformSampler

__all__ = ["BoundSampler", "PrioritizedSampler", "Sampler", "SamplerBase", "UniformSampler", "View"]
