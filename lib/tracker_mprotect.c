// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * tracker_mprotect.c: the last-resort backend.  The regions are made
 * read-only; the first write to a page raises SIGSEGV, whose handler makes
 * the page writable again and records it.  Collect takes the recorded set
 * and makes those pages read-only again.
 *
 * Each region keeps the protection it had (PROT_EXEC of a JIT arena, say):
 * tracking removes only PROT_WRITE, and the end of tracking puts back what
 * the region had.  A region must have one protection throughout.
 *
 * Ordering: the handler unprotects, then records; collect takes the record,
 * then protects.  A write between the two in collect lands on a page that
 * is reported now (read it after collect); a write after the protect faults
 * and is reported next time.  Nothing is missed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define SLOTS 16

static _Atomic(struct uffdwp_tracker *) table[SLOTS];
static atomic_int inflight;
static struct sigaction old_action;
static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;
static bool installed;

static void chain(int sig, siginfo_t *si, void *uc)
{
	if (old_action.sa_flags & SA_SIGINFO) {
		old_action.sa_sigaction(sig, si, uc);
	} else if (old_action.sa_handler != SIG_DFL &&
		   old_action.sa_handler != SIG_IGN) {
		old_action.sa_handler(sig);
	} else {
		/* Default: return with the default action in place; the
		 * access faults again and the process dies as it would. */
		signal(SIGSEGV, SIG_DFL);
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

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	uintptr_t addr = (uintptr_t)si->si_addr & ~(uintptr_t)(uw_page_size() - 1);

	atomic_fetch_add(&inflight, 1);
	for (int i = 0; si->si_code == SEGV_ACCERR && i < SLOTS; i++) {
		struct uffdwp_tracker *t = atomic_load(&table[i]);
		long idx, reg;

		if (!t)
			continue;
		idx = uw_page_index(&t->rs, addr);
		reg = region_of(t, addr);
		if (idx < 0 || reg < 0)
			continue;
		if (mprotect((void *)addr, uw_page_size(), t->prot[reg]) == 0) {
			uw_bit_set(t->faulted, (size_t)idx);
			atomic_fetch_sub(&inflight, 1);
			return;
		}
	}
	atomic_fetch_sub(&inflight, 1);
	chain(sig, si, uc);
}

static int install(void)
{
	struct sigaction sa;
	int err = 0;

	pthread_mutex_lock(&install_lock);
	if (!installed) {
		memset(&sa, 0, sizeof(sa));
		sa.sa_sigaction = on_segv;
		sa.sa_flags = SA_SIGINFO | SA_RESTART;
		sigemptyset(&sa.sa_mask);
		if (sigaction(SIGSEGV, &sa, &old_action))
			err = -errno;
		else
			installed = true;
	}
	pthread_mutex_unlock(&install_lock);
	return err;
}

/* Every region with its own protection, less MASK. */
static int protect_regions(struct uffdwp_tracker *t, int mask)
{
	for (size_t i = 0; i < t->rs.nr; i++)
		if (mprotect(t->rs.r[i].addr, t->rs.r[i].len, t->prot[i] & ~mask))
			return -errno;
	return 0;
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

static int mp_start(struct uffdwp_tracker *t)
{
	int err = install();

	if (err)
		return err;
	t->faulted = uw_alloc(t->words * 8);
	t->prot = calloc(t->rs.nr, sizeof(*t->prot));
	if (!t->faulted || !t->prot)
		return -ENOMEM;
	for (size_t i = 0; i < t->rs.nr; i++) {
		err = range_prot((uintptr_t)t->rs.r[i].addr, t->rs.r[i].len,
				 &t->prot[i]);
		if (err)
			return err;
	}
	for (int i = 0; i < SLOTS; i++) {
		struct uffdwp_tracker *none = NULL;

		if (atomic_compare_exchange_strong(&table[i], &none, t)) {
			t->slot = i;
			break;
		}
	}
	if (t->slot < 0)
		return -ENOSPC;
	return protect_regions(t, PROT_WRITE);
}

static int mp_gather(struct uffdwp_tracker *t)
{
	size_t psz = uw_page_size();

	for (size_t w = 0; w < t->words; w++) {
		uint64_t bits = atomic_exchange(&t->faulted[w], 0);

		if (!bits)
			continue;
		atomic_fetch_or(&t->pending[w], bits);
		/* Protect runs of consecutive pages with one call each. */
		while (bits) {
			int b = __builtin_ctzll(bits), e = b;

			while (e < 64 && (bits >> e) & 1)
				e++;
			bits &= e == 64 ? 0 : ~0ULL << e;
			for (int k = b; k < e;) {
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
					     ~PROT_WRITE))
					return -errno;
				k += run;
			}
		}
	}
	return 0;
}

static void mp_stop(struct uffdwp_tracker *t)
{
	if (t->slot >= 0) {
		atomic_store(&table[t->slot], NULL);
		/* Let a handler that already saw T finish with it. */
		while (atomic_load(&inflight))
			sched_yield();
		protect_regions(t, 0);	/* as they were */
	}
	t->slot = -1;
	uw_free(t->faulted, t->words * 8);
	t->faulted = NULL;
	free(t->prot);
	t->prot = NULL;
}

const struct uw_tracker_ops uw_mprotect_ops = {
	.start = mp_start,
	.gather = mp_gather,
	.stop = mp_stop,
};
