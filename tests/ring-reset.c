// SPDX-License-Identifier: GPL-2.0
/*
 * ring-reset: what UFFDIO_RING_RESET promises besides re-protecting pages
 * (kernel/patches "userfaultfd: make UFFDIO_RING_RESET killable and
 * mmap_changing aware" and "userfaultfd: notify and count only the PTEs a
 * ring reset changes").
 *
 *  - reset-counts-changed-pages: @reprotected counts the pages whose
 *    protection the reset changed; a second entry for a page, or an entry
 *    whose page UFFDIO_WRITEPROTECT protected since, counts nothing.
 *  - reset-eagain-while-event-pending: while a UFFD_EVENT_REMAP is queued
 *    and unread the reset fails with EAGAIN, as UFFDIO_WRITEPROTECT does,
 *    and leaves the consumer index and the pages alone; once the event is
 *    read it succeeds.
 *  - reset-killable: a process killed in the middle of a long reset dies
 *    there; the consumer index says how far it got.
 *  - reset-resumes-after-kill: a reset from that index finishes the job.
 *  - reset-protects-collapsed-thp: the 512 logged pages of a range that
 *    MADV_COLLAPSE (as khugepaged would) mapped with one PMD again are all
 *    protected by the reset, and the THP stays whole.
 *  - reset-protects-migrated-pages: logged pages that move_pages() moved to
 *    the other NUMA node before the reset (as compaction or NUMA balancing
 *    may) are protected where they are now, data intact.
 *  - reset-protects-cow-shared-pages: logged pages shared copy-on-write
 *    with a child forked before the reset are protected in the parent; the
 *    parent's next write is logged and copies the page, the child keeps
 *    the old content.
 *
 * The first three fail on the series without those two patches, whose reset
 * counts every entry, ignores pending events, and runs to its end under one
 * mmap lock whatever signal comes; the fourth passes there, as the reset it
 * resumes has finished.  The fifth failed on the 26-patch series, whose
 * reset split the PMD for the first entry and then took the other 511
 * pages, present and writable after the split, for pages written since
 * their entries: their next writes were not logged
 * (docs/results/previous-series/).  The sixth and seventh cover paths
 * between log and reset that no version got wrong.
 */
#define _GNU_SOURCE
#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static long psz;

static void case_counts_changed(void)
{
	const char *name = "reset-counts-changed-pages";
	uint64_t rep = 99, prod;
	struct uring_view r;
	int err, unprot = 0;
	char *p;

	p = ring_tracked(&r, name, 64, 8);
	if (!p)
		return;
	p[0] = 2;				/* entry 0: page 0 */
	p[psz] = 2;				/* entry 1: page 1 */
	p[2 * psz] = 2;				/* entry 2: page 2 */
	uffd_wp(r.uffd, p + psz, psz, UFFDIO_WRITEPROTECT_MODE_WP);
	p[psz + 1] = 3;				/* entry 3: page 1 again */
	/* Page 2 protected by hand: its entry has nothing left to do. */
	uffd_wp(r.uffd, p + 2 * psz, psz, UFFDIO_WRITEPROTECT_MODE_WP);
	prod = ring_producer(&r);
	err = ring_reset(&r, prod, 0, &rep);
	for (int i = 0; i < 8; i++)
		unprot += !page_wp(p + i * psz);
	tap_check(prod == 4 && !err && rep == 2 && !unprot, name,
		  "4 entries for pages 0, 1, 2, 1 (page 2 protected since): producer %llu, reset %d, reprotected %llu (want 2), %d pages left unprotected",
		  (unsigned long long)prod, err, (unsigned long long)rep,
		  unprot);
	ring_close(&r);
	munmap(p, 8 * psz);
}

struct remapper {
	pthread_t t;
	char *from, *to;
	size_t len;
	void *ret;
};

static void *do_mremap(void *arg)
{
	struct remapper *m = arg;

	m->ret = mremap(m->from, m->len, m->len,
			MREMAP_MAYMOVE | MREMAP_FIXED, m->to);
	return NULL;
}

static void case_eagain(void)
{
	const char *name = "reset-eagain-while-event-pending";
	struct remapper m = { .len = 4 * (size_t)psz };
	struct pollfd pfd;
	struct uffd_msg msg;
	struct uring_view r;
	uint64_t rep = 0, prod, cons;
	int err, err2 = -1, got = 0, wp_during = 0, unprot = 0;
	char *p = NULL;

	m.from = NULL;
	m.to = MAP_FAILED;
	if (ring_open(&r, 64, UFFD_FEATURE_EVENT_REMAP)) {
		tap_fail(name, "ring_open failed");
		return;
	}
	if (!(p = ring_track(&r, 8, true)) ||
	    !(m.from = ring_track(&r, 4, true))) {
		tap_fail(name, "ring_track failed");
		goto out;
	}
	m.to = mmap(NULL, m.len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		    0);
	if (m.to == MAP_FAILED) {
		tap_fail(name, "mmap: %s", strerror(errno));
		goto out;
	}
	for (int i = 0; i < 8; i++)
		p[i * psz] = 5;
	prod = ring_producer(&r);
	/* mremap() of the second area waits in the kernel until the remap
	 * event is read; the uffd turns readable once it is queued. */
	pthread_create(&m.t, NULL, do_mremap, &m);
	pfd = (struct pollfd){ .fd = r.uffd, .events = POLLIN };
	if (poll(&pfd, 1, 20000) != 1) {
		tap_fail(name, "no remap event within 20 s");
		/* mremap() stays blocked until its event is read */
		ring_close(&r);
		pthread_join(m.t, NULL);
		goto out_unmap;
	}
	err = ring_reset(&r, prod, 0, &rep);
	cons = ring_consumer(&r);
	for (int i = 0; i < 8; i++)
		wp_during += page_wp(p + i * psz);
	got = uffd_read_msg(r.uffd, &msg, 1000);
	pthread_join(m.t, NULL);
	if (got == 1 && msg.event == UFFD_EVENT_REMAP && err == -EAGAIN) {
		ring_overflowed(&r);	/* the mremap's overflow */
		err2 = ring_reset(&r, prod, UFFDIO_RING_RESET_CLEAR_OVERFLOW,
				  &rep);
		for (int i = 0; i < 8; i++)
			unprot += !page_wp(p + i * psz);
	}
	tap_check(prod == 8 && err == -EAGAIN && cons == 0 && !wp_during &&
		  got == 1 && msg.event == UFFD_EVENT_REMAP &&
		  m.ret == m.to && !err2 && rep == 8 && !unprot, name,
		  "8 entries; reset with the remap event unread gave %d (want -EAGAIN), consumer %llu, %d pages protected meanwhile; event read %d (type %#x), mremap %s; reset after it gave %d, reprotected %llu, %d pages unprotected",
		  err, (unsigned long long)cons, wp_during, got,
		  got == 1 ? msg.event : 0,
		  m.ret == m.to ? "done" : "failed", err2,
		  (unsigned long long)rep, unprot);
out:
	ring_close(&r);
out_unmap:
	if (p)
		munmap(p, 8 * psz);
	if (m.from && m.ret != m.to)	/* not moved to m.to */
		munmap(m.from, m.len);
	if (m.to != MAP_FAILED)
		munmap(m.to, m.len);
}

/*
 * Written pages of a THP that are collapsed again before the reset: every
 * page of the range has its entry, none is protected, and one PMD maps
 * them.  The reset must protect all 512 (the whole PMD, keeping it huge)
 * so that the next write to any of them is logged.
 */
static void case_collapsed_thp(void)
{
	const char *name = "reset-protects-collapsed-thp";
	size_t nr = HPAGE_SIZE / psz, unprot = 0;
	uint64_t prod, rep = 0, after = 0, entry = 0;
	long huge_before, huge_after;
	struct uring_view r;
	char *p;
	int err;

	if (ring_open(&r, 1024, 0)) {
		tap_fail(name, "ring_open failed");
		return;
	}
	p = map_anon_aligned(HPAGE_SIZE, HPAGE_SIZE);
	if (!p) {
		tap_fail(name, "mmap: %s", strerror(errno));
		goto out_ring;
	}
	if (madvise(p, HPAGE_SIZE, MADV_HUGEPAGE)) {
		tap_skip(name, "MADV_HUGEPAGE: %s (no THP in this kernel)",
			 strerror(errno));
		goto out;
	}
	memset(p, 1, HPAGE_SIZE);
	if (uffd_register(r.uffd, p, HPAGE_SIZE, UFFDIO_REGISTER_MODE_WP,
			  NULL) ||
	    uffd_wp(r.uffd, p, HPAGE_SIZE, UFFDIO_WRITEPROTECT_MODE_WP)) {
		tap_fail(name, "register/protect: %s", strerror(errno));
		goto out;
	}
	/* Async faults split the PMD and log each page. */
	for (size_t i = 0; i < nr; i++)
		p[i * psz] = 2;
	prod = ring_producer(&r);
	if (madvise(p, HPAGE_SIZE, MADV_COLLAPSE)) {
		tap_skip(name, "MADV_COLLAPSE of the written range: %s",
			 strerror(errno));
		goto out;
	}
	huge_before = smaps_field_kb(p, "AnonHugePages");
	err = ring_reset(&r, prod, 0, &rep);
	huge_after = smaps_field_kb(p, "AnonHugePages");
	for (size_t i = 0; i < nr; i++)
		unprot += !page_wp(p + i * psz);
	p[5 * psz] = 3;
	after = ring_producer(&r);
	if (after == prod + 1)
		entry = ring_entry(&r, prod);
	tap_check(prod == nr && huge_before == (long)(HPAGE_SIZE >> 10) &&
		  !err && rep == nr && !unprot &&
		  huge_after == huge_before && after == prod + 1 &&
		  entry == (uintptr_t)(p + 5 * psz), name,
		  "%llu entries for %zu pages; AnonHugePages %ld kB after MADV_COLLAPSE; reset gave %d, reprotected %llu (want %zu), %zu pages left unprotected, AnonHugePages %ld kB after it; a write then logged %llu entries (want 1) naming %#llx (want %p)",
		  (unsigned long long)prod, nr, huge_before, err,
		  (unsigned long long)rep, nr, unprot, huge_after,
		  (unsigned long long)(after - prod),
		  (unsigned long long)entry, (void *)(p + 5 * psz));
out:
	munmap(p, HPAGE_SIZE);
out_ring:
	ring_close(&r);
}

/*
 * Pages written (logged) and then migrated to the other node before the
 * reset: present and writable again on a new page when it runs.
 */
#define MIG_PAGES	16
static void case_migrated(void)
{
	const char *name = "reset-protects-migrated-pages";
	int nodes[MIG_PAGES], status[MIG_PAGES], target, moved = 0;
	int unprot = 0, lost = 0, err;
	void *pages[MIG_PAGES];
	uint64_t prod, rep = 0, after;
	struct uring_view r;
	long ret;
	char *p;

	p = ring_tracked(&r, name, 64, MIG_PAGES);
	if (!p)
		return;
	for (int i = 0; i < MIG_PAGES; i++) {
		p[i * psz] = 3;
		pages[i] = p + i * psz;
	}
	prod = ring_producer(&r);
	/* Where page 0 is now; the others go with it to the other node. */
	ret = sys_move_pages(1, pages, NULL, status, 0);
	if (ret < 0 || status[0] < 0) {
		tap_skip(name, "move_pages query: %s",
			 strerror(ret < 0 ? errno : -status[0]));
		goto out;
	}
	target = status[0] ? 0 : 1;
	for (int i = 0; i < MIG_PAGES; i++)
		nodes[i] = target;
	ret = sys_move_pages(MIG_PAGES, pages, nodes, status, MPOL_MF_MOVE);
	if (ret < 0 && (errno == ENODEV || errno == EINVAL)) {
		tap_skip(name, "no node %d to migrate to: %s", target,
			 strerror(errno));
		goto out;
	}
	for (int i = 0; i < MIG_PAGES; i++)
		moved += status[i] == target;
	err = ring_reset(&r, prod, 0, &rep);
	for (int i = 0; i < MIG_PAGES; i++) {
		unprot += !page_wp(p + i * psz);
		lost += p[i * psz] != 3;
	}
	p[7 * psz] = 4;
	after = ring_producer(&r);
	tap_check(prod == MIG_PAGES && ret == 0 && moved == MIG_PAGES &&
		  !err && rep == MIG_PAGES && !unprot && !lost &&
		  after == prod + 1 &&
		  ring_entry(&r, prod) == (uintptr_t)(p + 7 * psz), name,
		  "%llu entries; move_pages to node %d gave %ld, %d of %d pages there; reset gave %d, reprotected %llu (want %d), %d pages unprotected, %d lost their data; a write then logged %llu entries (want 1)",
		  (unsigned long long)prod, target, ret, moved, MIG_PAGES, err,
		  (unsigned long long)rep, MIG_PAGES, unprot, lost,
		  (unsigned long long)(after - prod));
out:
	munmap(p, MIG_PAGES * psz);
	ring_close(&r);
}

/*
 * Pages logged and then shared copy-on-write with a child: the parent's
 * PTEs are read-only and not protected when the reset comes.
 */
#define COW_PAGES	4
static void case_forked(void)
{
	const char *name = "reset-protects-cow-shared-pages";
	uint64_t prod, rep = 0, after;
	int fds[2], status = -1, err, unprot = 0;
	struct uring_view r;
	pid_t pid;
	char *p;

	p = ring_tracked(&r, name, 64, COW_PAGES);
	if (!p)
		return;
	if (pipe(fds)) {
		tap_fail(name, "pipe: %s", strerror(errno));
		goto out;
	}
	for (int i = 0; i < COW_PAGES; i++)
		p[i * psz] = 3;
	prod = ring_producer(&r);
	pid = fork();
	if (pid < 0)
		tap_bail("fork: %s", strerror(errno));
	if (!pid) {
		char c;
		int bad = 0;

		/* After the parent's reset and write: the old content. */
		close(fds[1]);
		if (read(fds[0], &c, 1) != 1)
			_exit(2);
		for (int i = 0; i < COW_PAGES; i++)
			bad += p[i * psz] != 3;
		_exit(bad ? 1 : 0);
	}
	close(fds[0]);
	err = ring_reset(&r, prod, 0, &rep);
	for (int i = 0; i < COW_PAGES; i++)
		unprot += !page_wp(p + i * psz);
	p[2 * psz] = 4;
	after = ring_producer(&r);
	if (write(fds[1], "x", 1) != 1)
		kill(pid, SIGKILL);
	close(fds[1]);
	waitpid(pid, &status, 0);
	tap_check(prod == COW_PAGES && !err && rep == COW_PAGES && !unprot &&
		  after == prod + 1 &&
		  ring_entry(&r, prod) == (uintptr_t)(p + 2 * psz) &&
		  p[2 * psz] == 4 && WIFEXITED(status) &&
		  WEXITSTATUS(status) == 0, name,
		  "%llu entries; reset after fork gave %d, reprotected %llu (want %d), %d pages unprotected; the parent's write logged %llu entries (want 1); child status %#x (0: it still saw the old content)",
		  (unsigned long long)prod, err, (unsigned long long)rep,
		  COW_PAGES, unprot, (unsigned long long)(after - prod),
		  status);
out:
	munmap(p, COW_PAGES * psz);
	ring_close(&r);
}

/*
 * A long reset: KILL_PAGES pages written again and again, protected by hand
 * between rounds, until the ring holds kill_entries entries (the largest
 * ring, UFFD_RING_MAX_ENTRIES: 8192 reset steps), and the pages are
 * writable at the end.  The first argument sets another size.
 */
#define KILL_PAGES	16384
static uint64_t kill_entries = UFFD_RING_MAX_ENTRIES;

static void case_killable(void)
{
	const char *name = "reset-killable";
	const char *resume = "reset-resumes-after-kill";
	uint64_t prod, cons = 0, rep = 0, want;
	long long t0, spin_ms;
	struct uring_view r;
	int status = 0, err, unprot = 0, lost = 0;
	pid_t child, w = 0;
	char *p;

	p = ring_tracked(&r, name, kill_entries, KILL_PAGES);
	if (!p) {
		tap_fail(resume, "no ring");
		return;
	}
	/*
	 * MADV_POPULATE_WRITE write-faults every page from the kernel: each
	 * is resolved and logged as a write from user space would be, and
	 * the data stays as it was.
	 */
	t0 = now_ms();
	for (uint64_t round = 0; round < kill_entries / KILL_PAGES; round++) {
		if (round)
			uffd_wp(r.uffd, p, KILL_PAGES * psz,
				UFFDIO_WRITEPROTECT_MODE_WP);
		if (madvise(p, KILL_PAGES * psz, MADV_POPULATE_WRITE)) {
			tap_fail(name, "MADV_POPULATE_WRITE in round %llu: %s",
				 (unsigned long long)round, strerror(errno));
			tap_fail(resume, "no long reset to resume");
			goto out;
		}
	}
	prod = ring_producer(&r);
	tap_diag("%s: %llu entries written in %lld ms", name,
		 (unsigned long long)prod, now_ms() - t0);
	if (prod != kill_entries || ring_overflowed(&r)) {
		tap_fail(name, "filling the ring gave %llu entries (want %llu), overflow %d",
			 (unsigned long long)prod,
			 (unsigned long long)kill_entries, ring_overflowed(&r));
		tap_fail(resume, "no long reset to resume");
		goto out;
	}
	/* The child's reset acts on this process's mm (the uffd's). */
	child = fork();
	if (child < 0)
		tap_bail("fork: %s", strerror(errno));
	if (!child)
		_exit(ring_reset(&r, prod, 0, NULL) ? 1 : 0);
	/* Kill it once its first step is published. */
	t0 = now_ms();
	while (!(cons = ring_consumer(&r)) &&
	       !(w = waitpid(child, &status, WNOHANG)) &&
	       now_ms() - t0 < 60000)
		;
	spin_ms = now_ms() - t0;
	if (!w) {
		t0 = now_ms();
		kill(child, SIGKILL);
		w = waitpid(child, &status, 0);
		tap_diag("%s: child reaped %lld ms after SIGKILL", name,
			 now_ms() - t0);
	}
	cons = ring_consumer(&r);
	tap_check(w == child && WIFSIGNALED(status) &&
		  WTERMSIG(status) == SIGKILL && cons > 0 && cons < prod &&
		  cons % 512 == 0, name,
		  "reset of %llu entries: consumer %llu when the child's wait ended (%s after %lld ms); want it killed part way at a step boundary",
		  (unsigned long long)prod, (unsigned long long)cons,
		  WIFSIGNALED(status) ? "killed" : "exited", spin_ms);
	r.consumer = cons;
	t0 = now_ms();
	err = ring_reset(&r, prod, 0, &rep);
	tap_diag("%s: the rest, %llu entries, reset in %lld ms", resume,
		 (unsigned long long)(prod - cons), now_ms() - t0);
	for (size_t i = 0; i < KILL_PAGES; i++) {
		unprot += !page_wp(p + i * psz);
		lost += p[i * psz] != 1;	/* as ring_track() filled it */
	}
	/* The first KILL_PAGES entries name each page once; the killed
	 * reset protected the pages of those it reached. */
	want = cons < KILL_PAGES ? KILL_PAGES - cons : 0;
	tap_check(!err && ring_consumer(&r) == prod && rep == want &&
		  !unprot && !lost, resume,
		  "reset from %llu to %llu gave %d, consumer %llu, reprotected %llu (want %llu), %d pages unprotected, %d lost their data",
		  (unsigned long long)cons, (unsigned long long)prod, err,
		  (unsigned long long)ring_consumer(&r),
		  (unsigned long long)rep, (unsigned long long)want, unprot,
		  lost);
out:
	ring_close(&r);
	munmap(p, KILL_PAGES * psz);
}

int main(int argc, char **argv)
{
	psz = page_size();
	if (argc > 1)
		kill_entries = strtoull(argv[1], NULL, 0);
	if (kill_entries < KILL_PAGES || kill_entries % KILL_PAGES ||
	    kill_entries & (kill_entries - 1)) {
		fprintf(stderr, "ring-reset: ENTRIES must be a power of two, a multiple of %d\n",
			KILL_PAGES);
		return 2;
	}
	watchdog(1100);
	tap_plan(7);
	if (!ring_supported())
		tap_bail("UFFDIO_API does not offer UFFD_FEATURE_WP_RING");
	case_counts_changed();
	case_eagain();
	case_collapsed_thp();
	case_migrated();
	case_forked();
	case_killable();
	return tap_done();
}
