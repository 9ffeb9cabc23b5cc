// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-retry: a write to a write-protected page that is swapped out
 * needs both a swap-in and a WP fault, and the fault is retried until both
 * are done.
 *
 * Contract (area 9): such a write completes once the WP fault is resolved,
 * with exactly one WP message and the data intact.  Also: a fault that is
 * woken without being resolved is retried and faults again (one message
 * per retry) as often as it is woken, then completes once resolved; and a
 * run of such writes gives exactly one message per page.
 *
 * The kernel does the swap-in and raises the WP fault in the same fault
 * attempt (do_swap_page() calls do_wp_page()), so the only retries user
 * space can observe are the ones after each wake-up; the second case makes
 * the fault go round several times.
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
#include "wp_probe.h"

#define NR_PAGES	16
#define MSG_WAIT_MS	3000
#define QUIET_MS	300
#define NR_WAKES	2

static long psz;

/*
 * NR_PAGES pages with a pattern, registered and write-protected, then paged
 * out until every page is a protected swap entry.  Reports the case itself
 * (fail or skip) when that does not work.
 */
static bool area_swapped_protected(struct wp_area *a, const char *name,
				   unsigned int seed)
{
	char why[256] = "";

	if (wp_area_create(a, NR_PAGES * psz, why, sizeof(why))) {
		tap_fail(name, "%s", why);
		return false;
	}
	wp_area_fill(a, seed);
	if (wp_area_arm(a, UFFD_FEATURE_PAGEFAULT_FLAG_WP, true, why,
			sizeof(why))) {
		tap_fail(name, "%s", why);
		return false;
	}
	if (!page_out(a->p, a->len, PM_UFFD_WP))
		return true;
	tap_fail(name, "only %zu of %d pages became protected swap entries",
		 pages_swapped(a->p, a->len, PM_UFFD_WP), NR_PAGES);
	return false;
}

static bool is_wp_write_at(const struct uffd_msg *m, void *want)
{
	return m->event == UFFD_EVENT_PAGEFAULT &&
	       (m->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) &&
	       (m->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE) &&
	       m->arg.pagefault.address == (uintptr_t)want;
}

/* After the write: page present, no longer swapped, no longer protected. */
static bool page_settled(void *page, char *why, size_t wlen)
{
	uint64_t e = pagemap_entry(page);

	if ((e & PM_PRESENT) && !(e & (PM_SWAP | PM_UFFD_WP)))
		return true;
	snprintf(why, wlen, "written page not present and unprotected: "
		 "pagemap %#llx", (unsigned long long)e);
	return false;
}

/*
 * Wait for the writer W; if it does not finish, unregister (which wakes it
 * without uffd) and mark the area as not to be unmapped if even that fails.
 */
static bool finish_writer(struct wp_area *a, struct writer *w)
{
	if (writer_wait(w, MSG_WAIT_MS))
		return true;
	uffd_unregister(a->uffd, a->p, a->len);
	uffd_wake(a->uffd, a->p, a->len);
	if (!writer_wait(w, MSG_WAIT_MS))
		a->leak = true;
	return false;
}

/*
 * retry-swapped-write-one-message: the write to a protected, swapped-out
 * page blocks with exactly one WP message for that page, completes once the
 * page is unprotected, and leaves the page swapped in with its data.
 */
static void test_swapped_write_one_message(void)
{
	const char *name = "retry-swapped-write-one-message";
	char *page;
	char why[512] = "";
	struct uffd_msg msg;
	struct writer w;
	struct wp_area a;
	bool ok = false;
	uint64_t at_msg;
	int err;

	if (!area_swapped_protected(&a, name, 1))
		goto out_free;
	page = a.p + 2 * psz;
	if (writer_start(&w, page, 1, 'r'))
		FAIL("pthread_create failed");
	a.expect[2 * psz] = 'r';
	if (uffd_read_msg(a.uffd, &msg, MSG_WAIT_MS) != 1) {
		finish_writer(&a, &w);
		FAIL("no fault message within %d ms", MSG_WAIT_MS);
	}
	at_msg = pagemap_entry(page);
	if (!is_wp_write_at(&msg, page)) {
		finish_writer(&a, &w);
		FAIL("message event %u flags %#llx address %#llx, want a WP "
		     "write fault at %p", msg.event,
		     (unsigned long long)msg.arg.pagefault.flags,
		     (unsigned long long)msg.arg.pagefault.address, page);
	}
	if (__atomic_load_n(&w.done, __ATOMIC_ACQUIRE)) {
		finish_writer(&a, &w);
		FAIL("the write completed before it was resolved");
	}
	err = uffd_wp(a.uffd, page, psz, 0);
	if (err) {
		finish_writer(&a, &w);
		FAIL("unprotect: %s", strerror(-err));
	}
	if (!finish_writer(&a, &w))
		FAIL("the write did not complete after the WP fault was resolved");
	if (uffd_read_msg(a.uffd, &msg, QUIET_MS) == 1)
		FAIL("a second message after resolving (flags %#llx)",
		     (unsigned long long)msg.arg.pagefault.flags);
	if (!page_settled(page, why, sizeof(why)))
		goto out;
	tap_diag("pagemap of the page while the WP fault was pending: %#llx",
		 (unsigned long long)at_msg);
	ok = wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	wp_area_destroy(&a);
}

/*
 * retry-wake-refaults: waking the blocked write without resolving it makes
 * the fault retry and fault again, one message per wake-up; after NR_WAKES
 * such retries, unprotecting lets the write complete.  Exactly
 * NR_WAKES + 1 messages, all for the written page, and the data intact.
 */
static void test_wake_refaults(void)
{
	const char *name = "retry-wake-refaults";
	char *page;
	char why[512] = "";
	struct uffd_msg msg;
	struct writer w;
	struct wp_area a;
	bool ok = false;
	int msgs = 0, err;

	if (!area_swapped_protected(&a, name, 2))
		goto out_free;
	page = a.p + 9 * psz;
	if (writer_start(&w, page, 1, 'R'))
		FAIL("pthread_create failed");
	a.expect[9 * psz] = 'R';
	for (;;) {
		if (uffd_read_msg(a.uffd, &msg, MSG_WAIT_MS) != 1) {
			finish_writer(&a, &w);
			FAIL("no message %d within %d ms", msgs + 1, MSG_WAIT_MS);
		}
		msgs++;
		if (!is_wp_write_at(&msg, page)) {
			finish_writer(&a, &w);
			FAIL("message %d: event %u flags %#llx address %#llx, "
			     "want a WP write fault at %p", msgs, msg.event,
			     (unsigned long long)msg.arg.pagefault.flags,
			     (unsigned long long)msg.arg.pagefault.address, page);
		}
		if (__atomic_load_n(&w.done, __ATOMIC_ACQUIRE)) {
			finish_writer(&a, &w);
			FAIL("the write completed while still protected "
			     "(after %d messages)", msgs);
		}
		if (msgs > NR_WAKES)
			break;
		err = uffd_wake(a.uffd, page, psz);
		if (err) {
			finish_writer(&a, &w);
			FAIL("UFFDIO_WAKE: %s", strerror(-err));
		}
	}
	err = uffd_wp(a.uffd, page, psz, 0);
	if (err) {
		finish_writer(&a, &w);
		FAIL("unprotect: %s", strerror(-err));
	}
	if (!finish_writer(&a, &w))
		FAIL("the write did not complete after %d retries and the "
		     "resolution", msgs);
	if (uffd_read_msg(a.uffd, &msg, QUIET_MS) == 1)
		FAIL("an extra message after resolving (flags %#llx)",
		     (unsigned long long)msg.arg.pagefault.flags);
	if (!page_settled(page, why, sizeof(why)))
		goto out;
	ok = wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	wp_area_destroy(&a);
}

/*
 * retry-many-swapped-pages: one thread writes every page of a protected,
 * swapped-out area while a resolver unprotects each faulting page; all
 * writes complete with exactly one WP message per page.
 */
static void test_many_swapped_pages(void)
{
	const char *name = "retry-many-swapped-pages";
	char why[512] = "";
	struct resolver r;
	struct writer w;
	struct wp_area a;
	bool ok = false, done;

	if (!area_swapped_protected(&a, name, 3))
		goto out_free;
	if (resolver_start(&r, a.uffd))
		FAIL("resolver: pthread_create failed");
	if (writer_start(&w, a.p, a.len, 'M')) {
		resolver_stop(&r);
		FAIL("writer: pthread_create failed");
	}
	for (size_t off = 0; off < a.len; off += psz)
		a.expect[off] = 'M';
	done = writer_wait(&w, 20000);
	resolver_stop(&r);
	if (!done) {
		finish_writer(&a, &w);
		FAIL("the writer did not finish; %d faults resolved", r.faults);
	}
	if (r.faults != NR_PAGES || r.other || r.errors)
		FAIL("%d WP faults (want %d), %d other messages, %d failed "
		     "resolutions", r.faults, NR_PAGES, r.other, r.errors);
	for (int i = 0; i < NR_PAGES; i++)
		if (!page_settled(a.p + i * psz, why, sizeof(why)))
			goto out;
	ok = wp_area_data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	wp_area_destroy(&a);
}

int main(void)
{
	watchdog(60);
	psz = page_size();
	/* Keep MADV_PAGEOUT's LRU drain on the CPU that faulted pages in. */
	if (pin_to_cpu0())
		tap_diag("sched_setaffinity: %s", strerror(errno));
	tap_plan(3);
	test_swapped_write_one_message();
	test_wake_refaults();
	test_many_swapped_pages();
	return tap_done();
}
