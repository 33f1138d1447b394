# The README's commands. Each target sets itself up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-test
export TF_CPP_MIN_LOG_LEVEL ?= 2
export TF_USE_LEGACY_KERAS ?= 1

.PHONY: test test-slow demo test-pythons bench bench-charts bench-prioritized bench-windows bench-learner bench-memmap bench-gpu lint venv clean test-compat test-reverb reverb-dqn reverb-sac bench-peers bench-reverb bazel-test test-wheel wheel tutorials tutorials-site docs screenshots

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The venvs install with uv (from PyPI, into .venv): the same packages pip picks, in about half pip's time, compiled
# to bytecode as pip does. `$(UV) --python PYTHON` installs into another venv. The wheel lane builds with pip (the
# README's command) and installs the user's venv with uv, from the cache that filled this one.
$(VENV)/bin/uv: | $(VENV)/bin/python
	$(PY) -m pip install --quiet uv
UV = $(VENV)/bin/uv pip install --quiet --compile-bytecode

# The editable install compiles the C libraries in place; the TF ops are the explicit step after it, so
# `make test` covers the compiled kernels (and its build tests the fallbacks).
KERNELS := $(wildcard tfreplay/native/kernels/*) tfreplay/native/_sources.py

$(STAMP): setup.py $(KERNELS) | $(VENV)/bin/uv
	$(UV) --python $(PY) -e ".[test]"
	$(PY) -m tfreplay.native build
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check tfreplay tests benchmarks examples tutorials scripts
	$(PY) -m ruff format --check tfreplay tests benchmarks examples tutorials scripts
	$(PY) -m mypy tfreplay

# Every pytest lane runs on both cores (pytest-xdist: JOBS workers, `make test JOBS=0` for one process) and prints its
# 20 slowest tests, which `.ci/lanes.py` collects from a CI log. `loadfile` hands out whole files: a docs page's
# blocks share one namespace and run in order, and a test file's traced functions are traced once.
JOBS ?= 2
XDIST = $(if $(filter-out 0,$(JOBS)),-n $(JOBS) --dist loadfile,)
PYTEST_LANE = -q $(XDIST) --durations=20

# The suite under tf-keras. Tests marked `slow` (training runs, the tutorials' notebooks, long property, concurrency
# and crash runs), every python block of README.md and docs/ (Sybil, the root conftest.py) and the Keras 3 pass are
# `make test-slow`'s; ruff and mypy are `make lint`'s (CI runs all three lanes).
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_LANE) -m "not slow" tests

# The slow tests and the docs' examples, then every Keras-touching test (marked `keras`, slow or not) again under
# Keras 3, current TensorFlow's default (CI runs this lane after `make test`). Their property, soak and crash runs are
# sized by counts with fixed seeds; docs/architecture.md lists the variables that make them longer. Three workers:
# much of this lane waits on processes, servers and threads, which leaves a core idle under two. The Ray service's
# tests, and the docs page whose blocks start its cluster, run apart in one process: a cluster starts processes that
# import TensorFlow, which beside three busy workers wait minutes.
RAY_DOCS := docs/guides/distributed.md
test-slow: JOBS = 3
test-slow: $(STAMP)
	$(PY) -m pytest $(PYTEST_LANE) -m slow tests README.md docs --ignore=tests/distributed --ignore=$(RAY_DOCS)
	$(PY) -m pytest -q --durations=20 -m slow tests/distributed $(RAY_DOCS)
	TF_USE_LEGACY_KERAS=0 $(PY) -m pytest $(PYTEST_LANE) -m keras tests

# The tutorials' notebooks, written beside their jupytext percent scripts (tutorials/NN_topic.py -> .ipynb, not
# committed, without outputs): open them in Jupyter or upload them to Colab.
tutorials: $(STAMP)
	$(PY) -m jupytext --to ipynb tutorials/[0-9][0-9]_*.py

# The demo needs only the rl extra (gymnasium, tf-keras, absl-py, and matplotlib for its learning curve); add
# `.[examples]` for the progress bar and TensorBoard summaries. `make demo ARGS=--steps=2000` passes flags.
DEMO_STAMP := $(VENV)/.installed-rl
$(DEMO_STAMP): setup.py $(KERNELS) | $(VENV)/bin/uv
	$(UV) --python $(PY) -e ".[rl]"
	touch $(DEMO_STAMP)

# The tutorials as the site shows them: each run with its own parameters in a fresh kernel, saved with its outputs
# and plots as docs/tutorials/NN_topic.ipynb (committed; `make test` checks they hold the current cells).
# `make tutorials-site ARGS=02_collect_and_train` reruns one.
tutorials-site: $(STAMP)
	$(PY) tutorials/execute.py $(ARGS)

demo: $(DEMO_STAMP)
	$(PY) -m tfreplay.rl.demo $(ARGS)

# The benchmarks (benchmarks/test_*.py, pytest-benchmark; docs/benchmarks.md): each group of cases beside its floor,
# measured in the same run. A run saves its JSON under .benchmarks/ (`--benchmark-compare` sets a run beside the last
# saved one; `pytest-benchmark compare` lists them) and prints a Markdown table per group. `make bench` runs the
# uniform buffers (about a minute); `make bench BENCH=benchmarks` every file; `make bench ARGS="-k cartpole"` passes
# pytest arguments. `ROUNDS=R` times each file's cases in R interleaved rounds instead (benchmarks/interleave.py:
# every case in every round, medians and min-max over the rounds, each ratio taken within its round; the JSON in
# .benchmarks/interleaved.json). The targets whose tables are ratios interleave, 7 rounds unless ROUNDS says
# otherwise (`ROUNDS=0`: pytest-benchmark, one case after another).
BENCH ?= benchmarks/test_buffers.py
INTERLEAVED = $(filter-out 0,$(ROUNDS))
BENCH_JSON = .benchmarks/$(if $(INTERLEAVED),interleaved,last).json
BENCH_PYTEST = -m pytest -c benchmarks/pytest.ini \
	$(if $(INTERLEAVED),--interleaved=$(ROUNDS) --interleaved-json=$(BENCH_JSON),--benchmark-autosave --benchmark-json=$(BENCH_JSON))
bench-prioritized bench-memmap bench-learner bench-peers: ROUNDS ?= 7

$(VENV)/.installed-bench: setup.py $(STAMP)
	$(UV) --python $(PY) -e ".[bench]"
	touch $@

bench: $(VENV)/.installed-bench
	mkdir -p .benchmarks
	$(PY) $(BENCH_PYTEST) $(BENCH) $(ARGS)
	$(PY) -m benchmarks.report $(BENCH_JSON)

# The Benchmarks page's charts (docs/images/benchmarks/) from the interleaved runs it keeps in docs/data/benchmarks/:
# the learner's groups, memmap against RAM, and tfreplay over its peers (`make bench-peers`' JSON, kept as peers.json).
bench-charts: $(VENV)/.installed-bench
	$(PY) -m benchmarks.charts docs/data/benchmarks/learner.json --out docs/images/benchmarks
	$(PY) -m benchmarks.charts docs/data/benchmarks/memmap.json --out docs/images/benchmarks \
		--one-chart "memory-mapped storage against RAM (NumPy buffers)"
	$(PY) -m benchmarks.charts docs/data/benchmarks/peers.json --out docs/images/benchmarks --groups peers \
		--one-chart "tfreplay's time over TF-Agents', per call (TF 2.15)" --versus --name peers-tf-agents
	$(PY) -m benchmarks.charts docs/data/benchmarks/peers.json --out docs/images/benchmarks --groups peers \
		--one-chart "tfreplay's time over cpprb's and Reverb's, NumPy side (TF 2.15)" --beside cpprb reverb \
		--name peers-cpprb-reverb

bench-prioritized: $(VENV)/.installed-bench
	$(MAKE) bench BENCH=benchmarks/test_prioritized.py ROUNDS=$(ROUNDS)

bench-windows: $(VENV)/.installed-bench
	$(MAKE) bench BENCH=benchmarks/test_windows.py

# NumPy buffers with `storage_dir` against the same buffers in RAM, hot and cold cache (reads and drops a 1 GB file).
bench-memmap: $(VENV)/.installed-bench
	$(MAKE) bench BENCH=benchmarks/test_memmap.py ROUNDS=$(ROUNDS)

# Replay-to-update pipelines side by side (NumPy buffer, as_dataset, get_next, TrainLoop K, XLA) against the
# constant-batch floor, on the demo's Q-network and the DDPG example's update (a few minutes).
bench-learner: $(VENV)/.installed-bench $(DEMO_STAMP)
	$(MAKE) bench BENCH=benchmarks/test_learner.py ROUNDS=$(ROUNDS)

# The learner and the buffer's add/sample on the GPU beside the CPU (under 10 minutes); ARGS=--cpu-only without one.
bench-gpu: $(STAMP) $(DEMO_STAMP)
	$(PY) -m benchmarks.gpu $(ARGS)

# The docs site into site/: mkdocs-material, API pages from the docstrings (mkdocstrings), the tutorials/ scripts
# rendered unexecuted (mkdocs-jupyter, through the docs/tutorials link); --strict fails on any warning.
$(VENV)/.installed-docs: setup.py $(STAMP)
	$(UV) --python $(PY) -e ".[docs]"
	touch $@

docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# The built site as a reader's browser draws it: headless Chromium (Debian's, installed when missing) screenshots the
# home page, a guide, an executed tutorial and the Benchmarks page into site-screenshots/.
screenshots: docs
	command -v chromium >/dev/null || { sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq chromium; }
	$(PY) scripts/screenshots.py --site site --out site-screenshots

# The sdist installed (its C libraries compiled) on each other Python of 3.10-3.13 found on PATH or under
# pyenv, and the README's quick start run there. Manual: several minutes (a TensorFlow install per Python).
test-pythons: $(STAMP)
	TFREPLAY_TEST_PYTHONS=1 $(PY) -m pytest -q -s -p no:cacheprovider tests/test_packaging.py -k "installs_and_the_quick_start"

# The compatibility lane: its own venv (TF 2.15.1, TF-Agents 0.19.0 and their pins), built once and reused.
COMPAT_VENV := .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_STAMP := $(COMPAT_VENV)/.installed-compat
# Where a venv's python ($(1)) has tf_agents installed, found without importing it: TF-Agents' tests run from the wheel.
TFA_ROOT = $(shell $(1) -c "import importlib.util as u; print(u.find_spec('tf_agents').submodule_search_locations[0])")
TFA_DIR = $(call TFA_ROOT,$(COMPAT_PY))/replay_buffers

$(COMPAT_STAMP): tests/compat/requirements.txt | $(VENV)/bin/uv
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(UV) --python $(COMPAT_PY) -r tests/compat/requirements.txt
	$(UV) --python $(COMPAT_PY) dm-reverb==0.14.0 || echo "dm-reverb 0.14.0 did not install: bench-peers skips it"
	touch $(COMPAT_STAMP)

# A wheel with the TF ops for TensorFlow 2.15 (the compat venv's) and the current one (.venv's) into dist/: on either
# TensorFlow, prioritized and frame buffers run their compiled ops with no build step. setup.py builds the ops for
# each Python that TFREPLAY_WHEEL_TF names (README.md: Install).
WHEEL_TF = $(CURDIR)/$(PY):$(CURDIR)/$(COMPAT_PY)
wheel: $(STAMP) $(COMPAT_STAMP)
	TFREPLAY_WHEEL_TF=$(WHEEL_TF) $(PY) -m pip wheel --no-deps --no-build-isolation -w dist .

# A user's install: the README's `pip wheel` command (for both TensorFlows, as `make wheel`), then
# `<wheel>[rl]` installed in one fresh venv (dependencies from the package index), used from a folder outside the
# checkout: import tfreplay, the README's quick start, `tfreplay-demo --steps=2000`, the compiled sum tree and the
# wheel's TF ops loading with no compiler on PATH and no build step (on TF 2.15 too, over the compat venv's
# packages). Prints what it did.
test-wheel: $(STAMP) $(COMPAT_STAMP)
	TFREPLAY_WHEEL_TF=$(WHEEL_TF) TFREPLAY_TEST_WHEEL=1 $(PY) -m pytest -q -s --durations=20 -p no:cacheprovider \
		tests/test_packaging.py

# tfreplay's TF ops for the lane's TensorFlow (that venv finds tfreplay through PYTHONPATH, not pip).
COMPAT_OPS := $(COMPAT_VENV)/.built-ops
$(COMPAT_OPS): $(COMPAT_STAMP) $(KERNELS)
	PYTHONPATH=$(CURDIR) $(COMPAT_PY) -m tfreplay.native build
	touch $(COMPAT_OPS)

# TF-Agents' own tests against tfreplay.compat (imports redirected by tests/compat/redirect.py), then the parts of
# tfreplay's suite that meet what TensorFlow's version changes (COMPAT_TESTS): the interop tests, Keras 2, the TF
# ops built against TF 2.15, the contract suite in every mode (eager, tf.function, as_dataset), checkpoints (the
# golden ones included) and the compiled train loop. Feature tests (frames, transforms, hindsight, datasets) run
# through these same paths and stay on current TensorFlow. `-p tf_dependent` (tests/compat/tf_dependent.py)
# deselects the NumPy-only cases; the slow tests and the Reverb shim's (`make test-reverb`) stay out. One pytest
# run, one summary line, with TensorFlow's graph optimizer on (the other lanes' tests run without it; tests/conftest.py).
COMPAT_TESTS = tests/compat tests/keras tests/native tests/library/test_contract.py tests/library/test_checkpoint.py \
	tests/library/test_golden_checkpoints.py tests/library/test_restore_integrity.py tests/library/test_fused.py
test-compat: $(COMPAT_OPS)
	@echo "test-compat: $$($(COMPAT_PY) -m pip list 2>/dev/null | grep -E '^(tensorflow|tf-agents) ' | tr -s ' ' | paste -sd, -)"
	TFREPLAY_TEST_GRAPPLER=1 PYTHONPATH=$(CURDIR):$(CURDIR)/tests/compat $(COMPAT_PY) -m pytest $(PYTEST_LANE) -c tests/compat/pytest.ini --rootdir=$(CURDIR) --confcutdir=$(CURDIR)/tests \
		-p tf_dependent -k "not WithHashing" -m "not slow" --ignore=tests/compat/reverb \
		$(TFA_DIR)/tf_uniform_replay_buffer_test.py $(TFA_DIR)/py_replay_buffers_test.py::PyUniformReplayBufferTest \
		$(COMPAT_TESTS)

# The Reverb lane: TF-Agents' own Reverb tests (from the 0.19.0 wheel) against tfreplay.compat.reverb, `import reverb`
# redirected by tests/compat/reverb_redirect.py: (a) in the compat venv (TF 2.15, where the real dm-reverb also
# installs), with tfreplay's Reverb tests and, in a pytest of their own (no redirect), the differential tests against
# the real Reverb; (b) on current TensorFlow in .venv-reverb: TF 2.21 with tf-agents --no-deps. tfreplay's slow Reverb
# tests (processes, servers and stress runs) are `make test-slow`'s, on current TensorFlow.
TFA_REVERB = replay_buffers/reverb_replay_buffer_test.py replay_buffers/reverb_utils_test.py \
	experimental/distributed/reverb_variable_container_test.py train/utils/replay_buffer_utils_test.py
REVERB_VENV := .venv-reverb
REVERB_PY := $(REVERB_VENV)/bin/python
REVERB_STAMP := $(REVERB_VENV)/.installed-reverb
REVERB_PYTEST = -m pytest -q --durations=20 -c tests/compat/pytest.ini -p reverb_redirect --rootdir=$(CURDIR) --confcutdir=$(CURDIR)/tests

# .venv-reverb adds to the main venv instead of installing TensorFlow again: a .pth file puts .venv's packages
# (TensorFlow, tf-keras, pytest, ...) behind its own, and pip installs only what the pins add or change on top
# (TF-Agents, TensorFlow Probability, gym, NumPy below 2.4, which shadows the main venv's).
MAIN_SITE = $(shell $(PY) -c "import sysconfig; print(sysconfig.get_path('purelib'))")

$(REVERB_STAMP): tests/compat/requirements-reverb.txt $(STAMP)
	rm -rf $(REVERB_VENV)
	$(PYTHON) -m venv $(REVERB_VENV)
	$(REVERB_PY) -c "import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_path('purelib'), 'main-venv.pth').write_text(f'import site; site.addsitedir({sys.argv[1]!r})\n')" "$(MAIN_SITE)"
	$(REVERB_PY) -m pip install --quiet -r tests/compat/requirements-reverb.txt
	$(REVERB_PY) -m pip install --quiet --no-deps tf-agents==0.19.0
	touch $(REVERB_STAMP)

REVERB_OPS := $(REVERB_VENV)/.built-ops
$(REVERB_OPS): $(REVERB_STAMP) $(KERNELS)
	PYTHONPATH=$(CURDIR) $(REVERB_PY) -m tfreplay.native build
	touch $(REVERB_OPS)

# The servers these lanes start listen on the loopback interface only.
test-reverb reverb-dqn reverb-sac: export TFREPLAY_REVERB_HOST = 127.0.0.1

test-reverb: $(COMPAT_OPS) $(REVERB_OPS)
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests/compat $(COMPAT_PY) $(REVERB_PYTEST) $(XDIST) \
		-m "not slow" $(addprefix $(call TFA_ROOT,$(COMPAT_PY))/,$(TFA_REVERB)) tests/compat/reverb \
		--ignore=tests/compat/reverb/test_differential.py
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests/compat $(COMPAT_PY) -m pytest -q --durations=20 -c tests/compat/pytest.ini --rootdir=$(CURDIR) --confcutdir=$(CURDIR)/tests \
		tests/compat/reverb/test_differential.py
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests/compat $(REVERB_PY) $(REVERB_PYTEST) $(addprefix $(call TFA_ROOT,$(REVERB_PY))/,$(TFA_REVERB))

# TF-Agents' DQN example (tf_agents/examples/dqn/dqn_train_eval.py, unmodified) on TF 2.21 over the shim, to a return of
# 195 on CartPole, with its checkpoint saved and reloaded; prints the time, env steps, steps/s and the returns.
reverb-dqn: $(REVERB_OPS)
	TF_USE_LEGACY_KERAS=1 PYTHONPATH=$(CURDIR) $(REVERB_PY) tests/compat/reverb_dqn.py $(ARGS)

# TF-Agents' distributed SAC example (examples/sac/sac_{reverb_server,collect,train}.py and eval_job.py, unmodified,
# from a source checkout: the wheel leaves them out) as separate processes on TF 2.21 over the shim, on Pendulum-v1
# to an average return above -400; prints the time, env and train steps, the returns and the policy steps the collect
# job pulled. Get the checkout with `git clone --branch v0.19.0 --depth 1 https://github.com/tensorflow/agents`.
reverb-sac: $(REVERB_OPS)
	TF_USE_LEGACY_KERAS=1 PYTHONPATH=$(CURDIR) $(REVERB_PY) tests/compat/reverb_sac.py $(TFA_SRC) $(ARGS)

# Bazel 4.2.3 from Debian (bazel-bootstrap, with bazel-bootstrap-source for the rule mocks .bazelrc names; both
# installed when missing), offline: builds every target and runs two test targets with the venv's Python (one checks
# that every module is in exactly one target, the other reads data files: the golden checkpoints).
# Every test file has its target: `bazel test --python_path=$$PWD/.venv/bin/python //...` runs them all.
BAZEL_TESTS := //:test_bazel_build //:test_golden_checkpoints

bazel-test: $(STAMP)
	command -v bazel >/dev/null && test -d /usr/src/bazel-bootstrap/mock_repos || { sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq bazel-bootstrap bazel-bootstrap-source; }
	mkdir -p $(HOME)/.cache/tfreplay
	bazel build --python_path=$(CURDIR)/$(PY) //...
	bazel test --python_path=$(CURDIR)/$(PY) --sandbox_writable_path=$(HOME)/.cache/tfreplay $(BAZEL_TESTS)

# tfreplay beside TF-Agents, cpprb and Reverb, and TF-Agents' own DqnAgent loop beside tfreplay's, on TF 2.15.
bench-peers: $(COMPAT_OPS)
	mkdir -p .benchmarks
	PYTHONPATH=$(CURDIR) $(COMPAT_PY) $(BENCH_PYTEST) benchmarks/test_peers.py benchmarks/test_learner.py -k "peers or tf_agents" $(ARGS)
	PYTHONPATH=$(CURDIR) $(COMPAT_PY) -m benchmarks.report $(BENCH_JSON)

# The Reverb shim's gRPC server beside dm-reverb 0.14's, across processes, on TF 2.15 (`ARGS=--quick` for a smoke
# run, `ARGS="--rounds 5"` for more rounds); the table on stdout, the figures in .benchmarks/reverb_service.json.
bench-reverb: $(COMPAT_OPS)
	PYTHONPATH=$(CURDIR) $(COMPAT_PY) -m benchmarks.reverb_service $(ARGS)

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(REVERB_VENV) runs .pytest_cache .ruff_cache .benchmarks
