# Set-up and the two main entry points. `make plan` runs the main job, `make test` the tests;
# both create the virtual environment (.venv) on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: plan test lint bench schema clean browser

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch is pinned to the CPU build first, so nothing later pulls a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	# trainers `paraplan export` is checked against (their loaders' imports are the [export] extra)
	$(BIN)/pip install --quiet --no-deps torchtitan==0.3.0
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet --no-deps --no-build-isolation deepspeed==0.19.8
	$(BIN)/pip install --quiet -e '.[torch,report,dev,export]'
	touch $(STAMP)

# The main job: plan Llama 3 8B on one 8xH100 node, write plan.json.
plan: $(STAMP)
	$(BIN)/paraplan plan --model llama3-8b --cluster 8xh100 --global-batch 256 --seq-len 8192 -o plan.json

# Headless Chromium for the HTML report test (Debian's package; installed when we are root and
# apt-get exists; otherwise that one test skips and says why).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)) ; } \
	  || echo "chromium not installed: the HTML report test will be skipped"

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_plan_speed.py

# Rewrite docs/plan.schema.json from the code (a test checks they agree).
schema: $(STAMP)
	$(BIN)/python -m paraplan.planner.schema > docs/plan.schema.json
	$(BIN)/python -m paraplan.planner.profile_io > docs/profile.schema.json

clean:
	rm -rf $(VENV)
