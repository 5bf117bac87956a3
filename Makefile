# kvgate — top-level build.
#
#   make            build the shared library, tools, unit tests and the nginx module
#   make deps       install the Debian packages the build and tests need (idempotent)
#   make test       deps + build + the whole test suite through prove (+ ASan/UBSan unit tests)
#   make fuzz       build the libFuzzer targets and run each for FUZZ_SECONDS
#   make run        build and start what exists (see README)
#   make deb        the Debian packages, in build/deb/ (scripts/deb.sh)
#
# Layout of the outputs (all under build/, ignored by git):
#   build/libkvgate.a              src/*.c (the shared library: no nginx, no CUDA)
#   build/bin/NAME                 tools/NAME.c
#   build/t/NAME                   t/unit/NAME.c  (C unit tests, emit TAP)
#   build/bench/NAME               t/bench/NAME.c
#   build/t/family_check           t/tools/family_check.c (t/engine-families.t; also in
#                                  build/emu/t/ and build/asan/t/)
#   build/asan/...                 the library and unit tests again under ASan+UBSan
#   build/fuzz/NAME                fuzz/NAME.c (clang, -fsanitize=fuzzer)
#   build/ngx_http_kvgate_module.so
#   build/cuda/libkvgate-cuda.a    the CUDA backend: engine/cuda/*.c + kernels/*.cu (nvcc)
#   build/emu/libkvgate-cuda-emu.a the same sources on the host: kernels/*.cu compiled as C++
#                                  against kernels/emu/ (the CUDA execution model emulated)

CC      ?= gcc
BUILD   ?= build
# The build in `make test` runs on every core.
NPROC   := $(shell nproc 2>/dev/null || echo 2)
PKGS    := jansson libcrypto libutf8proc libpcre2-8
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -ljansson -lcrypto -lutf8proc -lpcre2-8)

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
BASE_CFLAGS := -std=gnu11 -g -fPIC -D_GNU_SOURCE -Isrc $(PKG_CFLAGS) $(WARN)
OPT     ?= -O2
CFLAGS  := $(BASE_CFLAGS) $(OPT) $(EXTRA_CFLAGS)
LDLIBS  := $(PKG_LIBS) -lpthread -lm

SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
ASAN_CFLAGS := $(BASE_CFLAGS) -O1 $(SAN_FLAGS)

LIB_SRCS   := $(wildcard src/*.c)
ENGINE_SRCS := $(wildcard engine/*.c engine/cpu/*.c)
ENGINE_CMDS := $(wildcard engine/cmd/*.c)
TOOL_SRCS  := $(wildcard tools/*.c)
UNIT_SRCS  := $(wildcard t/unit/*.c)
BENCH_SRCS := $(wildcard t/bench/*.c)
FUZZ_SRCS  := $(wildcard fuzz/*.c)
HDRS       := $(wildcard src/*.h) $(wildcard t/unit/*.h) $(wildcard t/bench/*.h) $(wildcard engine/*.h engine/cpu/*.h)

LIB_OBJS   := $(LIB_SRCS:src/%.c=$(BUILD)/obj/%.o)
LIB        := $(BUILD)/libkvgate.a
ENGINE_OBJS := $(ENGINE_SRCS:%.c=$(BUILD)/obj/%.o)
ENGINE_LIB := $(BUILD)/libkvgate-engine.a
ENGINE_BINS := $(ENGINE_CMDS:engine/cmd/%.c=$(BUILD)/bin/%)
TOOLS      := $(TOOL_SRCS:tools/%.c=$(BUILD)/bin/%)
UNITS      := $(UNIT_SRCS:t/unit/%.c=$(BUILD)/t/%)
SHIMS      := $(patsubst t/shim/%.c,$(BUILD)/t/%.so,$(wildcard t/shim/*.c))
BENCHES    := $(BENCH_SRCS:t/bench/%.c=$(BUILD)/bench/%)
# Benchmarks may compare against OpenBLAS (the speed reference for the GEMMs).
BENCH_LIBS := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)

ASAN_OBJS  := $(LIB_SRCS:src/%.c=$(BUILD)/asan/obj/%.o)
ASAN_LIB   := $(BUILD)/asan/libkvgate.a
ASAN_ENGINE_OBJS := $(ENGINE_SRCS:%.c=$(BUILD)/asan/obj/%.o)
ASAN_ENGINE_LIB := $(BUILD)/asan/libkvgate-engine.a
ASAN_UNITS := $(UNIT_SRCS:t/unit/%.c=$(BUILD)/asan/t/%)
ASAN_BINS  := $(ENGINE_CMDS:engine/cmd/%.c=$(BUILD)/asan/bin/%) $(TOOL_SRCS:tools/%.c=$(BUILD)/asan/bin/%)

FUZZERS    := $(FUZZ_SRCS:fuzz/%.c=$(BUILD)/fuzz/%)
# The engine's exactness checks on one model file (t/engine-families.t runs them per model
# family): not a unit test (it takes a --model), so not in UNITS.
FAMILY_CHECK := $(BUILD)/t/family_check
EMU_FAMILY_CHECK := $(BUILD)/emu/t/family_check
ASAN_FAMILY_CHECK := $(BUILD)/asan/t/family_check
FUZZ_SECONDS ?= 30

# The CUDA backend is built whenever nvcc is found (CUDA=0 skips it). Its emulated twin is
# built everywhere: the unit tests t/unit/cuda_*.c run every kernel through it.
NVCC       ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
# The toolkit's root: CUDA_HOME, else where nvcc says it lives (the nvcc on PATH may be a
# wrapper script, e.g. /usr/local/bin/nvcc execing /usr/local/cuda-13.0/bin/nvcc).
ifneq ($(NVCC),)
CUDA_HOME  := $(shell scripts/cuda-home.sh $(NVCC))
endif
CUDA       ?= $(if $(CUDA_HOME),1,0)
CUDA_ARCH  := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90
CXX        ?= g++
KERNEL_SRCS := $(wildcard kernels/*.cu)
EMU_RT_SRCS := $(wildcard kernels/emu/*.cc)
CUDA_HOST_SRCS := $(filter-out engine/cuda/absent.c,$(wildcard engine/cuda/*.c))
CUDA_HDRS  := $(wildcard kernels/*.h kernels/*.cuh kernels/emu/*.h engine/cuda/*.h)
HDRS       += $(CUDA_HDRS)
CUDA_NVFLAGS := -O3 -std=c++17 $(CUDA_ARCH) -Isrc -Iengine -Ikernels \
              -Xcompiler -fPIC,-Wall,-Wextra,-Werror
CUDA_LIB   := $(BUILD)/cuda/libkvgate-cuda.a
CUDA_OBJS  := $(KERNEL_SRCS:kernels/%.cu=$(BUILD)/cuda/obj/kernels/%.o) \
              $(CUDA_HOST_SRCS:engine/cuda/%.c=$(BUILD)/cuda/obj/engine/cuda/%.o)
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudnn -lcublasLt -lcublas -lcudart -lstdc++
EMU_CXXFLAGS = -std=gnu++17 -g -fPIC -D_GNU_SOURCE -DKVG_CUDA_EMU -Isrc -Iengine -Ikernels -Ikernels/emu \
              -Wall -Wextra -Werror -Wshadow -Wno-unknown-pragmas
EMU_OBJS   = $(KERNEL_SRCS:kernels/%.cu=$(1)/obj/kernels/%.o) \
              $(EMU_RT_SRCS:kernels/emu/%.cc=$(1)/obj/kernels/emu/%.o) \
              $(CUDA_HOST_SRCS:engine/cuda/%.c=$(1)/obj/engine/cuda/%.o)
# The kernels' translation units in the plain emulated build call the strict checks'
# hooks before every memory access (kernels/emu/cuda_emu_strict.cc: provenance, races).
# The ASan build keeps ASan's own instrumentation, which uses the same hooks.
EMU_STRICT_FLAGS := -fsanitize=kernel-address --param asan-instrumentation-with-call-threshold=0 \
              --param asan-stack=0 --param asan-globals=0
# ... and contract a*b+c into one fused multiply-add where the expression allows, as nvcc
# does by default (--fmad=true); x86-64 needs -mfma for g++ to do it (docs: kernels/README.md).
EMU_FMA    := $(if $(filter x86_64,$(shell uname -m)),-mfma) -ffp-contract=fast
EMU_LIB    := $(BUILD)/emu/libkvgate-cuda-emu.a
ASAN_EMU_LIB := $(BUILD)/asan/emu/libkvgate-cuda-emu.a
EMU_LDLIBS := -lstdc++
# What an engine binary links for `--backend cuda`: the real backend (a build with nvcc), or
# a stub that says this build has none.
ifeq ($(CUDA)$(if $(CUDA_HOST_SRCS),y,n),1y)
ENGINE_CUDA := $(CUDA_LIB)
ENGINE_CUDA_LDLIBS := $(CUDA_LDLIBS)
else
ENGINE_CUDA := $(BUILD)/obj/engine/cuda/absent.o
ENGINE_CUDA_LDLIBS :=
endif
ABSENT_OBJ := $(BUILD)/obj/engine/cuda/absent.o
ASAN_ABSENT_OBJ := $(BUILD)/asan/obj/engine/cuda/absent.o
# Unit tests named cuda_*.c run the CUDA backend emulated; the others get the stub.
CUDA_UNITS := $(filter $(BUILD)/t/cuda_%,$(UNITS))
ASAN_CUDA_UNITS := $(filter $(BUILD)/asan/t/cuda_%,$(ASAN_UNITS))

MODULE     := $(BUILD)/ngx_http_kvgate_module.so
MODULE_ASAN := $(BUILD)/asan/ngx_http_kvgate_module.so

.PHONY: emu gpu-bundle all lib engine tools units benches asan module module-asan deps deb test test-unit test-asan test-nginx fuzz run clean

all: lib tools engine units benches module emu

lib: $(LIB)
engine: $(ENGINE_LIB) $(ENGINE_BINS)
tools: $(TOOLS)
units: $(UNITS) $(SHIMS) $(FAMILY_CHECK)
benches: $(BENCHES)
asan: $(ASAN_UNITS) $(ASAN_BINS) $(ASAN_FAMILY_CHECK)

# LD_PRELOAD shims some tests start nginx with (t/shim/NAME.c -> build/t/NAME.so; SHIMS
# is defined with the other lists above, before `units` names it).
$(BUILD)/t/%.so: t/shim/%.c | $(BUILD)/t
	$(CC) -std=gnu11 -O2 -fPIC -shared -Wall -Wextra -Werror $< -o $@ -ldl -lpthread

$(BUILD)/obj/%.o: src/%.c $(HDRS) | $(BUILD)/obj
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJS)
	rm -f $@; ar rcs $@ $^

# The engine (engine/*.c, engine/cpu/*.c) is a second static library; its commands
# (engine/cmd/NAME.c) become build/bin/NAME. SIMD kernels select their ISA per function
# (target attributes + runtime dispatch), so no -march here: the binaries run anywhere.
$(BUILD)/obj/engine/%.o: engine/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O3 -Iengine -c $< -o $@

$(ENGINE_LIB): $(ENGINE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@; ar rcs $@ $^

$(BUILD)/bin/%: engine/cmd/%.c $(ENGINE_LIB) $(ENGINE_CUDA) $(LIB) $(HDRS) | $(BUILD)/bin
	$(CC) $(CFLAGS) -Iengine $< -o $@ -Wl,--start-group $(ENGINE_LIB) $(ENGINE_CUDA) -Wl,--end-group \
	    $(LIB) $(LDLIBS) $(ENGINE_CUDA_LDLIBS)

$(BUILD)/bin/%: tools/%.c $(LIB) $(HDRS) | $(BUILD)/bin
	$(CC) $(CFLAGS) $< -o $@ $(LIB) $(LDLIBS)

$(CUDA_UNITS): $(BUILD)/t/%: t/unit/%.c $(ENGINE_LIB) $(EMU_LIB) $(LIB) $(HDRS) | $(BUILD)/t
	$(CC) $(CFLAGS) -DKVG_CUDA_EMU -It/unit -Iengine -Ikernels -Ikernels/emu $< $(filter %.o,$^) -o $@ \
	    -Wl,--start-group $(ENGINE_LIB) $(EMU_LIB) -Wl,--end-group $(LIB) $(LDLIBS) $(EMU_LDLIBS)

$(BUILD)/t/%: t/unit/%.c $(ENGINE_LIB) $(ABSENT_OBJ) $(LIB) $(HDRS) | $(BUILD)/t
	$(CC) $(CFLAGS) -It/unit -Iengine $< -o $@ $(ENGINE_LIB) $(ABSENT_OBJ) $(LIB) $(LDLIBS)

# The AVX-512 kernels on SIMDe (t/unit/gemm*_avx512_emu.c): at -O2 gcc takes over two
# minutes on the int8 one (SIMDe's 512-bit emulation inlined into the unrolled kernels:
# the longest step of the whole build), at -Og 11 s, and the tests still run in a tenth
# of a second; under ASan -O0 halves -O1's time. What they check (bit-identical to the
# generic kernels) holds at any level. `private`: not passed on to the prerequisites.
SIMDE_UNITS := gemm_avx512_emu gemm_int8_avx512_emu
$(SIMDE_UNITS:%=$(BUILD)/t/%): private CFLAGS += -Og
$(SIMDE_UNITS:%=$(BUILD)/asan/t/%): private ASAN_CFLAGS += -O0

# family_check links what an engine command links (--backend cuda: the real backend where
# this build has one), the emulated backend in build/emu/t/, the CPU alone under ASan.
$(FAMILY_CHECK): t/tools/family_check.c $(ENGINE_LIB) $(ENGINE_CUDA) $(LIB) $(HDRS) | $(BUILD)/t
	$(CC) $(CFLAGS) -It/unit -Iengine $< -o $@ -Wl,--start-group $(ENGINE_LIB) $(ENGINE_CUDA) -Wl,--end-group \
	    $(LIB) $(LDLIBS) $(ENGINE_CUDA_LDLIBS)

$(EMU_FAMILY_CHECK): t/tools/family_check.c $(ENGINE_LIB) $(EMU_LIB) $(LIB) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DKVG_CUDA_EMU -It/unit -Iengine $< -o $@ -Wl,--start-group $(ENGINE_LIB) $(EMU_LIB) -Wl,--end-group \
	    $(LIB) $(LDLIBS) $(EMU_LDLIBS)

$(ASAN_FAMILY_CHECK): t/tools/family_check.c $(ASAN_ENGINE_LIB) $(ASAN_ABSENT_OBJ) $(ASAN_LIB) $(HDRS) | $(BUILD)/asan/t
	$(CC) $(ASAN_CFLAGS) -It/unit -Iengine $< -o $@ $(ASAN_ENGINE_LIB) $(ASAN_ABSENT_OBJ) $(ASAN_LIB) $(LDLIBS)

$(BUILD)/bench/%: t/bench/%.c $(ENGINE_LIB) $(ENGINE_CUDA) $(LIB) $(HDRS) | $(BUILD)/bench
	$(CC) $(CFLAGS) -O3 -Iengine $< -o $@ -Wl,--start-group $(ENGINE_LIB) $(ENGINE_CUDA) -Wl,--end-group \
	    $(LIB) $(LDLIBS) $(ENGINE_CUDA_LDLIBS) $(BENCH_LIBS)

# The CUDA backend. Kernels through nvcc (device code for sm_80, sm_90 and PTX); the
# host side is plain C against the CUDA runtime and cuBLASLt headers.
$(BUILD)/cuda/obj/kernels/%.o: kernels/%.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_NVFLAGS) -c $< -o $@

$(BUILD)/cuda/obj/engine/cuda/%.o: engine/cuda/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O2 -Iengine -Ikernels -isystem $(CUDA_HOME)/include -c $< -o $@

$(CUDA_LIB): $(CUDA_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@; ar rcs $@ $^

# The emulated twin: the same .cu files as host C++ (kernels/emu/cuda_emu.h supplies the
# execution model), the same host C with -DKVG_CUDA_EMU, and the emulated runtime.
$(BUILD)/emu/obj/kernels/%.o: kernels/%.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_STRICT_FLAGS) $(EMU_FMA) -O2 -x c++ -include kernels/emu/cuda_emu.h -c $< -o $@

$(BUILD)/emu/obj/kernels/emu/%.o: kernels/emu/%.cc $(HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -O2 -c $< -o $@

$(BUILD)/emu/obj/engine/cuda/%.o: engine/cuda/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DKVG_CUDA_EMU -Iengine -Ikernels -Ikernels/emu -c $< -o $@

$(EMU_LIB): $(call EMU_OBJS,$(BUILD)/emu)
	@mkdir -p $(dir $@)
	rm -f $@; ar rcs $@ $^

$(BUILD)/asan/emu/obj/kernels/%.o: kernels/%.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_FMA) -O1 $(SAN_FLAGS) -x c++ -include kernels/emu/cuda_emu.h -c $< -o $@

$(BUILD)/asan/emu/obj/kernels/emu/%.o: kernels/emu/%.cc $(HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -O1 $(SAN_FLAGS) -c $< -o $@

$(BUILD)/asan/emu/obj/engine/cuda/%.o: engine/cuda/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -DKVG_CUDA_EMU -Iengine -Ikernels -Ikernels/emu -c $< -o $@

$(ASAN_EMU_LIB): $(call EMU_OBJS,$(BUILD)/asan/emu)
	@mkdir -p $(dir $@)
	rm -f $@; ar rcs $@ $^

# The emulator's self-test (t/unit/cuda_emu.c) links its own test kernels,
# t/unit/cuda_emu_kernels.cu, built as the emulated kernels are.
$(BUILD)/emu/obj/t/unit/%.o: t/unit/%.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_STRICT_FLAGS) $(EMU_FMA) -O2 -x c++ -include kernels/emu/cuda_emu.h -c $< -o $@

$(BUILD)/asan/emu/obj/t/unit/%.o: t/unit/%.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_FMA) -O1 $(SAN_FLAGS) -x c++ -include kernels/emu/cuda_emu.h -c $< -o $@

$(BUILD)/t/cuda_emu: $(BUILD)/emu/obj/t/unit/cuda_emu_kernels.o
$(BUILD)/asan/t/cuda_emu: $(BUILD)/asan/emu/obj/t/unit/cuda_emu_kernels.o
$(BUILD)/t/cuda_emu_strict: $(BUILD)/emu/obj/t/unit/cuda_emu_strict_kernels.o
$(BUILD)/asan/t/cuda_emu_strict: $(BUILD)/asan/emu/obj/t/unit/cuda_emu_strict_kernels.o

# The engine's commands linked with the emulated CUDA backend: `--backend cuda` runs on the
# host (slowly: tiny models only). t/gpu/run.sh's steps run through these where no GPU is.
EMU_BINS   := $(ENGINE_CMDS:engine/cmd/%.c=$(BUILD)/emu/bin/%)
# The GPU benchmarks too (t/gpu/run.sh with KVG_RUN_EMU=1 runs them emulated).
EMU_BENCHES := $(BUILD)/emu/bench/gpu_bench $(BUILD)/emu/bench/tiers_gpu_bench
emu: $(EMU_BINS) $(EMU_BENCHES) $(CUDA_UNITS) $(EMU_FAMILY_CHECK)

$(BUILD)/emu/bench/%: t/bench/%.c $(ENGINE_LIB) $(EMU_LIB) $(LIB) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O3 -DKVG_CUDA_EMU -Iengine $< -o $@ -Wl,--start-group $(ENGINE_LIB) $(EMU_LIB) -Wl,--end-group \
	    $(LIB) $(LDLIBS) $(EMU_LDLIBS)

# The self-contained folder for a bare GPU machine: build/gpu-bundle/ (scripts/gpu-bundle.sh;
# its objects in build/gpu-bundle-obj/, build/bin untouched).
gpu-bundle:
	BUILD=$(BUILD) scripts/gpu-bundle.sh

$(BUILD)/emu/bin/%: engine/cmd/%.c $(ENGINE_LIB) $(EMU_LIB) $(LIB) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DKVG_CUDA_EMU -Iengine $< -o $@ -Wl,--start-group $(ENGINE_LIB) $(EMU_LIB) -Wl,--end-group \
	    $(LIB) $(LDLIBS) $(EMU_LDLIBS)

$(BUILD)/obj/engine/cuda/absent.o: engine/cuda/absent.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iengine -c $< -o $@

$(BUILD)/asan/obj/engine/cuda/absent.o: engine/cuda/absent.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -Iengine -c $< -o $@

$(BUILD)/asan/obj/%.o: src/%.c $(HDRS) | $(BUILD)/asan/obj
	$(CC) $(ASAN_CFLAGS) -c $< -o $@

$(ASAN_LIB): $(ASAN_OBJS)
	rm -f $@; ar rcs $@ $^

$(BUILD)/asan/obj/engine/%.o: engine/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -Iengine -c $< -o $@

$(ASAN_ENGINE_LIB): $(ASAN_ENGINE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@; ar rcs $@ $^

# The engine and the tools under ASan+UBSan too: the daemon tests run the engine as a
# separate process, and an ASan test starts these.
$(BUILD)/asan/bin/%: engine/cmd/%.c $(ASAN_ENGINE_LIB) $(ASAN_ABSENT_OBJ) $(ASAN_LIB) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -Iengine $< -o $@ $(ASAN_ENGINE_LIB) $(ASAN_ABSENT_OBJ) $(ASAN_LIB) $(LDLIBS)

$(BUILD)/asan/bin/%: tools/%.c $(ASAN_LIB) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $< -o $@ $(ASAN_LIB) $(LDLIBS)

$(ASAN_CUDA_UNITS): $(BUILD)/asan/t/%: t/unit/%.c $(ASAN_ENGINE_LIB) $(ASAN_EMU_LIB) $(ASAN_LIB) $(HDRS) | $(BUILD)/asan/t
	$(CC) $(ASAN_CFLAGS) -DKVG_CUDA_EMU -It/unit -Iengine -Ikernels -Ikernels/emu $< $(filter %.o,$^) -o $@ \
	    -Wl,--start-group $(ASAN_ENGINE_LIB) $(ASAN_EMU_LIB) -Wl,--end-group $(ASAN_LIB) $(LDLIBS) $(EMU_LDLIBS)

$(BUILD)/asan/t/%: t/unit/%.c $(ASAN_ENGINE_LIB) $(ASAN_ABSENT_OBJ) $(ASAN_LIB) $(HDRS) | $(BUILD)/asan/t
	$(CC) $(ASAN_CFLAGS) -It/unit -Iengine $< -o $@ $(ASAN_ENGINE_LIB) $(ASAN_ABSENT_OBJ) $(ASAN_LIB) $(LDLIBS)

# libFuzzer targets are built with clang from the library sources directly, so the
# whole library is instrumented for coverage.
$(BUILD)/fuzz/%: fuzz/%.c $(LIB_SRCS) $(ENGINE_SRCS) $(HDRS) | $(BUILD)/fuzz
	clang $(BASE_CFLAGS) -Iengine -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    $< $(LIB_SRCS) $(ENGINE_SRCS) engine/cuda/absent.c -o $@ $(LDLIBS)

$(BUILD)/obj $(BUILD)/bin $(BUILD)/t $(BUILD)/bench $(BUILD)/asan/obj $(BUILD)/asan/t $(BUILD)/fuzz:
	mkdir -p $@

# The status page kvgate_status serves to browsers: ngx_module/dashboard/index.html as a C
# string. The generated file is committed (a build needs nothing but a C compiler) and
# remade here when the page changes; t/gateway-dashboard.t checks it is up to date.
ngx_module/ngx_http_kvgate_dashboard.c: ngx_module/dashboard/index.html ngx_module/dashboard/embed.pl
	perl ngx_module/dashboard/embed.pl $< > $@.tmp && mv -f $@.tmp $@

module: $(MODULE)
module-asan: $(MODULE_ASAN)

$(MODULE): $(LIB) config $(wildcard ngx_module/*.c ngx_module/*.h) scripts/build-module.sh
	BUILD=$(BUILD) scripts/build-module.sh

$(MODULE_ASAN): $(ASAN_LIB) config $(wildcard ngx_module/*.c ngx_module/*.h) scripts/build-module.sh
	BUILD=$(BUILD) KVG_MODULE_ASAN=1 scripts/build-module.sh

deps:
	@scripts/deps.sh

# The whole suite: C unit tests (TAP executables) and the perl end-to-end tests, in one
# prove run; then the C unit tests under ASan+UBSan and the nginx tests again with the
# ASan+UBSan build of the module (KVGATE_ASAN=1 makes the harness load it).
# prove runs with Kvgate::CheckedHarness: a test that skips fails the run unless
# t/skips-allowed allows that skip (a skipped check is one that cannot fail).
# prove runs TEST_JOBS files at once: most files spend their time waiting on servers,
# sockets and child processes, so 3 on 2 cores finishes the suite in ~55% of the time of
# one at a time (every wait in a test has a deadline, none a timing assertion). The
# longest files go first, so that none of them ends the run alone.
PROVE      := PERL5LIB=t/lib$${PERL5LIB:+:$$PERL5LIB} prove --harness Kvgate::CheckedHarness
TEST_JOBS  ?= 3
SLOW_TESTS := t/chat-templates.t t/engine-families.t t/deb.t t/gateway-backpressure.t t/tokenizer-hf.t \
              t/gpu-bundle.t t/gateway-tenants.t
OTHER_TESTS := $(filter-out $(SLOW_TESTS),$(wildcard t/*.t))

test: deps
	$(MAKE) -j$(NPROC) all asan module-asan
	@# the npm references (tokenizers, the SDK) before the unit tests, which read them too
	BUILD=$(BUILD) perl -It/lib -MKvgate::TokenizerRef -e \
	    'my ($$r, $$why) = Kvgate::TokenizerRef::install(); die "make test: $$why\n" unless $$r'
	BUILD=$(BUILD) $(PROVE) -j$(TEST_JOBS) $(PROVE_FLAGS) $(SLOW_TESTS) $(UNITS) $(OTHER_TESTS)
	BUILD=$(BUILD) KVGATE_ASAN=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    $(PROVE) -j$(TEST_JOBS) $(PROVE_FLAGS) $(SLOW_TESTS) $(ASAN_UNITS) $(OTHER_TESTS)

fuzz: $(FUZZERS)
	@scripts/run-fuzzers.sh $(FUZZ_SECONDS) $(FUZZERS)

run: deps all
	@scripts/run.sh

# The Debian packages (dpkg-buildpackage on a copy of the sources, CUDA=0), into
# $(BUILD)/deb/; lintian's report in $(BUILD)/deb/lintian.txt.
deb:
	@BUILD=$(BUILD) scripts/deb.sh

clean:
	rm -rf $(BUILD)
