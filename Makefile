# The two commands a newcomer needs: `make demo` and `make test`. Both set up first: the demo
# only what it runs (under a minute), the tests everything, llama.cpp's source build included.
# `make test` leaves out the end-to-end tests marked slow (minutes each); `make test-slow` runs
# them, and CI (.ci/run) runs both.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help setup-demo setup demo test test-slow lint bench gate clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup-demo:  ## only what the demo runs: bcc, kernel headers, venv with tailsight (root)
	@bash scripts/setup.sh demo

setup:  ## setup-demo + what tests use: dev tools, torch, llama.cpp (built once)
	@bash scripts/setup.sh all

demo: setup-demo  ## the whole story in < 2 min: trading system, agent, replay, noisy neighbour, explain
	$(PY) -m tailsight.cli.demo $(DEMO_ARGS)

test: setup  ## lint, type-check, every test but the slow ones (kernel tests need root), quick benchmarks
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	bash scripts/typecheck.sh
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)
	$(MAKE) --no-print-directory bench BENCH_ARGS=--quick

test-slow: setup  ## the slow end-to-end tests: soak, fault injections, demo, fleet, gate workflow
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

bench: setup  ## benchmarks (figures with same-run baselines)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; t=$$(date +%s); \
		$(PY) $$b $(BENCH_ARGS) || exit 1; echo "== $$b: $$(( $$(date +%s) - t )) s"; done

# Latency gate of two revisions (docs/ci-gate.md): RUNS per side, DURATION s per run; optional
# overrides of scripts/gate_revs.py's defaults, the same for both sides: PLACEMENT (replay
# --placement; default auto), BUSY_POLL (0 or 1; default 1), BLOCK (runs per replay invocation;
# default 1). GATE_ARGS go to tailsight gate. Run `make setup` first.
RUNS ?= 30
DURATION ?= 5
PLACEMENT ?=
BUSY_POLL ?=
GATE_ARGS ?=
gate:  ## make gate BASE=<rev> CAND=<rev>: interleaved replays of both, then tailsight gate
	@test -n "$(BASE)" -a -n "$(CAND)" || { echo "usage: make gate BASE=<rev> CAND=<rev>"; exit 2; }
	$(PY) scripts/gate_revs.py --base "$(BASE)" --cand "$(CAND)" --runs $(RUNS) \
		--duration $(DURATION) $(if $(PLACEMENT),--placement "$(PLACEMENT)") \
		$(if $(filter 1,$(BUSY_POLL)),--busy-poll)$(if $(filter 0,$(BUSY_POLL)),--no-busy-poll) \
		$(if $(BLOCK),--block $(BLOCK)) -- $(GATE_ARGS)

lint: setup  ## ruff + mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	bash scripts/typecheck.sh

clean:  ## remove the venv and caches
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
