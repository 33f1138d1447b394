"""`save_rlds` and `RldsWriter`: a buffer's episodes, or a collector's stream, as a TFDS RLDS directory."""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tfreplay.datasets import _steps, _stored
from tfreplay.datasets._load import CONVENTION_KEY

Nest = Any


def save_rlds(
    buffer: Any,
    directory: str | os.PathLike,
    *,
    convention: str | None = None,
    episode_fields: Sequence[str] = (),
    split: str = "train",
    append: bool = False,
    name: str = "tfreplay_rlds",
    max_episodes_per_shard: int = 1000,
) -> int:
    """Writes a buffer's stored episodes as an RLDS dataset that `tfds.builder_from_directory` reads.

    The buffer's items must carry episode boundaries (see `EpisodeRule`) and use
    the `tfreplay.rl.drivers.Transition` names: `observation`, and
    `next_observation` for the `"envlogger"` convention; `terminated` marks
    `is_terminal`; every other field (`action`, `reward`, `discount`, ...) is
    written as a step field of its own name. Only whole episodes are written:
    one whose first item was overwritten, or that has not ended, is left out.
    `load_rlds` on the directory gives the same items in the same episodes.

    Args:
      buffer: a rows buffer (uniform or prioritized, TF or NumPy).
      directory: where to write; it must not hold a dataset unless `append`.
      convention: `"envlogger"` (the default when the spec has `next_observation`) or `"d4rl"`; recorded in
        the dataset's metadata, where `load_rlds(convention="auto")` reads it.
      episode_fields: top-level fields written once per episode (their value at its first item) as episode
        metadata, not per step.
      split: the split to write.
      append: add the episodes as new shards of the dataset already in `directory` (same layout).
      name: the dataset's name.
      max_episodes_per_shard: episodes per file.

    Returns:
      The number of episodes written.

    Raises:
      ValueError: the buffer has no episode boundaries or lacks a field the convention needs, `directory`
        holds a dataset (without `append`) or one of another layout (with it). Nothing is written then.
      TypeError: a frame buffer, or a spec that is not a dict or named tuple.
    """
    where = "save_rlds"
    episodes = _stored.whole_episodes(where, buffer)
    writer = _Directory(
        where, directory, buffer.data_spec, convention, episode_fields, split, append, name, max_episodes_per_shard
    )
    count = 0
    try:
        for episode, terminal in episodes:
            writer.write(episode, terminal)
            count += 1
    finally:
        writer.close()
    return count


class RldsWriter:
    """An observer that writes each episode of a collector's stream to an RLDS directory when it ends.

    Call it with each batch of transitions (`[batch, ...]`, row `b` from
    environment `b`), as a driver calls its observers; an episode is written
    when its `terminated` or `truncated` item arrives, and an item with
    `step_type` 0 (or `first`) starts a new one (items before an environment's
    first start are not written). `close()` (or leaving a `with`
    block) closes the files; an unfinished episode is not written.

    Args:
      directory, convention, episode_fields, split, append, name, max_episodes_per_shard: as in `save_rlds`.
      data_spec: the spec of one transition (e.g. `driver.transition_spec`).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        data_spec: Nest,
        *,
        convention: str | None = None,
        episode_fields: Sequence[str] = (),
        split: str = "train",
        append: bool = False,
        name: str = "tfreplay_rlds",
        max_episodes_per_shard: int = 1000,
    ):
        where = "RldsWriter"
        fields = _stored.as_dicts(data_spec)
        if not any(end in fields for end in ("terminated", "truncated")):
            raise ValueError(f"{where}: data_spec must have a bool 'terminated' or 'truncated' field to end episodes.")
        self._directory = _Directory(
            where, directory, data_spec, convention, episode_fields, split, append, name, max_episodes_per_shard
        )
        self._has_start = "first" in fields or "step_type" in fields
        self._pending: list[list[dict]] = []
        self.num_episodes = 0

    def __call__(self, transitions: Nest) -> None:
        batch = _stored.as_dicts(tf.nest.map_structure(np.asarray, transitions))
        size = len(tf.nest.flatten(batch)[0])
        if not self._pending:
            self._pending = [[] for _ in range(size)]
        for b in range(size):
            row = {key: _steps.slice_nest(value, b, b + 1) for key, value in batch.items()}
            if self._starts(row):
                self._pending[b] = [row]
            elif self._pending[b] or not self._has_start:  # an episode whose start was not seen is not written
                self._pending[b].append(row)
            else:
                continue
            if _flag(row, "terminated") or _flag(row, "truncated"):
                self._directory.write(_steps.concat_all(self._pending[b]), _flag(row, "terminated"))
                self._pending[b] = []
                self.num_episodes += 1

    @staticmethod
    def _starts(row: dict) -> bool:
        return _flag(row, "first") or ("step_type" in row and int(row["step_type"][0]) == _steps.STEP_TYPE_FIRST)

    def close(self) -> None:
        """Closes the dataset's files; episodes that have not ended are not written."""
        self._directory.close()

    def __enter__(self) -> RldsWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _flag(row: dict, name: str) -> bool:
    return name in row and bool(row[name][0])


class _Directory:
    """One split of a TFDS dataset of RLDS episodes, opened for writing."""

    def __init__(self, where, directory, data_spec, convention, episode_fields, split, append, name, per_shard):
        import tensorflow_datasets as tfds  # the `datasets` extra, loaded only here

        fields = _stored.as_dicts(data_spec)
        if not isinstance(fields, dict):
            raise TypeError(f"{where}: the data_spec ({type(data_spec).__name__}) must be a dict or a named tuple.")
        if convention is None:
            convention = "envlogger" if "next_observation" in fields else "d4rl"
        if convention not in _steps.CONVENTIONS:
            raise ValueError(f"{where}: convention ({convention!r}) must be 'envlogger' or 'd4rl'.")
        needed = ("observation", "next_observation") if convention == "envlogger" else ("observation",)
        for field in needed:
            if field not in fields:
                raise ValueError(f"{where}: the spec has no {field!r} field, which convention {convention!r} needs.")
        for field in episode_fields:
            if field not in fields or field in _steps.BUILT:
                raise ValueError(
                    f"{where}: episode_fields ({field!r}) must name a field of the spec other than "
                    f"{', '.join(_steps.BUILT)}."
                )
        path = os.fspath(directory)
        exists = os.path.isfile(os.path.join(path, "dataset_info.json"))
        if exists and not append:
            raise ValueError(f"{where}: directory ({path!r}) already holds a dataset; pass append=True to add to it.")
        self.convention, self.episode_fields = convention, tuple(episode_fields)
        steps = {k: v for k, v in fields.items() if k not in _steps.BUILT and k not in self.episode_fields}
        steps["observation"] = fields["observation"]
        features = {k: _feature(tfds, v) for k, v in steps.items()}
        features.update({mark: tfds.features.Tensor(shape=(), dtype=np.bool_) for mark in _steps.MARKS})
        episode = {k: _feature(tfds, fields[k]) for k in self.episode_fields}
        info = tfds.core.DatasetInfo(
            builder=tfds.core.DatasetIdentity(
                name=name, version=tfds.core.Version("1.0.0"), data_dir=path, module_name="tfreplay.datasets"
            ),
            description=f"RLDS episodes written by tfreplay ({convention} convention).",
            features=tfds.features.FeaturesDict({"steps": tfds.features.Dataset(features), **episode}),
            metadata=tfds.core.MetadataDict({CONVENTION_KEY: convention}),
        )
        if exists:
            _check_same_layout(where, tfds, path, info, convention)
        os.makedirs(path, exist_ok=True)
        self._writer = tfds.core.SequentialWriter(info, max_examples_per_shard=per_shard, overwrite=not exists)
        self._writer.initialize_splits([split], fail_if_exists=False)
        self._split = split

    def write(self, transitions: dict, terminal: bool) -> None:
        example = {k: tf.nest.map_structure(lambda x: x[0], transitions[k]) for k in self.episode_fields}
        kept = {k: v for k, v in transitions.items() if k not in self.episode_fields}
        example["steps"] = _steps.to_steps(kept, self.convention, terminal)
        self._writer.add_examples({self._split: [example]})

    def close(self) -> None:
        self._writer.close_all()


def _check_same_layout(where: str, tfds: Any, path: str, info: Any, convention: str) -> None:
    existing = tfds.builder_from_directory(path).info
    recorded = (existing.metadata or {}).get(CONVENTION_KEY)
    if existing.name != info.name or recorded != convention:
        raise ValueError(
            f"{where}: directory ({path!r}) holds dataset {existing.name!r} ({recorded} convention); appending "
            f"needs name {info.name!r} and convention {convention!r}."
        )
    if existing.features.to_json() != info.features.to_json():
        raise ValueError(
            f"{where}: directory ({path!r}) holds episodes of another layout: {existing.features!r}; these "
            f"episodes are {info.features!r}."
        )


def _feature(tfds: Any, spec: Nest) -> Any:
    if isinstance(spec, dict):
        return tfds.features.FeaturesDict({k: _feature(tfds, v) for k, v in spec.items()})
    if isinstance(spec, tf.TensorSpec):
        return tfds.features.Tensor(shape=tuple(spec.shape), dtype=spec.dtype.as_numpy_dtype)
    raise TypeError(f"RLDS features: a spec ({spec!r}) must be a nest of dicts, named tuples and TensorSpecs.")
