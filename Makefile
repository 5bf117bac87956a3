# kvgate — top-level build.
#
#   make            build the shared library, tools, unit tests and the nginx module
#   make deps       install the Debian packages the build and tests need (idempotent)
#   make test       deps + build + the whole test suite through prove (+ ASan/UBSan unit tests)
#   make fuzz       build the libFuzzer targets and run each for FUZZ_SECONDS
#   make run        build and start what exists (see README)
#
# Layout of the outputs (all under build/, ignored by git):
#   build/libkvgate.a              src/*.c (the shared library: no nginx, no CUDA)
#   build/bin/NAME                 tools/NAME.c
#   build/t/NAME                   t/unit/NAME.c  (C unit tests, emit TAP)
#   build/bench/NAME               t/bench/NAME.c
#   build/asan/...                 the library and unit tests again under ASan+UBSan
#   build/fuzz/NAME                fuzz/NAME.c (clang, -fsanitize=fuzzer)
#   build/ngx_http_kvgate_module.so

CC      ?= gcc
BUILD   ?= build
PKGS    := jansson libcrypto libutf8proc
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -ljansson -lcrypto -lutf8proc)

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
FUZZ_SECONDS ?= 30

MODULE     := $(BUILD)/ngx_http_kvgate_module.so
MODULE_ASAN := $(BUILD)/asan/ngx_http_kvgate_module.so

.PHONY: all lib engine tools units benches asan module module-asan deps test test-unit test-asan test-nginx fuzz run clean

all: lib tools engine units benches module

lib: $(LIB)
engine: $(ENGINE_LIB) $(ENGINE_BINS)
tools: $(TOOLS)
units: $(UNITS)
benches: $(BENCHES)
asan: $(ASAN_UNITS) $(ASAN_BINS)

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

$(BUILD)/bin/%: engine/cmd/%.c $(ENGINE_LIB) $(LIB) $(HDRS) | $(BUILD)/bin
	$(CC) $(CFLAGS) -Iengine $< -o $@ $(ENGINE_LIB) $(LIB) $(LDLIBS)

$(BUILD)/bin/%: tools/%.c $(LIB) $(HDRS) | $(BUILD)/bin
	$(CC) $(CFLAGS) $< -o $@ $(LIB) $(LDLIBS)

$(BUILD)/t/%: t/unit/%.c $(ENGINE_LIB) $(LIB) $(HDRS) | $(BUILD)/t
	$(CC) $(CFLAGS) -It/unit -Iengine $< -o $@ $(ENGINE_LIB) $(LIB) $(LDLIBS)

$(BUILD)/bench/%: t/bench/%.c $(ENGINE_LIB) $(LIB) $(HDRS) | $(BUILD)/bench
	$(CC) $(CFLAGS) -O3 -Iengine $< -o $@ $(ENGINE_LIB) $(LIB) $(LDLIBS) $(BENCH_LIBS)

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
$(BUILD)/asan/bin/%: engine/cmd/%.c $(ASAN_ENGINE_LIB) $(ASAN_LIB) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -Iengine $< -o $@ $(ASAN_ENGINE_LIB) $(ASAN_LIB) $(LDLIBS)

$(BUILD)/asan/bin/%: tools/%.c $(ASAN_LIB) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $< -o $@ $(ASAN_LIB) $(LDLIBS)

$(BUILD)/asan/t/%: t/unit/%.c $(ASAN_ENGINE_LIB) $(ASAN_LIB) $(HDRS) | $(BUILD)/asan/t
	$(CC) $(ASAN_CFLAGS) -It/unit -Iengine $< -o $@ $(ASAN_ENGINE_LIB) $(ASAN_LIB) $(LDLIBS)

# libFuzzer targets are built with clang from the library sources directly, so the
# whole library is instrumented for coverage.
$(BUILD)/fuzz/%: fuzz/%.c $(LIB_SRCS) $(ENGINE_SRCS) $(HDRS) | $(BUILD)/fuzz
	clang $(BASE_CFLAGS) -Iengine -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    $< $(LIB_SRCS) $(ENGINE_SRCS) -o $@ $(LDLIBS)

$(BUILD)/obj $(BUILD)/bin $(BUILD)/t $(BUILD)/bench $(BUILD)/asan/obj $(BUILD)/asan/t $(BUILD)/fuzz:
	mkdir -p $@

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
test: deps
	$(MAKE) all asan module-asan
	BUILD=$(BUILD) prove $(PROVE_FLAGS) $(UNITS) $(wildcard t/*.t)
	BUILD=$(BUILD) KVGATE_ASAN=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    prove $(PROVE_FLAGS) $(ASAN_UNITS) $(wildcard t/*.t)

fuzz: $(FUZZERS)
	@scripts/run-fuzzers.sh $(FUZZ_SECONDS) $(FUZZERS)

run: deps all
	@scripts/run.sh

clean:
	rm -rf $(BUILD)
