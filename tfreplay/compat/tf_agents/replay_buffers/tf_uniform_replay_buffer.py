"""`tf_agents.replay_buffers.tf_uniform_replay_buffer` over tfreplay's `TFUniformReplayBuffer`.

TF-Agents 0.19's constructor (`table_fn` sixth) and return values: `get_next`
and the dataset give `(items, BufferInfo)`, items in the structure of the
spec as given (lists stay lists). Where TF-Agents fails or is wrong, tfreplay's
behaviour stays (README, "TF-Agents compatibility").
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from tfreplay import buffers
from tfreplay._src import specs
from tfreplay._src.api import BufferInfo
from tfreplay._src.specs import Nest
from tfreplay.compat.tf_agents.replay_buffers import replay_buffer

__all__ = ["BufferInfo", "TFUniformReplayBuffer"]


def _is_tf_agents_table(table_fn: Any) -> bool:
    """TF-Agents' own default, `tf_agents.replay_buffers.table.Table`, named without importing TF-Agents."""
    return getattr(table_fn, "__module__", "") == "tf_agents.replay_buffers.table" and (
        getattr(table_fn, "__name__", "") == "Table"
    )


class TFUniformReplayBuffer(buffers.TFUniformReplayBuffer):
    """TF-Agents' `TFUniformReplayBuffer`, by tfreplay: same arguments, same returns.

    An empty buffer's sample raises what TF-Agents raises, `tf.errors.InvalidArgumentError` with its words
    (eagerly tfreplay's `EmptyBufferError`, which is that error and a `ValueError`); `_capacity` is a tensor,
    as TF-Agents' tests read it.

    Args:
      data_spec, batch_size, max_length, scope, device: as TF-Agents.
      table_fn: `None` or TF-Agents' `table.Table` (its default); tfreplay
        keeps rows in its own storage, so another table is refused.
      dataset_drop_remainder, dataset_window_shift, stateful_dataset: as TF-Agents.
      seed: (keyword only, tfreplay's) seed of the sampling generator.
    """

    def __init__(
        self,
        data_spec: Nest,
        batch_size: int,
        max_length: int = 1000,
        scope: str = "TFUniformReplayBuffer",
        device: str = "cpu:*",
        table_fn: Callable | None = None,
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
        *,
        seed: int | list[int] | None = None,
    ):
        if table_fn is not None and not _is_tf_agents_table(table_fn):
            raise ValueError(
                f"TFUniformReplayBuffer: table_fn ({table_fn!r}) must be None or TF-Agents' table.Table; "
                "tfreplay keeps rows in its own storage."
            )
        super().__init__(
            data_spec,
            batch_size,
            max_length,
            scope,
            device,
            dataset_drop_remainder,
            dataset_window_shift,
            stateful_dataset,
            seed,
        )
        object.__setattr__(self, "_given_spec", data_spec)
        object.__setattr__(self, "_as_given", replay_buffer.as_given(data_spec))
        object.__setattr__(self, "_capacity_value", self._capacity)
        object.__setattr__(self, "_capacity", tf.constant(self._capacity, tf.int64))  # as TF-Agents keeps it
        self._table_fn = table_fn
        object.__setattr__(self, "_drops_remainder", bool(dataset_drop_remainder))

    _empty_note = " (TFUniformReplayBuffer is empty. Make sure to add items before sampling the buffer.)"

    @property
    def capacity(self) -> int:
        return self._capacity_value

    @property
    def data_spec(self) -> Nest:
        """The spec as given."""
        return self._given_spec

    @property
    def table_fn(self) -> Callable | None:
        return self._table_fn

    def get_next(  # type: ignore[override]
        self, sample_batch_size: Any = None, num_steps: Any = None, time_stacked: bool = True, *, transform: Any = None
    ) -> tuple[Nest, BufferInfo]:
        items, info = super().get_next(sample_batch_size, num_steps, time_stacked, transform)
        return self._repack(items, num_steps is not None and not time_stacked), info

    def _get_next(self, sample_batch_size: Any = None, num_steps: Any = None, time_stacked: bool = True) -> Any:
        """TF-Agents' private sampling hook, which its own tests call: `get_next` by TF-Agents' positions."""
        return self.get_next(sample_batch_size, num_steps, time_stacked)

    def as_dataset(  # type: ignore[override]
        self,
        sample_batch_size: Any = None,
        num_steps: Any = None,
        num_parallel_calls: Any = None,
        single_deterministic_pass: bool = False,
        *,
        sequence_preprocess_fn: Callable[[Nest], Nest] | None = None,
        transform: Any = None,
    ) -> tf.data.Dataset:
        """TF-Agents' argument order; tfreplay's `sequence_preprocess_fn` and `transform` by keyword only."""
        if single_deterministic_pass and self._drops_remainder:
            self._check_pass_keeps_data(sample_batch_size, num_steps)
        return super().as_dataset(
            sample_batch_size,
            num_steps,
            num_parallel_calls,
            sequence_preprocess_fn,
            single_deterministic_pass,
            transform,
        )

    def gather_all(self) -> Nest:
        return self._as_given(super().gather_all())

    def _check_pass_keeps_data(self, sample_batch_size: Any, num_steps: Any) -> None:
        """TF-Agents' refusal of a deterministic pass that would drop everything, in tfreplay's words."""
        size = specs.static_int("as_dataset", "sample_batch_size", sample_batch_size)
        steps = specs.static_int("as_dataset", "num_steps", num_steps)
        for name, value, limit, bound in (
            ("sample_batch_size", size, "batch_size", self.batch_size),
            ("num_steps", steps, "max_length", self.max_length),
        ):
            if isinstance(value, int) and value > bound:
                raise ValueError(
                    f"as_dataset: {name} ({value}) must be at most {limit} ({bound}) with "
                    "dataset_drop_remainder=True; otherwise ALL data will be dropped by the deterministic pass."
                )

    def _repack(self, items: Nest, by_step: bool) -> Nest:
        return tuple(self._as_given(step) for step in items) if by_step else self._as_given(items)

    # TF-Agents' private helpers that its own tests (and some user code) call.
    def _get_last_id(self) -> tf.Tensor:
        """The id of the newest add (-1 when empty), as TF-Agents counts adds."""
        return tf.reduce_max(self.front_door.num_adds()) - 1

    def _clear(self, clear_all_variables: bool = False) -> Any:
        """Empties the buffer; with `clear_all_variables` also zeroes the stored rows."""
        return self.front_door.clear_zeroed() if clear_all_variables else super()._clear()


replay_buffer.ReplayBuffer.register(TFUniformReplayBuffer)
