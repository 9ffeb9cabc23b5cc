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
CFLAGS_OURS   := $(CFLAGS_COMMON) -Iinclude -Itests

# Our programs: the PID 1, the demo, and one conformance suite per area.
TEST_SRCS := $(wildcard tests/*.c)
TEST_LIB  := $(filter tests/tap.c tests/uffd_util.c,$(TEST_SRCS))
SUITES    := $(filter-out $(TEST_LIB),$(TEST_SRCS))
OURS := $(OUT)/init $(OUT)/bin/catch-writes \
	$(patsubst tests/%.c,$(OUT)/bin/%,$(SUITES))

# The tree's selftests, compiled the way tools/testing/selftests/mm does it.
ST   := $(KSRC)/tools/testing/selftests/mm
ST_CFLAGS := -O2 -Wall -U_FORTIFY_SOURCE -static -pthread -I $(KSRC) \
	     -isystem $(UAPI)/include -isystem $(KSRC)/tools/include/uapi \
	     -Wno-maybe-uninitialized -fmacro-prefix-map=$(ST)/=
ST_PROGS := uffd-unit-tests uffd-stress pagemap_ioctl
SELFTESTS := $(if $(KSRC),$(patsubst %,$(OUT)/bin/%,$(ST_PROGS)))

all: $(OURS) $(SELFTESTS)

$(OUT)/init: guest/init.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $<

$(OUT)/bin/catch-writes: demo/catch-writes.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $<

$(OUT)/bin/%: tests/%.c $(TEST_LIB) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_OURS) -o $@ $< $(TEST_LIB)

$(OUT)/bin/uffd-unit-tests $(OUT)/bin/uffd-stress: $(OUT)/bin/%: $(ST)/%.c $(ST)/uffd-common.c
	@mkdir -p $(dir $@)
	$(CC) $(ST_CFLAGS) -o $@ $^ $(ST)/vm_util.c $(ST)/thp_settings.c -lrt -lm

$(OUT)/bin/pagemap_ioctl: $(ST)/pagemap_ioctl.c
	@mkdir -p $(dir $@)
	$(CC) $(ST_CFLAGS) -o $@ $^ $(ST)/vm_util.c $(ST)/thp_settings.c -lrt -lm

.PHONY: all
