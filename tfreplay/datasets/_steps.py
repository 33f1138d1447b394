"""RLDS steps to transitions and back, one episode at a time, on NumPy arrays.

An RLDS episode is a sequence of steps `(observation, action, reward,
discount, is_first, is_last, is_terminal, ...)`. Two conventions are in use:

* `"envlogger"`: step `k` holds the action taken in `observation[k]` and the
  reward and discount that followed; a finished episode ends with one more
  step holding only the final observation, whose action and reward are not
  a transition. `T` transitions take `T + 1` steps.
* `"d4rl"`: every step is a transition, the `is_last` one too; the final
  observation is not stored. `T` transitions take `T` steps.

A transition here uses the names of `tfreplay.rl.drivers.Transition`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay._src import specs

CONVENTIONS = ("envlogger", "d4rl")
MARKS = ("is_first", "is_last", "is_terminal")
# The transition fields built from the RLDS fields; every other step field keeps its own name.
BUILT = ("observation", "next_observation", "step_type", "first", "terminated", "truncated")
STEP_TYPE_FIRST, STEP_TYPE_MID = 0, 1


def detect(steps: dict) -> str | None:
    """The convention of a finished episode's steps, or None when this episode cannot tell.

    An envlogger episode's `is_last` step carries no transition, so its action,
    reward and discount are zeros (what envlogger writes); any nonzero value
    there means the step is a real one (`"d4rl"`).
    """
    if not len(steps["is_last"]) or not steps["is_last"][-1]:
        return None
    tail = [np.asarray(steps[name][-1]) for name in ("action", "reward", "discount") if name in steps]
    return "envlogger" if all(not np.any(value) for value in tf.nest.flatten(tail)) else "d4rl"


def check_marks(where: str, label: str, steps: dict) -> None:
    """An episode's `is_first`, `is_last` and `is_terminal` mark where it starts and ends, and nowhere else.

    An episode without `is_first` would join the one before it in a buffer, and
    steps after an early `is_last` would join the episode it ends, so both are
    refused rather than read otherwise. `label` names the episode in the message.
    """
    first, last, terminal = (np.asarray(steps[name], bool).reshape(-1) for name in MARKS)
    wrong_first = np.flatnonzero(first != (np.arange(len(first)) == 0))
    if len(wrong_first):
        k = int(wrong_first[0])
        raise ValueError(
            f"{where}: {label}, step {k}: is_first ({bool(first[k])}) must be True at the episode's first step and "
            "False after it (each RLDS episode starts once, at its first step)."
        )
    check_ends(where, label, "is_last", last)
    wrong_terminal = np.flatnonzero(terminal & ~last)
    if len(wrong_terminal):
        raise ValueError(
            f"{where}: {label}, step {int(wrong_terminal[0])}: is_terminal (True) must be False where is_last is "
            "False (an episode terminates at its last step)."
        )


def check_ends(where: str, label: str, name: str, flags: Any) -> None:
    """`flags` (an episode's `is_last`, or a Minari episode's terminations or truncations) end it only at its last
    step: the steps after an earlier one would join the episode it ends."""
    early = np.flatnonzero(np.asarray(flags, bool).reshape(-1)[:-1])
    if len(early):
        raise ValueError(
            f"{where}: {label}, step {int(early[0])}: {name} (True) must be False before the episode's last step "
            f"({len(flags)} steps); an episode ends once, at its last step."
        )


def to_transitions(steps: dict, convention: str, needs_next: bool) -> dict:
    """The transitions of one episode's steps (`[n, ...]` arrays by RLDS name) as `[T, ...]` arrays.

    `needs_next`: the caller stores `next_observation`. A `"d4rl"` episode has
    no observation after its last step: when it terminated, that step keeps its
    own observation as `next_observation` (its discount makes it unused); when
    it was truncated, the step cannot bootstrap, so it is left out and the step
    before it ends the episode, truncated.
    """
    n = len(steps["is_last"])
    ended, terminal = bool(n and steps["is_last"][-1]), bool(n and steps["is_terminal"][-1])
    observation = steps["observation"]
    if convention == "envlogger":
        num = max(n - 1, 0)
        following = slice_nest(observation, 1, n)
    else:
        num = n if (not needs_next or (ended and terminal)) else max(n - 1, 0)
        following = slice_nest(observation, 1, n)
        if num == n and n:
            following = concat_nest(following, slice_nest(observation, n - 1, n))
    out = {name: slice_nest(value, 0, num) for name, value in steps.items() if name not in MARKS}
    out["observation"] = slice_nest(observation, 0, num)
    if needs_next:
        out["next_observation"] = slice_nest(following, 0, num)
    first = np.zeros([num], bool)
    if num and bool(steps["is_first"][0]):
        first[0] = True
    end = np.zeros([num], bool)
    if num and ended:
        end[-1] = True
    out["first"] = first
    out["step_type"] = np.where(first, STEP_TYPE_FIRST, STEP_TYPE_MID).astype(np.int32)
    out["terminated"] = end & terminal
    out["truncated"] = end & (not terminal)
    return out


def to_frame_rows(transitions: dict) -> dict:
    """Frame-buffer rows (`frame_data_spec`) of one episode's transitions: the first frame, then one per step."""
    num = len(transitions["first"])
    if not num:
        return {}
    frame = concat_nest(slice_nest(transitions["observation"], 0, 1), transitions["next_observation"])
    rows: dict[str, Any] = {"frame": frame}
    rows["first"] = np.concatenate([[bool(transitions["first"][0])], np.zeros([num], bool)])
    for name, value in transitions.items():
        if name not in BUILT:
            rows[name] = concat_nest(tf.nest.map_structure(np.zeros_like, slice_nest(value, 0, 1)), value)
    for name in ("terminated", "truncated"):
        rows[name] = np.concatenate([[False], transitions[name]])
    return rows


def to_steps(transitions: dict, convention: str, terminal: bool) -> dict:
    """The RLDS steps (by RLDS name) of one finished episode's transitions; the inverse of `to_transitions`."""
    num = len(tf.nest.flatten(transitions["observation"])[0])
    kept = {name: value for name, value in transitions.items() if name not in BUILT}
    if convention == "envlogger":
        steps = {name: pad_step(value) for name, value in kept.items()}
        final = slice_nest(transitions["next_observation"], -1, None)
        steps["observation"] = concat_nest(transitions["observation"], final)
        num += 1
    else:
        steps = dict(kept, observation=transitions["observation"])
    steps["is_first"] = np.arange(num) == 0
    steps["is_last"] = np.arange(num) == num - 1
    steps["is_terminal"] = steps["is_last"] & terminal
    return steps


def named_leaves(nest: Any) -> list[tuple[str, Any]]:
    """`(path, leaf)` pairs in `tf.nest.flatten` order, named by the spec module's leaf paths (`""`: a nest that is
    one leaf)."""
    leaves = tf.nest.flatten(nest)
    if len(leaves) == 1 and leaves[0] is nest:
        return [("", nest)]
    return list(zip(specs.leaf_paths(nest), leaves))


def slice_nest(nest: Any, start: int, stop: int | None) -> Any:
    return tf.nest.map_structure(lambda value: value[start:stop], nest)


def concat_nest(a: Any, b: Any) -> Any:
    return tf.nest.map_structure(lambda x, y: np.concatenate([x, y]), a, b)


def pad_step(nest: Any) -> Any:
    """`[n, ...]` arrays with one step of zeros appended (an envlogger episode's final step holds no transition)."""
    return tf.nest.map_structure(
        lambda x: np.concatenate([x, np.zeros((1, *np.shape(x)[1:]), np.asarray(x).dtype)]), nest
    )


def concat_all(parts: list) -> Any:
    return tf.nest.map_structure(lambda *xs: np.concatenate(xs), *parts)
