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
           libpcre2-8 hiredis yaml-0.1 libsystemd libnghttp2
PKGS    += zlib yajl
MODULES := common conf gateway auth ratelimit filters fallback model cache

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

# Link-time optimisation of build/sluice (docs/gateway.md, "Build flags"): the
# modules' objects carry GCC's IR beside their machine code (fat), and only the
# binary's link optimises across them; unit, fuzz and tool links use the
# machine code (-fno-lto: GCC would otherwise run LTO on them too). Not part
# of CFLAGS, so a package build (whose CFLAGS come from dpkg-buildflags) gets
# it too. LTO=0 turns it off; SANITIZE=1 builds leave it off.
ifeq ($(SANITIZE),1)
LTO     ?= 0
else
LTO     ?= 1
endif
ifeq ($(LTO),1)
LTO_CFLAGS  := -flto=auto -ffat-lto-objects
LTO_LDFLAGS := -flto=auto
NO_LTO      := -fno-lto
else
LTO_CFLAGS  :=
LTO_LDFLAGS :=
NO_LTO      :=
endif

# Profile-guided build (opt-in, docs/gateway.md, "Build flags"): `make pgo`
# builds build-pgo/sluice with -fprofile-generate, runs bench/pgo_train.sh on
# it (realistic.sh's plain, full and full-sse loads; needs wrk and nginx),
# then rebuilds it with -fprofile-use from the .gcda files the run left beside
# the objects. Nothing is committed or reused: every `make pgo` trains anew.
# The default build, the tests and the package never use it. Of what
# -fprofile-use turns on, the code-duplicating passes (trace formation, loop
# unrolling, peeling, splitting and unswitching, cloning for constants) are
# left off: the full request then runs 705 distinct I-cache lines instead of
# 823, with 14 % fewer I1 misses (bench/RESULTS.md, "pgoflags").
ifeq ($(PGO),gen)
PGO_CFLAGS := -fprofile-generate -fprofile-update=atomic
else ifeq ($(PGO),use)
PGO_CFLAGS := -fprofile-use -fprofile-partial-training -Wno-missing-profile \
              -fno-tracer -fno-unroll-loops -fno-peel-loops -fno-split-loops \
              -fno-unswitch-loops -fno-ipa-cp-clone
else
PGO_CFLAGS :=
endif

# Calls into shared libraries (libevent, libc, OpenSSL) go through the GOT
# directly, not through a PLT stub (one jump less per call); the GOT is then
# bound at start (-z now), as Debian's hardening flags do anyway.
CODEGEN := $(strip -fno-plt $(PGO_CFLAGS))

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
           -Wmissing-prototypes -Wno-unused-parameter
CFLAGS  ?= $(OPT) -g
SL_BUILD_CFLAGS := $(CFLAGS) $(SANFLAGS) $(CODEGEN) $(LTO_LDFLAGS)
CFLAGS  += -std=c11 -D_GNU_SOURCE -pthread $(CODEGEN) $(WARN) $(SANFLAGS) -I. \
           $(shell $(PKG) --cflags $(PKGS))
LDFLAGS += -pthread $(SANFLAGS) -Wl,-z,now
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
        format-check check-san bench conf-reference promtool-test install FORCE \
        check-layers pgo

all: $(BIN) $(TOOL_BINS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CC    $<" || true
	$(Q)$(CC) $(CFLAGS) $(LTO_CFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJS)
	@[ -n "$(Q)" ] && echo "  AR    $@" || true
	$(Q)rm -f $@ && ar rcs $@ $^

# Generated sources: files embedded as C arrays (the status page), in the
# build dir, linked into the library like any module source.
GEN_OBJS   := $(BUILD)/obj/gen/status_page.o
$(LIB): $(GEN_OBJS)

$(BUILD)/gen/status_page.c: gateway/www/status.html scripts/embed.py
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  EMBED $<" || true
	$(Q)$(PYTHON) scripts/embed.py --include common/status_page.h sl_status_page $< $@

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CC    $<" || true
	$(Q)$(CC) $(CFLAGS) $(LTO_CFLAGS) -MMD -MP -c $< -o $@

$(BIN): $(MAIN_OBJ) $(LIB)
	@[ -n "$(Q)" ] && echo "  LD    $@" || true
	$(Q)$(CC) $(CFLAGS) $(LTO_LDFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(UNIT_HELP) $(LIB)
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  TEST  $@" || true
	$(Q)$(CC) $(CFLAGS) $(NO_LTO) $(shell $(PKG) --cflags cmocka) $(LDFLAGS) -o $@ $< \
	    $(UNIT_HELP) $(LIB) $(LDLIBS) $(shell $(PKG) --libs cmocka)

# Corpus replay: the fuzz target linked with a plain main() that feeds it every
# file of its corpus. Works with gcc; `make fuzz` builds the libFuzzer versions.
$(BUILD)/fuzz/%: tests/fuzz/%.c tests/fuzz/replay_main.c $(wildcard tests/fuzz/*.h) $(LIB)
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  FUZZ  $@" || true
	$(Q)$(CC) $(CFLAGS) $(NO_LTO) $(LDFLAGS) -o $@ $< tests/fuzz/replay_main.c $(LIB) $(LDLIBS)

$(BUILD)/tools/%: tests/tools/%.c $(LIB)
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  TOOL  $@" || true
	$(Q)$(CC) $(CFLAGS) $(NO_LTO) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# The README's two commands: both install missing packages first (apt-get),
# then re-enter make so pkg-config sees them.
test:
	@./scripts/deps.sh --if-missing
	@$(MAKE) --no-print-directory -j$(NPROC) test-all

test-all: all unit fuzz-replay integration promtool-test

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

# The alert rules (contrib/prometheus) checked and unit-tested by promtool.
promtool-test:
	promtool check rules contrib/prometheus/alerts.yml
	promtool test rules tests/prometheus/alerts_test.yml

# libFuzzer builds (clang): build/fuzz-lf/fuzz_x; run e.g.
#   build/fuzz-lf/fuzz_http_request tests/fuzz/corpus/fuzz_http_request -max_total_time=60
fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang LTO=0 \
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

# Training uses the ordinary build's bench_upstream: the instrumented one
# would add its own calls to the library objects' profile.
pgo: $(TOOL_BINS)
	rm -rf build-pgo
	$(MAKE) PGO=gen BUILD=build-pgo build-pgo/sluice
	SLUICE_BIN=build-pgo/sluice ./bench/pgo_train.sh
	$(MAKE) PGO=use BUILD=build-pgo build-pgo/sluice

deps:
	./scripts/deps.sh

# docs/conf-reference.md, written from the key table (a test checks it).
conf-reference: $(BIN)
	./scripts/update-conf-reference.sh $(BIN)

FORMAT_SRCS = $(shell git ls-files '*.c' '*.h' 2>/dev/null)
format:
	clang-format -i $(FORMAT_SRCS)
format-check:
	clang-format --dry-run --Werror $(FORMAT_SRCS)

# Include layering: the README's module rules and the gateway's internal
# order (scripts/check-layers.py; the remaining exceptions, which may only
# shrink, in scripts/check-layers.allow).
check-layers:
	$(PYTHON) scripts/check-layers.py

clean:
	rm -rf build build-san build-fuzz build-pgo

# ---- version and install (docs/ops.md) --------------------------------------
# `sluice -V` reports VERSION (keep debian/changelog's in step: a test checks),
# the commit and the build flags, compiled into common/version.o only. The
# stamp changes when one of them does, so a new commit relinks the binary.
# SLUICE_COMMIT may come from the environment (a tree without .git: only this
# tree's own repository counts, not one it happens to be unpacked in).
VERSION        := 0.1.0
SLUICE_COMMIT  ?= $(shell [ "$$(git rev-parse --show-toplevel 2>/dev/null)" = "$(CURDIR)" ] && \
                    c=$$(git rev-parse --short=12 HEAD) && \
                    { git diff --quiet HEAD -- || c="$$c-dirty"; }; echo $${c:-unknown})
# Path-mapping flags name the build directory: left out, so the string (and
# a package) is the same wherever it is built.
SL_FLAGS_SHOWN  = $(subst ",,$(subst ',,$(strip $(filter-out -ffile-prefix-map=% \
                    -fdebug-prefix-map=% -fmacro-prefix-map=%,$(SL_BUILD_CFLAGS)))))
SL_VERSION_DEFS = -DSL_VERSION_STR='"$(VERSION)"' -DSL_COMMIT_STR='"$(SLUICE_COMMIT)"' \
                  -DSL_BUILD_FLAGS_STR='"$(SL_FLAGS_SHOWN)"'
$(BUILD)/obj/common/version.o: CFLAGS += $(SL_VERSION_DEFS)
$(BUILD)/obj/common/version.o: $(BUILD)/version.stamp
$(BUILD)/version.stamp: FORCE
	@mkdir -p $(dir $@)
	@printf '%s\n' "$(VERSION)" "$(SLUICE_COMMIT)" "$(SL_FLAGS_SHOWN)" > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
FORCE:

# Every object depends on the flags it was built with: the stamp changes
# when the compiler, CFLAGS, the LTO flags or the link flags do (LTO=0,
# SANITIZE's OPT, a package's dpkg-buildflags), so a changed flag rebuilds
# the objects instead of linking stale ones (nginx's configure and
# HAProxy's build options file do the same).
SL_FLAGS_LINE = $(CC) $(CFLAGS) $(LTO_CFLAGS) | $(LTO_LDFLAGS) $(LDFLAGS) $(LDLIBS)
$(LIB_OBJS) $(MAIN_OBJ) $(GEN_OBJS): $(BUILD)/flags.stamp
$(BUILD)/flags.stamp: FORCE
	@mkdir -p $(dir $@)
	@printf '%s\n' '$(subst ','"'"',$(SL_FLAGS_LINE))' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi

# make install [PREFIX=/usr] [DESTDIR=...]: the binary, the man page, the
# systemd unit and logrotate file, the example conf (kept if one is there:
# it is the operator's), and the state directory of the queue journal.
# SL_INSTALL_BIN installs an already built binary (the tests, a san build).
PREFIX         ?= /usr
SBINDIR        ?= $(PREFIX)/sbin
MANDIR         ?= $(PREFIX)/share/man
SYSCONFDIR     ?= /etc
LOCALSTATEDIR  ?= /var
UNITDIR        ?= /lib/systemd/system
SL_INSTALL_BIN ?= $(BIN)
INSTALL        ?= install
install: $(SL_INSTALL_BIN)
	$(INSTALL) -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(UNITDIR) \
	    $(DESTDIR)$(SYSCONFDIR)/sluice $(DESTDIR)$(SYSCONFDIR)/logrotate.d \
	    $(DESTDIR)$(SYSCONFDIR)/default \
	    $(DESTDIR)$(LOCALSTATEDIR)/lib/sluice $(DESTDIR)$(LOCALSTATEDIR)/log/sluice
	$(INSTALL) -m 0755 $(SL_INSTALL_BIN) $(DESTDIR)$(SBINDIR)/sluice
	$(INSTALL) -m 0644 docs/sluice.8 $(DESTDIR)$(MANDIR)/man8/sluice.8
	sed 's|/usr/sbin/sluice|$(SBINDIR)/sluice|g; s|/etc/|$(SYSCONFDIR)/|g' \
	    contrib/systemd/sluice.service > $(DESTDIR)$(UNITDIR)/sluice.service.tmp
	mv $(DESTDIR)$(UNITDIR)/sluice.service.tmp $(DESTDIR)$(UNITDIR)/sluice.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/sluice.service
	$(INSTALL) -m 0644 contrib/logrotate/sluice $(DESTDIR)$(SYSCONFDIR)/logrotate.d/sluice
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/sluice/sluice.yaml ]; then \
	    echo "  kept $(DESTDIR)$(SYSCONFDIR)/sluice/sluice.yaml"; \
	else $(INSTALL) -m 0644 conf/sluice.yaml $(DESTDIR)$(SYSCONFDIR)/sluice/sluice.yaml; fi
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/default/sluice ]; then \
	    echo "  kept $(DESTDIR)$(SYSCONFDIR)/default/sluice"; \
	else $(INSTALL) -m 0600 contrib/systemd/sluice.default $(DESTDIR)$(SYSCONFDIR)/default/sluice; fi

-include $(LIB_OBJS:.o=.d) $(MAIN_OBJ:.o=.d) $(GEN_OBJS:.o=.d)
