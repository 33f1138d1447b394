"""Every tutorial notebook runs headless, top to bottom, with small step counts."""

import ast
import importlib.util
import pathlib

import pytest

# The compatibility lane (TF 2.15, TF-Agents' typing-extensions pin) has no notebook tooling: skip there.
NO_TOOLING = "notebook tooling (the test extra) is not installed"
nbformat = pytest.importorskip("nbformat", reason=NO_TOOLING)
NotebookClient = pytest.importorskip("nbclient", reason=NO_TOOLING).NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "tutorials").glob("*.ipynb"))

# Values that replace each notebook's `parameters` cell.
SMALL = {
    "1_replay_buffers.ipynb": {"max_length": 20, "num_adds": 12},
    "2_collect_and_train.ipynb": {
        "num_env_steps": 600,
        "initial_collect_steps": 200,
        "log_interval": 200,
        "num_eval_episodes": 2,
        "recipe_env_steps": 400,
    },
    "3_prioritized_and_sequences.ipynb": {"num_env_steps": 400, "train_steps": 20, "recipe_env_steps": 1_200},
}


def parameters_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "a notebook needs exactly one code cell tagged `parameters`"
    return cells[0]


def assigned_names(source):
    return {t.id for node in ast.parse(source).body if isinstance(node, ast.Assign) for t in node.targets}


def test_every_notebook_has_small_parameters():
    assert {p.name for p in NOTEBOOKS} == set(SMALL)
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert set(SMALL[path.name]) == assigned_names(parameters_cell(nb).source), path.name
        assert all(c.get("outputs", []) == [] for c in nb.cells), f"{path.name}: commit notebooks without outputs"


def test_notebooks_match_their_build_script():
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "tutorials" / "build_notebooks.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    for name, cells in build.NOTEBOOKS.items():
        on_disk = nbformat.read(ROOT / "tutorials" / name, as_version=4)
        assert on_disk == build.build(cells), f"run `python tutorials/build_notebooks.py` to update {name}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    parameters_cell(nb).source = "\n".join(f"{k} = {v!r}" for k, v in SMALL[path.name].items())
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the failing cell and traceback, on any error
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
