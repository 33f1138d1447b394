"""The training run's optional packages: tqdm (the progress bar), TensorBoard (summaries), matplotlib (the
learning curve), all three in the `examples` extra.

Each is imported when first used. Where one is missing the run goes on without it and says so once, in one
line on stderr that names the package to install: the `rl` extra alone is enough to train.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Any

import tensorflow as tf

_told: set = set()


def available(package: str, without: str) -> bool:
    """Whether `package` can be imported; if not, prints (once per package) what the run does without it."""
    if importlib.util.find_spec(package) is not None:
        return True
    if package not in _told:
        _told.add(package)
        print(f"tfreplay: {package} is not installed: {without} (pip install {package}).", file=sys.stderr)
    return False


class _NoBar:
    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def update(self, n: int) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass


class _Lines(_NoBar):
    """Progress as plain lines on stdout: one per tenth of the run (and at least every `interval` seconds)."""

    def __init__(self, total: int, initial: int, interval: float = 30.0):
        self.total, self.done, self.interval = max(total, 1), initial, interval
        self.postfix: dict = {}
        self.next_tenth = self.done * 10 // self.total + 1
        self.last = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        tenth, now = self.done * 10 // self.total, time.monotonic()
        if tenth >= self.next_tenth or now - self.last >= self.interval:
            self.next_tenth, self.last = tenth + 1, now
            self.print()

    def set_postfix(self, **kwargs: Any) -> None:
        self.postfix = kwargs

    def print(self) -> None:
        extra = "".join(f", {key}={value}" for key, value in self.postfix.items())
        print(f"{self.done:,}/{self.total:,} steps ({100 * self.done // self.total}%){extra}", flush=True)


def progress_bar(total: int, initial: int, enabled: bool) -> Any:
    """A tqdm bar over `total` steps from `initial` (a widget in a notebook with ipywidgets); plain lines without
    tqdm or in a notebook without ipywidgets; nothing if not `enabled`."""
    if not enabled:
        return _NoBar()
    if not available("tqdm", "progress is printed as plain lines"):
        return _Lines(total, initial)
    if "ipykernel" in sys.modules and importlib.util.find_spec("ipywidgets") is None:
        return _Lines(total, initial)  # tqdm's text bar would leave one output per refresh in a saved notebook
    import warnings

    with warnings.catch_warnings():  # tqdm.auto warns in a notebook without ipywidgets, then prints text
        warnings.simplefilter("ignore")
        from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, mininterval=0.5)


class Summaries:
    """TensorBoard scalars under `logdir`, or nothing where TensorBoard is not installed (`tf.summary.scalar`
    comes from the tensorboard package)."""

    def __init__(self, logdir: str):
        self.writer = None
        if available("tensorboard", "no TensorBoard summaries are written"):
            self.writer = tf.summary.create_file_writer(logdir)

    def scalars(self, step: int, values: dict) -> None:
        """Writes each `name: value` of `values` whose value is not None, at `step`."""
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            for name, value in values.items():
                if value is not None:
                    tf.summary.scalar(name, value)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()
