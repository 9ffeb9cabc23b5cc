// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-copy-wp: UFFDIO_COPY with UFFDIO_COPY_MODE_WP.
 *
 * Contract checked (issue tracker, area 3 "copy-wp"):
 *  - UFFDIO_COPY with COPY_MODE_WP installs pages that are write-protected
 *    (pagemap PM_UFFD_WP) and hold the copied data; reads do not fault;
 *  - the next write to such a page takes a WP fault (WP|WRITE at the page)
 *    and, resolved with mode 0, lands;
 *  - on one page a MISSING fault (flags exactly WRITE) and then a WP fault
 *    (WP|WRITE) arrive in that order when the MISSING fault is resolved with
 *    COPY_MODE_WP; the write lands only after the second resolution;
 *  - COPY_MODE_WP|COPY_MODE_DONTWAKE leaves the writer asleep until
 *    UFFDIO_WAKE, after which it takes the WP fault;
 *  - COPY_MODE_WP on a range registered without MODE_WP is EINVAL and
 *    installs nothing (fs/userfaultfd.c passes MFILL_ATOMIC_WP, rejected in
 *    mfill_atomic() when the VMA lacks VM_UFFD_WP);
 *  - a plain UFFDIO_COPY into a MISSING|WP range installs an unprotected
 *    page: writes then never fault.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"
#include "wp_probe.h"

#define FAULT_WAIT_MS	3000
#define QUIET_MS	200
#define WP_WRITE	(UFFD_PAGEFAULT_FLAG_WP | UFFD_PAGEFAULT_FLAG_WRITE)
#define MISSING_WP	(UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP)
#define PAGES		4

/* The pattern of page I at offset OFF, in the source buffer. */
static char pattern(int i, size_t off)
{
	return (char)(0x17 * (i + 1) + off % 241);
}

/* An unpopulated registered area, and a source buffer with the pattern. */
static bool area_setup(struct pat_area *a, uint64_t mode)
{
	if (!pat_area_map(a, PAGES, pattern, true))
		return false;
	a->uffd = wp_uffd_open(a->base, a->len, UFFD_FEATURE_PAGEFAULT_FLAG_WP,
			       mode, false, why, sizeof(why));
	return a->uffd >= 0;
}

/*
 * Let a writer that may be blocked go: closing the uffd wakes every fault
 * and drops the registration.  If it still does not finish, never unmap.
 */
static void writer_release(struct pat_area *a, struct writer *w)
{
	uffd_wp(a->uffd, a->base, a->len, 0);
	close(a->uffd);
	a->uffd = -1;
	if (!writer_joined(w, FAULT_WAIT_MS)) {
		tap_diag("a writer thread is stuck; leaking its mapping");
		a->stuck = true;
	}
}

/* Read one message: a page fault at page I with exactly FLAGS. */
static bool fault_at(struct pat_area *a, int i, uint64_t flags)
{
	return expect_fault(a->uffd, pat_area_page(a, i), flags, FAULT_WAIT_MS);
}

static bool expect_no_message(struct pat_area *a, const char *when)
{
	return expect_quiet(a->uffd, QUIET_MS, when);
}

/* Page I holds the source pattern, with byte 0 replaced by VAL if WRITTEN. */
static bool page_holds(struct pat_area *a, int i, bool written, char val)
{
	if (!(pagemap_entry(pat_area_page(a, i)) & PM_PRESENT))
		return because("page %d is not present", i);
	return pat_area_holds(a, i, written, val);
}

static bool copy_pages(struct pat_area *a, int first, int n, uint64_t mode)
{
	int err = uffd_copy(a->uffd, pat_area_page(a, first),
			    a->src + first * page_size(), n * page_size(), mode);

	if (err)
		return because("UFFDIO_COPY pages %d+%d mode %#llx: %s", first,
			       n, (unsigned long long)mode, strerror(-err));
	return true;
}

/* COPY_MODE_WP into the idle area: protected, present, right data. */
static bool copy_wp_installs(struct pat_area *a)
{
	size_t n;

	if (!copy_pages(a, 0, PAGES, UFFDIO_COPY_MODE_WP))
		return false;
	n = pages_with(a->base, a->len, PM_PRESENT | PM_UFFD_WP);
	if (n != PAGES)
		return because("%zu of %d copied pages are present with "
			       "PM_UFFD_WP", n, PAGES);
	for (int i = 0; i < PAGES; i++)
		if (!page_holds(a, i, false, 0))
			return false;
	return expect_no_message(a, "after reading the copied pages");
}

/* Every page of the copied area faults WP on write; resolve each. */
static bool copied_pages_fault_on_write(struct pat_area *a)
{
	struct writer w;

	if (writer_start(&w, a->base, a->len, 'C'))
		return because("pthread_create failed");
	for (int i = 0; i < PAGES; i++) {
		if (!fault_at(a, i, WP_WRITE)) {
			writer_release(a, &w);
			return false;
		}
		if (uffd_wp(a->uffd, pat_area_page(a, i), page_size(), 0)) {
			writer_release(a, &w);
			return because("resolving page %d failed", i);
		}
	}
	if (!writer_joined(&w, FAULT_WAIT_MS)) {
		writer_release(a, &w);
		return because("writer not woken by the last resolution");
	}
	for (int i = 0; i < PAGES; i++)
		if (!page_holds(a, i, true, 'C'))
			return false;
	return expect_no_message(a, "after the writer finished");
}

static void case_copy_wp_pages(void)
{
	struct pat_area a;
	bool installed, faults = false;

	installed = area_setup(&a, MISSING_WP) && copy_wp_installs(&a);
	tap_check(installed, "copy-wp-installs-protected-pages", "%s", why);
	if (installed)
		faults = copied_pages_fault_on_write(&a);
	else
		because("not checked: COPY_MODE_WP did not install protected "
			"pages");
	tap_check(faults, "copy-wp-next-write-faults-wp", "%s", why);
	pat_area_teardown(&a);
}

/*
 * A write to a missing page: MISSING fault first, resolved with
 * COPY_MODE_WP (plus EXTRA mode bits), then a WP fault on the same page.
 */
static bool missing_then_wp(struct pat_area *a, struct writer *w, uint64_t extra)
{
	int err;

	if (writer_start(w, pat_area_page(a, 1), page_size(), 'M'))
		return because("pthread_create failed");
	if (!fault_at(a, 1, UFFD_PAGEFAULT_FLAG_WRITE))
		return because_with("first message");
	/* The message is queued before the writer sleeps: let it sleep. */
	usleep(100 * 1000);
	if (!copy_pages(a, 1, 1, UFFDIO_COPY_MODE_WP | extra))
		return false;
	if (extra & UFFDIO_COPY_MODE_DONTWAKE) {
		if (writer_joined(w, QUIET_MS * 2))
			return because("COPY_MODE_DONTWAKE woke the writer");
		if (!expect_no_message(a, "before UFFDIO_WAKE"))
			return false;
		err = uffd_wake(a->uffd, pat_area_page(a, 1), page_size());
		if (err)
			return because("UFFDIO_WAKE: %s", strerror(-err));
	}
	if (!fault_at(a, 1, WP_WRITE))
		return because_with("second message");
	if (!page_holds(a, 1, false, 0))
		return because_with("before the WP fault was resolved");
	err = uffd_wp(a->uffd, pat_area_page(a, 1), page_size(), 0);
	if (err)
		return because("resolving the WP fault: %s", strerror(-err));
	if (!writer_joined(w, FAULT_WAIT_MS))
		return because("writer not woken after the WP fault");
	return page_holds(a, 1, true, 'M') &&
	       expect_no_message(a, "after the writer finished");
}

static void run_missing_then_wp(const char *name, uint64_t extra)
{
	struct writer w = { 0 };
	struct pat_area a;
	bool ok = area_setup(&a, MISSING_WP);

	if (ok) {
		ok = missing_then_wp(&a, &w, extra);
		if (!ok && w.addr)
			writer_release(&a, &w);
	}
	tap_check(ok, name, "%s", why);
	pat_area_teardown(&a);
}

static bool copy_wp_needs_wp(struct pat_area *a)
{
	int err = uffd_copy(a->uffd, a->base, a->src, a->len,
			    UFFDIO_COPY_MODE_WP);

	if (err != -EINVAL)
		return because("COPY_MODE_WP on a MISSING-only range: %s, "
			       "want EINVAL", err ? strerror(-err) : "success");
	if (pages_with(a->base, a->len, PM_PRESENT))
		return because("the failed copy installed %zu pages",
			       pages_with(a->base, a->len, PM_PRESENT));
	/* The same copy without the WP mode is fine there. */
	if (!copy_pages(a, 0, PAGES, 0))
		return false;
	if (pages_with(a->base, a->len, PM_UFFD_WP))
		return because("a plain copy installed protected pages");
	return page_holds(a, 0, false, 0);
}

static void case_copy_wp_needs_wp(void)
{
	struct pat_area a;
	bool ok = area_setup(&a, UFFDIO_REGISTER_MODE_MISSING) &&
		  copy_wp_needs_wp(&a);

	tap_check(ok, "copy-wp-without-wp-registration-einval", "%s", why);
	pat_area_teardown(&a);
}

static bool plain_copy_unprotected(struct pat_area *a)
{
	struct writer w;

	if (!copy_pages(a, 0, PAGES, 0))
		return false;
	if (pages_with(a->base, a->len, PM_UFFD_WP))
		return because("a plain copy installed %zu protected pages",
			       pages_with(a->base, a->len, PM_UFFD_WP));
	if (writer_start(&w, a->base, a->len, 'P'))
		return because("pthread_create failed");
	if (!writer_joined(&w, FAULT_WAIT_MS)) {
		writer_release(a, &w);
		return because("writes to plainly copied pages blocked");
	}
	for (int i = 0; i < PAGES; i++)
		if (!page_holds(a, i, true, 'P'))
			return false;
	return expect_no_message(a, "after writing plainly copied pages");
}

static void case_plain_copy(void)
{
	struct pat_area a;
	bool ok = area_setup(&a, MISSING_WP) && plain_copy_unprotected(&a);

	tap_check(ok, "copy-without-mode-wp-not-protected", "%s", why);
	pat_area_teardown(&a);
}

int main(void)
{
	watchdog(60);
	tap_plan(6);
	case_copy_wp_pages();
	run_missing_then_wp("copy-wp-missing-then-wp-in-order", 0);
	run_missing_then_wp("copy-wp-dontwake-needs-wake",
			    UFFDIO_COPY_MODE_DONTWAKE);
	case_copy_wp_needs_wp();
	case_plain_copy();
	return tap_done();
}
