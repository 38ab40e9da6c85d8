PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[torch,test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m fixtures.models build/fixtures mobilenetv2
	mkdir -p demo
	$(BIN)/mnntool convert build/fixtures/mobilenetv2.onnx demo/mobilenetv2.mnn
	$(BIN)/mnntool info demo/mobilenetv2.mnn
	$(BIN)/mnntool verify build/fixtures/mobilenetv2.onnx demo/mobilenetv2.mnn --report demo/verify.html
	$(BIN)/mnntool bench demo/mobilenetv2.mnn --runs 20 --profile --top 5

test: $(STAMP)
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) build demo
