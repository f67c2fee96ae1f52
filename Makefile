# sluice — plain Makefile. `make` builds build/sluice and build/libsluice.a;
# `make test` builds and runs every test; `make SANITIZE=1 ...` does the same
# with ASan+UBSan into build-san/. `V=1` prints full command lines.
#
# Sources are found by folder, so adding a file to a module needs no edit here
# (LIB_SRCS, UNIT_SRCS and FUZZ_SRCS can be narrowed on the command line to
# build one module alone, e.g. make BUILD=build/x LIB_SRCS="common/sl.c ..."):
#   <module>/*.c          -> libsluice.a  (gateway/main.c -> the binary only)
#   tests/unit/test_*.c   -> one cmocka binary each
#   tests/fuzz/fuzz_*.c   -> one corpus-replay binary each (libFuzzer: make fuzz)

CC      ?= cc
NPROC   := $(shell nproc 2>/dev/null || echo 2)
PKG     ?= pkg-config
PYTHON  ?= /usr/bin/python3

PKGS    := libevent libevent_pthreads libevent_openssl openssl jansson \
           libpcre2-8 hiredis yaml-0.1
MODULES := common conf gateway auth ratelimit filters fallback model

ifeq ($(SANITIZE),1)
BUILD   ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer \
            -fno-sanitize-recover=undefined
OPT     ?= -O1
else
BUILD   ?= build
SANFLAGS :=
OPT     ?= -O2
endif

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
           -Wmissing-prototypes -Wno-unused-parameter
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -pthread $(WARN) $(SANFLAGS) -I. \
           $(shell $(PKG) --cflags $(PKGS))
LDFLAGS += -pthread $(SANFLAGS)
LDLIBS  += $(shell $(PKG) --libs $(PKGS)) -lhttp_parser -lm -lunistring

ifeq ($(V),1)
Q :=
else
Q := @
endif

LIB_SRCS   := $(filter-out gateway/main.c,$(foreach m,$(MODULES),$(wildcard $(m)/*.c)))
LIB_OBJS   := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
MAIN_OBJ   := $(BUILD)/obj/gateway/main.o
UNIT_SRCS  := $(wildcard tests/unit/test_*.c)
UNIT_BINS  := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
UNIT_HELP  := $(filter-out tests/unit/test_%,$(wildcard tests/unit/*.c))
FUZZ_SRCS  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS  := $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz/%)
TOOL_SRCS  := $(wildcard tests/tools/*.c)
TOOL_BINS  := $(TOOL_SRCS:tests/tools/%.c=$(BUILD)/tools/%)
LIB        := $(BUILD)/libsluice.a
BIN        := $(BUILD)/sluice

.PHONY: all test test-all unit fuzz-replay integration fuzz run deps clean format \
        format-check check-san bench conf-reference

all: $(BIN) $(TOOL_BINS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CC    $<" || true
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJS)
	@[ -n "$(Q)" ] && echo "  AR    $@" || true
	$(Q)rm -f $@ && ar rcs $@ $^

$(BIN): $(MAIN_OBJ) $(LIB)
	@[ -n "$(Q)" ] && echo "  LD    $@" || true
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(UNIT_HELP) $(LIB)
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  TEST  $@" || true
	$(Q)$(CC) $(CFLAGS) $(shell $(PKG) --cflags cmocka) $(LDFLAGS) -o $@ $< \
	    $(UNIT_HELP) $(LIB) $(LDLIBS) $(shell $(PKG) --libs cmocka)

# Corpus replay: the fuzz target linked with a plain main() that feeds it every
# file of its corpus. Works with gcc; `make fuzz` builds the libFuzzer versions.
$(BUILD)/fuzz/%: tests/fuzz/%.c tests/fuzz/replay_main.c $(LIB)
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  FUZZ  $@" || true
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< tests/fuzz/replay_main.c $(LIB) $(LDLIBS)

$(BUILD)/tools/%: tests/tools/%.c $(LIB)
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  TOOL  $@" || true
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# The README's two commands: both install missing packages first (apt-get),
# then re-enter make so pkg-config sees them.
test:
	@./scripts/deps.sh --if-missing
	@$(MAKE) --no-print-directory -j$(NPROC) test-all

test-all: all unit fuzz-replay integration

unit: $(UNIT_BINS)
	@set -e; for t in $(UNIT_BINS); do \
	    echo "== $$t"; $$t; done

fuzz-replay: $(FUZZ_BINS)
	@set -e; for f in $(FUZZ_BINS); do n=$$(basename $$f); \
	    echo "== $$n: replaying tests/fuzz/corpus/$$n"; \
	    $$f tests/fuzz/corpus/$$n; done

integration: $(BIN) $(TOOL_BINS)
	SLUICE_BIN=$(abspath $(BIN)) SLUICE_BUILD=$(abspath $(BUILD)) \
	    $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration $(PYTEST_ARGS)

# libFuzzer builds (clang): build/fuzz-lf/fuzz_x; run e.g.
#   build/fuzz-lf/fuzz_http_request tests/fuzz/corpus/fuzz_http_request -max_total_time=60
fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang \
	    SANFLAGS="-fsanitize=fuzzer-no-link,address,undefined" build-fuzz/libsluice.a
	@mkdir -p build/fuzz-lf
	@set -e; for s in $(FUZZ_SRCS); do n=$$(basename $$s .c); \
	    echo "  LF    build/fuzz-lf/$$n"; \
	    clang $(CFLAGS) -fsanitize=fuzzer,address,undefined -o build/fuzz-lf/$$n \
	        $$s build-fuzz/libsluice.a $(LDLIBS); done

check-san:
	$(MAKE) -j$(NPROC) SANITIZE=1 test-all

run:
	@./scripts/deps.sh --if-missing
	@$(MAKE) --no-print-directory -j$(NPROC) all
	./scripts/run-demo.sh $(abspath $(BIN))

bench: $(BIN) $(TOOL_BINS)
	./bench/run.sh

deps:
	./scripts/deps.sh

conf-reference: $(BIN)
	$(BIN) --conf-reference

FORMAT_SRCS = $(shell git ls-files '*.c' '*.h' 2>/dev/null)
format:
	clang-format -i $(FORMAT_SRCS)
format-check:
	clang-format --dry-run --Werror $(FORMAT_SRCS)

clean:
	rm -rf build build-san build-fuzz

-include $(LIB_OBJS:.o=.d) $(MAIN_OBJ:.o=.d)
