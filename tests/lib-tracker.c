// SPDX-License-Identifier: GPL-2.0
/*
 * lib-tracker: libuffdwp's dirty tracker, every backend.
 *  - each available backend reports exactly the pages written since the
 *    last collect (populated and never-touched pages alike), in address
 *    order, nothing on a quiet round, and the rest on the next call when
 *    the caller's array is short; the backends agree with each other;
 *  - with a writer running during collects, every write is reported by a
 *    collect that returns after it (uffd and mprotect backends);
 *  - a round that overflows the ring's largest size still reports every
 *    written page once, and the ring serves the round after it, whether
 *    the kernel can discard the entries or protects them first;
 *  - AUTO picks uffdwp_backend_choose(); a forced backend the kernel lacks
 *    is -EOPNOTSUPP; soft-dirty is one per process (-EBUSY); bad input is
 *    -EINVAL.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffdwp.h"

#define PAGES 96

static long psz;
static char *area;		/* PAGES pages between two PROT_NONE guards */
static char got_sets[UFFDWP_BACKEND_COUNT][3][PAGES];
static bool ran[UFFDWP_BACKEND_COUNT];

static char *map_guarded(size_t pages)
{
	char *p = mmap(NULL, (pages + 2) * psz, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	/* Guards keep the region its own VMA (soft-dirty: no merging). */
	mprotect(p, psz, PROT_NONE);
	mprotect(p + (pages + 1) * psz, psz, PROT_NONE);
	madvise(p + psz, pages * psz, MADV_NOHUGEPAGE);
	return p + psz;
}

/* Collect everything in chunks of MAX into SET (one flag per page);
 * returns the count, or -errno / -1000 on order or range errors. */
static int collect_all(struct uffdwp_tracker *t, char *set, size_t max)
{
	void *pages[PAGES + 1];
	int total = 0;

	memset(set, 0, PAGES);
	for (;;) {
		ssize_t n = uffdwp_tracker_collect(t, pages, max);

		if (n < 0)
			return (int)n;
		for (ssize_t i = 0; i < n; i++) {
			long idx = ((char *)pages[i] - area) / psz;

			/* Ascending within a call; a later call (after a
			 * full one) may report a page again if written again. */
			if (idx < 0 || idx >= PAGES ||
			    (i && pages[i] <= pages[i - 1]))
				return -1000;
			total += !set[idx];
			set[idx] = 1;
		}
		if ((size_t)n < max)
			return total;
	}
}

static void write_set(const char *set, char val)
{
	for (int i = 0; i < PAGES; i++)
		if (set[i])
			area[i * psz + (i * 13) % psz] = val;
}

static void describe(char *out, size_t len, const char *set)
{
	size_t n = 0;

	out[0] = 0;
	for (int i = 0; i < PAGES && n + 8 < len; i++)
		if (set[i])
			n += (size_t)snprintf(out + n, len - n, "%d ", i);
}

static void t_backend(enum uffdwp_backend b)
{
	char name[64], want[3][PAGES], got[PAGES], why[640] = "";
	struct uffdwp_tracker *t = NULL;
	int err = uffdwp_backend_available(b), n, step;

	snprintf(name, sizeof(name), "tracker-%s", uffdwp_backend_name(b));
	if (err) {
		tap_skip(name, "backend %s unavailable on this kernel: %s",
			 uffdwp_backend_name(b), strerror(-err));
		return;
	}
	/* Pages 0..47 populated before tracking, 48.. never touched. */
	munmap(area, PAGES * psz);
	area = mmap(area, PAGES * psz, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	madvise(area, PAGES * psz, MADV_NOHUGEPAGE);
	memset(area, 1, PAGES / 2 * psz);
	memset(want, 0, sizeof(want));
	for (int i = 0; i < PAGES; i++) {
		want[0][i] = i % 3 == 0 || i == 50 || i == 51;	/* both halves */
		want[1][i] = i == 1 || i == 95;
		want[2][i] = 0;
	}
	struct uffdwp_region r = { area, PAGES * psz };

	err = uffdwp_tracker_new(&t, &r, 1, b);
	if (err) {
		tap_fail(name, "tracker_new: %s", strerror(-err));
		return;
	}
	if (uffdwp_tracker_backend(t) != b) {
		tap_fail(name, "tracker reports backend %s",
			 uffdwp_backend_name(uffdwp_tracker_backend(t)));
		uffdwp_tracker_free(t);
		return;
	}
	n = collect_all(t, got, PAGES);
	if (n != 0) {
		snprintf(why, sizeof(why), "first collect before any write: %d pages", n);
		goto out;
	}
	for (step = 0; step < 3; step++) {
		write_set(want[step], (char)(step + 2));
		/* Short arrays on the first round: the rest must follow. */
		n = collect_all(t, got, step == 0 ? 5 : PAGES);
		memcpy(got_sets[b][step], got, PAGES);
		if (n < 0 || memcmp(got, want[step], PAGES)) {
			char w[300], g[300];

			describe(w, sizeof(w), want[step]);
			describe(g, sizeof(g), got);
			snprintf(why, sizeof(why), "round %d (%d): want [%s] got [%s]",
				 step, n, w, g);
			goto out;
		}
	}
	/* The data written is all there. */
	for (int i = 0; i < PAGES; i++) {
		char v = want[1][i] ? 3 : want[0][i] ? 2 : i < PAGES / 2 ? 1 : 0;

		if (area[i * psz + (i * 13) % psz] != v) {
			snprintf(why, sizeof(why), "page %d holds %d, want %d",
				 i, area[i * psz + (i * 13) % psz], v);
			goto out;
		}
	}
	ran[b] = true;
out:
	uffdwp_tracker_free(t);
	tap_check(!why[0], name, "%s", why);
}

static void t_agree(void)
{
	int first = -1, nran = 0;
	bool ok = true;

	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++) {
		if (!ran[b])
			continue;
		nran++;
		if (first < 0)
			first = b;
		else
			ok &= !memcmp(got_sets[b], got_sets[first],
				      sizeof(got_sets[b]));
	}
	if (nran < 2) {
		tap_skip("tracker-backends-agree", "fewer than two backends ran here");
		return;
	}
	tap_check(ok, "tracker-backends-agree",
		  "backends report different page sets");
}

/* A writer stamps pages with increasing values while we collect; every
 * page whose stamp changed since we last read it must have been reported
 * by the collect before that read. */
struct stamper {
	pthread_t th;
	atomic_int stop;
	long rounds;
};

static void *stamp_main(void *arg)
{
	struct stamper *s = arg;
	unsigned int x = 12345;

	while (!atomic_load(&s->stop)) {
		x = x * 1103515245 + 12345;
		((volatile long *)(area + (x >> 8) % PAGES * psz))[0] = ++s->rounds;
	}
	return NULL;
}

static void t_concurrent(enum uffdwp_backend b)
{
	char name[64], why[256] = "", got[PAGES];
	long seen[PAGES];
	bool pend[PAGES] = { false };
	struct uffdwp_tracker *t = NULL;
	struct uffdwp_region r = { area, PAGES * psz };
	struct stamper s = { 0 };
	int err = uffdwp_backend_available(b);

	snprintf(name, sizeof(name), "tracker-concurrent-%s", uffdwp_backend_name(b));
	if (err) {
		tap_skip(name, "backend unavailable: %s", strerror(-err));
		return;
	}
	memset(area, 0, PAGES * psz);
	err = uffdwp_tracker_new(&t, &r, 1, b);
	if (err) {
		tap_fail(name, "tracker_new: %s", strerror(-err));
		return;
	}
	for (int i = 0; i < PAGES; i++)
		seen[i] = 0;
	pthread_create(&s.th, NULL, stamp_main, &s);
	for (int round = 0; round < 200 && !why[0]; round++) {
		int n = collect_all(t, got, PAGES);

		if (n < 0) {
			snprintf(why, sizeof(why), "collect: %d", n);
			break;
		}
		/* Read after collect.  A change since the last read that
		 * this collect did not report happened after it started:
		 * the next collect must report it. */
		for (int i = 0; i < PAGES && !why[0]; i++) {
			long v = ((volatile long *)(area + i * psz))[0];

			if (got[i]) {
				pend[i] = false;
			} else if (pend[i]) {
				snprintf(why, sizeof(why),
					 "round %d: page %d changed without being reported",
					 round, i);
			} else if (v != seen[i]) {
				pend[i] = true;
			}
			seen[i] = v;
		}
		usleep(1000);
	}
	atomic_store(&s.stop, 1);
	pthread_join(s.th, NULL);
	uffdwp_tracker_free(t);
	tap_check(!why[0] && s.rounds > 0, name, "%s (writer made %ld writes)", why,
		  s.rounds);
}

static void t_errors(void)
{
	struct uffdwp_region r = { area, PAGES * psz };
	struct uffdwp_region bad = { area + 1, psz };
	struct uffdwp_tracker *t = NULL, *t2 = NULL;
	void *pg[1];
	int e1 = uffdwp_tracker_new(&t, &r, 1, (enum uffdwp_backend)99);
	int e2 = uffdwp_tracker_new(NULL, &r, 1, UFFDWP_BACKEND_AUTO);
	int e3 = uffdwp_tracker_new(&t, &bad, 1, UFFDWP_BACKEND_AUTO);
	int e4 = uffdwp_tracker_new(&t, &r, 0, UFFDWP_BACKEND_AUTO);
	ssize_t e5 = uffdwp_tracker_collect(NULL, pg, 1);
	int err;

	tap_check(e1 == -EINVAL && e2 == -EINVAL && e3 == -EINVAL &&
		  e4 == -EINVAL && e5 == -EINVAL && !t, "tracker-bad-input",
		  "results %d %d %d %d %zd (want -EINVAL)", e1, e2, e3, e4, e5);

	err = uffdwp_tracker_new(&t, &r, 1, UFFDWP_BACKEND_AUTO);
	tap_check(!err && uffdwp_tracker_backend(t) == uffdwp_backend_choose() &&
		  uffdwp_tracker_collect(t, NULL, 1) == -EINVAL &&
		  uffdwp_tracker_collect(t, NULL, 0) == 0,
		  "tracker-auto", "err %d, backend %s, choice %s", err,
		  uffdwp_backend_name(uffdwp_tracker_backend(t)),
		  uffdwp_backend_name(uffdwp_backend_choose()));
	uffdwp_tracker_free(t);
	t = NULL;

	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++) {
		char name[64];

		snprintf(name, sizeof(name), "tracker-missing-%s", uffdwp_backend_name(b));
		if (b == UFFDWP_BACKEND_MPROTECT)
			continue;
		if (!uffdwp_backend_available(b)) {
			tap_skip(name, "this kernel has %s", uffdwp_backend_name(b));
			continue;
		}
		err = uffdwp_tracker_new(&t, &r, 1, b);
		tap_check(err == -EOPNOTSUPP && !t, name,
			  "forced %s on a kernel without it: %d, want -EOPNOTSUPP",
			  uffdwp_backend_name(b), err);
	}

	if (uffdwp_backend_available(UFFDWP_BACKEND_SOFT_DIRTY)) {
		tap_skip("tracker-soft-dirty-once", "no soft-dirty on this kernel");
		return;
	}
	char *other = map_guarded(4);
	struct uffdwp_region r2 = { other, 4 * psz };

	err = uffdwp_tracker_new(&t, &r, 1, UFFDWP_BACKEND_SOFT_DIRTY);
	int busy = uffdwp_tracker_new(&t2, &r2, 1, UFFDWP_BACKEND_SOFT_DIRTY);
	uffdwp_tracker_free(t);
	int again = uffdwp_tracker_new(&t2, &r2, 1, UFFDWP_BACKEND_SOFT_DIRTY);

	tap_check(!err && busy == -EBUSY && !again, "tracker-soft-dirty-once",
		  "first %d, second %d (want -EBUSY), after free %d", err, busy, again);
	uffdwp_tracker_free(t2);
}

/* The protection flags ("rwx") /proc/self/maps shows for ADDR, or "". */
static void maps_perms(void *addr, char out[4])
{
	FILE *f = fopen("/proc/self/maps", "re");
	unsigned long lo, hi, a = (unsigned long)addr;
	char line[512], perms[8];

	strcpy(out, "");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 &&
		    a >= lo && a < hi) {
			memcpy(out, perms, 3);
			out[3] = 0;
			break;
		}
	if (f)
		fclose(f);
}

/*
 * tracker-mprotect-keeps-protection: the mprotect backend takes only
 * PROT_WRITE away and gives each region back the protection it had (an
 * executable arena stays executable); a region mixing protections is
 * refused.
 */
static void t_mprotect_prot(void)
{
	const char *name = "tracker-mprotect-keeps-protection";
	char *x = mmap(NULL, 4 * psz, PROT_READ | PROT_WRITE | PROT_EXEC,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { x, 4 * psz }, half = { x, 4 * psz };
	struct uffdwp_tracker *t = NULL;
	char during[4] = "", after[4] = "", mixed_perms[4] = "";
	void *pg[4];
	ssize_t n = -1;
	int err, mixed;

	if (x == MAP_FAILED) {
		tap_fail(name, "mmap(PROT_EXEC): %s", strerror(errno));
		return;
	}
	err = uffdwp_tracker_new(&t, &r, 1, UFFDWP_BACKEND_MPROTECT);
	if (!err) {
		maps_perms(x, during);
		x[psz] = 1;
		n = uffdwp_tracker_collect(t, pg, 4);
		uffdwp_tracker_free(t);
	}
	maps_perms(x, after);
	mprotect(x + 2 * psz, 2 * psz, PROT_READ);
	t = NULL;
	mixed = uffdwp_tracker_new(&t, &half, 1, UFFDWP_BACKEND_MPROTECT);
	maps_perms(x, mixed_perms);
	tap_check(!err && !strcmp(during, "r-x") && n == 1 && pg[0] == x + psz &&
		  !strcmp(after, "rwx") && mixed == -EINVAL && !t &&
		  !strcmp(mixed_perms, "rwx"), name,
		  "new %d, protection while tracking %s (want r-x), collect %zd, after free %s (want rwx); mixed region: %d (want -EINVAL), left %s",
		  err, during, n, after, mixed, mixed_perms);
	if (t)
		uffdwp_tracker_free(t);
	munmap(x, 4 * psz);
}

/*
 * One round writes more pages than the library's largest ring (65536
 * entries) holds: the ring overflows, and collect falls back to one
 * PAGEMAP_SCAN round after a reset that discards the entries where the
 * kernel allows it.  Every written page is reported once and no other,
 * and the next round, served by the ring again, reports exactly the pages
 * written since, those written in the overflowed round included.
 */
#define BIG_PAGES	(65536 + 1024)

/* libuffdwp's test seam (lib/internal.h): behave as on a kernel without
 * UFFDIO_RING_RESET_DISCARD, whose overflowed reset protects the entries. */
extern bool uw_ring_no_discard;

static bool big_written(long i)
{
	return i % 1000 != 999;
}

static void t_ring_overflow(bool no_discard)
{
	const char *name = no_discard ? "tracker-ring-overflow-no-discard" :
					"tracker-ring-overflow";
	const long again[] = { 5, 999, BIG_PAGES - 1 };
	struct uffdwp_tracker *t = NULL;
	long expect = 0, bad = -1;
	void **pages = NULL;
	ssize_t n = -1, n2 = -1;
	char *p;
	int err = uffdwp_backend_available(UFFDWP_BACKEND_RING);

	if (err) {
		tap_skip(name, "backend ring unavailable on this kernel: %s",
			 strerror(-err));
		return;
	}
	p = map_guarded(BIG_PAGES);
	pages = malloc(BIG_PAGES * sizeof(*pages));
	if (!p || !pages)
		tap_bail("%s: no memory", name);
	memset(p, 1, BIG_PAGES * psz);
	struct uffdwp_region r = { p, BIG_PAGES * psz };

	uw_ring_no_discard = no_discard;
	err = uffdwp_tracker_new(&t, &r, 1, UFFDWP_BACKEND_RING);
	uw_ring_no_discard = false;
	if (err) {
		tap_fail(name, "tracker_new: %s", strerror(-err));
		goto out;
	}
	for (long i = 0; i < BIG_PAGES; i++)
		if (big_written(i)) {
			p[i * psz] = 2;
			expect++;
		}
	n = uffdwp_tracker_collect(t, pages, BIG_PAGES);
	for (long i = 0, k = 0; n == expect && i < BIG_PAGES && bad < 0; i++)
		if (big_written(i) && pages[k++] != p + i * psz)
			bad = i;
	for (size_t i = 0; i < sizeof(again) / sizeof(again[0]); i++)
		p[again[i] * psz] = 3;
	n2 = uffdwp_tracker_collect(t, pages, BIG_PAGES);
	tap_check(n == expect && bad < 0 && n2 == 3 &&
		  pages[0] == p + again[0] * psz &&
		  pages[1] == p + again[1] * psz &&
		  pages[2] == p + again[2] * psz, name,
		  "%ld pages written past a 65536-entry ring: collect %zd, first wrong page %ld; then 3 written: collect %zd",
		  expect, n, bad, n2);
	uffdwp_tracker_free(t);
out:
	free(pages);
	munmap(p - psz, (BIG_PAGES + 2) * psz);
}

int main(void)
{
	psz = sysconf(_SC_PAGESIZE);
	area = map_guarded(PAGES);
	if (!area)
		tap_bail("no memory");
	tap_plan(17);
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++)
		t_backend(b);
	t_agree();
	t_concurrent(UFFDWP_BACKEND_RING);
	t_concurrent(UFFDWP_BACKEND_PAGEMAP_SCAN);
	t_concurrent(UFFDWP_BACKEND_MPROTECT);
	t_ring_overflow(false);
	t_ring_overflow(true);
	t_errors();
	t_mprotect_prot();
	return tap_done();
}
