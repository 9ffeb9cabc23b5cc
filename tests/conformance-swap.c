// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-swap: the uffd-wp bit survives swap-out (zram swap in the
 * guest).
 *
 * Contract (area 5):
 *  - MADV_PAGEOUT of write-protected anonymous pages keeps the uffd-wp bit
 *    on the swap entry: pagemap shows PM_SWAP and PM_UFFD_WP (and, read as
 *    root, a real swap slot of swap device 0 rather than a pte marker);
 *  - reading a swapped-out protected page swaps it in without a fault
 *    message and the page stays protected;
 *  - the next write takes a WP fault;
 *  - the data survives.
 * Also: protecting pages that are already swapped out marks the swap
 * entries, and unprotecting swapped-out pages clears the bit so the write
 * after swap-in needs no message.  UFFDIO_MOVE of protected pages that are
 * swapped out leaves the bit behind, as the move of a present page does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"
#include "wp_probe.h"

#define NR_PAGES	16
#define QUIET_MS	300

static long psz;

/* NR_PAGES pages with a pattern, registered for WP but not protected. */
static bool area_create(struct wp_area *a, unsigned int seed, char *why,
			size_t wlen)
{
	if (wp_area_create(a, NR_PAGES * psz, why, wlen))
		return false;
	wp_area_fill(a, seed);
	return !wp_area_arm(a, UFFD_FEATURE_PAGEFAULT_FLAG_WP, false, why,
			    wlen);
}

static int area_protect(struct wp_area *a)
{
	return uffd_wp(a->uffd, a->p, a->len, UFFDIO_WRITEPROTECT_MODE_WP);
}

/* Every page's pagemap entry must satisfy PRED; name the first that fails. */
static bool all_pages(struct wp_area *a, bool (*pred)(uint64_t),
		      const char *what, char *why, size_t wlen)
{
	for (size_t i = 0; i < a->len / psz; i++) {
		uint64_t e = pagemap_entry(a->p + i * psz);

		if (!pred(e)) {
			snprintf(why, wlen, "page %zu is not %s: pagemap %#llx",
				 i, what, (unsigned long long)e);
			return false;
		}
	}
	return true;
}

static bool swapped_wp(uint64_t e)
{
	return pm_swapped(e) && (e & PM_UFFD_WP);
}

static bool swapped_not_wp(uint64_t e)
{
	return pm_swapped(e) && !(e & PM_UFFD_WP);
}

static bool present_wp(uint64_t e)
{
	return (e & PM_PRESENT) && (e & PM_UFFD_WP);
}

/* Create, protect and page out an area; on failure the case is reported. */
static bool swapped_protected(struct wp_area *a, const char *name,
			      unsigned int seed)
{
	char why[256] = "";
	int err;

	if (!area_create(a, seed, why, sizeof(why))) {
		tap_fail(name, "%s", why);
		return false;
	}
	err = area_protect(a);
	if (err) {
		tap_fail(name, "protect: %s", strerror(-err));
		return false;
	}
	err = page_out(a->p, a->len, 0);
	if (err) {
		tap_skip(name, "MADV_PAGEOUT left %zu of %d pages in swap (%s)",
			 pages_swapped(a->p, a->len, 0), NR_PAGES,
			 strerror(-err));
		return false;
	}
	return true;
}

/*
 * swap-pageout-keeps-wp: after MADV_PAGEOUT every protected page is a real
 * swap entry (device 0, non-zero slot) that still carries PM_UFFD_WP.
 */
static void test_pageout_keeps_wp(void)
{
	const char *name = "swap-pageout-keeps-wp";
	char why[512] = "";
	struct wp_area a;
	bool ok;

	if (!swapped_protected(&a, name, 1))
		goto out_free;
	ok = all_pages(&a, swapped_wp, "swapped out with PM_UFFD_WP", why,
		       sizeof(why));
	if (ok)
		ok = wp_area_data_ok(&a, why, sizeof(why));
	tap_check(ok, name, "%s", why);
out_free:
	wp_area_destroy(&a);
}

/*
 * swap-read-no-message: reading swapped-out protected pages returns their
 * data without any fault message, and leaves them present and protected.
 */
static void test_read_no_message(void)
{
	const char *name = "swap-read-no-message";
	char why[512] = "";
	struct uffd_msg msg;
	struct wp_area a;
	bool ok = false;
	long d;

	if (!swapped_protected(&a, name, 2))
		goto out_free;
	d = first_diff(a.p, a.expect, a.len);
	if (d >= 0)
		FAIL("data read back differs at offset %ld", d);
	if (uffd_read_msg(a.uffd, &msg, QUIET_MS) == 1)
		FAIL("reading sent a message (event %u, flags %#llx)", msg.event,
		     (unsigned long long)msg.arg.pagefault.flags);
	ok = all_pages(&a, present_wp, "present with PM_UFFD_WP", why,
		       sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	wp_area_destroy(&a);
}

/*
 * swap-write-after-swapin-faults: once read back in, a write to a
 * protected page takes one WP fault; the other pages keep their data.
 */
static void test_write_after_swapin_faults(void)
{
	const char *name = "swap-write-after-swapin-faults";
	char why[512] = "";
	volatile char sink;
	struct wp_area a;
	bool ok = false;

	if (!swapped_protected(&a, name, 3))
		goto out_free;
	for (size_t off = 0; off < a.len; off += psz)
		sink = a.p[off];
	(void)sink;
	if (!all_pages(&a, present_wp, "present with PM_UFFD_WP after reading",
		       why, sizeof(why)))
		goto out;
	if (!wp_area_fault_page(&a, 5, 'w', why, sizeof(why)))
		goto out;
	if (page_wp(a.p + 5 * psz))
		FAIL("page 5 still PM_UFFD_WP after resolving");
	ok = wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	wp_area_destroy(&a);
}

/*
 * swap-protect-while-swapped: protecting pages that are already swapped
 * out sets the bit on their swap entries, and a write swaps the page in
 * and takes a WP fault.
 */
static void test_protect_while_swapped(void)
{
	const char *name = "swap-protect-while-swapped";
	char why[512] = "";
	struct wp_area a;
	bool ok = false;
	int err;

	if (!area_create(&a, 4, why, sizeof(why)))
		goto out;
	if (page_out(a.p, a.len, 0)) {
		tap_skip(name, "MADV_PAGEOUT left %zu of %d pages in swap",
			 pages_swapped(a.p, a.len, 0), NR_PAGES);
		goto out_free;
	}
	if (!all_pages(&a, swapped_not_wp, "swapped out without PM_UFFD_WP",
		       why, sizeof(why)))
		goto out;
	err = area_protect(&a);
	if (err)
		FAIL("protect swapped-out pages: %s", strerror(-err));
	if (!all_pages(&a, swapped_wp, "swapped out with PM_UFFD_WP", why,
		       sizeof(why)))
		goto out;
	if (!wp_area_fault_page(&a, 3, 'p', why, sizeof(why)))
		goto out;
	ok = wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	wp_area_destroy(&a);
}

/*
 * swap-unprotect-while-swapped: unprotecting swapped-out pages clears the
 * bit on the swap entries; a write then swaps in without any message.
 */
static void test_unprotect_while_swapped(void)
{
	const char *name = "swap-unprotect-while-swapped";
	char why[512] = "";
	struct wp_area a;
	bool ok = false;
	int err;

	if (!swapped_protected(&a, name, 5))
		goto out_free;
	if (!all_pages(&a, swapped_wp, "swapped out with PM_UFFD_WP", why,
		       sizeof(why)))
		goto out;
	err = uffd_wp(a.uffd, a.p, a.len, 0);
	if (err)
		FAIL("unprotect swapped-out pages: %s", strerror(-err));
	if (!all_pages(&a, swapped_not_wp, "swapped out without PM_UFFD_WP",
		       why, sizeof(why)))
		goto out;
	a.expect[3 * psz] = 'u';
	if (!wp_write_no_fault(a.uffd, a.p + 3 * psz, 'u', &a.leak, why,
			       sizeof(why)))
		goto out;
	ok = wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	wp_area_destroy(&a);
}

/*
 * swap-move-clears-wp: UFFDIO_MOVE of write-protected pages that are
 * swapped out gives the destination swap entries without the uffd-wp bit,
 * as the move of a present page builds a PTE without it.  The destination
 * is registered for missing faults only: a bit carried over shows in
 * pagemap, and swapping the page in for a write then makes a writable PTE
 * that still has uffd-wp set (PAGE_TABLE_CHECK warns).  The data moves.
 */
static void test_move_swapped_clears_wp(void)
{
	const char *name = "swap-move-clears-wp";
	char why[512] = "";
	char *dst = MAP_FAILED;
	struct wp_area a;
	bool ok = false;
	int err, i;

	err = wp_area_create(&a, NR_PAGES * psz, why, sizeof(why));
	if (err)
		goto out;
	wp_area_fill(&a, 6);
	err = wp_area_arm(&a, UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_MOVE,
			  true, why, sizeof(why));
	if (err == -EOPNOTSUPP) {
		tap_skip(name, "%s", why);
		goto out_free;
	}
	if (err)
		goto out;
	err = page_out(a.p, a.len, PM_UFFD_WP);
	if (err) {
		tap_skip(name, "MADV_PAGEOUT left %zu of %d pages in swap with PM_UFFD_WP (%s)",
			 pages_swapped(a.p, a.len, PM_UFFD_WP), NR_PAGES,
			 strerror(-err));
		goto out_free;
	}
	dst = mmap(NULL, a.len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (dst == MAP_FAILED)
		FAIL("mmap: %s", strerror(errno));
	err = uffd_register(a.uffd, dst, a.len, UFFDIO_REGISTER_MODE_MISSING,
			    NULL);
	if (err)
		FAIL("register the destination for missing faults: %s",
		     strerror(-err));
	for (i = 0; i < NR_PAGES; i++) {
		err = uffd_move(a.uffd, dst + i * psz, a.p + i * psz, psz,
				0);
		if (err)
			FAIL("UFFDIO_MOVE of swapped-out page %d: %s", i,
			     strerror(-err));
	}
	for (i = 0; i < NR_PAGES; i++) {
		uint64_t e = pagemap_entry(dst + i * psz);

		if (e & PM_UFFD_WP)
			FAIL("moved page %d still carries PM_UFFD_WP (pagemap %#llx, %s)",
			     i, (unsigned long long)e,
			     pm_swapped(e) ? "a swap entry" : "present");
	}
	if (memcmp(dst, a.expect, a.len))
		FAIL("moved data differs at byte %ld",
		     first_diff(dst, a.expect, a.len));
	/* A write swaps each page in: writable, no bit, nothing queued. */
	for (i = 0; i < NR_PAGES; i++)
		dst[i * psz] = 'm';
	for (i = 0; i < NR_PAGES; i++) {
		uint64_t e = pagemap_entry(dst + i * psz);

		if (!(e & PM_PRESENT) || (e & PM_UFFD_WP))
			FAIL("page %d after its write: pagemap %#llx (want present, no PM_UFFD_WP)",
			     i, (unsigned long long)e);
	}
	ok = true;
out:
	tap_check(ok, name, "%s", why);
out_free:
	if (dst != MAP_FAILED)
		munmap(dst, a.len);
	wp_area_destroy(&a);
}

int main(void)
{
	watchdog(60);
	psz = page_size();
	/*
	 * MADV_PAGEOUT only reclaims pages that reached the LRU; pages
	 * faulted in on another CPU can sit in that CPU's LRU batch.  Keep
	 * the whole program on CPU 0 so the madvise's own drain covers them.
	 */
	if (pin_to_cpu0())
		tap_diag("sched_setaffinity: %s", strerror(errno));
	tap_plan(6);
	test_pageout_keeps_wp();
	test_read_no_message();
	test_write_after_swapin_faults();
	test_protect_while_swapped();
	test_unprotect_while_swapped();
	test_move_swapped_clears_wp();
	return tap_done();
}
