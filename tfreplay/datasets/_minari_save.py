"""`save_minari`: a buffer's whole episodes as a local Minari dataset, with raw arrays (image spaces too)."""

from __future__ import annotations

import inspect
import os
import shutil
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tfreplay.datasets import _steps, _stored
from tfreplay.datasets._fill import compare_specs
from tfreplay.datasets._minari import TAKEN, import_minari

Nest = Any
FORMATS = ("hdf5", "arrow", "parquet")
EPISODES_PER_WRITE = 64  # episodes handed to Minari at once: memory is the buffer's copy and these


def save_minari(
    buffer: Any,
    dataset_id: str,
    *,
    env: Any = None,
    observation_space: Any = None,
    action_space: Any = None,
    data_format: str = "hdf5",
    algorithm_name: str | None = None,
    author: str | set[str] | None = None,
    author_email: str | set[str] | None = None,
    code_permalink: str | None = None,
    description: str | None = None,
    eval_env: Any = None,
    requirements: Sequence[str] | None = None,
) -> int:
    """Writes a buffer's stored episodes as a local Minari dataset that `minari.load_dataset` reads.

    The buffer's items must carry episode boundaries (see `EpisodeRule`) and
    have `observation`, `next_observation`, `action` and `reward` fields (the
    `tfreplay.rl.drivers.Transition` names). Each whole episode is written with
    `minari.create_dataset_from_buffers`: its `T + 1` observations, its actions
    and rewards, terminations and truncations from how it ended, and every other
    field (not `step_type`, `first`, `terminated`, `truncated`) as an info of
    its name, one entry per observation (zeros with the final one); `discount`
    is written only when it is not 0 at terminations and 1 elsewhere, what
    `load_minari` derives without it. Only whole episodes are written: one whose
    first item was overwritten, or that has not ended, is left out. Arrays are
    stored raw, image spaces too (never Minari's lossy JPEG encoding), so
    `load_minari` on the dataset gives the same items in the same episodes.

    Args:
      buffer: a rows buffer (uniform or prioritized, TF or NumPy).
      dataset_id: `"(namespace/)name-v(version)"`, e.g. `"tfreplay/cartpole-v0"`; it must not name a local
        dataset yet. The dataset is written in Minari's local datasets directory (`MINARI_DATASETS_PATH`).
      env: the environment of the data (a `gymnasium.Env`, an id or an `EnvSpec`), recorded for
        `MinariDataset.recover_environment`; its spaces are the dataset's unless given below.
      observation_space, action_space: the dataset's spaces; without them (and without `env`) each is a `Box`
        per leaf of the spec (the dtype's full range; `Dict` and `Tuple` for nests). They must hold the
        spec's dtypes and shapes.
      data_format: `"hdf5"`, `"arrow"` or `"parquet"`.
      algorithm_name, author, author_email, code_permalink, description, eval_env, requirements: the
        dataset's metadata, as `minari.create_dataset_from_buffers` takes them.

    Returns:
      The number of episodes written.

    Raises:
      ValueError: `dataset_id` is malformed or taken, `data_format` is unknown, the buffer has no episode
        boundaries or lacks a field Minari needs, a space's shape differs from the spec, or an image space
        with a Minari older than 0.5.4 (which stores images only as JPEG). Nothing is written then.
      TypeError: a frame buffer, a spec that is not a dict or named tuple, a nested field other than the
        observation and action, or a space of another dtype.
      ImportError: Minari is not installed (`pip install tfreplay[minari]`).
    """
    where = "save_minari"
    minari = import_minari(where)
    import gymnasium as gym  # a dependency of Minari

    path = _new_dataset_path(where, dataset_id)
    if data_format not in FORMATS:
        raise ValueError(f"{where}: data_format ({data_format!r}) must be one of {', '.join(map(repr, FORMATS))}.")
    stored = _stored.whole_episodes(where, buffer)
    fields = _fields(where, buffer.data_spec)
    episodes = list(stored)  # views of one read of the buffer
    infos = [name for name in fields if name not in TAKEN and name != "discount"]
    if "discount" in fields and any(_own_discount(episode, terminal) for episode, terminal in episodes):
        infos.append("discount")
    if isinstance(env, (str, gym.envs.registration.EnvSpec)):
        env = gym.make(env)
    spaces = {
        f"{name}_space": _checked_space(where, gym, name, given, env, fields[name])
        for name, given in (("observation", observation_space), ("action", action_space))
    }
    kwargs = dict(
        env=env,
        eval_env=eval_env,
        algorithm_name=algorithm_name,
        author=author,
        author_email=author_email,
        code_permalink=code_permalink,
        description=description,
        data_format=data_format,
        requirements=None if requirements is None else list(requirements),
        **spaces,
        **_raw_kwargs(where, minari, spaces),
    )
    try:
        dataset = None
        for start in range(0, max(len(episodes), 1), EPISODES_PER_WRITE):
            chunk = [_episode_buffer(*episode, infos) for episode in episodes[start : start + EPISODES_PER_WRITE]]
            if dataset is None:
                dataset = minari.create_dataset_from_buffers(dataset_id, chunk, **kwargs)
            else:
                dataset.update_dataset_from_buffer(chunk)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)  # a half-written dataset would shadow the id
        raise
    return len(episodes)


def _fields(where: str, data_spec: Nest) -> dict:
    """The buffer's spec as a dict, checked for what a Minari episode needs; every other field an array."""
    fields = _stored.as_dicts(data_spec)
    if not isinstance(fields, dict):
        raise TypeError(
            f"{where}: the buffer's data_spec ({type(data_spec).__name__}) must be a dict or a named tuple."
        )
    for name in ("observation", "next_observation", "action", "reward"):
        if name not in fields:
            raise ValueError(f"{where}: the buffer's spec has no {name!r} field, which a Minari episode needs.")
    if not isinstance(fields["reward"], tf.TensorSpec) or fields["reward"].shape.rank != 0:
        raise ValueError(
            f"{where}: reward ({fields['reward']!r}) must be one scalar per step, as Minari stores rewards."
        )
    for name, spec in fields.items():
        if name not in TAKEN and not isinstance(spec, tf.TensorSpec):
            raise TypeError(
                f"{where}: field {name!r} must be one array, written as a Minari info of its name; it is a nest "
                f"({spec!r})."
            )
    return fields


def _new_dataset_path(where: str, dataset_id: str) -> str:
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage import get_dataset_path

    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError):  # TypeError: no version
        raise ValueError(
            f"{where}: dataset_id ({dataset_id!r}) must be '(namespace/)name-v(version)', e.g. "
            "'tfreplay/cartpole-v0' (a namespace has at least two characters)."
        ) from None
    path = os.fspath(get_dataset_path(dataset_id))
    if os.path.exists(path):
        raise ValueError(
            f"{where}: dataset_id ({dataset_id!r}) must be new; a local dataset has it ({path}). Pick another "
            f"version, or delete it with minari.delete_dataset({dataset_id!r})."
        )
    return path


def _own_discount(episode: dict, terminal: bool) -> bool:
    """Whether an episode's discounts differ from what `load_minari` derives (float32, 0 at a termination, else 1)."""
    implied = np.ones(len(episode["discount"]), np.float32)
    implied[-1:] = 0.0 if terminal else 1.0
    return episode["discount"].dtype != np.float32 or not np.array_equal(episode["discount"], implied)


def _episode_buffer(episode: dict, terminal: bool, infos: list[str]) -> Any:
    """One whole episode's transitions as a `minari.EpisodeBuffer` (raw arrays)."""
    from minari.data_collector import EpisodeBuffer

    kept = {name: episode[name] for name in ("observation", "next_observation", "action", "reward", *infos)}
    steps = _steps.to_steps(kept, "envlogger", terminal)  # T + 1 steps: every field padded with one zero step
    num = len(episode["reward"])
    ends = np.arange(num) == num - 1
    return EpisodeBuffer(
        observations=_minari_nest(steps["observation"]),
        actions=_minari_nest(_steps.slice_nest(episode["action"], 0, num)),
        rewards=episode["reward"],
        terminations=ends & terminal,
        truncations=ends & (not terminal),
        # Minari's arrow storage reads back a one-dimensional info only from a list of its values.
        infos={name: list(steps[name]) if steps[name].ndim == 1 else steps[name] for name in infos} or None,
    )


def _minari_nest(nest: Nest) -> Nest:
    """Dicts and tuples, as Minari's storages take a Dict or Tuple space's values."""
    if isinstance(nest, dict):
        return {key: _minari_nest(value) for key, value in nest.items()}
    if isinstance(nest, (tuple, list)):
        return tuple(_minari_nest(value) for value in nest)
    return nest


def _space(gym: Any, spec: Nest) -> Any:
    """A `Box` per leaf (the dtype's full range), `Dict` and `Tuple` for nests."""
    if isinstance(spec, dict):
        return gym.spaces.Dict({key: _space(gym, value) for key, value in spec.items()})
    if isinstance(spec, (tuple, list)):
        return gym.spaces.Tuple(tuple(_space(gym, value) for value in spec))
    dtype = np.dtype(spec.dtype.as_numpy_dtype)
    low: Any
    high: Any
    if dtype == np.bool_:
        low, high = False, True
    elif np.issubdtype(dtype, np.integer):
        low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
    elif np.issubdtype(dtype, np.floating):
        low, high = -np.inf, np.inf
    else:
        raise TypeError(f"save_minari: a spec's dtype ({spec.dtype.name}) must be bool, an integer or a float.")
    return gym.spaces.Box(low, high, tuple(spec.shape), dtype)


def _space_spec(gym: Any, space: Any, label: str) -> Nest:
    """The `tf.TensorSpec` nest of one element of a space."""
    if isinstance(space, gym.spaces.Dict):
        return {key: _space_spec(gym, sub, f"{label}/{key}") for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_space_spec(gym, sub, f"{label}/{i}") for i, sub in enumerate(space.spaces))
    kinds = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
    if isinstance(space, kinds):
        return tf.TensorSpec(space.shape, tf.as_dtype(space.dtype))
    raise TypeError(
        f"save_minari: {label} ({space!r}) must be a Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple space."
    )


def _checked_space(where: str, gym: Any, name: str, space: Any, env: Any, spec: Nest) -> Any:
    """The space given, else `env`'s, else one derived from the spec; it must hold exactly the spec's dtypes and
    shapes (Minari's arrow storage casts to the space's dtype)."""
    if space is None:
        space = getattr(env, f"{name}_space") if env is not None else _space(gym, spec)
    held = _space_spec(gym, space, f"the {name}_space")
    compare_specs(where, name, held, spec, "in the buffer's spec", f"the {name}_space ({space!r}) holds")
    return space


def _raw_kwargs(where: str, minari: Any, spaces: dict) -> dict:
    """The arguments that keep image spaces raw; a Minari without them (before 0.5.4) cannot, so it is refused."""
    if "jpeg_encoding" in inspect.signature(minari.create_dataset_from_buffers).parameters:
        return {"jpeg_encoding": False}
    from minari.dataset.minari_storage import is_image_space

    for key, space in spaces.items():
        for path, leaf in _space_leaves(space, key[: -len("_space")]):
            if is_image_space(leaf):
                raise ValueError(
                    f"{where}: {path} ({leaf!r}) is an image space, which Minari {minari.__version__} stores only "
                    "as lossy JPEG; tfreplay writes raw arrays: install minari>=0.5.4 (pip install 'tfreplay[minari]')."
                )
    return {}


def _space_leaves(space: Any, label: str) -> list[tuple[str, Any]]:
    subspaces = getattr(space, "spaces", None)
    if isinstance(subspaces, dict):
        return [pair for key, sub in subspaces.items() for pair in _space_leaves(sub, f"{label}/{key}")]
    if isinstance(subspaces, tuple):
        return [pair for i, sub in enumerate(subspaces) for pair in _space_leaves(sub, f"{label}/{i}")]
    return [(label, space)]
