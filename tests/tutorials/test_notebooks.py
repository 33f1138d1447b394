"""Every tutorial, a jupytext percent script, converts to a notebook that runs headless, top to bottom, with small
step counts, and prints none of TensorFlow's start-up messages."""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import re
import sys

import pytest

# The compatibility lane (TF 2.15, TF-Agents' typing-extensions pin) has no notebook tooling: skip there.
NO_TOOLING = "notebook tooling (the test extra) is not installed"
jupytext = pytest.importorskip("jupytext", reason=NO_TOOLING)
pytest.importorskip("nbclient", reason=NO_TOOLING)  # runs the notebooks (tutorials/execute.py)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))

# Values that replace each tutorial's `parameters` cell.
SMALL = {
    "01_replay_buffers": {"max_length": 20, "num_adds": 12},
    "02_collect_and_train": {
        "num_env_steps": 600,
        "initial_collect_steps": 200,
        "log_interval": 200,
        "num_eval_episodes": 2,
        "recipe_env_steps": 400,
    },
    "03_prioritized_and_sequences": {"num_env_steps": 400, "train_steps": 20, "recipe_env_steps": 1_200},
    "04_offline_keras": {"num_episodes": 4, "epochs": 1, "steps_per_epoch": 20, "num_eval_episodes": 2},
}

# What TensorFlow's C++ code writes as it loads: the notebooks must hide it.
START_UP_NOISE = re.compile(r"oneDNN|cudart|cuInit|absl::InitializeLog|cpu_feature_guard|TF_ENABLE_ONEDNN_OPTS")


def notebook(path):
    return jupytext.read(path, fmt="py:percent")


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def parameters_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "a tutorial needs exactly one code cell tagged `parameters`"
    return cells[0]


def assigned_names(source):
    return {t.id for node in ast.parse(source).body if isinstance(node, ast.Assign) for t in node.targets}


def imported_modules(source):
    tree = ast.parse(source)
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_every_tutorial_has_small_parameters():
    assert {p.stem for p in SCRIPTS} == set(SMALL)
    for path in SCRIPTS:
        assert set(SMALL[path.stem]) == assigned_names(parameters_cell(notebook(path)).source), path.name


def test_the_first_cell_sets_the_log_level_and_installs_only_from_a_checkout_or_wheel():
    for path in SCRIPTS:
        cells = code_cells(notebook(path))
        first = cells[0].source
        assert 'os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"' in first, path.name
        assert 'importlib.util.find_spec("tfreplay") is None' in first, path.name
        assert 'os.environ.get("TFREPLAY_WHEEL", "..")' in first, path.name
        # pip is given a path, never a name it would look up on a package index.
        assert not re.search(r"pip.*install.*[\"' ]tfreplay\b", path.read_text()), path.name
        assert not {"tensorflow", "tf_keras", "tfreplay"} & imported_modules(first), path.name


def run_first_cell(path, monkeypatch, tfreplay_found=True, **environ):
    """The pip commands the tutorial's first cell runs (none is run), where tfreplay is or is not importable."""
    calls = []
    monkeypatch.setattr("subprocess.check_call", lambda args: calls.append(args))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name: find_spec(name) if tfreplay_found else None)
    monkeypatch.setitem(os.environ, "TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    exec(compile(code_cells(notebook(path))[0].source, path.name, "exec"), {})
    return calls


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_the_first_cell_installs_nothing_where_tfreplay_is_importable(path, monkeypatch):
    assert run_first_cell(path, monkeypatch) == []


def installs(requirement, source):
    """`requirement` is `source`, bare or with the extras a tutorial needs (the offline one reads RLDS)."""
    return requirement in (source, f"{source}[examples]", f"{source}[examples,datasets]")


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_the_first_cell_installs_the_wheel_or_checkout_it_is_given(path, monkeypatch, tmp_path):
    wheel = str(tmp_path / "tfreplay-0.1.0-cp311-cp311-linux_x86_64.whl")
    for source in (wheel, str(ROOT)):
        (command,) = run_first_cell(path, monkeypatch, tfreplay_found=False, TFREPLAY_WHEEL=source)
        assert command[:5] == [sys.executable, "-m", "pip", "install", "--quiet"]
        assert installs(command[5], source), command
    monkeypatch.chdir(ROOT / "tutorials")
    monkeypatch.delenv("TFREPLAY_WHEEL", raising=False)
    (command,) = run_first_cell(path, monkeypatch, tfreplay_found=False)
    assert installs(command[5], str(ROOT)), "the default is the checkout above tutorials/"
    with pytest.raises(FileNotFoundError, match="neither a wheel nor a tfreplay checkout: set TFREPLAY_WHEEL"):
        run_first_cell(path, monkeypatch, tfreplay_found=False, TFREPLAY_WHEEL=str(tmp_path))


def test_the_tutorials_build_with_the_keras_tensorflow_uses():
    # Through `tfreplay.keras.keras_module`, never a fixed package: the tutorials run under Keras 3 and under
    # tf-keras (TF_USE_LEGACY_KERAS=1) alike, and never mix the two.
    for path in SCRIPTS:
        assert not re.search(r"\btf\.keras\b|\bimport (tf_)?keras\b|\btf_keras\.", path.read_text()), path.name


def run(path, tmp_path):
    """The tutorial with its small parameters, executed as `make tutorials-site` executes it (a fresh kernel of
    this interpreter, this checkout's tfreplay, no TF_CPP_MIN_LOG_LEVEL, so that the notebook must set it)."""
    spec = importlib.util.spec_from_file_location("tutorials_execute", ROOT / "tutorials" / "execute.py")
    executor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(executor)
    nb = executor.execute(path, str(tmp_path), SMALL[path.stem], timeout=600)
    return [o for c in code_cells(nb) for o in c.outputs]


def text(output):
    if output.output_type == "stream":
        return output.text
    if output.output_type == "error":
        return "\n".join(output.traceback)
    return "\n".join(str(v) for k, v in output.get("data", {}).items() if k.startswith("text/"))


# The Keras tutorial (`model.fit` from a buffer) runs again in `make test`'s Keras 3 pass; the others run once.
KERAS_TUTORIALS = {"04_offline_keras"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=[pytest.mark.keras] * (p.stem in KERAS_TUTORIALS)) for p in SCRIPTS],
    ids=[p.stem for p in SCRIPTS],
)
def test_tutorial_runs_without_tensorflows_start_up_messages(path, tmp_path):
    outputs = run(path, tmp_path)
    assert not [o for o in outputs if o.output_type == "error"]
    noise = [text(o) for o in outputs if START_UP_NOISE.search(text(o))]
    assert not noise, f"{path.name} prints TensorFlow's start-up messages: {noise}"


SITE = ROOT / "docs" / "tutorials"


def cell_sources(nb):
    return [(c.cell_type, c.source) for c in nb.cells]


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_the_site_shows_each_tutorial_as_it_ran_from_its_current_cells(path):
    # `make tutorials-site` writes these; a tutorial edited without rerunning it fails here.
    shown = SITE / f"{path.stem}.ipynb"
    assert shown.exists(), f"{shown.relative_to(ROOT)} is missing: run `make tutorials-site ARGS={path.stem}`"
    ran = jupytext.read(shown)
    assert cell_sources(ran) == cell_sources(notebook(path)), f"{shown.name} is stale: run `make tutorials-site`"
    cells = code_cells(ran)
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1)), "every cell ran, in order"
    outputs = [o for c in cells for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert not [text(o) for o in outputs if START_UP_NOISE.search(text(o))]
    assert "setup" in cells[0].metadata.get("tags", []), "the site hides the setup cell by this tag"
    for cell in cells:  # progress is a line per tenth of a run, never one output per refresh
        assert sum(o.output_type == "stream" for o in cell.outputs) <= 12, cell.source[:80]
        assert sum(text(o).count("\n") for o in cell.outputs if o.output_type == "stream") <= 60, cell.source[:80]
