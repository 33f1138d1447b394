"""The errors a Reverb user catches, under Reverb's names (`reverb.errors.DeadlineExceededError`)."""

from __future__ import annotations

import tensorflow as tf


class ReverbError(Exception):
    """The base of the shim's own errors (Reverb's `ReverbError`)."""


class DeadlineExceededError(ReverbError, tf.errors.DeadlineExceededError):
    """A call not admitted by a table's rate limiter (or not done) within its timeout.

    Also a `tf.errors.DeadlineExceededError`, what the same wait raises from a TensorFlow op.
    """

    def __init__(self, message: str):
        tf.errors.DeadlineExceededError.__init__(self, None, None, message)


class ServerStoppedError(ReverbError, tf.errors.CancelledError):
    """A call on a table whose server was stopped (`Server.stop()`), or one waiting when it stopped."""

    def __init__(self, message: str):
        tf.errors.CancelledError.__init__(self, None, None, message)


class SignatureError(tf.errors.InvalidArgumentError, ValueError):
    """Data that does not match a table's signature: a `ValueError`, and TF's `InvalidArgumentError` (what an op
    raises for it)."""

    def __init__(self, message: str):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


class NotFoundError(ReverbError, tf.errors.NotFoundError, KeyError, RuntimeError):
    """A table the server does not have: Reverb's TF ops raise `NotFoundError` and its `Client` a `RuntimeError`;
    also a `KeyError`, a lookup that failed."""

    def __init__(self, message: str):
        tf.errors.NotFoundError.__init__(self, None, None, message)

    def __str__(self) -> str:
        return self.message


class DtypeMismatchError(ReverbError, tf.errors.InvalidArgumentError, TypeError):
    """Sampled data whose dtypes are not those asked for: an `InvalidArgumentError`, as Reverb's sample op raises
    eagerly, and a `TypeError`."""

    def __init__(self, message: str):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)

    def __str__(self) -> str:
        return self.message


class UnavailableError(ReverbError, tf.errors.UnavailableError):
    """A server in another process that cannot be reached any more (it stopped, died or the network failed)."""

    def __init__(self, message: str):
        tf.errors.UnavailableError.__init__(self, None, None, message)
