"""How the compiled kernels are built and found, seen from outside: fresh processes, their environment, stderr.

Each case runs Python in a subprocess on a copy of the package (with or without its compiled C libraries),
so what it loads or builds depends only on the environment the case gives it: a cache of its own, a compiler
or none. A line a user would see is a stderr line starting with "tfreplay:".
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from tfreplay import native

ROOT = pathlib.Path(__file__).resolve().parents[2]
GXX = shutil.which("g++") or shutil.which("c++")
needs_compiler = pytest.mark.skipif(GXX is None, reason="no C++ compiler here")


def sample(windows: bool = False) -> str:
    """Code that samples a `PyPrioritizedReplayBuffer` and prints what loaded from where (and, if asked, whether
    the window library loads too)."""
    return f"""
import json, numpy as np
import tfreplay
from tfreplay import PyPrioritizedReplayBuffer, native
rb = PyPrioritizedReplayBuffer({{"x": np.zeros([2], np.float32)}}, capacity=64, seed=0)
rb.add_batch({{"x": np.arange(32, dtype=np.float32).reshape(16, 2)}})
items, info = rb.get_next(sample_batch_size=8)
rb.update_priorities(info.ids, np.full([8], 2.0))
items, info = rb.get_next(sample_batch_size=8)
print(json.dumps({{
    "shape": list(items["x"].shape), "compiled": native.sum_tree_library() is not None,
    "windows": {"native.windows_library() is not None" if windows else "None"},
    "status": {{row.name: [row.origin, row.path, row.reason] for row in native.status()}},
    "package": tfreplay.__file__,
}}))
"""


def copy_package(into: pathlib.Path, with_libraries: bool = False) -> pathlib.Path:
    """A copy of the package under test in `into` (its compiled libraries only if asked); returns `into`."""
    skip = ["__pycache__"] + ([] if with_libraries else ["*.so", "*.pyd"])
    shutil.copytree(ROOT / "tfreplay", into / "tfreplay", ignore=shutil.ignore_patterns(*skip))
    return into


def environment(tmp_path: pathlib.Path, source: pathlib.Path | None, **changes: str) -> dict:
    """The test's environment with no tfreplay or compiler settings, a cache of its own, `source` first on the
    path, then `changes`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFREPLAY_") and k not in ("CXX", "PYTHONPATH")}
    env.update(TFREPLAY_CACHE=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="2")
    if source is not None:
        env["PYTHONPATH"] = str(source)
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


def python(code: str, env: dict, cwd: pathlib.Path, python: str = sys.executable) -> tuple[dict, list]:
    """Runs `code` in `cwd` (outside the repository: `-c` puts the working folder first on the path); returns the
    JSON its last stdout line prints, and its stderr lines from tfreplay."""
    command = [python, "-c", textwrap.dedent(code)]
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1]), tfreplay_lines(done.stderr)


def tfreplay_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("tfreplay:")]


def no_compiler(tmp_path: pathlib.Path) -> dict:
    """A `CXX` that is not a program and a PATH without g++ or c++."""
    (tmp_path / "empty-bin").mkdir(exist_ok=True)
    return {"CXX": str(tmp_path / "no-such-compiler"), "PATH": str(tmp_path / "empty-bin")}


def counting_compiler(tmp_path: pathlib.Path, wait_for: tuple = ()) -> tuple[pathlib.Path, pathlib.Path]:
    """A `CXX` that logs each run, waits until the files `wait_for` exist, then runs g++; and its log."""
    log, script = tmp_path / "compiler-runs.log", tmp_path / "counting-g++"
    waits = "".join(f'[ -e "{flag}" ] && ' for flag in wait_for)
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$$" >> "{log}"\n'
        f"i=0; until {waits}true || [ $i -gt 600 ]; do sleep 0.1; i=$((i + 1)); done\n"
        f"{'sleep 1' if wait_for else ''}\n"
        f'exec "{GXX}" "$@"\n'
    )
    script.chmod(0o755)
    return script, log


def runs(log: pathlib.Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.slow  # a fresh process imports TensorFlow
def test_without_a_compiler_a_kernel_is_none_warns_once_and_buffers_still_sample(tmp_path):
    env = environment(tmp_path, copy_package(tmp_path), TFREPLAY_BUILD_OPS="1", **no_compiler(tmp_path))
    got, lines = python(sample(), env, tmp_path)
    assert got["package"] == str(tmp_path / "tfreplay/__init__.py")  # the copy, without compiled libraries
    assert got["shape"] == [8, 2] and got["compiled"] is False
    assert got["status"]["sum_tree"][0] == "missing"
    assert len(lines) == 1, lines  # two buffer calls, two accessor calls: one warning
    assert lines[0].startswith("tfreplay: the compiled sum tree is not available (no C++ compiler: CXX (")
    assert "PyPrioritizedReplayBuffer samples and updates priorities with NumPy array ops" in lines[0]
    assert "Reinstall tfreplay from a wheel, or run `python -m tfreplay.native build`." in lines[0]
    assert "-fPIC" not in lines[0] and "-shared" not in lines[0]  # no compiler command line
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []


def test_tfreplay_native_0_turns_every_kernel_off_without_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("TFREPLAY_NATIVE", "0")
    monkeypatch.setenv("TFREPLAY_BUILD_OPS", "1")  # no build either
    accessors = [native.sum_tree_library, native.windows_library, native.sum_tree_ops, native.frame_stack]
    assert [accessor() for accessor in accessors] == [None] * 4
    assert caplog.records == []


@pytest.mark.slow  # a fresh process imports TensorFlow
@needs_compiler
def test_nothing_is_built_without_the_opt_in_and_one_line_says_what_is_built_with_it(tmp_path):
    compiler, log = counting_compiler(tmp_path)
    env = environment(tmp_path, copy_package(tmp_path), CXX=str(compiler))
    code = """
    import json, os, sys
    from tfreplay import native
    before = native.windows_library() is None, native.sum_tree_ops() is None
    print("tfreplay: -- the opt-in --", file=sys.stderr, flush=True)
    os.environ["TFREPLAY_BUILD_OPS"] = "1"
    print(json.dumps({"before": before, "after": native.sum_tree_library() is not None}))
    """
    got, lines = python(code, env, tmp_path)
    assert got == {"before": [True, True], "after": True}
    opt_in = lines.index("tfreplay: -- the opt-in --")
    without, built = lines[:opt_in], lines[opt_in + 1 :]
    assert len(without) == 2, without  # the two kernels asked for, one warning each, no build
    assert "the compiled window plan is not available (not compiled into this install" in without[0]
    assert f"the sum-tree TF ops are not available (not built for TensorFlow {tf.__version__}" in without[1]
    assert "Run `python -m tfreplay.native build` once for this TensorFlow" in without[1]
    assert len(built) == 1 and built[0].startswith("tfreplay: building the compiled sum tree (sum_tree.cc) into ")
    assert "TFREPLAY_BUILD_OPS=1" in built[0]
    assert runs(log) == 1  # a compile for the opt-in, none before
    assert len(list((tmp_path / "cache").glob("sum_tree-*.so"))) == 1


@pytest.mark.slow  # a fresh process imports TensorFlow
@needs_compiler
def test_an_unwritable_cache_builds_into_a_temp_folder(tmp_path):
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o500)
    cache_home = readonly
    if os.access(readonly, os.W_OK):  # root writes anywhere: a path through a file is no folder for anyone
        (tmp_path / "a-file").write_text("")
        cache_home = tmp_path / "a-file" / "cache"
    (tmp_path / "tmp").mkdir()
    env = environment(
        tmp_path, copy_package(tmp_path), TFREPLAY_CACHE=None, XDG_CACHE_HOME=str(cache_home),
        TMPDIR=str(tmp_path / "tmp"), TFREPLAY_BUILD_OPS="1",
    )  # fmt: skip
    try:
        got, lines = python(sample(), env, tmp_path)
    finally:
        readonly.chmod(0o700)
    assert got["package"] == str(tmp_path / "tfreplay/__init__.py")
    assert got["shape"] == [8, 2] and got["compiled"] is True
    origin, path, _ = got["status"]["sum_tree"]
    assert origin == "cache" and pathlib.Path(path).parent.parent == tmp_path / "tmp", path
    assert len(lines) == 1 and lines[0].startswith("tfreplay: building the compiled sum tree"), lines


@pytest.mark.slow  # two processes import TensorFlow at once
@needs_compiler
def test_two_processes_building_one_kernel_compile_it_once(tmp_path):
    ready = (tmp_path / "ready-1", tmp_path / "ready-2")
    compiler, log = counting_compiler(tmp_path, wait_for=ready)  # the compile waits until both want it
    env = environment(tmp_path, copy_package(tmp_path), CXX=str(compiler))
    code = """
    import json, pathlib, sys
    from tfreplay import native
    pathlib.Path(sys.argv[1]).touch()
    [result] = native.build(["sum_tree"])
    print(json.dumps({"state": result.state, "path": result.path, "loaded": native.sum_tree_library() is not None}))
    """
    both = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(flag)], env=env, cwd=tmp_path, stdout=subprocess.PIPE
        )
        for flag in ready
    ]
    got = [json.loads(process.communicate(timeout=600)[0].decode().splitlines()[-1]) for process in both]
    assert all(process.returncode == 0 for process in both)
    assert sorted(g["state"] for g in got) == ["built", "cached"]  # one compiled, the other waited and found it
    assert got[0]["path"] == got[1]["path"] and all(g["loaded"] for g in got)
    assert runs(log) == 1


@pytest.fixture(scope="module")
def built_package(tmp_path_factory):
    """A source tree with its C libraries compiled in place by setup.py (as `pip install -e .` does), and the TF ops
    for this TensorFlow (setup.py builds them where the building Python imports TensorFlow, as here). The tests below
    check that a stale one is skipped and the others still load; that a wheel's load with no compiler and no build step
    is `make test-wheel`'s (tests/test_packaging.py)."""
    if GXX is None:
        pytest.skip("no C++ compiler here")
    tree = copy_package(tmp_path_factory.mktemp("built"))
    for name in ("setup.py", "README.md"):
        shutil.copy(ROOT / name, tree)
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return tree


@pytest.mark.slow  # a fresh process imports TensorFlow
def test_a_packaged_library_from_other_sources_is_not_used(tmp_path, built_package):
    tree = tmp_path / "edited"
    shutil.copytree(built_package, tree)
    with open(tree / "tfreplay/native/kernels/windows.cc", "a") as source:
        source.write("// an edit since the build\n")
    env = environment(tmp_path, tree, **no_compiler(tmp_path))
    got, lines = python(sample(windows=True), env, tmp_path)
    assert got["windows"] is False and got["compiled"] is True  # the edited kernel is skipped, the other loads
    assert got["status"]["windows"][:2] == ["missing", None] and got["status"]["sum_tree"][0] == "package"
    assert len(lines) == 1 and "the compiled window plan is not available (the packaged library does not" in lines[0]


TF_SAMPLE = """
import json, tensorflow as tf, tfreplay
from tfreplay import native
rb = tfreplay.TFPrioritizedReplayBuffer({"x": tf.TensorSpec([2], tf.float32)}, batch_size=4, max_length=16, seed=0)
rb.add_batch({"x": tf.ones([4, 2])})
items, info = rb.get_next(8)
rb.update_priorities(info.ids, [2.0] * 8)
print(json.dumps({row.name: [row.origin, row.path, row.reason] for row in native.status()}))
"""


@pytest.mark.slow  # fresh processes import TensorFlow
@pytest.mark.parametrize("renamed", ["another version", "other sources"])
def test_a_packaged_tf_op_for_another_tensorflow_or_other_sources_is_not_loaded(tmp_path, built_package, renamed):
    tree = tmp_path / "tree"
    shutil.copytree(built_package, tree)
    (op,) = (tree / "tfreplay/native/ops").glob("sum_tree_ops-*.so")
    version, key = op.stem.split("-tf")[1].split("-")
    op.rename(
        op.with_name(
            f"sum_tree_ops-tf0.0.1-{key}.so"
            if renamed == "another version"
            else f"sum_tree_ops-tf{version}-{'0' * 16}.so"
        )
    )
    env = environment(tmp_path, tree, **no_compiler(tmp_path))
    status, lines = python(TF_SAMPLE, env, tmp_path)
    assert status["sum_tree_ops"][:2] == ["missing", None] and status["frame_stack"][0] == "package", status
    why = f"not built for TensorFlow {tf.__version__}" if renamed == "another version" else "does not match its sources"
    assert len(lines) == 1 and "the sum-tree TF ops are not available" in lines[0] and why in lines[0], lines


def test_an_install_from_source_without_a_compiler_still_succeeds(tmp_path):
    tree = copy_package(tmp_path)
    for name in ("setup.py", "README.md"):
        shutil.copy(ROOT / name, tree)
    missing = str(tmp_path / "no-such-compiler")
    env = environment(tmp_path, None, CC=missing, CXX=missing, LDSHARED=missing)
    command = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("tfreplay: compiling its C libraries failed") == 1, done.stderr
    assert "installing without them" in done.stderr
    assert list((tree / "tfreplay/native").glob("_*.so")) == []


def test_the_command_prints_the_status_and_the_usage_and_refuses_an_unknown_kernel(capsys):
    from tfreplay.native.__main__ import main

    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tfreplay's native kernels (TensorFlow ")
    assert all(f"\n  {name} " in out for name in native.NAMES)
    assert "python -m tfreplay.native build " in out and "TFREPLAY_BUILD_OPS=1" in out
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("tfreplay's native kernels")
    with pytest.raises(SystemExit):
        main(["build", "nope"])
    assert "build: kernel (nope) must be one of sum_tree, windows, sum_tree_ops" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"build: kernel \(nope\) must be one of sum_tree, windows, sum_tree_ops"):
        native.build(["nope"])


def test_disabled_turns_kernels_off_for_one_block_of_one_thread():
    import threading

    outside = native.sum_tree_library()
    with native.disabled("sum_tree"):
        assert native.sum_tree_library() is None
        seen = []
        thread = threading.Thread(target=lambda: seen.append(native.sum_tree_library()))
        thread.start()
        thread.join()
        assert seen == [outside]  # another thread is not affected
        with native.disabled():
            assert [native.windows_library(), native.frame_stack(), native.sum_tree_ops()] == [None] * 3
    assert native.sum_tree_library() is outside
    with pytest.raises(ValueError, match=r"disabled: kernel names \(\['window'\]\) must be among"):
        with native.disabled("window"):
            pass
