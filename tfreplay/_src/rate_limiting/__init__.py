"""Rate limiting: the limiter's rule and its counts (`limiter.py`), and the buffer's side of it, the gate
every add and sample passes (`gate.py`).

They import the array namespaces (`arrays/`) and each other, nothing of the buffer's path above them.
"""
