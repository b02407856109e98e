# Two commands for a new user: `make serve` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL ?=
SERVE_ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv serve test lint proto bench fleet-net chaos soak clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned, so nothing resolves a CUDA build.
	$(BIN)/python -m pip install --quiet -c constraints.txt torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

serve: venv
	$(BIN)/tessera serve $(if $(MODEL),--model $(MODEL)) $(SERVE_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: venv lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

proto: venv
	$(BIN)/python scripts/gen_proto.py

bench: venv
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)

# The fleet on test hosts (network namespaces, a switch, dnsmasq; needs root) until Ctrl-C.
fleet-net: venv
	$(BIN)/python -m tessera.testbed.netfleet $(if $(MODEL),--model $(MODEL))

# Every fault of the schedule under load, into docs/reliability.md (about ten minutes).
chaos: venv
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	$(BIN)/python -m benchmarks.chaos.run $(if $(MODEL),--model $(MODEL)) $(CHAOS_ARGS)

# 30 minutes of steady load: RSS bound, nothing held at the end, into docs/reliability.md.
soak: venv
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	$(BIN)/python -m benchmarks.chaos.soak $(if $(MODEL),--model $(MODEL)) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
