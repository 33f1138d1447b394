"""What a user gets from tfreplay's distributions: the metadata, the sdist's files and the installed wheel.

The metadata and sdist checks run with the suite (a few seconds). `make test-wheel` (TFREPLAY_TEST_WHEEL=1)
builds the wheel, installs it as `tfreplay[rl]` in one fresh venv with its dependencies from the package
index, and from a folder outside the repository imports tfreplay, runs the README's quick start and the demo
command, and samples through the compiled libraries and the wheel's TF ops with no compiler on PATH and no
build step (on the TensorFlow of the lane's own venv, and on TF 2.15 where TFREPLAY_WHEEL_TF names a Python that
has it). `make test-pythons`
(TFREPLAY_TEST_PYTHONS=1) installs the sdist on each other Python 3.10-3.13 found here and runs the quick start.
"""

from __future__ import annotations

import email
import email.message
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYTHONS = ("3.10", "3.11", "3.12", "3.13")  # the supported range
pytestmark = pytest.mark.skipif(not (ROOT / "setup.py").is_file(), reason="needs the source tree (setup.py)")


def source_files() -> list[str]:
    """The repository's files as git sees them (tracked, and new ones not ignored); skips without git."""
    command = ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"]
    try:
        listed = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs a git checkout to list the source files")
    return sorted(name for name in set(listed.splitlines()) if (ROOT / name).is_file())


def quick_start() -> str:
    """The first ```python block of README.md."""
    found = re.search(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S | re.M)
    assert found, "README.md has no ```python block"
    return found.group(1)


def build_sdist(into: pathlib.Path) -> pathlib.Path:
    """`setup.py sdist` on a copy of the source files (the checkout itself is left alone)."""
    tree = into / "src"
    for name in source_files():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    command = [sys.executable, "setup.py", "-q", "sdist", "-d", str(into / "dist")]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (sdist,) = (into / "dist").glob("tfreplay-*.tar.gz")
    return sdist


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> tuple[pathlib.Path, list[str], email.message.Message]:
    """The sdist, its file names (without the top folder) and its PKG-INFO."""
    path = build_sdist(tmp_path_factory.mktemp("sdist"))
    with tarfile.open(path) as archive:
        members = [m for m in archive.getmembers() if m.isfile()]
        names = sorted(m.name.split("/", 1)[1] for m in members)
        (info,) = [m for m in members if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")]
        metadata = email.message_from_bytes(archive.extractfile(info).read())  # type: ignore[union-attr]
    return path, names, metadata


def test_the_sdist_carries_every_source_file_and_nothing_built(sdist):
    _, names, _ = sdist
    missing = sorted(set(source_files()) - set(names) - {".gitignore"})
    assert missing == [], f"MANIFEST.in leaves these out of the sdist: {missing}"
    # What the suite reads beside the code: golden checkpoints, the API snapshot, the compat lane's pins, helpers.
    for needed in ("tests/library/api_snapshot.json", "tests/compat/requirements.txt", "tests/helpers.py"):
        assert needed in names
    assert any(name.startswith("tests/library/golden/") and not name.endswith(".py") for name in names)
    built = [n for n in names if n.endswith((".so", ".pyc", ".pyd")) or "__pycache__" in n]
    assert built == []


def test_the_metadata_names_the_license_and_the_pythons(sdist):
    _, names, metadata = sdist
    assert metadata["License"] == "Apache-2.0" and metadata["License-File"] == "LICENSE"  # an SPDX expression
    # setuptools 77 and later deprecate license classifiers beside the expression: the metadata carries none.
    assert [c for c in metadata.get_all("Classifier") if c.startswith("License ::")] == []
    assert "LICENSE" in names
    assert (ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert metadata["Requires-Python"] == f">={PYTHONS[0]}"
    versions = [c.rsplit(" :: ", 1)[1] for c in metadata.get_all("Classifier") if re.fullmatch(r".*:: 3\.\d+", c)]
    assert tuple(versions) == PYTHONS
    assert metadata["Author"] == metadata["Maintainer"] == "tfreplay developers"


def test_the_metadata_gives_no_address_that_does_not_resolve(sdist):
    # The project has no public home yet: no home page or project URLs rather than placeholders.
    _, _, metadata = sdist
    assert metadata.get_all("Project-URL") is None and metadata.get("Home-page") is None
    assert "example.invalid" not in metadata.as_string()


def test_the_rl_extra_brings_what_the_demo_draws_its_learning_curve_with(sdist):
    path, _, _ = sdist
    with tarfile.open(path) as archive:
        (member,) = [m for m in archive.getmembers() if m.name.endswith(".egg-info/requires.txt")]
        text = archive.extractfile(member).read().decode()  # type: ignore[union-attr]
    extras = {}
    for section in re.split(r"^\[", text, flags=re.M)[1:]:  # `[name]` (or `[name:marker]`), then its requirements
        name, _, body = section.partition("]\n")
        extras.setdefault(name.split(":")[0], set()).update(re.split(r"[<>=;\[ ]", r)[0].lower() for r in body.split())
    assert {"gymnasium", "tf-keras", "absl-py", "matplotlib"} <= extras["rl"]


def readme_install() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8").split("## Install", 1)[1].split("\n## ", 1)[0]


def readme_wheel_command() -> list[str]:
    """The README's `pip wheel ...` line, as arguments (its comment dropped)."""
    (line,) = [line for line in readme_install().splitlines() if line.startswith("pip wheel ")]
    return line.split("#", 1)[0].split()


def test_the_readme_says_what_the_wheel_is_tagged_for():
    # The wheel carries compiled C libraries, so pip tags it for one CPython and one platform.
    install = readme_install()
    assert re.search(r"tfreplay-0\.1\.0-cp311-cp311-linux_x86_64\.whl", install), install
    assert "copied where it is needed" not in install


def test_the_demo_and_the_reverb_server_are_console_scripts(sdist):
    path, _, _ = sdist
    with tarfile.open(path) as archive:
        (member,) = [m for m in archive.getmembers() if m.name.endswith(".egg-info/entry_points.txt")]
        text = archive.extractfile(member).read().decode()  # type: ignore[union-attr]
    assert "[console_scripts]\ntfreplay-demo = tfreplay.rl.demo:run" in text
    assert "\ntfreplay-reverb-server = tfreplay.compat.reverb.serve:main" in text


# --- the wheel, installed as a user installs it (`make test-wheel`) ---

needs_wheel_lane = pytest.mark.skipif(
    os.environ.get("TFREPLAY_TEST_WHEEL") != "1", reason="`make test-wheel` runs it (a fresh venv, the package index)"
)


def clean_environment(home: pathlib.Path, path: str, **changes: str) -> dict:
    """The environment without tfreplay's settings, PYTHONPATH or a compiler choice; its own HOME and caches.
    pip's own settings (index, cache) stay, so the venv installs from the same index a user's would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFREPLAY_", "VIRTUAL_ENV"))}
    for name in ("PYTHONPATH", "CXX", "TF_USE_LEGACY_KERAS", "XDG_CACHE_HOME"):
        env.pop(name, None)
    env.update(HOME=str(home), PATH=path, TF_CPP_MIN_LOG_LEVEL="2", **changes)
    if "PIP_CACHE_DIR" not in os.environ:
        env["PIP_CACHE_DIR"] = str(pathlib.Path.home() / ".cache" / "pip")  # a warm cache across runs
    return env


class User:
    """A fresh venv with the wheel installed, used from a folder outside the repository."""

    def __init__(self, root: pathlib.Path):
        self.root, self.venv, self.here = root, root / "venv", root / "elsewhere"
        self.here.mkdir()
        (root / "home").mkdir()
        self.report: list[str] = []

    def env(self, **changes: str) -> dict:
        return clean_environment(self.root / "home", str(self.venv / "bin"), VIRTUAL_ENV=str(self.venv), **changes)

    def run(self, command: list, timeout: int = 600, **changes: str) -> subprocess.CompletedProcess:
        start = time.perf_counter()
        done = subprocess.run(
            command, cwd=self.here, env=self.env(**changes), capture_output=True, text=True, timeout=timeout
        )
        self.seconds = time.perf_counter() - start
        return done

    def python(self, code: str, **changes: str) -> subprocess.CompletedProcess:
        return self.run([str(self.venv / "bin/python"), "-c", code], **changes)

    def note(self, line: str) -> None:
        self.report.append(f"test-wheel: {line}")


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The wheel (`pip wheel .`) installed as `tfreplay[rl]` in a fresh venv, dependencies from the index."""
    root = tmp_path_factory.mktemp("user")
    start = time.perf_counter()
    # The README's command, from this venv (which has TensorFlow): the wheel carries its TF ops.
    pip, wheel_args = readme_wheel_command()[:2], readme_wheel_command()[2:]
    assert pip == ["pip", "wheel"] and wheel_args[-3:] == ["-w", "dist", "."], wheel_args
    command = [sys.executable, "-m", "pip", "wheel", "-q", *wheel_args[:-3], "-w", str(root / "dist"), str(ROOT)]
    done = subprocess.run(command, timeout=900, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (wheel,) = (root / "dist").glob("tfreplay-*.whl")
    user = User(root)
    user.wheel = wheel
    user.note(f"built {wheel.name} in {time.perf_counter() - start:.0f} s ({' '.join(readme_wheel_command())})")
    subprocess.run([sys.executable, "-m", "venv", str(user.venv)], check=True, timeout=300)
    # The TensorFlow the wheel's ops were built for (the index may hold a newer one, which would need the build step).
    tensorflow = f"tensorflow=={importlib.metadata.version('tensorflow')}"
    python = str(user.venv / "bin/python")
    # The same resolution from the same index as the venv's pip; uv (the Makefile's installer) takes seconds
    # where pip takes minutes to download and unpack TensorFlow again.
    uv = shutil.which("uv", path=os.path.dirname(sys.executable))
    installer, cache = [python, "-m", "pip", "install"], {}
    if uv:  # with the cache that filled this venv (the user's HOME here is a fresh one)
        installer = [uv, "pip", "install", "--python", python]
        cache = {"UV_CACHE_DIR": subprocess.run([uv, "cache", "dir"], capture_output=True, text=True).stdout.strip()}
    done = user.run([*installer, "-q", f"{wheel}[rl]", tensorflow], 900, **cache)
    assert done.returncode == 0, done.stderr[-3000:]
    installed = user.seconds
    listed = user.run([python, "-m", "pip", "list", "--format=json"]).stdout
    packages = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listed)}
    user.packages = packages
    user.note(
        f"fresh venv, {'uv ' if uv else ''}pip install <wheel>[rl]: {len(packages)} packages in {installed:.0f} s "
        f"(tensorflow {packages.get('tensorflow')}, tf-keras {packages.get('tf-keras')}, "
        f"gymnasium {packages.get('gymnasium')}; tqdm, tensorboard, matplotlib: "
        f"{', '.join(n for n in ('tqdm', 'tensorboard', 'matplotlib') if n in packages) or 'none'})"
    )
    yield user
    print("\n" + "\n".join(user.report))


@needs_wheel_lane
def test_the_wheel_imports_from_outside_the_repository(user):
    done = user.python("import json, tfreplay; print(json.dumps([tfreplay.__file__, len(tfreplay.__all__)]))")
    assert done.returncode == 0, done.stderr[-3000:]
    path, num_names = json.loads(done.stdout.splitlines()[-1])
    assert path.startswith(str(user.venv)) and num_names > 0, path
    user.note(f"import tfreplay: {num_names} public names, from the venv ({user.seconds:.1f} s)")


@needs_wheel_lane
def test_the_readme_quick_start_runs_from_the_wheel(user):
    code = quick_start()
    (user.here / "quick_start.py").write_text(code)
    done = user.run([str(user.venv / "bin/python"), "quick_start.py"])
    assert done.returncode == 0, done.stderr[-3000:]
    user.note(f"README quick start ({len(code.splitlines())} lines): ran in {user.seconds:.1f} s")


@needs_wheel_lane
def test_the_demo_command_trains_with_only_the_rl_extra(user):
    demo = str(user.venv / "bin/tfreplay-demo")
    done = user.run([demo, "--help"])
    assert done.returncode == 0 and "--steps: Total environment steps" in done.stdout, done.stderr[-3000:]
    done = user.run([demo, "--steps=2000", "--output_dir=run"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Greedy evaluation over 20 episodes" in done.stdout and "CartPole-v1: average return" in done.stdout
    assert list((user.here / "run/checkpoints").glob("ckpt-2000.index")) and (user.here / "run/history.json").exists()
    # One line for each optional package that is missing, and what the run did without it; the rl extra brings
    # matplotlib, so the learning curve is drawn and the run says where.
    told = [line for line in done.stderr.splitlines() if line.startswith("tfreplay:")]
    missing = [name for name in ("tqdm", "tensorboard") if name not in user.packages]
    assert sorted(line.split()[1] for line in told) == sorted(missing), told
    assert "matplotlib" in user.packages and (user.here / "run/learning_curve.png").stat().st_size > 0
    assert f"Learning curve: {user.here / 'run/learning_curve.png'}" in done.stdout
    if "tqdm" not in user.packages:
        assert "2,000/2,000 steps (100%)" in done.stdout
    user.note(f"tfreplay-demo --steps=2000: exit 0 in {user.seconds:.0f} s; {done.stdout.splitlines()[-1]}")
    user.note("  its lines about what is not installed: " + (" | ".join(told) or "none"))


@needs_wheel_lane
def test_the_wheel_samples_with_its_compiled_libraries_where_no_compiler_is(user):
    # Tagged for this CPython and platform, as the README says (compiled libraries inside).
    python, platform = f"cp{sys.version_info.major}{sys.version_info.minor}", sysconfig.get_platform()
    assert user.wheel.name == f"tfreplay-0.1.0-{python}-{python}-{platform.replace('-', '_').replace('.', '_')}.whl"
    names = zipfile.ZipFile(user.wheel).namelist()
    for library in ("sum_tree", "windows"):
        assert [n for n in names if n.startswith(f"tfreplay/native/_{library}.") and n.endswith(".so")], names
    assert "tfreplay/native/kernels/sum_tree_ops.cc" in names  # the TF ops' sources, for the build step
    assert "tfreplay/rl/demo.py" in names
    code = """
import json, numpy as np
from tfreplay import PyPrioritizedReplayBuffer, native
rb = PyPrioritizedReplayBuffer({"x": np.zeros([2], np.float32)}, capacity=64, seed=0)
rb.add_batch({"x": np.arange(32, dtype=np.float32).reshape(16, 2)})
_, info = rb.get_next(sample_batch_size=8)
rb.update_priorities(info.ids, np.full([8], 2.0))
items, _ = rb.get_next(sample_batch_size=8)
print(json.dumps([list(items["x"].shape), {row.name: [row.origin, row.path] for row in native.status()}]))
"""
    assert shutil.which("g++", path=str(user.venv / "bin")) is None
    done = user.python(code, TFREPLAY_CACHE=str(user.root / "cache"))  # an empty kernel cache: nothing built
    assert done.returncode == 0, done.stderr[-3000:]
    shape, status = json.loads(done.stdout.splitlines()[-1])
    assert shape == [8, 2] and [line for line in done.stderr.splitlines() if line.startswith("tfreplay:")] == []
    origin, path = status["sum_tree"]
    assert origin == "package" and path.startswith(str(user.venv)), status
    user.note(f"no compiler on PATH: the sum tree loads from the wheel ({path.rsplit('/', 1)[1]})")


TF_OPS_CODE = """
import json, tensorflow as tf, tfreplay
from tfreplay import native
rb = tfreplay.TFPrioritizedReplayBuffer({"x": tf.TensorSpec([2], tf.float32)}, batch_size=4, max_length=16, seed=0)
rb.add_batch({"x": tf.ones([4, 2])})
items, info = rb.get_next(8)
rb.update_priorities(info.ids, [2.0] * 8)
frames = tfreplay.TFFrameReplayBuffer(tfreplay.frame_data_spec((8, 8)), 2, 32, 4, seed=0)
kinds = {"frame": tf.uint8, "action": tf.int32, "reward": tf.float32}
for t in range(6):
    step = {k: tf.zeros([2, 8, 8] if k == "frame" else [2], kinds.get(k, tf.bool)) for k in frames.data_spec}
    frames.add_batch({**step, "first": tf.fill([2], t == 0)})
stacks, _ = frames.get_next(4)
print(json.dumps([tf.__version__, {row.name: [row.origin, row.path] for row in native.status()}]))
"""


def tf_ops_in_the_wheel(user, python: str, **changes: str) -> tuple[str, dict]:
    """`(TensorFlow version, kernel status)` after a TF prioritized and frame sample by `python`, with no compiler
    on PATH and an empty kernel cache; no line of tfreplay's (a fallback's warning) on stderr."""
    done = user.run([python, "-c", TF_OPS_CODE], TFREPLAY_CACHE=str(user.root / "cache"), **changes)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line for line in done.stderr.splitlines() if "tfreplay" in line] == [], done.stderr[-3000:]
    version, status = json.loads(done.stdout.splitlines()[-1])
    for op in ("sum_tree_ops", "frame_stack"):
        origin, path = status[op]
        assert origin == "package" and f"/tfreplay/native/ops/{op}-tf{version}-" in path, status
    return version, status


@needs_wheel_lane
def test_the_wheel_carries_the_tf_ops_so_prioritized_and_frames_need_no_build_step(user):
    names = zipfile.ZipFile(user.wheel).namelist()
    version = importlib.metadata.version("tensorflow")
    for op in ("sum_tree_ops", "frame_stack"):
        assert [n for n in names if n.startswith(f"tfreplay/native/ops/{op}-tf{version}-")], names
    assert shutil.which("g++", path=str(user.venv / "bin")) is None
    version, status = tf_ops_in_the_wheel(user, str(user.venv / "bin/python"))
    user.note(f"TensorFlow {version}, no build step: {status['sum_tree_ops'][1].rsplit('/', 1)[1]} from the wheel")


def second_tensorflow() -> pathlib.Path:
    """The second Python of `TFREPLAY_WHEEL_TF` (as `make test-wheel` and `make wheel` set it: TF 2.15's)."""
    others = [p for p in os.environ.get("TFREPLAY_WHEEL_TF", "").split(os.pathsep) if p and p != sys.executable]
    if not others:
        pytest.skip("TFREPLAY_WHEEL_TF names no second Python (make test-wheel names the TF 2.15 venv's)")
    return pathlib.Path(others[0]).absolute()


def venv_over(python: pathlib.Path, venv: pathlib.Path) -> pathlib.Path:
    """A fresh venv over `python`'s packages (a .pth file), with nothing of its own; returns its Python."""
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    code = "import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_path('purelib'), 'base.pth').write_text("
    code += "f'import site; site.addsitedir({sys.argv[1]!r})\\n')"
    subprocess.run([str(venv / "bin/python"), "-c", code, site], check=True, timeout=60)
    return venv / "bin/python"


def pip_install(python: pathlib.Path, what: str) -> None:
    """`pip install --no-deps what` into `python`'s venv (this venv's pip, run as that Python)."""
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", what]
    done = subprocess.run(install, timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@needs_wheel_lane
def test_the_wheel_built_for_two_tensorflows_loads_each_ones_ops(user, tmp_path):
    # TensorFlow 2.15 and its pins, with only the wheel installed on top.
    python = venv_over(second_tensorflow(), tmp_path / "venv")
    pip_install(python, str(user.wheel))
    version, status = tf_ops_in_the_wheel(user, str(python))
    assert version.startswith("2.15"), version
    user.note(f"TensorFlow {version}, no build step: {status['sum_tree_ops'][1].rsplit('/', 1)[1]} from the wheel")


@needs_wheel_lane
def test_pip_install_from_the_checkout_builds_the_tf_ops_where_tensorflow_is_installed(user, tmp_path):
    # `pip install .` (pip's isolated build) into a venv that has TensorFlow 2.15: the install builds its ops.
    python = venv_over(second_tensorflow(), tmp_path / "venv")
    start = time.perf_counter()
    pip_install(python, str(ROOT))
    seconds = time.perf_counter() - start
    version, status = tf_ops_in_the_wheel(user, str(python))
    assert version.startswith("2.15"), version
    user.note(f"pip install <checkout> where TensorFlow {version} is: {seconds:.0f} s, its TF ops from the package")


# --- the other Pythons of the supported range (`make test-pythons`) ---


def runs_as(path: str | None, version: str) -> bool:
    """Whether `path` is an interpreter of `version` (a pyenv shim of a version not selected is not)."""
    if not path or not os.access(path, os.X_OK):
        return False
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    done = subprocess.run([path, "-c", code], capture_output=True, text=True, timeout=60)
    return done.returncode == 0 and done.stdout.strip() == version


def interpreters() -> list:
    """python3.10 ... python3.13 other than this one: under pyenv's versions, or on PATH (probed only when
    `make test-pythons` asks)."""
    if os.environ.get("TFREPLAY_TEST_PYTHONS") != "1":
        return []
    found = []
    roots = sorted(pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv"), "versions").glob("3.*"))
    for version in PYTHONS:
        if version == f"{sys.version_info.major}.{sys.version_info.minor}":
            continue
        candidates = [str(r / f"bin/python{version}") for r in roots] + [shutil.which(f"python{version}")]
        path = next((c for c in candidates if runs_as(c, version)), None)
        found.append(pytest.param(version, path, marks=pytest.mark.skipif(path is None, reason="not installed")))
    return found


@pytest.mark.skipif(os.environ.get("TFREPLAY_TEST_PYTHONS") != "1", reason="`make test-pythons` runs it")
@pytest.mark.parametrize("version, interpreter", interpreters())
def test_the_sdist_installs_and_the_quick_start_runs_on(version, interpreter, sdist, tmp_path):
    path, _, _ = sdist
    venv, here = tmp_path / "venv", tmp_path / "elsewhere"
    here.mkdir()
    (tmp_path / "home").mkdir()
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, timeout=300)
    env = clean_environment(tmp_path / "home", f"{venv / 'bin'}:/usr/bin:/bin", VIRTUAL_ENV=str(venv))
    start = time.perf_counter()
    command = [str(venv / "bin/python"), "-m", "pip", "install", "-q", str(path)]  # builds its wheel, compiles
    done = subprocess.run(command, cwd=here, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    installed = time.perf_counter() - start
    (here / "quick_start.py").write_text(quick_start())
    code = "import json, platform, tensorflow as tf, tfreplay; from tfreplay import native; "
    code += "print(json.dumps([platform.python_version(), tf.__version__, native.sum_tree_library() is not None]))"
    start = time.perf_counter()
    ran = subprocess.run(
        [str(venv / "bin/python"), "quick_start.py"], cwd=here, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    seconds = time.perf_counter() - start
    checked = subprocess.run([str(venv / "bin/python"), "-c", code], cwd=here, env=env, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr[-3000:]
    python, tensorflow, compiled = json.loads(checked.stdout.splitlines()[-1])
    assert python.startswith(version + ".") and compiled
    print(  # shown with -s, as `make test-pythons` runs it
        f"\ntest-pythons: Python {python}: pip install <sdist> {installed:.0f} s (TensorFlow {tensorflow}, "
        f"C libraries compiled: {compiled}); README quick start {seconds:.1f} s"
    )
