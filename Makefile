# `make train` and `make test` build .venv (Python 3.12) on first use, then run.
PYTHON ?= $(shell command -v python3.12 2>/dev/null || echo /root/.pyenv/versions/3.12.1/bin/python3.12)
VENV := .venv
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: train test clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

train: $(STAMP)
	$(VENV)/bin/python scripts/train.py --config configs/demo.py $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 -q $(ARGS)

clean:
	rm -rf $(VENV) runs
