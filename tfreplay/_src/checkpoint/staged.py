"""A TF buffer's restore, whole or not at all: restored tensors are held until every one is checked.

TF restores a checkpoint's variables one by one, each as it reads it, so a
bad tensor found late would leave the variables read before it restored. A
TF buffer's state is made of `StagedVariable`s instead: once its layout
record has been checked (TF restores it before any variable), each
variable's restored tensor is kept aside (`Staging.put`), and when every
variable has been read (the record's `after_restore` hook, which TF runs
last) `Staging.commit` checks them all, shapes, dtypes and values
(`state.check`), before it assigns any. A refused checkpoint raises and
leaves the buffer as it was.

Restores that run no hook after the variables go as TF does them: inside a
`tf.function` or a v1 graph (the tensors are symbolic there), and
checkpoints written before the hook existed (format 1 before its rate
limiter counts); their layout record is still checked first.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from tfreplay._src.samplers import refuse


class Staging:
    """The restored tensors of one buffer's variables, until they are checked and assigned together.

    Args:
      check: `check(values)` raises `ValueError` for restored values (state name -> array) no buffer could hold.
    """

    def __init__(self, check: Callable[[dict], None]):
        self._check, self.active = check, False
        self._tensors: dict[int, tf.Tensor] = {}

    def begin(self) -> None:
        """A restore of this buffer has begun: its variables' tensors are held from now on."""
        self.active, self._tensors = True, {}

    def put(self, variable: tf.Variable, tensor: tf.Tensor) -> None:
        self._tensors[id(variable)] = tensor

    def commit(self, variables: dict[str, tf.Variable]) -> None:
        """Checks every held tensor, then assigns them all; raises `ValueError` (and assigns nothing) if the
        checkpoint lacks one of `variables` (state name -> variable) or holds a value none could have."""
        if not self.active:
            return
        held, self.active, self._tensors = self._tensors, False, {}
        values = {}
        for name, variable in variables.items():
            tensor = held.get(id(variable))
            if tensor is None:
                raise refuse(name, [], "saved: a checkpoint of this buffer holds every one of its variables")
            if tensor.dtype != variable.dtype or tensor.shape != variable.shape:
                raise refuse(f"{name} (a {tensor.dtype.name} tensor of shape {tensor.shape})", [], "shaped as saved")
            values[name] = tensor.numpy()
        self._check(values)
        for name, variable in variables.items():
            variable.assign(values[name])


class StagedVariable(resource_variable_ops.ResourceVariable):
    """A variable whose restore is held by its buffer's `Staging` while a checked restore is under way."""

    _staging: Staging | None = None

    def _restore_from_tensors(self, restored_tensors: dict) -> Any:
        staging = self._staging
        if staging is None or not staging.active or not tf.executing_eagerly():
            return super()._restore_from_tensors(restored_tensors)
        staging.put(self, restored_tensors["VARIABLE_VALUE"])
        return None


class StagedGenerator(tf.random.Generator):
    """A `tf.random.Generator` whose state variable is a `StagedVariable` (its restore is checked with the rest)."""

    def _create_variable(self, *args: Any, **kwargs: Any) -> Any:
        with tf.name_scope("random_generator"):
            kwargs["name"] = "StateVar"  # the name tf.random.Generator gives it
            return StagedVariable(*args, **kwargs)


def make(staging: Staging, initial: Any, name: str) -> StagedVariable:
    """A non-trainable `StagedVariable` of `initial`, restored through `staging`."""
    variable = StagedVariable(initial, trainable=False, name=name)
    variable._staging = staging
    return variable
