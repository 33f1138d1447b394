"""Pure array code: the NumPy and TF array namespaces every part is written over (`ops.py`), the adapters
of the compiled kernels (`kernels.py`), frame-history stacks (`stacks.py`) and the Python calls put in graphs
(`py_calls.py`, which let the interpreter exit while a dataset prefetches).

They import nothing of tfreplay above `tfreplay.native`: only it and each other.
"""
