"""Offline RL datasets in and out of tfreplay buffers: RLDS (the `datasets` extra) and Minari (the `minari` extra).

* `load_rlds(source, buffer)` streams the episodes of an RLDS `tf.data.Dataset`
  or TFDS directory into any buffer, whole episodes per segment.
* `save_rlds(buffer, directory)` writes a buffer's stored episodes as an RLDS
  dataset that `tfds.builder_from_directory` reads; `RldsWriter` is an
  observer that writes a collector's episodes as they end.
* `load_minari(dataset, buffer)` streams a local Minari dataset (hdf5, arrow or
  parquet; a `MinariDataset`, an id or a path) into any buffer the same way;
  `save_minari(buffer, dataset_id)` writes a buffer's episodes as a Minari
  dataset that `minari.load_dataset` reads, with raw arrays.

RLDS is read and written in its two published step conventions, `"envlogger"`
and `"d4rl"` (see `load_rlds`); a Minari episode has the envlogger layout. The
dataset libraries (`tensorflow_datasets`, `minari`) are imported only by the
functions that need them.
"""

from tfreplay.datasets._fill import LoadInfo
from tfreplay.datasets._load import load_rlds
from tfreplay.datasets._minari import load_minari
from tfreplay.datasets._minari_save import save_minari
from tfreplay.datasets._save import RldsWriter, save_rlds

__all__ = ["LoadInfo", "RldsWriter", "load_minari", "load_rlds", "save_minari", "save_rlds"]
