"""The public API, pinned: every exported name and every public constructor and method signature.

`api_snapshot.json` (beside this file) is the API as released. A change that
adds, removes or re-signs a public name fails here until the snapshot is
rewritten on purpose: `python tests/library/test_public_api.py --write`.
Parameters are pinned by name, kind and default (annotations may be reworded).
"""

from __future__ import annotations

import importlib
import inspect
import json
import pathlib
import pickle
import pkgutil
import sys

SNAPSHOT = pathlib.Path(__file__).with_name("api_snapshot.json")
# The namespaces users import from, and what each exports.
NAMESPACES = {
    "tfreplay": None,  # its __all__
    "tfreplay.keras": None,
    "tfreplay.datasets": None,
    "tfreplay.compat.tf_agents": None,
    "tfreplay.compat.tf_agents.replay_buffers": None,
    "tfreplay.compat.tf_agents.replay_buffers.replay_buffer": ["ReplayBuffer", "BufferInfo"],
    "tfreplay.compat.tf_agents.replay_buffers.tf_uniform_replay_buffer": ["TFUniformReplayBuffer", "BufferInfo"],
    "tfreplay.compat.tf_agents.replay_buffers.py_uniform_replay_buffer": ["PyUniformReplayBuffer"],
    "tfreplay.compat.tf_agents.specs": None,
    "tfreplay.compat.tf_agents.specs.array_spec": None,
    "tfreplay.compat.tf_agents.specs.tensor_spec": None,
    "tfreplay.compat.reverb": None,
    "tfreplay.compat.reverb.selectors": ["Uniform", "Prioritized", "Fifo", "Lifo", "MinHeap", "MaxHeap"],
    "tfreplay.compat.reverb.rate_limiters": ["MinSize", "SampleToInsertRatio", "Queue", "Stack"],
    "tfreplay.compat.reverb.checkpointers": ["DefaultCheckpointer", "TempDirCheckpointer", "default_checkpointer"],
}


def _default(value) -> str:
    if value is inspect.Parameter.empty:
        return "<required>"
    return repr(value) if isinstance(value, (int, float, str, bool, type(None), tuple)) else type(value).__name__


def _signature(fn) -> list | None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, _default(p.default)] for p in signature.parameters.values()]


def _ours(owner: type) -> bool:
    return owner.__module__.split(".")[0] == "tfreplay"


def _members(cls: type) -> dict:
    """Public methods and properties defined by tfreplay classes in `cls`'s MRO (TF's own are TF's to keep)."""
    out: dict = {}
    for owner in reversed(cls.__mro__):
        if not _ours(owner):
            continue
        for name, value in vars(owner).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property):
                out[name] = "property"
            elif isinstance(value, (staticmethod, classmethod)):
                out[name] = _signature(value.__func__)
            elif inspect.isfunction(value):
                out[name] = _signature(value)
    return dict(sorted(out.items()))


def _describe(value) -> dict:
    if inspect.ismodule(value):
        return {"kind": "module"}
    if inspect.isclass(value):
        described: dict = {"kind": "class"}
        if _ours(value):
            described["init"] = _signature(value)
            described["members"] = _members(value)
            if issubclass(value, tuple) and hasattr(value, "_fields"):
                described["fields"] = list(value._fields)
        return described
    if callable(value):
        return {"kind": "function", "signature": _signature(value)}
    return {"kind": type(value).__name__}


def snapshot() -> dict:
    out = {}
    for name, exported in NAMESPACES.items():
        module = importlib.import_module(name)
        names = sorted(module.__all__ if exported is None else exported)
        out[name] = {n: _describe(getattr(module, n)) for n in names}
    return out


def test_the_public_api_matches_its_snapshot():
    want = json.loads(SNAPSHOT.read_text())
    got = json.loads(json.dumps(snapshot()))
    assert sorted(got) == sorted(want)
    for namespace in want:
        assert sorted(got[namespace]) == sorted(want[namespace]), namespace
        for name in want[namespace]:
            assert got[namespace][name] == want[namespace][name], f"{namespace}.{name} changed"


def _public_modules() -> list:
    """Every importable tfreplay module without a `_`-prefixed part in its name (an extra not installed is
    left out)."""
    import tfreplay

    names = ["tfreplay"] + [
        info.name
        for info in pkgutil.walk_packages(tfreplay.__path__, "tfreplay.", onerror=lambda name: None)
        if not any(part.startswith("_") for part in info.name.split("."))
    ]
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    return modules


def test_every_public_error_prints_as_the_name_it_is_exported_by():
    """`tfreplay.EmptyBufferError`, not its private home: each exception class a public module exports has a
    public `__module__` that exports it under its `__qualname__`; the top level's own are `tfreplay.<Name>`."""
    import tfreplay

    checked = set()
    for module in _public_modules():
        exported = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
        for name in exported:
            error = getattr(module, name, None)
            if not (inspect.isclass(error) and issubclass(error, BaseException) and _ours(error)):
                continue
            checked.add(error)
            home = error.__module__
            assert not any(part.startswith("_") for part in home.split(".")), f"{module.__name__}.{name}: {home}"
            assert getattr(importlib.import_module(home), error.__qualname__, None) is error, f"{home}.{name}"
            if name in tfreplay.__all__ and module is tfreplay:
                assert f"{home}.{error.__qualname__}" == f"tfreplay.{name}"
    assert {tfreplay.EmptyBufferError, tfreplay.BufferClosedError, tfreplay.RateLimitTimeoutError} <= checked


def test_a_public_error_survives_pickling_under_its_public_name():
    import tfreplay

    error = pickle.loads(pickle.dumps(tfreplay.EmptyBufferError("get_next: the buffer is empty")))
    assert type(error) is tfreplay.EmptyBufferError and "the buffer is empty" in str(error)
    assert repr(type(error)) == "<class 'tfreplay.EmptyBufferError'>"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
