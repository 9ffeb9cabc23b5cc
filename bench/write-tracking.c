// SPDX-License-Identifier: GPL-2.0
/*
 * write-tracking: what it costs to catch and resolve the first write to each
 * of N populated 4 KiB pages, with uffd-wp (handler thread, SIGBUS, async),
 * mprotect + SIGSEGV (one VMA, or one VMA per page) and soft-dirty, against
 * plain writes (no_tracking).
 *
 * One configuration = variant x pages x writer threads.  Its memory is mapped
 * and written once (so every measured fault is a write-protect fault, never
 * a missing page), then each repetition protects the range (untimed), lets
 * the writers store one byte into every page once (timed) and checks that
 * every page holds the value and that every page's fault was seen.
 *
 * Options: --pages N[,N...] (every variant at these sizes), --threads
 * T[,T...] (writer threads, default 1,4; the sweep runs 1,2,4,8 on the two
 * vCPUs the guests have), --variants NAME[,NAME...] (default all).
 *
 * uffdwp_session and uffdwp_session_sync: libuffdwp's session, the first
 * write to each page between snapshots (before each repetition, untimed, a
 * snapshot into a memfd protects every page again): async mode with the
 * ring as the dirty set where the kernel allows, and held in sync mode.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench_util.h"
#include "uffd_ring.h"
#include "uffd_util.h"
#include "uffdwp.h"

#define BENCH "write-tracking"
#define PSZ 4096UL

enum variant {
	NO_TRACKING,
	UFFD_THREAD,
	UFFD_SIGBUS,
	UFFD_ASYNC,
	UFFD_ASYNC_RING,
	MPROTECT_SEGV,
	MPROTECT_SEGV_RANGES,
	SOFT_DIRTY,
	UFFDWP_SESSION,
	UFFDWP_SESSION_SYNC,
	NR_VARIANTS
};

static const char *const variant_name[NR_VARIANTS] = {
	[NO_TRACKING] = "no_tracking",
	[UFFD_THREAD] = "uffd_thread",
	[UFFD_SIGBUS] = "uffd_sigbus",
	[UFFD_ASYNC] = "uffd_async",
	[UFFD_ASYNC_RING] = "uffd_async_ring",
	[MPROTECT_SEGV] = "mprotect_segv",
	[MPROTECT_SEGV_RANGES] = "mprotect_segv_ranges",
	[SOFT_DIRTY] = "soft_dirty",
	[UFFDWP_SESSION] = "uffdwp_session",
	[UFFDWP_SESSION_SYNC] = "uffdwp_session_sync",
};

/* libuffdwp's seam (lib/session-async.c): sessions stay in sync mode
 * between snapshots, as before the ring was their dirty set. */
extern bool uw_session_sync_between;

/* The session variants: a session over the range, its snapshots into a
 * memfd emptied before each. */
static struct uffdwp_session *g_ss;
static int g_snap_fd = -1;
/* The kernel lets sessions run async between snapshots (the ring and
 * UFFDIO_SET_MODE): uffdwp_session must, uffdwp_session_sync must not. */
static bool session_async_ok, session_ok, ring_ok;

/* uffd_async_ring: the write-log ring of the async userfaultfd. */
static struct uring_view g_ring = { .uffd = -1 };

/* State the signal handlers read: the tracked range and its uffd. */
static char *g_mem;
static size_t g_len;
static int g_uffd = -1;
static long g_faults;		/* faults resolved by a signal handler */

/* ---- signal handlers: resolve one page and count it ---------------- */

static void die_in_handler(const char *msg)
{
	if (write(1, msg, strlen(msg)) < 0)
		_exit(1);
	_exit(1);
}

static char *fault_page(siginfo_t *si)
{
	char *a = si->si_addr;

	if (a < g_mem || a >= g_mem + g_len)
		die_in_handler("# FAIL: fault outside the tracked range\n");
	return (char *)((unsigned long)a & ~(PSZ - 1));
}

static void on_sigsegv(int sig, siginfo_t *si, void *uc)
{
	int saved = errno;

	(void)sig;
	(void)uc;
	if (mprotect(fault_page(si), PSZ, PROT_READ | PROT_WRITE))
		die_in_handler("# FAIL: mprotect in the SIGSEGV handler\n");
	__atomic_add_fetch(&g_faults, 1, __ATOMIC_RELAXED);
	errno = saved;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	int saved = errno;

	(void)sig;
	(void)uc;
	if (uffd_wp(g_uffd, fault_page(si), PSZ, 0))
		die_in_handler("# FAIL: UFFDIO_WRITEPROTECT in the SIGBUS handler\n");
	__atomic_add_fetch(&g_faults, 1, __ATOMIC_RELAXED);
	errno = saved;
}

static void set_handler(int sig, void (*fn)(int, siginfo_t *, void *))
{
	struct sigaction sa = { .sa_flags = SA_SIGINFO };

	sigemptyset(&sa.sa_mask);
	sa.sa_sigaction = fn;
	if (sigaction(sig, &sa, NULL))
		bench_fail("sigaction(%d): %s", sig, strerror(errno));
}

static void reset_handler(int sig)
{
	signal(sig, SIG_DFL);
}

/* ---- the uffd handler thread (uffd_thread) ---------------------------- */

struct handler {
	pthread_t thread;
	int uffd, stop_fd;
	long resolved, other, errors;
};

static void *handler_main(void *arg)
{
	struct handler *h = arg;
	struct uffd_msg msg[64];

	for (;;) {
		ssize_t n = read(h->uffd, msg, sizeof(msg));

		if (n < 0 && errno == EAGAIN) {
			struct pollfd p[2] = {
				{ .fd = h->uffd, .events = POLLIN },
				{ .fd = h->stop_fd, .events = POLLIN },
			};

			if (poll(p, 2, -1) < 0 && errno != EINTR) {
				h->errors++;
				return NULL;
			}
			if (p[1].revents)
				return NULL;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || n % sizeof(msg[0])) {
			h->errors++;
			return NULL;
		}
		for (size_t i = 0; i < n / sizeof(msg[0]); i++) {
			unsigned long a = msg[i].arg.pagefault.address;

			if (msg[i].event != UFFD_EVENT_PAGEFAULT ||
			    !(msg[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)) {
				h->other++;
				continue;
			}
			/* Count first: the wakeup below may let the last
			 * writer finish before this thread runs again. */
			__atomic_add_fetch(&h->resolved, 1, __ATOMIC_SEQ_CST);
			/* Mode 0: unprotect the page and wake the writer. */
			if (uffd_wp(h->uffd, (void *)(a & ~(PSZ - 1)), PSZ, 0))
				h->errors++;
		}
	}
}

/* ---- writers ----------------------------------------------------------- */

struct writer_arg {
	pthread_t thread;
	pthread_barrier_t *start;
	char *mem;
	size_t pages;
	char val;
	uint64_t t0, t1;
};

static void *writer_main(void *arg)
{
	struct writer_arg *w = arg;

	pthread_barrier_wait(w->start);
	w->t0 = bench_now_ns();
	for (size_t i = 0; i < w->pages; i++)
		*(volatile char *)(w->mem + i * PSZ) = w->val;
	w->t1 = bench_now_ns();
	return NULL;
}

/* Every thread writes VAL once into each page of its own contiguous share;
 * returns the time from the first writer's start to the last one's end. */
static uint64_t write_all(char *mem, size_t pages, int threads, char val)
{
	struct writer_arg w[16];
	pthread_barrier_t bar;
	uint64_t t0 = UINT64_MAX, t1 = 0;
	size_t share = pages / threads;

	pthread_barrier_init(&bar, NULL, threads);
	for (int i = 0; i < threads; i++) {
		w[i] = (struct writer_arg){
			.start = &bar, .mem = mem + i * share * PSZ,
			.pages = i == threads - 1 ? pages - i * share : share,
			.val = val,
		};
		errno = pthread_create(&w[i].thread, NULL, writer_main, &w[i]);
		if (errno)
			bench_fail("pthread_create: %s", strerror(errno));
	}
	for (int i = 0; i < threads; i++) {
		pthread_join(w[i].thread, NULL);
		if (w[i].t0 < t0)
			t0 = w[i].t0;
		if (w[i].t1 > t1)
			t1 = w[i].t1;
	}
	pthread_barrier_destroy(&bar);
	return t1 - t0;
}

/* ---- pagemap in bulk ---------------------------------------------------- */

/* Pages of [mem, mem + pages * PSZ) whose pagemap entry has every bit of MASK. */
static size_t count_pagemap(char *mem, size_t pages, uint64_t mask)
{
	static uint64_t buf[65536];
	static int fd = -1;
	size_t n = 0;

	if (fd < 0 && (fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC)) < 0)
		bench_fail("open /proc/self/pagemap: %s", strerror(errno));
	for (size_t done = 0; done < pages;) {
		size_t want = pages - done < 65536 ? pages - done : 65536;
		off_t off = ((unsigned long)mem / PSZ + done) * sizeof(uint64_t);
		ssize_t got = pread(fd, buf, want * sizeof(uint64_t), off);

		if (got != (ssize_t)(want * sizeof(uint64_t)))
			bench_fail("read /proc/self/pagemap: %s",
				   got < 0 ? strerror(errno) : "short read");
		for (size_t i = 0; i < want; i++)
			n += (buf[i] & mask) == mask;
		done += want;
	}
	return n;
}

/* ---- soft-dirty support ---------------------------------------------- */

static int clear_soft_dirty(void)
{
	return bench_write_file("/proc/self/clear_refs", "4");
}

/* Without CONFIG_MEM_SOFT_DIRTY clear_refs accepts "4" but pagemap bit 55
 * never shows up: write a page after clearing and look for the bit. */
static bool soft_dirty_works(const char **why)
{
	char *p = mmap(NULL, PSZ, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	bool ok;

	if (p == MAP_FAILED)
		bench_fail("mmap: %s", strerror(errno));
	*p = 1;
	if (clear_soft_dirty()) {
		*why = "writing 4 to /proc/self/clear_refs failed";
		munmap(p, PSZ);
		return false;
	}
	*p = 2;
	ok = count_pagemap(p, 1, PM_SOFT_DIRTY) == 1;
	munmap(p, PSZ);
	if (!ok)
		*why = "a page written after clear_refs has no soft-dirty bit "
		       "(pagemap bit 55): kernel without CONFIG_MEM_SOFT_DIRTY";
	return ok;
}

/* ---- one configuration ------------------------------------------------ */

struct config {
	enum variant v;
	size_t pages;
	int threads;
};

static void setup_uffd(uint64_t features)
{
	uint64_t ioctls = 0;

	g_uffd = uffd_open(features, NULL);
	if (g_uffd < 0)
		bench_fail("userfaultfd with features %#llx: %s",
			   (unsigned long long)features, strerror(-g_uffd));
	errno = -uffd_register(g_uffd, g_mem, g_len, UFFDIO_REGISTER_MODE_WP,
			       &ioctls);
	if (errno)
		bench_fail("UFFDIO_REGISTER mode WP: %s", strerror(errno));
	if (!(ioctls & (1ULL << _UFFDIO_WRITEPROTECT)))
		bench_fail("UFFDIO_REGISTER offers no UFFDIO_WRITEPROTECT");
}

static void protect(const struct config *c)
{
	int err = 0;

	switch (c->v) {
	case NO_TRACKING:
		break;
	case UFFD_THREAD:
	case UFFD_SIGBUS:
	case UFFD_ASYNC:
		err = uffd_wp(g_uffd, g_mem, g_len, UFFDIO_WRITEPROTECT_MODE_WP);
		break;
	case UFFD_ASYNC_RING:
		/* the last repetition's entries dropped, every page protected */
		err = ring_reset(&g_ring, ring_producer(&g_ring),
				 UFFDIO_RING_RESET_DISCARD, NULL);
		if (!err)
			err = uffd_wp(g_uffd, g_mem, g_len,
				      UFFDIO_WRITEPROTECT_MODE_WP);
		break;
	case MPROTECT_SEGV:
		err = mprotect(g_mem, g_len, PROT_READ) ? -errno : 0;
		break;
	case MPROTECT_SEGV_RANGES:
		for (size_t i = 0; i < c->pages && !err; i++)
			err = mprotect(g_mem + i * PSZ, PSZ, PROT_READ) ? -errno : 0;
		break;
	case SOFT_DIRTY:
		err = clear_soft_dirty();
		break;
	case UFFDWP_SESSION:
	case UFFDWP_SESSION_SYNC:
		/* A snapshot (the first a base, then deltas of the last
		 * repetition's pages): afterwards every page is protected. */
		if (ftruncate(g_snap_fd, 0) || lseek(g_snap_fd, 0, SEEK_SET))
			err = -errno;
		if (!err)
			err = uffdwp_session_snapshot(g_ss, g_snap_fd, 0);
		if (!err)
			err = uffdwp_session_wait(g_ss, -1);
		break;
	default:
		abort();
	}
	if (err)
		bench_fail("%s: protecting %zu pages: %s", variant_name[c->v],
			   c->pages, strerror(-err));
}

static void run_config(const struct config *c, int reps)
{
	struct handler h = { .uffd = -1, .stop_fd = -1 };
	char param[64];

	snprintf(param, sizeof(param), "pages=%zu;threads=%d", c->pages, c->threads);
	g_len = c->pages * PSZ;
	g_mem = map_anon_aligned(g_len, HPAGE_SIZE);
	if (!g_mem)
		bench_fail("mmap %zu pages: %s", c->pages, strerror(errno));
	/* Small pages only: every tracked unit is one 4 KiB page. */
	if (madvise(g_mem, g_len, MADV_NOHUGEPAGE))
		bench_fail("MADV_NOHUGEPAGE: %s", strerror(errno));
	for (size_t i = 0; i < c->pages; i++)
		g_mem[i * PSZ] = 1;

	switch (c->v) {
	case UFFD_THREAD:
		setup_uffd(0);
		h.uffd = g_uffd;
		h.stop_fd = eventfd(0, EFD_CLOEXEC);
		if (h.stop_fd < 0)
			bench_fail("eventfd: %s", strerror(errno));
		errno = pthread_create(&h.thread, NULL, handler_main, &h);
		if (errno)
			bench_fail("pthread_create: %s", strerror(errno));
		break;
	case UFFD_SIGBUS:
		setup_uffd(UFFD_FEATURE_SIGBUS);
		set_handler(SIGBUS, on_sigbus);
		break;
	case UFFD_ASYNC:
		setup_uffd(UFFD_FEATURE_WP_ASYNC);
		break;
	case UFFD_ASYNC_RING: {
		uint64_t entries = 64, ioctls = 0;

		while (entries < c->pages)
			entries <<= 1;
		errno = -ring_open(&g_ring, entries, 0);
		if (errno)
			bench_fail("uffd_async_ring: a ring of %llu entries: %s",
				   (unsigned long long)entries, strerror(errno));
		g_uffd = g_ring.uffd;
		errno = -uffd_register(g_uffd, g_mem, g_len,
				       UFFDIO_REGISTER_MODE_WP, &ioctls);
		if (errno)
			bench_fail("UFFDIO_REGISTER mode WP: %s", strerror(errno));
		break;
	}
	case UFFDWP_SESSION:
	case UFFDWP_SESSION_SYNC: {
		struct uffdwp_region r = { g_mem, g_len };
		int err;

		uw_session_sync_between = c->v == UFFDWP_SESSION_SYNC;
		g_snap_fd = memfd_create("write-tracking", MFD_CLOEXEC);
		if (g_snap_fd < 0)
			bench_fail("memfd_create: %s", strerror(errno));
		err = uffdwp_session_new(&g_ss, &r, 1, NULL);
		if (err)
			bench_fail("uffdwp_session_new: %s", strerror(-err));
		break;
	}
	case MPROTECT_SEGV_RANGES:
		/* VM_DONTCOPY on every other page: neighbours differ in flags,
		 * so each page stays its own VMA whatever its protection. */
		for (size_t i = 1; i < c->pages; i += 2)
			if (madvise(g_mem + i * PSZ, PSZ, MADV_DONTFORK))
				bench_fail("MADV_DONTFORK page %zu of %zu: %s "
					   "(vm.max_map_count?)", i, c->pages,
					   strerror(errno));
		/* fall through */
	case MPROTECT_SEGV:
		set_handler(SIGSEGV, on_sigsegv);
		break;
	default:
		break;
	}

	for (int rep = 0; rep < reps; rep++) {
		char val = 2 + rep % 100;
		long vmas = 0, resolved;
		size_t n;
		uint64_t ns;

		protect(c);
		switch (c->v) {
		case UFFD_THREAD:
		case UFFD_SIGBUS:
		case UFFD_ASYNC:
		case UFFD_ASYNC_RING:
			n = count_pagemap(g_mem, c->pages, PM_UFFD_WP);
			if (n != c->pages)
				bench_fail("%s %s: %zu of %zu pages uffd-wp after "
					   "UFFDIO_WRITEPROTECT", variant_name[c->v],
					   param, n, c->pages);
			break;
		case SOFT_DIRTY:
			n = count_pagemap(g_mem, c->pages, PM_SOFT_DIRTY);
			if (n)
				bench_fail("%s %s: %zu pages still soft-dirty after "
					   "clear_refs", variant_name[c->v], param, n);
			break;
		case UFFDWP_SESSION:
		case UFFDWP_SESSION_SYNC: {
			struct uffdwp_stats_v v = { .size = sizeof(v) };
			bool async;

			n = count_pagemap(g_mem, c->pages, PM_UFFD_WP);
			if (n != c->pages || uffdwp_session_dirty(g_ss))
				bench_fail("%s %s: %zu of %zu pages uffd-wp, %zd dirty "
					   "after a snapshot", variant_name[c->v],
					   param, n, c->pages,
					   uffdwp_session_dirty(g_ss));
			if (uffdwp_session_stats_v(g_ss, &v))
				bench_fail("uffdwp_session_stats_v failed");
			async = v.flags & UFFDWP_STATS_ASYNC_BETWEEN;
			if (async != (c->v == UFFDWP_SESSION && session_async_ok))
				bench_fail("%s %s: async between snapshots is %s",
					   variant_name[c->v], param,
					   async ? "on" : "off");
			break;
		}
		case MPROTECT_SEGV:
		case MPROTECT_SEGV_RANGES:
			vmas = bench_vma_count();
			if (vmas < 0)
				bench_fail("reading /proc/self/maps: %s", strerror(errno));
			if (c->v == MPROTECT_SEGV_RANGES && vmas < (long)c->pages)
				bench_fail("%s %s: only %ld VMAs for %zu one-page ranges",
					   variant_name[c->v], param, vmas, c->pages);
			break;
		default:
			break;
		}
		g_faults = 0;
		h.resolved = 0;

		ns = write_all(g_mem, c->pages, c->threads, val);

		for (size_t i = 0; i < c->pages; i++)
			if (g_mem[i * PSZ] != val)
				bench_fail("%s %s: page %zu holds %d, wrote %d",
					   variant_name[c->v], param, i,
					   g_mem[i * PSZ], val);
		resolved = -1;
		switch (c->v) {
		case UFFD_THREAD:
			resolved = __atomic_load_n(&h.resolved, __ATOMIC_RELAXED);
			if (h.errors || h.other)
				bench_fail("%s %s: handler saw %ld failed ioctls, "
					   "%ld unexpected messages",
					   variant_name[c->v], param, h.errors, h.other);
			break;
		case UFFD_SIGBUS:
		case MPROTECT_SEGV:
		case MPROTECT_SEGV_RANGES:
			resolved = g_faults;
			break;
		case UFFD_ASYNC:
			n = count_pagemap(g_mem, c->pages, PM_UFFD_WP);
			if (n)
				bench_fail("%s %s: %zu pages still uffd-wp after "
					   "the writes", variant_name[c->v], param, n);
			break;
		case UFFD_ASYNC_RING:
			resolved = (long)(ring_producer(&g_ring) - g_ring.consumer);
			break;
		case SOFT_DIRTY:
			n = count_pagemap(g_mem, c->pages, PM_SOFT_DIRTY);
			if (n != c->pages)
				bench_fail("%s %s: %zu of %zu written pages soft-dirty",
					   variant_name[c->v], param, n, c->pages);
			break;
		case UFFDWP_SESSION:
		case UFFDWP_SESSION_SYNC:
			resolved = uffdwp_session_dirty(g_ss);
			break;
		default:
			break;
		}
		if (resolved >= 0 && resolved != (long)c->pages)
			bench_fail("%s %s: %ld faults resolved for %zu pages",
				   variant_name[c->v], param, resolved, c->pages);

		bench_sample(BENCH, variant_name[c->v], param, "fault_ns",
			     (double)ns / c->pages, "ns");
		if (vmas)
			bench_sample(BENCH, variant_name[c->v], param, "vmas",
				     vmas, "count");
	}

	if (c->v == UFFD_THREAD) {
		uint64_t one = 1;

		if (write(h.stop_fd, &one, sizeof(one)) != sizeof(one))
			bench_fail("eventfd write: %s", strerror(errno));
		pthread_join(h.thread, NULL);
		close(h.stop_fd);
	}
	if (g_ring.uffd >= 0) {
		ring_close(&g_ring);
		g_uffd = -1;
	}
	if (g_uffd >= 0) {
		close(g_uffd);
		g_uffd = -1;
	}
	if (g_ss) {
		uffdwp_session_free(g_ss);
		g_ss = NULL;
		close(g_snap_fd);
		g_snap_fd = -1;
		uw_session_sync_between = false;
	}
	reset_handler(SIGBUS);
	reset_handler(SIGSEGV);
	if (munmap(g_mem, g_len))
		bench_fail("munmap: %s", strerror(errno));
	g_mem = NULL;
	g_len = 0;
}

/* Make room for one VMA per page (plus slack); returns how many pages the
 * ranges variant may use. */
static size_t allow_vmas(size_t pages)
{
	const char *knob = "/proc/sys/vm/max_map_count";
	long cur = 0, want = pages + 4096;
	char buf[32];

	if (bench_read_long(knob, &cur))
		cur = 65530;
	if (cur >= want)
		return pages;
	snprintf(buf, sizeof(buf), "%ld", want);
	if (!bench_write_file(knob, buf)) {
		bench_comment("raised vm.max_map_count from %ld to %ld for "
			      "mprotect_segv_ranges", cur, want);
		return pages;
	}
	bench_comment("cannot raise vm.max_map_count (%ld): mprotect_segv_ranges "
		      "capped at %ld pages", cur, cur - 4096);
	return cur - 4096;
}

/* --variants NAME[,NAME...]: only these (all by default). */
static bool use[NR_VARIANTS];

static bool pick_variants(const char *list)
{
	memset(use, !list, sizeof(use));
	for (const char *p = list; p && *p;) {
		size_t n = strcspn(p, ","), v = 0;

		while (v < NR_VARIANTS && (strlen(variant_name[v]) != n ||
					   strncmp(variant_name[v], p, n)))
			v++;
		if (v == NR_VARIANTS) {
			fprintf(stderr, "bench-write-tracking: --variants: unknown variant '%.*s'\n",
				(int)n, p);
			return false;
		}
		use[v] = true;
		p += n + (p[n] == ',');
	}
	return true;
}

/* A signal or handler-thread variant: each fault costs tens of microseconds
 * in the TCG guest, which rules out 5 repetitions of 262144 pages in the
 * default run. */
static bool slow_variant(enum variant v)
{
	return v == UFFD_THREAD || v == UFFD_SIGBUS || v == MPROTECT_SEGV ||
	       v == MPROTECT_SEGV_RANGES || v == UFFDWP_SESSION_SYNC ||
	       (v == UFFDWP_SESSION && !session_async_ok);
}

int main(int argc, char **argv)
{
	const char *pages_opt = bench_take_opt(&argc, argv, "--pages");
	const char *threads_opt = bench_take_opt(&argc, argv, "--threads");
	const char *variants_opt = bench_take_opt(&argc, argv, "--variants");
	size_t sizes[8] = { 1024, 16384, 262144 }, nsizes = 3, max_ranges;
	size_t threads[8] = { 1, 4 }, nthreads = 2;
	struct bench_opts o;
	const char *sd_why = NULL;
	bool sd_ok, all_variants = false;
	uint64_t start = bench_now_ns();

	bench_parse_args(argc, argv, &o, 5);
	if (!pick_variants(variants_opt))
		return 2;
	if (threads_opt)
		nthreads = bench_parse_list("--threads", threads_opt, threads, 8,
					    1, 64, 1);
	if (pages_opt) {
		nsizes = bench_parse_list("--pages", pages_opt, sizes, 8, 4,
					  1UL << 20, 4);
		all_variants = true;
	} else if (o.quick) {
		sizes[0] = 256;
		nsizes = 1;
		all_variants = true;
	}
	if (sysconf(_SC_PAGESIZE) != (long)PSZ)
		bench_fail("page size is %ld, this benchmark assumes 4096",
			   sysconf(_SC_PAGESIZE));

	bench_comment("write-tracking: first write to each of N populated 4 KiB "
		      "pages, caught and resolved; T writer threads write disjoint "
		      "contiguous shares, one byte per page");
	bench_comment("fault_ns = (last writer's end - first writer's start, "
		      "CLOCK_MONOTONIC) / N, i.e. wall time per page including "
		      "catching and resolving its fault");
	bench_comment("vmas = lines of /proc/self/maps right after protection "
		      "(mprotect variants)");
	bench_comment("no_tracking: plain writes to writable memory; uffd_thread: "
		      "uffd-wp sync, handler thread unprotects (WRITEPROTECT mode 0, "
		      "wakes); uffd_sigbus: UFFD_FEATURE_SIGBUS, the writer's SIGBUS "
		      "handler unprotects; uffd_async: UFFD_FEATURE_WP_ASYNC; "
		      "uffd_async_ring: the same with the write-log ring logging "
		      "each resolution");
	bench_comment("mprotect_segv: one mprotect(PROT_READ) of the range, SIGSEGV "
		      "handler mprotects the page RW; mprotect_segv_ranges: every "
		      "page its own VMA (MADV_DONTFORK on every other page keeps "
		      "neighbours from merging), one mprotect(PROT_READ) per page, "
		      "same handler");
	bench_comment("soft_dirty: echo 4 > /proc/self/clear_refs, then writes "
		      "(write fault per page); protection is untimed in every "
		      "variant");
	bench_comment("memory is mapped, MADV_NOHUGEPAGE, written once before the "
		      "repetitions; %d repetitions per figure", o.reps);
	if (!all_variants)
		bench_comment("262144 pages: uffd_thread, uffd_sigbus, mprotect_segv "
			      "and mprotect_segv_ranges not run by default: in the "
			      "TCG guest a signal delivery alone costs ~50 us and a "
			      "cross-vCPU wakeup or TLB shootdown 0.1-5 ms (it waits "
			      "for the host to run the other vCPU thread), so 5 reps "
			      "x 2 thread counts x 4 variants take 15 min to hours; "
			      "run them with --pages 262144");
	bench_comment("uffdwp_session: a libuffdwp session's first write to each "
		      "page between snapshots (a snapshot into a memfd, untimed, "
		      "before each repetition): async mode with the write-log ring "
		      "as its dirty set where the kernel has UFFDIO_SET_MODE and "
		      "the ring; uffdwp_session_sync: the same held in sync mode "
		      "(each first write a round trip through the session's "
		      "handler thread), as sessions were before");
	{
		struct uffdwp_features uf;

		session_ok = !uffdwp_probe(&uf) && uf.wp;
		session_async_ok = session_ok && uf.set_mode &&
				   uf.wp_ring && uf.wp_unpopulated;
		ring_ok = ring_supported();
		if (!session_ok)
			bench_comment("uffdwp_session variants skipped: no sync "
				      "write-protection for libuffdwp");
		if (!ring_ok)
			bench_comment("uffd_async_ring skipped: no write-log ring");
		if (!session_async_ok)
			bench_comment("uffdwp_session runs in sync mode here: the "
				      "kernel lacks UFFDIO_SET_MODE or the ring");
	}
	sd_ok = soft_dirty_works(&sd_why);
	if (!sd_ok)
		bench_comment("soft_dirty skipped: %s", sd_why);
	max_ranges = sizes[0];
	for (size_t s = 1; s < nsizes; s++)
		if (sizes[s] > max_ranges)
			max_ranges = sizes[s];
	max_ranges = allow_vmas(max_ranges);

	for (size_t s = 0; s < nsizes; s++)
		for (size_t t = 0; t < nthreads; t++)
			for (int v = 0; v < NR_VARIANTS; v++) {
				struct config c = {
					.v = v, .pages = sizes[s],
					.threads = (int)threads[t],
				};

				if (!use[v] || (v == SOFT_DIRTY && !sd_ok) ||
				    (v == UFFD_ASYNC_RING && !ring_ok) ||
				    ((v == UFFDWP_SESSION ||
				      v == UFFDWP_SESSION_SYNC) && !session_ok))
					continue;
				if (!all_variants && slow_variant(v) && c.pages > 16384)
					continue;
				if (v == MPROTECT_SEGV_RANGES && c.pages > max_ranges)
					c.pages = max_ranges & ~3UL;
				run_config(&c, o.reps);
			}
	bench_comment("write-tracking done in %.1f s",
		      (bench_now_ns() - start) / 1e9);
	return 0;
}
