# Builds run and quantize; kernels.cu joins when nvcc is found (CPU-only build otherwise).
#   make            binaries, models, and the INT8 demo model
#   make demo       generate a story from stories260K through the INT8 path
#   make test       the test suite (GPU tests are skipped where there is no GPU)
CC      ?= gcc
CFLAGS  ?= -O3 -std=gnu11 -Wall -Wextra -Wshadow -Wno-unused-parameter
LDLIBS  := -lm -lpthread
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
# sm_90a machine code for the H200 (wgmma needs the "a" target), plus PTX so that newer GPUs can JIT
# it (the wgmma kernel compiles to nothing there and is not dispatched: kernels.cu wgmma_available)
NVFLAGS ?= -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90 \
           -Xcompiler -Wall,-Wextra -lineinfo
SHARED_MODELS ?= ../shared/models

ifneq ($(NVCC),)
  GPU_OBJ  := kernels.o
  GPU_DEFS := -DHAVE_GPU
  CUDA_LIB := $(abspath $(dir $(NVCC))../lib64)
  GPU_LIBS := -L$(CUDA_LIB) -Wl,-rpath,$(CUDA_LIB) -lcublas -lcudart_static -ldl -lrt -lstdc++
endif

.PHONY: all models demo test bench clean
all: run quantize models models/stories260K_q8.bin

run.o: run.c model.h kernels.h
	$(CC) $(CFLAGS) $(GPU_DEFS) -c run.c -o $@
model.o: model.c model.h
	$(CC) $(CFLAGS) -c model.c -o $@
kernels.o: kernels.cu kernels.h
	$(NVCC) $(NVFLAGS) -c kernels.cu -o $@
run: run.o model.o $(GPU_OBJ)
	$(CC) -o $@ $^ $(GPU_LIBS) $(LDLIBS)
quantize: quantize.c model.o model.h
	$(CC) $(CFLAGS) -o $@ quantize.c model.o $(LDLIBS)

# Models come from ../shared/models when it exists, else from upstream (sha256-checked).
MODEL_FILES := models/stories260K.bin models/tok512.bin tokenizer.bin
models: $(MODEL_FILES)
models/stories260K.bin models/tok512.bin models/code15M.bin models/aidreams260K.bin models/aidreams_tok512.bin \
models/stories260K_q80_gs8.v2.bin models/stories260K.greedy.txt:
	sh models/fetch.sh $(notdir $@) $@ $(SHARED_MODELS)
tokenizer.bin:
	sh models/fetch.sh tokenizer.bin $@ $(SHARED_MODELS)
models/stories260K_q8.bin: models/stories260K.bin quantize
	./quantize models/stories260K.bin $@

demo: all
	./run models/stories260K_q8.bin -z models/tok512.bin -p "Once upon a time" -n 200 -t 0.8 -s 42

# Test builds: the same sources, with AddressSanitizer and UBSan.
SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -g
tests/test_run: tests/test_run.c run.c model.c model.h $(GPU_OBJ) kernels.h
	$(CC) $(CFLAGS) -Wno-unused-function $(GPU_DEFS) -O2 $(SAN) -c tests/test_run.c -o tests/test_run.o
	$(CC) $(CFLAGS) -O2 $(SAN) -c model.c -o tests/model_san.o
	$(CC) $(SAN) -o $@ tests/test_run.o tests/model_san.o $(GPU_OBJ) $(GPU_LIBS) $(LDLIBS)
# Test-only models: code15M and two reference files exist only in ../shared/models; where they
# are missing their tests report skipped.
OPTIONAL_MODELS := models/code15M.bin models/stories260K_q80_gs8.v2.bin models/stories260K.greedy.txt
test: all tests/test_run
	-@for f in $(OPTIONAL_MODELS); do [ -f $$f ] || $(MAKE) -s $$f 2>/dev/null; done
	sh tests/run_tests.sh

bench/kernel_bench: bench/kernel_bench.cu kernels.o kernels.h model.h
	$(NVCC) $(NVFLAGS) -o $@ bench/kernel_bench.cu kernels.o -lcublas
bench: run quantize tokenizer.bin bench/kernel_bench
	./bench/kernel_bench
	@mkdir -p bench/out
	./bench/kernel_bench --across-m bench/out/across_m.csv
	sh bench/bench.sh
	-sh bench/plot.sh bench/out/across_m.csv

clean:
	rm -rf run quantize *.o tests/*.o tests/test_run tests/test_run_vg tests/test_run_gpu tests/asan tests/vg bench/kernel_bench tests/fuzz/fuzz_* tests/fuzz/replay_*

# Fuzzing (issue: hostile input): libFuzzer targets built with clang, ASan and UBSan.
#   make fuzz                  each target for FUZZ_SECONDS (default 600) on its corpus
#   make fuzz FUZZ_SECONDS=30  the short run .ci/run does
# Corpora grow in tests/fuzz/corpus/<target> (not committed); seeds come from ../shared/models,
# synthetic checkpoints of every format and tests/fuzz/regressions/<target>, where every crash
# found is kept and which the normal test run replays (tests/run_tests.sh).
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 600
FUZZ_TARGETS := model tokenizer encode run_args quantize_args
FUZZ_FLAGS   := -g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
                -Wall -Wextra -Wno-unused-function -Wno-unused-parameter
FUZZ_SRC     := tests/fuzz/fuzz.c run.c quantize.c model.c model.h
fuzz_define   = -DFUZZ_$(shell echo $(1) | tr a-z A-Z)
tests/fuzz/fuzz_%: $(FUZZ_SRC)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(call fuzz_define,$*) -o $@ tests/fuzz/fuzz.c model.c -lm -lpthread
# gcc replay builds of the same targets, for the regression files
tests/fuzz/replay_%: $(FUZZ_SRC)
	$(CC) -g -O1 -std=gnu11 $(SAN) -fno-sanitize-recover=undefined -Wall -Wextra -Wno-unused-function -Wno-unused-parameter \
	    -DFUZZ_REPLAY $(call fuzz_define,$*) -o $@ tests/fuzz/fuzz.c model.c -lm -lpthread
fuzz-seeds: quantize tests/test_run models
	sh tests/fuzz/seeds.sh
fuzz: fuzz-seeds $(addprefix tests/fuzz/fuzz_,$(FUZZ_TARGETS))
	sh tests/fuzz/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)
.PHONY: fuzz fuzz-seeds

# The CPU suite's command-line checks again through ASan + UBSan builds of run and quantize
# (tests/test_run is always such a build).
tests/asan/run: run.c model.c model.h
	@mkdir -p tests/asan
	$(CC) $(CFLAGS) -O1 $(SAN) -fno-sanitize-recover=undefined -o $@ run.c model.c $(LDLIBS)
tests/asan/quantize: quantize.c model.c model.h
	@mkdir -p tests/asan
	$(CC) $(CFLAGS) -O1 $(SAN) -fno-sanitize-recover=undefined -o $@ quantize.c model.c $(LDLIBS)
test-asan: all tests/test_run tests/asan/run tests/asan/quantize
	-@for f in $(OPTIONAL_MODELS); do [ -f $$f ] || $(MAKE) -s $$f 2>/dev/null; done
	RUN=tests/asan/run QUANTIZE=tests/asan/quantize sh tests/run_tests.sh

# The CPU unit tests under valgrind (no sanitizers, no GPU code), then the command-line checks
# with run and quantize (CPU-only builds) under valgrind; code15M is left out (--quick, QUICK=1).
tests/test_run_vg: tests/test_run.c run.c model.c model.h
	$(CC) $(CFLAGS) -Wno-unused-function -O1 -g -o $@ tests/test_run.c model.c $(LDLIBS)
tests/vg/run: run.c model.c model.h
	@mkdir -p tests/vg
	$(CC) $(CFLAGS) -O1 -g -o $@ run.c model.c $(LDLIBS)
tests/vg/quantize: quantize.c model.c model.h
	@mkdir -p tests/vg
	$(CC) $(CFLAGS) -O1 -g -o $@ quantize.c model.c $(LDLIBS)
VG := valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite
test-valgrind: all tests/test_run_vg tests/vg/run tests/vg/quantize
	$(VG) ./tests/test_run_vg --quick models
	CLI_ONLY=1 QUICK=1 RUN="$(VG) tests/vg/run" QUANTIZE="$(VG) tests/vg/quantize" sh tests/run_tests.sh

# The GPU tests and a short generation on each GPU path under compute-sanitizer's four tools
# (memcheck, racecheck, initcheck, synccheck); on the GPU machine.
tests/test_run_gpu: tests/test_run.c run.c model.c model.h kernels.o kernels.h
	$(CC) $(CFLAGS) -Wno-unused-function $(GPU_DEFS) -O2 -g -c tests/test_run.c -o tests/test_run_gpu.o
	$(CC) -o $@ tests/test_run_gpu.o model.o kernels.o $(GPU_LIBS) $(LDLIBS)
test-gpu-sanitize: all tests/test_run_gpu
	sh tests/gpu_sanitize.sh
.PHONY: test-asan test-valgrind test-gpu-sanitize
