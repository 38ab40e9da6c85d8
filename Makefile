PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install wheel clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[torch,tf,zoo,test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m fixtures.models build/fixtures mobilenetv2
	$(BIN)/python -m fixtures.calib build/calib 16
	mkdir -p demo
	$(BIN)/mnntool convert build/fixtures/mobilenetv2.onnx demo/mobilenetv2.mnn
	$(BIN)/mnntool info demo/mobilenetv2.mnn
	$(BIN)/mnntool quant demo/mobilenetv2.mnn demo/mobilenetv2_int8.mnn --int8 --calib build/calib --method mse --auto-skip 0.99
	$(BIN)/mnntool verify build/fixtures/mobilenetv2.onnx demo/mobilenetv2.mnn --report demo/verify.html
	$(BIN)/mnntool verify build/fixtures/mobilenetv2.onnx demo/mobilenetv2_int8.mnn --min-cosine 0.99 --outputs-only --report demo/verify_int8.html
	$(BIN)/mnntool compile-kernels
	$(BIN)/mnntool bench demo/mobilenetv2.mnn --runs 20 --profile --top 5
	$(BIN)/mnntool bench demo/mobilenetv2.mnn --runs 20 --backend mnn
	# a language model: a small Llama trained here on the stdlib's sources (~1 min once), exported to the bundle
	# MNN-LLM loads, run in mnntool's runtime, scored through MNN-LLM against transformers
	$(BIN)/python -m fixtures.llm_checkpoints build/llm trained test
	$(BIN)/mnntool llm export build/llm/trained-test demo/llama-q4 --bits 4 --hqq --overwrite
	$(BIN)/mnntool llm run demo/llama-q4 --prompt "def main(argv):" -n 48
	$(BIN)/mnntool llm eval demo/llama-q4 --text build/llm/trained-test/heldout.txt --max-tokens 4096 --ctx 128 --ref build/llm/trained-test

# two worker processes (pytest-xdist), whole test modules each: CI has 2 cores and the suite's CPU time is
# ~1.4x its wall time run serially (`make test TEST_WORKERS=0` runs it in one process)
TEST_WORKERS ?= 2

# a native crash (no Python traceback) leaves its stack in build/test-crash.log: its first line and the
# frames in tests/ and mnntool/ are printed last, where CI's excerpt of the output shows them
test: $(STAMP)
	@mkdir -p build && rm -f build/test-crash.log
	MNNTOOL_CRASH_LOG=build/test-crash.log $(BIN)/python -m pytest -p no:faulthandler -n $(TEST_WORKERS) --dist loadfile tests || { rc=$$?; \
	  if [ -s build/test-crash.log ]; then echo "native crash, from build/test-crash.log:"; head -n 1 build/test-crash.log; \
	    grep -m 16 -E '/(tests|mnntool|fixtures)/' build/test-crash.log; fi; exit $$rc; }

# the sdist and the wheel (tests/test_wheel_smoke.py, in `make test`, builds them the same way from a copy of the
# sources and installs the wheel into a clean venv with no extras)
wheel: $(STAMP)
	$(BIN)/python -m build --outdir build/dist

clean:
	rm -rf $(VENV) build demo
