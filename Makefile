# pagellm: the two commands of the README.
#   make serve   set up, build, and serve the default model (Gemma 3 270M) on 127.0.0.1:8000
#   make test    set up, build, and run every test (unit incl. the C API's,
#                end-to-end server, and the Python package's)
# Both install what is missing (Debian packages, Python packages, the model).
# CI (.ci/run) adds the checks below, each in its own build folder:
#   make sanitize  unit tests under ASan + UBSan            (build-asan)
#   make tsan      concurrency tests under ThreadSanitizer  (build-tsan)
#   make fuzz      every libFuzzer target for FUZZ_SECONDS (build-fuzz, clang)
#   make soak      1,000 mixed and hostile requests against a live server
#   make arm-test  aarch64 cross build, its kernel / op / greedy / server tests
#                  under qemu-user at each ARM level                (build-arm)

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
PAGELLM := $(BUILD_DIR)/pagellm
PORT ?= 8000
HOST ?= 127.0.0.1
# Extra CMake options and a target subset (the Dockerfile builds only the binary).
CMAKE_FLAGS ?=
BUILD_TARGETS ?=

FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
ASAN_DIR := build-asan
TSAN_DIR := build-tsan
FUZZ_DIR := build-fuzz
# Sanitizer builds configure RelWithDebInfo (-O1 -g1 there, see CMakeLists.txt).
# The OpenCL plugin stays out of them: PoCL's own threads and allocations are
# not ours to sanitize (the release build tests it).
SAN_CMAKE := -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGELLM_OPENCL=OFF

.PHONY: arm-test all setup setup-serve setup-sanitizers build build-serve test unit-test e2e-test python-install python-test serve generate clean sanitize tsan fuzz fuzz-build soak deploy-check

all: build

setup:
	@tools/setup.sh

setup-serve:
	@tools/setup.sh serve

setup-sanitizers:
	@tools/setup.sh sanitizers

$(BUILD_DIR)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: setup $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS) $(if $(BUILD_TARGETS),--target $(BUILD_TARGETS))

unit-test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

e2e-test: build
	PAGELLM_BIN=$(abspath $(PAGELLM)) .venv/bin/python -m pytest -q tests/e2e

# The Python package, installed into .venv from this tree (its own build
# folder, build/python; with ccache it reuses the objects of `make build`,
# which needs the same compiler name, hence CC/CXX).
python-install: build
	CC=cc CXX=c++ .venv/bin/pip install -q --no-build-isolation --disable-pip-version-check .

python-test: python-install
	PAGELLM_BIN=$(abspath $(PAGELLM)) PAGELLM_BUILD_DIR=$(abspath $(BUILD_DIR)) .venv/bin/python -m pytest -q tests/python

test: unit-test e2e-test python-test

# Serving needs the binary alone (it pulls in the backend plugins); the unit
# tests, the C API and the fuzz targets are built by `make test`.
build-serve: setup-serve $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS) --target pagellm

generate: build-serve
	$(PAGELLM) generate -m "$$(cat $(BUILD_DIR)/default-model.txt)" -p "The capital of France is" -n 64 --temp 0

serve: build-serve
	$(PAGELLM) serve --model "$$(cat $(BUILD_DIR)/default-model.txt)" --host $(HOST) --port $(PORT)

# ---- sanitizers and fuzzing

# The two Gemma 3 270M greedy-decoding tests take 5+ minutes together under
# ASan (the release build runs them in seconds); the tiny and stories260K
# models cover the same code. Everything else runs.
# The unit tests run in one process per shard (tools/gtest_shards.sh): an ASan
# process per test, as ctest runs them, doubled the job's time.
# The suites that compile grammars in forked workers while other threads
# allocate are left to the release run: GCC 12's ASan allocator takes no lock
# around fork, so a child can wait forever on a lock another thread held at
# the fork (caught with gdb; glibc's malloc is fork-safe). BoundedChild's own
# tests and the grammar fuzz replay still run here.
ASAN_EXCLUDE := TrainedModelVs*.Gemma3_270M_*:GrammarOnStories.*:StructuredEngine.*
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
sanitize: setup-sanitizers
	cmake -S . -B $(ASAN_DIR) $(SAN_CMAKE) -DPAGELLM_SANITIZE=ON
	cmake --build $(ASAN_DIR) -j $(JOBS) --target pagellm_tests pagellm_capi_test
	cd $(ASAN_DIR) && $(ASAN_ENV) ctest --output-on-failure --timeout 900 -R '^CApi\.'
	cd $(ASAN_DIR) && $(ASAN_ENV) ../tools/gtest_shards.sh $(JOBS) ./pagellm_tests '-$(ASAN_EXCLUDE)'

# Tests where threads meet: the thread pool (also inside forward passes), the
# async engine, the server pieces, the KV offload tier's I/O thread and the
# KV event log, HTTP client/server pairs, concurrent tokenizers and
# templates; then the whole server under streaming load.
TSAN_TESTS := ^(ThreadPool|AsyncEngine|EmbeddedEngine|CApi|Engine|Server|HttpServer|BenchServe|BenchOffline|BenchMemory|Trace|AllArchs/
TSAN_TESTS := $(TSAN_TESTS)|KvOffload|KvEventLog|Matmul/MatmulTypes\.BatchAndThread|ChatTemplate\.Concurrent|TokenizerGguf\.Concurrent)
TSAN_ENV := TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tools/tsan.supp)"
tsan: setup-sanitizers
	cmake -S . -B $(TSAN_DIR) $(SAN_CMAKE) -DPAGELLM_TSAN=ON
	cmake --build $(TSAN_DIR) -j $(JOBS) --target pagellm_tests pagellm pagellm_capi_test
	cd $(TSAN_DIR) && $(TSAN_ENV) ctest --output-on-failure -j $(JOBS) --timeout 900 -R '$(TSAN_TESTS)'
	$(TSAN_ENV) tests/tsan/serve_load.sh $(TSAN_DIR)

# The soak test (docs/reliability.md): 1,000 requests of every kind over
# SOAK_SECONDS; CI runs it over 45 s.
SOAK_REQUESTS ?= 1000
SOAK_SECONDS ?= 180
soak: build
	PAGELLM_BIN=$(abspath $(PAGELLM)) .venv/bin/python tools/soak.py --requests $(SOAK_REQUESTS) --duration $(SOAK_SECONDS)

fuzz-build: setup-sanitizers
	cmake -S . -B $(FUZZ_DIR) $(SAN_CMAKE) -DCMAKE_CXX_COMPILER=clang++ -DPAGELLM_FUZZ=ON -DPAGELLM_BUILD_TESTS=OFF
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target fuzzers

fuzz: fuzz-build
	FUZZ_JOBS=$(FUZZ_JOBS) tests/fuzz/run.sh $(FUZZ_DIR) $(FUZZ_SECONDS)

# ---- aarch64 (docs/architecture.md, "ARM64"): Debian's cross compiler, the
# arm64 libraries unpacked into build-arm/sysroot (nothing installed for
# arm64), xgrammar cross-built, then pagellm and pagellm_kernel_tests, run
# under qemu-aarch64-static -cpu max / neoverse-n1 / cortex-a57.
ARM_DIR := build-arm
arm-test: setup
	ARM_DIR=$(ARM_DIR) JOBS=$(JOBS) tests/arm/build.sh
	ARM_DIR=$(ARM_DIR) tests/arm/run.sh

# The deployment files: lint and schema-check deploy/ (the e2e tests do too)
# and, where docker or podman exists, build the image.
deploy-check: setup
	.venv/bin/python tools/validate_deploy.py --build

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR) $(FUZZ_DIR) $(ARM_DIR)
