"""Pure array code: the NumPy and TF array namespaces every part is written over (`ops.py`), the adapters
of the compiled kernels (`kernels.py`) and frame-history stacks (`stacks.py`).

They import nothing of tfreplay above `tfreplay.native`: only it and each other.
"""
