"""Install tfreplay: `pip install .` (add `[rl]`, `[examples]`, `[ray]`, `[test]`, `[bench]` or `[dev]`)."""

from setuptools import find_packages, setup

RL = ["gymnasium>=1.0", "tf-keras>=2.15", "absl-py>=1.0"]  # tfreplay.rl: drivers, agents, training
EXAMPLES = RL + ["tqdm>=4.60", "matplotlib>=3.5", "tensorboard"]
RAY = ["ray==2.60.0"]  # tfreplay.distributed, the sharded replay service (imported only there)
TEST = [
    "pytest>=7",
    "hypothesis>=6.80",
    "attrs>=22",
    "scipy>=1.10",
    "ruff>=0.4",
    "mypy>=1.5",
    "nbclient>=0.9",
    "nbformat>=5.9",
    "ipykernel>=6.20",
] + EXAMPLES + RAY

setup(
    name="tfreplay",
    version="0.1.0",
    description="TensorFlow-native experience replay: uniform buffers in tf.Variables and their NumPy twin.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfreplay", "tfreplay.*"]),
    package_data={"tfreplay": ["native/kernels/*.cc", "native/kernels/*.h"]},  # native kernels, compiled on first use
    python_requires=">=3.9",
    install_requires=[
        "tensorflow>=2.15",
        "numpy>=1.23",
    ],
    extras_require={
        "rl": RL,
        "test": TEST,
        "examples": EXAMPLES,
        "ray": RAY,
        "bench": ["cpprb>=10.7"],  # benchmarks/prioritized.py compares against its PrioritizedReplayBuffer
        "dev": TEST + ["pytest-benchmark", "pyinstrument"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
