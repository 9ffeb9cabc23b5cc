// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * tracker_mprotect.c: the last-resort backend, and the SIGSEGV handler it
 * shares with the soft-dirty backend.  The regions are made read-only; the
 * first write to a page raises SIGSEGV, whose handler makes the page
 * writable again and records it.  Collect takes the recorded set and makes
 * those pages read-only again, then reads the pagemap to find the pages
 * the program discarded (tracker.c).
 *
 * Each region keeps the protection it had (PROT_EXEC of a JIT arena, say):
 * tracking removes only PROT_WRITE, and the end of tracking puts back what
 * the region had.  A region must be writable, with one protection
 * throughout, and no two trackers of this file may share a page.
 *
 * Ordering: the handler unprotects, then records; collect takes the record,
 * then protects.  A write between the two in collect lands on a page that
 * is reported now (read it after collect); a write after the protect faults
 * and is reported next time.  Nothing is missed.
 *
 * Faults the handler cannot attribute.  A thread can fault on a page that
 * was read-only and have its handler run only after the page has become
 * writable again and its tracker has left the table (a tracker freed while
 * writers run).  So a fault nobody claims is retried once; a second fault
 * of the same thread at the same page with no protection change by the
 * library in between is a real one, and goes to the handler that was there
 * before (or the default action: the process dies as it would without the
 * library).  The same rule stops a fault that making the page writable does
 * not cure (an instruction fetch from a tracked page) from looping.
 * "No protection change in between": every change the library makes is
 * bracketed by prot_begun++ before and prot_ended++ after; a handler notes
 * prot_ended on entry, and a later fault is a repeat only if prot_begun
 * still equals that note (every change that began had ended before).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "snapshot.h"

#define SLOTS 16

static _Atomic(struct uffdwp_tracker *) table[SLOTS];
static atomic_int inflight;
static atomic_ulong prot_begun, prot_ended;
static struct sigaction old_action;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

/* This thread's last fault (see above). */
static __thread struct {
	uintptr_t addr;
	unsigned long ended;
	bool valid;
} last __attribute__((tls_model("initial-exec")));

static void chain(int sig, siginfo_t *si, void *uc)
{
	if (old_action.sa_flags & SA_SIGINFO) {
		old_action.sa_sigaction(sig, si, uc);
	} else if (old_action.sa_handler != SIG_DFL &&
		   old_action.sa_handler != SIG_IGN) {
		old_action.sa_handler(sig);
	} else {
		/* Default (a fault is never ignored): return with the default
		 * action in place; the access faults again and the process
		 * dies as it would have without the library.  A SIGSEGV sent
		 * by kill() is not repeated: send it again (it arrives once
		 * this handler returns). */
		signal(SIGSEGV, SIG_DFL);
		if (si->si_code <= 0)
			raise(sig);
	}
}

/* The region of T that holds ADDR (async-signal-safe), or -1. */
static long region_of(const struct uffdwp_tracker *t, uintptr_t addr)
{
	for (size_t i = 0; i < t->rs.nr; i++) {
		uintptr_t a = (uintptr_t)t->rs.r[i].addr;

		if (addr >= a && addr < a + t->rs.r[i].len)
			return (long)i;
	}
	return -1;
}

static void futex_wait(atomic_int *w, int val)
{
	syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(atomic_int *w)
{
	syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* T's fault at ADDR in region REG (async-signal-safe). */
static void claim(struct uffdwp_tracker *t, uintptr_t addr, long reg)
{
	size_t psz = uw_page_size();

	if (t->backend == UFFDWP_BACKEND_SOFT_DIRTY) {
		/* Read and clear in progress: wait for it to end. */
		while (atomic_load(&t->hold))
			futex_wait(&t->hold, 1);
		return;
	}
	if (mprotect((void *)addr, psz, t->prot[reg]) == 0) {
		uw_bit_set(t->faulted, (size_t)uw_page_index(&t->rs, addr));
		return;
	}
	/*
	 * Out of mappings (each writable page of a read-only region is a
	 * mapping of its own, up to vm.max_map_count): the whole region
	 * becomes writable again, one mapping, and all its pages dirty.
	 */
	if (mprotect(t->rs.r[reg].addr, t->rs.r[reg].len, t->prot[reg]) == 0)
		for (size_t i = 0; i < t->rs.r[reg].len / psz; i++)
			uw_bit_set(t->faulted, t->rs.first[reg] + i);
}

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	uintptr_t addr = (uintptr_t)si->si_addr & ~(uintptr_t)(uw_page_size() - 1);
	unsigned long ended = atomic_load(&prot_ended);
	int saved_errno = errno;

	if (si->si_code != SEGV_ACCERR ||
	    (last.valid && last.addr == addr &&
	     atomic_load(&prot_begun) == last.ended)) {
		chain(sig, si, uc);
		errno = saved_errno;
		return;
	}
	last.addr = addr;
	last.ended = ended;
	last.valid = true;
	atomic_fetch_add(&inflight, 1);
	for (int i = 0; i < SLOTS; i++) {
		struct uffdwp_tracker *t = atomic_load(&table[i]);
		long reg;

		if (!t || (reg = region_of(t, addr)) < 0)
			continue;
		claim(t, addr, reg);
		break;
	}
	/* Claimed or not, the access is retried (see the top). */
	atomic_fetch_sub(&inflight, 1);
	errno = saved_errno;
}

/* Ours in place, the one before kept for chain().  Again if the program
 * has put its own in since (its faults outside trackers go to it). */
static int install(void)
{
	struct sigaction sa, cur;

	if (sigaction(SIGSEGV, NULL, &cur))
		return -errno;
	if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_segv)
		return 0;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	old_action = cur;
	if (sigaction(SIGSEGV, &sa, NULL))
		return -errno;
	return 0;
}

/* Every region with its own protection, less MASK, bracketed for the
 * handler's repeat rule. */
static int protect_regions(struct uffdwp_tracker *t, int mask)
{
	int err = 0;

	atomic_fetch_add(&prot_begun, 1);
	for (size_t i = 0; i < t->rs.nr && !err; i++)
		if (mprotect(t->rs.r[i].addr, t->rs.r[i].len, t->prot[i] & ~mask))
			err = -errno;
	atomic_fetch_add(&prot_ended, 1);
	return err;
}

/*
 * The protection of [A, A + LEN) from /proc/self/maps into *PROT: 0, or
 * -EINVAL if the range mixes protections, -ENOMEM if part of it is not
 * mapped (as mprotect(2) says), -errno if maps cannot be read.
 */
static int range_prot(uintptr_t a, size_t len, int *prot)
{
	FILE *f = fopen("/proc/self/maps", "re");
	uintptr_t next = a, lo, hi;
	char perms[8], line[512];
	int p = -1;

	if (!f)
		return -errno;
	while (next < a + len && fgets(line, sizeof(line), f)) {
		int q;

		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 ||
		    hi <= next)
			continue;
		if (lo > next)
			break;	/* a hole */
		q = (perms[0] == 'r' ? PROT_READ : 0) |
		    (perms[1] == 'w' ? PROT_WRITE : 0) |
		    (perms[2] == 'x' ? PROT_EXEC : 0);
		if (p >= 0 && q != p) {
			fclose(f);
			return -EINVAL;
		}
		p = q;
		next = hi;
	}
	fclose(f);
	if (next < a + len)
		return -ENOMEM;
	*prot = p;
	return 0;
}

static bool overlaps(const struct uffdwp_tracker *a,
		     const struct uffdwp_tracker *b)
{
	for (size_t i = 0; i < a->rs.nr; i++)
		for (size_t j = 0; j < b->rs.nr; j++) {
			uintptr_t x = (uintptr_t)a->rs.r[i].addr;
			uintptr_t y = (uintptr_t)b->rs.r[j].addr;

			if (x < y + b->rs.r[j].len && y < x + a->rs.r[i].len)
				return true;
		}
	return false;
}

bool uw_segv_overlaps(const struct uffdwp_tracker *t)
{
	bool hit = false;

	pthread_mutex_lock(&table_lock);
	for (int i = 0; i < SLOTS && !hit; i++) {
		struct uffdwp_tracker *o = atomic_load(&table[i]);

		hit = o && overlaps(o, t);
	}
	pthread_mutex_unlock(&table_lock);
	return hit;
}

int uw_segv_attach(struct uffdwp_tracker *t, bool protect)
{
	int err;

	/* The handler runs on the faulting thread's stack and writes its
	 * thread-local storage: with those read-only the signal could not
	 * even be delivered, and the process would die. */
	if (uw_regions_hold_own_thread(&t->rs))
		return -EDEADLK;
	t->prot = calloc(t->rs.nr, sizeof(*t->prot));
	if (!t->prot)
		return -ENOMEM;
	pthread_mutex_lock(&table_lock);
	err = install();
	for (int i = 0; i < SLOTS && !err; i++) {
		struct uffdwp_tracker *o = atomic_load(&table[i]);

		if (o && overlaps(o, t))
			err = -EBUSY;
	}
	for (size_t i = 0; i < t->rs.nr && !err; i++) {
		err = range_prot((uintptr_t)t->rs.r[i].addr, t->rs.r[i].len,
				 &t->prot[i]);
		/* Not writable: a write would fault anyway, and the handler
		 * could not make it succeed. */
		if (!err && !(t->prot[i] & PROT_WRITE))
			err = -EINVAL;
	}
	for (int i = 0; i < SLOTS && !err && t->slot < 0; i++)
		if (!atomic_load(&table[i])) {
			atomic_store(&table[i], t);
			t->slot = i;
		}
	if (!err && t->slot < 0)
		err = -ENOSPC;
	pthread_mutex_unlock(&table_lock);
	if (!err && protect)
		err = protect_regions(t, PROT_WRITE);
	return err;
}

void uw_segv_forget(struct uffdwp_tracker *t)
{
	struct uffdwp_tracker *me = t;

	/* The child's memory only; no lock (a thread of the parent's may
	 * have held it at the fork) and no wait for handlers (theirs). */
	if (t->backend == UFFDWP_BACKEND_MPROTECT)
		protect_regions(t, 0);
	atomic_compare_exchange_strong(&table[t->slot], &me, NULL);
	t->slot = -1;
	free(t->prot);
	t->prot = NULL;
}

void uw_segv_detach(struct uffdwp_tracker *t, bool restore)
{
	if (t->slot >= 0) {
		/* Writable first, then out of the table: a writer faulting
		 * meanwhile is claimed, or finds its page writable on the
		 * retry. */
		if (restore)
			protect_regions(t, 0);	/* as they were */
		pthread_mutex_lock(&table_lock);
		atomic_store(&table[t->slot], NULL);
		pthread_mutex_unlock(&table_lock);
		/* Let a handler that already saw T finish with it. */
		while (atomic_load(&inflight))
			sched_yield();
	}
	t->slot = -1;
	free(t->prot);
	t->prot = NULL;
}

int uw_segv_hold(struct uffdwp_tracker *t)
{
	atomic_store(&t->hold, 1);
	return protect_regions(t, PROT_WRITE);
}

int uw_segv_release(struct uffdwp_tracker *t)
{
	int err = protect_regions(t, 0);

	atomic_store(&t->hold, 0);
	futex_wake(&t->hold);
	return err;
}

static int mp_start(struct uffdwp_tracker *t)
{
	int err;

	t->faulted = uw_alloc(t->words * 8);
	if (!t->faulted)
		return -ENOMEM;
	/* The pages' state before the protect (the start of tracking): a
	 * discard from now on is seen by the first collect. */
	err = uw_pagemap_open(t);
	if (!err)
		err = uw_pagemap_pass(t, false, true);
	if (!err)
		err = uw_segv_attach(t, true);
	return err;
}

static int mp_gather(struct uffdwp_tracker *t)
{
	size_t psz = uw_page_size();
	int err = 0;

	for (size_t w = 0; w < t->words && !err; w++) {
		uint64_t bits = atomic_exchange(&t->faulted[w], 0);

		if (!bits)
			continue;
		atomic_fetch_or(&t->pending[w], bits);
		atomic_fetch_add(&prot_begun, 1);
		/* Protect runs of consecutive pages with one call each. */
		while (bits && !err) {
			int b = __builtin_ctzll(bits), e = b;

			while (e < 64 && (bits >> e) & 1)
				e++;
			for (int k = b; k < e && !err;) {
				size_t idx = w * 64 + k;
				uintptr_t a = uw_page_addr(&t->rs, idx);
				int run = 1;

				/* stay inside one region */
				while (k + run < e &&
				       uw_page_addr(&t->rs, idx + run) ==
				       a + run * psz)
					run++;
				if (mprotect((void *)a, run * psz,
					     t->prot[region_of(t, a)] &
					     ~PROT_WRITE)) {
					/* Still writable: keep them for the
					 * next collect to protect. */
					err = -errno;
					atomic_fetch_or(&t->faulted[w],
						bits & (~0ULL << k));
					break;
				}
				k += run;
			}
			bits &= e == 64 ? 0 : ~0ULL << e;
		}
		atomic_fetch_add(&prot_ended, 1);
	}
	if (err)
		return err;
	/* After the protect: a discard from now on is seen next time. */
	return uw_pagemap_pass(t, false, false);
}

static void mp_stop(struct uffdwp_tracker *t)
{
	uw_segv_detach(t, true);
	uw_free(t->faulted, t->words * 8);
	t->faulted = NULL;
}

const struct uw_tracker_ops uw_mprotect_ops = {
	.start = mp_start,
	.gather = mp_gather,
	.stop = mp_stop,
};
