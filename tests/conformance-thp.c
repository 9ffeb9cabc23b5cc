// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-thp: uffd-wp on anonymous transparent huge pages.
 *
 * Contract (area 4):
 *  - a write-protected, PMD-mapped 2 MiB THP stays huge and takes a WP
 *    fault on write; every one of its 512 pages shows PM_UFFD_WP;
 *  - unprotecting one 4 KiB page splits the PMD mapping and every other
 *    page stays protected: pagemap bit 57 per page, and writes still fault;
 *  - neither MADV_COLLAPSE nor khugepaged collapses a range that holds
 *    protected PTEs while the protection is on;
 *  - mprotect() of the whole THP (PROT_READ, then PROT_READ|PROT_WRITE)
 *    keeps it PMD-mapped and protected: the architecture's pmd_modify()
 *    must keep the bit.
 *
 * Each case builds its own THP and userfaultfd.  MADV_COLLAPSE and
 * khugepaged are first shown to collapse an unprotected twin range, so a
 * refusal on the protected range is down to the protection.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"
#include "wp_probe.h"

#define NR_SUBPAGES	512
#define KHUGEPAGED	"/sys/kernel/mm/transparent_hugepage/khugepaged/"

static long psz;

/* A 2 MiB THP, its expected contents and (once armed) its userfaultfd. */
struct thp {
	char *p;
	char *expect;
	int uffd;
	bool leak;		/* a writer may still touch it: never unmap */
};

static long huge_kb(void *addr)
{
	return smaps_field_kb(addr, "AnonHugePages");
}

/*
 * Fault in a PMD-mapped THP at P (2 MiB aligned, already mapped) and fill
 * it with a pattern.  False if the kernel gave us small pages instead.
 */
static bool thp_populate(char *p, unsigned int seed)
{
	if (madvise(p, HPAGE_SIZE, MADV_HUGEPAGE))
		return false;
	fill_pattern(p, HPAGE_SIZE, seed);
	return huge_kb(p) >= (long)(HPAGE_SIZE >> 10);
}

/* Map P as a fresh THP; on failure say why in WHY.  T->p set on success. */
static bool thp_create_at(struct thp *t, char *p, unsigned int seed, char *why,
			  size_t wlen)
{
	memset(t, 0, sizeof(*t));
	t->uffd = -1;
	t->p = p;
	t->expect = malloc(HPAGE_SIZE);
	if (!t->expect) {
		snprintf(why, wlen, "malloc failed");
		return false;
	}
	if (!thp_populate(p, seed)) {
		snprintf(why, wlen, "no THP: AnonHugePages %ld kB after touching",
			 huge_kb(p));
		return false;
	}
	memcpy(t->expect, p, HPAGE_SIZE);
	return true;
}

/* Register T for WP and write-protect all of it; false with WHY if not. */
static bool thp_protect(struct thp *t, char *why, size_t wlen)
{
	t->uffd = wp_uffd_open(t->p, HPAGE_SIZE, UFFD_FEATURE_PAGEFAULT_FLAG_WP,
			       UFFDIO_REGISTER_MODE_WP, true, why, wlen);
	return t->uffd >= 0;
}

static void thp_release(struct thp *t)
{
	if (t->uffd >= 0)
		close(t->uffd);
	free(t->expect);
	t->expect = NULL;
	t->uffd = -1;
}

/* Write VAL at the first byte of page IDX of T through a WP fault. */
static bool fault_page(struct thp *t, int idx, char val, char *res,
		       size_t res_len, char *why, size_t wlen)
{
	char *page = t->p + idx * psz;

	t->expect[idx * psz] = val;
	if (!wp_write_faults_once(t->uffd, page, val, page, res, res_len,
				  &t->leak, why, wlen)) {
		size_t n = strlen(why);

		snprintf(why + n, wlen - n, " (page %d)", idx);
		return false;
	}
	return true;
}

/* Pages of T whose WP bit differs from "all protected except SKIP". */
static int wp_mismatches(struct thp *t, int skip, int *first)
{
	int bad = 0;

	*first = -1;
	for (int i = 0; i < NR_SUBPAGES; i++) {
		uint64_t e = pagemap_entry(t->p + i * psz);
		bool want = i != skip;

		if (!(e & PM_PRESENT) || !!(e & PM_UFFD_WP) != want) {
			if (*first < 0)
				*first = i;
			bad++;
		}
	}
	return bad;
}

static bool data_ok(struct thp *t, char *why, size_t wlen)
{
	long d = first_diff(t->p, t->expect, HPAGE_SIZE);

	if (d < 0)
		return true;
	snprintf(why, wlen, "data differs at offset %ld (page %ld)", d, d / psz);
	return false;
}

/* A fresh 2 MiB-aligned THP of our own; skip the case if there is none. */
static bool thp_new(struct thp *t, const char *name, unsigned int seed)
{
	char why[256];
	char *p = map_anon_aligned(HPAGE_SIZE, HPAGE_SIZE);

	if (!p) {
		tap_fail(name, "mmap: %s", strerror(errno));
		return false;
	}
	if (!thp_create_at(t, p, seed, why, sizeof(why))) {
		tap_skip(name, "%s", why);
		free(t->expect);
		munmap(p, HPAGE_SIZE);
		return false;
	}
	return true;
}

static void thp_free(struct thp *t)
{
	thp_release(t);
	if (!t->leak)
		munmap(t->p, HPAGE_SIZE);
}

/*
 * thp-protected-huge-faults: protecting a whole THP keeps it PMD-mapped,
 * marks all 512 pages WP, and a write takes a WP fault at the written page;
 * unprotecting the whole range resolves it without splitting.
 */
static void test_protected_huge_faults(void)
{
	const char *name = "thp-protected-huge-faults";
	char why[512] = "";
	struct thp t;
	bool ok = false;
	int n;

	if (!thp_new(&t, name, 1))
		return;
	if (!thp_protect(&t, why, sizeof(why)))
		goto out;
	if (huge_kb(t.p) != (long)(HPAGE_SIZE >> 10))
		FAIL("protecting split the THP: AnonHugePages %ld kB",
		     huge_kb(t.p));
	n = pages_with(t.p, HPAGE_SIZE, PM_PRESENT | PM_UFFD_WP);
	if (n != NR_SUBPAGES)
		FAIL("%d of %d pages present with PM_UFFD_WP", n, NR_SUBPAGES);
	if (!fault_page(&t, 100, 'W', t.p, HPAGE_SIZE, why, sizeof(why)))
		goto out;
	if (huge_kb(t.p) != (long)(HPAGE_SIZE >> 10))
		FAIL("whole-range unprotect split the THP: AnonHugePages %ld kB",
		     huge_kb(t.p));
	n = pages_with(t.p, HPAGE_SIZE, PM_UFFD_WP);
	if (n)
		FAIL("%d pages still PM_UFFD_WP after unprotecting all", n);
	ok = data_ok(&t, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	thp_free(&t);
}

/*
 * thp-unprotect-one-splits: unprotecting one 4 KiB page of a protected THP
 * splits the PMD; that page is writable without a message, the 511 others
 * keep PM_UFFD_WP, and the contents survive the split.
 */
static void test_unprotect_one_splits(void)
{
	const char *name = "thp-unprotect-one-splits";
	char why[512] = "";
	struct thp t;
	bool ok = false;
	int err, bad, first;

	if (!thp_new(&t, name, 2))
		return;
	if (!thp_protect(&t, why, sizeof(why)))
		goto out;
	err = uffd_wp(t.uffd, t.p + 7 * psz, psz, 0);
	if (err)
		FAIL("unprotect page 7: %s", strerror(-err));
	if (huge_kb(t.p) != 0)
		FAIL("still PMD-mapped after unprotecting one page: "
		     "AnonHugePages %ld kB", huge_kb(t.p));
	bad = wp_mismatches(&t, 7, &first);
	if (bad)
		FAIL("%d pages with the wrong WP bit, first page %d", bad, first);
	t.expect[7 * psz] = 'U';
	if (!wp_write_no_fault(t.uffd, t.p + 7 * psz, 'U', &t.leak, why,
			       sizeof(why)))
		goto out;
	ok = data_ok(&t, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	thp_free(&t);
}

/*
 * thp-split-rest-still-faults: after the split, writes to other pages of
 * the former THP (both ends and the unprotected page's neighbours) each
 * take exactly one WP fault at their own address.
 */
static void test_split_rest_still_faults(void)
{
	static const int pages[] = { 0, 6, 8, 255, 511 };
	const char *name = "thp-split-rest-still-faults";
	const int n = sizeof(pages) / sizeof(pages[0]);
	char why[512] = "";
	struct thp t;
	bool ok = false;
	int err, wp;

	if (!thp_new(&t, name, 3))
		return;
	if (!thp_protect(&t, why, sizeof(why)))
		goto out;
	err = uffd_wp(t.uffd, t.p + 7 * psz, psz, 0);
	if (err)
		FAIL("unprotect page 7: %s", strerror(-err));
	if (huge_kb(t.p) != 0)
		FAIL("still PMD-mapped after unprotecting one page");
	for (int i = 0; i < n; i++) {
		char *page = t.p + pages[i] * psz;

		if (!fault_page(&t, pages[i], 'a' + i, page, psz, why,
				sizeof(why)))
			goto out;
	}
	wp = pages_with(t.p, HPAGE_SIZE, PM_UFFD_WP);
	if (wp != NR_SUBPAGES - 1 - n)
		FAIL("%d pages PM_UFFD_WP after resolving %d faults, want %d",
		     wp, n, NR_SUBPAGES - 1 - n);
	ok = data_ok(&t, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	thp_free(&t);
}

/*
 * Two adjacent 2 MiB THPs: the first is protected and then split by
 * unprotecting page 7 (511 protected PTEs), the second ("twin") is split
 * without uffd by zapping its page 7.  Both are PTE-mapped afterwards.
 */
struct pair {
	char *base;
	struct thp t;		/* protected */
	struct thp twin;	/* unprotected */
};

static bool pair_setup(struct pair *pr, const char *name, unsigned int seed)
{
	char why[256] = "";
	int err;

	memset(pr, 0, sizeof(*pr));
	pr->t.uffd = pr->twin.uffd = -1;
	pr->base = map_anon_aligned(2 * HPAGE_SIZE, HPAGE_SIZE);
	if (!pr->base) {
		tap_fail(name, "mmap: %s", strerror(errno));
		return false;
	}
	if (!thp_create_at(&pr->t, pr->base, seed, why, sizeof(why)) ||
	    !thp_create_at(&pr->twin, pr->base + HPAGE_SIZE, seed + 1, why,
			   sizeof(why))) {
		tap_skip(name, "%s", why);
		goto undo;
	}
	if (!thp_protect(&pr->t, why, sizeof(why))) {
		tap_fail(name, "%s", why);
		goto undo;
	}
	err = uffd_wp(pr->t.uffd, pr->t.p + 7 * psz, psz, 0);
	if (err) {
		tap_fail(name, "unprotect page 7: %s", strerror(-err));
		goto undo;
	}
	if (madvise(pr->twin.p + 7 * psz, psz, MADV_DONTNEED)) {
		tap_fail(name, "MADV_DONTNEED: %s", strerror(errno));
		goto undo;
	}
	memset(pr->twin.expect + 7 * psz, 0, psz);
	if (huge_kb(pr->t.p) || huge_kb(pr->twin.p)) {
		tap_fail(name, "ranges not split: %ld and %ld kB huge",
			 huge_kb(pr->t.p), huge_kb(pr->twin.p));
		goto undo;
	}
	return true;
undo:
	thp_release(&pr->t);
	thp_release(&pr->twin);
	munmap(pr->base, 2 * HPAGE_SIZE);
	return false;
}

static void pair_free(struct pair *pr)
{
	thp_release(&pr->t);
	thp_release(&pr->twin);
	if (!pr->t.leak)
		munmap(pr->base, 2 * HPAGE_SIZE);
}

/* The protected range is intact: not huge, WP bits, data, still faults. */
static bool still_protected(struct thp *t, char *why, size_t wlen)
{
	int bad, first;

	if (huge_kb(t->p)) {
		snprintf(why, wlen, "protected range collapsed: AnonHugePages %ld kB",
			 huge_kb(t->p));
		return false;
	}
	bad = wp_mismatches(t, 7, &first);
	if (bad) {
		snprintf(why, wlen, "%d pages lost or gained WP, first page %d",
			 bad, first);
		return false;
	}
	if (!data_ok(t, why, wlen))
		return false;
	if (!fault_page(t, 300, 'K', t->p + 300 * psz, psz, why, wlen))
		return false;
	return data_ok(t, why, wlen);
}

/*
 * thp-madv-collapse-refused: MADV_COLLAPSE collapses the unprotected twin
 * but fails on the range holding 511 protected PTEs and leaves it split,
 * protected, intact and faulting.
 */
static void test_madv_collapse_refused(void)
{
	const char *name = "thp-madv-collapse-refused";
	char why[512] = "";
	struct pair pr;
	bool ok = false;
	int ret, err;

	if (!pair_setup(&pr, name, 10))
		return;
	if (madvise(pr.twin.p, HPAGE_SIZE, MADV_COLLAPSE) ||
	    huge_kb(pr.twin.p) != (long)(HPAGE_SIZE >> 10)) {
		tap_skip(name, "MADV_COLLAPSE does not collapse even an unprotected "
			 "range here (%s, %ld kB huge)", strerror(errno),
			 huge_kb(pr.twin.p));
		pair_free(&pr);
		return;
	}
	if (first_diff(pr.twin.p, pr.twin.expect, HPAGE_SIZE) >= 0)
		FAIL("MADV_COLLAPSE corrupted the unprotected twin");
	ret = madvise(pr.t.p, HPAGE_SIZE, MADV_COLLAPSE);
	err = errno;
	if (ret == 0)
		FAIL("MADV_COLLAPSE reported success on the protected range "
		     "(AnonHugePages %ld kB)", huge_kb(pr.t.p));
	tap_diag("MADV_COLLAPSE on the protected range: %s", strerror(err));
	ok = still_protected(&pr.t, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	pair_free(&pr);
}

static long read_long(const char *path)
{
	char buf[64] = "";
	int fd = open(path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? strtol(buf, NULL, 10) : -1;
}

static int write_long(const char *path, long val)
{
	char buf[32];
	int fd = open(path, O_WRONLY), n;

	if (fd < 0)
		return -errno;
	n = snprintf(buf, sizeof(buf), "%ld", val);
	n = write(fd, buf, n) == n ? 0 : -errno;
	close(fd);
	return n;
}

struct khugepaged_knobs {
	long scan_sleep, alloc_sleep, pages_to_scan;
};

static bool khugepaged_speed_up(struct khugepaged_knobs *saved)
{
	saved->scan_sleep = read_long(KHUGEPAGED "scan_sleep_millisecs");
	saved->alloc_sleep = read_long(KHUGEPAGED "alloc_sleep_millisecs");
	saved->pages_to_scan = read_long(KHUGEPAGED "pages_to_scan");
	if (saved->scan_sleep < 0 || saved->alloc_sleep < 0 ||
	    saved->pages_to_scan < 0)
		return false;
	/* Writing scan_sleep_millisecs also wakes khugepaged up. */
	return !write_long(KHUGEPAGED "pages_to_scan", 8 * NR_SUBPAGES) &&
	       !write_long(KHUGEPAGED "alloc_sleep_millisecs", 10) &&
	       !write_long(KHUGEPAGED "scan_sleep_millisecs", 10);
}

static void khugepaged_restore(const struct khugepaged_knobs *saved)
{
	if (saved->pages_to_scan >= 0)
		write_long(KHUGEPAGED "pages_to_scan", saved->pages_to_scan);
	if (saved->alloc_sleep >= 0)
		write_long(KHUGEPAGED "alloc_sleep_millisecs", saved->alloc_sleep);
	if (saved->scan_sleep >= 0)
		write_long(KHUGEPAGED "scan_sleep_millisecs", saved->scan_sleep);
}

/*
 * Wait until khugepaged has collapsed the twin and finished two more full
 * scans than at START, so one whole pass began after the setup.
 */
static bool khugepaged_wait(struct pair *pr, long start, int timeout_ms)
{
	long long end = now_ms() + timeout_ms;

	while (now_ms() < end) {
		if (huge_kb(pr->twin.p) == (long)(HPAGE_SIZE >> 10) &&
		    read_long(KHUGEPAGED "full_scans") >= start + 2)
			return true;
		usleep(20000);
	}
	return false;
}

/*
 * thp-khugepaged-refused: with khugepaged scanning fast, the unprotected
 * twin is collapsed, and after two further full scans the protected range
 * is still split, protected, intact and faulting.
 */
static void test_khugepaged_refused(void)
{
	const char *name = "thp-khugepaged-refused";
	struct khugepaged_knobs saved = { -1, -1, -1 };
	char why[512] = "";
	struct pair pr;
	bool ok = false, waited;
	long long t0;
	long scans;

	if (!pair_setup(&pr, name, 20))
		return;
	/* Make every twin PTE young again so khugepaged wants it. */
	for (int i = 0; i < NR_SUBPAGES; i++)
		if (i != 7)
			pr.twin.p[i * psz] = pr.twin.expect[i * psz];
	scans = read_long(KHUGEPAGED "full_scans");
	if (scans < 0 || !khugepaged_speed_up(&saved)) {
		khugepaged_restore(&saved);
		tap_skip(name, "cannot tune khugepaged through " KHUGEPAGED);
		pair_free(&pr);
		return;
	}
	t0 = now_ms();
	waited = khugepaged_wait(&pr, scans, 20000);
	khugepaged_restore(&saved);
	if (!waited) {
		tap_skip(name, "khugepaged did not collapse the unprotected twin "
			 "(%ld kB huge, full_scans %ld -> %ld) within 20 s",
			 huge_kb(pr.twin.p), scans,
			 read_long(KHUGEPAGED "full_scans"));
		pair_free(&pr);
		return;
	}
	tap_diag("khugepaged collapsed the twin; full_scans %ld -> %ld in %lld ms",
		 scans, read_long(KHUGEPAGED "full_scans"), now_ms() - t0);
	if (first_diff(pr.twin.p, pr.twin.expect, HPAGE_SIZE) >= 0)
		FAIL("khugepaged corrupted the unprotected twin");
	ok = still_protected(&pr.t, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	pair_free(&pr);
}

/*
 * thp-mprotect-keeps-wp: mprotect() of a protected, PMD-mapped THP to
 * PROT_READ and back changes the huge PMD in place; it stays huge, all 512
 * pages keep PM_UFFD_WP, and a write still takes a WP fault.
 */
static void test_mprotect_keeps_wp(void)
{
	const char *name = "thp-mprotect-keeps-wp";
	char why[512] = "";
	struct thp t;
	bool ok = false;
	int n;

	if (!thp_new(&t, name, 6))
		return;
	if (!thp_protect(&t, why, sizeof(why)))
		goto out;
	if (mprotect(t.p, HPAGE_SIZE, PROT_READ) ||
	    mprotect(t.p, HPAGE_SIZE, PROT_READ | PROT_WRITE))
		FAIL("mprotect: %s", strerror(errno));
	if (huge_kb(t.p) != (long)(HPAGE_SIZE >> 10))
		FAIL("mprotect split the THP: AnonHugePages %ld kB",
		     huge_kb(t.p));
	n = pages_with(t.p, HPAGE_SIZE, PM_PRESENT | PM_UFFD_WP);
	if (n != NR_SUBPAGES)
		FAIL("after mprotect %d of %d pages present with PM_UFFD_WP", n,
		     NR_SUBPAGES);
	if (!fault_page(&t, 300, 'P', t.p, HPAGE_SIZE, why, sizeof(why)))
		goto out;
	ok = data_ok(&t, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	thp_free(&t);
}

int main(void)
{
	watchdog(90);
	psz = page_size();
	tap_plan(6);
	test_protected_huge_faults();
	test_unprotect_one_splits();
	test_split_rest_still_faults();
	test_madv_collapse_refused();
	test_khugepaged_refused();
	test_mprotect_keeps_wp();
	return tap_done();
}
