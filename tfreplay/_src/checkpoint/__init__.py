"""Buffer checkpoints: the layout record and its checks (`layout.py`), the NumPy twin's state
(`numpy_state.py`), and the hook that runs once a restore has put every variable in place (`after_restore.py`)."""
