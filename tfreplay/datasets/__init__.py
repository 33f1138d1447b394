"""RLDS datasets in and out of tfreplay buffers (the `datasets` extra: `tensorflow-datasets`).

* `load_rlds(source, buffer)` streams the episodes of an RLDS `tf.data.Dataset`
  or TFDS directory into any buffer, whole episodes per segment.
* `save_rlds(buffer, directory)` writes a buffer's stored episodes as an RLDS
  dataset that `tfds.builder_from_directory` reads; `RldsWriter` is an
  observer that writes a collector's episodes as they end.

Both read and write the two published step conventions, `"envlogger"` and
`"d4rl"` (see `load_rlds`). `tensorflow_datasets` is imported only by the
functions that need it.
"""

from tfreplay.datasets._load import LoadInfo, load_rlds
from tfreplay.datasets._save import RldsWriter, save_rlds

__all__ = ["LoadInfo", "RldsWriter", "load_rlds", "save_rlds"]
