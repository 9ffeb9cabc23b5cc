// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-unpopulated-async: UFFD_FEATURE_WP_UNPOPULATED,
 * UFFD_FEATURE_WP_ASYNC and PAGEMAP_SCAN.
 *
 * Contract (area 13):
 *  - with WP_UNPOPULATED, protecting never-touched anonymous pages protects
 *    them (pte markers: PM_UFFD_WP); a write to one gives a WP fault, not a
 *    MISSING fault; a read maps zeroes and the page stays protected.
 *    Without the feature, untouched pages are not protected at all;
 *  - with WP_ASYNC the kernel resolves WP faults itself: writes complete and
 *    no message is ever readable; the written pages lose PM_UFFD_WP;
 *  - PAGEMAP_SCAN on /proc/self/pagemap with PM_SCAN_WP_MATCHING |
 *    PM_SCAN_CHECK_WPASYNC and category PAGE_IS_WRITTEN reports exactly the
 *    written pages as ranges and protects them again, so a second scan
 *    reports nothing and later writes are found by the next scan.
 *
 * The areas are registered in WP mode only, so "not MISSING" is checked
 * against the message flags (a MISSING fault carries no FLAG_WP).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"
#include "wp_probe.h"

#define NR_PAGES	8
#define SCAN_PAGES	64
#define MSG_WAIT_MS	3000
#define QUIET_MS	300

static long psz;

/*
 * Map LEN bytes of private anonymous memory, fill the first POPULATED
 * pages with a pattern, register them in WP mode with FEATURES and
 * protect everything.  On failure WHY says why.
 */
static bool area_setup(struct wp_area *a, size_t len, size_t populated,
		       uint64_t features, char *why, size_t wlen)
{
	if (wp_area_create(a, len, why, wlen))
		return false;
	for (size_t i = 0; i < populated * psz; i++)
		a->p[i] = a->expect[i] = (char)(i * 7 + i / psz + 1);
	return !wp_area_arm(a, features, true, why, wlen);
}

/* Store VAL at page IDX from a thread; true if the store completed. */
static bool write_page(struct wp_area *a, int idx, char val, int timeout_ms)
{
	struct writer *w = calloc(1, sizeof(*w));

	if (!w || writer_start(w, a->p + idx * psz, 1, val)) {
		free(w);
		return false;
	}
	a->expect[idx * psz] = val;
	if (!writer_wait(w, timeout_ms)) {
		/* Unregister (drops the protection) and wake; else leak it. */
		uffd_unregister(a->uffd, a->p, a->len);
		uffd_wake(a->uffd, a->p, a->len);
		if (!writer_wait(w, MSG_WAIT_MS))
			a->leak = true;
		return false;
	}
	free(w);
	return true;
}

/*
 * unpopulated-write-wp-fault: with WP_UNPOPULATED, protecting untouched
 * pages marks them PM_UFFD_WP (not present); a write to one is a WP fault
 * at that page, and the resolved write lands on a zeroed page.
 */
static void test_unpopulated_write_wp_fault(void)
{
	const char *name = "unpopulated-write-wp-fault";
	char why[512] = "";
	struct wp_area a;
	bool ok = false;
	size_t n;

	if (!area_setup(&a, NR_PAGES * psz, 0, UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			UFFD_FEATURE_WP_UNPOPULATED, why, sizeof(why)))
		goto out;
	n = pages_matching(a.p, a.len, PM_UFFD_WP, PM_PRESENT);
	if (n != NR_PAGES)
		FAIL("%zu of %d untouched pages marked PM_UFFD_WP", n, NR_PAGES);
	if (!wp_area_fault_page(&a, 3, 'u', why, sizeof(why)))
		goto out;
	n = pages_matching(a.p, a.len, PM_UFFD_WP, 0);
	if (n != NR_PAGES - 1)
		FAIL("%zu pages PM_UFFD_WP after resolving one, want %d", n,
		     NR_PAGES - 1);
	ok = wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	wp_area_destroy(&a);
}

/*
 * unpopulated-off-no-fault: without WP_UNPOPULATED, the same protect call
 * that protects the populated page 0 leaves the untouched pages
 * unprotected: no PM_UFFD_WP, and a write goes through without a message.
 */
static void test_unpopulated_off_no_fault(void)
{
	const char *name = "unpopulated-off-no-fault";
	char why[512] = "";
	struct wp_area a;
	bool ok = false;
	size_t n;

	if (!area_setup(&a, NR_PAGES * psz, 1, UFFD_FEATURE_PAGEFAULT_FLAG_WP,
			why, sizeof(why)))
		goto out;
	if (!page_wp(a.p))
		FAIL("the populated page 0 is not PM_UFFD_WP after protecting");
	n = pages_matching(a.p + psz, a.len - psz, PM_UFFD_WP, 0);
	if (n)
		FAIL("%zu untouched pages PM_UFFD_WP without WP_UNPOPULATED", n);
	a.expect[3 * psz] = 'o';
	if (!wp_write_no_fault(a.uffd, a.p + 3 * psz, 'o', &a.leak, why,
			       sizeof(why)))
		goto out;
	ok = wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	wp_area_destroy(&a);
}

/*
 * unpopulated-read-keeps-wp: with WP_UNPOPULATED, reading an untouched
 * protected page gives zeroes without a message and the page stays
 * protected (present, PM_UFFD_WP); the write after it is a WP fault.
 */
static void test_unpopulated_read_keeps_wp(void)
{
	const char *name = "unpopulated-read-keeps-wp";
	char why[512] = "";
	struct uffd_msg msg;
	struct wp_area a;
	bool ok = false;
	uint64_t e;

	if (!area_setup(&a, NR_PAGES * psz, 0, UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			UFFD_FEATURE_WP_UNPOPULATED, why, sizeof(why)))
		goto out;
	if (*(volatile char *)(a.p + 2 * psz + 5) != 0)
		FAIL("untouched page does not read as zero");
	if (uffd_read_msg(a.uffd, &msg, QUIET_MS) == 1)
		FAIL("the read sent a message (flags %#llx)",
		     (unsigned long long)msg.arg.pagefault.flags);
	e = pagemap_entry(a.p + 2 * psz);
	if (!(e & PM_PRESENT) || !(e & PM_UFFD_WP))
		FAIL("after the read: pagemap %#llx, want present and PM_UFFD_WP",
		     (unsigned long long)e);
	if (!wp_area_fault_page(&a, 2, 'r', why, sizeof(why)))
		goto out;
	ok = wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	wp_area_destroy(&a);
}

/*
 * The scattered set written in the async cases: page indexes of SCAN_PAGES
 * pages, of which the first half were populated before protecting.  It has
 * single pages, runs, both ends and the populated/untouched boundary.
 */
static const int written_a[] = { 0, 1, 2, 9, 31, 32, 33, 40, 63 };
static const int written_b[] = { 1, 5, 6, 7, 8, 32, 50, 62 };

#define NR(x)	((int)(sizeof(x) / sizeof((x)[0])))

static bool write_set(struct wp_area *a, const int *set, int n, char val,
		      char *why, size_t wlen)
{
	for (int i = 0; i < n; i++) {
		if (!write_page(a, set[i], val + i, MSG_WAIT_MS)) {
			snprintf(why, wlen, "the async write to page %d blocked",
				 set[i]);
			return false;
		}
	}
	return true;
}

static bool in_set(const int *set, int n, int idx)
{
	for (int i = 0; i < n; i++)
		if (set[i] == idx)
			return true;
	return false;
}

/* Written pages (and only they) are without PM_UFFD_WP. */
static bool wp_bits_match(struct wp_area *a, const int *set, int n, char *why,
			  size_t wlen)
{
	for (size_t i = 0; i < a->len / psz; i++) {
		bool wp = page_wp(a->p + i * psz), written = in_set(set, n, i);

		if (wp == written) {
			snprintf(why, wlen, "page %zu: PM_UFFD_WP %d, written %d",
				 i, wp, written);
			return false;
		}
	}
	return true;
}

static bool no_message(struct wp_area *a, char *why, size_t wlen)
{
	struct uffd_msg msg;

	if (uffd_read_msg(a->uffd, &msg, QUIET_MS) != 1)
		return true;
	snprintf(why, wlen, "a message was readable (event %u, flags %#llx)",
		 msg.event, (unsigned long long)msg.arg.pagefault.flags);
	return false;
}

#define WP_ASYNC_FEATURES	(UFFD_FEATURE_PAGEFAULT_FLAG_WP |	\
				 UFFD_FEATURE_WP_UNPOPULATED |		\
				 UFFD_FEATURE_WP_ASYNC)

/*
 * async-writes-no-messages: with WP_ASYNC, writes to protected pages (both
 * populated and untouched ones) complete on their own, no message is ever
 * readable, and exactly the written pages lose PM_UFFD_WP.
 */
static void test_async_writes_no_messages(void)
{
	const char *name = "async-writes-no-messages";
	char why[512] = "";
	struct wp_area a;
	bool ok = false;

	if (!area_setup(&a, SCAN_PAGES * psz, SCAN_PAGES / 2, WP_ASYNC_FEATURES,
			why, sizeof(why)))
		goto out;
	if (pages_matching(a.p, a.len, PM_UFFD_WP, 0) != SCAN_PAGES)
		FAIL("not every page PM_UFFD_WP after protecting");
	ok = write_set(&a, written_a, NR(written_a), 'a', why, sizeof(why)) &&
	     no_message(&a, why, sizeof(why)) &&
	     wp_bits_match(&a, written_a, NR(written_a), why, sizeof(why)) &&
	     wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	wp_area_destroy(&a);
}

/*
 * PAGEMAP_SCAN [a->p, a->p + a->len) for written pages, protecting them
 * again; RETURN_MASK picks the categories reported.  Returns the number of
 * regions or -errno.
 */
static long scan_written(struct wp_area *a, struct page_region *vec, size_t n,
			 uint64_t return_mask, uint64_t *walk_end)
{
	struct pm_scan_arg arg = {
		.size = sizeof(arg),
		.flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
		.start = (uintptr_t)a->p,
		.end = (uintptr_t)a->p + a->len,
		.vec = (uintptr_t)vec,
		.vec_len = n,
		.category_mask = PAGE_IS_WRITTEN,
		.return_mask = return_mask,
	};
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	long ret;

	if (fd < 0)
		return -errno;
	ret = ioctl(fd, PAGEMAP_SCAN, &arg);
	if (ret < 0)
		ret = -errno;
	close(fd);
	*walk_end = arg.walk_end;
	return ret;
}

/*
 * Compare the regions of a scan with the ranges of the sorted page set
 * SET, each expected with CATEGORIES.
 */
static bool regions_match(struct wp_area *a, const struct page_region *vec,
			  long got, const int *set, int n, uint64_t categories,
			  char *why, size_t wlen)
{
	long want = 0;

	for (int i = 0; i < n; want++) {
		int first = set[i], last = set[i];
		uintptr_t start, end;

		while (i + 1 < n && set[i + 1] == last + 1)
			last = set[++i];
		i++;
		start = (uintptr_t)a->p + first * psz;
		end = (uintptr_t)a->p + (last + 1) * psz;
		if (want >= got) {
			snprintf(why, wlen, "scan returned %ld regions; missing "
				 "pages %d-%d", got, first, last);
			return false;
		}
		if (vec[want].start != start || vec[want].end != end ||
		    vec[want].categories != categories) {
			snprintf(why, wlen, "region %ld: pages %lld-%lld cat %#llx, "
				 "want pages %d-%d cat %#llx", want,
				 (long long)((vec[want].start - (uintptr_t)a->p) / psz),
				 (long long)((vec[want].end - (uintptr_t)a->p) / psz) - 1,
				 (unsigned long long)vec[want].categories,
				 first, last, (unsigned long long)categories);
			return false;
		}
	}
	if (got != want) {
		snprintf(why, wlen, "scan returned %ld regions, want %ld", got, want);
		return false;
	}
	return true;
}

/* One scan that must report exactly SET and leave every page protected. */
static bool scan_expect(struct wp_area *a, const int *set, int n,
			uint64_t return_mask, uint64_t categories, char *why,
			size_t wlen)
{
	struct page_region vec[SCAN_PAGES];
	uint64_t walk_end = 0;
	long got;
	size_t wp;

	memset(vec, 0, sizeof(vec));
	got = scan_written(a, vec, SCAN_PAGES, return_mask, &walk_end);
	if (got < 0) {
		snprintf(why, wlen, "PAGEMAP_SCAN: %s", strerror(-got));
		return false;
	}
	if (!regions_match(a, vec, got, set, n, categories, why, wlen))
		return false;
	if (walk_end != (uintptr_t)a->p + a->len) {
		snprintf(why, wlen, "walk_end %#llx, want the end %p",
			 (unsigned long long)walk_end, a->p + a->len);
		return false;
	}
	wp = pages_matching(a->p, a->len, PM_UFFD_WP, 0);
	if (wp != SCAN_PAGES) {
		snprintf(why, wlen, "%zu of %d pages PM_UFFD_WP after the "
			 "WP_MATCHING scan", wp, SCAN_PAGES);
		return false;
	}
	return true;
}

/*
 * async-scan-exact-written: PAGEMAP_SCAN (WP_MATCHING | CHECK_WPASYNC,
 * PAGE_IS_WRITTEN) returns exactly the ranges of the written pages and
 * protects them again; the data is untouched.
 */
static void test_async_scan_exact_written(void)
{
	const char *name = "async-scan-exact-written";
	char why[512] = "";
	struct wp_area a;
	bool ok = false;

	if (!area_setup(&a, SCAN_PAGES * psz, SCAN_PAGES / 2, WP_ASYNC_FEATURES,
			why, sizeof(why)))
		goto out;
	ok = write_set(&a, written_a, NR(written_a), 'e', why, sizeof(why)) &&
	     scan_expect(&a, written_a, NR(written_a), PAGE_IS_WRITTEN,
			 PAGE_IS_WRITTEN, why, sizeof(why)) &&
	     no_message(&a, why, sizeof(why)) &&
	     wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	wp_area_destroy(&a);
}

/*
 * async-scan-rescan: after a scan, a second scan without writes reports
 * nothing; writes to a new set (including pages written and re-protected
 * before) are reported exactly by the next scan.  This one asks for
 * PAGE_IS_PRESENT too, which the kernel serves by its general walk.
 */
static void test_async_scan_rescan(void)
{
	const uint64_t mask = PAGE_IS_WRITTEN | PAGE_IS_PRESENT;
	const char *name = "async-scan-rescan";
	char why[512] = "";
	struct wp_area a;
	bool ok = false;

	if (!area_setup(&a, SCAN_PAGES * psz, SCAN_PAGES / 2, WP_ASYNC_FEATURES,
			why, sizeof(why)))
		goto out;
	ok = write_set(&a, written_a, NR(written_a), 'f', why, sizeof(why)) &&
	     scan_expect(&a, written_a, NR(written_a), mask, mask, why,
			 sizeof(why)) &&
	     scan_expect(&a, NULL, 0, mask, mask, why, sizeof(why)) &&
	     write_set(&a, written_b, NR(written_b), 'g', why, sizeof(why)) &&
	     scan_expect(&a, written_b, NR(written_b), mask, mask, why,
			 sizeof(why)) &&
	     no_message(&a, why, sizeof(why)) &&
	     wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
	wp_area_destroy(&a);
}

int main(void)
{
	watchdog(60);
	psz = page_size();
	tap_plan(6);
	test_unpopulated_write_wp_fault();
	test_unpopulated_off_no_fault();
	test_unpopulated_read_keeps_wp();
	test_async_writes_no_messages();
	test_async_scan_exact_written();
	test_async_scan_rescan();
	return tap_done();
}
