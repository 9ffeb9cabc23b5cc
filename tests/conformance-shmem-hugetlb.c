// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-shmem-hugetlb: uffd-wp on shmem and hugetlbfs memory
 * (UFFD_FEATURE_WP_HUGETLBFS_SHMEM, pte markers).
 *
 * Contract (area 12):
 *  - the API reports UFFD_FEATURE_WP_HUGETLBFS_SHMEM; on shmem (memfd,
 *    MAP_SHARED|MAP_ANONYMOUS) and hugetlbfs (memfd MFD_HUGETLB,
 *    MAP_HUGETLB) a protected page's write faults with FLAG_WP, is resolved
 *    by unprotecting, and the data is right (also as seen through the file);
 *  - protection survives a zap: after MADV_DONTNEED of protected shmem or
 *    hugetlb pages the pte marker keeps PM_UFFD_WP, a read brings the data
 *    back without a message and a write still takes a WP fault;
 *  - on shmem, never-populated pages can be protected too (markers): their
 *    first write is a WP fault, not a MISSING one.
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
#include "wp_probe.h"

#ifndef MFD_HUGETLB
#define MFD_HUGETLB	0x0004U
#endif
#ifndef MAP_HUGETLB
#define MAP_HUGETLB	0x40000
#endif

#define NR_PAGES	8
#define QUIET_MS	300

static long psz;

enum kind { SHMEM_MEMFD, SHMEM_ANON, HUGETLB_MEMFD, HUGETLB_PRIVATE };

struct area {
	enum kind kind;
	char *p;
	size_t len;
	size_t unit;		/* fault granule: page or huge page */
	int fd;			/* memfd, or -1 */
	char *expect;
	int uffd;
	bool leak;
};

static bool is_hugetlb(enum kind kind)
{
	return kind == HUGETLB_MEMFD || kind == HUGETLB_PRIVATE;
}

/*
 * Map LEN bytes of KIND; POPULATE fills it with a pattern (else it stays
 * untouched and EXPECT is all zero).  On failure WHY says why and *SKIP
 * tells whether it was only the huge page pool.
 */
static bool area_map(struct area *a, enum kind kind, size_t len, bool populate,
		     bool *skip, char *why, size_t wlen)
{
	int flags = MAP_SHARED;

	memset(a, 0, sizeof(*a));
	a->kind = kind;
	a->fd = -1;
	a->uffd = -1;
	a->len = len;
	a->unit = is_hugetlb(kind) ? HPAGE_SIZE : (size_t)psz;
	*skip = false;
	if (kind == SHMEM_MEMFD || kind == HUGETLB_MEMFD) {
		a->fd = memfd_create("uffd-wp-shmem-hugetlb",
				     kind == HUGETLB_MEMFD ? MFD_HUGETLB : 0);
		if (a->fd < 0 || ftruncate(a->fd, len)) {
			*skip = is_hugetlb(kind);
			snprintf(why, wlen, "memfd: %s", strerror(errno));
			return false;
		}
	} else if (kind == SHMEM_ANON) {
		flags = MAP_SHARED | MAP_ANONYMOUS;
	} else {
		flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;
	}
	a->p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, a->fd, 0);
	if (a->p == MAP_FAILED) {
		a->p = NULL;
		*skip = is_hugetlb(kind) && errno == ENOMEM;
		snprintf(why, wlen, "mmap: %s", strerror(errno));
		return false;
	}
	a->expect = calloc(1, len);
	if (!a->expect) {
		snprintf(why, wlen, "malloc failed");
		return false;
	}
	if (populate) {
		fill_pattern(a->p, len, kind + 1);
		memcpy(a->expect, a->p, len);
	}
	return true;
}

/* Open a uffd asking for WP on shmem/hugetlbfs, register and protect. */
static bool area_protect(struct area *a, char *why, size_t wlen)
{
	a->uffd = wp_uffd_open(a->p, a->len, UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			       UFFD_FEATURE_WP_HUGETLBFS_SHMEM,
			       UFFDIO_REGISTER_MODE_WP, true, why, wlen);
	return a->uffd >= 0;
}

static void area_destroy(struct area *a)
{
	if (a->uffd >= 0)
		close(a->uffd);
	if (a->fd >= 0)
		close(a->fd);
	free(a->expect);
	if (a->p && !a->leak)
		munmap(a->p, a->len);
}

/* Map (and maybe populate) and protect; report setup failures here. */
static bool area_setup(struct area *a, enum kind kind, size_t len,
		       bool populate, const char *name)
{
	char why[256] = "";
	bool skip;

	if (!area_map(a, kind, len, populate, &skip, why, sizeof(why))) {
		if (skip)
			tap_skip(name, "no huge page: %s", why);
		else
			tap_fail(name, "%s", why);
		return false;
	}
	if (!area_protect(a, why, sizeof(why))) {
		tap_fail(name, "%s", why);
		return false;
	}
	return true;
}

/*
 * Write VAL at byte OFF of A through exactly one WP fault, reported at the
 * start of the fault granule (no UFFD_FEATURE_EXACT_ADDRESS) and resolved
 * by unprotecting that granule.
 */
static bool fault_at(struct area *a, size_t off, char val, char *why,
		     size_t wlen)
{
	char *want = a->p + off / a->unit * a->unit;

	a->expect[off] = val;
	return wp_write_faults_once(a->uffd, a->p + off, val, want, want,
				    a->unit, &a->leak, why, wlen);
}

/* The mapping, and the file behind it if any, hold the expected data. */
static bool data_ok(struct area *a, char *why, size_t wlen)
{
	long d = first_diff(a->p, a->expect, a->len);
	char *buf;

	if (d >= 0) {
		snprintf(why, wlen, "mapping differs at offset %ld", d);
		return false;
	}
	if (a->fd < 0 || is_hugetlb(a->kind))
		return true;
	buf = malloc(a->len);
	if (!buf || pread(a->fd, buf, a->len, 0) != (ssize_t)a->len) {
		snprintf(why, wlen, "pread of the memfd failed");
		free(buf);
		return false;
	}
	d = first_diff(buf, a->expect, a->len);
	free(buf);
	if (d >= 0) {
		snprintf(why, wlen, "memfd contents differ at offset %ld", d);
		return false;
	}
	return true;
}

/*
 * shmem-memfd-wp-fault: a write to a protected shmem page (memfd,
 * MAP_SHARED) faults with WP at that page; after the resolution the byte is
 * in the mapping and in the file, and the other pages stay protected.
 */
static void test_shmem_memfd_wp_fault(void)
{
	const char *name = "shmem-memfd-wp-fault";
	char why[512] = "";
	struct area a;
	bool ok = false;
	size_t n;

	if (!area_setup(&a, SHMEM_MEMFD, NR_PAGES * psz, true, name))
		goto out_free;
	n = pages_matching(a.p, a.len, PM_PRESENT | PM_UFFD_WP, 0);
	if (n != NR_PAGES)
		FAIL("%zu of %d pages present with PM_UFFD_WP", n, NR_PAGES);
	if (!fault_at(&a, 2 * psz + 100, 'S', why, sizeof(why)))
		goto out;
	n = pages_matching(a.p, a.len, PM_UFFD_WP, 0);
	if (n != NR_PAGES - 1)
		FAIL("%zu pages PM_UFFD_WP after resolving one, want %d", n,
		     NR_PAGES - 1);
	ok = data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

/*
 * shmem-anon-unpopulated-wp: never-touched MAP_SHARED|MAP_ANONYMOUS pages
 * are protected through markers (PM_UFFD_WP, not present); a read gives
 * zeroes without a message, and the first write is a WP fault.
 */
static void test_shmem_anon_unpopulated(void)
{
	const char *name = "shmem-anon-unpopulated-wp";
	char why[512] = "";
	struct uffd_msg msg;
	struct area a;
	bool ok = false;
	size_t n;

	if (!area_setup(&a, SHMEM_ANON, NR_PAGES * psz, false, name))
		goto out_free;
	n = pages_matching(a.p, a.len, PM_UFFD_WP, PM_PRESENT);
	if (n != NR_PAGES)
		FAIL("%zu of %d untouched pages marked PM_UFFD_WP", n, NR_PAGES);
	if (a.p[5 * psz] != 0)
		FAIL("untouched page reads %d, want 0", a.p[5 * psz]);
	if (uffd_read_msg(a.uffd, &msg, QUIET_MS) == 1)
		FAIL("the read sent a message (flags %#llx)",
		     (unsigned long long)msg.arg.pagefault.flags);
	if (!(pagemap_entry(a.p + 5 * psz) & PM_UFFD_WP))
		FAIL("the page lost PM_UFFD_WP when read in");
	if (!fault_at(&a, 4 * psz + 1, 'A', why, sizeof(why)))
		goto out;
	ok = data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

/*
 * Shared zap checks: after MADV_DONTNEED of the whole protected area, every
 * page keeps PM_UFFD_WP without being present; a read of the first granule
 * brings the data back without a message and still protected; a write to
 * the second granule takes a WP fault; the data is unchanged otherwise.
 */
static bool zap_keeps_wp(struct area *a, char *why, size_t wlen)
{
	size_t pages = a->len / psz, n;
	struct uffd_msg msg;
	long d;

	if (madvise(a->p, a->len, MADV_DONTNEED)) {
		snprintf(why, wlen, "MADV_DONTNEED: %s", strerror(errno));
		return false;
	}
	n = pages_matching(a->p, a->len, PM_UFFD_WP, PM_PRESENT);
	if (n != pages) {
		snprintf(why, wlen, "after MADV_DONTNEED %zu of %zu pages kept "
			 "PM_UFFD_WP (not present)", n, pages);
		return false;
	}
	d = first_diff(a->p, a->expect, a->unit);
	if (d >= 0) {
		snprintf(why, wlen, "zapped data read back differs at %ld", d);
		return false;
	}
	if (uffd_read_msg(a->uffd, &msg, QUIET_MS) == 1) {
		snprintf(why, wlen, "reading a zapped page sent a message");
		return false;
	}
	n = pages_matching(a->p, a->unit, PM_PRESENT | PM_UFFD_WP, 0);
	if (n != a->unit / psz) {
		snprintf(why, wlen, "read-in pages not present+PM_UFFD_WP: %zu of "
			 "%zu", n, a->unit / psz);
		return false;
	}
	if (!fault_at(a, a->unit + 3 * psz, 'Z', why, wlen))
		return false;
	return data_ok(a, why, wlen);
}

/*
 * shmem-dontneed-keeps-wp: MADV_DONTNEED of protected memfd pages leaves
 * uffd-wp markers; reads need no message, writes still fault with WP.
 */
static void test_shmem_dontneed(void)
{
	const char *name = "shmem-dontneed-keeps-wp";
	char why[512] = "";
	struct area a;
	bool ok;

	if (!area_setup(&a, SHMEM_MEMFD, NR_PAGES * psz, true, name))
		goto out_free;
	ok = zap_keeps_wp(&a, why, sizeof(why));
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

/*
 * hugetlb-memfd-wp-fault: on two protected 2 MiB hugetlb pages (memfd
 * MFD_HUGETLB) every 4 KiB slot shows PM_UFFD_WP; a write inside the second
 * faults with WP at that huge page's start; after the resolution the first
 * huge page is still protected and the data is right.
 */
static void test_hugetlb_memfd_wp_fault(void)
{
	const char *name = "hugetlb-memfd-wp-fault";
	char why[512] = "";
	struct area a;
	bool ok = false;
	size_t n, per = HPAGE_SIZE / psz;

	if (!area_setup(&a, HUGETLB_MEMFD, 2 * HPAGE_SIZE, true, name))
		goto out_free;
	n = pages_matching(a.p, a.len, PM_PRESENT | PM_UFFD_WP, 0);
	if (n != 2 * per)
		FAIL("%zu of %zu pages present with PM_UFFD_WP", n, 2 * per);
	if (!fault_at(&a, HPAGE_SIZE + 5 * psz + 9, 'H', why, sizeof(why)))
		goto out;
	n = pages_matching(a.p, HPAGE_SIZE, PM_UFFD_WP, 0);
	if (n != per)
		FAIL("first huge page: %zu of %zu pages PM_UFFD_WP", n, per);
	n = pages_matching(a.p + HPAGE_SIZE, HPAGE_SIZE, PM_UFFD_WP, 0);
	if (n)
		FAIL("resolved huge page still has %zu pages PM_UFFD_WP", n);
	ok = data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

/*
 * hugetlb-dontneed-keeps-wp: MADV_DONTNEED of protected hugetlb pages
 * leaves markers; reads need no message, writes still fault with WP.
 */
static void test_hugetlb_dontneed(void)
{
	const char *name = "hugetlb-dontneed-keeps-wp";
	char why[512] = "";
	struct area a;
	bool ok;

	if (!area_setup(&a, HUGETLB_MEMFD, 2 * HPAGE_SIZE, true, name))
		goto out_free;
	ok = zap_keeps_wp(&a, why, sizeof(why));
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

/*
 * hugetlb-private-wp-fault: a private MAP_HUGETLB page, protected, faults
 * with WP at its start on write; the resolved write lands, data intact.
 */
static void test_hugetlb_private_wp_fault(void)
{
	const char *name = "hugetlb-private-wp-fault";
	char why[512] = "";
	struct area a;
	bool ok = false;
	size_t n;

	if (!area_setup(&a, HUGETLB_PRIVATE, HPAGE_SIZE, true, name))
		goto out_free;
	n = pages_matching(a.p, a.len, PM_PRESENT | PM_UFFD_WP, 0);
	if (n != HPAGE_SIZE / psz)
		FAIL("%zu of %lu pages present with PM_UFFD_WP", n,
		     HPAGE_SIZE / psz);
	if (!fault_at(&a, 123 * psz + 45, 'P', why, sizeof(why)))
		goto out;
	ok = data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

int main(void)
{
	watchdog(60);
	psz = page_size();
	tap_plan(6);
	test_shmem_memfd_wp_fault();
	test_shmem_anon_unpopulated();
	test_shmem_dontneed();
	test_hugetlb_memfd_wp_fault();
	test_hugetlb_dontneed();
	test_hugetlb_private_wp_fault();
	return tap_done();
}
