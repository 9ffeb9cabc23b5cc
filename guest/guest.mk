# Static guest binaries for one lane.  Called by scripts/build-guest.sh:
#   make -f guest/guest.mk OUT=dir CC=cc UAPI=dir KSRC=dir
# UAPI is the lane kernel's installed headers (headers_install), so programs
# see the uAPI of the kernel they run on; KSRC is that kernel's tree, whose
# own selftests are built from it here and never copied into the repository.

OUT  ?= build/guest/host
CC   ?= gcc
UAPI ?= /usr
KSRC ?=

CFLAGS_COMMON := -std=gnu11 -O2 -g -Wall -Wextra -Werror -static -pthread \
		 -isystem $(UAPI)/include
CFLAGS_OURS   := $(CFLAGS_COMMON) -Iinclude -Itests -Ibench -Iworkload

# libuffdwp (lib/*.c, include/uffdwp.h) as a static archive for the guest.
LIB_SRCS := $(wildcard lib/*.c)
LIB_OBJS := $(patsubst lib/%.c,$(OUT)/lib/%.o,$(LIB_SRCS))
LIB_A    := $(if $(LIB_SRCS),$(OUT)/libuffdwp.a)

# The versioned-record workload (workload/*.c), for the tool, the benchmarks
# and the tests that check snapshots with it: an archive, so a program that
# does not use it links none of it.
WL_SRCS := $(wildcard workload/*.c)
WL_A    := $(if $(WL_SRCS),$(OUT)/libworkload.a)

# Our programs: the PID 1, the demo, and one conformance suite per area.
TEST_SRCS := $(wildcard tests/*.c)
TEST_LIB  := $(filter tests/tap.c tests/uffd_util.c tests/uffd_ring.c \
		      tests/wp_probe.c,$(TEST_SRCS))
SUITES    := $(filter-out $(TEST_LIB),$(TEST_SRCS))
OURS := $(OUT)/init $(OUT)/bin/catch-writes $(OUT)/bin/sysfs-set \
	$(patsubst tests/%.c,$(OUT)/bin/%,$(SUITES))

# examples/NAME.c -> bin/example-NAME, built the way a user builds them:
# against libuffdwp installed under $(OUT)/prefix (header, static library,
# uffdwp.pc from lib/uffdwp.pc.in) through pkg-config --static.
PREFIX_G := $(abspath $(OUT))/prefix
EXAMPLES := $(patsubst examples/%.c,$(OUT)/bin/example-%,$(wildcard examples/*.c))
OURS += $(EXAMPLES)

# Benchmarks (bench/NAME.c -> bin/bench-NAME, sharing bench/bench_util.c),
# the uffdwp tool and the fuzzer.
BENCH_LIB  := $(wildcard bench/bench_util.c)
BENCH_SRCS := $(filter-out $(BENCH_LIB),$(wildcard bench/*.c))
OURS += $(patsubst bench/%.c,$(OUT)/bin/bench-%,$(BENCH_SRCS))
OURS += $(if $(wildcard tools/uffdwp.c),$(OUT)/bin/uffdwp)
# A fuzzer is fuzz/NAME.c (its driver) and the parts fuzz/NAME-*.c.
FUZZ_PARTS := $(wildcard fuzz/*-*.c)
OURS += $(patsubst fuzz/%.c,$(OUT)/bin/fuzz-%,$(filter-out $(FUZZ_PARTS),$(wildcard fuzz/*.c)))

# The tree's selftests, compiled the way tools/testing/selftests/mm does it.
ST   := $(KSRC)/tools/testing/selftests/mm
ST_CFLAGS := -O2 -Wall -U_FORTIFY_SOURCE -static -pthread -I $(KSRC) \
	     -isystem $(UAPI)/include -isystem $(KSRC)/tools/include/uapi \
	     -Wno-maybe-uninitialized -fmacro-prefix-map=$(ST)/=
ST_PROGS := uffd-unit-tests uffd-stress pagemap_ioctl ksm_functional_tests
# The ring's own kselftest comes with kernel/patches; a tree without the
# series (the mutant and base lanes) has none.
ST_PROGS += $(if $(wildcard $(ST)/uffd-wp-ring.c),uffd-wp-ring)
SELFTESTS := $(if $(KSRC),$(patsubst %,$(OUT)/bin/%,$(ST_PROGS)))

all: $(OURS) $(SELFTESTS)

$(OUT)/init: guest/init.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $<

$(OUT)/bin/sysfs-set: guest/sysfs-set.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $<

$(OUT)/bin/catch-writes: demo/catch-writes.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $<

$(PREFIX_G)/lib/pkgconfig/uffdwp.pc: $(LIB_A) include/uffdwp.h lib/uffdwp.pc.in
	@mkdir -p $(PREFIX_G)/include $(PREFIX_G)/lib/pkgconfig
	cp include/uffdwp.h $(PREFIX_G)/include/
	cp $(LIB_A) $(PREFIX_G)/lib/
	sed -e 's|@PREFIX@|$(PREFIX_G)|' -e 's|@LIBDIR@|$(PREFIX_G)/lib|' \
		-e "s|@VERSION@|$$(sed -n 's/^UFFDWP_VER *:= *//p' lib/lib.mk)|" lib/uffdwp.pc.in >$@

$(OUT)/bin/example-%: examples/%.c $(PREFIX_G)/lib/pkgconfig/uffdwp.pc
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -O2 -Wall -Wextra -Werror -static -o $@ $< \
		$$(PKG_CONFIG_PATH=$(PREFIX_G)/lib/pkgconfig pkg-config --static --cflags --libs uffdwp)

$(OUT)/lib/%.o: lib/%.c $(wildcard include/*.h lib/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) -Iinclude -Ilib -c -o $@ $<

$(OUT)/libuffdwp.a: $(LIB_OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

$(OUT)/workload/%.o: workload/%.c $(wildcard workload/*.h include/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -c -o $@ $<

$(OUT)/libworkload.a: $(patsubst workload/%.c,$(OUT)/workload/%.o,$(WL_SRCS))
	@rm -f $@
	$(AR) rcs $@ $^

$(OUT)/bin/bench-%: bench/%.c $(BENCH_LIB) $(TEST_LIB) $(WL_A) $(LIB_A) $(wildcard tests/*.h bench/*.h workload/*.h include/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $< $(BENCH_LIB) $(TEST_LIB) $(WL_A) $(LIB_A) -lm

$(OUT)/bin/uffdwp: tools/uffdwp.c $(WL_A) $(LIB_A) $(wildcard include/*.h workload/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $< $(WL_A) $(LIB_A) -lm

$(OUT)/bin/fuzz-%: fuzz/%.c $(FUZZ_PARTS) $(TEST_LIB) $(wildcard tests/*.h fuzz/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $< $(filter fuzz/$*-%.c,$(FUZZ_PARTS)) $(TEST_LIB)

# The clients step's driver of QEMU needs nothing but the TAP helpers (and
# so builds on a tree whose library is mid-change).
$(OUT)/bin/qemu-snapshot: tests/qemu-snapshot.c tests/tap.c tests/tap.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $< tests/tap.c

$(OUT)/bin/%: tests/%.c $(TEST_LIB) $(WL_A) $(LIB_A) $(wildcard tests/*.h workload/*.h include/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $< $(TEST_LIB) $(WL_A) $(LIB_A)

$(OUT)/bin/uffd-unit-tests $(OUT)/bin/uffd-stress: $(OUT)/bin/%: $(ST)/%.c $(ST)/uffd-common.c
	@mkdir -p $(dir $@)
	$(CC) $(ST_CFLAGS) -o $@ $^ $(ST)/vm_util.c $(ST)/thp_settings.c -lrt -lm

$(OUT)/bin/pagemap_ioctl $(OUT)/bin/ksm_functional_tests $(OUT)/bin/uffd-wp-ring: $(OUT)/bin/%: $(ST)/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ST_CFLAGS) -o $@ $^ $(ST)/vm_util.c $(ST)/thp_settings.c -lrt -lm

.PHONY: all
