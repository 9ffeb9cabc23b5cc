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
 * after swap-in needs no message.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

#define NR_PAGES	16
#define MSG_WAIT_MS	3000
#define QUIET_MS	300
/* A swap pagemap entry holds the swap type in bits 0-4, the offset above. */
#define PM_SWAP_TYPE(e)		((e) & 0x1f)
#define PM_SWAP_OFFSET(e)	(((e) & ((1ULL << 55) - 1)) >> 5)

#define FAIL(...)						\
	do {							\
		snprintf(why, sizeof(why), __VA_ARGS__);	\
		goto out;					\
	} while (0)

static long psz;

/* NR_PAGES anonymous pages, their expected contents and a WP uffd. */
struct area {
	char *p;
	size_t len;
	char *expect;
	int uffd;
	bool leak;
};

/*
 * MADV_PAGEOUT only reclaims pages that reached the LRU; pages faulted in
 * on another CPU can sit in that CPU's LRU batch.  Keep the whole program
 * on CPU 0 so the madvise's own drain covers them.
 */
/* True if E is a swap entry of a real slot on swap device 0 (zram). */
static bool is_swapped(uint64_t e)
{
	return (e & PM_SWAP) && !(e & PM_PRESENT) && PM_SWAP_TYPE(e) == 0 &&
	       PM_SWAP_OFFSET(e) != 0;
}

static int count_swapped(struct area *a)
{
	int n = 0;

	for (size_t off = 0; off < a->len; off += psz)
		n += is_swapped(pagemap_entry(a->p + off));
	return n;
}

/* Page out the whole area; true once every page is a real swap entry. */
static bool page_out(struct area *a)
{
	for (int tries = 0; tries < 20; tries++) {
		if (madvise(a->p, a->len, MADV_PAGEOUT))
			return false;
		if (count_swapped(a) == (int)(a->len / psz))
			return true;
		usleep(10000);
	}
	return false;
}

static bool area_create(struct area *a, unsigned int seed, char *why,
			size_t wlen)
{
	int err;

	memset(a, 0, sizeof(*a));
	a->uffd = -1;
	a->len = NR_PAGES * psz;
	a->p = mmap(NULL, a->len, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a->p == MAP_FAILED) {
		a->p = NULL;
		snprintf(why, wlen, "mmap: %s", strerror(errno));
		return false;
	}
	a->expect = malloc(a->len);
	if (!a->expect) {
		snprintf(why, wlen, "malloc failed");
		return false;
	}
	fill_pattern(a->p, a->len, seed);
	memcpy(a->expect, a->p, a->len);
	a->uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (a->uffd < 0) {
		snprintf(why, wlen, "userfaultfd with WP: %s", strerror(-a->uffd));
		return false;
	}
	err = uffd_register(a->uffd, a->p, a->len, UFFDIO_REGISTER_MODE_WP,
			    NULL);
	if (err) {
		snprintf(why, wlen, "WP register: %s", strerror(-err));
		return false;
	}
	return true;
}

static int area_protect(struct area *a)
{
	return uffd_wp(a->uffd, a->p, a->len, UFFDIO_WRITEPROTECT_MODE_WP);
}

static void area_destroy(struct area *a)
{
	if (a->uffd >= 0)
		close(a->uffd);
	free(a->expect);
	if (a->p && !a->leak)
		munmap(a->p, a->len);
}

static bool data_ok(struct area *a, char *why, size_t wlen)
{
	long d = first_diff(a->p, a->expect, a->len);

	if (d < 0)
		return true;
	snprintf(why, wlen, "data differs at offset %ld (page %ld)", d, d / psz);
	return false;
}

/* Every page's pagemap entry must satisfy PRED; name the first that fails. */
static bool all_pages(struct area *a, bool (*pred)(uint64_t), const char *what,
		      char *why, size_t wlen)
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
	return is_swapped(e) && (e & PM_UFFD_WP);
}

static bool swapped_not_wp(uint64_t e)
{
	return is_swapped(e) && !(e & PM_UFFD_WP);
}

static bool present_wp(uint64_t e)
{
	return (e & PM_PRESENT) && (e & PM_UFFD_WP);
}

struct wp_probe {
	int msgs;
	struct uffd_msg msg;
	bool blocked;
	int resolve_err;
	bool finished;
	int extra;
};

/*
 * Store VAL at ADDR from a writer thread, take the first message while the
 * writer is blocked, unprotect ADDR's page and wait for the writer.
 */
static bool probe_write(int uffd, char *addr, char val, struct wp_probe *pr)
{
	struct writer *w = calloc(1, sizeof(*w));
	char *page = (char *)((uintptr_t)addr & ~(psz - 1));

	memset(pr, 0, sizeof(*pr));
	if (!w || writer_start(w, addr, 1, val)) {
		free(w);
		return false;
	}
	pr->msgs = uffd_read_msg(uffd, &pr->msg, MSG_WAIT_MS) == 1;
	pr->blocked = !__atomic_load_n(&w->done, __ATOMIC_ACQUIRE);
	pr->resolve_err = uffd_wp(uffd, page, psz, 0);
	pr->finished = writer_wait(w, MSG_WAIT_MS);
	if (!pr->finished) {
		uffd_unregister(uffd, page, psz);
		uffd_wake(uffd, page, psz);
		if (!writer_wait(w, MSG_WAIT_MS))
			return false;
	} else {
		struct uffd_msg more;

		pr->extra = uffd_read_msg(uffd, &more, QUIET_MS) == 1;
	}
	free(w);
	return true;
}

static bool probe_ok(const struct wp_probe *pr, void *want, char *why,
		     size_t wlen)
{
	const struct uffd_msg *m = &pr->msg;

	if (!pr->msgs)
		snprintf(why, wlen, "no fault message within %d ms", MSG_WAIT_MS);
	else if (m->event != UFFD_EVENT_PAGEFAULT)
		snprintf(why, wlen, "message event %u, want PAGEFAULT", m->event);
	else if (!(m->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) ||
		 !(m->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE))
		snprintf(why, wlen, "fault flags %#llx, want WP|WRITE",
			 (unsigned long long)m->arg.pagefault.flags);
	else if (m->arg.pagefault.address != (uintptr_t)want)
		snprintf(why, wlen, "fault address %#llx, want %p",
			 (unsigned long long)m->arg.pagefault.address, want);
	else if (!pr->blocked)
		snprintf(why, wlen, "the write completed before it was resolved");
	else if (pr->resolve_err)
		snprintf(why, wlen, "unprotect to resolve: %s",
			 strerror(-pr->resolve_err));
	else if (!pr->finished)
		snprintf(why, wlen, "the write did not complete after resolving");
	else if (pr->extra)
		snprintf(why, wlen, "a second message after resolving");
	else
		return true;
	return false;
}

/* Write VAL to page IDX of A expecting exactly one WP fault there. */
static bool fault_page(struct area *a, int idx, char val, char *why,
		       size_t wlen)
{
	char *page = a->p + idx * psz;
	struct wp_probe pr;

	if (!probe_write(a->uffd, page, val, &pr)) {
		a->leak = true;
		snprintf(why, wlen, "writer on page %d never finished", idx);
		return false;
	}
	a->expect[idx * psz] = val;
	return probe_ok(&pr, page, why, wlen);
}

/* Create, protect and page out an area; on failure the case is reported. */
static bool swapped_protected(struct area *a, const char *name,
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
	if (!page_out(a)) {
		tap_skip(name, "MADV_PAGEOUT left %d of %d pages in swap (%s)",
			 count_swapped(a), NR_PAGES, strerror(errno));
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
	struct area a;
	bool ok;

	if (!swapped_protected(&a, name, 1))
		goto out_free;
	ok = all_pages(&a, swapped_wp, "swapped out with PM_UFFD_WP", why,
		       sizeof(why));
	if (ok)
		ok = data_ok(&a, why, sizeof(why));
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
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
	struct area a;
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
	area_destroy(&a);
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
	struct area a;
	bool ok = false;

	if (!swapped_protected(&a, name, 3))
		goto out_free;
	for (size_t off = 0; off < a.len; off += psz)
		sink = a.p[off];
	(void)sink;
	if (!all_pages(&a, present_wp, "present with PM_UFFD_WP after reading",
		       why, sizeof(why)))
		goto out;
	if (!fault_page(&a, 5, 'w', why, sizeof(why)))
		goto out;
	if (page_wp(a.p + 5 * psz))
		FAIL("page 5 still PM_UFFD_WP after resolving");
	ok = data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
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
	struct area a;
	bool ok = false;
	int err;

	if (!area_create(&a, 4, why, sizeof(why)))
		goto out;
	if (!page_out(&a)) {
		tap_skip(name, "MADV_PAGEOUT left %d of %d pages in swap",
			 count_swapped(&a), NR_PAGES);
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
	if (!fault_page(&a, 3, 'p', why, sizeof(why)))
		goto out;
	ok = data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

/*
 * swap-unprotect-while-swapped: unprotecting swapped-out pages clears the
 * bit on the swap entries; a write then swaps in without any message.
 */
static void test_unprotect_while_swapped(void)
{
	const char *name = "swap-unprotect-while-swapped";
	char why[512] = "";
	struct uffd_msg msg;
	struct writer w;
	struct area a;
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
	if (writer_start(&w, a.p + 3 * psz, 1, 'u'))
		FAIL("pthread_create failed");
	if (!writer_wait(&w, MSG_WAIT_MS)) {
		a.leak = true;
		FAIL("write to the unprotected swapped-out page blocked");
	}
	a.expect[3 * psz] = 'u';
	if (uffd_read_msg(a.uffd, &msg, QUIET_MS) == 1)
		FAIL("the write sent a message (flags %#llx)",
		     (unsigned long long)msg.arg.pagefault.flags);
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
	if (pin_to_cpu0())
		tap_diag("sched_setaffinity: %s", strerror(errno));
	tap_plan(5);
	test_pageout_keeps_wp();
	test_read_no_message();
	test_write_after_swapin_faults();
	test_protect_while_swapped();
	test_unprotect_while_swapped();
	return tap_done();
}
