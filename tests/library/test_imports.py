"""`import tfreplay` stays light: no optional extra loads with it, and imports point down to the library.

One fresh interpreter imports tensorflow, then tfreplay, then its datasets
module, then the Ray service, then the RL application, recording which
modules each step added; TensorFlow
alone loads some of the extras (tf_keras or Keras 3 with matplotlib, absl's
flags), so only what a step adds over the steps before it counts.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Every heavy optional dependency: the rl, examples, ray, datasets, minari and test extras, and the compat
# lane's peers.
HEAVY = (
    "absl.app",
    "absl.flags",
    "gymnasium",
    "h5py",
    "IPython",
    "jupytext",
    "keras",
    "matplotlib",
    "minari",
    "nbclient",
    "nbformat",
    "pandas",
    "PIL",
    "pyarrow",
    "ray",
    "reverb",
    "scipy",
    "tensorboard",
    "tensorflow_datasets",
    "tf_agents",
    "tf_keras",
    "tqdm",
)
# What only the application and the adapters may load (each loads an extra: gymnasium, Ray).
UPPER = ("tfreplay.compat", "tfreplay.distributed", "tfreplay.rl")

PROBE = """
import json, sys
steps = {}
def step(name, statement):
    before = set(sys.modules)
    exec(statement)
    steps[name] = sorted(set(sys.modules) - before)
step("tensorflow", "import tensorflow")
step("tfreplay", "import tfreplay")
step("datasets", "import tfreplay.datasets")
step("reverb", "import tfreplay.compat.reverb")
step("distributed", "import tfreplay.distributed")
step("rl", "import tfreplay.rl.training")
import tfreplay
lazy = {}
for name, module in [("ExpReplay", "tfreplay.compat.tensorpack"), ("ExperienceReplay", "tfreplay.compat.fastrl")]:
    loaded_before = module in sys.modules
    value = getattr(tfreplay, name)
    lazy[name] = [loaded_before, value is getattr(sys.modules[module], name)]
try:
    tfreplay.NoSuchName
    lazy["missing"] = "resolved"
except AttributeError as error:
    lazy["missing"] = str(error)
print(json.dumps({"steps": steps, "lazy": lazy}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    """What each import step added to `sys.modules`, and how the lazy names resolved (one fresh interpreter)."""
    run = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def loaded(added: list[str], names: tuple[str, ...]) -> list[str]:
    """The modules of `added` that are one of `names` or inside one of them."""
    return sorted(m for m in added if any(m == n or m.startswith(n + ".") for n in names))


def test_import_tfreplay_loads_no_optional_dependency(probe):
    added = probe["steps"]["tfreplay"]
    assert loaded(added, HEAVY) == []
    assert loaded(added, UPPER) == []


def test_import_tfreplay_and_its_reverb_shim_load_no_grpc(probe):
    # The Reverb shim's gRPC transport loads when a server starts or a client reaches another process.
    assert loaded(probe["steps"]["tfreplay"], ("grpc",)) == []
    assert "tfreplay.compat.reverb" in probe["steps"]["reverb"]
    assert loaded(probe["steps"]["reverb"], ("grpc", "tfreplay.compat.reverb.transport.server")) == []
    assert loaded(probe["steps"]["reverb"], ("tfreplay.compat.reverb.transport.client",)) == []


def test_import_tfreplay_datasets_loads_no_dataset_library(probe):
    # tensorflow_datasets, minari (with h5py, pyarrow, Pillow, gymnasium) load inside the functions that use them.
    assert loaded(probe["steps"]["datasets"], HEAVY) == []


def test_the_probe_sees_an_extra_when_one_loads(probe):
    # The RL application needs gymnasium: the same check on its import must report it.
    assert "gymnasium" in loaded(probe["steps"]["rl"], HEAVY)
    assert "tfreplay.rl.training" in probe["steps"]["rl"]


def test_the_ray_service_loads_neither_gymnasium_nor_the_rl_application(probe):
    added = probe["steps"]["distributed"]
    assert "ray" in added
    assert loaded(added, ("gymnasium", "matplotlib", "tf_keras", "tfreplay.rl", "tfreplay.compat")) == []


def test_the_seed_adapters_load_on_first_use(probe):
    lazy = probe["lazy"]
    assert lazy["ExpReplay"] == [False, True]  # not loaded before the name was read, then the adapter's class
    assert lazy["ExperienceReplay"] == [False, True]
    assert lazy["missing"] == "module 'tfreplay' has no attribute 'NoSuchName'"


def library_files() -> list[pathlib.Path]:
    package = ROOT / "tfreplay"
    return sorted(p for p in package.rglob("*.py") if (package / "rl") not in p.parents)


def imported_modules(path: pathlib.Path, parents: bool = True) -> list[str]:
    """Every module a file imports, `from a import b` counted as `a` and `a.b` (b may be a module); without
    `parents` as `a.b` alone (`from tfreplay import native` is `tfreplay.native`, not all of `tfreplay`)."""
    package = path.relative_to(ROOT).parent.parts
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()  # `from ..x import y`
            module = ".".join([*base, *([node.module] if node.module else [])])
            names += ([module] if parents else []) + [f"{module}.{alias.name}" for alias in node.names]
    return names


def test_no_library_module_imports_the_rl_application():
    files = library_files()
    assert ROOT / "tfreplay" / "__init__.py" in files and ROOT / "tfreplay" / "_src" / "api.py" in files
    offenders = {
        str(path.relative_to(ROOT)): bad for path in files if (bad := loaded(imported_modules(path), ("tfreplay.rl",)))
    }
    assert offenders == {}, "imports point down: the library must not import tfreplay.rl"


def test_the_array_code_imports_only_the_native_kernels_of_tfreplay():
    # tfreplay/_src/arrays/ is the ground floor of the buffer's path: every part is written over its namespaces.
    files = sorted((ROOT / "tfreplay" / "_src" / "arrays").glob("*.py"))
    assert {p.stem for p in files} >= {"__init__", "ops", "kernels", "stacks"}
    allowed = ("tfreplay.native", "tfreplay._src.arrays")
    offenders = {
        p.name: bad
        for p in files
        if (bad := [m for m in loaded(imported_modules(p, parents=False), ("tfreplay",)) if not loaded([m], allowed)])
    }
    assert offenders == {}, "tfreplay/_src/arrays/ imports nothing of tfreplay but tfreplay.native and itself"


REVERB = "tfreplay.compat.reverb"
REVERB_API = [f"{REVERB}.{m}" for m in ("client", "server", "tf_client", "trajectory_writer", "trajectory_dataset")]


def reverb_layer(layer: str) -> list[pathlib.Path]:
    return sorted((ROOT / "tfreplay" / "compat" / "reverb" / layer).glob("*.py"))


def test_the_reverb_engine_imports_neither_the_transport_nor_reverbs_api():
    files = reverb_layer("engine")
    assert {p.stem for p in files} >= {"table", "tables", "items", "selectors", "rate_limiters", "checkpoints"}
    banned = (f"{REVERB}.transport", f"{REVERB}.serve", *REVERB_API)
    offenders = {p.name: bad for p in files if (bad := loaded(imported_modules(p), banned))}
    assert offenders == {}, "the engine sits below the transport and the API"


def test_the_reverb_transport_imports_no_module_of_reverbs_api():
    files = reverb_layer("transport")
    assert {p.stem for p in files} >= {"routing", "wire", "server", "client"}
    offenders = {p.name: bad for p in files if (bad := loaded(imported_modules(p), (f"{REVERB}.serve", *REVERB_API)))}
    assert offenders == {}, "the transport sits below Reverb's API"


@pytest.mark.slow  # a fresh interpreter that imports TensorFlow
def test_import_tfreplay_alone_loads_no_tensorflow_until_a_name_is_used():
    # A command line built on tfreplay (the demo's `--help`) answers before TensorFlow starts.
    code = (
        "import json, sys, tfreplay; before = 'tensorflow' in sys.modules; tfreplay.TFUniformReplayBuffer; "
        "listed = sorted(set(dir(tfreplay)) & {'keras', 'NStepReturns'}); "
        "print(json.dumps([before, 'tensorflow' in sys.modules, listed]))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert json.loads(run.stdout.splitlines()[-1]) == [False, True, ["NStepReturns"]]


# The front door: code outside the buffer's path (`tfreplay/_src/`) uses a buffer through its documented
# interface and `buffer.front_door`, never its private members.
def private_buffer_members() -> tuple[set[str], set[str]]:
    """`(every private member of a buffer, the ones Buffer adds to ReplayBuffer)`, read off built buffers: the
    state its constructor and backend set on it, and the methods of tfreplay's classes in its MRO."""
    import tensorflow as tf

    import tfreplay
    from tfreplay._src.api import ReplayBuffer
    from tfreplay._src.buffer import Buffer

    def private(names) -> set[str]:
        return {n for n in names if n.startswith("_") and not n.startswith("__")}

    spec = {"x": tf.TensorSpec([], tf.int64), "first": tf.TensorSpec([], tf.bool)}
    built = [
        tfreplay.TFUniformReplayBuffer(spec, batch_size=1, max_length=4),
        tfreplay.PyPrioritizedReplayBuffer(spec, capacity=4),
        tfreplay.PyFrameReplayBuffer(tfreplay.frame_data_spec((2,)), capacity=8, history_len=2),
    ]
    hooks = {name: lambda *args: None for name in ReplayBuffer.__abstractmethods__}
    bare = type("Bare", (ReplayBuffer,), hooks)(spec, 4)
    module_state = private(vars(tf.Module()))

    def methods(cls: type) -> set[str]:
        return {n for owner in cls.__mro__ if owner.__module__.startswith("tfreplay.") for n in private(vars(owner))}

    every = set().union(*(private(vars(b)) for b in built)) - module_state | methods(Buffer)
    return every, every - (private(vars(bare)) | methods(ReplayBuffer))


def private_reaches(tree: ast.AST, names: set[str], on_self: bool) -> list[str]:
    """Attribute reads of `names`: on any object but `self`, `cls` and `super()`, or (`on_self`) on those only."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr not in names:
            continue
        owner = node.value
        own = (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
            isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super"
        )
        if own == on_self:
            found.append((node.lineno, ast.unparse(node)))
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_the_private_member_check_sees_a_reach():
    every, added = private_buffer_members()
    assert {"_parts", "_twin", "_gate", "_data_spec", "_sample_request"} <= every
    assert {"_parts", "_twin", "_append_sequence"} <= added and "_data_spec" not in added
    code = ast.parse("rule = buffer._parts.rule\nself._twin.exclusive(f)\nself._data_spec\nsuper()._parts")
    assert private_reaches(code, every, on_self=False) == ["1: buffer._parts"]
    assert private_reaches(code, added, on_self=True) == ["2: self._twin", "4: super()._parts"]


# Objects that are no buffer but share a private name with one: the Reverb shim's columns have their own `_clear`.
NOT_BUFFERS = {("tfreplay/compat/reverb/trajectory_writer.py", "column._clear")}


def test_no_module_outside_the_buffers_path_touches_a_private_buffer_member():
    every, _ = private_buffer_members()
    package = ROOT / "tfreplay"
    outside = sorted(p for p in package.rglob("*.py") if (package / "_src") not in p.parents)
    assert package / "datasets" / "_fill.py" in outside and package / "compat" / "tf_agents" / "migrate.py" in outside
    offenders = {}
    for path in outside:
        name = str(path.relative_to(ROOT))
        found = private_reaches(ast.parse(path.read_text(), name), every, on_self=False)
        found = [reach for reach in found if (name, reach.split(": ", 1)[1]) not in NOT_BUFFERS]
        if found:
            offenders[name] = found
    assert offenders == {}, "use buffer.front_door (tfreplay/_src/front_door.py), not a buffer's private members"


def test_no_buffer_subclass_outside_the_buffers_path_reaches_into_buffer():
    # A subclass may override ReplayBuffer's hooks; what Buffer keeps (its parts, backend, gate) it reads through
    # the front door.
    import importlib
    import inspect
    import textwrap

    from tfreplay._src.buffer import Buffer

    _, added = private_buffer_members()
    names = [
        "tfreplay.buffers",
        "tfreplay.compose",
        "tfreplay.compat.tf_agents.replay_buffers",
        "tfreplay.compat.tensorpack",
    ]
    modules = [importlib.import_module(name) for name in names]
    classes = {
        cls
        for module in modules
        for cls in vars(module).values()
        if inspect.isclass(cls) and issubclass(cls, Buffer) and not cls.__module__.startswith("tfreplay._src")
    }
    classes |= {sub for cls in list(classes) for sub in cls.__subclasses__() if sub.__module__.startswith("tfreplay.")}
    assert {c.__name__ for c in classes} >= {"PyFrameReplayBuffer", "TFUniformReplayBuffer", "PyUniformReplayBuffer"}
    offenders = {
        f"{cls.__module__}.{cls.__qualname__}": found
        for cls in classes
        if (found := private_reaches(ast.parse(textwrap.dedent(inspect.getsource(cls))), added, on_self=True))
    }
    assert offenders == {}, "use self.front_door, not the private members Buffer keeps"
