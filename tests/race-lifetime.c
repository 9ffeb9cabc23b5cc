// SPDX-License-Identifier: GPL-2.0
/*
 * race-lifetime: the end of a registration or of a userfaultfd while uffd-wp
 * faults are in flight.
 *
 *  - UNREGISTER of a MISSING|WP range with writers blocked in WP faults
 *    wakes them (userfaultfd_unregister() wakes MISSING ranges): every write
 *    completes, is visible, and no uffd-wp bit is left.
 *  - UNREGISTER of a MISSING|WP range while a reader starts faulting on it:
 *    once UNREGISTER returns, no fault of the range may be pending (the
 *    monitor could only answer it with -ENOENT) and the reader runs on.  A
 *    fault handled under the per-VMA lock could queue itself between the
 *    wakeup and the clearing of the range (kernel/patches: "userfaultfd:
 *    wake pending faults after unregistering a range, not before").
 *  - UNREGISTER of a WP-only range with writers blocked, and of a minor-only
 *    shmem range with a reader blocked: they run on without UFFDIO_WAKE
 *    (kernel/patches: "userfaultfd: wake write-protect and minor faults on
 *    unregister as well"; before it only MISSING ranges were woken).
 *  - close() of the uffd with writers blocked: release wakes them all.
 *  - close() while a resolver thread is answering faults of writers that
 *    keep writing: every writer finishes all its writes.
 *  - Re-registering a write-protected range without MODE_WP drops the VMA's
 *    VM_UFFD_WP; the uffd-wp pte bits must go with it (as UNREGISTER clears
 *    them), or a later write leaves a writable pte that pagemap still calls
 *    write-protected.
 *  - Registering a WP range again for MISSING only, with writers blocked in
 *    WP faults: they run on (kernel/patches: "userfaultfd: drop uffd-wp bits
 *    when a range is registered again without WP").
 *  - The write-log ring (only when UFFDIO_API reports UFFD_FEATURE_WP_RING):
 *    harvesting while writers write and the uffd is closed under them; a
 *    ring context freed while its mm exits and a hole punch walks the
 *    mm's mappings of the file (a use-after-free is a KASAN report in the
 *    debug lane's console).
 *
 * Each case repeats its race a bounded number of times; a global watchdog
 * turns a hang into a failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <signal.h>
#include <linux/falloc.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"



#define NW		4	/* writers, one page each */
#define ITERS		12
#define WAIT_MS		5000
#define WHY_LEN		300

static long psz;

static bool fail(char *why, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static bool fail(char *why, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, WHY_LEN, fmt, ap);
	va_end(ap);
	return false;
}

/* ---- writers that each store one value into their own page ------------- */

struct one_write {
	pthread_t thread;
	volatile uint64_t *word;
	uint64_t val;
	bool read;		/* read the word instead */
	volatile int done;
};

static void *one_write_main(void *arg)
{
	struct one_write *w = arg;

	if (w->read)
		w->val = *w->word;
	else
		*w->word = w->val;
	__atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static int done_count(struct one_write *w, int n)
{
	int k = 0;

	for (int i = 0; i < n; i++)
		k += __atomic_load_n(&w[i].done, __ATOMIC_SEQ_CST);
	return k;
}

static bool wait_all(struct one_write *w, int n, int timeout_ms)
{
	long long end = now_ms() + timeout_ms;

	while (done_count(w, n) < n && now_ms() < end)
		usleep(1000);
	return done_count(w, n) == n;
}

/*
 * A populated, registered, write-protected region of NW pages and NW
 * writers blocked in WP faults on it (their messages read, not answered).
 */
struct blocked {
	int uffd;
	char *mem;
	int started;
	struct one_write w[NW];
};

static bool block_writers(struct blocked *b, uint64_t mode, int iter,
			  char *why)
{
	int got = 0, err;

	b->mem = map_anon_aligned(NW * psz, psz);
	if (!b->mem)
		return fail(why, "mmap: %s", strerror(errno));
	memset(b->mem, 0, NW * psz);
	b->uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (b->uffd < 0)
		return fail(why, "userfaultfd: %s", strerror(-b->uffd));
	err = uffd_register(b->uffd, b->mem, NW * psz, mode, NULL);
	if (!err)
		err = uffd_wp(b->uffd, b->mem, NW * psz,
			      UFFDIO_WRITEPROTECT_MODE_WP);
	if (err)
		return fail(why, "register/protect: %s", strerror(-err));
	for (int i = 0; i < NW; i++) {
		b->w[i].word = (uint64_t *)(b->mem + i * psz);
		b->w[i].val = ((uint64_t)iter << 8) | (i + 1);
		b->w[i].done = 0;
		if (pthread_create(&b->w[i].thread, NULL, one_write_main,
				   &b->w[i]))
			return fail(why, "pthread_create failed");
		b->started++;
	}
	while (got < NW) {
		struct uffd_msg m;

		if (uffd_read_msg(b->uffd, &m, WAIT_MS) != 1)
			return fail(why, "iteration %d: %d of %d writers raised "
				    "a WP fault", iter, got, NW);
		if (m.event != UFFD_EVENT_PAGEFAULT ||
		    !(m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP))
			return fail(why, "unexpected message event %#x flags "
				    "%#llx", m.event,
				    (unsigned long long)m.arg.pagefault.flags);
		got++;
	}
	if (done_count(b->w, NW))
		return fail(why, "a write completed while protected");
	return true;
}

/* Every write is visible and no page is left protected. */
static bool writes_visible(struct blocked *b, char *why)
{
	for (int i = 0; i < NW; i++) {
		if (*b->w[i].word != b->w[i].val)
			return fail(why, "page %d holds %#" PRIx64 ", the "
				    "completed write stored %#" PRIx64, i,
				    *b->w[i].word, b->w[i].val);
		if (page_wp(b->mem + i * psz))
			return fail(why, "page %d still has the uffd-wp bit", i);
	}
	return true;
}

static void unblock_and_free(struct blocked *b)
{
	if (b->uffd >= 0 && b->mem)
		uffd_wake(b->uffd, b->mem, NW * psz);
	if (b->uffd >= 0)
		close(b->uffd);
	b->uffd = -1;
	if (!wait_all(b->w, b->started, WAIT_MS))
		tap_bail("writers still blocked after close()");
	for (int i = 0; i < b->started; i++)
		pthread_join(b->w[i].thread, NULL);
	if (b->mem)
		munmap(b->mem, NW * psz);
}

/* ---- cases --------------------------------------------------------------- */

static bool unregister_missing_wp(char *why)
{
	for (int it = 0; it < ITERS; it++) {
		struct blocked b = { .uffd = -1 };
		int err;
		bool ok = block_writers(&b, UFFDIO_REGISTER_MODE_MISSING |
					UFFDIO_REGISTER_MODE_WP, it, why);

		if (ok) {
			err = uffd_unregister(b.uffd, b.mem, NW * psz);
			if (err)
				ok = fail(why, "unregister: %s", strerror(-err));
			else if (!wait_all(b.w, NW, WAIT_MS))
				ok = fail(why, "iteration %d: %d of %d writers "
					  "still blocked after UNREGISTER", it,
					  NW - done_count(b.w, NW), NW);
			else
				ok = writes_visible(&b, why);
		}
		unblock_and_free(&b);
		if (!ok)
			return false;
	}
	return true;
}

/*
 * UNREGISTER of a MISSING|WP range whose first part is populated and
 * write-protected (clearing its uffd-wp bits takes a while) while a reader
 * starts reading the unpopulated rest: each fault the reader raises before
 * the range is gone must be woken, and none may be left pending.
 */
#define REFAULT_PROTECTED	2048	/* pages */
#define REFAULT_PAGES		32
#define REFAULT_ROUNDS		40

struct reader {
	pthread_t thread;
	volatile char *mem;
	volatile int go, done;
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;

	while (!__atomic_load_n(&r->go, __ATOMIC_SEQ_CST))
		;
	for (int i = 0; i < REFAULT_PAGES; i++)
		(void)r->mem[(long)i * psz];
	__atomic_store_n(&r->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static bool refault_round(int round, char *why)
{
	size_t len = (REFAULT_PROTECTED + REFAULT_PAGES) * psz;
	size_t prot = REFAULT_PROTECTED * psz;
	struct reader r = { 0 };
	struct uffd_msg m;
	bool ok = true, started = false;
	int uffd, err;
	char *mem;

	mem = map_anon_aligned(len, psz);
	if (!mem)
		return fail(why, "mmap: %s", strerror(errno));
	memset(mem, 1, prot);
	uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (uffd < 0) {
		munmap(mem, len);
		return fail(why, "userfaultfd: %s", strerror(-uffd));
	}
	err = uffd_register(uffd, mem, len, UFFDIO_REGISTER_MODE_MISSING |
			    UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		err = uffd_wp(uffd, mem, prot, UFFDIO_WRITEPROTECT_MODE_WP);
	if (err)
		ok = fail(why, "register/protect: %s", strerror(-err));
	r.mem = mem + prot;
	if (ok && pthread_create(&r.thread, NULL, reader_main, &r))
		ok = fail(why, "pthread_create failed");
	started = ok;
	if (ok) {
		__atomic_store_n(&r.go, 1, __ATOMIC_SEQ_CST);
		err = uffd_unregister(uffd, mem, len);
		if (err)
			ok = fail(why, "unregister: %s", strerror(-err));
	}
	if (ok && uffd_read_msg(uffd, &m, 0) == 1)
		ok = fail(why, "round %d: a fault (event %#x, page %ld of the "
			  "unpopulated part) is pending after UNREGISTER "
			  "returned", round, m.event,
			  (long)((char *)(uintptr_t)m.arg.pagefault.address -
				 (mem + prot)) / psz);
	if (ok) {
		long long end = now_ms() + WAIT_MS;

		while (!__atomic_load_n(&r.done, __ATOMIC_SEQ_CST) &&
		       now_ms() < end)
			usleep(1000);
		if (!r.done)
			ok = fail(why, "round %d: the reader is still blocked "
				  "after UNREGISTER", round);
	}
	/* Whatever happened, let the reader finish before freeing. */
	uffd_wake(uffd, mem, len);
	close(uffd);
	if (started)
		pthread_join(r.thread, NULL);
	munmap(mem, len);
	return ok;
}

static bool unregister_vs_refault(char *why)
{
	for (int round = 0; round < REFAULT_ROUNDS; round++)
		if (!refault_round(round, why))
			return false;
	return true;
}

/* Undo the WP registration of B's range (unregister or re-register). */
static int unregister_all(struct blocked *b)
{
	return uffd_unregister(b->uffd, b->mem, NW * psz);
}

static int reregister_missing(struct blocked *b)
{
	return uffd_register(b->uffd, b->mem, NW * psz,
			     UFFDIO_REGISTER_MODE_MISSING, NULL);
}

/* Writers blocked in WP faults of a WP-only range must run on once UNDO
 * (named WHAT) has taken WP from it. */
static bool wp_writers_run_on(char *why, int (*undo)(struct blocked *b),
			      const char *what)
{
	for (int it = 0; it < ITERS; it++) {
		struct blocked b = { .uffd = -1 };
		bool ok = block_writers(&b, UFFDIO_REGISTER_MODE_WP, it, why);
		int err;

		if (ok) {
			err = undo(&b);
			if (err)
				ok = fail(why, "%s: %s", what, strerror(-err));
			else if (!wait_all(b.w, NW, WAIT_MS))
				ok = fail(why, "iteration %d: %d of %d writers "
					  "still blocked after %s", it,
					  NW - done_count(b.w, NW), NW, what);
			else
				ok = writes_visible(&b, why);
		}
		unblock_and_free(&b);
		if (!ok)
			return false;
	}
	return true;
}

static bool unregister_wp_only(char *why)
{
	return wp_writers_run_on(why, unregister_all,
				 "UNREGISTER of their WP-only range");
}

/*
 * Writers blocked in WP faults run on once their range is registered again
 * without WP (MISSING only): the range keeps its context but loses
 * VM_UFFD_WP and its uffd-wp bits, so UFFDIO_WRITEPROTECT can no longer
 * resolve them and only a wakeup can (issue 34, item 7).
 */
static bool reregister_wakes_wp(char *why)
{
	return wp_writers_run_on(why, reregister_missing,
				 "their WP range was registered again for "
				 "MISSING only");
}

/*
 * A reader blocked in a minor fault on a shmem mapping registered for minor
 * faults only runs on once the range is unregistered.
 */
static bool unregister_minor(char *why)
{
	struct one_write r = { 0 };
	struct uffd_msg m;
	char *mem = MAP_FAILED, *alias = MAP_FAILED;
	int fd, uffd = -1, err;
	bool ok = true, started = false;

	fd = memfd_create("race-lifetime-minor", 0);
	if (fd < 0 || ftruncate(fd, psz))
		return fail(why, "memfd: %s", strerror(errno));
	mem = mmap(NULL, psz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	alias = mmap(NULL, psz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (mem == MAP_FAILED || alias == MAP_FAILED)
		ok = fail(why, "mmap: %s", strerror(errno));
	if (ok) {
		/* In the page cache, not mapped at mem: a minor fault. */
		memset(alias, 7, psz);
		uffd = uffd_open(UFFD_FEATURE_MINOR_SHMEM, NULL);
		if (uffd < 0)
			ok = fail(why, "userfaultfd: %s", strerror(-uffd));
	}
	if (ok && (err = uffd_register(uffd, mem, psz,
				       UFFDIO_REGISTER_MODE_MINOR, NULL)))
		ok = fail(why, "register: %s", strerror(-err));
	/* The "writer" stores what the page already holds: a read fault. */
	r.word = (uint64_t *)mem;
	r.val = 0x0707070707070707ULL;
	if (ok && pthread_create(&r.thread, NULL, one_write_main, &r))
		ok = fail(why, "pthread_create failed");
	started = ok;
	if (ok && uffd_read_msg(uffd, &m, WAIT_MS) != 1)
		ok = fail(why, "no minor fault reported");
	else if (ok && (m.event != UFFD_EVENT_PAGEFAULT ||
			!(m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR)))
		ok = fail(why, "unexpected message event %#x flags %#llx",
			  m.event, (unsigned long long)m.arg.pagefault.flags);
	if (ok && r.done)
		ok = fail(why, "the access completed while its minor fault "
			  "was pending");
	if (ok && (err = uffd_unregister(uffd, mem, psz)))
		ok = fail(why, "unregister: %s", strerror(-err));
	if (ok && !wait_all(&r, 1, WAIT_MS))
		ok = fail(why, "the faulting thread is still blocked after "
			  "UNREGISTER of its minor-only range");
	if (ok && *(uint64_t *)alias != r.val)
		ok = fail(why, "the page holds %#" PRIx64 " after the store",
			  *(uint64_t *)alias);
	if (uffd >= 0) {
		uffd_wake(uffd, mem, psz);
		close(uffd);
	}
	if (started)
		pthread_join(r.thread, NULL);
	if (mem != MAP_FAILED)
		munmap(mem, psz);
	if (alias != MAP_FAILED)
		munmap(alias, psz);
	close(fd);
	return ok;
}

static bool close_blocked(char *why)
{
	for (int it = 0; it < ITERS; it++) {
		struct blocked b = { .uffd = -1 };
		bool ok = block_writers(&b, it & 1 ? UFFDIO_REGISTER_MODE_WP :
					UFFDIO_REGISTER_MODE_WP |
					UFFDIO_REGISTER_MODE_MISSING, it, why);

		if (ok) {
			close(b.uffd);
			b.uffd = -1;
			if (!wait_all(b.w, NW, WAIT_MS))
				ok = fail(why, "iteration %d: %d writers still "
					  "blocked after close()", it,
					  NW - done_count(b.w, NW));
			else
				ok = writes_visible(&b, why);
		}
		unblock_and_free(&b);
		if (!ok)
			return false;
	}
	return true;
}

/* ---- close while a resolver is busy ------------------------------------ */

#define SEQ_WRITES	400

struct seq_writer {
	pthread_t thread;
	volatile uint64_t *word;
	volatile uint64_t last;		/* last store that returned */
	volatile int done;
};

static void *seq_writer_main(void *arg)
{
	struct seq_writer *w = arg;

	for (uint64_t v = 1; v <= SEQ_WRITES; v++) {
		*w->word = v;
		w->last = v;
	}
	__atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

struct busy_resolver {
	pthread_t thread;
	int uffd;
	char *mem;
	volatile int stop;
	volatile int resolved;
};

/* Unprotect the faulting page, then protect the whole region again so the
 * next write faults too. */
static void *busy_resolver_main(void *arg)
{
	struct busy_resolver *r = arg;

	while (!r->stop) {
		struct uffd_msg m;
		unsigned long a;

		if (uffd_read_msg(r->uffd, &m, 20) != 1)
			continue;
		if (m.event != UFFD_EVENT_PAGEFAULT)
			continue;
		a = m.arg.pagefault.address & ~(psz - 1);
		if (uffd_wp(r->uffd, (void *)a, psz, 0))
			uffd_wake(r->uffd, (void *)a, psz);
		r->resolved++;
		uffd_wp(r->uffd, r->mem, NW * psz, UFFDIO_WRITEPROTECT_MODE_WP);
	}
	return NULL;
}

static bool close_vs_resolver(char *why)
{
	int total_resolved = 0;

	for (int it = 0; it < ITERS; it++) {
		struct busy_resolver r = { 0 };
		struct seq_writer w[NW];
		char *mem = map_anon_aligned(NW * psz, psz);
		bool ok = true;
		int uffd, err;

		if (!mem)
			return fail(why, "mmap: %s", strerror(errno));
		memset(mem, 0, NW * psz);
		uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
		if (uffd < 0)
			return fail(why, "userfaultfd: %s", strerror(-uffd));
		err = uffd_register(uffd, mem, NW * psz, UFFDIO_REGISTER_MODE_WP,
				    NULL);
		if (!err)
			err = uffd_wp(uffd, mem, NW * psz,
				      UFFDIO_WRITEPROTECT_MODE_WP);
		if (err)
			return fail(why, "register/protect: %s", strerror(-err));
		r.uffd = uffd;
		r.mem = mem;
		pthread_create(&r.thread, NULL, busy_resolver_main, &r);
		for (int i = 0; i < NW; i++) {
			w[i] = (struct seq_writer){ .word = (uint64_t *)(mem + i * psz) };
			pthread_create(&w[i].thread, NULL, seq_writer_main, &w[i]);
		}
		/* Let some faults go round, then pull the fd away. */
		for (long long end = now_ms() + WAIT_MS;
		     r.resolved < 4 * (it + 1) && r.resolved < 40 &&
		     now_ms() < end;)
			usleep(500);
		close(uffd);
		for (int i = 0; i < NW; i++) {
			long long end = now_ms() + WAIT_MS;

			while (!w[i].done && now_ms() < end)
				usleep(1000);
			if (!w[i].done && ok)
				ok = fail(why, "iteration %d: writer %d blocked "
					  "after close() at write %" PRIu64, it,
					  i, w[i].last + 1);
		}
		r.stop = 1;
		pthread_join(r.thread, NULL);
		total_resolved += r.resolved;
		for (int i = 0; i < NW; i++) {
			if (!w[i].done)
				tap_bail("writer blocked for good after close()");
			pthread_join(w[i].thread, NULL);
			if (ok && *w[i].word != SEQ_WRITES)
				ok = fail(why, "writer %d's page holds %" PRIu64
					  " after %d writes", i, *w[i].word,
					  SEQ_WRITES);
			if (ok && page_wp(mem + i * psz))
				ok = fail(why, "page %d still protected after "
					  "close()", i);
		}
		munmap(mem, NW * psz);
		if (!ok)
			return false;
	}
	tap_diag("close-vs-resolver: %d faults resolved before the closes",
		 total_resolved);
	return true;
}

/* ---- re-registration without MODE_WP ------------------------------------ */

static bool written_by_scan(char *page)
{
	struct page_region v[2];
	struct pm_scan_arg a = {
		.size = sizeof(a), .start = (uintptr_t)page,
		.end = (uintptr_t)page + psz, .vec = (uintptr_t)v, .vec_len = 2,
		.category_mask = PAGE_IS_WRITTEN, .return_mask = PAGE_IS_WRITTEN,
	};
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	long n = fd < 0 ? -1 : ioctl(fd, PAGEMAP_SCAN, &a);

	if (fd >= 0)
		close(fd);
	return n == 1;
}

static bool reregister_without_wp(char *why)
{
	char *page = map_anon_aligned(psz, psz);
	int uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL), async;
	struct one_write w = { 0 };
	bool ok = true;
	int err;

	if (!page || uffd < 0)
		return fail(why, "setup: %s", strerror(page ? -uffd : errno));
	memset(page, 'A', psz);
	err = uffd_register(uffd, page, psz, UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		err = uffd_wp(uffd, page, psz, UFFDIO_WRITEPROTECT_MODE_WP);
	if (!err)	/* same uffd, MISSING only: VM_UFFD_WP goes */
		err = uffd_register(uffd, page, psz,
				    UFFDIO_REGISTER_MODE_MISSING, NULL);
	if (err)
		return fail(why, "register WP, protect, register MISSING: %s",
			    strerror(-err));
	/* The range is no longer WP-registered: the write must not block. */
	w.word = (uint64_t *)page;
	w.val = 0x4242;
	pthread_create(&w.thread, NULL, one_write_main, &w);
	if (!wait_all(&w, 1, WAIT_MS)) {
		ok = fail(why, "write blocked on a range registered MISSING "
			  "only");
		uffd_wake(uffd, page, psz);
		close(uffd);
		uffd = -1;
	}
	pthread_join(w.thread, NULL);
	if (ok && page_wp(page))
		ok = fail(why, "after UFFDIO_REGISTER without MODE_WP over a "
			  "protected page and a write that completed, pagemap "
			  "still shows the uffd-wp bit (%#" PRIx64 "): the bit "
			  "outlived VM_UFFD_WP", pagemap_entry(page));
	if (uffd >= 0) {
		uffd_unregister(uffd, page, psz);
		close(uffd);
	}
	/* Consequence for a new async tracker on the same range. */
	async = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			  UFFD_FEATURE_WP_ASYNC, NULL);
	if (async >= 0 &&
	    !uffd_register(async, page, psz, UFFDIO_REGISTER_MODE_WP, NULL)) {
		*(volatile char *)page = 'C';
		tap_diag("reregister: after UNREGISTER and a new WP_ASYNC "
			 "registration, a write leaves pagemap %#" PRIx64
			 "; PAGEMAP_SCAN %s it written", pagemap_entry(page),
			 written_by_scan(page) ? "reports" : "does NOT report");
	}
	if (async >= 0)
		close(async);
	munmap(page, psz);
	return ok;
}

/*
 * A re-registration without WP that fails halfway (the split of the vma
 * hits vm.max_map_count) leaves the range registered for WP: its pages
 * must keep their protection, so that a write still faults.  Before the
 * fix the bits were dropped before the vma was changed (review of
 * 2026-12-07).
 */
static int map_count(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0, c;

	if (!f)
		return -1;
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

static bool reregister_failure_keeps_wp(char *why)
{
	char *mem = map_anon_aligned(3 * psz, psz);
	int uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL), err;
	char old[32] = "", lim[32];
	FILE *f;
	bool ok = true;

	if (!mem || uffd < 0)
		return fail(why, "setup: %s", strerror(mem ? -uffd : errno));
	memset(mem, 'A', 3 * psz);
	err = uffd_register(uffd, mem, 3 * psz, UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		err = uffd_wp(uffd, mem, 3 * psz, UFFDIO_WRITEPROTECT_MODE_WP);
	if (err)
		return fail(why, "register/protect: %s", strerror(-err));
	f = fopen("/proc/sys/vm/max_map_count", "r");
	if (!f || !fgets(old, sizeof(old), f))
		return fail(why, "read vm.max_map_count: %s", strerror(errno));
	fclose(f);
	/* No room for the two vmas the split of the middle page needs. */
	snprintf(lim, sizeof(lim), "%d\n", map_count());
	f = fopen("/proc/sys/vm/max_map_count", "w");
	if (!f || fputs(lim, f) < 0 || fclose(f))
		return fail(why, "write vm.max_map_count: %s", strerror(errno));
	err = uffd_register(uffd, mem + psz, psz, UFFDIO_REGISTER_MODE_MISSING,
			    NULL);
	f = fopen("/proc/sys/vm/max_map_count", "w");
	if (f) {
		fputs(old, f);
		fclose(f);
	}
	if (err != -ENOMEM)
		ok = fail(why, "re-registering the middle page with the map "
			  "count full returned %s, not ENOMEM",
			  err ? strerror(-err) : "success");
	else if (!page_wp(mem + psz))
		ok = fail(why, "the failed re-registration left the range "
			  "registered for WP but dropped its page's uffd-wp "
			  "bit (pagemap %#" PRIx64 "): its writes would not "
			  "fault", pagemap_entry(mem + psz));
	close(uffd);
	munmap(mem, 3 * psz);
	return ok;
}

/*
 * Re-registering a WP|MISSING shmem range for MISSING|MINOR drops WP and
 * wakes the writers blocked in its WP faults, and only those: a reader
 * blocked in a missing fault whose message the monitor has read stays
 * blocked, and no second message comes for it (a wakeup of every fault
 * of the range made it fault again and queue a duplicate).
 */
static bool reregister_wakes_only_wp(char *why)
{
	struct one_write r = { 0 };
	struct uffd_msg m;
	uint64_t got = 0;
	int fd, uffd, err, n;
	char *mem;
	bool ok = true;

	uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			 UFFD_FEATURE_WP_HUGETLBFS_SHMEM |
			 UFFD_FEATURE_MINOR_SHMEM, &got);
	if (uffd < 0)
		return fail(why, "userfaultfd: %s", strerror(-uffd));
	fd = memfd_create("race-lifetime-rereg", 0);
	if (fd < 0 || ftruncate(fd, 2 * psz))
		return fail(why, "memfd: %s", strerror(errno));
	mem = mmap(NULL, 2 * psz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (mem == MAP_FAILED)
		return fail(why, "mmap: %s", strerror(errno));
	err = uffd_register(uffd, mem, 2 * psz, UFFDIO_REGISTER_MODE_WP |
			    UFFDIO_REGISTER_MODE_MISSING, NULL);
	if (err)
		return fail(why, "register WP|MISSING: %s", strerror(-err));
	/* A reader of the hole: a missing fault. */
	r.word = (uint64_t *)mem;
	r.read = true;
	pthread_create(&r.thread, NULL, one_write_main, &r);
	n = uffd_read_msg(uffd, &m, WAIT_MS);
	if (n != 1 || m.event != UFFD_EVENT_PAGEFAULT ||
	    (m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP))
		ok = fail(why, "no missing-fault message for the reader");
	if (ok) {
		err = uffd_register(uffd, mem, 2 * psz,
				    UFFDIO_REGISTER_MODE_MISSING |
				    UFFDIO_REGISTER_MODE_MINOR, NULL);
		if (err)
			ok = fail(why, "register MISSING|MINOR: %s",
				  strerror(-err));
	}
	if (ok) {
		n = uffd_read_msg(uffd, &m, 1000);
		if (n == 1)
			ok = fail(why, "a second message (event %u, flags "
				  "%#llx) for the reader's missing fault "
				  "after the re-registration: it was woken",
				  m.event, (unsigned long long)
				  m.arg.pagefault.flags);
		else if (wait_all(&r, 1, 200))
			ok = fail(why, "the reader ran on without an answer");
	}
	/* Answer it: a zero page for the hole. */
	uffd_wake(uffd, mem, psz);
	uffd_zeropage(uffd, mem, psz, 0);
	close(uffd);
	if (!wait_all(&r, 1, WAIT_MS))
		tap_bail("the reader stayed blocked after close()");
	pthread_join(r.thread, NULL);
	munmap(mem, 2 * psz);
	close(fd);
	return ok;
}

/* ---- the write-log ring ------------------------------------------------- */

static bool ring_vs_close(char *why)
{
	enum { PAGES = 64 };
	for (int it = 0; it < ITERS; it++) {
		struct uffdio_ring_setup rs = { .entries = 64 };
		struct uffd_ring_header *h;
		struct writer wr;
		char *mem = map_anon_aligned(PAGES * psz, psz);
		uint64_t got = 0, seen = 0;
		int uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP |
				     UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING,
				     &got), err;

		if (!mem || uffd < 0)
			return fail(why, "setup: %s", strerror(mem ? -uffd : errno));
		if (ioctl(uffd, UFFDIO_RING_SETUP, &rs))
			return fail(why, "RING_SETUP: %s", strerror(errno));
		h = mmap(NULL, rs.mmap_size, PROT_READ, MAP_SHARED, uffd, 0);
		if (h == MAP_FAILED)
			return fail(why, "ring mmap: %s", strerror(errno));
		err = uffd_register(uffd, mem, PAGES * psz,
				    UFFDIO_REGISTER_MODE_WP, NULL);
		if (!err)
			err = uffd_wp(uffd, mem, PAGES * psz,
				      UFFDIO_WRITEPROTECT_MODE_WP);
		if (err)
			return fail(why, "register/protect: %s", strerror(-err));
		writer_start(&wr, mem, PAGES * psz, (char)(it + 1));
		/* Harvest a few rounds, then close under the writer. */
		for (int round = 0; round < 3 + it % 3; round++) {
			struct uffdio_ring_reset rr = { 0 };
			uint64_t p = __atomic_load_n(&h->producer,
						     __ATOMIC_ACQUIRE);

			if (p < h->consumer)
				return fail(why, "producer %llu < consumer %llu",
					    (unsigned long long)p,
					    (unsigned long long)h->consumer);
			rr.consumer = p;
			/* the count before the flag (it is published after) */
			rr.overflows = __atomic_load_n(&h->overflows,
						       __ATOMIC_ACQUIRE);
			if (__atomic_load_n(&h->flags, __ATOMIC_ACQUIRE) &
			    UFFD_RING_OVERFLOW)
				rr.flags = UFFDIO_RING_RESET_CLEAR_OVERFLOW;
			if (ioctl(uffd, UFFDIO_RING_RESET, &rr))
				return fail(why, "RING_RESET to %llu: %s",
					    (unsigned long long)p,
					    strerror(errno));
			seen = p;
		}
		close(uffd);
		/* The mapping outlives the fd; the header stays readable. */
		if (h->producer < seen)
			return fail(why, "producer went back after close");
		if (!writer_wait(&wr, WAIT_MS))
			return fail(why, "writer blocked after close()");
		for (int i = 0; i < PAGES; i++)
			if (mem[i * psz] != (char)(it + 1))
				return fail(why, "page %d lost its write", i);
		munmap(h, rs.mmap_size);
		munmap(mem, PAGES * psz);
	}
	return true;
}

/*
 * Issue 34, item 6: a truncation walks the file's mappings (i_mmap) without
 * the mmap lock of the processes it zaps, and logs the protected pages it
 * takes away in the ring of each mapping's context.  A process A that
 * tracks a shared memfd with a ring is killed; while its mm is exiting
 * (mm_users is zero, its vmas still in i_mmap) a process B that holds the
 * last reference to the userfaultfd closes it, so the context is freed
 * without its vmas being cleared; the parent punches holes in the memfd
 * all the while.  The kernel must not follow the freed context: under
 * KASAN (the debug lane) a use-after-free is a console report, which fails
 * the lane; here a hang or a crash fails the case.
 */
#define DYING_PAGES	1024
#define DYING_ITERS	40	/* at most, */
#define DYING_MS	20000	/* or as many as fit (at least 3) */

static int dying_child(int memfd, int ready_w, int close_r)
{
	struct uffdio_ring_setup rs = { .entries = 64 };
	uint64_t got = 0;
	char *mem, c = 'r';
	int uffd, err;
	pid_t b;

	uffd = uffd_open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING |
			 UFFD_FEATURE_WP_HUGETLBFS_SHMEM, &got);
	if (uffd < 0 || ioctl(uffd, UFFDIO_RING_SETUP, &rs) ||
	    mmap(NULL, rs.mmap_size, PROT_READ, MAP_SHARED, uffd, 0) ==
	    MAP_FAILED)
		return 2;
	mem = mmap(NULL, DYING_PAGES * psz, PROT_READ | PROT_WRITE,
		   MAP_SHARED, memfd, 0);
	if (mem == MAP_FAILED)
		return 3;
	memset(mem, 7, DYING_PAGES * psz);
	err = uffd_register(uffd, mem, DYING_PAGES * psz,
			    UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		err = uffd_wp(uffd, mem, DYING_PAGES * psz,
			      UFFDIO_WRITEPROTECT_MODE_WP);
	if (err)
		return 4;
	/* B: holds the userfaultfd until told to close it. */
	b = fork();
	if (b < 0)
		return 5;
	if (b == 0) {
		if (read(close_r, &c, 1) != 1)
			_exit(1);
		close(uffd);
		_exit(0);
	}
	close(uffd);
	if (write(ready_w, &c, 1) != 1)
		return 6;
	for (;;)
		pause();
}

static bool ring_dying_mm(char *why)
{
	uint64_t got = 0;
	int fd = uffd_open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING |
			   UFFD_FEATURE_WP_HUGETLBFS_SHMEM, &got);

	if (fd < 0)
		return fail(why, "userfaultfd: %s", strerror(-fd));
	close(fd);
	long long until = now_ms() + DYING_MS;
	int it;

	for (it = 0; it < DYING_ITERS && (it < 3 || now_ms() < until); it++) {
		int ready[2], closer[2], memfd, st;
		pid_t a;
		char c;

		memfd = memfd_create("race-lifetime-dying", 0);
		if (memfd < 0 || ftruncate(memfd, DYING_PAGES * psz) ||
		    pipe(ready) || pipe(closer))
			return fail(why, "setup: %s", strerror(errno));
		a = fork();
		if (a < 0)
			return fail(why, "fork: %s", strerror(errno));
		if (a == 0)
			_exit(dying_child(memfd, ready[1], closer[0]));
		close(ready[1]);
		close(closer[0]);
		if (read(ready[0], &c, 1) != 1) {
			waitpid(a, &st, 0);
			return fail(why, "iteration %d: the tracking child "
				    "failed to set up (status %#x)", it, st);
		}
		/* A's mm starts exiting; then B drops the last reference. */
		kill(a, SIGKILL);
		if (write(closer[1], &c, 1) != 1)
			return fail(why, "pipe: %s", strerror(errno));
		for (int k = 0; k < 64; k++) {
			off_t at = (off_t)((k * 37) % DYING_PAGES) * psz;

			fallocate(memfd, FALLOC_FL_PUNCH_HOLE |
				  FALLOC_FL_KEEP_SIZE, at, 16 * psz);
		}
		waitpid(a, &st, 0);
		/* B was A's child: reparented; it exits once it closed. */
		close(ready[0]);
		close(closer[1]);
		close(memfd);
	}
	tap_diag("ring-context-freed-while-mm-exits: %d iterations", it);
	return true;
}

/* ---- main ---------------------------------------------------------------- */

static void run(const char *name, bool (*fn)(char *why))
{
	char why[WHY_LEN] = "";

	tap_check(fn(why), name, "%s", why);
}

int main(void)
{
	uint64_t got = 0;
	int fd;

	psz = page_size();
	/* KASAN kernels (the debug lane) take minutes for the whole plan */
	watchdog(500);
	tap_plan(12);
	fd = uffd_open(0, &got);
	if (fd < 0)
		tap_bail("userfaultfd: %s", strerror(-fd));
	close(fd);
	run("lifetime-unregister-wakes-missing-wp", unregister_missing_wp);
	run("lifetime-unregister-no-fault-pending-after",
	    unregister_vs_refault);
	run("lifetime-unregister-wakes-wp-only", unregister_wp_only);
	run("lifetime-reregister-without-wp-wakes-writers",
	    reregister_wakes_wp);
	if (got & UFFD_FEATURE_MINOR_SHMEM)
		run("lifetime-unregister-wakes-minor", unregister_minor);
	else
		tap_skip("lifetime-unregister-wakes-minor",
			 "kernel does not report UFFD_FEATURE_MINOR_SHMEM");
	run("lifetime-close-wakes-blocked-writers", close_blocked);
	run("lifetime-close-vs-busy-resolver", close_vs_resolver);
	run("lifetime-reregister-without-wp-clears-bits",
	    reregister_without_wp);
	run("lifetime-reregister-failure-keeps-protection",
	    reregister_failure_keeps_wp);
	if (got & UFFD_FEATURE_MINOR_SHMEM)
		run("lifetime-reregister-wakes-only-wp-faults",
		    reregister_wakes_only_wp);
	else
		tap_skip("lifetime-reregister-wakes-only-wp-faults",
			 "kernel does not report UFFD_FEATURE_MINOR_SHMEM");
	if (got & UFFD_FEATURE_WP_RING)
		run("lifetime-ring-harvest-vs-writers-vs-close", ring_vs_close);
	else
		tap_skip("lifetime-ring-harvest-vs-writers-vs-close",
			 "kernel does not report UFFD_FEATURE_WP_RING");
	if (got & UFFD_FEATURE_WP_RING)
		run("lifetime-ring-context-freed-while-mm-exits",
		    ring_dying_mm);
	else
		tap_skip("lifetime-ring-context-freed-while-mm-exits",
			 "kernel does not report UFFD_FEATURE_WP_RING");
	return tap_done();
}
