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
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
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

/*
 * The watchdog: a case that hangs fails (and the program bails out)
 * instead of hanging `make check-host`.  watchdog_arm(NAME, SECONDS)
 * before the case, watchdog_disarm() after it.
 */
static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cond = PTHREAD_COND_INITIALIZER;
static const char *wd_name;
static int wd_seconds;
static bool wd_armed;
static pthread_t wd_thread;

static inline void *wd_main(void *arg)
{
	struct timespec ts;

	(void)arg;
	pthread_mutex_lock(&wd_lock);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += wd_seconds;
	while (wd_armed)
		if (pthread_cond_timedwait(&wd_cond, &wd_lock, &ts) == ETIMEDOUT &&
		    wd_armed) {
			tap_fail(wd_name, "no progress in %d s: hung", wd_seconds);
			tap_bail("%s hung", wd_name);
		}
	pthread_mutex_unlock(&wd_lock);
	return NULL;
}

static inline void watchdog_arm(const char *name, int seconds)
{
	wd_name = name;
	wd_seconds = seconds;
	wd_armed = true;
	pthread_create(&wd_thread, NULL, wd_main, NULL);
}

static inline void watchdog_disarm(void)
{
	pthread_mutex_lock(&wd_lock);
	wd_armed = false;
	pthread_cond_broadcast(&wd_cond);
	pthread_mutex_unlock(&wd_lock);
	pthread_join(wd_thread, NULL);
}

/*
 * The load of issue #35: a 16 MiB arena (its first half MADV_HUGEPAGE),
 * three writers each writing its third word by word, pass after pass (the
 * pass number, from 1, in every word), and one thread that about every
 * 20 ms gives part of the arena back or moves it: MADV_DONTNEED,
 * MADV_FREE + MADV_PAGEOUT, MADV_PAGEOUT, MADV_COLD, move_pages() or
 * fork() (the child exits at once).
 */
#define MLOAD_LEN	(16UL << 20)
#define MLOAD_WRITERS	3
#ifndef MADV_COLD
#define MADV_COLD	20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT	21
#endif

struct mload {
	char *arena, *raw;
	pthread_t th[MLOAD_WRITERS + 1];
	volatile int stop;
	unsigned long ops[6], passes[MLOAD_WRITERS];
	int nthreads;
};

struct mload_writer {
	struct mload *m;
	int k;
};
static struct mload_writer mload_w[MLOAD_WRITERS];

/* Writer K's part: whole pages. */
static inline void mload_part(size_t k, size_t *off, size_t *len)
{
	size_t psz = (size_t)sysconf(_SC_PAGESIZE);
	size_t part = MLOAD_LEN / MLOAD_WRITERS / psz * psz;

	*off = k * part;
	*len = k + 1 == MLOAD_WRITERS ? MLOAD_LEN - *off : part;
}

static inline void *mload_writer_main(void *arg)
{
	struct mload_writer *w = arg;
	size_t off, len;

	mload_part((size_t)w->k, &off, &len);
	for (uint64_t v = 1; !w->m->stop; v++) {
		volatile uint64_t *q = (volatile uint64_t *)(w->m->arena + off);

		for (size_t i = 0; i < len / 8 && !w->m->stop; i++)
			q[i] = v;
		w->m->passes[w->k] = v;
	}
	return NULL;
}

static inline void *mload_discard_main(void *arg)
{
	struct mload *m = arg;
	size_t psz = (size_t)sysconf(_SC_PAGESIZE), piece = 64UL << 10;
	unsigned int seed = 35;

	for (unsigned long n = 0; !m->stop; n++) {
		char *at = m->arena +
			   (size_t)rand_r(&seed) % (MLOAD_LEN / piece) * piece;
		void *pages[16];
		int nodes[16] = { 0 }, status[16];
		pid_t pid;

		usleep(20000);
		switch (n % 6) {
		case 0:
			madvise(at, piece, MADV_DONTNEED);
			break;
		case 1:
			madvise(at, piece, MADV_FREE);
			madvise(at, piece, MADV_PAGEOUT);
			break;
		case 2:
			madvise(at, piece, MADV_PAGEOUT);
			break;
		case 3:
			madvise(at, piece, MADV_COLD);
			break;
		case 4:
			for (int i = 0; i < 16; i++)
				pages[i] = at + (size_t)i * psz;
			sys_move_pages(16, pages, nodes, status, MPOL_MF_MOVE);
			break;
		default:
			pid = fork();
			if (pid == 0)
				_exit(0);
			if (pid > 0)
				waitpid(pid, NULL, 0);
		}
		m->ops[n % 6]++;
	}
	return NULL;
}

/* Map and fill the arena and start the threads: 0 or -errno. */
static inline int mload_start(struct mload *m)
{
	size_t al = 2UL << 20;

	memset(m, 0, sizeof(*m));
	m->raw = mmap(NULL, MLOAD_LEN + al, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m->raw == MAP_FAILED)
		return -errno;
	m->arena = (char *)(((uintptr_t)m->raw + al - 1) & ~(al - 1));
	madvise(m->arena, MLOAD_LEN / 2, MADV_HUGEPAGE);
	madvise(m->arena + MLOAD_LEN / 2, MLOAD_LEN / 2, MADV_NOHUGEPAGE);
	memset(m->arena, 0, MLOAD_LEN);
	for (int k = 0; k < MLOAD_WRITERS; k++) {
		mload_w[k] = (struct mload_writer){ m, k };
		if (pthread_create(&m->th[m->nthreads], NULL, mload_writer_main,
				   &mload_w[k]))
			return -EAGAIN;
		m->nthreads++;
	}
	if (pthread_create(&m->th[m->nthreads], NULL, mload_discard_main, m))
		return -EAGAIN;
	m->nthreads++;
	/* Every writer past its first pass: the arena is populated. */
	for (int i = 0; i < 5000; i++) {
		bool all = true;

		for (int k = 0; k < MLOAD_WRITERS; k++)
			all &= m->passes[k] > 0;
		if (all)
			break;
		usleep(1000);
	}
	return 0;
}

static inline void mload_stop(struct mload *m)
{
	m->stop = 1;
	for (int i = 0; i < m->nthreads; i++)
		pthread_join(m->th[i], NULL);
	munmap(m->raw, MLOAD_LEN + (2UL << 20));
}

/*
 * Is IMG (the arena's bytes at an instant) one instant of the load?  In
 * each writer's part the words not zero (a discard zeroes pages until the
 * writer's next pass) read v+1 up to the writer's position and v after
 * it: non-increasing, and within one.  Returns 0, or the offset + 1 of the
 * first word that breaks it (*WHY says how).
 */
static inline size_t mload_check(const char *img, const char **why)
{
	for (size_t k = 0; k < MLOAD_WRITERS; k++) {
		size_t off, len;
		uint64_t hi = 0, lo = 0;

		mload_part(k, &off, &len);
		for (size_t i = 0; i < len / 8; i++) {
			uint64_t v = ((const uint64_t *)(img + off))[i];

			if (!v)
				continue;
			if (!hi)
				hi = lo = v;
			if (v > lo) {
				*why = "a later word is newer";
				return off + i * 8 + 1;
			}
			lo = v;
			if (hi - lo > 1) {
				*why = "two passes apart";
				return off + i * 8 + 1;
			}
		}
	}
	return 0;
}

#endif
