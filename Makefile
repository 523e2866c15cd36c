# Two entry points for a fresh machine: `make demo` and `make test` (see README).
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
TORCH_VERSION ?= 2.13.0
BASE := .make-base
DEV := .make-dev

.PHONY: install install-dev demo demo-deepspeed test test-fast lint bench gpu-check dash clean

# CPU torch first, pinned: an unpinned resolve of `torch` (or of a package that depends on it)
# would download the multi-GB CUDA build on a CPU machine.
$(BASE): pyproject.toml setup.py
	$(PIP) install -q "torch==$(TORCH_VERSION)"
	$(PIP) install -q -e .
	# the C++ recording hooks (gradient-ready stamps, DDP bucket timing), built against this torch now rather than by the first trace
	$(PYTHON) -m syncviz.record.native
	touch $(BASE)

# What the tests need on top: pytest, selenium, triton (kernel tests), torch-tb-profiler, ruff,
# lightning and accelerate (tests/test_engines.py), dask[distributed] (tests/test_cluster.py).
$(DEV): $(BASE)
	$(PIP) install -q -e ".[test,kernels,profiler,cluster]"
	# DeepSpeed without prebuilt ops: they are JIT-built on first use (syncviz/workloads/ds_build.py)
	DS_BUILD_OPS=0 $(PIP) install -q -e ".[deepspeed]"
	touch $(DEV)

install: $(BASE)
install-dev: $(DEV)

demo: $(BASE)
	syncviz demo --preset mini --steps 8 --bucket-cap-mb 1 --out traces/demo
	@echo
	@echo "Look at it:  syncviz summary traces/demo   |   syncviz dash traces/   (http://127.0.0.1:8050)"

# The classic table: DDP, ZeRO-1/2/3 (torch and DeepSpeed), ZeRO-Offload, ZeRO-Infinity, one model
demo-deepspeed: $(DEV)
	bash .ci/libaio.sh
	syncviz demo --compare --deepspeed --preset mini --steps 6 --batch 2 --seq 64 --bucket-cap-mb 1 --out traces/classic

lint: $(DEV)
	$(PYTHON) -m ruff check .

test: $(DEV)
	bash .ci/browsers.sh
	bash .ci/libaio.sh
	$(PYTHON) -m ruff check .
	$(PYTHON) -m syncviz.workloads.ds_build
	$(PYTHON) -m pytest -q tests

test-fast: $(DEV)
	$(PYTHON) -m pytest -q -m "not slow and not browser" tests

bench: $(DEV)
	for b in benchmarks/*.py; do [ $$b = benchmarks/gpu_check.py ] && continue; echo "== $$b"; $(PYTHON) $$b || exit 1; done

# The CUDA/NCCL path on one GPU (report in gpu-check/); without a GPU, its CPU self-checks.
# Uses the torch already installed (a CUDA build on a GPU machine): installs only the project,
# triton and pytest when they are missing, never torch (pip keeps an installed torch >= 2.4).
gpu-check:
	$(PYTHON) -c "import syncviz.kernels, pytest, triton" 2>/dev/null || $(PIP) install -q -e ".[kernels]" pytest pytest-timeout
	$(PYTHON) benchmarks/gpu_check.py --out gpu-check $(GPU_CHECK_ARGS)

dash: $(BASE)
	syncviz dash traces/

clean:
	rm -rf $(BASE) $(DEV) .make-installed traces/demo traces/classic .pytest_cache build *.egg-info
