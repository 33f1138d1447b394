"""BUILD lists every module and every test file (so Bazel users get them all)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _calls(kind):
    tree = ast.parse((ROOT / "BUILD").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == kind:
            yield {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg in ("name", "srcs")}


def test_every_module_is_in_the_library():
    listed = set().union(*(set(c["srcs"]) for c in _calls("py_library") if c["name"] == "tfreplay"))
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tfreplay").rglob("*.py")}
    assert modules - listed == set(), "modules missing from BUILD's py_library"
    assert listed - modules == set(), "BUILD lists files that do not exist"


def test_every_test_file_has_a_py_test():
    targets = {c["name"]: c["srcs"] for c in _calls("py_test")}
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")}
    for path in sorted(files):
        name = pathlib.Path(path).stem
        assert targets.get(name) == [path], f"BUILD needs py_test(name={name!r}, srcs=[{path!r}])"
    assert set(targets) == {pathlib.Path(f).stem for f in files}, "py_test targets without a test file"
