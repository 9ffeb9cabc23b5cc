// SPDX-License-Identifier: GPL-2.0
/*
 * lib-session-async: a session between snapshots in async mode, the
 * write-log ring as its dirty set (lib/session-async.c).
 *
 *  - session-async-between: four writer threads write pages of a 4 KiB
 *    arena between snapshots (each page by one thread, chosen by a seed),
 *    while the main thread asks uffdwp_session_dirty() and
 *    uffdwp_session_dirty_ranges() over and over (folding the ring while
 *    the kernel logs into it).  After the writers stop: the dirty count and
 *    the ranges are exactly the pages written, the delta stores exactly
 *    those, and base + deltas equal memory, round after round (odd rounds
 *    ask nothing: the instant harvests the whole ring).
 *    UFFDWP_STATS_ASYNC_BETWEEN is set after each snapshot on a kernel with
 *    UFFDIO_SET_MODE and the ring, and clear on one without (where the
 *    same exactness holds in sync mode);
 *  - session-async-ring-overflow: the same with the ring cut to 64
 *    entries (vm.uffd_ring_max_entries), so that it overflows and the
 *    dirty set comes from PAGEMAP_SCAN; then a round small enough for the
 *    ring's entries again;
 *  - session-async-huge-stays-sync: with a PMD-mapped block in the regions
 *    the session stays in sync mode (an async write would split the
 *    block), and the block is still PMD-mapped after a write and a delta;
 *  - session-async-dirty-in-signal: uffdwp_session_dirty() called from a
 *    signal handler that interrupts it: no hang, exact counts;
 *  - session-fork-child-ring-mapping: a fork child freeing its copies of a
 *    session and a ring tracker leaves its own memory at the ring's
 *    address (the ring is not inherited);
 *  - session-async-count-lock-busy, -no-pagemap, -add-file-region: the
 *    review's findings (the count without the lock after an overflow, a
 *    session that could not scan an overflow, a file mapping that async
 *    mode would register).
 * Replayable: SEED=N in the environment (the seed is printed).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib_test.h"
/* the session's internals, for the cases that hold its lock or take its
 * pagemap away (lib/snapshot.h) */
#include "../lib/snapshot.h"

#define WRITERS	4
#define ROUNDS	6

static long psz;
static uint64_t seed;

static bool capable(void)
{
	return f.set_mode && f.wp_ring && f.wp_unpopulated;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

struct arena {
	char *p;
	size_t pages;
	unsigned int permille;	/* share of pages a round writes */
	uint64_t round;
};

/* Whether ROUND writes PAGE, and which thread. */
static bool writes(const struct arena *a, size_t page, unsigned int *who)
{
	uint64_t h = mix(seed ^ (a->round << 32) ^ page);

	*who = (unsigned int)(h >> 40) % WRITERS;
	return h % 1000 < a->permille;
}

struct page_writer {
	struct arena *a;
	unsigned int id;
	pthread_t th;
};

static void *writer_main(void *arg)
{
	struct page_writer *w = arg;
	struct arena *a = w->a;
	unsigned int who;

	for (size_t i = 0; i < a->pages; i++)
		if (writes(a, i, &who) && who == w->id) {
			/* two stores to the page: the second finds it
			 * writable (no second entry, nothing lost) */
			a->p[i * psz + (a->round % 64) * 8] ^= (char)(a->round | 1);
			a->p[i * psz + psz - 1] = (char)a->round;
		}
	return NULL;
}

/* Pages the ranges cover, or -errno. */
static ssize_t range_pages(struct uffdwp_session *ss)
{
	struct uffdwp_region r[256];
	ssize_t n = uffdwp_session_dirty_ranges(ss, r, 256), total = 0;

	if (n < 0 || n > 256)
		return n < 0 ? n : -E2BIG;
	for (ssize_t i = 0; i < n; i++)
		total += (ssize_t)(r[i].len / (size_t)psz);
	return total;
}

static bool async_now(struct uffdwp_session *ss)
{
	struct uffdwp_stats_v v = { .size = sizeof(v) };

	return !uffdwp_session_stats_v(ss, &v) &&
	       (v.flags & UFFDWP_STATS_ASYNC_BETWEEN);
}

/*
 * ROUNDS rounds of PERMILLE of PAGES written between snapshots.  Fails the
 * case NAME on the first difference.  A ring of 64 entries when SMALL_RING
 * (the caller set the sysctl); the last round then writes 20 pages.
 */
static void run_rounds(const char *name, size_t pages, unsigned int permille,
		       bool small_ring)
{
	struct arena a = { .pages = pages, .permille = permille };
	size_t len = pages * (size_t)psz;
	char *img = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r, dst = { img, len };
	struct uffdwp_snapshot_stats st;
	struct uffdwp_session *ss = NULL;
	int fds[ROUNDS + 1];
	char why[200] = "";
	bool async_seen = false;
	uint64_t overflows = 0;
	int err, round;

	a.p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	for (int i = 0; i <= ROUNDS; i++)
		fds[i] = memfd_create("snap", MFD_CLOEXEC);
	err = a.p == MAP_FAILED || img == MAP_FAILED ? -ENOMEM : 0;
	if (!err) {
		madvise(a.p, len, MADV_NOHUGEPAGE);
		fill(a.p, len, 7);
		r = (struct uffdwp_region){ a.p, len };
		err = uffdwp_session_new(&ss, &r, 1, NULL);
	}
	if (!err)
		err = uffdwp_session_snapshot(ss, fds[0], 0);
	if (!err)
		err = uffdwp_session_wait(ss, 120000);
	for (round = 1; !err && round <= ROUNDS && !why[0]; round++) {
		struct page_writer w[WRITERS];
		size_t want = 0;
		ssize_t dirty, ranges, folds = 0;
		unsigned int who;
		bool last = round == ROUNDS, ask = round % 2 == 0;

		if (async_now(ss) != capable()) {
			snprintf(why, sizeof(why),
				 "round %d: async between snapshots %s on a kernel %s UFFDIO_SET_MODE and the ring",
				 round, capable() ? "off" : "on",
				 capable() ? "with" : "without");
			break;
		}
		async_seen |= async_now(ss);
		a.round = (uint64_t)round;
		if (small_ring && last)
			a.permille = (unsigned int)(20 * 1000 / pages) + 1;
		for (size_t i = 0; i < pages; i++)
			want += writes(&a, i, &who);
		for (unsigned int t = 0; t < WRITERS && !err; t++) {
			w[t] = (struct page_writer){ &a, t, 0 };
			err = -pthread_create(&w[t].th, NULL, writer_main,
					      &w[t]);
			if (err)
				while (t--)
					pthread_join(w[t].th, NULL);
		}
		if (err)
			break;
		/* folds racing with the kernel's logging (even rounds; odd
		 * ones leave the whole ring to the instant's harvest) */
		for (int k = 0; ask && k < 50; k++) {
			dirty = uffdwp_session_dirty(ss);
			ranges = range_pages(ss);
			if (dirty < 0 || (ranges < 0 && ranges != -E2BIG))
				folds = dirty < 0 ? dirty : ranges;
		}
		for (unsigned int t = 0; t < WRITERS; t++)
			pthread_join(w[t].th, NULL);
		dirty = ask ? uffdwp_session_dirty(ss) : (ssize_t)want;
		ranges = ask ? range_pages(ss) : (ssize_t)want;
		if (folds < 0 || dirty != (ssize_t)want ||
		    (ranges != (ssize_t)want && ranges != -E2BIG)) {
			snprintf(why, sizeof(why),
				 "round %d: %zu pages written, dirty %zd, ranges cover %zd, an earlier call %zd",
				 round, want, dirty, ranges, folds);
			break;
		}
		err = uffdwp_session_snapshot(ss, fds[round], 0);
		if (!err)
			err = uffdwp_session_wait(ss, 120000);
		if (!err)
			err = uffdwp_session_stats(ss, &st);
		if (!err && st.pages != want)
			snprintf(why, sizeof(why),
				 "round %d: the delta stores %llu pages, %zu were written",
				 round, (unsigned long long)st.pages, want);
		if (!err && !why[0] &&
		    (load_chain(fds, round + 1, &dst, 1, NULL) ||
		     memcmp(img, a.p, len)))
			snprintf(why, sizeof(why),
				 "round %d: base + deltas differ from memory",
				 round);
	}
	/* The small ring must really have overflowed (the scan path ran). */
	if (!err && small_ring) {
		const struct uffd_ring_header *h =
			((struct uffdwp_snapshot *)ss)->ring;

		overflows = h ? __atomic_load_n(&h->overflows,
						__ATOMIC_ACQUIRE) : 0;
	}
	uffdwp_session_free(ss);
	tap_check(!err && !why[0] && async_seen == capable() &&
		  (!small_ring || overflows > 0), name,
		  "err %d, %s, ring overflows %llu (seed %llu)", err,
		  why[0] ? why : "exact", (unsigned long long)overflows,
		  (unsigned long long)seed);
	for (int i = 0; i <= ROUNDS; i++)
		close(fds[i]);
	if (a.p != MAP_FAILED)
		munmap(a.p, len);
	if (img != MAP_FAILED)
		munmap(img, len);
}

static void t_between(void)
{
	if (skip_no_wp("session-async-between"))
		return;
	run_rounds("session-async-between", 4096, 40, false);
}

static struct uffdwp_snapshot *inside(struct uffdwp_session *ss)
{
	return (struct uffdwp_snapshot *)ss;
}

/* Write N pages of P from FIRST, each once. */
static void write_pages(char *p, size_t first, size_t n)
{
	for (size_t i = first; i < first + n; i++)
		p[i * psz] ^= 0x11;
}

/* One snapshot into FD, waited for; its page count in *PAGES. */
static int snap_pages(struct uffdwp_session *ss, int fd, uint64_t *pages)
{
	struct uffdwp_snapshot_stats st = { 0 };
	int err = uffdwp_session_snapshot(ss, fd, 0);

	if (!err)
		err = uffdwp_session_wait(ss, 120000);
	if (!err)
		err = uffdwp_session_stats(ss, &st);
	*pages = st.pages;
	return err;
}

struct lock_holder {
	struct uffdwp_snapshot *s;
	pthread_t th;
	atomic_int state;	/* 1 held, 2 release asked, 3 released */
};

static void *holder_main(void *arg)
{
	struct lock_holder *h = arg;

	pthread_mutex_lock(&h->s->instant_lock);
	atomic_store(&h->state, 1);
	while (atomic_load(&h->state) != 2)
		usleep(1000);
	pthread_mutex_unlock(&h->s->instant_lock);
	atomic_store(&h->state, 3);
	return NULL;
}

/*
 * session-async-count-lock-busy (ring cut to 64 entries): while another
 * thread holds the session's lock (as when a signal handler interrupted
 * its holder), uffdwp_session_dirty() counts aside: 30 pages written (in
 * the ring's entries), then 300 (the ring overflowed: a scan), and 300
 * again once the lock is free (the fold); the delta stores the 300.
 */
static void t_count_lock_busy(void)
{
	const char *name = "session-async-count-lock-busy";
	size_t pages = 2048, len = pages * (size_t)psz;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { p, len };
	struct uffdwp_session *ss = NULL;
	struct lock_holder h = { 0 };
	int fds[2] = { memfd_create("a", MFD_CLOEXEC),
		       memfd_create("b", MFD_CLOEXEC) };
	ssize_t few = -1, many = -1, freed = -1;
	uint64_t base = 0, delta = 0;
	bool async = false;
	int err;

	madvise(p, len, MADV_NOHUGEPAGE);
	fill(p, len, 8);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = snap_pages(ss, fds[0], &base);
	if (!err)
		async = async_now(ss);
	if (!err) {
		h.s = inside(ss);
		err = -pthread_create(&h.th, NULL, holder_main, &h);
	}
	if (!err) {
		while (atomic_load(&h.state) != 1)
			usleep(1000);
		write_pages(p, 100, 30);
		few = uffdwp_session_dirty(ss);
		write_pages(p, 500, 270);
		many = uffdwp_session_dirty(ss);
		atomic_store(&h.state, 2);
		pthread_join(h.th, NULL);
		freed = uffdwp_session_dirty(ss);
		err = snap_pages(ss, fds[1], &delta);
	}
	uffdwp_session_free(ss);
	tap_check(!err && async && few == 30 && many == 300 && freed == 300 &&
		  delta == 300, name,
		  "err %d, async %d; with the lock busy: %zd (want 30), after the overflow %zd (want 300); free: %zd (want 300); delta %llu pages",
		  err, async, few, many, freed, (unsigned long long)delta);
	close(fds[0]);
	close(fds[1]);
	munmap(p, len);
}

/*
 * session-async-no-pagemap (ring cut to 64 entries): a session that
 * cannot read /proc/self/pagemap could not scan after an overflow, so it
 * stays in sync mode; 300 pages written are all in the next delta.
 */
static void t_no_pagemap(void)
{
	const char *name = "session-async-no-pagemap";
	size_t pages = 2048, len = pages * (size_t)psz;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *img = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_session *ss = NULL;
	int fds[2] = { memfd_create("a", MFD_CLOEXEC),
		       memfd_create("b", MFD_CLOEXEC) };
	uint64_t base = 0, delta = 0;
	ssize_t dirty = -1;
	bool async = true, same = false;
	int err;

	madvise(p, len, MADV_NOHUGEPAGE);
	fill(p, len, 9);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err && inside(ss)->pagemap_fd >= 0) {
		close(inside(ss)->pagemap_fd);
		inside(ss)->pagemap_fd = -1;
	}
	if (!err)
		err = snap_pages(ss, fds[0], &base);
	if (!err) {
		async = async_now(ss);
		write_pages(p, 0, 300);
		dirty = uffdwp_session_dirty(ss);
		err = snap_pages(ss, fds[1], &delta);
	}
	if (!err)
		same = !load_chain(fds, 2, &dst, 1, NULL) && !memcmp(img, p, len);
	uffdwp_session_free(ss);
	tap_check(!err && !async && dirty == 300 && delta == 300 && same, name,
		  "err %d, async %d (want 0), dirty %zd, delta %llu (want 300), image %s",
		  err, async, dirty, (unsigned long long)delta,
		  same ? "same" : "differs");
	close(fds[0]);
	close(fds[1]);
	munmap(p, len);
	munmap(img, len);
}

/*
 * session-async-add-file-region: a MAP_SHARED mapping of a ramfs file
 * (memory uffd-wp cannot track in sync mode) offered to a session after
 * its base, when it runs async between snapshots: refused as in sync
 * mode, and the session's next snapshot still succeeds.
 */
static void t_add_file(void)
{
	const char *name = "session-async-add-file-region";
	char dir[] = "/tmp/lib-session-async-XXXXXX", path[64];
	size_t len = 64 * (size_t)psz, flen = 16 * (size_t)psz;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *q = MAP_FAILED;
	struct uffdwp_region r = { p, len }, fr;
	struct uffdwp_session *ss = NULL;
	int fds[2] = { memfd_create("a", MFD_CLOEXEC),
		       memfd_create("b", MFD_CLOEXEC) };
	int err, add = 0, fd = -1;
	uint64_t base = 0, delta = 0;
	bool mounted = false, async = false;

	if (skip_no_wp(name))
		goto out;
	if (!mkdtemp(dir) || mount("none", dir, "ramfs", 0, NULL)) {
		tap_skip(name, "cannot mount a ramfs: %s", strerror(errno));
		goto out;
	}
	mounted = true;
	snprintf(path, sizeof(path), "%s/f", dir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)flen) ||
	    (q = mmap(NULL, flen, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		      0)) == MAP_FAILED) {
		tap_skip(name, "cannot map a ramfs file: %s", strerror(errno));
		goto out;
	}
	memset(q, 1, flen);
	fr = (struct uffdwp_region){ q, flen };
	madvise(p, len, MADV_NOHUGEPAGE);
	fill(p, len, 2);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = snap_pages(ss, fds[0], &base);
	if (!err) {
		async = async_now(ss);
		add = uffdwp_session_add_region(ss, &fr);
		write_pages(p, 3, 5);
		err = snap_pages(ss, fds[1], &delta);
	}
	uffdwp_session_free(ss);
	tap_check(!err && add < 0 && delta == 5 && async == capable(), name,
		  "err %d, async %d; add_region(ramfs MAP_SHARED) %d (want an error); the next delta %llu pages (want 5)",
		  err, async, add, (unsigned long long)delta);
out:
	if (q != MAP_FAILED)
		munmap(q, flen);
	if (fd >= 0)
		close(fd);
	if (mounted) {
		unlink(path);
		umount(dir);
		rmdir(dir);
	}
	close(fds[0]);
	close(fds[1]);
	munmap(p, len);
}

/* In the child: NAME's ring mapping at RING (LEN bytes) was not
 * inherited (VM_DONTCOPY), so the child maps its own memory there; freeing
 * the inherited handle (FREE) must leave that memory mapped.  Exit 0, 3
 * (the address was not free: the ring was inherited), 4 (the child's
 * memory was unmapped). */
static void child_frees_over(void *ring, size_t len, void (*free_fn)(void *),
			     void *handle)
{
	char *q = mmap(ring, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	unsigned char vec;

	if (q != ring)
		_exit(3);
	q[0] = 42;
	free_fn(handle);
	if (mincore(q, (size_t)psz, &vec))
		_exit(4);
	_exit(q[0] == 42 ? 0 : 4);
}

static void free_session(void *h)
{
	uffdwp_session_free(h);
}

static void free_tracker(void *h)
{
	uffdwp_tracker_free(h);
}

static int child_status(void *ring, size_t len, void (*free_fn)(void *),
			void *handle)
{
	pid_t pid = fork();
	int st = -1;

	if (pid == 0)
		child_frees_over(ring, len, free_fn, handle);
	if (pid < 0)
		return -1;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return st;
}

/*
 * session-fork-child-ring-mapping: a child of fork() freeing its copy of a
 * session and of a ring tracker touches nothing of its own memory: the
 * ring is not inherited (VM_DONTCOPY), and the child may have mapped
 * something else at its address.
 */
static void t_fork_ring(void)
{
	const char *name = "session-fork-child-ring-mapping";
	size_t len = 64 * (size_t)psz;
	char *p = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { p, len }, r2 = { p + len, len };
	struct uffdwp_session *ss = NULL;
	struct uffdwp_tracker *t = NULL;
	int fd = memfd_create("a", MFD_CLOEXEC), err, st_s = -1, st_t = -1;
	uint64_t base;

	if (!capable()) {
		tap_skip(name, "kernel without UFFDIO_SET_MODE or the write-log ring");
		goto out;
	}
	memset(p, 1, 2 * len);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = snap_pages(ss, fd, &base);
	if (!err)
		err = uffdwp_tracker_new(&t, &r2, 1, UFFDWP_BACKEND_RING);
	if (!err && (!inside(ss)->ring || !t->ring))
		err = -ENOENT;
	if (!err) {
		st_s = child_status(inside(ss)->ring, inside(ss)->ring_len,
				    free_session, ss);
		st_t = child_status(t->ring, t->ring_len, free_tracker, t);
	}
	uffdwp_tracker_free(t);
	uffdwp_session_free(ss);
	tap_check(!err && st_s == 0 && st_t == 0, name,
		  "err %d; the child freeing the session: status %#x, the tracker: %#x (0: its memory at the ring's address kept; exit 3: the ring was inherited; exit 4 or a signal: unmapped)",
		  err, st_s, st_t);
out:
	close(fd);
	munmap(p, 2 * len);
}

static void t_overflow(void)
{
	const char *name = "session-async-ring-overflow";
	const char *knob = "/proc/sys/vm/uffd_ring_max_entries";
	char old[32] = "";
	ssize_t n;
	int fd, err;

	if (!capable()) {
		tap_skip(name, "kernel without UFFDIO_SET_MODE or the write-log ring");
		tap_skip("session-async-count-lock-busy", "kernel without UFFDIO_SET_MODE or the write-log ring");
		tap_skip("session-async-no-pagemap", "kernel without UFFDIO_SET_MODE or the write-log ring");
		return;
	}
	fd = open(knob, O_RDONLY | O_CLOEXEC);
	n = fd >= 0 ? read(fd, old, sizeof(old) - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n <= 0 || write_knob(knob, "64")) {
		tap_skip(name, "cannot lower %s (not root?)", knob);
		tap_skip("session-async-count-lock-busy", "cannot lower %s (not root?)", knob);
		tap_skip("session-async-no-pagemap", "cannot lower %s (not root?)", knob);
		return;
	}
	/* 2048 pages, 15% a round: about 300 pages, the ring holds 64 */
	run_rounds(name, 2048, 150, true);
	t_count_lock_busy();
	t_no_pagemap();
	err = write_knob(knob, old);
	if (err)
		tap_diag("could not restore %s: %d", knob, err);
}

static void t_huge(void)
{
	const char *name = "session-async-huge-stays-sync";
	size_t len = 2 * HPAGE_SIZE;
	char *raw = mmap(NULL, len + HPAGE_SIZE, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *p = (char *)(((uintptr_t)raw + HPAGE_SIZE - 1) &
			   ~(HPAGE_SIZE - 1));
	struct uffdwp_region r = { p, len };
	struct uffdwp_session *ss = NULL;
	int fds[2] = { memfd_create("a", MFD_CLOEXEC),
		       memfd_create("b", MFD_CLOEXEC) };
	bool on_base = true, on_delta = true;
	long blocks = -1, after = -1;
	int err;

	if (!capable() || !f.thp) {
		tap_skip(name, "%s", !f.thp ? "transparent hugepages are off" :
			 "kernel without UFFDIO_SET_MODE or the write-log ring");
		goto out;
	}
	madvise(p, len, MADV_HUGEPAGE);
	fill(p, len, 3);
	blocks = make_pmd_mapped(p, len);
	if (blocks != 2) {
		tap_skip(name, "the arena got %ld of 2 blocks PMD-mapped", blocks);
		goto out;
	}
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = uffdwp_session_snapshot(ss, fds[0], 0);
	if (!err)
		err = uffdwp_session_wait(ss, 120000);
	on_base = async_now(ss);
	p[HPAGE_SIZE + 7 * psz] ^= 1;
	if (!err)
		err = uffdwp_session_snapshot(ss, fds[1], 0);
	if (!err)
		err = uffdwp_session_wait(ss, 120000);
	on_delta = async_now(ss);
	after = pmd_mapped_blocks(p, len);
	uffdwp_session_free(ss);
	tap_check(!err && !on_base && !on_delta && after == 2, name,
		  "err %d, async after the base %d, after the delta %d (want 0, 0), PMD-mapped blocks after a write and a delta %ld (want 2)",
		  err, on_base, on_delta, after);
out:
	close(fds[0]);
	close(fds[1]);
	munmap(raw, len + HPAGE_SIZE);
}

/* ---- uffdwp_session_dirty() from a signal handler ---- */

static struct uffdwp_session *sig_ss;
static ssize_t sig_want;
static atomic_long sig_calls, sig_wrong;

static void on_usr1(int sig)
{
	int saved = errno;
	ssize_t n = uffdwp_session_dirty(sig_ss);

	(void)sig;
	atomic_fetch_add(&sig_calls, 1);
	if (n != sig_want)
		atomic_fetch_add(&sig_wrong, 1);
	errno = saved;
}

struct kicker {
	pthread_t target, th;
	atomic_bool done;
};

static void *kicker_main(void *arg)
{
	struct kicker *k = arg;
	struct timespec ts = { 0, 50000 };

	for (int i = 0; i < 2000; i++) {
		pthread_kill(k->target, SIGUSR1);
		nanosleep(&ts, NULL);
	}
	atomic_store(&k->done, true);
	return NULL;
}

/*
 * session-async-dirty-in-signal: uffdwp_session_dirty() is documented
 * async-signal-safe.  A thread signals the main thread 2000 times while
 * it calls uffdwp_session_dirty() in a loop, and the handler calls it too
 * (often interrupting a call that holds the session's lock): no hang (a
 * 60 s alarm), and every count, in the handler and outside, is the 37
 * pages written.
 */
static void t_dirty_in_signal(void)
{
	const char *name = "session-async-dirty-in-signal";
	size_t len = 256 * psz;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { p, len };
	struct sigaction sa = { .sa_handler = on_usr1 }, old;
	struct kicker k = { .target = pthread_self() };
	int fd = memfd_create("snap", MFD_CLOEXEC), err;
	long outside = 0, wrong_outside = 0;

	if (skip_no_wp(name))
		goto out;
	madvise(p, len, MADV_NOHUGEPAGE);
	fill(p, len, 5);
	err = uffdwp_session_new(&sig_ss, &r, 1, NULL);
	if (!err)
		err = uffdwp_session_snapshot(sig_ss, fd, 0);
	if (!err)
		err = uffdwp_session_wait(sig_ss, 120000);
	for (size_t i = 0; !err && i < 37; i++)
		p[(i * 7 % 256) * psz] ^= 1;
	sig_want = 37;
	sigaction(SIGUSR1, &sa, &old);
	alarm(60);
	if (!err)
		err = -pthread_create(&k.th, NULL, kicker_main, &k);
	while (!err && !atomic_load(&k.done)) {
		outside++;
		wrong_outside += uffdwp_session_dirty(sig_ss) != sig_want;
	}
	if (!err)
		pthread_join(k.th, NULL);
	alarm(0);
	sigaction(SIGUSR1, &old, NULL);
	uffdwp_session_free(sig_ss);
	tap_check(!err && atomic_load(&sig_calls) > 0 &&
		  !atomic_load(&sig_wrong) && !wrong_outside, name,
		  "err %d; in the handler %ld calls, %ld wrong; outside %ld calls, %ld wrong (want %zd pages)",
		  err, atomic_load(&sig_calls), atomic_load(&sig_wrong),
		  outside, wrong_outside, sig_want);
out:
	close(fd);
	munmap(p, len);
}

int main(void)
{
	const char *s = getenv("SEED");

	psz = sysconf(_SC_PAGESIZE);
	seed = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
	tap_plan(8);
	tap_diag("seed %llu", (unsigned long long)seed);
	uffdwp_probe(&f);
	t_between();
	t_overflow();
	t_huge();
	t_dirty_in_signal();
	t_add_file();
	t_fork_ring();
	return tap_done();
}
