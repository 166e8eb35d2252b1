# pagellm: the two commands of the README.
#   make serve   set up, build, and serve the default model (Gemma 3 270M) on 127.0.0.1:8000
#   make test    set up, build, and run every test
# Both install what is missing (Debian packages, Python packages, the model).

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
PAGELLM := $(BUILD_DIR)/pagellm
PORT ?= 8000
HOST ?= 127.0.0.1

.PHONY: all setup build test unit-test e2e-test serve generate clean

all: build

setup:
	@tools/setup.sh

$(BUILD_DIR)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: setup $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

unit-test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

e2e-test: build
	PAGELLM_BIN=$(abspath $(PAGELLM)) .venv/bin/python -m pytest -q tests/e2e

test: unit-test e2e-test

generate: build
	$(PAGELLM) generate -m "$$(cat $(BUILD_DIR)/default-model.txt)" -p "The capital of France is" -n 64 --temp 0

serve: build
	$(PAGELLM) serve --model "$$(cat $(BUILD_DIR)/default-model.txt)" --host $(HOST) --port $(PORT)

clean:
	rm -rf $(BUILD_DIR)
