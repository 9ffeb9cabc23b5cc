// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-sigbus: write-protection with UFFD_FEATURE_SIGBUS.
 *
 * Contract checked (issue tracker, area 11 "sigbus"): on a uffd opened with
 * UFFD_FEATURE_SIGBUS, a write to a write-protected page
 *  - raises SIGBUS in the writing thread, with si_addr inside that page,
 *  - queues no message on the uffd,
 *  - leaves the page's data and its protection (PM_UFFD_WP) unchanged;
 * while reads of protected pages raise nothing, and once a page is
 * unprotected (mode 0) writes to it succeed without a signal.
 *
 * Every access runs in a probe thread that catches SIGBUS with
 * sigsetjmp/siglongjmp, so a kernel that queues a message instead (and
 * blocks the writer) is detected by a timeout, not a hang.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"

#define PAGES		4
#define PROBE_WAIT_MS	3000
#define QUIET_MS	200
#define STORE_OFFSET	0x123	/* where in a page the probe writes */

/* One access by a thread of its own; what it saw. */
struct probe {
	pthread_t thread;
	volatile char *addr;
	bool write;
	char val;		/* stored, or read back */
	volatile int done;
	bool sigbus;
	void *fault_addr;	/* si_addr of the SIGBUS */
	int fault_code;		/* its si_code */
	pid_t tid;		/* the probe thread */
	pid_t sig_tid;		/* the thread the handler ran in */
};

static __thread sigjmp_buf probe_env;
static __thread struct probe *probe_self;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	struct probe *p = probe_self;

	(void)sig;
	(void)uc;
	if (!p)
		_exit(4);	/* a SIGBUS outside any probe: unrecoverable */
	p->sigbus = true;
	p->fault_addr = si->si_addr;
	p->fault_code = si->si_code;
	p->sig_tid = gettid();
	siglongjmp(probe_env, 1);
}

static void *probe_main(void *arg)
{
	struct probe *p = arg;

	p->tid = gettid();
	probe_self = p;
	if (!sigsetjmp(probe_env, 1)) {
		if (p->write)
			*p->addr = p->val;
		else
			p->val = *p->addr;
	}
	probe_self = NULL;
	__atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static bool probe_wait(struct probe *p, int timeout_ms)
{
	return joined_within(p->thread, &p->done, timeout_ms);
}

static char pattern(int i, size_t off)
{
	return (char)(0x29 * (i + 1) + off % 239);
}

/* A uffd with UFFD_FEATURE_SIGBUS over PAGES protected, patterned pages. */
static bool area_setup(struct pat_area *a)
{
	uint64_t features = UFFD_FEATURE_SIGBUS | UFFD_FEATURE_PAGEFAULT_FLAG_WP;
	int err;

	if (!pat_area_map(a, PAGES, pattern, false))
		return false;
	a->uffd = uffd_open(features, NULL);
	if (a->uffd < 0)
		return because("uffd_open(SIGBUS|PAGEFAULT_FLAG_WP): %s",
			       strerror(-a->uffd));
	err = uffd_register(a->uffd, a->base, a->len, UFFDIO_REGISTER_MODE_WP,
			    NULL);
	if (err)
		return because("UFFDIO_REGISTER(WP): %s", strerror(-err));
	err = uffd_wp(a->uffd, a->base, a->len, UFFDIO_WRITEPROTECT_MODE_WP);
	if (err)
		return because("UFFDIO_WRITEPROTECT(MODE_WP): %s", strerror(-err));
	if (pages_with(a->base, a->len, PM_UFFD_WP) != PAGES)
		return because("only %zu of %d pages have PM_UFFD_WP",
			       pages_with(a->base, a->len, PM_UFFD_WP), PAGES);
	return true;
}

/*
 * Run one access at ADDR in a probe thread.  A probe that blocks (the
 * kernel queued a message instead of raising SIGBUS) is released by
 * unprotecting and waking the area; false then.
 */
static bool probe_run(struct pat_area *a, struct probe *p, char *addr, bool write,
		      char val)
{
	memset(p, 0, sizeof(*p));
	p->addr = addr;
	p->write = write;
	p->val = val;
	if (pthread_create(&p->thread, NULL, probe_main, p))
		return because("pthread_create failed");
	if (probe_wait(p, PROBE_WAIT_MS))
		return true;
	because("the %s at %p blocked for %d ms instead of completing or "
		"raising SIGBUS", write ? "write" : "read", (void *)addr,
		PROBE_WAIT_MS);
	uffd_wp(a->uffd, a->base, a->len, 0);
	uffd_wake(a->uffd, a->base, a->len);
	if (!probe_wait(p, PROBE_WAIT_MS))
		a->stuck = true;
	return false;
}

static bool page_unchanged(struct pat_area *a, int i)
{
	for (size_t off = 0; off < (size_t)page_size(); off++)
		if (pat_area_page(a, i)[off] != pattern(i, off))
			return because("page %d byte %zu is %#x, want %#x", i,
				       off, (unsigned char)pat_area_page(a, i)[off],
				       (unsigned char)pattern(i, off));
	return true;
}

/* Write every protected page; each must raise SIGBUS in the writer. */
static bool writes_raise_sigbus(struct pat_area *a)
{
	for (int i = 0; i < PAGES; i++) {
		char *addr = pat_area_page(a, i) + STORE_OFFSET;
		uintptr_t page = (uintptr_t)pat_area_page(a, i);
		struct probe p;

		if (!probe_run(a, &p, addr, true, 'X'))
			return false;
		if (!p.sigbus)
			return because("the write to page %d completed without "
				       "SIGBUS", i);
		if ((uintptr_t)p.fault_addr < page ||
		    (uintptr_t)p.fault_addr >= page + page_size())
			return because("page %d: si_addr %p outside the page %p",
				       i, p.fault_addr, (void *)page);
		if (p.sig_tid != p.tid)
			return because("SIGBUS ran in thread %d, the writer is %d",
				       p.sig_tid, p.tid);
		if (i == 0 && (uintptr_t)p.fault_addr != (uintptr_t)addr)
			tap_diag("si_addr %p, store at %p (si_code %d)",
				 p.fault_addr, (void *)addr, p.fault_code);
	}
	return true;
}

static bool no_message(struct pat_area *a)
{
	return expect_quiet(a->uffd, QUIET_MS, "");
}

static bool data_and_protection_kept(struct pat_area *a)
{
	for (int i = 0; i < PAGES; i++)
		if (!page_unchanged(a, i))
			return false;
	if (pages_with(a->base, a->len, PM_UFFD_WP) != PAGES)
		return because("only %zu of %d pages still have PM_UFFD_WP",
			       pages_with(a->base, a->len, PM_UFFD_WP), PAGES);
	return true;
}

static bool reads_raise_nothing(struct pat_area *a)
{
	for (int i = 0; i < PAGES; i++) {
		struct probe p;

		if (!probe_run(a, &p, pat_area_page(a, i) + STORE_OFFSET, false, 0))
			return false;
		if (p.sigbus)
			return because("reading page %d raised SIGBUS", i);
		if (p.val != pattern(i, STORE_OFFSET))
			return because("reading page %d gave %#x", i,
				       (unsigned char)p.val);
	}
	return no_message(a);
}

static bool unprotected_write_lands(struct pat_area *a)
{
	char *addr = pat_area_page(a, 2) + STORE_OFFSET;
	struct probe p;
	int err;

	err = uffd_wp(a->uffd, pat_area_page(a, 2), page_size(), 0);
	if (err)
		return because("UFFDIO_WRITEPROTECT(0): %s", strerror(-err));
	if (!probe_run(a, &p, addr, true, 'U'))
		return false;
	if (p.sigbus)
		return because("writing the unprotected page raised SIGBUS");
	if (*addr != 'U')
		return because("the write did not land: %#x",
			       (unsigned char)*addr);
	if (page_wp(pat_area_page(a, 1)) != true || page_wp(pat_area_page(a, 3)) != true)
		return because("unprotecting page 2 unprotected a neighbour");
	return no_message(a);
}

/* Cases 1-3: one run of writes gives the evidence for all three. */
static void case_protected_writes(void)
{
	struct pat_area a;
	bool raised = area_setup(&a) && writes_raise_sigbus(&a);

	tap_check(raised, "sigbus-write-raises-sigbus-in-writer", "%s", why);
	if (!raised)
		because("not checked: the writes did not raise SIGBUS");
	tap_check(raised && no_message(&a), "sigbus-no-message-queued", "%s",
		  why);
	tap_check(raised && data_and_protection_kept(&a),
		  "sigbus-data-and-protection-unchanged", "%s", why);
	pat_area_teardown(&a);
}

static void case_reads(void)
{
	struct pat_area a;
	bool ok = area_setup(&a) && reads_raise_nothing(&a);

	tap_check(ok, "sigbus-reads-raise-nothing", "%s", why);
	pat_area_teardown(&a);
}

static void case_unprotected_write(void)
{
	struct pat_area a;
	bool ok = area_setup(&a) && unprotected_write_lands(&a);

	tap_check(ok, "sigbus-unprotected-write-succeeds", "%s", why);
	pat_area_teardown(&a);
}

int main(void)
{
	struct sigaction sa = { .sa_sigaction = on_sigbus,
				.sa_flags = SA_SIGINFO };

	watchdog(60);
	tap_plan(5);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
	case_protected_writes();
	case_reads();
	case_unprotected_write();
	return tap_done();
}
