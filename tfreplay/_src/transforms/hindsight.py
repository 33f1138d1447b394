"""Hindsight experience replay: goals relabeled at sample time (public as `tfreplay.transforms.HindsightRelabel`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import tensorflow as tf

from tfreplay._src import specs
from tfreplay._src.specs import Nest
from tfreplay._src.transforms.base import Lookup, Span, Transform, _fields

STRATEGIES = ("future", "final", "episode")


@dataclasses.dataclass(frozen=True)
class HindsightRelabel(Transform):
    """Hindsight experience replay (HER): each sampled transition's goal relabeled, at sample time.

    With probability `relabel_ratio`, a sampled item's desired goal is
    replaced by a goal its episode achieved, and its reward recomputed by
    `reward_fn`; otherwise it is returned as stored. The stored items are never
    changed, so every sample relabels afresh. Which item is drawn, and
    `BufferInfo.probabilities`, are the sampler's (uniform or prioritized);
    relabeling only changes what the drawn item holds.

    An item is one transition; its `achieved_goal` is the goal achieved by
    that step (at its next observation: what its reward is computed from).
    The new goal is the `achieved_goal` of a stored item of the same episode
    and segment, chosen by `strategy`:

    * `"future"`: uniform over the item itself and the later items of its
      episode stored so far (the states reached after the transition);
    * `"final"`: the episode's last item. While that item is not stored yet
      (the episode runs on) the transition is left as stored;
    * `"episode"`: uniform over the stored items of its episode, earlier ones
      included (those the ring has overwritten are not stored).

    Goals never come from another episode, another segment (environment), an
    overwritten row or past the write head. The buffer's items must mark
    episode boundaries (`step_type`, `first`, `terminated`, `truncated`, or an
    `EpisodeRule`); an episode ends at an item an end field marks, or before
    an item that starts the next one.

    Args:
      reward_fn: `reward_fn(achieved_goal, desired_goal) -> reward`, on a batch
        (`[B, *goal_shape]` each; returns `[B, *reward_shape]`, cast to the
        reward's dtype). It gets tensors on TF buffers (inside the sample's
        graph: use TF ops) and NumPy arrays on the NumPy (`Py...`) buffers.
      strategy: `"future"` (HER's default), `"final"` or `"episode"`.
      relabel_ratio: the probability that a sampled item is relabeled: HER's
        `k` relabeled goals per stored one is `k / (k + 1)`, 0.8 for `k = 4`.
      achieved_goal: path of the goal achieved by an item (`"a/b"` for nested
        items).
      desired_goal: path of the goal an item pursued, or several paths (e.g. a
        goal inside both the observation and the next observation); each gets
        the new goal. Each must have the achieved goal's shape and dtype.
      reward: path of the reward replaced by `reward_fn`'s.

    Example:
      `reached = lambda achieved, desired: tf.cast(tf.reduce_all(achieved == desired, -1), tf.float32) - 1`,
      then `buffer.get_next(sample_batch_size=256, transform=HindsightRelabel(reached))` (a TF buffer: 0 where
      the goal is reached, else -1).
    """

    reward_fn: Callable[[Any, Any], Any]
    strategy: str = "future"
    relabel_ratio: float = 0.8
    achieved_goal: str = "achieved_goal"
    desired_goal: str | tuple[str, ...] = "desired_goal"
    reward: str = "reward"

    def __post_init__(self) -> None:
        where = "HindsightRelabel"
        if not callable(self.reward_fn):
            raise TypeError(f"{where}: reward_fn ({self.reward_fn!r}) must be callable: (achieved, desired) -> reward.")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"{where}: strategy ({self.strategy!r}) must be one of {', '.join(STRATEGIES)}.")
        specs.check_unit(where, "relabel_ratio", self.relabel_ratio)
        for name in ("achieved_goal", "reward"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{where}: {name} ({getattr(self, name)!r}) must be a field path (str).")
        desired = self.desired_goals
        if not desired or not all(isinstance(p, str) for p in desired):
            raise TypeError(f"{where}: desired_goal ({self.desired_goal!r}) must be a path or a tuple of paths.")

    @property
    def desired_goals(self) -> tuple[str, ...]:
        """The desired goals' paths, as a tuple."""
        return (self.desired_goal,) if isinstance(self.desired_goal, str) else tuple(self.desired_goal)

    @property
    def num_steps(self) -> int:  # type: ignore[override]
        return 1

    @property
    def padded(self) -> bool:  # type: ignore[override]
        return True  # a padded window of one item is any stored item: every sampler draws them

    def output_spec(self, item_spec: Nest) -> Nest:
        where = "HindsightRelabel"
        _fields(where, item_spec)  # a mapping or a NamedTuple
        by_path = dict(zip(specs.leaf_paths(item_spec), tf.nest.flatten(item_spec)))
        for name, path in [("achieved_goal", self.achieved_goal), ("reward", self.reward)] + [
            ("desired_goal", p) for p in self.desired_goals
        ]:
            if path not in by_path:
                raise ValueError(
                    f"{where}: {name} ({path!r}) must be a leaf of the sampled item; its leaves are {sorted(by_path)}."
                )
        goal = by_path[self.achieved_goal]
        for path in self.desired_goals:
            spec = by_path[path]
            if spec.shape != goal.shape or spec.dtype != goal.dtype:
                raise ValueError(
                    f"{where}: desired_goal {path!r} ({spec.dtype.name}{spec.shape.as_list()}) must have the "
                    f"achieved goal's shape and dtype ({goal.dtype.name}{goal.shape.as_list()})."
                )
        reward = by_path[self.reward]
        if not (reward.dtype.is_floating or reward.dtype.is_integer):
            raise TypeError(f"{where}: reward ({self.reward!r}, {reward.dtype.name}) must be a number.")
        return item_spec

    def steps(self, item_spec: Nest) -> dict[str, str]:
        return {name: "first" for name in _fields("HindsightRelabel", item_spec)}  # items `[B, ...]`

    def lookups(self, item_spec: Nest) -> tuple[str, ...]:
        return (self.achieved_goal,)

    def choose(self, span: Span, uniform: Callable[[list], Any], ops: Any) -> tuple[Any, Any]:
        """The goal's step from each item and whether to relabel: two uniform draws per item, whatever the
        strategy (so a seed gives the same relabel choices under every strategy)."""
        size = span.after.shape[0]
        relabel, pick = uniform([size]) < self.relabel_ratio, uniform([size])
        if self.strategy == "final":
            return span.after, relabel & span.ended
        low = ops.zeros_like(span.before) if self.strategy == "future" else -span.before
        choices = span.after - low + 1
        # floor(pick * choices) may round up to `choices` for a pick just below 1: clamped.
        offset = ops.minimum(ops.to_int64(pick * ops.to_float64(choices)), choices - 1) + low
        return offset, relabel

    def __call__(self, items: Nest, mask: Any, ops: Any, lookup: Lookup | None = None) -> Nest:
        """Items `[B, ...]` (each field read at the sampled step), and the looked-up achieved goals."""
        assert lookup is not None  # the buffer passes it: `lookups` names a field
        paths = specs.leaf_paths(items)
        leaves = dict(zip(paths, tf.nest.flatten(items)))
        goal, use = lookup.values[self.achieved_goal], lookup.use
        keep = ops.reshape(use, [-1] + [1] * (ops.rank(goal) - 1))
        out = {p: ops.where(keep, goal, leaves[p]) for p in self.desired_goals}
        reward = leaves[self.reward]
        computed = ops.cast(self.reward_fn(leaves[self.achieved_goal], goal), ops.dtype(reward))
        new_reward = ops.reshape(computed, [-1] + list(reward.shape[1:]))
        out[self.reward] = ops.where(ops.reshape(use, [-1] + [1] * (ops.rank(reward) - 1)), new_reward, reward)
        return tf.nest.pack_sequence_as(items, [out.get(p, leaves[p]) for p in paths])
