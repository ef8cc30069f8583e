PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[all,test]"
	# Keras 2 (tf_keras), for the tests that write Keras-2 files: its release matches TensorFlow's
	# minor version and names the full tensorflow package, so it goes in without dependencies
	# (none yet for a new TensorFlow release: those tests then skip, and say why)
	$(BIN)/python -m pip install --quiet --no-deps "tf_keras~=$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu").rsplit(".", 1)[0])').0" \
	    || echo "no tf_keras release matches this TensorFlow: the tests that write Keras-2 files skip"
	touch $@

install: $(STAMP)

## The main job: convert the models shipped in models/, run them, print outputs, timing and accuracy.
demo: install
	$(BIN)/edgeinfer convert models/sample_cnn.onnx -o models/sample_cnn.eim
	$(BIN)/edgeinfer inspect models/sample_cnn.eim
	$(BIN)/edgeinfer run models/sample_cnn.eim --input models/sample_input.npy --threads 2
	$(BIN)/edgeinfer inspect models/sample_cnn.eim --plan --backend openvino+onnxruntime
	$(BIN)/edgeinfer bench models/sample_cnn.eim --backend numpy,onnxruntime,auto --threads 2 --runs 30 --stream 200
	$(BIN)/edgeinfer convert models/caffe_lenet_digits/lenet_digits.prototxt \
	    --weights models/caffe_lenet_digits/lenet_digits.caffemodel -o models/caffe_lenet_digits/lenet_digits.eim
	$(BIN)/python models/caffe_lenet_digits/evaluate.py --eim models/caffe_lenet_digits/lenet_digits.eim

## The whole test suite.
test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check edgeinfer converters backends devkit tests benchmarks models
