"""`load_minari`: stream a local Minari dataset (hdf5, arrow or parquet) into a buffer, whole episodes per segment.

A Minari episode of `T` steps stores `T + 1` observations and `T` actions,
rewards, terminations and truncations, and `infos` with one entry per
observation: the layout of an RLDS episode in the `"envlogger"` convention
with its extra final step. `load_minari` reads it as one (and `save_minari`
writes one) with that convention's step helpers (`_steps`), so Minari and
RLDS give the same transitions.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from tfreplay.datasets import _fill, _steps
from tfreplay.datasets._fill import LoadInfo, ToItems

# An info key of one of these names is not a field of its own: the episode's arrays give these fields.
TAKEN = ("action", "reward", *_steps.BUILT, *_steps.MARKS)
# The arrays of a Minari episode, as its storages name them.
FIELDS = ("observations", "actions", "rewards", "terminations", "truncations", "infos")


def load_minari(source: Any, buffer: Any, *, to_items: ToItems | None = None) -> LoadInfo:
    """Adds the episodes of a local Minari dataset to a buffer, one episode at a time.

    A Minari episode of `T` steps becomes `T` transitions named as
    `tfreplay.rl.drivers.Transition`: `observation` (the first `T` of its
    `T + 1` observations), `action`, `reward`, `discount` (0 where the step
    terminated, else 1, as float32), `next_observation`, `step_type` (`0` at the
    first step, else `1`), `first`, `terminated` and `truncated` (at the last
    step, from its terminations and truncations). Each key of the episode's
    `infos` whose leaves hold one entry per observation becomes a field of its
    name: the info that came with `observation` (a `discount` info replaces the
    derived discount). Dict and Tuple spaces give nests. The buffer takes the
    top-level fields its spec names; a frame buffer gets frame rows, as with
    `load_rlds`.

    Episodes are read one at a time (memory: the buffer and one episode) and
    spread over the buffer's segments whole, exactly as `load_rlds` does.

    A load is all or nothing, as with `load_rlds`: the dataset is read twice,
    first to check every episode (its arrays' lengths, its terminations and
    truncations, its fields against the buffer's spec, what `to_items` gives),
    then to add them. A dataset that fails anywhere is refused before the first
    add, so the buffer is unchanged.

    Args:
      source: a `minari.MinariDataset`, the id of a dataset in Minari's local datasets directory
        (`MINARI_DATASETS_PATH`, by default `~/.minari/datasets`), or the path of a dataset's directory.
        Nothing is ever downloaded: fetch a remote dataset first with `minari.download_dataset`.
      buffer: any tfreplay buffer. Its spec must be a dict or named tuple.
      to_items: `to_items(transitions, episode)`, called per episode (on both reads) with the default
        fields (`[T, ...]` NumPy arrays; frame rows for a frame buffer) and the `minari.EpisodeData`,
        returns the episode's items in the buffer's spec with a leading time axis. Use it to rename, cast
        or compute fields.

    Returns:
      A `LoadInfo` (its `convention` is `"envlogger"`: a Minari episode stores its final observation).

    Raises:
      ValueError: `source` is no local Minari dataset, a field the spec needs has no source, a shape
        differs, an episode's arrays disagree in length (`T` actions, rewards, terminations and
        truncations, `T + 1` observations), a termination or truncation comes before an episode's last
        step, or Minari's storage cannot read an episode (a missing array: its error is chained). The
        message names the dataset, the episode (its index in the dataset) and the step or the field.
        Nothing is added.
      TypeError: a dtype or structure differs from the buffer's spec. Nothing is added.
      ImportError: Minari is not installed (`pip install tfreplay[minari]`).
    """
    where = "load_minari"
    minari = import_minari(where)
    dataset = _open(minari, source, where)
    origin = f"Minari dataset ({dataset.spec.dataset_id!r})"
    frames = buffer.front_door.capabilities.history_len is not None
    needs_next = _fill.needs_next(buffer, where)

    def read() -> Iterator[tuple[dict, Any]]:
        for index, episode in enumerate(_read_episodes(dataset, where, origin)):
            _check_episode(where, f"episode {index} of the {origin}", episode)
            transitions = _steps.to_transitions(_as_steps(episode), "envlogger", needs_next)
            yield _fill.episode_fields(transitions, {}, frames), episode

    counts = _fill.add_episodes(where, buffer, read, to_items, origin)
    return LoadInfo(*counts, "envlogger")


def _read_episodes(dataset: Any, where: str, origin: str) -> Iterator[Any]:
    """The dataset's episodes; an error of Minari's storage (h5py, pyarrow) becomes one naming the episode and
    the field, chained to it."""
    episodes = iter(dataset.iterate_episodes())
    index = 0
    while True:
        try:
            episode = next(episodes)
        except StopIteration:
            return
        except Exception as err:  # whatever the storage library raises, named and chained
            text = str(err)
            name = next((f for f in FIELDS if f"'{f}'" in text or f'"{f}"' in text), "every field")
            raise ValueError(
                f"{where}: episode {index} of the {origin}: {name} must be readable; reading the episode raised "
                f"{type(err).__name__}: {text}"
            ) from err
        yield episode
        index += 1


def _check_episode(where: str, label: str, episode: Any) -> None:
    """A Minari episode of `T` rewards holds `T` of each step array, `T + 1` observations, and ends only at its
    last step."""
    num = len(episode.rewards)
    counts = {"rewards": np.size(episode.rewards)}
    counts.update({name: np.size(getattr(episode, name)) for name in ("terminations", "truncations")})
    for name, value in (("actions", episode.actions), ("observations", episode.observations)):
        counts.update({_joined(name, path): _rows(leaf) for path, leaf in _steps.named_leaves(_arrays(value))})
    for name, count in counts.items():
        want = num + 1 if name.startswith("observations") else num
        if count != want:
            rule = "one more entry than rewards" if want > num else "one entry per reward"
            raise ValueError(
                f"{where}: {label}: {name} ({count} entries) must hold {rule} ({num}); a Minari episode of T steps "
                "holds T actions, rewards, terminations and truncations and T + 1 observations."
            )
    for name in ("terminations", "truncations"):
        _steps.check_ends(where, label, name, getattr(episode, name))


def _joined(name: str, path: str) -> str:
    return f"{name}/{path}" if path else name


def _rows(leaf: Any) -> int:
    return int(np.shape(leaf)[0]) if np.ndim(leaf) else 0


def import_minari(where: str) -> Any:
    try:
        import minari
        import PIL  # noqa: F401  (Minari's storages import Pillow without declaring it)
    except ImportError as err:
        raise ImportError(f"{where} needs Minari and Pillow: pip install 'tfreplay[minari]' ({err}).") from err
    return minari


def _open(minari: Any, source: Any, where: str) -> Any:
    """The `MinariDataset` of a dataset, a local id or a directory (the dataset's, or its `data` folder)."""
    if isinstance(source, minari.MinariDataset):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"{where}: source ({source!r}) must be a minari.MinariDataset, a local dataset id or a path.")
    path = os.fspath(source)
    if os.path.isdir(path):
        for data in (os.path.join(path, "data"), path):
            if os.path.isfile(os.path.join(data, "metadata.json")):
                return minari.MinariDataset(data)
        raise ValueError(f"{where}: source ({path!r}) must be a Minari dataset directory (with data/metadata.json).")
    try:
        return minari.load_dataset(path, download=False)
    except FileNotFoundError:
        from minari.storage import get_dataset_path

        raise ValueError(
            f"{where}: source ({path!r}) must be a local Minari dataset: no directory of that name, and no dataset "
            f"of that id in {os.fspath(get_dataset_path())} (MINARI_DATASETS_PATH). {where} never downloads; "
            f"fetch it first with minari.download_dataset({path!r})."
        ) from None


def _as_steps(episode: Any) -> dict:
    """A Minari episode as RLDS steps in the envlogger convention: `T + 1` steps, the last one holding no transition."""
    num = len(episode.rewards)
    terminations = np.asarray(episode.terminations, bool).reshape(-1)
    truncations = np.asarray(episode.truncations, bool).reshape(-1)
    steps = {
        name: value
        for name, value in _arrays(episode.infos or {}).items()
        if name not in TAKEN and all(np.shape(leaf)[:1] == (num + 1,) for leaf in tf.nest.flatten(value))
    }
    steps["observation"] = _arrays(episode.observations)
    steps["action"] = _steps.pad_step(_arrays(episode.actions))
    steps["reward"] = _steps.pad_step(np.asarray(episode.rewards).reshape(-1))
    if "discount" not in steps:
        steps["discount"] = _steps.pad_step(np.where(terminations, 0.0, 1.0).astype(np.float32))
    last = np.arange(num + 1) == num
    ended = bool(num) and bool(terminations[-1] or truncations[-1])
    steps["is_first"] = np.arange(num + 1) == 0
    steps["is_last"] = last & ended
    steps["is_terminal"] = last & (bool(num) and bool(terminations[-1]))
    return steps


def _arrays(nest: Any) -> Any:
    """Minari's episode values (dicts, tuples, lists of strings for Text spaces) with NumPy arrays as leaves."""
    if isinstance(nest, dict):
        return {key: _arrays(value) for key, value in nest.items()}
    if isinstance(nest, tuple):
        return tuple(_arrays(value) for value in nest)
    return np.asarray(nest)
