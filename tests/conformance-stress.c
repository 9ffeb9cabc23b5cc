// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-stress: many writers against a handler that resolves uffd-wp
 * faults while the region is write-protected again and again.
 *
 * Contract checked (issue tracker, area 15 "stress"; the idea of the
 * original series' bounce test):
 *  - N = 2 x online CPUs writer threads each own every N-th page of a
 *    256-page region and increment a counter on each of their pages with
 *    plain loads and stores, checking every value they read against their
 *    own record.  A handler thread resolves each WP fault by unprotecting
 *    the page (waking the writer directly on even rounds, with DONTWAKE and
 *    a separate UFFDIO_WAKE on odd rounds).
 *  - Barrier rounds: the whole region is protected between rounds (pagemap
 *    shows every page protected), then the writers run one round.  After R
 *    rounds no write was lost or duplicated, and every page raised at least
 *    one WP message in every round.
 *  - Concurrent rounds: the region is protected again while the writers are
 *    running; every round each page faults, and still no write is lost.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"

#define NPAGES		256
#define ROUNDS		8
#define INCS		4		/* increments per page per barrier round */
#define ROUND_MS	10000

struct stress {
	char *region;
	int uffd;
	int nwriters;
	bool concurrent;
	volatile int round;		/* round the writers may run, -1 before */
	volatile int quit;		/* concurrent mode: writers stop */
	volatile int finished;		/* barrier mode: writer-rounds done */
	volatile int stop_handler;
	int msgs[ROUNDS][NPAGES];	/* WP messages per round and page */
	volatile int bad_msgs;		/* messages that are not our WP faults */
	volatile int errors;		/* failed resolutions */
	int unprotected_rounds;		/* rounds not fully protected at start */
};

struct writer_ctx {
	struct stress *s;
	pthread_t thread;
	int id;
	uint64_t expect[NPAGES];	/* the value this writer last stored */
	long mismatches;
	int first_bad_page;
	uint64_t first_bad_seen, first_bad_expected;
};

static volatile uint64_t *counter(struct stress *s, int page)
{
	return (volatile uint64_t *)(s->region + (size_t)page * page_size());
}

/* One increment of each of the writer's pages, checking what it reads. */
static void writer_pass(struct writer_ctx *w)
{
	struct stress *s = w->s;

	for (int p = w->id; p < NPAGES; p += s->nwriters) {
		volatile uint64_t *c = counter(s, p);
		uint64_t v = *c;

		if (v != w->expect[p] && !w->mismatches++) {
			w->first_bad_page = p;
			w->first_bad_seen = v;
			w->first_bad_expected = w->expect[p];
		}
		*c = v + 1;
		w->expect[p] = v + 1;
	}
}

static void *writer_main(void *arg)
{
	struct writer_ctx *w = arg;
	struct stress *s = w->s;

	if (s->concurrent) {
		while (__atomic_load_n(&s->round, __ATOMIC_ACQUIRE) < 0)
			usleep(200);
		while (!__atomic_load_n(&s->quit, __ATOMIC_ACQUIRE))
			writer_pass(w);
		return NULL;
	}
	for (int r = 0; r < ROUNDS; r++) {
		while (__atomic_load_n(&s->round, __ATOMIC_ACQUIRE) < r) {
			if (__atomic_load_n(&s->quit, __ATOMIC_ACQUIRE))
				return NULL;
			usleep(200);
		}
		for (int k = 0; k < INCS; k++)
			writer_pass(w);
		__atomic_add_fetch(&s->finished, 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

/* Unprotect the faulting page; odd rounds wake in a separate step. */
static void resolve(struct stress *s, void *page, int round)
{
	int err;

	if (round & 1) {
		err = uffd_wp(s->uffd, page, page_size(),
			      UFFDIO_WRITEPROTECT_MODE_DONTWAKE);
		if (!err)
			err = uffd_wake(s->uffd, page, page_size());
	} else {
		err = uffd_wp(s->uffd, page, page_size(), 0);
	}
	if (err)
		__atomic_add_fetch(&s->errors, 1, __ATOMIC_RELAXED);
}

static void *handler_main(void *arg)
{
	struct stress *s = arg;
	uintptr_t lo = (uintptr_t)s->region;
	uintptr_t hi = lo + (size_t)NPAGES * page_size();

	while (!__atomic_load_n(&s->stop_handler, __ATOMIC_ACQUIRE)) {
		struct uffd_msg msg;
		uintptr_t addr;
		int round, page;

		if (uffd_read_msg(s->uffd, &msg, 50) != 1)
			continue;
		addr = msg.arg.pagefault.address & ~(page_size() - 1);
		round = __atomic_load_n(&s->round, __ATOMIC_ACQUIRE);
		if (msg.event != UFFD_EVENT_PAGEFAULT ||
		    !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) ||
		    addr < lo || addr >= hi || round < 0 || round >= ROUNDS) {
			__atomic_add_fetch(&s->bad_msgs, 1, __ATOMIC_RELAXED);
			continue;
		}
		page = (addr - lo) / page_size();
		resolve(s, (void *)addr, round);
		/*
		 * Count only after the unprotect, so the main thread never
		 * protects the next round before this one is undone.
		 */
		__atomic_add_fetch(&s->msgs[round][page], 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static int stress_setup(struct stress *s, bool concurrent, char *why,
			size_t whylen)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int err;

	memset(s, 0, sizeof(*s));
	s->round = -1;
	s->concurrent = concurrent;
	s->nwriters = 2 * (cpus > 0 ? cpus : 1);
	s->region = map_anon_aligned((size_t)NPAGES * page_size(), page_size());
	if (!s->region) {
		snprintf(why, whylen, "mmap: %s", strerror(errno));
		return -1;
	}
	memset(s->region, 0, (size_t)NPAGES * page_size());
	s->uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (s->uffd < 0) {
		snprintf(why, whylen, "uffd_open: %s", strerror(-s->uffd));
		return -1;
	}
	err = uffd_register(s->uffd, s->region, (size_t)NPAGES * page_size(),
			    UFFDIO_REGISTER_MODE_WP, NULL);
	if (err) {
		snprintf(why, whylen, "register WP: %s", strerror(-err));
		return -1;
	}
	return 0;
}

static void stress_free(struct stress *s)
{
	if (s->uffd >= 0)
		close(s->uffd);
	if (s->region)
		munmap(s->region, (size_t)NPAGES * page_size());
}

/* Protect the whole region for ROUND; note if pagemap disagrees. */
static int protect_round(struct stress *s)
{
	size_t len = (size_t)NPAGES * page_size();
	int err = uffd_wp(s->uffd, s->region, len, UFFDIO_WRITEPROTECT_MODE_WP);

	if (!err && !s->concurrent &&
	    pages_with(s->region, len, PM_UFFD_WP | PM_PRESENT) != NPAGES)
		s->unprotected_rounds++;
	return err;
}

static bool round_faulted(struct stress *s, int r)
{
	for (int p = 0; p < NPAGES; p++)
		if (!__atomic_load_n(&s->msgs[r][p], __ATOMIC_ACQUIRE))
			return false;
	return true;
}

/* Run all rounds; returns the rounds completed, *why set on a problem. */
static int drive_rounds(struct stress *s, char *why, size_t whylen)
{
	for (int r = 0; r < ROUNDS; r++) {
		long long end = now_ms() + ROUND_MS;
		int err;

		if (s->concurrent)
			__atomic_store_n(&s->round, r, __ATOMIC_RELEASE);
		err = protect_round(s);
		if (err) {
			snprintf(why, whylen, "protect round %d: %s", r,
				 strerror(-err));
			return r;
		}
		if (!s->concurrent)
			__atomic_store_n(&s->round, r, __ATOMIC_RELEASE);
		while (s->concurrent ? !round_faulted(s, r) :
		       __atomic_load_n(&s->finished, __ATOMIC_ACQUIRE) <
		       s->nwriters * (r + 1)) {
			if (now_ms() >= end) {
				snprintf(why, whylen, "round %d did not finish "
					 "within %d ms", r, ROUND_MS);
				return r;
			}
			usleep(500);
		}
	}
	return ROUNDS;
}

static bool check_counters(struct stress *s, struct writer_ctx *w,
			   char *why, size_t whylen)
{
	for (int i = 0; i < s->nwriters; i++)
		if (w[i].mismatches)
			return snprintf(why, whylen, "writer %d read %ld stale "
					"values, first page %d: %llu, expected "
					"%llu", i, w[i].mismatches,
					w[i].first_bad_page,
					(unsigned long long)w[i].first_bad_seen,
					(unsigned long long)
					w[i].first_bad_expected),
			       false;
	for (int p = 0; p < NPAGES; p++) {
		uint64_t want = w[p % s->nwriters].expect[p];

		if (!s->concurrent && want != ROUNDS * INCS)
			return snprintf(why, whylen, "page %d: writer stored "
					"%llu increments, expected %d", p,
					(unsigned long long)want,
					ROUNDS * INCS), false;
		if (*counter(s, p) != want)
			return snprintf(why, whylen, "page %d counter %llu, "
					"expected %llu", p,
					(unsigned long long)*counter(s, p),
					(unsigned long long)want), false;
	}
	return true;
}

static bool check_messages(struct stress *s, char *why, size_t whylen)
{
	long total = 0;

	for (int r = 0; r < ROUNDS; r++)
		for (int p = 0; p < NPAGES; p++) {
			if (!s->msgs[r][p])
				return snprintf(why, whylen, "round %d page %d: "
						"written but no WP message", r,
						p), false;
			total += s->msgs[r][p];
		}
	tap_diag("%d writers, %d rounds x %d pages: %ld WP messages", s->nwriters,
		 ROUNDS, NPAGES, total);
	if (s->bad_msgs || s->errors || s->unprotected_rounds)
		return snprintf(why, whylen, "%d stray messages, %d failed "
				"resolutions, %d rounds not fully protected "
				"at start", s->bad_msgs, s->errors,
				s->unprotected_rounds), false;
	return true;
}

/* Start everything, drive the rounds, stop everything. */
static int stress_run(struct stress *s, struct writer_ctx *w, char *why,
		      size_t whylen)
{
	pthread_t handler;
	int done;

	if (pthread_create(&handler, NULL, handler_main, s))
		tap_bail("pthread_create failed");
	for (int i = 0; i < s->nwriters; i++) {
		w[i] = (struct writer_ctx){ .s = s, .id = i };
		if (pthread_create(&w[i].thread, NULL, writer_main, &w[i]))
			tap_bail("pthread_create failed");
	}
	done = drive_rounds(s, why, whylen);
	__atomic_store_n(&s->quit, 1, __ATOMIC_RELEASE);
	if (done < ROUNDS)	/* free any writer stuck in a fault */
		uffd_unregister(s->uffd, s->region, (size_t)NPAGES * page_size());
	for (int i = 0; i < s->nwriters; i++)
		pthread_join(w[i].thread, NULL);
	__atomic_store_n(&s->stop_handler, 1, __ATOMIC_RELEASE);
	pthread_join(handler, NULL);
	return done;
}

static void test_barrier_rounds(void)
{
	const char *n1 = "stress-rounds-no-lost-or-duplicated-writes";
	const char *n2 = "stress-rounds-wp-message-per-page-per-round";
	static struct stress s;
	struct writer_ctx *w;
	char why[256] = "";
	long long t0 = now_ms();

	if (stress_setup(&s, false, why, sizeof(why))) {
		tap_fail(n1, "setup: %s", why);
		tap_fail(n2, "setup failed");
		stress_free(&s);
		return;
	}
	w = calloc(s.nwriters, sizeof(*w));
	if (!w)
		tap_bail("out of memory");
	if (stress_run(&s, w, why, sizeof(why)) < ROUNDS) {
		tap_fail(n1, "%s", why);
		tap_fail(n2, "%s", why);
	} else {
		tap_check(check_counters(&s, w, why, sizeof(why)), n1, "%s",
			  why);
		tap_check(check_messages(&s, why, sizeof(why)), n2, "%s", why);
	}
	tap_diag("barrier rounds took %lld ms", now_ms() - t0);
	free(w);
	stress_free(&s);
}

static void test_concurrent_rounds(void)
{
	const char *name = "stress-concurrent-reprotect-no-lost-writes";
	static struct stress s;
	struct writer_ctx *w;
	char why[256] = "";
	long long t0 = now_ms();
	uint64_t total = 0;

	if (stress_setup(&s, true, why, sizeof(why))) {
		tap_fail(name, "setup: %s", why);
		stress_free(&s);
		return;
	}
	w = calloc(s.nwriters, sizeof(*w));
	if (!w)
		tap_bail("out of memory");
	if (stress_run(&s, w, why, sizeof(why)) < ROUNDS) {
		tap_fail(name, "%s", why);
	} else {
		for (int p = 0; p < NPAGES; p++)
			total += *counter(&s, p);
		tap_check(check_counters(&s, w, why, sizeof(why)) &&
			  check_messages(&s, why, sizeof(why)), name, "%s",
			  why);
	}
	tap_diag("concurrent rounds took %lld ms, %llu increments",
		 now_ms() - t0, (unsigned long long)total);
	free(w);
	stress_free(&s);
}

int main(void)
{
	watchdog(60);
	tap_plan(3);
	test_barrier_rounds();
	test_concurrent_rounds();
	return tap_done();
}
