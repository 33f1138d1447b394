"""Where items live: the ring's rows and ids (`ring.py`) and the episode index (`episodes.py`), the math
stated once as small functions over an array namespace.

They import nothing of tfreplay but each other.
"""
