"""Install tfreplay: `pip install .` (add `[rl]`, `[examples]`, `[ray]`, `[datasets]`, `[minari]`, `[test]`, `[bench]` or
`[dev]`)."""

import concurrent.futures
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

HERE = pathlib.Path(__file__).parent


def native_module(name):
    """`tfreplay/native/<name>.py` loaded by its path, with no TensorFlow and nothing else of tfreplay: `_sources`
    (kernel files, shared flags, source keys) and `_build` (the compiler, one compile)."""
    spec = importlib.util.spec_from_file_location(f"tfreplay_native{name}", HERE / f"tfreplay/native/{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def native_libraries():
    """The plain C kernels as shared libraries inside the package (`tfreplay/native/_<name>.*.so`, loaded with
    ctypes, never imported): a baseline ISA, so a wheel runs on any CPU of its platform; each carries the key
    of its sources, which the loader checks."""
    sources = native_module("_sources")
    return [
        Extension(
            f"tfreplay.native._{name}",
            [f"tfreplay/native/kernels/{sources.FILES[name][0]}"],
            depends=[f"tfreplay/native/kernels/{file}" for file in sources.FILES[name][1:]],
            language="c++",  # linked by the C++ driver, with its runtime
            extra_compile_args=[*sources.FLAGS, "-g0"],
            define_macros=[(sources.KEY_MACRO, f'"{sources.source_key(name)}"')],
            optional=True,  # an install goes on without it (see OptionalBuildExt)
        )
        for name in sources.LIBRARIES
    ]


def tf_pythons():
    """`(python, hidden)` for each Python whose TensorFlow the TF ops are built for: `TFREPLAY_WHEEL_TF` (paths
    separated by `os.pathsep`; `none` for no TF ops), else this Python where it has TensorFlow. `hidden`: this
    Python's own environment is hidden from this build (pip's isolated build puts its own packages first through
    PYTHONPATH and drops the environment's); asked without that, it still shows whether TensorFlow is installed
    where the package goes, as in `pip install .` in a venv that has TensorFlow."""
    named = os.environ.get("TFREPLAY_WHEEL_TF", "")
    if named.strip().lower() == "none":
        return []
    if named:
        return [(python, python != sys.executable) for python in named.split(os.pathsep) if python]
    if importlib.util.find_spec("tensorflow") is not None:
        return [(sys.executable, False)]
    if "PYTHONPATH" in os.environ:  # an isolated build: is TensorFlow where the package is going?
        code = "import importlib.util as u, sys; sys.exit(u.find_spec('tensorflow') is None)"
        done = subprocess.run([sys.executable, "-c", code], env=_unhidden(), capture_output=True)
        if done.returncode == 0:
            return [(sys.executable, True)]
    return []


def _unhidden():
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}


def tensorflow_of(python, hidden):
    """`(version, compile and link flags)` of the TensorFlow that `python` imports, asked in a process of its own
    (`hidden`: without this build's PYTHONPATH, which would hide that Python's packages)."""
    code = "import json, tensorflow as tf; s = tf.sysconfig"
    code += "; print(json.dumps([tf.__version__, s.get_compile_flags() + s.get_link_flags()]))"
    env = dict(_unhidden() if hidden else os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise OSError(f"{python} could not import tensorflow: {done.stderr.strip().splitlines()[-1:]}")
    version, flags = json.loads(done.stdout.strip().splitlines()[-1])
    return version, flags


class OptionalBuildExt(build_ext):
    """Compiles the C libraries where a compiler works, then the TF ops for each TensorFlow of `tf_pythons()`
    (`tfreplay/native/ops/<op>-tf<version>-<sources>.so`: loaded only by that TensorFlow version). Where no
    compiler works, the install still succeeds (tfreplay then runs on its array-op fallback) and says so once."""

    failed = False

    def run(self):
        try:
            super().run()
        except (PlatformError, CCompilerError, ExecError, OSError) as err:
            self.without(err)
        if not self.failed:
            self.build_tf_ops()

    def build_tf_ops(self):
        """Both ops for each TensorFlow, side by side (a compiler process per core), for any CPU of the platform
        (no -march=native, as the C libraries). A failed op is left out, with the compiler's first error."""
        sources = native_module("_sources")
        folder = pathlib.Path("tfreplay" if self.inplace else os.path.join(self.build_lib, "tfreplay"))
        folder = folder / "native" / sources.PACKAGED_OPS
        for stale in folder.glob("*.so"):  # an earlier build's, in a reused build folder
            stale.unlink()
        jobs = []
        for python, hidden in tf_pythons():
            try:
                version, flags = tensorflow_of(python, hidden)
            except OSError as err:
                print(f"tfreplay: no TF ops for {python}: {err}", file=sys.stderr)
                continue
            jobs += [(name, version, flags) for name in sources.OPS]
        if not jobs:
            return
        tools = native_module("_build")
        compiler = tools.compiler()
        if compiler is None:
            print(f"tfreplay: no TF ops: {tools.no_compiler_reason()}", file=sys.stderr)
            return
        folder.mkdir(parents=True, exist_ok=True)
        versions = sorted({version for _, version, _ in jobs})
        print(f"tfreplay: building its TF ops for TensorFlow {', '.join(versions)} into {folder} ...", flush=True)
        start = time.perf_counter()

        def build(job):
            name, version, flags = job
            target = folder / sources.packaged_op(name, version)
            source = sources.KERNELS / sources.FILES[name][0]
            command = [*compiler, str(source), "-o", f"{target}.tmp", *sources.build_flags(name, flags), "-g0"]
            ok, output = tools.run(command)
            if not ok:
                return f"tfreplay: {name} for TensorFlow {version} left out: {tools.first_error(compiler, output)}"
            os.replace(f"{target}.tmp", target)
            return None

        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            for failure in pool.map(build, jobs):
                if failure:
                    print(failure, file=sys.stderr)
        print(f"tfreplay: TF ops built in {time.perf_counter() - start:.0f} s", flush=True)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, OSError) as err:
            self.without(err)

    def without(self, err):
        if not self.failed:
            self.failed = True
            print(
                f"tfreplay: compiling its C libraries failed ({err}); installing without them: tfreplay uses "
                "array ops instead (same results, slower). Install a C++ compiler and reinstall, or install a wheel.",
                file=sys.stderr,
            )


# tfreplay.rl: drivers, agents, training, and the demo's learning curve (matplotlib, imported only to draw it)
RL = ["gymnasium>=1.0", "tf-keras>=2.15", "absl-py>=1.0", "matplotlib>=3.5"]
EXAMPLES = RL + ["tqdm>=4.60", "tensorboard"]
RAY = ["ray==2.60.0"]  # tfreplay.distributed, the sharded replay service (imported only there)
DATASETS = ["tensorflow-datasets>=4.9"]  # tfreplay.datasets: RLDS in and out (imported only there)
# tfreplay.datasets' Minari side (imported only there). Minari 0.5.4 needs Python >= 3.11 and NumPy >= 2 (and is
# the first to store image spaces raw); 0.5.3 is the last for Python 3.10 and NumPy 1. Minari's storages import
# Pillow without declaring it.
MINARI = [
    'minari[hdf5,arrow]>=0.5.4,<0.6; python_version >= "3.11"',
    'minari[hdf5,arrow]>=0.5.3,<0.5.4; python_version < "3.11"',
    "pillow",
]
TEST = (
    [
        "pytest>=7",
        "hypothesis>=6.80",
        "attrs>=22",
        "scipy>=1.10",
        "ruff>=0.4",
        "mypy>=1.5",
        "nbclient>=0.9",
        "nbformat>=5.9",
        "ipykernel>=6.20",
        "jupytext>=1.16",  # the tutorials are percent scripts, converted to notebooks to run
        "sybil[pytest]>=6",  # runs every python block of README.md and docs/ (the root conftest.py)
        "pytest-benchmark>=4",  # tests/benchmarks runs the benchmark files on tiny sizes
        "pytest-xdist>=3.5",  # every pytest lane runs on both cores
    ]
    + EXAMPLES
    + RAY
    + DATASETS
    + MINARI
)

setup(
    name="tfreplay",
    version="0.1.0",
    description="TensorFlow-native experience replay: uniform buffers in tf.Variables and their NumPy twin.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfreplay", "tfreplay.*"]),
    # The kernels' sources travel too: `python -m tfreplay.native build` compiles the TF ops from them.
    package_data={"tfreplay": ["native/kernels/*.cc", "native/kernels/*.h"]},
    ext_modules=native_libraries(),
    cmdclass={"build_ext": OptionalBuildExt},
    entry_points={
        "console_scripts": [
            "tfreplay-demo = tfreplay.rl.demo:run",  # needs the rl extra
            "tfreplay-reverb-server = tfreplay.compat.reverb.serve:main",  # a Reverb server from a JSON config
        ]
    },
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.15",
        "numpy>=1.23",
    ],
    extras_require={
        "rl": RL,
        "test": TEST,
        "examples": EXAMPLES,
        "ray": RAY,
        "datasets": DATASETS,
        "minari": MINARI,
        # benchmarks/: pytest-benchmark runs them; test_prioritized.py and test_peers.py time cpprb beside tfreplay
        "bench": ["pytest-benchmark>=4", "cpprb>=10.7", "matplotlib>=3.5"],  # matplotlib: benchmarks.charts
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings-python>=1.10", "mkdocs-jupyter>=0.24"],
        "dev": TEST + ["pytest-benchmark", "pyinstrument"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Programming Language :: C++",
        "Topic :: Software Development :: Libraries :: Python Modules",
    ],
    license="Apache-2.0",  # an SPDX expression (setuptools deprecates license classifiers beside one)
    license_files=["LICENSE"],
    author="tfreplay developers",
    maintainer="tfreplay developers",
    keywords=["reinforcement learning", "experience replay", "replay buffer", "tensorflow"],
)
