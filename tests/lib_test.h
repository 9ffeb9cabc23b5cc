/* SPDX-License-Identifier: GPL-2.0 */
/*
 * lib_test.h: what libuffdwp's snapshot and session tests share
 * (header-only: each test program is one translation unit).
 *
 *  - F, the features uffdwp_probe() found (main() fills it), and
 *    skip_no_wp(): skip a case on a kernel without sync WP;
 *  - fill(): a pattern that differs per 8 bytes and per seed;
 *  - load_chain(): snapshot files loaded in order (a base, its deltas);
 *  - the gate: libuffdwp's test seam (lib/internal.h) is
 *    uw_snap_before_chunk, which the copier calls before each chunk.
 *    gate_hold() makes it wait until gate_open(); gate_remove() also takes
 *    the seam away.
 */
#ifndef UFFDWP_TESTS_LIB_TEST_H
#define UFFDWP_TESTS_LIB_TEST_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"
#include "uffdwp.h"

static struct uffdwp_features f;

static inline bool skip_no_wp(const char *name)
{
	if (f.wp)
		return false;
	tap_skip(name, "kernel has no sync write-protect for anonymous memory");
	return true;
}

/*
 * The number of PMD-mapped 2 MiB blocks of [P, P + LEN), a THP arena just
 * filled.  When some are not (memory fragmented by earlier suites), first
 * compact memory and collapse the arena, so that a test's precondition
 * holds when it can; the test skips, saying so, when it still does not.
 */
static inline long make_pmd_mapped(char *p, size_t len)
{
	long n = pmd_mapped_blocks(p, len);
	int fd;

	if (n < 0 || n == (long)(len / HPAGE_SIZE))
		return n;
	fd = open("/proc/sys/vm/compact_memory", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (write(fd, "1", 1) != 1)
			tap_diag("compact_memory: %s", strerror(errno));
		close(fd);
	}
	madvise(p, len, MADV_COLLAPSE);
	n = pmd_mapped_blocks(p, len);
	tap_diag("%ld of %zu blocks PMD-mapped after compaction and MADV_COLLAPSE",
		 n, len / HPAGE_SIZE);
	return n;
}

static inline void fill(char *p, size_t len, unsigned int seed)
{
	for (size_t i = 0; i < len; i += 8)
		*(uint64_t *)(p + i) = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
}

/* Load the NFILES files (each read from offset 0) into DST in order. */
static inline int load_chain(const int *fds, int nfiles,
		      const struct uffdwp_region *dst, size_t nr,
		      struct uffdwp_snapshot_info *last)
{
	struct uffdwp_snapshot_info prev, info;
	int err = 0;

	for (int i = 0; i < nfiles && !err; i++) {
		if (lseek(fds[i], 0, SEEK_SET) < 0)
			return -errno;
		err = uffdwp_snapshot_load(fds[i], dst, nr, i ? &prev : NULL,
					   &info);
		prev = info;
	}
	if (!err && last)
		*last = info;
	return err;
}

extern void (*uw_snap_before_chunk)(void);

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static bool gate_closed;

static inline void gate_wait(void)
{
	pthread_mutex_lock(&gate_lock);
	while (gate_closed)
		pthread_cond_wait(&gate_cond, &gate_lock);
	pthread_mutex_unlock(&gate_lock);
}

static inline void gate_hold(void)
{
	gate_closed = true;
	uw_snap_before_chunk = gate_wait;
}

static inline void gate_open(void)
{
	pthread_mutex_lock(&gate_lock);
	gate_closed = false;
	pthread_cond_broadcast(&gate_cond);
	pthread_mutex_unlock(&gate_lock);
}

static inline void gate_remove(void)
{
	gate_open();
	uw_snap_before_chunk = NULL;
}

#endif
