// SPDX-License-Identifier: GPL-2.0
/*
 * ring-promise: one deterministic case per finding of issue #34, each
 * checking the write-log ring's promise on one path: a consumer that
 * harvests the ring (entries up to the producer, UFFDIO_RING_RESET, then
 * the contents; or, after an overflow, a discarding reset and a
 * PAGEMAP_SCAN round) never misses a change to a tracked page.
 *
 *  1 reset-race-refault-after-dontneed: threads race MADV_DONTNEED and
 *    refaults of a few pages against UFFDIO_RING_RESET; once everything
 *    is quiet and harvested, a write to each page must be logged.
 *  2 move-out-logged: UFFDIO_MOVE of a protected page out of the tracked
 *    range empties the source: an entry must name it, and the source's
 *    next write must be logged.
 *  3 hugetlb-private-dontneed-logged: MADV_DONTNEED of a protected private
 *    hugetlb page zeroes it: a huge entry must name it.
 *  4 shmem-punch-hole-logged, shmem-madv-remove-logged,
 *    hugetlbfs-punch-hole-logged: hole punching in tracked shared memory
 *    zeroes pages: an entry must name them, and their next write must be
 *    logged.
 *  5 close-with-ring-mapped-releases: close() of the userfaultfd with the
 *    ring still mapped, after UFFDIO_SET_MODE to sync, must release the
 *    context: a writer of a protected page completes within seconds.
 *  8 clear-overflow-only-the-one-seen: a reset with CLEAR_OVERFLOW and
 *    the overflow count read before the ring overflowed must fail with
 *    ESTALE and leave the flag set; the count rises once per overflow.
 *  9 copy-over-marker: UFFDIO_COPY over a protected (unpopulated, marked)
 *    page.  Without MODE_WP what happens is reported (logging it or
 *    documenting it as the monitor's own change were both allowed: the
 *    series documents it); with MODE_WP the page must stay protected and
 *    its next write be logged.
 *
 * Beyond the list, found by ring-stress on the fixed series:
 *  overflow-scan-finds-hugetlb-private-dontneed,
 *  overflow-scan-finds-shmem-punch-hole,
 *  overflow-scan-finds-hugetlbfs-punch-hole: a removal that leaves a
 *    uffd-wp marker must still be found by the overflow recovery (discarding
 *    reset + PAGEMAP_SCAN), whether it happened while the ring was full or
 *    its entry was discarded.
 *  overflow-scan-finds-hugetlb-dontneed-mremap: the same for private huge
 *    pages zapped and then moved by mremap() to where no page table is.
 *  private-file-cow-dontneed-logged: MADV_DONTNEED of a private file
 *    mapping's own copy of a page brings back the file's content: an entry
 *    must name it, and the page's next write after the harvest be logged.
 *  private-file-zeropage-dontneed-logged: the same for the zero page that
 *    UFFDIO_ZEROPAGE put there.
 *  scan-during-migration-keeps-protection(-hugetlb): the recovery's
 *    PAGEMAP_SCAN protecting pages under migration must leave them
 *    protected once the migration is done.
 *
 * Every case runs in a child process with a deadline, so none can hang the
 * plan; the child reports its verdict through shared memory.
 */
#define _GNU_SOURCE
#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MADV_REMOVE
#define MADV_REMOVE 9
#endif
#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif

static long psz;

/* A case's verdict, written by the child. */
enum { V_PASS, V_FAIL, V_SKIP };
struct verdict {
	int v;
	char why[900];
};
static struct verdict *vd;

static void say(int v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int v, const char *fmt, ...)
{
	va_list ap;

	vd->v = v;
	va_start(ap, fmt);
	vsnprintf(vd->why, sizeof(vd->why), fmt, ap);
	va_end(ap);
}

/* Run FN in a child; kill it after TMO seconds.  One TAP line. */
static void run_case(const char *name, void (*fn)(void), int tmo)
{
	long long end = now_ms() + tmo * 1000LL;
	int st = 0;
	pid_t pid, w = 0;

	vd->v = V_FAIL;
	snprintf(vd->why, sizeof(vd->why), "the case exited without a verdict");
	pid = fork();
	if (pid < 0) {
		tap_fail(name, "fork: %s", strerror(errno));
		return;
	}
	if (!pid) {
		alarm(tmo + 5);
		fn();
		_exit(0);
	}
	while (now_ms() < end && !(w = waitpid(pid, &st, WNOHANG)))
		usleep(20000);
	if (!w) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		tap_fail(name, "no verdict within %d s (child killed); last word: %s",
			 tmo, vd->why);
		return;
	}
	if (WIFSIGNALED(st)) {
		tap_fail(name, "child killed by signal %d; last word: %s",
			 WTERMSIG(st), vd->why);
		return;
	}
	if (vd->v == V_PASS)
		tap_pass(name);
	else if (vd->v == V_SKIP)
		tap_skip(name, "%s", vd->why);
	else
		tap_fail(name, "%s", vd->why);
	tap_diag("%s: %s", name, vd->why);
}

/* True if an entry in [from, producer) covers ADDR. */
static bool logged_since(const struct uring_view *r, uint64_t from, void *addr)
{
	unsigned long a = (unsigned long)addr;
	uint64_t prod = ring_producer(r);

	if (prod - from > r->hdr->entries)
		from = prod - r->hdr->entries;
	for (uint64_t i = from; i < prod; i++) {
		uint64_t e = ring_entry(r, i);
		unsigned long s = e & ~(uint64_t)(psz - 1);
		unsigned long len = e & UFFD_RING_ENTRY_HUGE ? HPAGE_SIZE : (unsigned long)psz;

		if (a >= s && a < s + len)
			return true;
	}
	return false;
}

/*
 * The consumer's harvest with nothing running: protect what was logged
 * (or, after an overflow, discard and rescan [P, P + LEN)).  0 or -errno.
 */
static int harvest_quiet(struct uring_view *r, void *p, size_t len)
{
	uint64_t prod = ring_producer(r);
	int err;

	if (ring_overflowed(r)) {
		err = ring_reset(r, prod, UFFDIO_RING_RESET_DISCARD |
				 UFFDIO_RING_RESET_CLEAR_OVERFLOW, NULL);
		if (!err && scan_written_reprotect(p, len, NULL, NULL) < 0)
			err = -EIO;
		return err;
	}
	return ring_reset(r, prod, 0, NULL);
}

static int open_ring(struct uring_view *r, uint64_t entries, uint64_t extra)
{
	int err = ring_open(r, entries, extra);

	if (err == -EINVAL || err == -ENOTTY || err == -EOPNOTSUPP) {
		say(V_SKIP, "no write-log ring with features %#llx: %s",
		    (unsigned long long)extra, strerror(-err));
		return err;
	}
	if (err)
		say(V_FAIL, "ring_open: %s", strerror(-err));
	return err;
}

static int track(struct uring_view *r, void *p, size_t len)
{
	int err = uffd_register(r->uffd, p, len, UFFDIO_REGISTER_MODE_WP, NULL);

	if (!err)
		err = uffd_wp(r->uffd, p, len, UFFDIO_WRITEPROTECT_MODE_WP);
	if (err)
		say(V_FAIL, "register/protect: %s", strerror(-err));
	return err;
}

/* ---- 1: reset race against MADV_DONTNEED and refaults ---- */

#define RACE_PAGES 8
static char *race_p;
static volatile int race_stop;

static void *race_dontneed(void *arg)
{
	unsigned int i = 0;

	(void)arg;
	while (!race_stop) {
		char *pg = race_p + (i++ % RACE_PAGES) * psz;

		pg[64] = (char)i;
		madvise(pg, psz, MADV_DONTNEED);
	}
	return NULL;
}

static void *race_rw(void *arg)
{
	unsigned int x = (unsigned int)(unsigned long)arg * 2654435761u + 1;
	volatile char sink;

	while (!race_stop) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		char *pg = race_p + (x % RACE_PAGES) * psz;

		if (x & 0x100)
			sink = pg[128];
		else
			pg[128 + (x >> 24) % 64] = (char)x;
	}
	(void)sink;
	return NULL;
}

static void case_reset_race(void)
{
	size_t len = RACE_PAGES * psz;
	long long deadline = now_ms() + 20000;
	struct uring_view r;
	int round;

	if (open_ring(&r, 1024, 0))
		return;
	race_p = map_anon_aligned(len, HPAGE_SIZE);
	if (!race_p) {
		say(V_FAIL, "mmap failed");
		return;
	}
	madvise(race_p, len, MADV_NOHUGEPAGE);
	memset(race_p, 1, len);
	if (track(&r, race_p, len))
		return;
	for (round = 1; now_ms() < deadline; round++) {
		pthread_t t[3];
		long long stop_at = now_ms() + 300;
		unsigned long resets = 0;
		int k, missed = 0, first = -1;

		race_stop = 0;
		pthread_create(&t[0], NULL, race_dontneed, NULL);
		pthread_create(&t[1], NULL, race_rw, (void *)1UL);
		pthread_create(&t[2], NULL, race_rw, (void *)2UL);
		while (now_ms() < stop_at) {
			if (harvest_quiet(&r, race_p, len) == 0)
				resets++;
		}
		race_stop = 1;
		for (k = 0; k < 3; k++)
			pthread_join(t[k], NULL);
		/* Quiet: harvest what the threads left, then write each page. */
		if (harvest_quiet(&r, race_p, len)) {
			say(V_FAIL, "quiet harvest failed");
			return;
		}
		for (k = 0; k < RACE_PAGES; k++) {
			uint64_t from = ring_producer(&r);
			bool wp = page_wp(race_p + k * psz);

			race_p[k * psz + 200] ^= 0x5a;
			if (!logged_since(&r, from, race_p + k * psz)) {
				missed++;
				if (first < 0)
					first = k;
				tap_diag("round %d: page %d was %sprotected after the quiet harvest; its write was not logged",
					 round, k, wp ? "" : "NOT ");
			}
			harvest_quiet(&r, race_p, len);
		}
		if (missed) {
			say(V_FAIL, "round %d (%lu resets raced): %d of %d pages had a write not logged after a quiet harvest (first: page %d)",
			    round, resets, missed, RACE_PAGES, first);
			return;
		}
	}
	say(V_PASS, "%d rounds of 300 ms, every quiet write logged", round - 1);
}

/* ---- 2: UFFDIO_MOVE out of the tracked range ---- */

static void case_move_out(void)
{
	size_t len = 4 * psz;
	struct uring_view r;
	char *p, *q;
	uint64_t from;
	bool src_logged, write_logged;
	int err;

	if (open_ring(&r, 64, UFFD_FEATURE_MOVE))
		return;
	p = map_anon_aligned(len, psz);
	q = map_anon_aligned(len, psz);
	if (!p || !q) {
		say(V_FAIL, "mmap failed");
		return;
	}
	madvise(p, len, MADV_NOHUGEPAGE);
	madvise(q, len, MADV_NOHUGEPAGE);
	memset(p, 0x33, len);
	if (track(&r, p, len))
		return;
	/* The destination must be registered with the same context. */
	err = uffd_register(r.uffd, q, len, UFFDIO_REGISTER_MODE_WP, NULL);
	if (err) {
		say(V_FAIL, "register the destination: %s", strerror(-err));
		return;
	}
	from = ring_producer(&r);
	err = uffd_move(r.uffd, q + psz, p + psz, psz, 0);
	if (err) {
		say(V_FAIL, "UFFDIO_MOVE: %s", strerror(-err));
		return;
	}
	src_logged = logged_since(&r, from, p + psz);
	harvest_quiet(&r, p, len);
	from = ring_producer(&r);
	p[psz + 7] = 0x44;
	write_logged = logged_since(&r, from, p + psz);
	if (src_logged && write_logged)
		say(V_PASS, "the move and the next write were logged");
	else
		say(V_FAIL, "source of UFFDIO_MOVE (now reads %d, was 0x33): move %slogged, next write %slogged (source page %sprotected)",
		    p[psz + 8], src_logged ? "" : "NOT ",
		    write_logged ? "" : "NOT ",
		    page_wp(p + psz) ? "" : "not ");
}

/* ---- 3: MADV_DONTNEED of a private hugetlb page ---- */

static bool hugetlb_reserved(void)
{
	FILE *f = fopen("/proc/sys/vm/nr_hugepages", "r");
	long n = 0;

	if (f) {
		if (fscanf(f, "%ld", &n) != 1)
			n = 0;
		fclose(f);
	}
	return n > 0;
}

/* LEN bytes of private hugetlb memory filled with FILL, or NULL (said). */
static char *map_private_huge(size_t len, int fill)
{
	char *p;

	if (!hugetlb_reserved()) {
		say(V_SKIP, "no huge pages reserved (/proc/sys/vm/nr_hugepages is 0)");
		return NULL;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	if (p == MAP_FAILED) {
		say(V_SKIP, "MAP_HUGETLB of %zu bytes: %s", len, strerror(errno));
		return NULL;
	}
	memset(p, fill, len);
	return p;
}

static void case_hugetlb_dontneed(void)
{
	struct uring_view r;
	uint64_t from;
	bool logged;
	char *p;

	p = map_private_huge(HPAGE_SIZE, 0x21);
	if (!p)
		return;
	if (open_ring(&r, 64, UFFD_FEATURE_WP_HUGETLBFS_SHMEM) ||
	    track(&r, p, HPAGE_SIZE))
		return;
	from = ring_producer(&r);
	if (madvise(p, HPAGE_SIZE, MADV_DONTNEED)) {
		say(V_FAIL, "MADV_DONTNEED: %s", strerror(errno));
		return;
	}
	logged = logged_since(&r, from, p + 4096);
	if (p[4096] == 0x21)
		say(V_PASS, "content kept (%s)", logged ? "logged" : "not logged");
	else if (logged)
		say(V_PASS, "the zap was logged (page now reads %d)", p[4096]);
	else
		say(V_FAIL, "the private hugetlb page now reads %d (was 0x21) and no entry names it",
		    p[4096]);
}

/* ---- 4: hole punching in tracked shmem and hugetlbfs ---- */

enum hole { HOLE_PUNCH, HOLE_REMOVE };

static void shared_hole(bool huge, enum hole how)
{
	size_t unit = huge ? HPAGE_SIZE : (size_t)psz;
	size_t len = 4 * unit;
	struct uring_view r;
	uint64_t from;
	bool logged, wlogged;
	char *p;
	int fd;

	if (huge && !hugetlb_reserved()) {
		say(V_SKIP, "no huge pages reserved (/proc/sys/vm/nr_hugepages is 0)");
		return;
	}
	fd = memfd_create("ring-promise", huge ? MFD_HUGETLB : 0);
	if (fd < 0 || ftruncate(fd, len)) {
		say(huge ? V_SKIP : V_FAIL, "memfd: %s", strerror(errno));
		return;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		say(V_FAIL, "mmap memfd: %s", strerror(errno));
		return;
	}
	memset(p, 0x5c, len);
	if (open_ring(&r, 64, UFFD_FEATURE_WP_HUGETLBFS_SHMEM) ||
	    track(&r, p, len))
		return;
	from = ring_producer(&r);
	if (how == HOLE_PUNCH) {
		if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      unit, unit)) {
			say(V_FAIL, "fallocate(PUNCH_HOLE): %s", strerror(errno));
			return;
		}
	} else if (madvise(p + unit, unit, MADV_REMOVE)) {
		say(V_FAIL, "MADV_REMOVE: %s", strerror(errno));
		return;
	}
	logged = logged_since(&r, from, p + unit);
	if (p[unit + 5] == 0x5c) {
		say(V_PASS, "content kept");
		return;
	}
	harvest_quiet(&r, p, len);
	from = ring_producer(&r);
	p[unit + 9] = 0x6d;
	wlogged = logged_since(&r, from, p + unit);
	if (logged && wlogged)
		say(V_PASS, "the hole and the next write were logged");
	else
		say(V_FAIL, "%s %s: page 1 now reads %d (was 0x5c); the hole was %slogged, the next write %slogged",
		    huge ? "hugetlbfs" : "shmem",
		    how == HOLE_PUNCH ? "fallocate(PUNCH_HOLE)" : "MADV_REMOVE",
		    p[unit + 5], logged ? "" : "NOT ", wlogged ? "" : "NOT ");
}

static void case_shmem_punch(void) { shared_hole(false, HOLE_PUNCH); }
static void case_shmem_remove(void) { shared_hole(false, HOLE_REMOVE); }
static void case_hugetlbfs_punch(void) { shared_hole(true, HOLE_PUNCH); }

/* ---- beyond #34: a private file mapping's own copy dropped ---- */

/*
 * A private mapping of a file (a memfd): the first write to a page makes a
 * private copy, which the ring logs.  MADV_DONTNEED drops that copy: the
 * page reads the file's content again, a change no write fault sees.  An
 * entry must name it, and after the harvest its next write must be logged
 * (found by the adversarial review of 2026-12-06).
 */
static void case_private_cow_dontneed(void)
{
	size_t len = 4 * psz;
	struct uring_view r;
	uint64_t from;
	bool logged, wlogged;
	volatile char sink;
	char *p;
	int fd;

	fd = memfd_create("ring-promise-cow", 0);
	if (fd < 0 || ftruncate(fd, len)) {
		say(V_FAIL, "memfd: %s", strerror(errno));
		return;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		say(V_FAIL, "mmap memfd: %s", strerror(errno));
		return;
	}
	memset(p, 0x11, len);
	munmap(p, len);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED) {
		say(V_FAIL, "mmap private: %s", strerror(errno));
		return;
	}
	for (size_t i = 0; i < len; i += psz)
		sink = p[i];	/* map the file's pages */
	(void)sink;
	if (open_ring(&r, 64, UFFD_FEATURE_WP_HUGETLBFS_SHMEM) ||
	    track(&r, p, len))
		return;
	p[psz + 3] = 0x22;	/* the private copy, logged */
	if (harvest_quiet(&r, p, len)) {
		say(V_FAIL, "harvest failed");
		return;
	}
	from = ring_producer(&r);
	if (madvise(p + psz, psz, MADV_DONTNEED)) {
		say(V_FAIL, "MADV_DONTNEED: %s", strerror(errno));
		return;
	}
	logged = logged_since(&r, from, p + psz);
	if (p[psz + 3] != 0x11) {
		say(V_FAIL, "after MADV_DONTNEED the page reads %#x, not the file's 0x11",
		    p[psz + 3]);
		return;
	}
	harvest_quiet(&r, p, len);
	from = ring_producer(&r);
	p[psz + 9] = 0x33;
	wlogged = logged_since(&r, from, p + psz);
	if (logged && wlogged)
		say(V_PASS, "the dropped copy and the next write were logged");
	else
		say(V_FAIL, "private file mapping: the dropped copy (0x22 -> 0x11) was %slogged, the next write %slogged",
		    logged ? "" : "NOT ", wlogged ? "" : "NOT ");
}

/*
 * The same with the zero page: UFFDIO_ZEROPAGE answers a missing fault of
 * a private file mapping with the zero page, which is that mapping's own
 * copy; the file is written through another mapping; MADV_DONTNEED of the
 * protected zero page brings the file's content back (review of
 * 2026-12-07).
 */
static volatile char zp_sink;

static void *zp_reader(void *arg)
{
	zp_sink = *(volatile char *)arg;
	return NULL;
}

static void case_private_zeropage_dontneed(void)
{
	size_t len = 4 * psz;
	struct uring_view r;
	struct uffd_msg m;
	pthread_t t;
	uint64_t from;
	char *p, *s;
	int fd, err;

	fd = memfd_create("ring-promise-zp", 0);
	if (fd < 0 || ftruncate(fd, len)) {
		say(V_FAIL, "memfd: %s", strerror(errno));
		return;
	}
	s = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	if (s == MAP_FAILED || p == MAP_FAILED) {
		say(V_FAIL, "mmap: %s", strerror(errno));
		return;
	}
	if (open_ring(&r, 64, UFFD_FEATURE_WP_HUGETLBFS_SHMEM))
		return;
	err = uffd_register(r.uffd, p, len, UFFDIO_REGISTER_MODE_MISSING |
			    UFFDIO_REGISTER_MODE_WP, NULL);
	if (err) {
		say(V_FAIL, "register MISSING|WP: %s", strerror(-err));
		return;
	}
	pthread_create(&t, NULL, zp_reader, p + psz);
	if (uffd_read_msg(r.uffd, &m, 5000) != 1 ||
	    m.event != UFFD_EVENT_PAGEFAULT) {
		say(V_FAIL, "no missing fault for the private page");
		return;
	}
	err = uffd_zeropage(r.uffd, p + psz, psz, 0);
	pthread_join(t, NULL);
	if (!err)
		err = uffd_wp(r.uffd, p + psz, psz, UFFDIO_WRITEPROTECT_MODE_WP);
	if (err) {
		say(V_FAIL, "UFFDIO_ZEROPAGE and protect: %s", strerror(-err));
		return;
	}
	s[psz + 5] = 0x44;	/* the file changes under the private zero page */
	if (p[psz + 5] != 0) {
		say(V_FAIL, "the private zero page reads %#x", p[psz + 5]);
		return;
	}
	harvest_quiet(&r, p, len);
	from = ring_producer(&r);
	if (madvise(p + psz, psz, MADV_DONTNEED)) {
		say(V_FAIL, "MADV_DONTNEED: %s", strerror(errno));
		return;
	}
	if (p[psz + 5] != 0x44) {
		say(V_FAIL, "after MADV_DONTNEED the page reads %#x, not the file's 0x44",
		    p[psz + 5]);
		return;
	}
	if (logged_since(&r, from, p + psz))
		say(V_PASS, "the dropped zero page (0 -> the file's 0x44) was logged");
	else
		say(V_FAIL, "private file mapping: the dropped zero page (0 -> the file's 0x44) was NOT logged");
}

/* ---- 5: close() with the ring mapped, context in sync mode ---- */

static void case_close_releases(void)
{
	struct uring_view r;
	struct writer w;
	char *p;
	int err;

	if (!set_mode_supported()) {
		say(V_SKIP, "no UFFDIO_SET_MODE in this kernel");
		return;
	}
	if (open_ring(&r, 64, 0))
		return;
	p = ring_track(&r, 1, true);
	if (!p) {
		say(V_FAIL, "ring_track failed");
		return;
	}
	err = uffd_set_async(r.uffd, false);
	if (err) {
		say(V_FAIL, "UFFDIO_SET_MODE(disable async): %s", strerror(-err));
		return;
	}
	/* The ring stays mapped: only the fd goes. */
	close(r.uffd);
	r.uffd = -1;
	say(V_FAIL, "writer started after close(), not finished yet");
	if (writer_start(&w, p, psz, 9)) {
		say(V_FAIL, "writer_start failed");
		return;
	}
	if (!writer_wait(&w, 5000)) {
		say(V_FAIL, "a writer of a protected page was still blocked 5 s after close() of the userfaultfd (ring mapped, sync mode): the context was not released");
		return;
	}
	say(V_PASS, "the writer completed after close()");
}

/* ---- 8: a clear covers only the overflow its caller saw ---- */

/*
 * A consumer looks at the header (no overflow), then the ring overflows,
 * then the consumer resets with CLEAR_OVERFLOW out of habit: the overflow
 * it never saw must stay flagged (-ESTALE), or the writes the kernel did
 * not log would be found by no scan.  The count then goes with the flag,
 * once per overflow.
 */
static void case_clear_stale_overflow(void)
{
	size_t npages = 128;
	struct uring_view r;
	uint64_t prod, seen;
	char *p;
	int err;

	if (open_ring(&r, 64, 0))
		return;
	p = map_anon_aligned(npages * psz, psz);
	if (!p) {
		say(V_FAIL, "mmap failed");
		return;
	}
	madvise(p, npages * psz, MADV_NOHUGEPAGE);
	memset(p, 1, npages * psz);
	if (track(&r, p, npages * psz))
		return;
	if (ring_overflowed(&r)) {
		say(V_FAIL, "overflow flag set before any write");
		return;
	}
	seen = r.overflows_seen;
	for (size_t i = 0; i < npages; i++)
		p[i * psz] = 2;
	prod = ring_producer(&r);
	err = ring_reset(&r, prod, UFFDIO_RING_RESET_CLEAR_OVERFLOW, NULL);
	if (err != -ESTALE) {
		say(V_FAIL, "a clear with the count read before the overflow (%llu) returned %s, not ESTALE",
		    (unsigned long long)seen, err ? strerror(-err) : "success");
		return;
	}
	if (!ring_overflowed(&r) || ring_consumer(&r) != prod) {
		say(V_FAIL, "after -ESTALE: overflow flag %s, consumer %llu (want set, %llu)",
		    ring_overflowed(&r) ? "set" : "CLEAR",
		    (unsigned long long)ring_consumer(&r),
		    (unsigned long long)prod);
		return;
	}
	if (r.overflows_seen != seen + 1) {
		say(V_FAIL, "overflow count %llu after one overflow from %llu",
		    (unsigned long long)r.overflows_seen,
		    (unsigned long long)seen);
		return;
	}
	/* The consumer's recovery with the count it has now seen. */
	err = ring_reset(&r, prod, UFFDIO_RING_RESET_CLEAR_OVERFLOW, NULL);
	if (err || ring_overflowed(&r)) {
		say(V_FAIL, "a clear with the count seen: %s, flag %s",
		    err ? strerror(-err) : "ok",
		    ring_overflowed(&r) ? "still set" : "clear");
		return;
	}
	if (scan_written_reprotect(p, npages * psz, NULL, NULL) < 0) {
		say(V_FAIL, "PAGEMAP_SCAN: %s", strerror(errno));
		return;
	}
	for (size_t i = 0; i < npages; i++)
		p[i * psz] = 3;
	if (!ring_overflowed(&r) || r.overflows_seen != seen + 2) {
		say(V_FAIL, "a second overflow: flag %s, count %llu (want set, %llu)",
		    ring_overflowed(&r) ? "set" : "clear",
		    (unsigned long long)r.overflows_seen,
		    (unsigned long long)(seen + 2));
		return;
	}
	say(V_PASS, "a stale clear kept the flag (ESTALE); the count went %llu -> %llu -> %llu",
	    (unsigned long long)seen, (unsigned long long)(seen + 1),
	    (unsigned long long)r.overflows_seen);
}

/* ---- 9: UFFDIO_COPY over a protected marker ---- */

/*
 * Item 9 let the kernel either log the monitor's own fills over a marker or
 * document them as the monitor's own change (docs/ring.md does, with patch
 * 44: without MODE_WP the page is left writable and the monitor records it
 * itself).  So the copy without MODE_WP is reported (a diagnostic line says
 * whether it was logged and whether the page stayed protected), and what
 * must hold either way is judged: the copy over the marker succeeds, and a
 * copy with MODE_WP leaves its page protected, so that its next write is
 * logged (the monitor's way to keep tracking a page it fills).
 */
static void case_copy_over_marker(void)
{
	size_t len = 4 * psz;
	struct uring_view r;
	bool logged, wp, wlogged, wp2, wlogged2;
	uint64_t from;
	char *p, *src;
	int err;

	if (open_ring(&r, 64, 0))
		return;
	p = ring_track(&r, 4, false);	/* unpopulated: markers only */
	src = malloc(psz);
	if (!p || !src) {
		say(V_FAIL, "ring_track/malloc failed");
		return;
	}
	memset(src, 0x77, psz);
	harvest_quiet(&r, p, len);

	/* Without MODE_WP: reported. */
	from = ring_producer(&r);
	err = uffd_copy(r.uffd, p + psz, src, psz, 0);
	if (err) {
		say(V_FAIL, "UFFDIO_COPY over the marker: %s", strerror(-err));
		return;
	}
	logged = logged_since(&r, from, p + psz);
	wp = page_wp(p + psz);
	harvest_quiet(&r, p, len);
	from = ring_producer(&r);
	p[psz + 3] = 0x11;
	wlogged = logged_since(&r, from, p + psz);
	tap_diag("copy-over-marker: UFFDIO_COPY without MODE_WP over a marker: copy %slogged, page %sprotected after it, next write %slogged",
		 logged ? "" : "not ", wp ? "" : "not ", wlogged ? "" : "not ");

	/* With MODE_WP: the page must stay tracked. */
	from = ring_producer(&r);
	err = uffd_copy(r.uffd, p + 2 * psz, src, psz,
			UFFDIO_COPY_MODE_WP);
	if (err) {
		say(V_FAIL, "UFFDIO_COPY(MODE_WP) over the marker: %s",
		    strerror(-err));
		return;
	}
	wp2 = page_wp(p + 2 * psz);
	harvest_quiet(&r, p, len);
	from = ring_producer(&r);
	p[2 * psz + 3] = 0x12;
	wlogged2 = logged_since(&r, from, p + 2 * psz);
	if (wp2 && wlogged2)
		say(V_PASS, "with MODE_WP the page stays tracked; without it: copy %slogged, page left %s, next write %slogged",
		    logged ? "" : "not ", wp ? "protected" : "writable",
		    wlogged ? "" : "not ");
	else
		say(V_FAIL, "UFFDIO_COPY(MODE_WP) over a marker left the page %s and its next write %slogged",
		    wp2 ? "protected" : "writable", wlogged2 ? "" : "NOT ");
}

/* ---- beyond #34: the overflow recovery must find removed content ---- */

/*
 * Found by ring-stress on the series with patches 39-45: the recovery after
 * an overflow (UFFDIO_RING_RESET with DISCARD | CLEAR_OVERFLOW, then a
 * PAGEMAP_SCAN round with PM_SCAN_WP_MATCHING) must report every page that
 * changed while the ring could not say so.  A removal that is logged but
 * leaves a uffd-wp marker behind (private hugetlb MADV_DONTNEED; shmem and
 * hugetlbfs hole punching where the marker stays) looks protected, not
 * written, to the scan: if its entry was never logged (the ring was full)
 * or was discarded by the recovery's own reset, the change is lost.  Both
 * orders are tried: the removal while the ring is overflowed, and the
 * removal logged and then discarded.
 */
enum removal { RM_HUGETLB_DONTNEED, RM_SHMEM_PUNCH, RM_HUGETLBFS_PUNCH };

struct seen {
	unsigned long lo, hi;
	bool hit;
};

static void seen_cb(unsigned long page, void *arg)
{
	struct seen *s = arg;

	if (page >= s->lo && page < s->hi)
		s->hit = true;
}

/* Write filler pages until the ring overflows; true if it did. */
static bool overflow_ring(struct uring_view *r, char *filler, int npages)
{
	for (int i = 0; i < npages && !ring_overflowed(r); i++)
		filler[i * psz] ^= 1;
	return ring_overflowed(r);
}

/* One order; returns NULL if the change was found, else what went wrong. */
static const char *removal_round(enum removal how, bool logged_first)
{
	static char why[300];
	bool huge = how != RM_SHMEM_PUNCH;
	size_t unit = huge ? HPAGE_SIZE : (size_t)psz, len = 2 * unit;
	struct uring_view r;
	struct seen sn;
	char *filler, *p;
	int fd = -1, err;
	long got;

	if (open_ring(&r, 64, UFFD_FEATURE_WP_HUGETLBFS_SHMEM))
		return vd->why;
	filler = ring_track(&r, 128, true);
	if (!filler)
		return "ring_track of the filler failed";
	if (how == RM_HUGETLB_DONTNEED) {
		p = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	} else {
		fd = memfd_create("ring-promise", huge ? MFD_HUGETLB : 0);
		if (fd < 0 || ftruncate(fd, len))
			return "memfd failed";
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	}
	if (p == MAP_FAILED)
		return "mmap failed";
	memset(p, 0x3c, len);
	if (track(&r, p, len))
		return vd->why;
	if (!logged_first && !overflow_ring(&r, filler, 128))
		return "the ring did not overflow";
	if (how == RM_HUGETLB_DONTNEED)
		err = madvise(p + unit, unit, MADV_DONTNEED) ? -errno : 0;
	else
		err = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				unit, unit) ? -errno : 0;
	if (err) {
		snprintf(why, sizeof(why), "the removal failed: %s",
			 strerror(-err));
		return why;
	}
	if (logged_first && !overflow_ring(&r, filler, 128))
		return "the ring did not overflow";
	/* The consumer's recovery: discard, clear, scan everything. */
	ring_overflowed(&r);
	err = ring_reset(&r, ring_producer(&r), UFFDIO_RING_RESET_DISCARD |
			 UFFDIO_RING_RESET_CLEAR_OVERFLOW, NULL);
	if (err) {
		snprintf(why, sizeof(why), "discarding reset: %s", strerror(-err));
		return why;
	}
	sn = (struct seen){ (unsigned long)p + unit, (unsigned long)p + len,
			    false };
	got = scan_written_reprotect(p, len, seen_cb, &sn);
	if (got < 0) {
		snprintf(why, sizeof(why), "PAGEMAP_SCAN: %s", strerror(-got));
		return why;
	}
	if (p[unit + 7] == 0x3c || sn.hit || logged_since(&r, r.consumer, p + unit))
		return NULL;
	snprintf(why, sizeof(why),
		 "%s: the removed %s now reads %d (was 0x3c) and neither the discarding reset's PAGEMAP_SCAN round nor an entry names it (pagemap %#llx)",
		 logged_first ? "removal logged, then the ring overflowed and the recovery discarded it"
			      : "removal while the ring was overflowed",
		 huge ? "huge page" : "page", p[unit + 7],
		 (unsigned long long)pagemap_entry(p + unit));
	return why;
}

static void overflow_removal(enum removal how)
{
	const char *a, *b;

	if (how != RM_SHMEM_PUNCH && !hugetlb_reserved()) {
		say(V_SKIP, "no huge pages reserved (/proc/sys/vm/nr_hugepages is 0)");
		return;
	}
	char first[300];

	a = removal_round(how, false);	/* a static buffer: keep a copy */
	if (a) {
		snprintf(first, sizeof(first), "%s", a);
		a = first;
	}
	b = removal_round(how, true);
	if (!a && !b)
		say(V_PASS, "the recovery scan found the removed page in both orders");
	else
		say(V_FAIL, "%s%s%s", a ? a : "", a && b ? "; " : "", b ? b : "");
}

static void case_ovf_hugetlb(void) { overflow_removal(RM_HUGETLB_DONTNEED); }
static void case_ovf_shmem(void) { overflow_removal(RM_SHMEM_PUNCH); }
static void case_ovf_hugetlbfs(void) { overflow_removal(RM_HUGETLBFS_PUNCH); }

/*
 * Found by the adversarial review of series patch 55: an empty hugetlb
 * entry of a ring context reads as written to PAGEMAP_SCAN only where a
 * page table holds the entry.  MADV_DONTNEED of protected private huge
 * pages logs them and leaves no marker; mremap() then moves the VMA (the
 * ring overflows, its entries name the old addresses) and allocates no
 * table at the destination for entries that are none.  The recovery's
 * scan of the new range found a hole there, reported nothing, and the
 * pages, zero now, were lost to the consumer.
 */
struct remap_arg {
	void *from, *to;
	size_t len;
	int err;
};

static void *remap_thread(void *arg)
{
	struct remap_arg *a = arg;

	if (mremap(a->from, a->len, a->len, MREMAP_MAYMOVE | MREMAP_FIXED,
		   a->to) == MAP_FAILED)
		a->err = -errno;
	return NULL;
}

static void case_ovf_hugetlb_mremap(void)
{
	size_t len = 2 * HPAGE_SIZE, gib = 1UL << 30;
	struct remap_arg ra = { .len = len };
	struct uring_view r;
	struct uffd_msg msg;
	struct seen sn;
	pthread_t th;
	char *p, *res, *to;
	long got;
	int err;

	p = map_private_huge(len, 0x3c);
	if (!p || open_ring(&r, 64, UFFD_FEATURE_EVENT_REMAP))
		return;
	if (track(&r, p, len))
		return;
	/* A destination alone in its own GiB: no page table there. */
	res = mmap(NULL, 2 * gib, PROT_NONE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (res == MAP_FAILED) {
		say(V_FAIL, "mmap of the reservation: %s", strerror(errno));
		return;
	}
	to = (char *)(((uintptr_t)res + gib - 1) & ~(uintptr_t)(gib - 1));
	munmap(res, 2 * gib);
	if (madvise(p, len, MADV_DONTNEED)) {
		say(V_FAIL, "MADV_DONTNEED: %s", strerror(errno));
		return;
	}
	/* mremap() waits for its UFFD_EVENT_REMAP to be read. */
	ra.from = p;
	ra.to = to;
	if (pthread_create(&th, NULL, remap_thread, &ra)) {
		say(V_FAIL, "pthread_create");
		return;
	}
	for (;;) {
		ssize_t n = read(r.uffd, &msg, sizeof(msg));

		if (n == sizeof(msg) && msg.event == UFFD_EVENT_REMAP)
			break;
		if (n < 0 && errno != EAGAIN && errno != EINTR) {
			say(V_FAIL, "read of the uffd: %s", strerror(errno));
			return;
		}
		usleep(1000);
	}
	pthread_join(th, NULL);
	if (ra.err) {
		say(V_FAIL, "mremap: %s", strerror(-ra.err));
		return;
	}
	if (!ring_overflowed(&r)) {
		say(V_FAIL, "mremap of a ring context's range did not set the overflow flag");
		return;
	}
	/* The consumer's recovery: discard, clear, scan everything. */
	err = ring_reset(&r, ring_producer(&r), UFFDIO_RING_RESET_DISCARD |
			 UFFDIO_RING_RESET_CLEAR_OVERFLOW, NULL);
	if (err) {
		say(V_FAIL, "discarding reset: %s", strerror(-err));
		return;
	}
	sn = (struct seen){ (unsigned long)to, (unsigned long)to + len, false };
	got = scan_written_reprotect(to, len, seen_cb, &sn);
	if (got < 0) {
		say(V_FAIL, "PAGEMAP_SCAN: %s", strerror(-got));
		return;
	}
	if (to[7] == 0x3c || sn.hit)
		say(V_PASS, "the recovery scan found the zapped huge pages at their new address");
	else
		say(V_FAIL, "the zapped huge pages moved by mremap() read %d (were 0x3c) and the recovery scan of their new range names neither (pagemap %#llx)",
		    to[7], (unsigned long long)pagemap_entry(to));
}

/* ---- beyond #34: PAGEMAP_SCAN's protection racing migration ---- */

/*
 * Found by ring-stress on the series with patches 39-45 (a hugetlb page
 * written without an entry after migrate, and page_table_check's warning
 * at mm/page_table_check.c:222 under PAGEMAP_SCAN): the overflow
 * recovery's PAGEMAP_SCAN with PM_SCAN_WP_MATCHING marks a *writable*
 * migration entry uffd-wp as it is (make_uffd_wp_pte(),
 * make_uffd_wp_huge_pte()), where change_protection() makes it readable
 * first; remove_migration_pte() then maps the page writable and drops the
 * uffd-wp bit, so the page's next writes are never logged.
 *
 * Here a thread migrates the pages between the two nodes while the main
 * thread unprotects them (writes) and protects them again with the
 * recovery's scan; after each round, with migration stopped, every page
 * must be protected again.
 */
#define MIG_PAGES 256
static char *mig_p;
static size_t mig_unit, mig_n;
static volatile int mig_stop, mig_paused, mig_idle;

static void *migrate_loop(void *arg)
{
	static void *pages[MIG_PAGES];
	static int nodes[MIG_PAGES], status[MIG_PAGES];
	int to = 1;

	(void)arg;
	for (size_t i = 0; i < mig_n; i++)
		pages[i] = mig_p + i * mig_unit;
	while (!mig_stop) {
		if (mig_paused) {
			mig_idle = 1;
			usleep(1000);
			continue;
		}
		mig_idle = 0;
		for (size_t i = 0; i < mig_n; i++)
			nodes[i] = to;
		sys_move_pages(mig_n, pages, nodes, status, MPOL_MF_MOVE);
		to ^= 1;
	}
	return NULL;
}

static void scan_vs_migration(bool huge)
{
	struct stat st;
	struct uring_view r;
	pthread_t t;
	long long deadline = now_ms() + 15000;
	size_t len, bad = 0, first = 0;
	long got;
	int round;

	if (stat("/sys/devices/system/node/node1", &st)) {
		say(V_SKIP, "one NUMA node: nothing to migrate to");
		return;
	}
	if (huge && !hugetlb_reserved()) {
		say(V_SKIP, "no huge pages reserved (/proc/sys/vm/nr_hugepages is 0)");
		return;
	}
	mig_unit = huge ? HPAGE_SIZE : (size_t)psz;
	mig_n = huge ? 4 : MIG_PAGES;
	len = mig_unit * mig_n;
	if (open_ring(&r, 64, UFFD_FEATURE_WP_HUGETLBFS_SHMEM))
		return;
	mig_p = huge ? mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0)
		     : map_anon_aligned(len, psz);
	if (!mig_p || mig_p == MAP_FAILED) {
		say(V_FAIL, "mmap failed");
		return;
	}
	if (!huge)
		madvise(mig_p, len, MADV_NOHUGEPAGE);
	memset(mig_p, 1, len);
	if (track(&r, mig_p, len))
		return;
	pthread_create(&t, NULL, migrate_loop, NULL);
	for (round = 1; now_ms() < deadline && !bad; round++) {
		/* Unprotect every page (async faults), then the recovery. */
		for (size_t i = 0; i < mig_n; i++)
			mig_p[i * mig_unit + 8] = (char)round;
		ring_overflowed(&r);
		ring_reset(&r, ring_producer(&r), UFFDIO_RING_RESET_DISCARD |
			   UFFDIO_RING_RESET_CLEAR_OVERFLOW, NULL);
		got = scan_written_reprotect(mig_p, len, NULL, NULL);
		if (got < 0) {
			mig_stop = 1;
			pthread_join(t, NULL);
			say(V_FAIL, "round %d: PAGEMAP_SCAN: %s", round,
			    strerror(-got));
			return;
		}
		/* Let migration finish, then look. */
		mig_idle = 0;
		mig_paused = 1;
		while (!mig_idle)
			usleep(1000);
		for (size_t i = 0; i < mig_n; i++)
			if (!page_wp(mig_p + i * mig_unit) && !bad++)
				first = i;
		mig_paused = 0;
	}
	mig_stop = 1;
	pthread_join(t, NULL);
	if (bad)
		say(V_FAIL, "round %d: %zu of %zu %s pages were writable (not uffd-wp) after PAGEMAP_SCAN(WP_MATCHING) protected them while they migrated (first: %zu, pagemap %#llx)",
		    round - 1, bad, mig_n, huge ? "hugetlb" : "4 KiB", first,
		    (unsigned long long)pagemap_entry(mig_p + first * mig_unit));
	else
		say(V_PASS, "%d rounds, every page protected after each", round - 1);
}

static void case_scan_migration(void) { scan_vs_migration(false); }
static void case_scan_migration_hugetlb(void) { scan_vs_migration(true); }

int main(void)
{
	static const struct {
		const char *name;
		void (*fn)(void);
		int tmo;
	} cases[] = {
		{ "reset-race-refault-after-dontneed", case_reset_race, 60 },
		{ "move-out-logged", case_move_out, 30 },
		{ "hugetlb-private-dontneed-logged", case_hugetlb_dontneed, 30 },
		{ "shmem-punch-hole-logged", case_shmem_punch, 30 },
		{ "shmem-madv-remove-logged", case_shmem_remove, 30 },
		{ "hugetlbfs-punch-hole-logged", case_hugetlbfs_punch, 30 },
		{ "close-with-ring-mapped-releases", case_close_releases, 20 },
		{ "copy-over-marker", case_copy_over_marker, 30 },
		{ "clear-overflow-only-the-one-seen", case_clear_stale_overflow, 30 },
		{ "overflow-scan-finds-hugetlb-private-dontneed", case_ovf_hugetlb, 30 },
		{ "overflow-scan-finds-shmem-punch-hole", case_ovf_shmem, 30 },
		{ "overflow-scan-finds-hugetlbfs-punch-hole", case_ovf_hugetlbfs, 30 },
		{ "overflow-scan-finds-hugetlb-dontneed-mremap", case_ovf_hugetlb_mremap, 30 },
		{ "private-file-cow-dontneed-logged", case_private_cow_dontneed, 30 },
		{ "private-file-zeropage-dontneed-logged", case_private_zeropage_dontneed, 30 },
		{ "scan-during-migration-keeps-protection", case_scan_migration, 40 },
		{ "scan-during-migration-keeps-protection-hugetlb", case_scan_migration_hugetlb, 40 },
	};
	unsigned int i, n = sizeof(cases) / sizeof(cases[0]);

	psz = page_size();
	vd = mmap(NULL, sizeof(*vd), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (vd == MAP_FAILED)
		return 1;
	tap_plan(n);
	if (!ring_supported()) {
		for (i = 0; i < n; i++)
			tap_skip(cases[i].name, "this kernel has no write-log ring");
		return tap_done();
	}
	for (i = 0; i < n; i++)
		run_case(cases[i].name, cases[i].fn, cases[i].tmo);
	return tap_done();
}
