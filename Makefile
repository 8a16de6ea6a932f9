# The two set-up-and-go targets of the README. Each builds .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: $(STAMP)
	$(BIN)/robotserve bench fleet --out reports/fleet

test: $(STAMP)
	$(BIN)/python -m pytest -q test

clean:
	rm -rf $(VENV) build *.egg-info
