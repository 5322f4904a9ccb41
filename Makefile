# jdist: two commands on a fresh machine — `make demo` and `make test`.
# Everything goes into .venv at the repo root (no system MPI). `make test` also installs, when missing,
# Debian's chromium (browser test) and slurm/munge/sshd (the multi-node test bed), as the CI machine's root.

PYTHON ?= python3
# The CPU build of torch (on these machines it lies on disk); override for a CUDA build.
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.jdist-installed
PYTEST_FLAGS ?= -q --durations=12
# make test: two pytest-xdist workers, each running whole test files (tests/conftest.py: families, longest first)
TEST_WORKERS ?= 2

.PHONY: venv horovod deepspeed tf chromium testbed labextension demo test test-fast bench lab clean \
	packaging check-wheel check-extras check-binder docs

$(STAMP): pyproject.toml Makefile
	@echo "== Creating $(VENV) and installing jdist with its test dependencies =="
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	HATCH_JUPYTER_BUILDER_SKIP_NPM=1 $(BIN)/python -m pip install -q -e ".[test]"
	@# rfc3987-syntax (jsonschema's optional "iri" format check, pulled in by JupyterLab; no Jupyter schema
	@# uses that format) builds its parsers at import: 2.2 s of CPU in every process that imports jsonschema,
	@# each Ray worker among them (a Ray Train fit of 2 workers: 29 -> 23 s here). docs/frameworks.md.
	$(BIN)/python -m pip uninstall -q -y rfc3987-syntax
	touch $(STAMP)

venv: $(STAMP)

# Horovod (for --backend horovod) has no wheel on PyPI: built once from source against the
# venv's torch with MPI (3-8 minutes), the wheel cached in ~/.cache/jdist/wheels.
horovod: venv
	tools/build_horovod.sh $(VENV)

# DeepSpeed (--backend deepspeed, installed with the venv) builds a C++ op the first time a cluster
# starts (~35 s): built here once, cached in ~/.cache/jdist/torch_extensions.
deepspeed: venv
	$(BIN)/python tools/build_deepspeed_ops.py

# tf-keras (tf.keras for --framework tf's model.fit) without its requirement on the full tensorflow wheel:
# the venv has tensorflow-cpu (jdist[tf], in jdist[test]). Installed only if missing.
tf: venv
	$(BIN)/python -c "import tf_keras" 2>/dev/null || $(BIN)/python -m pip install -q --no-deps "tf-keras==2.21.0"

demo: venv
	$(BIN)/python tools/run_notebook.py notebooks/01-quickstart.ipynb --out build/

# One pytest run: unit and integration tests, the docstring examples, and the notebooks executed by nbval
# (cells marked NBVAL_CHECK_OUTPUT are compared with their saved output); then the packaging
# checks (make packaging), which make clean venvs and so run outside pytest's time budget.
# pytest's wall time (the CI budget is 15 minutes) is printed again as the last line, pass or fail.
test: venv horovod deepspeed tf chromium testbed
	@mkdir -p build; start=$$(date +%s); \
	JDIST_RUN_DIR=$(CURDIR)/build/runs $(BIN)/python -m pytest --nbval-lax tests jdist notebooks -n $(TEST_WORKERS) $(PYTEST_FLAGS); \
	rc=$$?; took=$$(( $$(date +%s) - start )); \
	echo "make test: pytest took $$took s ($$((took / 60)) min $$((took % 60)) s), exit code $$rc" > build/pytest-time.txt; \
	cat build/pytest-time.txt; exit $$rc
	@$(MAKE) --no-print-directory packaging || { cat build/pytest-time.txt; exit 1; }
	@cat build/pytest-time.txt

# The fast tier for the edit loop: unit and pure tests and the docstring examples; no kernel, MPI
# cluster, Jupyter server or browser (tests marked `cluster` are left out). About a minute on 2 cores with the
# suite's workers (66 s in all, 49 s of tests; 84 s in one process: measured 2026-12-03).
test-fast: venv
	JDIST_RUN_DIR=$(CURDIR)/build/runs $(BIN)/python -m pytest -m "not cluster" tests jdist -n $(TEST_WORKERS) $(PYTEST_FLAGS)

# What a user gets, checked as a user gets it (tools/check_*.py: clean venvs made by uv, torch = TORCH_SPEC);
# each prints `check-NAME: N passed, M failed` and its times. `make test` runs them after pytest.
packaging: check-wheel check-extras check-binder docs

# The sdist and wheel (python -m build, twine check --strict); the wheel alone in a clean venv with torch
# and JupyterLab: one version everywhere, both extensions enabled, the quickstart run through a real
# jupyter server while the sidebar's endpoints list its cluster.
check-wheel: venv
	TORCH_SPEC="$(TORCH_SPEC)" $(BIN)/python tools/check_wheel.py

# Each extra of the wheel alone in a clean venv: uv pip check, and the modules it promises import.
check-extras: venv
	TORCH_SPEC="$(TORCH_SPEC)" $(BIN)/python tools/check_extras.py

# binder/: what jupyter-repo2docker --no-build would build, those steps in a clean venv, and the binder
# notebooks (binder/notebooks.txt) executed under a 2 GiB memory cgroup, with their peak memory.
check-binder: venv
	TORCH_SPEC="$(TORCH_SPEC)" $(BIN)/python tools/check_binder.py

# The documentation site (Sphinx, PyData theme, MyST; notebooks from their saved outputs) with warnings as
# errors, then every internal link and anchor of the built HTML. Open build/docs/html/index.html.
docs: venv
	rm -rf build/docs/html
	$(BIN)/python -m sphinx -E -W --keep-going -q -b html -c docs -d build/docs/doctrees . build/docs/html
	$(BIN)/python tools/check_docs_links.py build/docs/html

# Debian chromium for the browser test (tests/test_browser.py); installed only if missing.
chromium:
	tools/install_chromium.sh

# Debian slurm, munge and sshd for the two-node test bed of the multi-node tests (tools/testbed.py);
# installed only if missing, daemons never started outside the bed's namespaces.
testbed:
	tools/install_testbed.sh

# Rebuild the prebuilt JupyterLab extension (jdist/labextension) from labextension/ (needs node).
labextension: venv
	VENV=$(VENV) tools/build_labextension.sh

bench: venv horovod deepspeed tf chromium
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_dashboard.py
	$(BIN)/python benchmarks/bench_backends.py --repeats 4
	$(BIN)/python benchmarks/bench_faults.py --repeats 2
	$(BIN)/python benchmarks/bench_cli.py --repeats 5
	$(BIN)/python benchmarks/bench_model_parallel.py --repeats 5
	$(BIN)/python benchmarks/bench_compression.py --repeats 3
	$(BIN)/python benchmarks/bench_troubleshooting.py
	$(BIN)/python benchmarks/bench_tune.py --repeats 3
	$(BIN)/python benchmarks/bench_debug.py
	$(BIN)/python benchmarks/bench_scale.py
	$(BIN)/python benchmarks/bench_ray.py
	$(BIN)/python benchmarks/bench_tf.py

lab: venv
	$(BIN)/python -m pip install -q -e ".[lab]"
	$(BIN)/jupyter lab notebooks

clean:
	rm -rf build .pytest_cache
