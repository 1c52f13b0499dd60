# Two commands: `make demo` (set up + generate text) and `make test` (set up + whole test suite).
# Everything lives in .venv/ at the repository root; nothing outside it is installed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip -q --disable-pip-version-check
UPSTREAM := .upstream
TORCH_PIN := torch==2.13.0

.PHONY: demo test setup build upstream clean bench eval sanitize

demo: setup
	$(PY) -m rwkv.demo

test: setup upstream
	$(PY) -m pytest -q tests
	$(MAKE) sanitize

# Dependencies: pinned torch (a CPU build from local disk; any other spec downloads gigabytes).
$(VENV)/.deps: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH_PIN) numpy "tokenizers>=0.13.2" pytest safetensors ninja nbclient nbformat ipykernel \
		hypothesis
	$(PIP) install "fastapi>=0.110" "uvicorn>=0.29" "sse-starlette>=2.0" "prometheus-client>=0.20" \
		"openai>=1.30" "httpx>=0.27" "ray[serve]>=2.40"
	touch $@

# Editable install of the package itself (registers the source tree; the extension is built below).
$(VENV)/.editable: $(VENV)/.deps setup.py pyproject.toml
	RWKV_BUILD_EXT=0 $(PIP) install --no-build-isolation --no-deps -e .
	touch $@

# Compile rwkv._C ahead of time, in place, incrementally (ninja keeps build/ between runs).
build: $(VENV)/.editable
	@mkdir -p build
	@echo "building rwkv._C and rwkv._tokenizer (log: build/build.log)"
	@flock /tmp/rwkv-build.lock $(PY) setup.py build_ext --inplace > build/build.log 2>&1 \
		|| { tail -n 60 build/build.log; echo "build failed: see build/build.log"; exit 1; }
	@$(PY) -c "import sys, rwkv.ops as o; r = o.backend_report().splitlines()[0]; print('rwkv ops backend:', r); \
		sys.exit(0 if r.startswith('compiled') or '$(RWKV_BUILD_EXT)' == '0' else 'the extension did not load: ' + o.backend_report())"

setup: build

# The extension built with AddressSanitizer + UndefinedBehaviorSanitizer into build-asan/ (never in
# place), then the op tests and one forward per version and strategy run on it. Python itself is not
# instrumented, so the ASan runtime is preloaded; CPython's own allocations are not leaks to report
# (detect_leaks=0). Every report is written under build-asan/reports/ and aborts its process; any
# report fails the target.
ASAN_DIR := build-asan
SANITIZER_RUNTIME = $(shell $(CXX) -print-file-name=libasan.so) $(shell $(CXX) -print-file-name=libubsan.so)
sanitize: $(VENV)/.editable
	@mkdir -p $(ASAN_DIR)
	@echo "building the sanitized rwkv._C into $(ASAN_DIR)/ (log: $(ASAN_DIR)/build.log)"
	@RWKV_SANITIZE=1 RWKV_BUILD_CUDA=0 flock /tmp/rwkv-build.lock $(PY) setup.py build_ext \
		--build-lib $(ASAN_DIR)/lib --build-temp $(ASAN_DIR)/tmp > $(ASAN_DIR)/build.log 2>&1 \
		|| { tail -n 60 $(ASAN_DIR)/build.log; echo "sanitized build failed"; exit 1; }
	@rm -rf $(ASAN_DIR)/reports && mkdir -p $(ASAN_DIR)/reports
	LD_PRELOAD="$(SANITIZER_RUNTIME)" RWKV_TEST_EXTENSION_DIR=$(ASAN_DIR)/lib/rwkv \
		ASAN_OPTIONS=detect_leaks=0:log_path=$(CURDIR)/$(ASAN_DIR)/reports/asan \
		UBSAN_OPTIONS=print_stacktrace=1:log_path=$(CURDIR)/$(ASAN_DIR)/reports/ubsan \
		$(PY) -m pytest -q -p no:cacheprovider tests/ops tests/test_forward_each_version.py tests/test_step_plan.py; \
		status=$$?; reports=$$(ls $(ASAN_DIR)/reports); \
		if [ -n "$$reports" ]; then cat $(ASAN_DIR)/reports/*; echo "sanitizer reports: $$reports"; exit 1; fi; \
		exit $$status

# The upstream package, isolated in its own folder, used only by the compatibility tests and the
# benchmarks (always run in a subprocess so it never meets our own `rwkv`).
upstream: $(UPSTREAM)/rwkv/model.py
$(UPSTREAM)/rwkv/model.py: | $(VENV)/.deps
	$(PIP) install --no-deps --target $(UPSTREAM) rwkv==0.8.32

# Benchmarks (not part of `make test`; results and commands go into benchmarks/RESULTS.md). An
# upstream row still running after 20 minutes is stopped: on CPUs without AVX-512 BF16, upstream's
# RWKV-7 `cpu bf16` prefill takes over an hour, and the row then shows a bound on it instead.
bench: setup upstream
	$(PY) benchmarks/bench_model.py --upstream-timeout 1200

# Held-out perplexity of the shipped model per strategy, ours beside upstream's.
eval: setup upstream
	$(PY) benchmarks/eval_ppl.py

clean:
	rm -rf build $(ASAN_DIR) $(UPSTREAM) rwkv/*.so rwkv/_build_info.py
