"""A hook that runs when a `tf.train.Checkpoint` restore has put every variable in place.

TF restores every `PythonState` first, then the variables, then whatever a
registered saver restores; a `PythonState` (a TF buffer's layout record) has
no call after the variables. An `AfterRestore` child gives it one: it saves
nothing, and its node in the checkpoint makes TF call its restore last. A
checkpoint written without the node (an older one) makes no call. Inside a
`tf.function` the call is a `tf.py_function` that runs with it; a v1
graph's session never runs it (TF drops what a registered restore returns),
so a v1 caller acts when the restore is built.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf
from tensorflow.python.saved_model import registration  # the checkpoint saver registry (TF >= 2.10)


class AfterRestore(tf.__internal__.tracking.Trackable):
    """Runs `fn` when a restore has put every variable in place (TF runs registered restores last).

    It saves nothing: its node in the checkpoint is what asks for the call.
    """

    def __init__(self, fn: Callable[[], None]):
        self._fn = fn


def _no_save(trackables: dict, file_prefix: tf.Tensor) -> None:
    return None


def _run_after_restore(trackables: dict[str, AfterRestore], merged_prefix: tf.Tensor) -> Any:
    def run() -> bool:
        for hook in trackables.values():
            hook._fn()
        return True

    if tf.executing_eagerly():
        return run()
    return tf.py_function(run, [], Tout=tf.bool)


registration.register_checkpoint_saver(
    package="tfreplay",
    name="AfterRestore",
    predicate=lambda x: isinstance(x, AfterRestore),
    save_fn=_no_save,
    restore_fn=_run_after_restore,
    strict_predicate_restore=False,  # a SavedModel loaded without tfreplay skips it (it holds no data)
)
