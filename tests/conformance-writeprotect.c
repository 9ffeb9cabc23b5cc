// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-writeprotect: UFFDIO_WRITEPROTECT on private anonymous memory.
 *
 * Contract checked (issue tracker, area 2 "writeprotect"):
 *  - MODE_WP marks every page of the range (pagemap PM_UFFD_WP) and mode 0
 *    clears it;
 *  - reads of protected pages never fault;
 *  - every write to every protected page stops the writer and delivers
 *    exactly one message, flags UFFD_PAGEFAULT_FLAG_WP|FLAG_WRITE, at that
 *    page, and the store is not visible before the fault is resolved;
 *  - resolving with mode 0 wakes the writer and the page then holds exactly
 *    what the writer wrote (the rest of the page untouched);
 *  - a resolved page can be protected again and faults again;
 *  - mode 0|DONTWAKE unprotects but leaves the writer asleep until
 *    UFFDIO_WAKE;
 *  - MODE_WP|MODE_DONTWAKE, unknown mode bits, an unaligned start or
 *    length, a zero length and a wrapping range are EINVAL and change
 *    nothing;
 *  - a range with no registered VMA (a hole, or an unregistered mapping)
 *    and a VMA registered without MODE_WP are ENOENT;
 *  - many scattered sub-ranges of one registration can be protected one by
 *    one: exactly those pages fault, pages outside them never do;
 *  - mprotect() does not drop the protection: after PROT_NONE, PROT_READ
 *    and back to PROT_READ|PROT_WRITE every page still has PM_UFFD_WP and
 *    a write still takes a WP fault (the architecture's pte_modify() must
 *    keep the bit).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"
#include "wp_probe.h"

#define FAULT_WAIT_MS	3000	/* an expected message or wake-up */
#define QUIET_MS	200	/* how long "nothing happens" is watched */
#define WP_WRITE	(UFFD_PAGEFAULT_FLAG_WP | UFFD_PAGEFAULT_FLAG_WRITE)

/* The byte the setup stored at offset OFF of page I. */
static char pattern(int i, size_t off)
{
	return (char)(0x11 * (i % 13) + off % 251);
}

/* A registered area of private anonymous pages, each filled with the pattern. */
static bool area_setup(struct pat_area *a, int npages, uint64_t mode)
{
	if (!pat_area_map(a, npages, pattern, false))
		return false;
	a->uffd = wp_uffd_open(a->base, a->len, UFFD_FEATURE_PAGEFAULT_FLAG_WP,
			       mode, false, why, sizeof(why));
	return a->uffd >= 0;
}

/* Protect pages [first, first + n) and check pagemap agrees. */
static bool protect(struct pat_area *a, int first, int n)
{
	return protect_checked(a->uffd, pat_area_page(a, first), n * page_size());
}

/*
 * Let a writer that may be blocked in a fault go: unprotect everything
 * (mode 0 wakes) and wait for it.  If it still does not finish, the area
 * must never be unmapped under it.
 */
static void writer_release(struct pat_area *a, struct writer *w)
{
	writer_release_wake(w, a->uffd, a->base, a->len, FAULT_WAIT_MS,
			    &a->stuck);
}

/* Read one message and require a WP write fault at page I. */
static bool expect_wp_fault(struct pat_area *a, int i)
{
	return expect_fault(a->uffd, pat_area_page(a, i), WP_WRITE, FAULT_WAIT_MS);
}

static bool expect_no_message(struct pat_area *a, const char *when)
{
	return expect_quiet(a->uffd, QUIET_MS, when);
}

static void case_pagemap_bit(void)
{
	const char *name = "writeprotect-pagemap-bit-follows-mode";
	struct pat_area a;
	bool ok = area_setup(&a, 16, UFFDIO_REGISTER_MODE_WP);
	size_t left;
	int err;

	if (ok && pages_with(a.base, a.len, PM_UFFD_WP))
		ok = because("pages have PM_UFFD_WP before any MODE_WP");
	ok = ok && protect(&a, 0, a.npages);
	if (ok) {
		err = uffd_wp(a.uffd, a.base, a.len, 0);
		left = pages_with(a.base, a.len, PM_UFFD_WP);
		if (err)
			ok = because("UFFDIO_WRITEPROTECT(0): %s", strerror(-err));
		else if (left)
			ok = because("after mode 0 %zu pages keep PM_UFFD_WP", left);
	}
	tap_check(ok, name, "%s", why);
	pat_area_teardown(&a);
}

/* A thread that reads every byte of an area and checks the pattern. */
struct reader {
	pthread_t thread;
	struct pat_area *a;
	volatile int done;
	int bad_page;		/* first page with a wrong byte, or -1 */
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;

	r->bad_page = -1;
	for (int i = 0; i < r->a->npages && r->bad_page < 0; i++)
		for (size_t off = 0; off < (size_t)page_size(); off++)
			if (((volatile char *)pat_area_page(r->a, i))[off] !=
			    pattern(i, off)) {
				r->bad_page = i;
				break;
			}
	__atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static bool reader_wait(struct reader *r, int timeout_ms)
{
	return joined_within(r->thread, &r->done, timeout_ms);
}

static bool reads_do_not_fault(struct pat_area *a)
{
	struct reader r = { .a = a };
	bool ok;

	if (pthread_create(&r.thread, NULL, reader_main, &r))
		return because("pthread_create failed");
	if (!reader_wait(&r, FAULT_WAIT_MS)) {
		because("a reader of protected pages did not finish in %d ms",
			FAULT_WAIT_MS);
		uffd_wp(a->uffd, a->base, a->len, 0);
		if (!reader_wait(&r, FAULT_WAIT_MS))
			a->stuck = true;
		return false;
	}
	if (r.bad_page >= 0)
		return because("reader saw wrong data in page %d", r.bad_page);
	ok = expect_no_message(a, "after reading protected pages");
	if (ok && pages_with(a->base, a->len, PM_UFFD_WP) != (size_t)a->npages)
		ok = because("reading dropped PM_UFFD_WP from %zu pages",
			     a->npages - pages_with(a->base, a->len, PM_UFFD_WP));
	return ok;
}

static void case_reads_never_fault(void)
{
	struct pat_area a;
	bool ok = area_setup(&a, 16, UFFDIO_REGISTER_MODE_WP) &&
		  protect(&a, 0, 16) && reads_do_not_fault(&a);

	tap_check(ok, "writeprotect-reads-never-fault", "%s", why);
	pat_area_teardown(&a);
}

/*
 * A writer stores VAL into byte 0 of every page.  Each store must arrive
 * as one WP fault at that page, in order, and must not be visible before
 * we resolve it with mode 0.
 */
static bool every_write_faults_once(struct pat_area *a, struct writer *w, char val)
{
	if (writer_start(w, a->base, a->len, val))
		return because("pthread_create failed");
	for (int i = 0; i < a->npages; i++) {
		int err;

		if (!expect_wp_fault(a, i))
			return false;
		if (pat_area_page(a, i)[0] != pattern(i, 0))
			return because("page %d already changed before the fault "
				       "was resolved", i);
		if (!page_wp(pat_area_page(a, i)))
			return because("page %d lost PM_UFFD_WP while its writer "
				       "waits", i);
		err = uffd_wp(a->uffd, pat_area_page(a, i), page_size(), 0);
		if (err)
			return because("resolving page %d: %s", i, strerror(-err));
	}
	if (!writer_joined(w, FAULT_WAIT_MS))
		return because("writer still blocked after every fault was "
			       "resolved with mode 0");
	return expect_no_message(a, "after the last write");
}

static bool writes_landed(struct pat_area *a, char val)
{
	for (int i = 0; i < a->npages; i++)
		if (!pat_area_holds(a, i, true, val))
			return false;
	if (pages_with(a->base, a->len, PM_UFFD_WP))
		return because("%zu resolved pages keep PM_UFFD_WP",
			       pages_with(a->base, a->len, PM_UFFD_WP));
	return true;
}

static void case_every_write_faults(void)
{
	struct pat_area a;
	struct writer w = { 0 };
	bool faults, data = false;

	faults = area_setup(&a, 16, UFFDIO_REGISTER_MODE_WP) &&
		 protect(&a, 0, 16) && every_write_faults_once(&a, &w, 'W');
	tap_check(faults, "writeprotect-every-write-faults-once", "%s", why);
	if (faults)
		data = writes_landed(&a, 'W');
	else
		snprintf(why, sizeof(why), "not checked: the writes did not "
			 "fault and resolve as required");
	tap_check(data, "writeprotect-resolve-keeps-written-data", "%s", why);
	if (!faults && w.addr)
		writer_release(&a, &w);
	pat_area_teardown(&a);
}

/*
 * A writer thread stores VAL at byte 0 of protected page I: it must stop in
 * one WP fault at that page, and resolving the page (mode 0) must wake it.
 */
static bool write_faults_then_resolves(struct pat_area *a, int i, char val)
{
	struct writer w;
	int err;

	if (writer_start(&w, pat_area_page(a, i), 1, val))
		return because("pthread_create failed");
	if (!expect_wp_fault(a, i)) {
		writer_release(a, &w);
		return false;
	}
	err = uffd_wp(a->uffd, pat_area_page(a, i), page_size(), 0);
	if (err) {
		writer_release(a, &w);
		return because("resolving page %d: %s", i, strerror(-err));
	}
	if (!writer_joined(&w, FAULT_WAIT_MS)) {
		writer_release(a, &w);
		return because("page %d: writer not woken", i);
	}
	return true;
}

/* One page, protected, written, resolved, protected again, written again. */
static bool reprotect_faults_again(struct pat_area *a)
{
	for (int round = 0; round < 3; round++) {
		char val = (char)('a' + round);

		if (!protect(a, 0, 1))
			return false;
		if (!write_faults_then_resolves(a, 0, val))
			return because_with(round ? "after re-protecting" :
					    "first round");
		if (a->base[0] != val)
			return because("round %d: byte 0 is %#x, want %#x", round,
				       (unsigned char)a->base[0],
				       (unsigned char)val);
	}
	return true;
}

static void case_reprotect(void)
{
	struct pat_area a;
	bool ok = area_setup(&a, 1, UFFDIO_REGISTER_MODE_WP) &&
		  reprotect_faults_again(&a);

	tap_check(ok, "writeprotect-reprotect-faults-again", "%s", why);
	pat_area_teardown(&a);
}

static bool dontwake_needs_wake(struct pat_area *a, struct writer *w)
{
	int err;

	if (writer_start(w, a->base, page_size(), 'D'))
		return because("pthread_create failed");
	if (!expect_wp_fault(a, 0))
		return false;
	/* The message is queued before the writer sleeps: let it sleep. */
	usleep(100 * 1000);
	err = uffd_wp(a->uffd, a->base, page_size(),
		      UFFDIO_WRITEPROTECT_MODE_DONTWAKE);
	if (err)
		return because("UFFDIO_WRITEPROTECT(DONTWAKE): %s", strerror(-err));
	if (page_wp(a->base))
		return because("mode DONTWAKE did not unprotect the page");
	if (writer_joined(w, QUIET_MS * 2))
		return because("writer finished without UFFDIO_WAKE");
	err = uffd_wake(a->uffd, a->base, page_size());
	if (err)
		return because("UFFDIO_WAKE: %s", strerror(-err));
	if (!writer_joined(w, FAULT_WAIT_MS))
		return because("writer still asleep after UFFDIO_WAKE");
	return expect_no_message(a, "after the wake") &&
	       pat_area_holds(a, 0, true, 'D');
}

static void case_dontwake(void)
{
	struct pat_area a;
	struct writer w = { 0 };
	bool ok = area_setup(&a, 1, UFFDIO_REGISTER_MODE_WP) &&
		  protect(&a, 0, 1);

	if (ok) {
		ok = dontwake_needs_wake(&a, &w);
		if (!ok && w.addr)
			writer_release(&a, &w);
	}
	tap_check(ok, "writeprotect-dontwake-needs-wake", "%s", why);
	pat_area_teardown(&a);
}

/*
 * UFFDIO_WRITEPROTECT(area + OFF, LEN, MODE) on a registered, unprotected
 * 4-page area must fail with WANT and protect nothing.
 */
static bool rejected(uint64_t off, uint64_t len, uint64_t mode, int want)
{
	struct pat_area a;
	bool ok = area_setup(&a, 4, UFFDIO_REGISTER_MODE_WP);
	int err;

	if (ok) {
		err = uffd_wp(a.uffd, a.base + off, len, mode);
		if (err != want)
			ok = because("start area+%#llx len %#llx mode %#llx gave "
				     "%s, want %s", (unsigned long long)off,
				     (unsigned long long)len,
				     (unsigned long long)mode,
				     err ? strerror(-err) : "success",
				     strerror(-want));
		else if (pages_with(a.base, a.len, PM_UFFD_WP))
			ok = because("the failed call protected %zu pages",
				     pages_with(a.base, a.len, PM_UFFD_WP));
	}
	pat_area_teardown(&a);
	return ok;
}

static void case_bad_arguments(void)
{
	uint64_t psz = page_size();
	uint64_t wp = UFFDIO_WRITEPROTECT_MODE_WP;

	tap_check(rejected(0, psz, wp | UFFDIO_WRITEPROTECT_MODE_DONTWAKE,
			   -EINVAL),
		  "writeprotect-wp-with-dontwake-einval", "%s", why);
	tap_check(rejected(0, psz, wp | (1ULL << 2), -EINVAL) &&
		  rejected(0, psz, 1ULL << 63, -EINVAL),
		  "writeprotect-unknown-mode-einval", "%s", why);
	tap_check(rejected(1, psz, wp, -EINVAL) &&
		  rejected(psz / 2, psz, wp, -EINVAL),
		  "writeprotect-unaligned-start-einval", "%s", why);
	tap_check(rejected(0, psz + 1, wp, -EINVAL) &&
		  rejected(0, psz / 2, wp, -EINVAL),
		  "writeprotect-unaligned-len-einval", "%s", why);
	tap_check(rejected(0, 0, wp, -EINVAL) && rejected(0, 0, 0, -EINVAL),
		  "writeprotect-zero-len-einval", "%s", why);
	/* start + len passes 2^64 (the area's start is added to 0). */
	tap_check(rejected(0, -psz, wp, -EINVAL) &&
		  rejected(psz, -2 * psz, wp, -EINVAL),
		  "writeprotect-wrapping-range-einval", "%s", why);
}

static bool unregistered_is_enoent(void)
{
	size_t len = 4 * page_size();
	char *hole, *plain;
	int uffd, err;
	bool ok = true;

	uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (uffd < 0)
		return because("uffd_open: %s", strerror(-uffd));
	hole = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	plain = mmap(NULL, len, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (hole == MAP_FAILED || plain == MAP_FAILED) {
		close(uffd);
		return because("mmap: %s", strerror(errno));
	}
	munmap(hole, len);
	memset(plain, 1, len);
	err = uffd_wp(uffd, hole, len, UFFDIO_WRITEPROTECT_MODE_WP);
	if (err != -ENOENT)
		ok = because("range with no mapping: %s, want ENOENT",
			     err ? strerror(-err) : "success");
	err = uffd_wp(uffd, plain, len, UFFDIO_WRITEPROTECT_MODE_WP);
	if (ok && err != -ENOENT)
		ok = because("unregistered anonymous mapping: %s, want ENOENT",
			     err ? strerror(-err) : "success");
	if (ok && pages_with(plain, len, PM_UFFD_WP))
		ok = because("the unregistered mapping got PM_UFFD_WP");
	munmap(plain, len);
	close(uffd);
	return ok;
}

static void case_unregistered(void)
{
	tap_check(unregistered_is_enoent(),
		  "writeprotect-unregistered-range-enoent", "%s", why);
}

static void case_missing_only(void)
{
	struct pat_area a;
	bool ok = area_setup(&a, 4, UFFDIO_REGISTER_MODE_MISSING);
	int err;

	if (ok) {
		err = uffd_wp(a.uffd, a.base, a.len, UFFDIO_WRITEPROTECT_MODE_WP);
		if (err != -ENOENT)
			ok = because("MISSING-only VMA: %s, want ENOENT",
				     err ? strerror(-err) : "success");
		else if (pages_with(a.base, a.len, PM_UFFD_WP))
			ok = because("the MISSING-only VMA got PM_UFFD_WP");
	}
	tap_check(ok, "writeprotect-missing-only-vma-enoent", "%s", why);
	pat_area_teardown(&a);
}

/* Sub-ranges of a 64-page registration, protected one call each. */
static const struct { int first, n; } scattered[] = {
	{ 1, 1 }, { 3, 2 }, { 8, 3 }, { 13, 1 }, { 17, 4 }, { 25, 1 },
	{ 27, 1 }, { 30, 5 }, { 40, 2 }, { 45, 1 }, { 50, 7 }, { 63, 1 },
};
#define SCATTER_PAGES 64

static bool in_scattered(int page)
{
	for (size_t r = 0; r < sizeof(scattered) / sizeof(scattered[0]); r++)
		if (page >= scattered[r].first &&
		    page < scattered[r].first + scattered[r].n)
			return true;
	return false;
}

static bool protect_scattered(struct pat_area *a)
{
	for (size_t r = 0; r < sizeof(scattered) / sizeof(scattered[0]); r++)
		if (!protect(a, scattered[r].first, scattered[r].n))
			return false;
	for (int i = 0; i < a->npages; i++)
		if (page_wp(pat_area_page(a, i)) != in_scattered(i))
			return because("page %d: PM_UFFD_WP %d, protected %d", i,
				       page_wp(pat_area_page(a, i)), in_scattered(i));
	return true;
}

/*
 * Run a writer over the whole area, resolving every WP fault with mode 0,
 * and count the faults per page in COUNT.
 */
static bool serve_writer(struct pat_area *a, struct writer *w, char val, int *count)
{
	long long end = now_ms() + 10 * FAULT_WAIT_MS;

	if (writer_start(w, a->base, a->len, val))
		return because("pthread_create failed");
	while (!__atomic_load_n(&w->done, __ATOMIC_ACQUIRE)) {
		struct uffd_msg msg;
		uintptr_t addr;
		int n, i;

		if (now_ms() > end)
			return because("writer not done after %d ms",
				       10 * FAULT_WAIT_MS);
		n = uffd_read_msg(a->uffd, &msg, 20);
		if (n < 0)
			return because("reading the uffd: %s", strerror(-n));
		if (!n)
			continue;
		addr = msg.arg.pagefault.address;
		if (msg.event != UFFD_EVENT_PAGEFAULT ||
		    msg.arg.pagefault.flags != WP_WRITE ||
		    addr < (uintptr_t)a->base || addr >= (uintptr_t)a->base + a->len ||
		    addr % page_size())
			return because("bad message: event %u flags %#llx addr %#lx",
				       msg.event,
				       (unsigned long long)msg.arg.pagefault.flags,
				       (unsigned long)addr);
		i = (addr - (uintptr_t)a->base) / page_size();
		count[i]++;
		if (uffd_wp(a->uffd, pat_area_page(a, i), page_size(), 0))
			return because("resolving page %d failed", i);
	}
	writer_joined(w, FAULT_WAIT_MS);
	return expect_no_message(a, "after the writer finished");
}

static void case_scattered(void)
{
	int count[SCATTER_PAGES] = { 0 };
	bool set_up, faults = true, quiet = true;
	struct writer w = { 0 };
	struct pat_area a;

	set_up = area_setup(&a, SCATTER_PAGES, UFFDIO_REGISTER_MODE_WP) &&
		 protect_scattered(&a) && serve_writer(&a, &w, 'S', count);
	if (!set_up) {
		faults = quiet = false;
		if (w.addr)
			writer_release(&a, &w);
	}
	for (int i = 0; set_up && i < SCATTER_PAGES; i++) {
		if (in_scattered(i) && count[i] != 1)
			faults = because("protected page %d faulted %d times, "
					 "want once", i, count[i]);
		if (!in_scattered(i) && count[i])
			quiet = false;
	}
	for (int i = 0; faults && i < SCATTER_PAGES; i++)
		faults = pat_area_holds(&a, i, true, 'S');
	tap_check(faults, "writeprotect-scattered-subranges", "%s", why);
	if (set_up && !quiet) {
		char list[256] = "";
		size_t used = 0;

		for (int i = 0; i < SCATTER_PAGES && used < sizeof(list) - 8; i++)
			if (!in_scattered(i) && count[i])
				used += snprintf(list + used, sizeof(list) - used,
						 " %d", i);
		because("unprotected pages faulted:%s", list);
	}
	tap_check(quiet, "writeprotect-unprotected-pages-never-fault", "%s", why);
	pat_area_teardown(&a);
}

/*
 * Protect every page, take the range through PROT_NONE and PROT_READ back to
 * PROT_READ|PROT_WRITE, then check pagemap and that a write to page 2 still
 * stops in a WP fault and lands once resolved.
 */
static bool mprotect_keeps_wp(struct pat_area *a)
{
	static const int prots[] = { PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE };
	size_t got;

	if (!protect(a, 0, a->npages))
		return false;
	for (size_t k = 0; k < sizeof(prots) / sizeof(prots[0]); k++)
		if (mprotect(a->base, a->len, prots[k]))
			return because("mprotect(%#x): %s", prots[k],
				       strerror(errno));
	got = pages_with(a->base, a->len, PM_UFFD_WP);
	if (got != (size_t)a->npages)
		return because("after mprotect %zu of %d pages have PM_UFFD_WP",
			       got, a->npages);
	if (!write_faults_then_resolves(a, 2, 'M'))
		return because_with("write after mprotect");
	return expect_no_message(a, "after resolving") &&
	       pat_area_holds(a, 2, true, 'M') && pat_area_holds(a, 3, false, 0);
}

static void case_mprotect(void)
{
	struct pat_area a;
	bool ok = area_setup(&a, 4, UFFDIO_REGISTER_MODE_WP) &&
		  mprotect_keeps_wp(&a);

	tap_check(ok, "writeprotect-mprotect-keeps-wp", "%s", why);
	pat_area_teardown(&a);
}

int main(void)
{
	watchdog(120);
	tap_plan(17);
	case_pagemap_bit();
	case_reads_never_fault();
	case_every_write_faults();
	case_reprotect();
	case_dontwake();
	case_bad_arguments();
	case_unregistered();
	case_missing_only();
	case_scattered();
	case_mprotect();
	return tap_done();
}
