// SPDX-License-Identifier: GPL-2.0
/*
 * lib-tracker: libuffdwp's dirty tracker, every backend.
 *  - each available backend reports exactly the pages written since the
 *    last collect (populated and never-touched pages alike), in address
 *    order, nothing on a quiet round, and the rest on the next call when
 *    the caller's array is short; the backends agree with each other;
 *  - with a writer running during collects, every write is reported by a
 *    collect that returns after it (uffd and mprotect backends), also
 *    when collected as ranges three at a time;
 *  - uffdwp_tracker_collect_ranges(): adjacent pages coalesced, the same
 *    rounds as uffdwp_tracker_collect(), and the two mixed;
 *  - a round that overflows the ring's largest size still reports every
 *    written page once, and the ring serves the round after it, whether
 *    the kernel can discard the entries or protects them first;
 *  - AUTO picks uffdwp_backend_choose(); a forced backend the kernel lacks
 *    is -EOPNOTSUPP; soft-dirty is one per process (-EBUSY); bad input is
 *    -EINVAL;
 *  - discarded pages are reported by every backend, the same ones;
 *  - differential, every backend: writers (and a discarding thread) against
 *    a shadow kept from what collect reports (UFFDWP_SEED, UFFDWP_DIFF_MS);
 *  - mprotect: freeing trackers under running writers kills none; a
 *    read-only region is refused; faults not the tracker's go to the
 *    previous handler or kill; overlapping trackers are refused; AUTO does
 *    not switch backends when its own is busy.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"
#include "uffdwp.h"

#define PAGES 96

static long psz;
static char *area;		/* PAGES pages between two PROT_NONE guards */
static char got_sets[UFFDWP_BACKEND_COUNT][3][PAGES];
static bool ran[UFFDWP_BACKEND_COUNT];

/* uffd_util.h's clock, as this file counts time. */
static uint64_t clock_ms(void)
{
	return (uint64_t)now_ms();
}

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

/* collect_all() through uffdwp_tracker_collect_ranges(): every range
 * inside the area, ascending, not touching the one before it in the same
 * call (adjacent pages are one range). */
static int collect_all_ranges(struct uffdwp_tracker *t, char *set, size_t max)
{
	struct uffdwp_region r[PAGES + 1];
	int total = 0;

	memset(set, 0, PAGES);
	for (;;) {
		ssize_t n = uffdwp_tracker_collect_ranges(t, r, max);

		if (n < 0)
			return (int)n;
		for (ssize_t i = 0; i < n; i++) {
			long idx = ((char *)r[i].addr - area) / psz;
			long len = (long)(r[i].len / psz);

			if (idx < 0 || len <= 0 || idx + len > PAGES ||
			    r[i].len % psz || (i && (char *)r[i].addr <=
					       (char *)r[i - 1].addr + r[i - 1].len))
				return -1000;
			for (long k = idx; k < idx + len; k++) {
				total += !set[k];
				set[k] = 1;
			}
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

/* A tracker of backend B over the zeroed area for case NAME, or NULL with
 * the case reported (skipped: backend unavailable; failed: creation). */
static struct uffdwp_tracker *case_tracker(const char *name,
					   enum uffdwp_backend b)
{
	struct uffdwp_region r = { area, PAGES * psz };
	struct uffdwp_tracker *t = NULL;
	int err = uffdwp_backend_available(b);

	if (err) {
		tap_skip(name, "backend unavailable: %s", strerror(-err));
		return NULL;
	}
	memset(area, 0, PAGES * psz);
	err = uffdwp_tracker_new(&t, &r, 1, b);
	if (err) {
		tap_fail(name, "tracker_new: %s", strerror(-err));
		return NULL;
	}
	return t;
}

static void t_concurrent(enum uffdwp_backend b, bool ranges)
{
	char name[64], why[256] = "", got[PAGES];
	long seen[PAGES];
	bool pend[PAGES] = { false };
	struct uffdwp_tracker *t;
	struct stamper s = { 0 };

	snprintf(name, sizeof(name), "tracker-concurrent-%s%s",
		 ranges ? "ranges-" : "", uffdwp_backend_name(b));
	t = case_tracker(name, b);
	if (!t)
		return;
	for (int i = 0; i < PAGES; i++)
		seen[i] = 0;
	pthread_create(&s.th, NULL, stamp_main, &s);
	for (int round = 0; round < 200 && !why[0]; round++) {
		/* (ranges: in calls of 3, so that rounds span calls) */
		int n = ranges ? collect_all_ranges(t, got, 3) :
				 collect_all(t, got, PAGES);

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

/*
 * A round ends while writers run: draining in chunks of 4 with a writer
 * dirtying random pages all the time, a call must return fewer than 4
 * within a bounded number of calls (the man page's loop).  Before rounds,
 * every call gathered what was written since the last one and the loop
 * could go on for as long as the writer did.
 */
static void t_round_ends(enum uffdwp_backend b)
{
	char name[64], why[160] = "";
	struct uffdwp_tracker *t;
	struct stamper s = { 0 };
	long calls = 0;

	snprintf(name, sizeof(name), "tracker-round-ends-with-writers-%s",
		 uffdwp_backend_name(b));
	t = case_tracker(name, b);
	if (!t)
		return;
	pthread_create(&s.th, NULL, stamp_main, &s);
	/* The writer must be writing before the rounds start. */
	for (int i = 0; i < 2000 && s.rounds < 1000; i++)
		usleep(1000);
	for (int round = 0; round < 5 && !why[0]; round++) {
		void *pages[4];
		ssize_t n;
		long in_round = 0;

		/* Each chunk takes the caller a moment (sending the pages),
		 * in which the writer dirties more. */
		do {
			n = uffdwp_tracker_collect(t, pages, 4);
			calls++;
			in_round++;
			usleep(200);
		} while (n == 4 && in_round <= 4L * PAGES);
		if (n < 0)
			snprintf(why, sizeof(why), "round %d: collect: %s",
				 round, strerror((int)-n));
		else if (n == 4)
			snprintf(why, sizeof(why),
				 "round %d did not end in %ld calls of 4 pages (%d pages tracked)",
				 round, in_round, PAGES);
	}
	atomic_store(&s.stop, 1);
	pthread_join(s.th, NULL);
	uffdwp_tracker_free(t);
	tap_check(!why[0] && s.rounds > 0, name,
		  "%s (%ld calls for 5 rounds; the writer made %ld writes)",
		  why, calls, s.rounds);
}

/*
 * uffdwp_tracker_collect_ranges(): the pages written as runs, coalesced;
 * the rounds of uffdwp_tracker_collect() (a call returning MAX, the rest
 * in the next calls, a round that ended on MAX ends with 0); mixed with
 * uffdwp_tracker_collect() on one tracker.
 */
static void t_ranges(enum uffdwp_backend b)
{
	static const int runs[][2] = { { 0, 3 }, { 5, 1 }, { 7, 2 },
				       { 40, 8 }, { 95, 1 } };
	char name[64], why[200] = "";
	struct uffdwp_region r[8];
	struct uffdwp_tracker *t;
	void *pages[PAGES];
	ssize_t n, calls[4];

	snprintf(name, sizeof(name), "tracker-collect-ranges-%s",
		 uffdwp_backend_name(b));
	t = case_tracker(name, b);
	if (!t)
		return;
	for (int k = 0; k < 5; k++)
		for (int i = 0; i < runs[k][1]; i++)
			area[(runs[k][0] + i) * psz] = 1;
	n = uffdwp_tracker_collect_ranges(t, r, 8);
	if (n != 5)
		snprintf(why, sizeof(why), "first call: %zd ranges, want 5", n);
	for (int k = 0; !why[0] && k < 5; k++)
		if (r[k].addr != area + runs[k][0] * psz ||
		    r[k].len != (size_t)runs[k][1] * psz)
			snprintf(why, sizeof(why),
				 "range %d: page %ld, %zu pages; want %d, %d",
				 k, ((char *)r[k].addr - area) / psz,
				 r[k].len / psz, runs[k][0], runs[k][1]);
	n = uffdwp_tracker_collect_ranges(t, r, 8);
	if (!why[0] && n != 0)
		snprintf(why, sizeof(why), "nothing written: %zd ranges", n);
	/* Two at a time: 2, 2, 1; then 2, 2 (the round ends with 0 after
	 * a call that filled MAX exactly, here the fourth run left alone). */
	for (int k = 0; k < 5; k++)
		for (int i = 0; i < runs[k][1]; i++)
			area[(runs[k][0] + i) * psz] = 2;
	for (int c = 0; c < 3; c++)
		calls[c] = uffdwp_tracker_collect_ranges(t, r, 2);
	if (!why[0] && (calls[0] != 2 || calls[1] != 2 || calls[2] != 1))
		snprintf(why, sizeof(why), "in twos: %zd, %zd, %zd; want 2, 2, 1",
			 calls[0], calls[1], calls[2]);
	for (int k = 0; k < 4; k++)
		for (int i = 0; i < runs[k][1]; i++)
			area[(runs[k][0] + i) * psz] = 3;
	for (int c = 0; c < 3; c++)
		calls[c] = uffdwp_tracker_collect_ranges(t, r, 2);
	if (!why[0] && (calls[0] != 2 || calls[1] != 2 || calls[2] != 0))
		snprintf(why, sizeof(why),
			 "four runs in twos: %zd, %zd, %zd; want 2, 2, 0",
			 calls[0], calls[1], calls[2]);
	/* Mixed: one range, then the rest as pages. */
	for (int k = 0; k < 5; k++)
		for (int i = 0; i < runs[k][1]; i++)
			area[(runs[k][0] + i) * psz] = 4;
	calls[0] = uffdwp_tracker_collect_ranges(t, r, 1);
	calls[1] = uffdwp_tracker_collect(t, pages, PAGES);
	if (!why[0] && (calls[0] != 1 || calls[1] != 12 ||
			pages[0] != area + 5 * psz))
		snprintf(why, sizeof(why),
			 "mixed: %zd range then %zd pages (first %ld); want 1, then 12 from page 5",
			 calls[0], calls[1],
			 calls[1] > 0 ? ((char *)pages[0] - area) / psz : -1L);
	uffdwp_tracker_free(t);
	tap_check(!why[0], name, "%s", why);
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
 * The mprotect backend's collector and the program's own signals and
 * fork(), while a writer thread and a collecting thread run (review of
 * the claim/gather fix, issue 35):
 *  - tracker-mprotect-signal-on-collector: a handler of the program's,
 *    run on the collecting thread, writes tracked pages; collects go on
 *    (a claim in that handler once waited for the very gather it had
 *    interrupted, and every writer after it);
 *  - tracker-mprotect-fork-child-writes: children forked meanwhile write
 *    their copy of the tracked pages and exit (a child once inherited a
 *    gather's odd sequence and its first write spun for ever).
 */
#define MPS_PAGES	1024
static char *mps_mem;
static struct uffdwp_tracker *mps_t;
static volatile int mps_stop, mps_writer_done, mps_collector_done;
static atomic_long mps_collects;
static long mps_collect_err;

static void *mps_writer(void *arg)
{
	(void)arg;
	while (!mps_stop)
		for (size_t i = 0; i < MPS_PAGES && !mps_stop; i += 2)
			((volatile char *)mps_mem)[i * psz]++;
	__atomic_store_n(&mps_writer_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *mps_collector(void *arg)
{
	void **pg = malloc(MPS_PAGES * sizeof(*pg));

	(void)arg;
	while (!mps_stop && pg) {
		ssize_t n = uffdwp_tracker_collect(mps_t, pg, MPS_PAGES);

		if (n < 0 && !mps_collect_err)
			mps_collect_err = n;
		atomic_fetch_add(&mps_collects, 1);
	}
	free(pg);
	__atomic_store_n(&mps_collector_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void mps_on_usr1(int sig)
{
	(void)sig;
	/* odd pages: the writer leaves them alone */
	((volatile char *)mps_mem)[1 * psz]++;
	((volatile char *)mps_mem)[3 * psz]++;
}

static void t_mprotect_signals_fork(void)
{
	const char *n_sig = "tracker-mprotect-signal-on-collector";
	const char *n_fork = "tracker-mprotect-fork-child-writes";
	struct uffdwp_region r;
	struct sigaction sa = { .sa_handler = mps_on_usr1 }, old;
	pthread_t w, c;
	long before, killed = 0, forks = 0, stalls = 0;
	int err;

	mps_mem = map_guarded(MPS_PAGES);
	if (!mps_mem)
		tap_bail("no memory");
	memset(mps_mem, 1, MPS_PAGES * psz);
	r = (struct uffdwp_region){ mps_mem, MPS_PAGES * psz };
	err = uffdwp_tracker_new(&mps_t, &r, 1, UFFDWP_BACKEND_MPROTECT);
	if (err) {
		tap_fail(n_sig, "tracker_new: %s", strerror(-err));
		tap_fail(n_fork, "tracker_new: %s", strerror(-err));
		return;
	}
	sigaction(SIGUSR1, &sa, &old);
	mps_stop = mps_writer_done = mps_collector_done = 0;
	pthread_create(&w, NULL, mps_writer, NULL);
	pthread_create(&c, NULL, mps_collector, NULL);
	/* Signals to the collecting thread; it must keep collecting. */
	for (int round = 0; round < 10 && !stalls; round++) {
		before = atomic_load(&mps_collects);
		for (int i = 0; i < 300; i++) {
			pthread_kill(c, SIGUSR1);
			usleep(200);
		}
		for (int ms = 0; ms < 5000 &&
		     atomic_load(&mps_collects) == before; ms++)
			usleep(1000);
		stalls += atomic_load(&mps_collects) == before;
	}
	/* fork() while it collects: each child writes and exits. */
	for (; forks < 20 && !stalls && !killed; forks++) {
		pid_t pid = fork();
		int st;

		if (pid == 0) {
			/* 32 first writes: milliseconds, seconds under KASAN
			 * in TCG; a child that spins dies of the alarm. */
			alarm(60);
			for (size_t i = 1; i < 64; i += 2)
				((volatile char *)mps_mem)[i * psz] = 2;
			_exit(0);
		}
		if (pid < 0 || waitpid(pid, &st, 0) < 0)
			break;
		killed += !WIFEXITED(st) || WEXITSTATUS(st);
		usleep(1000);
	}
	mps_stop = 1;
	if (!joined_within(w, &mps_writer_done, 10000) ||
	    !joined_within(c, &mps_collector_done, 10000)) {
		/* Threads stuck in the handler: report, leave them. */
		tap_fail(n_sig, "threads did not stop within 10 s (a claim spinning?); %ld round(s) of signals stalled collects",
			 stalls);
		tap_fail(n_fork, "not checked: threads stuck (%ld children killed or failed)",
			 killed);
		return;
	}
	tap_check(!stalls && !mps_collect_err, n_sig,
		  "a round of 300 signals stalled the collects for 5 s: %ld; collect error %ld; %ld collects",
		  stalls, mps_collect_err, atomic_load(&mps_collects));
	tap_check(forks == 20 && !killed, n_fork,
		  "%ld children forked, %ld killed or failed (a child's first write spinning until alarm())%s",
		  forks, killed, stalls ? "; not run: collects stalled" : "");
	uffdwp_tracker_free(mps_t);
	sigaction(SIGUSR1, &old, NULL);
	munmap(mps_mem - psz, (MPS_PAGES + 2) * psz);
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

/*
 * tracker-ring-overflow-hugetlb: a private hugetlb page, tracked with a
 * region big enough to overflow the ring, is dropped by MADV_DONTNEED (its
 * content becomes zero; the kernel logs a huge entry and keeps the
 * page's uffd-wp marker), then the other region is written past the ring.
 * The overflow discards the entry and PAGEMAP_SCAN reports the hugetlb
 * page as protected and unchanged, so collect must report it by itself.
 */
static void t_ring_overflow_hugetlb(void)
{
	const char *name = "tracker-ring-overflow-hugetlb";
	const size_t hsz = 2u << 20;
	struct uffdwp_tracker *t = NULL;
	void **pages = NULL;
	ssize_t n = -1;
	long reported = 0;
	char *p = NULL, *h;
	int err = uffdwp_backend_available(UFFDWP_BACKEND_RING);

	if (err) {
		tap_skip(name, "backend ring unavailable on this kernel: %s",
			 strerror(-err));
		return;
	}
	h = mmap(NULL, hsz, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	if (h == MAP_FAILED) {
		tap_skip(name, "no 2 MiB hugetlb page to map: %s",
			 strerror(errno));
		return;
	}
	memset(h, 7, hsz);
	p = map_guarded(BIG_PAGES);
	pages = malloc((BIG_PAGES + hsz / psz) * sizeof(*pages));
	if (!p || !pages)
		tap_bail("%s: no memory", name);
	memset(p, 1, BIG_PAGES * psz);
	struct uffdwp_region r[2] = { { p, BIG_PAGES * psz }, { h, hsz } };

	err = uffdwp_tracker_new(&t, r, 2, UFFDWP_BACKEND_RING);
	if (err) {
		tap_fail(name, "tracker_new: %s", strerror(-err));
		goto out;
	}
	if (madvise(h, hsz, MADV_DONTNEED))
		tap_bail("%s: madvise: %s", name, strerror(errno));
	for (long i = 0; i < BIG_PAGES; i++)
		p[i * psz] = 2;
	n = uffdwp_tracker_collect(t, pages, BIG_PAGES + hsz / psz);
	for (ssize_t i = 0; i < n; i++)
		reported += (char *)pages[i] >= h && (char *)pages[i] < h + hsz;
	tap_check(n >= BIG_PAGES && reported == (long)(hsz / psz) && h[0] == 0,
		  name,
		  "hugetlb page dropped, then %d pages written past the ring: collect %zd, %ld of the hugetlb page's %zu pages reported (it reads %d)",
		  BIG_PAGES, n, reported, hsz / psz, h[0]);
	uffdwp_tracker_free(t);
out:
	free(pages);
	munmap(p - psz, (BIG_PAGES + 2) * psz);
	munmap(h, hsz);
}

/*
 * tracker-differential-<backend>[-discard]: writer threads write random
 * values to random pages (now and then a run of pages) for a bounded time
 * while this thread collects again and again and copies every page
 * reported into a shadow; with DISCARD, another thread discards random
 * pages (MADV_DONTNEED) and reads some back (the shared zero page), among
 * them the last quarter, which the writers leave alone.  The run is cut
 * into epochs of a few milliseconds: at the end of each, the writers park,
 * a last collect brings the shadow up to date, and the shadow must equal
 * the memory (so a write lost in one epoch is not hidden by a later write
 * to the same page).  Seed from UFFDWP_SEED (printed); duration
 * UFFDWP_DIFF_MS per case (default 400).
 */
#define DIFF_PAGES	1024
#define DIFF_WRITERS	3

static unsigned long long seed;
static long diff_ms = 400;

static bool discard_read_visible(void);

struct diff_thread {
	pthread_t th;
	struct diff *d;
	unsigned long long rng;
	long writes, discards;
};

struct diff {
	char *mem;
	atomic_int stop, park, parked;
	bool discard, read_back;
	struct diff_thread w[DIFF_WRITERS + 1];	/* the last one discards */
};

static unsigned long long rnd(unsigned long long *x)
{
	/* xorshift64* */
	*x ^= *x >> 12;
	*x ^= *x << 25;
	*x ^= *x >> 27;
	return *x * 2685821657736338717ULL;
}

static void *diff_writer(void *arg)
{
	struct diff_thread *w = arg;
	struct diff *d = w->d;
	bool discarder = w == &d->w[DIFF_WRITERS];

	while (!atomic_load(&d->stop)) {
		unsigned long long r = rnd(&w->rng);
		long pg = (long)(r % (discarder ? DIFF_PAGES : DIFF_PAGES * 3 / 4));
		long run = (r >> 20) % 16 == 0 ? 1 + (long)((r >> 24) % 8) : 1;

		if (atomic_load(&d->park)) {
			atomic_fetch_add(&d->parked, 1);
			while (atomic_load(&d->park) && !atomic_load(&d->stop))
				usleep(50);
			atomic_fetch_sub(&d->parked, 1);
			continue;
		}
		if (discarder) {
			madvise(d->mem + pg * psz, psz, MADV_DONTNEED);
			if (d->read_back && (r >> 40) & 1)
				(void)((volatile char *)d->mem)[pg * psz];
			w->discards++;
			usleep(20);
			continue;
		}
		for (long k = 0; k < run && pg + k < DIFF_PAGES; k++) {
			size_t off = (size_t)(rnd(&w->rng) % (psz / 8)) * 8;

			atomic_store_explicit((_Atomic unsigned long long *)
					      (d->mem + (pg + k) * psz + off),
					      rnd(&w->rng), memory_order_relaxed);
			w->writes++;
		}
	}
	return NULL;
}

/* Collect until the array is not full, copying what is reported into
 * SHADOW; the count of pages, or -errno, or -1000 for a page outside. */
static long diff_collect(struct uffdwp_tracker *t, struct diff *d,
			 char *shadow, void **pages)
{
	long total = 0;

	for (;;) {
		ssize_t n = uffdwp_tracker_collect(t, pages, DIFF_PAGES);

		if (n < 0)
			return (long)n;
		for (ssize_t i = 0; i < n; i++) {
			long idx = ((char *)pages[i] - d->mem) / psz;

			if (idx < 0 || idx >= DIFF_PAGES)
				return -1000;
			memcpy(shadow + idx * psz, d->mem + idx * psz, psz);
		}
		total += n;
		if (n < DIFF_PAGES)
			return total;
	}
}

static void t_differential(enum uffdwp_backend b, bool discard)
{
	char name[80], why[256] = "";
	struct uffdwp_tracker *t = NULL;
	struct diff d = { .discard = discard };
	char *shadow = NULL;
	void **pages = NULL;
	long rounds = 0, epochs = 0, reported = 0, writes = 0, discards = 0;
	int err = uffdwp_backend_available(b), nthreads = DIFF_WRITERS + discard;
	unsigned long long rng = seed ^ ((unsigned long long)b << 32 | discard);

	snprintf(name, sizeof(name), "tracker-differential-%s%s",
		 uffdwp_backend_name(b), discard ? "-discard" : "");
	if (err) {
		tap_skip(name, "backend %s unavailable on this kernel: %s",
			 uffdwp_backend_name(b), strerror(-err));
		return;
	}
	/* See discard_read_visible(): the exception documented. */
	d.read_back = discard_read_visible() || (b != UFFDWP_BACKEND_SOFT_DIRTY &&
						b != UFFDWP_BACKEND_MPROTECT);
	if (discard && !d.read_back)
		tap_diag("%s: discarded pages not read back: this kernel maps no shared zero page (documented)",
			 name);
	d.mem = map_guarded(DIFF_PAGES);
	shadow = malloc(DIFF_PAGES * psz);
	pages = malloc(DIFF_PAGES * sizeof(*pages));
	if (!d.mem || !shadow || !pages)
		tap_bail("%s: no memory", name);
	/* Three pages in four populated with data, the fourth never touched. */
	for (long i = 0; i < DIFF_PAGES; i++)
		if (i % 4 != 3)
			memset(d.mem + i * psz, (int)(i | 1), psz);
	memcpy(shadow, d.mem, DIFF_PAGES * psz);
	struct uffdwp_region r = { d.mem, DIFF_PAGES * psz };

	err = uffdwp_tracker_new(&t, &r, 1, b);
	if (err) {
		tap_fail(name, "tracker_new: %s", strerror(-err));
		goto out;
	}
	for (int i = 0; i < nthreads; i++) {
		d.w[i].d = &d;
		d.w[i].rng = rnd(&rng) | 1;
		pthread_create(&d.w[i].th, NULL, diff_writer, &d.w[i]);
	}
	/* At least the time asked for, and 12 collects unless that takes
	 * fifty times as long (a slow guest: the debug lane's KASAN kernel
	 * managed 2 mprotect collects in four times the time). */
	uint64_t start = clock_ms(), end = start + (uint64_t)diff_ms,
		 cap = start + 50 * (uint64_t)diff_ms;

	while (!why[0] && (clock_ms() < end || (rounds < 12 && clock_ms() < cap))) {
		/* An epoch: collects while the writers run... */
		int k = 1 + (int)(rnd(&rng) % 6);
		long n = 0;

		for (int i = 0; i < k && n >= 0; i++) {
			n = diff_collect(t, &d, shadow, pages);
			rounds++;
			reported += n > 0 ? n : 0;
			if (rnd(&rng) % 2)
				usleep((useconds_t)(rnd(&rng) % 2000));
		}
		/* ...then the writers park, a last collect, and a check. */
		atomic_store(&d.park, 1);
		while (atomic_load(&d.parked) < nthreads)
			usleep(50);
		if (n >= 0)
			n = diff_collect(t, &d, shadow, pages);
		epochs++;
		if (n < 0) {
			snprintf(why, sizeof(why), "collect: %s",
				 n == -1000 ? "a page outside the region" :
				 strerror((int)-n));
		} else {
			long stale = 0, first = -1;

			for (long i = 0; i < DIFF_PAGES; i++)
				if (memcmp(shadow + i * psz, d.mem + i * psz, psz)) {
					stale++;
					if (first < 0)
						first = i;
				}
			if (stale)
				snprintf(why, sizeof(why),
					 "epoch %ld: %ld of %d pages stale in the shadow (first: page %ld)",
					 epochs, stale, DIFF_PAGES, first);
		}
		atomic_store(&d.park, 0);
	}
	atomic_store(&d.stop, 1);
	for (int i = 0; i < nthreads; i++) {
		pthread_join(d.w[i].th, NULL);
		writes += d.w[i].writes;
		discards += d.w[i].discards;
	}
	if (!why[0] && (writes == 0 || rounds < 3))
		snprintf(why, sizeof(why), "no test: %ld writes, %ld collects",
			 writes, rounds);
	if (!why[0])
		tap_diag("%s: %ld writes, %ld discards, %ld collects in %ld epochs reporting %ld pages",
			 name, writes, discards, rounds, epochs, reported);
out:
	uffdwp_tracker_free(t);
	tap_check(!why[0], name,
		  "%s; seed %llu (UFFDWP_SEED), %ld ms, %ld writes, %ld discards, %ld collects in %ld epochs reporting %ld pages",
		  why, seed, diff_ms, writes, discards, rounds, epochs, reported);
	if (d.mem)
		munmap(d.mem - psz, (DIFF_PAGES + 2) * psz);
	free(shadow);
	free(pages);
}

/*
 * tracker-discard-<backend>: pages the program discards (MADV_DONTNEED)
 * read as zeroes afterwards; every backend reports them, whether they are
 * left alone or read again (the shared zero page) before the collect, and
 * all backends report the same pages.
 */
/*
 * The pagemap backends (mprotect, soft-dirty) can tell that a discarded
 * page was read again (before the next collect) only if the read mapped
 * the shared zero page (not exclusive); some kernels give the read a page
 * of its own instead (the page frame, where pagemap shows it, is often
 * the one just freed).  Which holds here?
 */
static bool discard_read_visible(void)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	char *m = mmap(NULL, 2 * psz, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t e[2] = { 0, 0 };

	if (fd < 0 || m == MAP_FAILED)
		tap_bail("pagemap: %s", strerror(errno));
	m[0] = 1;
	(void)((volatile char *)m)[psz];
	if (pread(fd, e, 16, (off_t)((uintptr_t)m / psz * 8)) != 16)
		tap_bail("pagemap: %s", strerror(errno));
	close(fd);
	munmap(m, 2 * psz);
	return (e[0] & (1ULL << 56)) && !(e[1] & (1ULL << 56));
}

static char discard_sets[UFFDWP_BACKEND_COUNT][PAGES];
static bool discard_ran[UFFDWP_BACKEND_COUNT];

static void t_discard(enum uffdwp_backend b)
{
	char name[64], why[640] = "", got[PAGES], want[PAGES] = { 0 };
	struct uffdwp_tracker *t = NULL;
	struct uffdwp_region r = { area, PAGES * psz };
	int err = uffdwp_backend_available(b), n;

	snprintf(name, sizeof(name), "tracker-discard-%s", uffdwp_backend_name(b));
	if (err) {
		tap_skip(name, "backend %s unavailable on this kernel: %s",
			 uffdwp_backend_name(b), strerror(-err));
		return;
	}
	munmap(area, PAGES * psz);
	area = mmap(area, PAGES * psz, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	madvise(area, PAGES * psz, MADV_NOHUGEPAGE);
	memset(area, 7, PAGES / 2 * psz);	/* 48.. never touched */
	err = uffdwp_tracker_new(&t, &r, 1, b);
	if (err) {
		tap_fail(name, "tracker_new: %s", strerror(-err));
		return;
	}
	/* Written after start: reported, then discarded. */
	area[10 * psz] = 8;
	area[60 * psz] = 8;
	n = collect_all(t, got, PAGES);
	if (n != 2 || !got[10] || !got[60]) {
		snprintf(why, sizeof(why), "first round: %d pages, want 10 and 60", n);
		goto out;
	}
	/* Discarded: 3 and 10 left alone, 4 and 60 read back; 50 (never
	 * touched) discarded and 51 (never touched) read: nothing changes. */
	const int gone[] = { 3, 4, 10, 60, 50 };

	for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
		madvise(area + gone[i] * psz, psz, MADV_DONTNEED);
	(void)((volatile char *)area)[4 * psz];
	(void)((volatile char *)area)[60 * psz];
	(void)((volatile char *)area)[51 * psz];
	want[3] = want[4] = want[10] = want[60] = 1;
	n = collect_all(t, got, PAGES);
	/* 50: zero before and after; reporting it is allowed.  4 and 60:
	 * see discard_read_visible(). */
	got[50] = 0;
	if (!discard_read_visible() && (b == UFFDWP_BACKEND_SOFT_DIRTY ||
					b == UFFDWP_BACKEND_MPROTECT)) {
		if (!got[4] || !got[60])
			tap_diag("%s: discarded pages read again not reported: this kernel maps no shared zero page (documented)",
				 name);
		got[4] = got[60] = 1;
	}
	memcpy(discard_sets[b], got, PAGES);
	if (n < 0 || memcmp(got, want, PAGES)) {
		char w[300], g[300];

		describe(w, sizeof(w), want);
		describe(g, sizeof(g), got);
		snprintf(why, sizeof(why), "after discards (%d): want [%s] got [%s]",
			 n, w, g);
		goto out;
	}
	n = collect_all(t, got, PAGES);
	if (n != 0)
		snprintf(why, sizeof(why), "quiet round after discards: %d pages", n);
	else
		discard_ran[b] = true;
out:
	uffdwp_tracker_free(t);
	tap_check(!why[0], name, "%s", why);
}

static void t_discard_agree(void)
{
	int first = -1, nran = 0;
	bool ok = true;

	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++) {
		if (!discard_ran[b])
			continue;
		nran++;
		if (first < 0)
			first = b;
		else
			ok &= !memcmp(discard_sets[b], discard_sets[first], PAGES);
	}
	if (nran < 2) {
		tap_skip("tracker-discard-backends-agree",
			 "fewer than two backends passed tracker-discard here");
		return;
	}
	tap_check(ok, "tracker-discard-backends-agree",
		  "backends report different discarded pages");
}

/* Run FN in a child with a watchdog of SECS: its exit status or signal,
 * as "exit N" / "signal N" in OUT; true if it exited 0. */
static bool in_child(void (*fn)(void), unsigned int secs, char *out, size_t len)
{
	int status;
	pid_t pid = fork();

	if (pid < 0) {
		snprintf(out, len, "fork: %s", strerror(errno));
		return false;
	}
	if (pid == 0) {
		alarm(secs);
		fn();
		_exit(0);
	}
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(status))
		snprintf(out, len, "killed by signal %d (%s)", WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
	else
		snprintf(out, len, "exit %d", WEXITSTATUS(status));
	return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int child_signal(const char *res)
{
	int sig = -1;

	sscanf(res, "killed by signal %d", &sig);
	return sig;
}

/*
 * tracker-mprotect-free-while-writing: trackers made and freed again and
 * again while writers keep writing the memory (allowed: "writers may
 * run"); no writer may die.  In a child, with a watchdog.
 */
static atomic_int fw_stop;
static char *fw_mem;

static void *fw_writer(void *arg)
{
	unsigned long long x = (unsigned long long)(uintptr_t)arg | 1;

	while (!atomic_load_explicit(&fw_stop, memory_order_relaxed))
		((volatile char *)fw_mem)[rnd(&x) % (64 * psz)]++;
	return NULL;
}

static void fw_child(void)
{
	pthread_t th[3];
	struct uffdwp_region r;
	void *pg[64];

	fw_mem = map_guarded(64);
	r = (struct uffdwp_region){ fw_mem, 64 * psz };
	for (int i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, fw_writer, (void *)(uintptr_t)(i + 1));
	uint64_t end = clock_ms() + 1000;

	for (int i = 0; i < 5000 && clock_ms() < end; i++) {
		struct uffdwp_tracker *t = NULL;

		if (uffdwp_tracker_new(&t, &r, 1, UFFDWP_BACKEND_MPROTECT))
			_exit(3);
		for (int k = 0; k < 1000; k++)
			__asm__ volatile("" ::: "memory");
		if (uffdwp_tracker_collect(t, pg, 64) < 0)
			_exit(4);
		uffdwp_tracker_free(t);
	}
	atomic_store(&fw_stop, 1);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
}

static void t_free_while_writing(void)
{
	char res[128];
	bool ok = in_child(fw_child, 30, res, sizeof(res));

	tap_check(ok, "tracker-mprotect-free-while-writing",
		  "trackers made and freed for 1 s under 3 writers: child %s", res);
}

/*
 * tracker-mprotect-not-ours: the mprotect backend refuses a region it
 * cannot make writable (read-only: -EINVAL) instead of accepting it and
 * then spinning on a stray write; a write the tracker is not responsible
 * for goes to the SIGSEGV handler that was there before, or, with none,
 * kills the process as without the library; a fault that making the page
 * writable does not cure (a jump into a tracked page) does not loop.
 */
static char *no_mem;
static atomic_int prev_calls;

static void prev_handler(int sig, siginfo_t *si, void *uc)
{
	char *page = (char *)((uintptr_t)si->si_addr & ~(uintptr_t)(psz - 1));

	(void)sig;
	(void)uc;
	if (page == no_mem + 5 * psz)
		atomic_fetch_add(&prev_calls, 1);
	else
		atomic_fetch_add(&prev_calls, 1000);	/* not its fault */
	mprotect(page, psz, PROT_READ | PROT_WRITE);
}

static void ro_write_child(void)
{
	struct uffdwp_region r = { no_mem, 4 * psz };
	struct uffdwp_tracker *t = NULL;

	if (uffdwp_tracker_new(&t, &r, 1, UFFDWP_BACKEND_MPROTECT))
		_exit(3);
	no_mem[0] = 1;				/* tracked */
	mprotect(no_mem + 5 * psz, psz, PROT_READ);
	((volatile char *)no_mem)[5 * psz] = 1;	/* not: must die here */
	_exit(5);
}

static void exec_child(void)
{
	struct uffdwp_region r = { no_mem, 4 * psz };
	struct uffdwp_tracker *t = NULL;

	if (uffdwp_tracker_new(&t, &r, 1, UFFDWP_BACKEND_MPROTECT))
		_exit(3);
	no_mem[psz] = (char)0xc3;	/* x86 ret; anything will do */
	((void (*)(void))(no_mem + psz))();	/* not executable: dies */
	_exit(5);
}

static void prev_child(void)
{
	struct uffdwp_region rw = { no_mem, 4 * psz };
	struct uffdwp_tracker *t = NULL;
	struct sigaction sa;
	void *pg[4] = { NULL };

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = prev_handler;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGSEGV, &sa, NULL);
	if (uffdwp_tracker_new(&t, &rw, 1, UFFDWP_BACKEND_MPROTECT))
		_exit(6);
	mprotect(no_mem + 5 * psz, psz, PROT_READ);
	((volatile char *)no_mem)[5 * psz] = 9;
	no_mem[2 * psz] = 9;
	if (atomic_load(&prev_calls) != 1 || no_mem[5 * psz] != 9)
		_exit(7);
	if (uffdwp_tracker_collect(t, pg, 4) != 1 || pg[0] != no_mem + 2 * psz)
		_exit(8);
	uffdwp_tracker_free(t);
}

static void kill_child(void)
{
	struct uffdwp_region rw = { no_mem, 4 * psz };
	struct uffdwp_tracker *t = NULL;

	if (uffdwp_tracker_new(&t, &rw, 1, UFFDWP_BACKEND_MPROTECT))
		_exit(3);
	kill(getpid(), SIGSEGV);	/* must die of it, as without */
	usleep(200000);
	_exit(5);
}

static void t_not_ours(void)
{
	const char *name = "tracker-mprotect-not-ours";
	struct uffdwp_region ro;
	struct uffdwp_tracker *t = NULL;
	char res1[128], res2[128], res3[128], res4[128];
	int err_ro;

	no_mem = mmap(NULL, 8 * psz, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (no_mem == MAP_FAILED)
		tap_bail("%s: no memory", name);
	mprotect(no_mem + 4 * psz, psz, PROT_NONE);	/* its own VMAs */
	/* Read-only: refused, and nothing is left behind. */
	mprotect(no_mem + 6 * psz, 2 * psz, PROT_READ);
	ro = (struct uffdwp_region){ no_mem + 6 * psz, 2 * psz };
	err_ro = uffdwp_tracker_new(&t, &ro, 1, UFFDWP_BACKEND_MPROTECT);
	if (t)
		uffdwp_tracker_free(t);
	t = NULL;
	mprotect(no_mem + 6 * psz, 2 * psz, PROT_READ | PROT_WRITE);
	/* A stray write with no handler before: the process dies (SIGSEGV)
	 * rather than spinning; and a fetch from a tracked page too. */
	bool ok1 = in_child(ro_write_child, 10, res1, sizeof(res1));
	bool ok2 = in_child(exec_child, 10, res2, sizeof(res2));
	/* A handler the program installed (after an earlier tracker put the
	 * library's in) gets the faults outside trackers of a new one. */
	bool ok3 = in_child(prev_child, 10, res3, sizeof(res3));
	/* A SIGSEGV sent by kill() kills too. */
	bool ok4 = in_child(kill_child, 10, res4, sizeof(res4));

	tap_check(err_ro == -EINVAL && !ok1 && child_signal(res1) == SIGSEGV &&
		  !ok2 && child_signal(res2) == SIGSEGV && ok3 &&
		  !ok4 && child_signal(res4) == SIGSEGV, name,
		  "read-only region: %d (want -EINVAL); stray write: child %s; jump into tracked page: child %s; kill -SEGV: child %s (want SIGSEGV for all three); previous handler: child %s (exit 6: tracker_new failed, 7: the handler got faults not its own or none, 8: the tracker missed its write)",
		  err_ro, res1, res2, res4, res3);
	munmap(no_mem, 8 * psz);
}

/*
 * tracker-mprotect-overlap: a second mprotect tracker over pages another
 * one tracks is refused (-EBUSY): it would never see a write.  Adjacent
 * memory is fine.
 */
static void t_overlap(void)
{
	char *m = map_guarded(8);
	struct uffdwp_region a = { m, 4 * psz }, same = { m, 4 * psz },
			     part = { m + 3 * psz, 2 * psz },
			     next = { m + 4 * psz, 4 * psz };
	struct uffdwp_tracker *t1 = NULL, *t2 = NULL, *t3 = NULL, *t4 = NULL;
	int e1, e2, e3, e4;

	e1 = uffdwp_tracker_new(&t1, &a, 1, UFFDWP_BACKEND_MPROTECT);
	e2 = uffdwp_tracker_new(&t2, &same, 1, UFFDWP_BACKEND_MPROTECT);
	e3 = uffdwp_tracker_new(&t3, &part, 1, UFFDWP_BACKEND_MPROTECT);
	e4 = uffdwp_tracker_new(&t4, &next, 1, UFFDWP_BACKEND_MPROTECT);
	uffdwp_tracker_free(t1);
	uffdwp_tracker_free(t2);
	uffdwp_tracker_free(t3);
	uffdwp_tracker_free(t4);
	tap_check(!e1 && e2 == -EBUSY && e3 == -EBUSY && !e4 && !t2 && !t3,
		  "tracker-mprotect-overlap",
		  "first %d, same memory %d, partly %d (want -EBUSY), adjacent %d (want 0)",
		  e1, e2, e3, e4);
	munmap(m - psz, 10 * psz);
}

/*
 * tracker-auto-no-silent-switch: AUTO uses uffdwp_backend_choose()'s
 * backend or fails; memory another tracker of that backend holds is
 * -EBUSY, not a quiet fall back to another backend.
 */
static void t_auto_busy(void)
{
	const char *name = "tracker-auto-no-silent-switch";
	enum uffdwp_backend b = uffdwp_backend_choose();
	char *m = map_guarded(8);
	struct uffdwp_region r = { m, 8 * psz };
	struct uffdwp_tracker *t1 = NULL, *t2 = NULL;
	int e1, e2;

	e1 = uffdwp_tracker_new(&t1, &r, 1, b);
	e2 = uffdwp_tracker_new(&t2, &r, 1, UFFDWP_BACKEND_AUTO);
	tap_check(!e1 && e2 == -EBUSY && !t2 && uffdwp_backend_choose() == b, name,
		  "first tracker (%s): %d; AUTO on the same memory: %d with backend %s (want -EBUSY, none)",
		  uffdwp_backend_name(b), e1, e2,
		  t2 ? uffdwp_backend_name(uffdwp_tracker_backend(t2)) : "none");
	uffdwp_tracker_free(t2);
	uffdwp_tracker_free(t1);
	munmap(m - psz, 10 * psz);
}

int main(void)
{
	const char *env = getenv("UFFDWP_SEED");

	psz = sysconf(_SC_PAGESIZE);
	area = map_guarded(PAGES);
	if (!area)
		tap_bail("no memory");
	seed = env ? strtoull(env, NULL, 0) : (unsigned long long)clock_ms() *
						 2654435761ULL ^ (unsigned long long)getpid();
	seed |= 1;
	env = getenv("UFFDWP_DIFF_MS");
	if (env)
		diff_ms = atol(env);
	tap_plan(48);
	tap_diag("seed %llu (set UFFDWP_SEED to replay)", seed);
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++)
		t_backend(b);
	t_agree();
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++)
		t_discard(b);
	t_discard_agree();
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++) {
		t_differential(b, false);
		t_differential(b, true);
	}
	t_free_while_writing();
	t_not_ours();
	t_overlap();
	t_auto_busy();
	t_concurrent(UFFDWP_BACKEND_RING, false);
	t_concurrent(UFFDWP_BACKEND_PAGEMAP_SCAN, false);
	t_concurrent(UFFDWP_BACKEND_MPROTECT, false);
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++)
		t_ranges(b);
	t_concurrent(UFFDWP_BACKEND_RING, true);
	t_concurrent(UFFDWP_BACKEND_PAGEMAP_SCAN, true);
	t_concurrent(UFFDWP_BACKEND_MPROTECT, true);
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++)
		t_round_ends(b);
	t_ring_overflow(false);
	t_ring_overflow(true);
	t_ring_overflow_hugetlb();
	t_errors();
	t_mprotect_prot();
	t_mprotect_signals_fork();
	return tap_done();
}
