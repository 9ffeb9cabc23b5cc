// SPDX-License-Identifier: GPL-2.0
/*
 * ring-mode: UFFDIO_SET_MODE switching write-protect faults of a live
 * context between sync delivery and async resolution (kernel/patches
 * "userfaultfd: add UFFDIO_SET_MODE to switch write-protect faults between
 * sync and async").
 *
 *  - mode-advertised: UFFDIO_API lists the ioctl where WP_ASYNC exists.
 *  - mode-bad-input: every rejected argument fails with its errno and
 *    changes nothing; the accepted ones succeed.
 *  - mode-esrch: a context whose process has exited cannot be switched.
 *  - mode-async-to-sync: after switching async off, a write to a protected
 *    page waits for the handler, its message carries UFFD_PAGEFAULT_FLAG_WP
 *    and it is not logged; the write before the switch was.
 *  - mode-sync-to-async-unread / -read: switching async on releases a
 *    writer blocked on a write-protect fault whose message is still queued
 *    (the message disappears) or already read; its write is logged.
 *  - mode-missing-keeps-waiting: the same switch leaves a thread blocked on
 *    a missing fault of the same context waiting for its answer.
 *  - mode-overflow-kept: switches leave an overflowed ring's flag and
 *    entries alone; a reset that clears the flag makes logging resume.
 *  - mode-back-and-forth: forty round trips; every async write is logged
 *    once and every sync write is delivered once.
 *  - mode-async-only-range: a ramfs file mapping, which only async mode
 *    registers for WP, keeps the context in async mode: switching it off
 *    fails with EINVAL, writes stay logged and the range unregisters.
 *  - mode-thp / mode-hugetlb: a write blocked in sync mode on a PMD-mapped
 *    THP (the fault taken on the huge PMD) or on a hugetlb page completes
 *    when async is switched on, logged as its 4 KiB page (the PMD split) or
 *    as one UFFD_RING_ENTRY_HUGE entry.
 *  - mode-pagemap-scan: PAGEMAP_SCAN's write-protect operation with
 *    PM_SCAN_CHECK_WPASYNC fails with EPERM in sync mode and works again
 *    in async mode.
 *  - mode-switch-under-writers: four threads write a tracked range while
 *    the mode flips between phases of writes and a handler answers sync
 *    faults.  No write is lost: every page that is no longer protected is
 *    in the ring or was delivered, at every async-to-sync switch and at the
 *    end, and every page holds what its writer stored.
 */
#define _GNU_SOURCE
#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define PM_UFFD_WP	(1ULL << 57)
#ifndef MAP_HUGETLB
#define MAP_HUGETLB	0x40000
#endif

static long psz;

static int set_mode(int uffd, uint64_t enable, uint64_t disable)
{
	struct uffdio_set_mode m = { .enable = enable, .disable = disable };

	return ioctl(uffd, UFFDIO_SET_MODE, &m) ? -errno : 0;
}

/* A message is queued on UFFD (poll says readable within TIMEOUT_MS). */
static bool msg_queued(int uffd, int timeout_ms)
{
	struct pollfd p = { .fd = uffd, .events = POLLIN };

	return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/* Whether entry I of R names page ADDR. */
static bool entry_is(const struct uring_view *r, uint64_t i, void *addr)
{
	return (ring_entry(r, i) & ~(uint64_t)(psz - 1)) == (uintptr_t)addr;
}

/* A WP fault message for page ADDR arrives within two seconds.  (A
 * hugetlb fault names its huge page: got_wp_fault_in() takes its size.) */
static bool got_wp_fault_in(int uffd, void *addr, size_t span, char *why,
			    size_t whylen);

static bool got_wp_fault(int uffd, void *addr, char *why, size_t whylen)
{
	return got_wp_fault_in(uffd, addr, psz, why, whylen);
}

static bool got_wp_fault_in(int uffd, void *addr, size_t span, char *why,
			    size_t whylen)
{
	struct uffd_msg msg;
	int n = uffd_read_msg(uffd, &msg, 2000);
	unsigned long a;

	if (n <= 0) {
		snprintf(why, whylen, "no message (%d)", n);
		return false;
	}
	a = msg.arg.pagefault.address & ~(unsigned long)(psz - 1);
	if (msg.event != UFFD_EVENT_PAGEFAULT ||
	    !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) ||
	    (a != (uintptr_t)addr &&
	     a != ((uintptr_t)addr & ~(uintptr_t)(span - 1)))) {
		snprintf(why, whylen, "event %#x flags %#llx at %#lx, expected a WP fault at %p",
			 msg.event, (unsigned long long)msg.arg.pagefault.flags,
			 a, addr);
		return false;
	}
	return true;
}

static void case_advertised(void)
{
	struct uffdio_api api = { .api = UFFD_API,
				  .features = UFFD_FEATURE_WP_ASYNC };
	int fd = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);

	if (fd < 0) {
		tap_fail("mode-advertised", "userfaultfd: %s", strerror(errno));
		return;
	}
	if (ioctl(fd, UFFDIO_API, &api))
		tap_fail("mode-advertised", "UFFDIO_API: %s", strerror(errno));
	else
		tap_check(api.ioctls & ((__u64)1 << _UFFDIO_SET_MODE),
			  "mode-advertised", "ioctls %#llx lacks bit %d",
			  (unsigned long long)api.ioctls, _UFFDIO_SET_MODE);
	close(fd);
}

static void case_bad_input(void)
{
	const char *name = "mode-bad-input";
	struct { const char *what; int fd; uint64_t en, dis; int want; } c[8];
	int plain = uffd_open(0, NULL);
	int unpop = uffd_open(UFFD_FEATURE_WP_UNPOPULATED, NULL);
	int async = uffd_open(UFFD_FEATURE_WP_ASYNC, NULL);
	int raw = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
	int n = 0, i, err;
	bool ok = true;

	if (plain < 0 || unpop < 0 || async < 0 || raw < 0) {
		tap_fail(name, "could not open the contexts");
		goto out;
	}
	c[n++] = (typeof(c[0])){ "enable and disable overlap", async,
		UFFD_FEATURE_WP_ASYNC, UFFD_FEATURE_WP_ASYNC, -EINVAL };
	c[n++] = (typeof(c[0])){ "a feature that cannot be switched", async,
		UFFD_FEATURE_EVENT_FORK, 0, -EINVAL };
	c[n++] = (typeof(c[0])){ "an undefined bit", async,
		0, 1ULL << 40, -EINVAL };
	c[n++] = (typeof(c[0])){ "async on without WP_UNPOPULATED", plain,
		UFFD_FEATURE_WP_ASYNC, 0, -EINVAL };
	c[n++] = (typeof(c[0])){ "a context before UFFDIO_API", raw,
		0, UFFD_FEATURE_WP_ASYNC, -EINVAL };
	c[n++] = (typeof(c[0])){ "both masks empty", async, 0, 0, 0 };
	c[n++] = (typeof(c[0])){ "async on with WP_UNPOPULATED", unpop,
		UFFD_FEATURE_WP_ASYNC, 0, 0 };
	c[n++] = (typeof(c[0])){ "async off", async,
		0, UFFD_FEATURE_WP_ASYNC, 0 };
	for (i = 0; i < n; i++) {
		err = set_mode(c[i].fd, c[i].en, c[i].dis);
		if (err != c[i].want) {
			tap_diag("%s: got %d, expected %d", c[i].what, err,
				 c[i].want);
			ok = false;
		}
	}
	err = ioctl(async, UFFDIO_SET_MODE, (void *)16) ? -errno : 0;
	if (err != -EFAULT) {
		tap_diag("an unmapped argument: got %d, expected %d", err,
			 -EFAULT);
		ok = false;
	}
	tap_check(ok, name, "see the lines above");
out:
	for (i = 0; i < 4; i++) {
		int fd = (int[]){ plain, unpop, async, raw }[i];

		if (fd >= 0)
			close(fd);
	}
}

/*
 * A child opens a context; this process takes a copy of its descriptor
 * with pidfd_getfd(2) and lets the child exit.  The context, or -errno.
 */
static int context_of_exited_child(void)
{
	int up[2], down[2], fd = -EIO, num = -1, pidfd, st;
	pid_t pid;

	if (pipe(up) || pipe(down))
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		int u = uffd_open(UFFD_FEATURE_WP_ASYNC, NULL);
		char c;

		close(up[0]);
		close(down[1]);
		if (write(up[1], &u, sizeof(u)) != sizeof(u))
			_exit(1);
		/* wait until the parent has its copy */
		_exit(read(down[0], &c, 1) < 0);
	}
	close(up[1]);
	close(down[0]);
	if (read(up[0], &num, sizeof(num)) == sizeof(num) && num >= 0) {
		pidfd = syscall(SYS_pidfd_open, pid, 0);
		if (pidfd >= 0) {
			fd = syscall(SYS_pidfd_getfd, pidfd, num, 0);
			if (fd < 0)
				fd = -errno;
			close(pidfd);
		} else {
			fd = -errno;
		}
	}
	close(down[1]);
	close(up[0]);
	waitpid(pid, &st, 0);
	return fd;
}

static void case_esrch(void)
{
	int fd = context_of_exited_child(), err;

	if (fd < 0) {
		tap_fail("mode-esrch", "no context from the child: %d", fd);
		return;
	}
	err = uffd_set_async(fd, false);
	tap_check(err == -ESRCH, "mode-esrch", "got %d, expected %d", err,
		  -ESRCH);
	close(fd);
}

static void case_async_to_sync(void)
{
	const char *name = "mode-async-to-sync";
	struct uring_view r;
	struct writer w = { 0 };
	char why[160] = "";
	char *p = ring_tracked(&r, name, 64, 8);
	bool ok;

	if (!p)
		return;
	p[0] = 2;
	if (ring_producer(&r) != 1 || !entry_is(&r, 0, p)) {
		tap_fail(name, "the async write before the switch was not logged");
		goto out;
	}
	if (uffd_set_async(r.uffd, false)) {
		tap_fail(name, "UFFDIO_SET_MODE: %s", strerror(errno));
		goto out;
	}
	if (writer_start(&w, p + psz, psz, 3)) {
		tap_fail(name, "writer_start failed");
		goto out;
	}
	ok = got_wp_fault(r.uffd, p + psz, why, sizeof(why));
	if (ok && w.done)
		snprintf(why, sizeof(why), "the writer did not wait"), ok = false;
	if (!uffd_wp(r.uffd, p + psz, psz, 0) && !writer_wait(&w, 5000))
		snprintf(why, sizeof(why), "the writer was not released"),
			ok = false;
	if (ok && ring_producer(&r) != 1)
		snprintf(why, sizeof(why), "the sync write was logged (producer %llu)",
			 (unsigned long long)ring_producer(&r)), ok = false;
	if (ok && p[psz] != 3)
		snprintf(why, sizeof(why), "the write did not land"), ok = false;
	tap_check(ok, name, "%s", why);
out:
	writer_joined(&w, 5000);
	munmap(p, 8 * psz);
	ring_close(&r);
}

static void case_sync_to_async(bool read_first)
{
	const char *name = read_first ? "mode-sync-to-async-read" :
					"mode-sync-to-async-unread";
	struct uring_view r;
	struct writer w = { 0 };
	struct uffd_msg msg;
	char *p = ring_tracked(&r, name, 64, 8);
	char *page;

	if (!p)
		return;
	page = p + 2 * psz;
	if (uffd_set_async(r.uffd, false) || writer_start(&w, page, psz, 4)) {
		tap_fail(name, "setup failed");
		goto out;
	}
	if (!msg_queued(r.uffd, 2000) || w.done) {
		tap_fail(name, "the writer did not block on a queued fault");
		goto out;
	}
	if (read_first && uffd_read_msg(r.uffd, &msg, 1000) != 1) {
		tap_fail(name, "could not read the message");
		goto out;
	}
	if (uffd_set_async(r.uffd, true)) {
		tap_fail(name, "UFFDIO_SET_MODE: %s", strerror(errno));
		goto out;
	}
	if (!writer_wait(&w, 5000)) {
		tap_fail(name, "the writer is still blocked after async was switched on");
		/* release it the sync way so that the case can end */
		uffd_wp(r.uffd, page, psz, 0);
		goto out;
	}
	tap_check(ring_producer(&r) == 1 && entry_is(&r, 0, page) &&
		  page[0] == 4 && !page_wp(page) && !msg_queued(r.uffd, 100),
		  name, "producer %llu, entry %#llx (page %p), content %d, %s, %s",
		  (unsigned long long)ring_producer(&r),
		  (unsigned long long)ring_entry(&r, 0), page, page[0],
		  page_wp(page) ? "still protected" : "unprotected",
		  msg_queued(r.uffd, 0) ? "a message is still queued" :
					 "no message");
out:
	writer_joined(&w, 5000);
	munmap(p, 8 * psz);
	ring_close(&r);
}

static void case_missing_waits(void)
{
	const char *name = "mode-missing-keeps-waiting";
	struct uring_view r;
	struct writer w = { 0 };
	struct uffd_msg msg;
	char *p = ring_tracked(&r, name, 64, 4), *hole;
	bool ok;

	if (!p)
		return;
	hole = mmap(NULL, psz, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (hole == MAP_FAILED ||
	    uffd_register(r.uffd, hole, psz, UFFDIO_REGISTER_MODE_MISSING,
			  NULL) || uffd_set_async(r.uffd, false) ||
	    writer_start(&w, hole, psz, 5)) {
		tap_fail(name, "setup failed");
		goto out;
	}
	if (uffd_read_msg(r.uffd, &msg, 2000) != 1 ||
	    (msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)) {
		tap_fail(name, "no missing fault from the writer");
		goto out;
	}
	if (uffd_set_async(r.uffd, true)) {
		tap_fail(name, "UFFDIO_SET_MODE: %s", strerror(errno));
		goto out;
	}
	/* A woken missing fault would fault again and queue a new message. */
	ok = !writer_wait(&w, 500) && !msg_queued(r.uffd, 0);
	if (uffd_zeropage(r.uffd, hole, psz, 0) || !writer_wait(&w, 5000)) {
		tap_fail(name, "the missing fault could not be resolved");
		goto out;
	}
	tap_check(ok && hole[0] == 5, name,
		  "the missing fault was woken before it was answered (the writer finished, or faulted again)");
out:
	writer_joined(&w, 5000);
	if (hole != MAP_FAILED)
		munmap(hole, psz);
	munmap(p, 4 * psz);
	ring_close(&r);
}

static void case_overflow_kept(void)
{
	const char *name = "mode-overflow-kept";
	struct uring_view r;
	struct writer w = { 0 };
	char why[160] = "";
	char *p = ring_tracked(&r, name, UFFD_RING_MIN_ENTRIES, 200);
	uint64_t prod;
	bool ok = true;

	if (!p)
		return;
	for (int i = 0; i < 100; i++)
		p[i * psz] = 6;
	prod = ring_producer(&r);
	if (!ring_overflowed(&r) || prod != UFFD_RING_MIN_ENTRIES) {
		tap_fail(name, "the ring did not overflow (producer %llu)",
			 (unsigned long long)prod);
		goto out;
	}
	if (uffd_set_async(r.uffd, false) || !ring_overflowed(&r)) {
		tap_fail(name, "switching async off changed the overflow flag");
		goto out;
	}
	if (writer_start(&w, p + 150 * psz, psz, 7) ||
	    !got_wp_fault(r.uffd, p + 150 * psz, why, sizeof(why)))
		ok = false;
	if (uffd_wp(r.uffd, p + 150 * psz, psz, 0) || !writer_wait(&w, 5000))
		ok = false, snprintf(why, sizeof(why), "writer not released");
	if (!ok) {
		tap_fail(name, "the sync write: %s", why);
		goto out;
	}
	if (uffd_set_async(r.uffd, true) || !ring_overflowed(&r) ||
	    ring_producer(&r) != prod) {
		tap_fail(name, "switching async on changed the ring");
		goto out;
	}
	if (ring_reset(&r, prod, UFFDIO_RING_RESET_CLEAR_OVERFLOW, NULL) ||
	    ring_overflowed(&r)) {
		tap_fail(name, "the reset did not clear the flag");
		goto out;
	}
	p[160 * psz] = 8;
	tap_check(ring_producer(&r) == prod + 1 &&
		  entry_is(&r, prod, p + 160 * psz), name,
		  "after the reset: producer %llu, expected %llu",
		  (unsigned long long)ring_producer(&r),
		  (unsigned long long)prod + 1);
out:
	writer_joined(&w, 5000);
	munmap(p, 200 * psz);
	ring_close(&r);
}

static void case_back_and_forth(void)
{
	const char *name = "mode-back-and-forth";
	const int rounds = 40;
	struct uring_view r;
	char why[160] = "";
	char *p = ring_tracked(&r, name, 128, 2 * rounds);
	int i;

	if (!p)
		return;
	for (i = 0; i < rounds; i++) {
		char *a = p + 2 * i * psz, *s = a + psz;
		struct writer w = { 0 };

		a[0] = 9;
		if (ring_producer(&r) != (uint64_t)i + 1 || !entry_is(&r, i, a)) {
			snprintf(why, sizeof(why), "round %d: the async write was not logged once",
				 i);
			break;
		}
		if (uffd_set_async(r.uffd, false) ||
		    writer_start(&w, s, psz, 10)) {
			snprintf(why, sizeof(why), "round %d: switch off failed", i);
			break;
		}
		if (!got_wp_fault(r.uffd, s, why, sizeof(why)) ||
		    uffd_wp(r.uffd, s, psz, 0) || !writer_wait(&w, 5000)) {
			uffd_wp(r.uffd, s, psz, 0);
			writer_joined(&w, 5000);
			if (!why[0])
				snprintf(why, sizeof(why), "round %d: sync write not resolved", i);
			break;
		}
		if (ring_producer(&r) != (uint64_t)i + 1 ||
		    uffd_set_async(r.uffd, true)) {
			snprintf(why, sizeof(why), "round %d: sync write logged or switch on failed",
				 i);
			break;
		}
	}
	tap_check(i == rounds && !msg_queued(r.uffd, 0), name, "%s", why);
	munmap(p, 2 * rounds * psz);
	ring_close(&r);
}

static void case_file_range(void)
{
	const char *name = "mode-async-only-range";
	const char *dir = "/tmp/ring-mode-ramfs";
	char path[64];
	struct uring_view r = { .uffd = -1 };
	char *p = MAP_FAILED;
	int fd = -1, err;

	mkdir("/tmp", 01777);
	mkdir(dir, 0700);
	if (mount("none", dir, "ramfs", 0, NULL)) {
		tap_skip(name, "cannot mount ramfs on %s: %s", dir,
			 strerror(errno));
		return;
	}
	snprintf(path, sizeof(path), "%s/f", dir);
	fd = open(path, O_RDWR | O_CREAT, 0600);
	if (fd < 0 || ftruncate(fd, 4 * psz) ||
	    (p = mmap(NULL, 4 * psz, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		      0)) == MAP_FAILED || ring_open(&r, 64, 0)) {
		tap_fail(name, "setup failed: %s", strerror(errno));
		goto out;
	}
	memset(p, 1, 4 * psz);
	/* async mode registers WP on any memory; sync mode only on anon,
	 * shmem and hugetlbfs */
	if (uffd_register(r.uffd, p, 4 * psz, UFFDIO_REGISTER_MODE_WP, NULL) ||
	    uffd_wp(r.uffd, p, 4 * psz, UFFDIO_WRITEPROTECT_MODE_WP)) {
		tap_fail(name, "async mode did not register the ramfs mapping");
		goto out;
	}
	err = uffd_set_async(r.uffd, false);
	p[0] = 2;
	tap_check(err == -EINVAL && ring_producer(&r) == 1 &&
		  entry_is(&r, 0, p) && !msg_queued(r.uffd, 0) &&
		  !uffd_unregister(r.uffd, p, 4 * psz), name,
		  "switch off: %d (expected %d); then producer %llu; the range %s",
		  err, -EINVAL, (unsigned long long)ring_producer(&r),
		  "must stay async and unregister");
out:
	if (p != MAP_FAILED)
		munmap(p, 4 * psz);
	if (r.uffd >= 0)
		ring_close(&r);
	if (fd >= 0)
		close(fd);
	unlink(path);
	umount(dir);
	rmdir(dir);
}

/*
 * A write into LEN bytes at P (protected, populated), made while the
 * context is in sync mode, waits on a fault with UFFD_PAGEFAULT_FLAG_WP;
 * switching async on lets it complete and logs it.  The entry it logged,
 * or 0 with WHY filled in.
 */
static uint64_t blocked_then_async(struct uring_view *r, char *page,
				   char *why, size_t whylen)
{
	struct writer w = { 0 };
	uint64_t e = 0;

	if (uffd_set_async(r->uffd, false) ||
	    writer_start(&w, page, 1, 11)) {
		snprintf(why, whylen, "setup failed");
		return 0;
	}
	if (!got_wp_fault_in(r->uffd, page, HPAGE_SIZE, why, whylen) ||
	    w.done) {
		if (!why[0])
			snprintf(why, whylen, "the writer did not wait");
		uffd_set_async(r->uffd, true);
		writer_joined(&w, 5000);
		return 0;
	}
	if (uffd_set_async(r->uffd, true) || !writer_wait(&w, 5000)) {
		snprintf(why, whylen, "the writer was not released");
		return 0;
	}
	if (ring_producer(r) != 1 || page[0] != 11)
		snprintf(why, whylen, "producer %llu, content %d",
			 (unsigned long long)ring_producer(r), page[0]);
	else
		e = ring_entry(r, 0);
	return e;
}

static void case_thp(void)
{
	const char *name = "mode-thp";
	struct uring_view r;
	char why[160] = "";
	char *p = map_anon_aligned(HPAGE_SIZE, HPAGE_SIZE);
	uint64_t e;

	if (!p) {
		tap_fail(name, "mmap failed");
		return;
	}
	madvise(p, HPAGE_SIZE, MADV_HUGEPAGE);
	memset(p, 1, HPAGE_SIZE);
	if (pmd_mapped_blocks(p, HPAGE_SIZE) != 1) {
		tap_skip(name, "the area is not PMD-mapped (no THP available)");
		munmap(p, HPAGE_SIZE);
		return;
	}
	if (ring_open(&r, 64, 0) ||
	    uffd_register(r.uffd, p, HPAGE_SIZE, UFFDIO_REGISTER_MODE_WP,
			  NULL) ||
	    uffd_wp(r.uffd, p, HPAGE_SIZE, UFFDIO_WRITEPROTECT_MODE_WP)) {
		tap_fail(name, "setup failed");
		goto out;
	}
	/* the sync fault is taken on the huge PMD; async then splits it */
	e = blocked_then_async(&r, p + 5 * psz, why, sizeof(why));
	tap_check(e && (e & ~(uint64_t)(psz - 1)) == (uintptr_t)(p + 5 * psz) &&
		  !(e & UFFD_RING_ENTRY_HUGE) && page_wp(p + 6 * psz), name,
		  "%s; entry %#llx, the next page %s", why,
		  (unsigned long long)e,
		  page_wp(p + 6 * psz) ? "protected" : "unprotected");
out:
	munmap(p, HPAGE_SIZE);
	ring_close(&r);
}

static void case_hugetlb(void)
{
	const char *name = "mode-hugetlb";
	struct uring_view r;
	char why[160] = "";
	char *p = mmap(NULL, HPAGE_SIZE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	uint64_t e;

	if (p == MAP_FAILED) {
		tap_skip(name, "no hugetlb page: %s", strerror(errno));
		return;
	}
	memset(p, 1, HPAGE_SIZE);
	if (ring_open(&r, 64, UFFD_FEATURE_WP_HUGETLBFS_SHMEM) ||
	    uffd_register(r.uffd, p, HPAGE_SIZE, UFFDIO_REGISTER_MODE_WP,
			  NULL) ||
	    uffd_wp(r.uffd, p, HPAGE_SIZE, UFFDIO_WRITEPROTECT_MODE_WP)) {
		tap_fail(name, "setup failed");
		goto out;
	}
	e = blocked_then_async(&r, p + 7 * psz, why, sizeof(why));
	tap_check(e && (e & ~(uint64_t)(psz - 1)) == (uintptr_t)p &&
		  (e & UFFD_RING_ENTRY_HUGE), name, "%s; entry %#llx", why,
		  (unsigned long long)e);
out:
	munmap(p, HPAGE_SIZE);
	ring_close(&r);
}

/* PAGEMAP_SCAN's write-protect operation follows the mode: it needs async
 * mode (PM_SCAN_CHECK_WPASYNC says EPERM without it). */
static void case_pagemap_scan(void)
{
	const char *name = "mode-pagemap-scan";
	struct uring_view r;
	char *p = ring_tracked(&r, name, 64, 8);
	long in_sync, in_async;

	if (!p)
		return;
	p[0] = 2;
	uffd_set_async(r.uffd, false);
	in_sync = scan_written_reprotect(p, 8 * psz, NULL, NULL);
	uffd_set_async(r.uffd, true);
	in_async = scan_written_reprotect(p, 8 * psz, NULL, NULL);
	tap_check(in_sync == -EPERM && in_async == 1 && page_wp(p), name,
		  "sync: %ld (expected %d), async: %ld (expected 1), page %s",
		  in_sync, -EPERM, in_async,
		  page_wp(p) ? "protected again" : "unprotected");
	munmap(p, 8 * psz);
	ring_close(&r);
}

/* mode-switch-under-writers */
#define SW_THREADS	4
#define SW_PAGES	256	/* per thread */
#define SW_PHASE	16	/* writes per phase, at least */

struct sw {
	struct uring_view r;
	char *mem;
	size_t npages;
	unsigned char *seen;	/* per page: 1 logged, 2 delivered */
	volatile int written;	/* pages stored so far, all threads */
	volatile int stop;
	volatile int delivered;
	volatile int errors;
};

struct sw_writer {
	struct sw *s;
	int id;
	pthread_t t;
};

static void *sw_write(void *arg)
{
	struct sw_writer *w = arg;
	char *base = w->s->mem + (size_t)w->id * SW_PAGES * psz;

	for (int i = 0; i < SW_PAGES; i++) {
		base[i * psz] = (char)(w->id + 2);
		__atomic_add_fetch(&w->s->written, 1, __ATOMIC_RELEASE);
		sched_yield();
	}
	return NULL;
}

/* The handler: records each delivered page before it unprotects it. */
static void *sw_handle(void *arg)
{
	struct sw *s = arg;

	while (!s->stop) {
		struct uffd_msg msg;
		unsigned long a;

		if (uffd_read_msg(s->r.uffd, &msg, 20) != 1)
			continue;
		a = msg.arg.pagefault.address & ~(unsigned long)(psz - 1);
		if (msg.event != UFFD_EVENT_PAGEFAULT ||
		    a < (uintptr_t)s->mem ||
		    a >= (uintptr_t)s->mem + s->npages * psz) {
			s->errors++;
			continue;
		}
		__atomic_or_fetch(&s->seen[(a - (uintptr_t)s->mem) / psz], 2,
				  __ATOMIC_RELEASE);
		s->delivered++;
		if (uffd_wp(s->r.uffd, (void *)a, psz, 0))
			s->errors++;
	}
	return NULL;
}

/* Mark every page the ring names; then a page without protection must be
 * marked.  The first page that is not, or -1. */
static long sw_unrecorded(struct sw *s, int pm, uint64_t *pme)
{
	uint64_t prod = ring_producer(&s->r);

	for (uint64_t i = s->r.consumer; i < prod; i++) {
		unsigned long a = ring_entry(&s->r, i) & ~(uint64_t)(psz - 1);

		if (a >= (uintptr_t)s->mem &&
		    a < (uintptr_t)s->mem + s->npages * psz)
			__atomic_or_fetch(&s->seen[(a - (uintptr_t)s->mem) / psz],
					  1, __ATOMIC_RELEASE);
	}
	s->r.consumer = prod;
	if (pread(pm, pme, s->npages * 8,
		  (uintptr_t)s->mem / psz * 8) != (ssize_t)(s->npages * 8))
		return -2;
	for (size_t i = 0; i < s->npages; i++)
		if (!(pme[i] & PM_UFFD_WP) &&
		    !__atomic_load_n(&s->seen[i], __ATOMIC_ACQUIRE))
			return i;
	return -1;
}

static void case_switch_under_writers(void)
{
	const char *name = "mode-switch-under-writers";
	struct sw s = { .npages = SW_THREADS * SW_PAGES };
	struct sw_writer w[SW_THREADS];
	pthread_t handler;
	uint64_t *pme = calloc(s.npages, 8);
	int pm = open("/proc/self/pagemap", O_RDONLY), started = 0;
	int switches = 0, logged = 0, err = 0;
	long bad = -1;
	bool async = true;

	s.seen = calloc(s.npages, 1);
	s.mem = ring_tracked(&s.r, name, 4096, s.npages);
	if (!s.mem)
		goto out_free;
	if (!pme || !s.seen || pm < 0 ||
	    pthread_create(&handler, NULL, sw_handle, &s)) {
		tap_fail(name, "setup failed");
		goto out_ring;
	}
	for (; started < SW_THREADS; started++) {
		w[started] = (struct sw_writer){ .s = &s, .id = started };
		if (pthread_create(&w[started].t, NULL, sw_write,
				   &w[started]))
			break;
	}
	while (started == SW_THREADS &&
	       __atomic_load_n(&s.written, __ATOMIC_ACQUIRE) <
	       (int)s.npages) {
		int mark = __atomic_load_n(&s.written, __ATOMIC_ACQUIRE);
		long long end = now_ms() + 10000;

		/* let this phase see SW_PHASE writes (or the last ones) */
		while (__atomic_load_n(&s.written, __ATOMIC_ACQUIRE) <
		       mark + SW_PHASE &&
		       __atomic_load_n(&s.written, __ATOMIC_ACQUIRE) <
		       (int)s.npages && now_ms() < end)
			usleep(200);
		err = uffd_set_async(s.r.uffd, !async);
		if (err)
			break;
		async = !async;
		switches++;
		/* every async resolution before the switch is in the ring */
		if (!async && (bad = sw_unrecorded(&s, pm, pme)) != -1)
			break;
	}
	if (!async && !err)
		err = uffd_set_async(s.r.uffd, true);
	for (int i = 0; i < started; i++)
		pthread_join(w[i].t, NULL);
	s.stop = 1;
	pthread_join(handler, NULL);
	if (bad == -1)
		bad = sw_unrecorded(&s, pm, pme);
	for (size_t i = 0; i < s.npages; i++)
		logged += s.seen[i] & 1;	/* all threads joined */
	for (size_t i = 0; bad == -1 && i < s.npages; i++)
		if (s.mem[i * psz] != (char)(i / SW_PAGES + 2) ||
		    (pme[i] & PM_UFFD_WP))
			bad = -3;
	tap_diag("%s: %d switches, %d pages logged, %d delivered", name,
		 switches, logged, s.delivered);
	tap_check(started == SW_THREADS && !err && bad == -1 && !s.errors &&
		  logged > 0 && s.delivered > 0, name,
		  "started %d, switch error %d, first unrecorded page %ld (-2: pagemap, -3: content or protection wrong), handler errors %d",
		  started, err, bad, s.errors);
out_ring:
	munmap(s.mem, s.npages * psz);
	ring_close(&s.r);
out_free:
	if (pm >= 0)
		close(pm);
	free(pme);
	free(s.seen);
}

int main(void)
{
	psz = page_size();
	watchdog(300);
	tap_plan(14);
	if (!ring_supported())
		tap_bail("UFFDIO_API does not offer UFFD_FEATURE_WP_RING");
	if (!set_mode_supported())
		tap_bail("UFFDIO_API does not offer UFFDIO_SET_MODE");
	case_advertised();
	case_bad_input();
	case_esrch();
	case_async_to_sync();
	case_sync_to_async(false);
	case_sync_to_async(true);
	case_missing_waits();
	case_overflow_kept();
	case_back_and_forth();
	case_file_range();
	case_thp();
	case_hugetlb();
	case_pagemap_scan();
	case_switch_under_writers();
	return tap_done();
}
