"""Install tfreplay: `pip install .` (add `[rl]`, `[examples]`, `[ray]`, `[datasets]`, `[minari]`, `[test]`, `[bench]` or
`[dev]`)."""

import importlib.util
import pathlib
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

HERE = pathlib.Path(__file__).parent


def native_sources():
    """`tfreplay/native/_sources.py` (kernel files, shared flags, source keys), loaded by path: no TensorFlow."""
    spec = importlib.util.spec_from_file_location("tfreplay_native_sources", HERE / "tfreplay/native/_sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def native_libraries():
    """The plain C kernels as shared libraries inside the package (`tfreplay/native/_<name>.*.so`, loaded with
    ctypes, never imported): a baseline ISA, so a wheel runs on any CPU of its platform; each carries the key
    of its sources, which the loader checks."""
    sources = native_sources()
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


class OptionalBuildExt(build_ext):
    """Compiles the C libraries where a compiler works. Where none does, the install still succeeds (tfreplay
    then runs on its array-op fallback) and says so once."""

    failed = False

    def run(self):
        try:
            super().run()
        except (PlatformError, CCompilerError, ExecError, OSError) as err:
            self.without(err)

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
