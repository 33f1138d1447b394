"""Reverb's `selectors` (also `item_selectors`): how a table picks the item to sample or to remove.

The engine's selectors (`engine/selectors.py`) under Reverb's module name.
"""

from tfreplay.compat.reverb.engine.selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform

__all__ = ["Fifo", "Lifo", "MaxHeap", "MinHeap", "Prioritized", "Selector", "Uniform"]
