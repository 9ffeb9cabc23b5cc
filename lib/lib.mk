# lib/lib.mk: host build, packaging and unit tests of libuffdwp.
# Included by the top Makefile.  Host builds use the host's /usr/include
# uAPI (lib/uapi_compat.h fills in what older headers lack).
#
#   make lib                     build/host/libuffdwp.{a,so} and build/host/uffdwp
#   make install PREFIX=/usr/local [DESTDIR=...]
#                                headers, libraries, uffdwp.pc, the tool
#   make check-host              the library's unit tests (tests/lib-*.c) on
#                                this machine's kernel, as ordinary programs

HOST_CC      ?= gcc
HOST_AR      ?= ar
HOST_OUT     := build/host
# The library builds from lib/ and include/ alone; the tool and the tests
# also see the shared workload (workload/) and the test helpers.
HOST_LIB_CFLAGS := -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -fPIC \
		-Iinclude -Ilib
HOST_CFLAGS  := $(HOST_LIB_CFLAGS) -Iworkload -Itests
PREFIX       ?= /usr/local
LIBDIR       ?= $(PREFIX)/lib
DESTDIR      ?=
UFFDWP_SOVER := 0
UFFDWP_VER   := 0.4.0

HOST_LIB_SRCS  := $(wildcard lib/*.c)
HOST_LIB_OBJS  := $(patsubst lib/%.c,$(HOST_OUT)/lib/%.o,$(HOST_LIB_SRCS))
HOST_LIB_A     := $(HOST_OUT)/libuffdwp.a
HOST_LIB_SO    := $(HOST_OUT)/libuffdwp.so
HOST_LIB_SOV   := $(HOST_OUT)/libuffdwp.so.$(UFFDWP_VER)
HOST_TOOL      := $(HOST_OUT)/uffdwp
HOST_TEST_SRCS := $(wildcard tests/lib-*.c)
HOST_TESTS     := $(patsubst tests/%.c,$(HOST_OUT)/tests/%,$(HOST_TEST_SRCS))
HOST_TEST_LIB  := tests/tap.c tests/uffd_util.c
HOST_HDRS      := $(wildcard include/*.h lib/*.h)
# The versioned-record workload of the tool and the tests (an archive).
HOST_WL_SRCS   := $(wildcard workload/*.c)
HOST_WL_A      := $(HOST_OUT)/libworkload.a

.PHONY: lib install check-host

lib: $(HOST_LIB_A) $(HOST_LIB_SO) $(HOST_TOOL)

$(HOST_OUT)/lib/%.o: lib/%.c $(HOST_HDRS)
	@mkdir -p $(dir $@)
	$(HOST_CC) $(HOST_LIB_CFLAGS) -c -o $@ $<

$(HOST_LIB_A): $(HOST_LIB_OBJS)
	@rm -f $@
	$(HOST_AR) rcs $@ $^

# lib/libuffdwp.map: the exported symbols by version node, kept by hand.
$(HOST_LIB_SOV): $(HOST_LIB_OBJS) lib/libuffdwp.map
	$(HOST_CC) -shared -pthread -Wl,-soname,libuffdwp.so.$(UFFDWP_SOVER) \
		-Wl,--version-script=lib/libuffdwp.map -o $@ $(HOST_LIB_OBJS)

$(HOST_LIB_SO): $(HOST_LIB_SOV)
	ln -sf libuffdwp.so.$(UFFDWP_VER) $(HOST_OUT)/libuffdwp.so.$(UFFDWP_SOVER)
	ln -sf libuffdwp.so.$(UFFDWP_SOVER) $@

$(HOST_OUT)/workload/%.o: workload/%.c $(HOST_HDRS) $(wildcard workload/*.h)
	@mkdir -p $(dir $@)
	$(HOST_CC) $(HOST_CFLAGS) -c -o $@ $<

$(HOST_WL_A): $(patsubst workload/%.c,$(HOST_OUT)/workload/%.o,$(HOST_WL_SRCS))
	@rm -f $@
	$(HOST_AR) rcs $@ $^

$(HOST_TOOL): tools/uffdwp.c $(HOST_WL_A) $(HOST_LIB_A) $(HOST_HDRS) $(wildcard workload/*.h)
	$(HOST_CC) $(HOST_CFLAGS) -o $@ $< $(HOST_WL_A) $(HOST_LIB_A) -lm

# uffdwp.pc is written at install time: it names this PREFIX and LIBDIR.
install: lib
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
		-e 's|@VERSION@|$(UFFDWP_VER)|' lib/uffdwp.pc.in >$(HOST_OUT)/uffdwp.pc
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(LIBDIR)/pkgconfig \
		$(DESTDIR)$(PREFIX)/bin
	install -m 644 include/uffdwp.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(HOST_LIB_A) $(DESTDIR)$(LIBDIR)/
	install -m 644 $(HOST_LIB_SOV) $(DESTDIR)$(LIBDIR)/
	ln -sf libuffdwp.so.$(UFFDWP_VER) $(DESTDIR)$(LIBDIR)/libuffdwp.so.$(UFFDWP_SOVER)
	ln -sf libuffdwp.so.$(UFFDWP_SOVER) $(DESTDIR)$(LIBDIR)/libuffdwp.so
	install -m 644 $(HOST_OUT)/uffdwp.pc $(DESTDIR)$(LIBDIR)/pkgconfig/
	install -m 755 $(HOST_TOOL) $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man3
	install -m 644 man/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 man/*.3 $(DESTDIR)$(PREFIX)/share/man/man3/
	install -d $(DESTDIR)$(PREFIX)/share/man/man7
	install -m 644 man/*.7 $(DESTDIR)$(PREFIX)/share/man/man7/
	@# A program linked against the shared library finds it at once (a
	@# staged install, DESTDIR, is the packager's to register).
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi

$(HOST_OUT)/tests/%: tests/%.c $(HOST_WL_A) $(HOST_LIB_A) $(HOST_TEST_LIB) $(HOST_HDRS) $(wildcard tests/*.h workload/*.h)
	@mkdir -p $(dir $@)
	$(HOST_CC) $(HOST_CFLAGS) -o $@ $< $(HOST_TEST_LIB) $(HOST_WL_A) $(HOST_LIB_A) -lm

# Each test prints TAP; the target fails if any case fails or a program
# exits non-zero.  Skips (missing kernel features) are listed with reasons.
check-host: $(HOST_TESTS) $(HOST_TOOL)
	@rc=0; for t in $(HOST_TESTS); do \
		echo "== $$t"; \
		timeout 300 $$t >$$t.tap 2>&1 || rc=1; cat $$t.tap; \
		grep -q '^not ok' $$t.tap && rc=1; \
	done; \
	echo "== $(HOST_TOOL) info"; $(HOST_TOOL) info || rc=1; \
	awk '/^ok .*# SKIP/ { s++; next } /^ok / { p++ } /^not ok/ { f++ } \
		END { printf "check-host: %d passed, %d failed, %d skipped\n", p, f, s }' \
		$(HOST_OUT)/tests/*.tap; \
	exit $$rc
