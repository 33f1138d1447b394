"""Service-wide item ids: the shard, the shard's epoch and the shard buffer's own id, in one int64.

    id = epoch << 48 | shard << 40 | buffer_id

* bits 0-39: the id the shard's buffer reported (its `BufferInfo.ids`:
  insertion order since that shard's last clear), below 2**40 (1.1e12 items);
* bits 40-47: the shard, below 256;
* bits 48-62: the shard's epoch, 0 when the service starts and one more each
  time the shard actor restarts (up to 32,767 restarts; the sign bit stays 0).

Two live items never share an id: other shards differ in bits 40-47, and a
restarted shard, whose buffer hands out again the ids issued after its last
checkpoint, differs in the epoch, so an update for an item from before the
restart is refused as stale instead of reaching the item that now has its
buffer id. As in one buffer, `clear()` starts every shard's ids again.
Pure NumPy: no Ray needed to read an id.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ITEM_BITS = 40
SHARD_BITS = 8
EPOCH_BITS = 15
MAX_SHARDS = 1 << SHARD_BITS
MAX_EPOCH = (1 << EPOCH_BITS) - 1
_ITEM_MASK = (1 << ITEM_BITS) - 1


def encode(buffer_ids: Any, shard: int, epoch: int) -> np.ndarray:
    """Service ids of a shard's buffer ids (any shape).

    Raises:
      ValueError: a shard, epoch or buffer id outside its bit field.
    """
    buffer_ids = np.asarray(buffer_ids, np.int64)
    if not 0 <= shard < MAX_SHARDS:
        raise ValueError(f"ids.encode: shard ({shard}) must be in [0, {MAX_SHARDS}).")
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"ids.encode: epoch ({epoch}) must be in [0, {MAX_EPOCH}]; the shard restarted too often.")
    if buffer_ids.size and (buffer_ids.min() < 0 or buffer_ids.max() > _ITEM_MASK):
        raise ValueError(f"ids.encode: buffer ids must be in [0, 2**{ITEM_BITS}); clear the service to start again.")
    return (np.int64(epoch) << (ITEM_BITS + SHARD_BITS)) | (np.int64(shard) << ITEM_BITS) | buffer_ids


def decode(ids: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(shard, epoch, buffer_id)` of service ids, each shaped like `ids`."""
    ids = np.asarray(ids, np.int64)
    return (ids >> ITEM_BITS) & (MAX_SHARDS - 1), ids >> (ITEM_BITS + SHARD_BITS), ids & _ITEM_MASK
