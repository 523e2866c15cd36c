# Two entry points for a fresh machine: `make demo` and `make test` (see README).
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
TORCH_VERSION ?= 2.13.0
STAMP := .make-installed

.PHONY: install demo test test-fast bench dash clean

# CPU torch first: an unpinned resolve of `torch` would download the multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PIP) install -q "torch==$(TORCH_VERSION)" || $(PIP) install -q "torch==$(TORCH_VERSION)" --index-url https://download.pytorch.org/whl/cpu
	$(PIP) install -q -e ".[test,kernels,profiler]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	syncviz demo --preset mini --steps 8 --bucket-cap-mb 1 --out traces/demo
	@echo
	@echo "Look at it:  syncviz summary traces/demo   |   syncviz dash traces/   (http://127.0.0.1:8050)"

test: $(STAMP)
	bash .ci/browsers.sh
	$(PYTHON) -m pytest -q tests

test-fast: $(STAMP)
	$(PYTHON) -m pytest -q -m "not slow and not browser" tests

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PYTHON) $$b || exit 1; done

dash: $(STAMP)
	syncviz dash traces/

clean:
	rm -rf $(STAMP) traces/demo .pytest_cache build *.egg-info
