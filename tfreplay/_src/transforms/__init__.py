"""Transforms: the interface and its helpers (`base.py`), the library's kinds (`n_step.py`, `sequences.py`,
`hindsight.py`) and the rows a transform's lookups read (`lookups.py`); public in `tfreplay.transforms`.

They import specs, parts, samplers' `View` and the index below them, never the backends or the calls above.
"""
