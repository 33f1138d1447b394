"""Transforms: what a sample becomes, computed from windows of items at sample time.

`NStepReturns`, `Sequences` and `HindsightRelabel` (goal relabeling, HER) are
the library's.

`buffer.get_next(sample_batch_size=B, transform=t)` and
`buffer.as_dataset(sample_batch_size=B, transform=t)` draw windows of
`t.num_steps` items with the buffer's own sampler and storage, then return
`t(items, mask, ops)` with `BufferInfo(ids, probabilities)` of each window's
*first* item (`[B]`: a window's priority is its first item's, so
`update_priorities(info.ids, ...)` works as usual). It runs in the graph (TF
buffers: eagerly, in `tf.function`, in `as_dataset`) or in NumPy (the NumPy
twins), through the same lines.

The interface, all a new transform needs (one class):

* `num_steps`: the window length the sampler draws.
* `padded`: False for *strict* windows, all `num_steps` items real steps of
  one episode; True for *padded* windows, which may run past their episode's
  end (a start is drawable when its window is complete or its episode ended
  inside it at a stored item; never past the write head of an unfinished
  episode). Items after the end are zeros and `mask` is False there.
* `output_spec(item_spec)`: the spec of one output (no batch axis) for a
  buffer whose sampled item has `item_spec`; raises on items it cannot use.
* `__call__(items, mask, ops)`: `items` time-stacked `[B, T, ...]`, `mask`
  `[B, T]` bool (True on the real steps of the first item's episode; always
  True for strict windows), `ops` the twin's array namespace (`NUMPY_OPS`
  or `TF_OPS`, in `tfreplay/_src/arrays/ops.py`); returns a batch of
  outputs `[B, ...]`. Steps where `mask` is False hold whatever their rows
  hold (the next episode, or stale rows past the write head):
  `pad(items, mask, ops)` zeroes them, for transforms that return them.
* `steps(item_spec)` (optional): the top-level fields `__call__` reads at
  one step only, `"first"` (the window's first item) or `"last"` (its last
  real one): the buffer reads those there alone and passes them `[B, ...]`.
  Reading less is faster; by default every field comes whole.
* `lookups(item_spec)` and `choose(span, uniform, ops)` (optional): leaf
  paths read at one more step of each window's episode (`HindsightRelabel`'s
  achieved goals). `choose` gets a `Span` (stored items of the first item's
  episode before and after it, and whether its last item is stored) and a
  uniform random source, and returns `[B]` offsets from the first item with
  a `[B]` bool `use`; `__call__` then gets a fourth argument, a
  `Lookup(values, use)`. Such transforms need a row buffer with episode
  boundaries.

On a buffer whose items mark episode boundaries (`step_type`, `first`,
`terminated`, `truncated`, or an `EpisodeRule`) windows follow episodes
whatever the buffer's `within_episodes`; without boundaries a segment is one
endless episode, so every window is `num_steps` consecutive items that do not
cross the write head.
"""

from tfreplay._src.transforms.base import Lookup as Lookup
from tfreplay._src.transforms.base import Span as Span
from tfreplay._src.transforms.base import Transform as Transform
from tfreplay._src.transforms.base import Window as Window
from tfreplay._src.transforms.base import pad as pad
from tfreplay._src.transforms.hindsight import HindsightRelabel as HindsightRelabel
from tfreplay._src.transforms.n_step import NStepReturns as NStepReturns
from tfreplay._src.transforms.sequences import Sequences as Sequences
from tfreplay._src.transforms.sequences import sequence_priorities as sequence_priorities
