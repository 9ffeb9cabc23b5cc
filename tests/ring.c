// SPDX-License-Identifier: GPL-2.0
/*
 * ring: the write-log ring of async uffd-wp (UFFD_FEATURE_WP_RING).
 *
 * Every write fault the kernel resolves in async mode is logged once; a
 * full ring sets the overflow flag and the page tables (PAGEMAP_SCAN) still
 * find every written page; UFFDIO_RING_RESET re-protects what was harvested
 * so the next write is logged again, or discards it for a scan to find;
 * bad input gets an errno and the
 * mapping exposes the ring and nothing else.
 */
#define _GNU_SOURCE
#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mman.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NPAGES	256

static long psz;

/* Harvest [consumer, producer) into SEEN (one counter per page of the
 * area at BASE) and reset; returns entries read or -errno. */
static long harvest(struct uring_view *r, char *base, size_t npages,
		    unsigned char *seen, long *outside, uint64_t *reprot)
{
	uint64_t prod = ring_producer(r), i;
	long n = 0;
	int err;

	for (i = r->consumer; i < prod; i++, n++) {
		unsigned long a = ring_entry(r, i) & ~(unsigned long)(psz - 1);

		if (a >= (unsigned long)base &&
		    a < (unsigned long)base + npages * psz)
			seen[(a - (unsigned long)base) / psz]++;
		else if (outside)
			(*outside)++;
	}
	err = ring_reset(r, prod, 0, reprot);
	return err ? err : n;
}

static bool need_ring(const char *name)
{
	if (ring_supported())
		return true;
	tap_fail(name, "UFFDIO_API does not offer UFFD_FEATURE_WP_RING");
	return false;
}

static void case_feature(void)
{
	uint64_t got = 0;
	int fd;

	fd = uffd_open(UFFD_FEATURE_WP_RING, NULL);
	tap_check(fd == -EINVAL, "api-ring-needs-async",
		  "UFFDIO_API(WP_RING without WP_ASYNC) gave %d, want -EINVAL",
		  fd);
	if (fd >= 0)
		close(fd);
	fd = uffd_open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING, &got);
	tap_check(fd >= 0 && (got & UFFD_FEATURE_WP_RING), "api-ring-offered",
		  "UFFDIO_API(WP_ASYNC|WP_RING) gave %d, features %#llx",
		  fd, (unsigned long long)got);
	if (fd >= 0)
		close(fd);
}

static int setup_errno(int fd, uint64_t entries, uint64_t flags)
{
	struct uffdio_ring_setup s = { .entries = entries, .flags = flags };

	return ioctl(fd, UFFDIO_RING_SETUP, &s) ? -errno : 0;
}

static void case_setup_bad(void)
{
	static const uint64_t bad[] = { 0, 1, 32, 63, 100, 4095,
		UFFD_RING_MAX_ENTRIES * 2ULL, ~0ULL, 1ULL << 40 };
	const char *name = "setup-bad-size";
	unsigned int i;
	int fd, e;

	fd = uffd_open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING, NULL);
	if (fd < 0) {
		tap_fail(name, "uffd_open: %d", fd);
		tap_fail("setup-bad-flags", "no uffd");
		tap_fail("setup-twice", "no uffd");
		return;
	}
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		e = setup_errno(fd, bad[i], 0);
		if (e != -EINVAL)
			break;
	}
	tap_check(i == sizeof(bad) / sizeof(bad[0]), name,
		  "entries=%llu gave %d, want -EINVAL",
		  (unsigned long long)bad[i < 9 ? i : 0], e);
	e = setup_errno(fd, 64, 1);
	tap_check(e == -EINVAL, "setup-bad-flags", "flags=1 gave %d", e);
	e = setup_errno(fd, 64, 0);
	if (e) {
		tap_fail("setup-twice", "valid setup failed: %d", e);
	} else {
		e = setup_errno(fd, 128, 0);
		tap_check(e == -EBUSY, "setup-twice",
			  "second UFFDIO_RING_SETUP gave %d, want -EBUSY", e);
	}
	close(fd);
}

static void case_setup_order(void)
{
	char *p = mmap(NULL, psz, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int fd, e;

	/* Without the feature the ioctl is refused. */
	fd = uffd_open(UFFD_FEATURE_WP_ASYNC, NULL);
	e = fd < 0 ? fd : setup_errno(fd, 64, 0);
	tap_check(e == -EINVAL, "setup-without-feature",
		  "UFFDIO_RING_SETUP on a WP_ASYNC-only uffd gave %d", e);
	if (fd >= 0)
		close(fd);

	/* A ring context registers only once the ring exists... */
	fd = uffd_open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING, NULL);
	e = fd < 0 ? fd : uffd_register(fd, p, psz, UFFDIO_REGISTER_MODE_WP,
					NULL);
	tap_check(e == -EINVAL, "register-before-setup",
		  "REGISTER before UFFDIO_RING_SETUP gave %d, want -EINVAL", e);
	/* ...and the ring cannot be set up once ranges are registered. */
	if (fd >= 0 && !setup_errno(fd, 64, 0) &&
	    !uffd_register(fd, p, psz, UFFDIO_REGISTER_MODE_WP, NULL)) {
		e = setup_errno(fd, 64, 0);
		tap_check(e == -EBUSY, "setup-after-register",
			  "setup after REGISTER gave %d, want -EBUSY", e);
	} else {
		tap_fail("setup-after-register", "could not set up and register");
	}
	if (fd >= 0)
		close(fd);
	munmap(p, psz);
}

/* vm.uffd_ring_max_entries caps the ring: a larger setup gets -EPERM,
 * one at the cap works, and nothing else is limited by it. */
static void case_setup_cap(void)
{
	const char *name = "setup-above-sysctl-cap";
	const char *knob = "/proc/sys/vm/uffd_ring_max_entries";
	char old[32] = "";
	int fd, kfd, e1, e2, e3;
	ssize_t n;

	kfd = open(knob, O_RDWR);
	if (kfd < 0) {
		tap_fail(name, "%s: %s", knob, strerror(errno));
		return;
	}
	n = read(kfd, old, sizeof(old) - 1);
	if (n <= 0 || pwrite(kfd, "1024", 4, 0) != 4) {
		tap_fail(name, "setting %s to 1024: %s", knob, strerror(errno));
		close(kfd);
		return;
	}
	fd = uffd_open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING, NULL);
	e1 = fd < 0 ? fd : setup_errno(fd, 2048, 0);
	e2 = fd < 0 ? fd : setup_errno(fd, 1024, 0);
	if (fd >= 0)
		close(fd);
	/* the cap itself is bounded by what the interface allows */
	e3 = pwrite(kfd, "32", 2, 0) == 2 ? 0 : -errno;
	if (pwrite(kfd, old, n, 0) != n)
		tap_diag("could not restore %s to %s", knob, old);
	close(kfd);
	tap_check(e1 == -EPERM && e2 == 0 && e3 == -EINVAL, name,
		  "with the cap at 1024: 2048 entries gave %d (want -EPERM), 1024 gave %d (want 0); setting the cap to 32 gave %d (want -EINVAL)",
		  e1, e2, e3);
}

/* Write VAL to cgroup file DIR/FILE: 0 or -errno. */
static int cg_write(const char *dir, const char *file, const char *val)
{
	char path[256];
	int fd, e = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	fd = open(path, O_WRONLY);
	if (fd < 0)
		return -errno;
	if (write(fd, val, strlen(val)) < 0)
		e = -errno;
	close(fd);
	return e;
}

/*
 * The ring is charged to the memory cgroup of the task that sets it up: in
 * a cgroup whose memory.max is below the ring's size the setup fails with
 * -ENOMEM (and a small ring still works there), and once the task is gone
 * the cgroup is empty again and can be removed.
 */
static void case_setup_memcg(void)
{
	const char *name = "setup-charged-to-memcg";
	const char *root = "/tmp/ring-cg", *cg = "/tmp/ring-cg/small";
	char pid[32];
	int status = -1, e;
	pid_t child;

	mkdir(root, 0755);
	if (mount("none", root, "cgroup2", 0, NULL) && errno != EBUSY) {
		tap_fail(name, "mount cgroup2: %s", strerror(errno));
		return;
	}
	e = cg_write(root, "cgroup.subtree_control", "+memory");
	if (!e && mkdir(cg, 0755) && errno != EEXIST)
		e = -errno;
	if (!e)
		e = cg_write(cg, "memory.max", "4M");
	if (e) {
		tap_fail(name, "setting up a memory cgroup: %s", strerror(-e));
		goto out;
	}
	child = fork();
	if (child == 0) {
		int fd, big, small;

		snprintf(pid, sizeof(pid), "%d", getpid());
		if (cg_write(cg, "cgroup.procs", pid))
			_exit(90);
		/* 4M entries: 32 MiB of ring in a 4 MiB cgroup */
		fd = uffd_open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING, NULL);
		big = fd < 0 ? fd : setup_errno(fd, UFFD_RING_MAX_ENTRIES, 0);
		if (fd >= 0)
			close(fd);
		fd = uffd_open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING, NULL);
		small = fd < 0 ? fd : setup_errno(fd, 1024, 0);
		if (fd >= 0)
			close(fd);
		_exit(big == -ENOMEM && small == 0 ? 0 :
		      big == -ENOMEM ? 91 : big == 0 ? 92 : 93);
	}
	waitpid(child, &status, 0);
	/* the charge goes with the ring: an empty cgroup can be removed */
	e = rmdir(cg) ? -errno : 0;
	tap_check(WIFEXITED(status) && WEXITSTATUS(status) == 0 && e == 0, name,
		  "child status %#x (91: the small ring failed too, 92: the 32 MiB ring fit in a 4 MiB cgroup, 93: another error, 90: could not join), rmdir of the cgroup afterwards gave %d",
		  status, e);
out:
	rmdir(cg);
	umount2(root, MNT_DETACH);
	rmdir(root);
}

static sigjmp_buf jump;
static volatile sig_atomic_t got_sig;

static void on_fault(int sig)
{
	got_sig = sig;
	siglongjmp(jump, 1);
}

/* Read *P; returns the signal it raised, or 0. */
static int probe_read(const volatile char *p)
{
	struct sigaction sa = { .sa_handler = on_fault }, o1, o2;
	int sig = 0;

	sigaction(SIGSEGV, &sa, &o1);
	sigaction(SIGBUS, &sa, &o2);
	got_sig = 0;
	if (!sigsetjmp(jump, 1))
		(void)*p;
	sig = got_sig;
	sigaction(SIGSEGV, &o1, NULL);
	sigaction(SIGBUS, &o2, NULL);
	return sig;
}

static void case_mmap(void)
{
	struct uffdio_ring_setup s = { .entries = 1024 };
	struct uffd_ring_header *h;
	char *resv, *m;
	int fd, e;

	fd = uffd_open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING, NULL);
	if (fd < 0) {
		tap_bail("uffd_open: %d", fd);
	}
	m = mmap(NULL, psz, PROT_READ, MAP_SHARED, fd, 0);
	e = m == MAP_FAILED ? -errno : 0;
	tap_check(e == -ENODEV, "mmap-before-setup",
		  "mmap before UFFDIO_RING_SETUP gave %d, want -ENODEV", e);
	if (ioctl(fd, UFFDIO_RING_SETUP, &s))
		tap_bail("UFFDIO_RING_SETUP: %s", strerror(errno));

	m = mmap(NULL, s.mmap_size + psz, PROT_READ, MAP_SHARED, fd, 0);
	e = m == MAP_FAILED ? -errno : 0;
	tap_check(e == -EINVAL, "mmap-wrong-size",
		  "mmap of mmap_size + 1 page gave %d, want -EINVAL", e);
	m = mmap(NULL, s.mmap_size - psz, PROT_READ, MAP_SHARED, fd, psz);
	e = m == MAP_FAILED ? -errno : 0;
	tap_check(e == -EINVAL, "mmap-wrong-offset",
		  "mmap at offset 1 page gave %d, want -EINVAL", e);
	m = mmap(NULL, s.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	e = m == MAP_FAILED ? -errno : 0;
	tap_check(e == -EACCES, "mmap-writable",
		  "PROT_WRITE mapping gave %d, want -EACCES", e);
	m = mmap(NULL, s.mmap_size, PROT_READ, MAP_PRIVATE, fd, 0);
	e = m == MAP_FAILED ? -errno : 0;
	tap_check(e == -EINVAL, "mmap-private",
		  "MAP_PRIVATE mapping gave %d, want -EINVAL", e);

	/* The mapping: header as documented, read-only, no growth, and the
	 * page after it is not part of it. */
	resv = mmap(NULL, s.mmap_size + psz, PROT_NONE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	h = mmap(resv, s.mmap_size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
	if (resv == MAP_FAILED || h == MAP_FAILED) {
		tap_fail("ring-header", "mmap of the ring failed: %s",
			 strerror(errno));
		tap_fail("ring-readonly", "no mapping");
		tap_fail("ring-bounds", "no mapping");
		close(fd);
		return;
	}
	tap_check(h->producer == 0 && h->consumer == 0 && h->flags == 0 &&
		  h->entries == 1024 && h->entry_offset == (uint64_t)psz &&
		  s.mmap_size == psz + 1024 * sizeof(uint64_t),
		  "ring-header",
		  "producer %llu consumer %llu flags %llu entries %llu offset %llu size %llu",
		  (unsigned long long)h->producer,
		  (unsigned long long)h->consumer,
		  (unsigned long long)h->flags, (unsigned long long)h->entries,
		  (unsigned long long)h->entry_offset,
		  (unsigned long long)s.mmap_size);
	e = mprotect(h, s.mmap_size, PROT_READ | PROT_WRITE) ? -errno : 0;
	{
		void *g = mremap(h, s.mmap_size, s.mmap_size + psz, 0);
		int ge = g == MAP_FAILED ? -errno : 0;
		int xe = mprotect(h, s.mmap_size, PROT_READ | PROT_EXEC) ?
			 -errno : 0;

		tap_check(e == -EACCES && ge != 0 && xe == -EACCES,
			  "ring-readonly",
			  "mprotect(PROT_WRITE) gave %d (want -EACCES), mremap grow gave %d, mprotect(PROT_EXEC) gave %d (want -EACCES)",
			  e, ge, xe);
	}
	e = probe_read(resv + s.mmap_size);
	tap_check(e == SIGSEGV || e == SIGBUS, "ring-bounds",
		  "reading the page after the ring raised signal %d", e);
	munmap(resv, s.mmap_size + psz);
	close(fd);
}

static void case_logging(void)
{
	static unsigned char seen[NPAGES];
	const char *name = "logs-each-write-once";
	struct uring_view r;
	uint64_t reprot = 0;
	long n, outside = 0;
	int err, i, wrong = 0;
	char *p;

	if (!need_ring(name)) {
		tap_fail("reset-reprotects", "no ring");
		tap_fail("rewrite-logged-again", "no ring");
		return;
	}
	err = ring_open(&r, 1024, 0);
	p = err ? NULL : ring_track(&r, NPAGES, true);
	if (!p)
		tap_bail("ring_open/track: %d", err);
	/* Every third page, twice: one entry per page. */
	for (i = 0; i < NPAGES; i += 3)
		p[i * psz] = 2;
	for (i = 0; i < NPAGES; i += 3)
		p[i * psz + 1] = 3;
	memset(seen, 0, sizeof(seen));
	n = harvest(&r, p, NPAGES, seen, &outside, &reprot);
	for (i = 0; i < NPAGES; i++)
		wrong += seen[i] != (i % 3 == 0);
	tap_check(n == (NPAGES + 2) / 3 && !wrong && !outside &&
		  !ring_overflowed(&r), name,
		  "%ld entries, %d pages wrong, %ld outside the area", n,
		  wrong, outside);
	/* The reset protected exactly the harvested pages again. */
	wrong = 0;
	for (i = 0; i < NPAGES; i++)
		wrong += !page_wp(p + i * psz);
	tap_check(reprot == (uint64_t)n && !wrong &&
		  r.hdr->consumer == r.hdr->producer, "reset-reprotects",
		  "reprotected %llu of %ld, %d pages unprotected, consumer %llu producer %llu",
		  (unsigned long long)reprot, n, wrong,
		  (unsigned long long)r.hdr->consumer,
		  (unsigned long long)r.hdr->producer);
	/* A write after the reset faults and is logged again. */
	p[0] = 9;
	p[5 * psz] = 9;
	memset(seen, 0, sizeof(seen));
	n = harvest(&r, p, NPAGES, seen, NULL, NULL);
	tap_check(n == 2 && seen[0] == 1 && seen[5] == 1 && p[0] == 9,
		  "rewrite-logged-again", "%ld entries after rewriting 2 pages",
		  n);
	ring_close(&r);
	munmap(p, NPAGES * psz);
}

/*
 * A reset whose entries jump between PTE tables in write order, some of
 * them paged out since they were logged: every page is protected again
 * (swapped ones in their swap entry), keeps what was written, and its next
 * write is logged once more.
 */
#define TBL_PAGES	2048	/* four PTE tables of 4 KiB pages */
#define TBL_WRITTEN	256
#define TBL_STEP	517	/* odd, so the walk visits distinct pages */

static void case_reset_across_tables(void)
{
	static unsigned char seen[TBL_PAGES];
	static int order[TBL_PAGES];	/* write number of each page, or -1 */
	const char *name = "reset-across-tables";
	int i, wrong = 0, unprot = 0, lost = 0, swapped = 0, relogged = 0;
	struct uring_view r;
	uint64_t reprot = 0;
	long n;
	char *p;

	if (!need_ring(name))
		return;
	if (ring_open(&r, 1024, 0) || !(p = ring_track(&r, TBL_PAGES, true)))
		tap_bail("ring_open/track");
	memset(order, -1, sizeof(order));
	for (i = 0; i < TBL_WRITTEN; i++) {
		order[i * TBL_STEP % TBL_PAGES] = i;
		p[(size_t)(i * TBL_STEP % TBL_PAGES) * psz] = (char)(i | 1);
	}
	/* Every eighth written page goes to swap before the reset. */
	for (i = 0; i < TBL_WRITTEN; i += 8)
		madvise(p + (size_t)(i * TBL_STEP % TBL_PAGES) * psz, psz,
			MADV_PAGEOUT);
	for (i = 0; i < TBL_WRITTEN; i++)
		swapped += !!(pagemap_entry(p + (size_t)(i * TBL_STEP % TBL_PAGES) *
					    psz) & PM_SWAP);
	memset(seen, 0, sizeof(seen));
	n = harvest(&r, p, TBL_PAGES, seen, NULL, &reprot);
	for (i = 0; i < TBL_PAGES; i++) {
		wrong += seen[i] != (order[i] >= 0);
		unprot += !page_wp(p + (size_t)i * psz);
		lost += order[i] >= 0 && p[(size_t)i * psz] != (char)(order[i] | 1);
	}
	/* Written again in the opposite order: each logged once more. */
	for (i = TBL_WRITTEN - 1; i >= 0; i--)
		p[(size_t)(i * TBL_STEP % TBL_PAGES) * psz + 1] = 1;
	memset(seen, 0, sizeof(seen));
	if (harvest(&r, p, TBL_PAGES, seen, NULL, NULL) == TBL_WRITTEN)
		for (i = 0; i < TBL_PAGES; i++)
			relogged += seen[i] == 1;
	tap_check(n == TBL_WRITTEN && reprot == TBL_WRITTEN && !wrong &&
		  !unprot && !lost && relogged == TBL_WRITTEN, name,
		  "%ld entries, %llu reprotected, %d pages logged wrongly, %d unprotected, %d lost their data, %d of %d logged again",
		  n, (unsigned long long)reprot, wrong, unprot, lost, relogged,
		  TBL_WRITTEN);
	tap_diag("%s: %d of %d written pages were in swap at the reset", name,
		 swapped, TBL_WRITTEN);
	ring_close(&r);
	munmap(p, (size_t)TBL_PAGES * psz);
}

static void case_reset_bad(void)
{
	struct uring_view r;
	uint64_t prod;
	int e1, e2, e3, e4, fd;
	char *p;

	if (!need_ring("reset-bad-input"))
		return;
	if (ring_open(&r, 64, 0) || !(p = ring_track(&r, 4, true)))
		tap_bail("ring_open/track");
	p[0] = 1;
	p[psz] = 1;
	prod = ring_producer(&r);
	e1 = ring_reset(&r, prod + 1, 0, NULL);
	e2 = ring_reset(&r, prod, 1ULL << 7, NULL);
	e3 = ring_reset(&r, prod, 0, NULL);	/* valid: consumer = 2 */
	e4 = ring_reset(&r, prod - 1, 0, NULL);	/* backwards */
	fd = uffd_open(UFFD_FEATURE_WP_ASYNC, NULL);
	{
		struct uffdio_ring_reset rr = { 0 };
		int e5 = ioctl(fd, UFFDIO_RING_RESET, &rr) ? -errno : 0;

		tap_check(prod == 2 && e1 == -EINVAL && e2 == -EINVAL &&
			  e3 == 0 && e4 == -EINVAL && e5 == -EINVAL &&
			  r.hdr->consumer == 2, "reset-bad-input",
			  "producer %llu; past producer %d, bad flags %d, valid %d, backwards %d, no ring %d",
			  (unsigned long long)prod, e1, e2, e3, e4, e5);
	}
	close(fd);
	ring_close(&r);
	munmap(p, 4 * psz);
}

struct scan_set {
	char *base;
	size_t npages;
	unsigned char *seen;
	long outside;
};

static void mark_page(unsigned long page, void *arg)
{
	struct scan_set *s = arg;

	if (page >= (unsigned long)s->base &&
	    page < (unsigned long)s->base + s->npages * psz)
		s->seen[(page - (unsigned long)s->base) / psz]++;
	else
		s->outside++;
}

static void case_overflow(void)
{
	static unsigned char seen[NPAGES];
	struct scan_set set = { .seen = seen, .npages = NPAGES };
	const char *name = "overflow-flag";
	struct uring_view r;
	uint64_t prod;
	long n, scanned;
	int i, missing = 0, wrote = 200;
	char *p;

	if (!need_ring(name)) {
		tap_fail("overflow-recovery", "no ring");
		return;
	}
	if (ring_open(&r, 64, 0) || !(p = ring_track(&r, NPAGES, true)))
		tap_bail("ring_open/track");
	set.base = p;
	for (i = 0; i < wrote; i++)
		p[i * psz] = 7;
	prod = ring_producer(&r);
	tap_check(ring_overflowed(&r) && prod == 64, name,
		  "after %d writes into a 64-entry ring: producer %llu, flags %llu",
		  wrote, (unsigned long long)prod,
		  (unsigned long long)r.hdr->flags);
	/* Recovery: take what the ring holds, clear the flag, then one scan
	 * finds (and re-protects) the rest. */
	memset(seen, 0, sizeof(seen));
	for (i = 0; (uint64_t)i < prod; i++)
		mark_page(ring_entry(&r, i) & ~(unsigned long)(psz - 1), &set);
	n = ring_reset(&r, prod, UFFDIO_RING_RESET_CLEAR_OVERFLOW, NULL);
	scanned = scan_written_reprotect(p, NPAGES * psz, mark_page, &set);
	for (i = 0; i < NPAGES; i++)
		missing += (i < wrote) != (seen[i] > 0);
	/* After recovery the ring logs again. */
	p[(NPAGES - 1) * psz] = 8;
	tap_check(n == 0 && scanned >= wrote - 64 && !missing &&
		  !set.outside && !ring_overflowed(&r) &&
		  ring_producer(&r) == prod + 1 &&
		  (ring_entry(&r, prod) & ~(uint64_t)(psz - 1)) ==
		  (uint64_t)(unsigned long)(p + (NPAGES - 1) * psz),
		  "overflow-recovery",
		  "reset %ld, scan found %ld, %d pages wrong, flag %d, producer %llu",
		  n, scanned, missing, ring_overflowed(&r),
		  (unsigned long long)ring_producer(&r));
	ring_close(&r);
	munmap(p, NPAGES * psz);
}

/*
 * UFFDIO_RING_RESET_DISCARD hands the slots back without protecting the
 * pages: they stay writable (pagemap shows no uffd-wp bit) and are not
 * logged again, and after an overflow one PAGEMAP_SCAN round then finds
 * every written page, the discarded ones included, as still written.
 */
static void case_discard(void)
{
	static unsigned char seen[NPAGES];
	struct scan_set set = { .seen = seen, .npages = NPAGES };
	uint64_t prod, reprot = 1;
	struct uring_view r;
	int i, err, missing = 0, wrote = 200;
	long scanned;
	char *p;

	if (!need_ring("reset-discard")) {
		tap_fail("overflow-recovery-discard", "no ring");
		return;
	}
	if (ring_open(&r, 64, 0) || !(p = ring_track(&r, NPAGES, true)))
		tap_bail("ring_open/track");
	for (i = 0; i < 3; i++)
		p[i * psz] = 5;
	prod = ring_producer(&r);
	err = ring_reset(&r, prod, UFFDIO_RING_RESET_DISCARD, &reprot);
	{
		bool left = !page_wp(p) && !page_wp(p + psz) &&
			    !page_wp(p + 2 * psz) && page_wp(p + 3 * psz);

		p[0] = 6;
		p[3 * psz] = 6;
		tap_check(prod == 3 && !err && reprot == 0 &&
			  r.hdr->consumer == 3 && left &&
			  ring_producer(&r) == 4 &&
			  (ring_entry(&r, 3) & ~(uint64_t)(psz - 1)) ==
			  (uint64_t)(unsigned long)(p + 3 * psz),
			  "reset-discard",
			  "producer %llu; discard %d, reprotected %llu, consumer %llu, written pages left writable %d, producer after two writes %llu",
			  (unsigned long long)prod, err,
			  (unsigned long long)reprot,
			  (unsigned long long)r.hdr->consumer, left,
			  (unsigned long long)ring_producer(&r));
	}
	/* Protect everything again, then overflow the ring. */
	scan_written_reprotect(p, NPAGES * psz, NULL, NULL);
	err = ring_reset(&r, ring_producer(&r), 0, NULL);
	set.base = p;
	memset(seen, 0, sizeof(seen));
	for (i = 0; i < wrote; i++)
		p[i * psz] = 7;
	prod = ring_producer(&r);
	reprot = 1;
	ring_overflowed(&r);	/* the overflow this recovery clears */
	if (!err)
		err = ring_reset(&r, prod, UFFDIO_RING_RESET_CLEAR_OVERFLOW |
				 UFFDIO_RING_RESET_DISCARD, &reprot);
	scanned = scan_written_reprotect(p, NPAGES * psz, mark_page, &set);
	for (i = 0; i < NPAGES; i++)
		missing += (i < wrote) != (seen[i] > 0);
	p[(NPAGES - 1) * psz] = 8;
	tap_check(!err && reprot == 0 && scanned == wrote && !missing &&
		  !set.outside && !ring_overflowed(&r) &&
		  ring_producer(&r) == prod + 1,
		  "overflow-recovery-discard",
		  "reset %d, reprotected %llu, scan found %ld of %d, %d pages wrong, flag %d, producer %llu",
		  err, (unsigned long long)reprot, scanned, wrote, missing,
		  ring_overflowed(&r), (unsigned long long)ring_producer(&r));
	ring_close(&r);
	munmap(p, NPAGES * psz);
}

/*
 * Writers store increasing sequence numbers into their own pages while the
 * harvester copies every logged page into a shadow after each reset.  When
 * the writers stop, a last harvest must leave the shadow equal to memory:
 * nothing written was missed, whether it came through the ring or through
 * the overflow scan.
 */
#define MT_PAGES	1024
#define MT_THREADS	4
#define MT_RING		256	/* entries: most rounds overflow */

struct mt_writer {
	pthread_t t;
	uint64_t *base;
	int first, stride;
	volatile int *stop;
	uint64_t writes;
};

static void *mt_write(void *arg)
{
	struct mt_writer *w = arg;
	uint64_t seq = 1, x = (uint64_t)w->first * 2654435761u + 1;

	while (!*w->stop) {
		int k;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		k = w->first + (int)(x % (MT_PAGES / w->stride)) * w->stride;
		w->base[k * psz / 8] = seq++;
		w->writes++;
	}
	return NULL;
}

struct mt_state {
	char *p;
	char *shadow;
};

static void mt_copy(unsigned long page, void *arg)
{
	struct mt_state *s = arg;
	size_t off = page - (unsigned long)s->p;

	if (off < (size_t)MT_PAGES * psz)
		memcpy(s->shadow + off, s->p + off, psz);
}

static void case_multithread(bool discard)
{
	const char *name = discard ? "multithread-no-write-lost-discard" :
				     "multithread-no-write-lost";
	static uint64_t harvested[MT_RING];
	struct mt_writer w[MT_THREADS];
	struct mt_state s;
	struct uring_view r;
	volatile int stop = 0;
	uint64_t last = 0, writes = 0, prod, i;
	int t, rounds = 0, overflows = 0, err;
	long bad = -1, logged = 0;
	long long start;

	if (!need_ring(name))
		return;
	if (ring_open(&r, MT_RING, 0) || !(s.p = ring_track(&r, MT_PAGES, true)))
		tap_bail("ring_open/track");
	s.shadow = malloc((size_t)MT_PAGES * psz);
	memcpy(s.shadow, s.p, (size_t)MT_PAGES * psz);
	for (t = 0; t < MT_THREADS; t++) {
		w[t] = (struct mt_writer){ .base = (uint64_t *)s.p,
			.first = t, .stride = MT_THREADS, .stop = &stop };
		pthread_create(&w[t].t, NULL, mt_write, &w[t]);
	}
	start = now_ms();
	for (rounds = 0; rounds < 60; rounds++) {
		bool over, discarding;

		usleep(20000);
		/* 60 rounds, or fewer (at least 10) when a slow guest makes
		 * them take more than 15 s. */
		if (rounds == 59 || (rounds >= 9 && now_ms() - start > 15000)) {
			rounds = 59;
			stop = 1;
			for (t = 0; t < MT_THREADS; t++)
				pthread_join(w[t].t, NULL);
		}
		prod = ring_producer(&r);
		over = ring_overflowed(&r);
		/*
		 * The entries are read before the reset: it hands their
		 * slots back, and new faults overwrite them at once.  The
		 * pages are copied after it re-protected them.  A discarding
		 * reset leaves them writable for the scan to find instead.
		 */
		discarding = discard && over;
		for (i = last; i < prod && !discarding; i++)
			harvested[i - last] = ring_entry(&r, i);
		err = ring_reset(&r, prod,
				 (over ? UFFDIO_RING_RESET_CLEAR_OVERFLOW : 0) |
				 (discarding ? UFFDIO_RING_RESET_DISCARD : 0),
				 NULL);
		if (err)
			break;
		for (i = last; i < prod && !discarding; i++)
			mt_copy(harvested[i - last] & ~(uint64_t)(psz - 1), &s);
		logged += prod - last;
		last = prod;
		if (over) {
			overflows++;
			if (scan_written_reprotect(s.p, (size_t)MT_PAGES * psz,
						   mt_copy, &s) < 0)
				break;
		}
	}
	for (t = 0; t < MT_THREADS; t++)
		writes += w[t].writes;
	if (rounds == 60)
		bad = first_diff(s.p, s.shadow, (size_t)MT_PAGES * psz);
	tap_check(rounds == 60 && bad < 0 && writes > 0, name,
		  "%d rounds, %llu writes, %ld logged, %d overflow rounds, first difference at byte %ld",
		  rounds, (unsigned long long)writes, logged, overflows, bad);
	tap_diag("%llu writes by %d threads, %ld entries logged, %d rounds overflowed, %lld ms",
		 (unsigned long long)writes, MT_THREADS, logged, overflows,
		 now_ms() - start);
	free(s.shadow);
	ring_close(&r);
	munmap(s.p, (size_t)MT_PAGES * psz);
}

static void case_unpopulated(void)
{
	static unsigned char seen[16];
	const char *name = "unpopulated-logged";
	struct uring_view r;
	long n;
	char *p;

	if (!need_ring(name))
		return;
	if (ring_open(&r, 64, 0) || !(p = ring_track(&r, 16, false)))
		tap_bail("ring_open/track");
	p[3 * psz] = 1;
	p[3 * psz + 10] = 2;
	p[9 * psz] = 1;
	memset(seen, 0, sizeof(seen));
	n = harvest(&r, p, 16, seen, NULL, NULL);
	tap_check(n == 2 && seen[3] == 1 && seen[9] == 1 && page_wp(p + 3 * psz),
		  name, "%ld entries for 2 first writes to unpopulated pages",
		  n);
	ring_close(&r);
	munmap(p, 16 * psz);
}

static void case_thp(void)
{
	const char *name = "thp-logged-as-pages";
	struct uring_view r;
	uint64_t e0, e1;
	long thp_kb;
	char *p;

	if (!need_ring(name))
		return;
	p = map_anon_aligned(HPAGE_SIZE, HPAGE_SIZE);
	if (!p || madvise(p, HPAGE_SIZE, MADV_HUGEPAGE))
		tap_bail("map/madvise");
	memset(p, 1, HPAGE_SIZE);
	thp_kb = smaps_field_kb(p, "AnonHugePages");
	if (thp_kb < 2048) {
		tap_skip(name, "no THP for the area (AnonHugePages %ld kB)",
			 thp_kb);
		munmap(p, HPAGE_SIZE);
		return;
	}
	if (ring_open(&r, 64, 0) ||
	    uffd_register(r.uffd, p, HPAGE_SIZE, UFFDIO_REGISTER_MODE_WP, NULL) ||
	    uffd_wp(r.uffd, p, HPAGE_SIZE, UFFDIO_WRITEPROTECT_MODE_WP))
		tap_bail("ring_open/register");
	/* Async mode splits the protected PMD on the first write: the log
	 * names the 4 KiB page written, not the 2 MiB extent. */
	p[5 * psz + 7] = 2;
	p[300 * psz] = 2;
	e0 = ring_entry(&r, 0);
	e1 = ring_entry(&r, 1);
	tap_check(ring_producer(&r) == 2 &&
		  e0 == (uint64_t)(unsigned long)(p + 5 * psz) &&
		  e1 == (uint64_t)(unsigned long)(p + 300 * psz) &&
		  page_wp(p + 6 * psz) && !page_wp(p + 5 * psz), name,
		  "producer %llu, entries %#llx %#llx for writes at %p and %p",
		  (unsigned long long)ring_producer(&r),
		  (unsigned long long)e0, (unsigned long long)e1,
		  (void *)(p + 5 * psz), (void *)(p + 300 * psz));
	ring_close(&r);
	munmap(p, HPAGE_SIZE);
}

static void case_hugetlb(void)
{
	const char *name = "hugetlb-huge-entry";
	struct uring_view r;
	uint64_t e, rep = 0;
	char *p;

	if (!need_ring(name))
		return;
	p = mmap(NULL, 2 * HPAGE_SIZE, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	if (p == MAP_FAILED) {
		tap_skip(name, "no hugetlb pages: %s", strerror(errno));
		return;
	}
	memset(p, 1, 2 * HPAGE_SIZE);
	if (ring_open(&r, 64, UFFD_FEATURE_WP_HUGETLBFS_SHMEM) ||
	    uffd_register(r.uffd, p, 2 * HPAGE_SIZE, UFFDIO_REGISTER_MODE_WP,
			  NULL) ||
	    uffd_wp(r.uffd, p, 2 * HPAGE_SIZE, UFFDIO_WRITEPROTECT_MODE_WP))
		tap_bail("ring_open/register hugetlb");
	p[HPAGE_SIZE + 12345] = 2;
	e = ring_entry(&r, 0);
	ring_reset(&r, ring_producer(&r), 0, &rep);
	tap_check(ring_producer(&r) == 1 &&
		  e == ((uint64_t)(unsigned long)(p + HPAGE_SIZE) |
			UFFD_RING_ENTRY_HUGE) &&
		  rep == 1 && page_wp(p + HPAGE_SIZE), name,
		  "producer %llu, entry %#llx (want %p|HUGE), reprotected %llu",
		  (unsigned long long)ring_producer(&r),
		  (unsigned long long)e, (void *)(p + HPAGE_SIZE),
		  (unsigned long long)rep);
	ring_close(&r);
	munmap(p, 2 * HPAGE_SIZE);
}

static void case_unmapped_and_unregistered(void)
{
	const char *name = "reset-skips-unmapped";
	struct uring_view r;
	uint64_t rep = 99;
	int e;
	char *p;

	if (!need_ring(name)) {
		tap_fail("unregister-stops-logging", "no ring");
		return;
	}
	if (ring_open(&r, 64, 0) || !(p = ring_track(&r, 8, true)))
		tap_bail("ring_open/track");
	p[0] = 1;
	p[2 * psz] = 1;
	p[4 * psz] = 1;
	munmap(p + 2 * psz, psz);
	uffd_unregister(r.uffd, p + 4 * psz, psz);
	e = ring_reset(&r, ring_producer(&r), 0, &rep);
	tap_check(e == 0 && rep == 1 && page_wp(p), name,
		  "reset over 3 entries (one unmapped, one unregistered) gave %d, reprotected %llu",
		  e, (unsigned long long)rep);
	p[4 * psz + 1] = 2;
	p[6 * psz] = 2;
	tap_check(ring_producer(&r) == 4 &&
		  (ring_entry(&r, 3) & ~(uint64_t)(psz - 1)) ==
		  (uint64_t)(unsigned long)(p + 6 * psz),
		  "unregister-stops-logging",
		  "producer %llu after writes to an unregistered and a registered page",
		  (unsigned long long)ring_producer(&r));
	ring_close(&r);
	munmap(p, 8 * psz);
}

static void case_dontneed(void)
{
	const char *name = "dontneed-logged";
	struct uring_view r;
	uint64_t rep = 0;
	char *p;

	if (!need_ring(name))
		return;
	if (ring_open(&r, 64, 0) || !(p = ring_track(&r, 4, true)))
		tap_bail("ring_open/track");
	/* MADV_DONTNEED drops a protected anonymous page with its
	 * protection: it reads as zero from now on, so the ring logs it as
	 * written (PAGEMAP_SCAN reports the hole as written too). */
	madvise(p + psz, psz, MADV_DONTNEED);
	tap_check(ring_producer(&r) == 1 &&
		  (ring_entry(&r, 0) & ~(uint64_t)(psz - 1)) ==
		  (uint64_t)(unsigned long)(p + psz) && p[psz] == 0, name,
		  "after MADV_DONTNEED of a protected page: producer %llu, value %d",
		  (unsigned long long)ring_producer(&r), p[psz]);
	/* The reset protects the hole again (a marker), so the write that
	 * repopulates it is logged. */
	ring_reset(&r, 1, 0, &rep);
	p[psz] = 5;
	tap_check(rep == 1 && ring_producer(&r) == 2 &&
		  (ring_entry(&r, 1) & ~(uint64_t)(psz - 1)) ==
		  (uint64_t)(unsigned long)(p + psz), "dontneed-refault-logged",
		  "reprotected %llu, producer %llu after writing the zapped page",
		  (unsigned long long)rep, (unsigned long long)ring_producer(&r));
	ring_close(&r);
	munmap(p, 4 * psz);
}

static void case_fork(void)
{
	const char *name = "fork-child-not-logged";
	struct uring_view r;
	int status = -1;
	pid_t pid;
	char *p;

	if (!need_ring(name))
		return;
	if (ring_open(&r, 64, 0) || !(p = ring_track(&r, 8, true)))
		tap_bail("ring_open/track");
	p[0] = 1;
	pid = fork();
	if (pid == 0) {
		/* The child has no ring mapping and its writes are its own. */
		int sig = probe_read((char *)r.hdr);

		p[psz] = 3;
		p[2 * psz] = 3;
		_exit(sig == SIGSEGV ? 0 : 10 + sig);
	}
	waitpid(pid, &status, 0);
	p[3 * psz] = 4;
	tap_check(WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
		  ring_producer(&r) == 2 &&
		  (ring_entry(&r, 1) & ~(uint64_t)(psz - 1)) ==
		  (uint64_t)(unsigned long)(p + 3 * psz), name,
		  "child status %#x (0: ring not mapped in the child), parent producer %llu (want 2)",
		  status, (unsigned long long)ring_producer(&r));
	ring_close(&r);
	munmap(p, 8 * psz);
}

/* Writers keep writing while the uffd (and then the ring mapping) goes
 * away; every write lands and nothing hangs. */
static void case_close_inflight(void)
{
	const char *name = "close-with-writers";
	struct mt_writer w[2];
	volatile int stop = 0;
	struct uring_view r;
	int t, bad = 0, k;
	char *p;

	if (!need_ring(name))
		return;
	if (ring_open(&r, 64, 0) || !(p = ring_track(&r, MT_PAGES, true)))
		tap_bail("ring_open/track");
	for (t = 0; t < 2; t++) {
		w[t] = (struct mt_writer){ .base = (uint64_t *)p, .first = t,
			.stride = 2, .stop = &stop };
		pthread_create(&w[t].t, NULL, mt_write, &w[t]);
	}
	usleep(30000);
	close(r.uffd);
	usleep(30000);
	munmap(r.hdr, r.map_size);
	usleep(30000);
	stop = 1;
	for (t = 0; t < 2; t++)
		pthread_join(w[t].t, NULL);
	/* After the last reference went, the area is an ordinary one. */
	for (k = 0; k < MT_PAGES; k++) {
		((volatile char *)p)[k * psz + 100] = (char)k;
		bad += p[k * psz + 100] != (char)k || page_wp(p + k * psz);
	}
	tap_check(bad == 0 && w[0].writes && w[1].writes, name,
		  "%d pages wrong or still protected after close; writes %llu/%llu",
		  bad, (unsigned long long)w[0].writes,
		  (unsigned long long)w[1].writes);
	munmap(p, (size_t)MT_PAGES * psz);
}

int main(void)
{
	psz = page_size();
	watchdog(400);
	tap_plan(38);
	case_feature();			/* 2 */
	case_setup_bad();		/* 3 */
	case_setup_order();		/* 3 */
	case_setup_cap();		/* 1 */
	case_setup_memcg();		/* 1 */
	case_mmap();			/* 8 */
	case_logging();			/* 3 */
	case_reset_bad();		/* 1 */
	case_reset_across_tables();	/* 1 */
	case_overflow();		/* 2 */
	case_discard();			/* 2 */
	case_multithread(false);	/* 1 */
	case_multithread(true);		/* 1 */
	case_unpopulated();		/* 1 */
	case_thp();			/* 1 */
	case_hugetlb();			/* 1 */
	case_unmapped_and_unregistered(); /* 2 */
	case_dontneed();		/* 2 */
	case_fork();			/* 1 */
	case_close_inflight();		/* 1 */
	return tap_done();
}
