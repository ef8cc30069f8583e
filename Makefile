PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[all,test]"
	touch $@

install: $(STAMP)

## The main job: convert the sample model shipped in models/, run it, print outputs and timing.
demo: install
	$(BIN)/edgeinfer convert models/sample_cnn.onnx -o models/sample_cnn.eim
	$(BIN)/edgeinfer inspect models/sample_cnn.eim
	$(BIN)/edgeinfer run models/sample_cnn.eim --input models/sample_input.npy --threads 2

## The whole test suite.
test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check edgeinfer converters backends tests benchmarks models
