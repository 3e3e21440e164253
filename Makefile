# `make train` and `make test` build .venv (Python 3.12) on first use, then run.
# The first Python 3.12 that runs (a pyenv shim can exist without working).
PYTHON ?= $(shell for p in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
PIP := $(VENV)/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt
ARGS ?=

.PHONY: train test prepare lock clean

# The package, under the versions CI passed with (constraints.txt); the tests' extras on top for `make test`.
$(STAMP): pyproject.toml constraints.txt
	@test -n "$(PYTHON)" || { echo "error: no Python 3.12 found; run make PYTHON=/path/to/python3.12"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PIP) -e '.[test]'
	touch $(TEST_STAMP)

train: $(STAMP)
	$(VENV)/bin/python scripts/train.py --config configs/demo.py $(ARGS)

test: $(TEST_STAMP)
	$(VENV)/bin/python -m pytest -n 2 -q $(ARGS)

# constraints.txt anew from .venv, after a change of pyproject.toml's dependencies and a `make test` that passed.
lock: $(TEST_STAMP)
	{ sed -n '/^#/p' constraints.txt; $(VENV)/bin/python -m pip freeze --exclude-editable; } > constraints.new
	mv constraints.new constraints.txt

# Preparing tfds datasets needs TensorFlow, which training does not: it gets a virtual environment of its own.
# An image folder's store needs no TensorFlow and is written from .venv.
PREPARE_STAMP := .venv-prepare/.installed
$(PREPARE_STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "error: no Python 3.12 found; run make PYTHON=/path/to/python3.12"; exit 1; }
	test -x .venv-prepare/bin/python || $(PYTHON) -m venv .venv-prepare
	.venv-prepare/bin/python -m pip install -q --disable-pip-version-check -e '.[prepare]'
	touch $(PREPARE_STAMP)

PREPARE_VENV := $(if $(findstring --name=folder,$(ARGS)),$(VENV),.venv-prepare)

prepare: $(PREPARE_VENV)/.installed
	$(PREPARE_VENV)/bin/python scripts/prepare_data.py $(ARGS)

clean:
	rm -rf $(VENV) .venv-prepare runs
