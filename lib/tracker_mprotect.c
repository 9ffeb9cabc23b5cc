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
 *
 * The program's own mprotect() (munmap(), mmap()) on tracked memory.
 * The library sets only two protections in a region: its own (P) and P
 * without PROT_WRITE (RO); a page is RO unless its bit in FAULTED is set
 * (or a claim is between its mprotect() and its bit).  The handler asks
 * the kernel (PROCMAP_QUERY, one ioctl) for the protection at the fault:
 * anything else than P or RO (PROT_NONE, say) is the program's: the
 * region becomes STALE and the fault goes to the previous handler or the
 * default action, as without the library.  Every gather compares the
 * regions' mappings with the same rule, and also finds pages RO whose bit
 * is set (made writable by us, read-only again by the program) and pages
 * writable without a bit (the program made them writable: their writes
 * raised no fault); a claim in flight is told apart by waiting for the
 * claims that began before the comparison (CLAIMING, by the parity of
 * CLAIM_EPOCH).  The handler cannot tell "RO with the bit set" from a
 * gather racing with it, so until the next gather a write there is taken
 * as a tracked one.
 * A stale region is never touched again (not protected, not restored),
 * every page of it is reported by every collect, and the collect that
 * finds it returns -ESTALE.  For "RO on a page whose bit is set" to be
 * the program's alone, a gather makes pages read-only again only after
 * the claims in flight when it took their bits have ended (it takes the
 * bits again then), a claim on a page already writable leaves the bit
 * alone, a claim whose unprotect overlapped a gather's last take and
 * protect does it again (unprotect()), and a gather that finds such a
 * page asks again once the claims in flight have ended.  A program's PROT_READ over pages the library holds
 * read-only changes nothing the kernel shows (mprotect() with the same
 * flags is a no-op): that one is not seen.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/ioctl.h>
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
/* /proc/self/maps for PROCMAP_QUERY, opened by install(), and the process
 * it describes (a child of fork() inherits the parent's). */
static int maps_fd = -1;
static pid_t maps_pid;
static atomic_bool query_broken;

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

static int prot_of(uint64_t vma_flags)
{
	return (vma_flags & PROCMAP_QUERY_VMA_READABLE ? PROT_READ : 0) |
	       (vma_flags & PROCMAP_QUERY_VMA_WRITABLE ? PROT_WRITE : 0) |
	       (vma_flags & PROCMAP_QUERY_VMA_EXECUTABLE ? PROT_EXEC : 0);
}

/*
 * The mapping at or after ADDR: its start, end and protection; -ENOENT
 * when there is none, -ENOTTY when the kernel cannot tell (before 6.11)
 * or this is not the process the descriptor describes.
 * Async-signal-safe.
 */
static int vma_query(uintptr_t addr, uintptr_t *start, uintptr_t *end,
		     int *prot)
{
	struct procmap_query q;

	if (maps_fd < 0 || atomic_load(&query_broken) || getpid() != maps_pid)
		return -ENOTTY;
	memset(&q, 0, sizeof(q));
	q.size = sizeof(q);
	q.query_flags = PROCMAP_QUERY_COVERING_OR_NEXT_VMA;
	q.query_addr = addr;
	if (ioctl(maps_fd, PROCMAP_QUERY, &q)) {
		if (errno == ENOENT)
			return -ENOENT;
		if (errno == ENOTTY || errno == EINVAL)
			atomic_store(&query_broken, true);
		return -ENOTTY;
	}
	*start = q.vma_start;
	*end = q.vma_end;
	*prot = prot_of(q.vma_flags);
	return 0;
}

/* The same from /proc/self/maps (where PROCMAP_QUERY is missing; not in
 * the handler): 0, -ENOENT, or -errno of reading it. */
static int maps_vma_at(uintptr_t addr, uintptr_t *start, uintptr_t *end,
		       int *prot)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char perms[8], line[512];
	uintptr_t lo, hi;
	int err = -ENOENT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 ||
		    hi <= addr)
			continue;
		*start = lo;
		*end = hi;
		*prot = (perms[0] == 'r' ? PROT_READ : 0) |
			(perms[1] == 'w' ? PROT_WRITE : 0) |
			(perms[2] == 'x' ? PROT_EXEC : 0);
		err = 0;
		break;
	}
	fclose(f);
	return err;
}

static int vma_at(uintptr_t addr, uintptr_t *start, uintptr_t *end,
		  int *prot)
{
	int err = vma_query(addr, start, end, prot);

	return err == -ENOTTY ? maps_vma_at(addr, start, end, prot) : err;
}

/* A claim of T's begins (async-signal-safe): counted under the epoch's
 * parity it saw, checked after counting (see the top). */
static unsigned int claim_enter(struct uffdwp_tracker *t)
{
	for (;;) {
		unsigned int e = atomic_load(&t->claim_epoch);

		atomic_fetch_add(&t->claiming[e & 1], 1);
		if (atomic_load(&t->claim_epoch) == e)
			return e & 1;
		atomic_fetch_sub(&t->claiming[e & 1], 1);
	}
}

/* Every claim of T's that began before this call has ended. */
static void claims_wait(struct uffdwp_tracker *t)
{
	unsigned int e = atomic_fetch_add(&t->claim_epoch, 1) & 1;

	while (atomic_load(&t->claiming[e]))
		sched_yield();
}

/*
 * Make the page at ADDR (index IDX, region REG) writable and set its bit
 * (async-signal-safe).  A gather that takes the bits and then makes pages
 * read-only again may overlap: another thread's claim on the same page
 * that began after the gather's epoch flip and set its bit before the
 * gather's last take puts the page into the gather's set, while this
 * claim, which asked the protection before that claim's unprotect, makes
 * it writable and sets its bit only after the gather protected it: the
 * page would stay read-only with its bit set, which the next gather takes
 * for the program's own mprotect() (the region stale, the next write
 * killing the process).  So the unprotect is redone until no gather's
 * take-and-protect (PROTECT_SEQ odd, or changed) overlapped it: the page
 * is then writable with its bit set, or was taken by a gather after.
 */
static void unprotect(struct uffdwp_tracker *t, uintptr_t addr, long reg,
		      long idx)
{
	size_t psz = uw_page_size();
	int p = t->prot[reg], ro = p & ~PROT_WRITE, prot, q;
	/* In a child of fork() no gather runs: its copy of the sequence
	 * may be odd for ever. */
	bool child = uw_tracker_foreign(t);
	uintptr_t vs, ve;

	for (bool again = false;; again = true) {
		unsigned int s0 = atomic_load(&t->protect_seq);

		if ((s0 & 1) && !child) {
			sched_yield();
			continue;
		}
		/* Asked again before a redo: the program may have changed
		 * the page meanwhile (the next check sees it). */
		if (again) {
			q = vma_query(addr, &vs, &ve, &prot);
			if (q == -ENOENT ||
			    (!q && (vs > addr || (prot != p && prot != ro))))
				return;
		}
		if (mprotect((void *)addr, psz, p) == 0) {
			uw_bit_set(t->faulted, (size_t)idx);
		} else if (mprotect(t->rs.r[reg].addr, t->rs.r[reg].len,
				    p) == 0) {
			/*
			 * Out of mappings (each writable page of a read-only
			 * region is a mapping of its own, up to
			 * vm.max_map_count): the whole region becomes
			 * writable again, one mapping, and all its pages
			 * dirty.
			 */
			for (size_t i = 0; i < t->rs.r[reg].len / psz; i++)
				uw_bit_set(t->faulted, t->rs.first[reg] + i);
		} else {
			return;
		}
		/* The bit before the sequence, as the gather orders its
		 * increment before its take (weakly ordered CPUs). */
		atomic_thread_fence(memory_order_seq_cst);
		if (child || atomic_load(&t->protect_seq) == s0)
			return;
	}
}

/*
 * T's fault at ADDR in region REG (async-signal-safe).  False when the
 * fault is not the tracker's: the program changed the protection there
 * (the region is stale from now on) or the region is stale already.
 */
static bool claim(struct uffdwp_tracker *t, uintptr_t addr, long reg)
{
	int p = t->prot[reg], ro = p & ~PROT_WRITE, prot = 0, q;
	uintptr_t vs = 0, ve = 0;
	unsigned int ep = 0;
	bool mp = t->backend == UFFDWP_BACKEND_MPROTECT, ok = true;
	long idx = uw_page_index(&t->rs, addr);

	if (atomic_load(&t->stale[reg]))
		return false;
	if (mp)
		ep = claim_enter(t);
	q = vma_query(addr, &vs, &ve, &prot);
	if (q == -ENOENT || (!q && (vs > addr ||
				    (prot != p && prot != ro)))) {
		/* Not mapped any more, or not a protection of ours. */
		atomic_store(&t->stale[reg], true);
		ok = false;
	} else if (!mp) {
		/* Soft-dirty: read and clear in progress: wait for it. */
		while (atomic_load(&t->hold))
			futex_wait(&t->hold, 1);
	} else if (!q && prot == p) {
		/* Writable already: another thread's claim (whose bit
		 * follows), or the program's (the next gather finds it). */
	} else {
		unprotect(t, addr, reg, idx);
	}
	if (mp)
		atomic_fetch_sub(&t->claiming[ep], 1);
	return ok;
}

/*
 * Other threads' stacks.  The handler runs on the stack of the thread that
 * faults: a thread whose stack is read-only cannot even be sent the
 * signal, and the process dies.  Their stacks cannot be listed, so before
 * a tracker takes PROT_WRITE away, every other thread that does not block
 * SIGSEGV is asked for its stack pointer: a SIGSEGV queued to it with
 * SI_QUEUE and ROLL_MAGIC (the handler stores the address of one of its
 * locals in its slot and returns); the mapping that holds it is the
 * thread's stack.  A thread that blocks SIGSEGV would die of any fault in
 * the regions anyway.
 */
#define ROLL_MAX	256
static struct {
	atomic_int tid;
	_Atomic uintptr_t sp;
} roll[ROLL_MAX];
static char roll_magic;

static bool roll_answer(const siginfo_t *si)
{
	volatile char here = 0;
	int tid;

	if (si->si_code != SI_QUEUE || si->si_value.sival_ptr != &roll_magic ||
	    si->si_pid != getpid())
		return false;
	tid = (int)syscall(SYS_gettid);
	for (int i = 0; i < ROLL_MAX; i++)
		if (atomic_load(&roll[i].tid) == tid)
			atomic_store(&roll[i].sp, (uintptr_t)&here);
	return true;
}

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	uintptr_t addr = (uintptr_t)si->si_addr & ~(uintptr_t)(uw_page_size() - 1);
	unsigned long ended = atomic_load(&prot_ended);
	int saved_errno = errno;

	if (roll_answer(si)) {
		errno = saved_errno;
		return;
	}
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
		if (!claim(t, addr, reg)) {
			/* The program's own protection: its fault, as
			 * without the library. */
			atomic_fetch_sub(&inflight, 1);
			chain(sig, si, uc);
			errno = saved_errno;
			return;
		}
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

	if (maps_fd < 0 || maps_pid != getpid()) {
		int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);

		/* Without it (no /proc) the protections go unchecked. */
		if (maps_fd >= 0)
			close(maps_fd);
		maps_fd = fd;
		maps_pid = getpid();
	}
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
		if (!atomic_load(&t->stale[i]) &&
		    mprotect(t->rs.r[i].addr, t->rs.r[i].len, t->prot[i] & ~mask))
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

/* Whether thread TID blocks SIGSEGV (its SigBlk in /proc). */
static bool blocks_segv(int tid)
{
	char path[64], line[128];
	unsigned long long mask = 0;
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%d/status", tid);
	f = fopen(path, "re");
	if (!f)
		return true;	/* gone */
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "SigBlk: %llx", &mask) == 1;
	fclose(f);
	return !found || (mask >> (SIGSEGV - 1) & 1);
}

/*
 * Whether a region of T holds another thread's stack (see roll[] above):
 * true, false, or false when it cannot tell (no /proc).  Under
 * table_lock, with the handler installed, before any protection.
 */
static bool regions_hold_other_stacks(const struct uffdwp_tracker *t)
{
	DIR *d = opendir("/proc/self/task");
	int self = (int)syscall(SYS_gettid), n = 0;
	struct dirent *e;
	bool hit = false;

	if (!d)
		return false;
	while ((e = readdir(d)) && n < ROLL_MAX) {
		int tid = atoi(e->d_name);
		siginfo_t si;

		if (tid <= 0 || tid == self || blocks_segv(tid))
			continue;
		atomic_store(&roll[n].sp, 0);
		atomic_store(&roll[n].tid, tid);
		memset(&si, 0, sizeof(si));
		si.si_signo = SIGSEGV;
		si.si_code = SI_QUEUE;
		si.si_pid = getpid();
		si.si_uid = getuid();
		si.si_value.sival_ptr = &roll_magic;
		if (syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, SIGSEGV, &si))
			atomic_store(&roll[n].tid, 0);
		n++;
	}
	closedir(d);
	/* Answers come as soon as each thread runs (up to 1 s: a thread
	 * that exited meanwhile never answers). */
	for (int tries = 0; tries < 1000; tries++) {
		bool all = true;

		for (int i = 0; i < n; i++)
			all &= !atomic_load(&roll[i].tid) ||
			       atomic_load(&roll[i].sp) != 0;
		if (all)
			break;
		usleep(1000);
	}
	for (int i = 0; i < n; i++) {
		uintptr_t sp = atomic_load(&roll[i].sp), vs, ve;
		int prot;

		if (sp && !vma_at(sp, &vs, &ve, &prot) && vs <= sp)
			for (size_t r = 0; r < t->rs.nr && !hit; r++) {
				uintptr_t a = (uintptr_t)t->rs.r[r].addr;

				hit = a < ve && vs < a + t->rs.r[r].len;
			}
		atomic_store(&roll[i].tid, 0);
	}
	return hit;
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
	/* Written by the handler: the library's own memory. */
	t->stale_len = t->rs.nr * (sizeof(*t->stale) + sizeof(*t->stale_told));
	t->stale = uw_alloc(t->stale_len);
	if (!t->prot || !t->stale)
		return -ENOMEM;
	t->stale_told = (bool *)(t->stale + t->rs.nr);
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
	/* Another thread's stack: its faults could not be delivered. */
	if (!err && regions_hold_other_stacks(t)) {
		atomic_store(&table[t->slot], NULL);
		t->slot = -1;
		err = -EDEADLK;
	}
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
	uw_free(t->stale, t->stale_len);
	t->stale = NULL;
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
	uw_free(t->stale, t->stale_len);
	t->stale = NULL;
}

/* Page I at A read-only with its bit set, asked again after the claims
 * in flight have ended (the bit and the mapping): the program's. */
static bool ro_with_bit(struct uffdwp_tracker *t, uintptr_t a, size_t i)
{
	int ro = t->prot[region_of(t, a)] & ~PROT_WRITE, prot;
	uintptr_t vs, ve;

	if (atomic_load(&query_broken) || vma_query(a, &vs, &ve, &prot) ||
	    vs > a || prot != ro)
		return false;
	claims_wait(t);
	return uw_bit_test(t->faulted, i) && !vma_query(a, &vs, &ve, &prot) &&
	       vs <= a && prot == ro;
}

/*
 * Compare T's regions' mappings with the protections T set (see the top):
 * a region with a hole, another protection, or (mprotect) a page read-only
 * whose bit is set or writable without a claim becomes stale.  Every page
 * of a stale region is marked pending.  Returns -ESTALE when a region is
 * stale that no collect has told about yet, else 0.  Collector only.
 */
int uw_segv_check(struct uffdwp_tracker *t)
{
	bool mp = t->backend == UFFDWP_BACKEND_MPROTECT, suspects = false;
	size_t psz = uw_page_size();
	int ret = 0;

	for (size_t r = 0; r < t->rs.nr; r++) {
		uintptr_t a = (uintptr_t)t->rs.r[r].addr;
		uintptr_t end = a + t->rs.r[r].len;
		int p = t->prot[r], ro = p & ~PROT_WRITE;
		bool bad = false;

		while (a < end && !bad && !atomic_load(&t->stale[r])) {
			uintptr_t vs, ve;
			int prot, err = vma_at(a, &vs, &ve, &prot);

			if (err && err != -ENOENT)
				return 0;	/* cannot tell here */
			if (err || vs > a ||
			    (prot != p && !(mp && prot == ro))) {
				bad = true;
				break;
			}
			if (ve > end)
				ve = end;
			for (; mp && a < ve; a += psz) {
				size_t i = (size_t)uw_page_index(&t->rs, a);
				bool bit = uw_bit_test(t->faulted, i);

				/* The bit was set after the claim made the
				 * page writable; only the program makes it
				 * read-only while the bit stays (a gather
				 * takes the bits first), once the claims in
				 * flight have ended: one that overlapped the
				 * last gather makes the page writable again
				 * (unprotect()).  The mapping asked again
				 * after the bit was read, and after those
				 * claims. */
				if (prot == ro && bit && ro_with_bit(t, a, i)) {
					bad = true;
					break;
				}
				if (prot == p && !bit) {
					uw_bit_set(t->rearm, i);
					suspects = true;
				}
			}
			a = ve;
		}
		if (bad)
			atomic_store(&t->stale[r], true);
	}
	/* Writable without a bit: a claim between its mprotect() and its
	 * bit, or the program's.  Once the claims that began before the
	 * comparison have ended, only the program's are left. */
	if (suspects)
		claims_wait(t);
	for (size_t w = 0; suspects && w < t->words; w++) {
		uint64_t v = atomic_exchange(&t->rearm[w], 0) &
			     ~atomic_load(&t->faulted[w]);

		while (v) {
			size_t i = w * 64 + (size_t)__builtin_ctzll(v);
			long r = region_of(t, uw_page_addr(&t->rs, i));

			atomic_store(&t->stale[r], true);
			v &= v - 1;
		}
	}
	for (size_t r = 0; r < t->rs.nr; r++) {
		if (!atomic_load(&t->stale[r]))
			continue;
		uw_mark_range(t, (uintptr_t)t->rs.r[r].addr, t->rs.r[r].len);
		if (!t->stale_told[r])
			ret = -ESTALE;
		t->stale_told[r] = true;
	}
	return ret;
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
	t->rearm = uw_alloc(t->words * 8);
	if (!t->faulted || !t->rearm)
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

/* Take the bits of FAULTED into REARM and PENDING. */
static void take_faulted(struct uffdwp_tracker *t)
{
	for (size_t w = 0; w < t->words; w++) {
		uint64_t bits = atomic_exchange(&t->faulted[w], 0);

		if (!bits)
			continue;
		atomic_fetch_or(&t->rearm[w], bits);
		atomic_fetch_or(&t->pending[w], bits);
	}
}

/* Block every signal but the synchronous ones; the old mask in *OLD. */
static void async_signals_block(sigset_t *old)
{
	static const int sync_sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE,
					  SIGTRAP, SIGSYS };
	sigset_t set;

	sigfillset(&set);
	for (size_t i = 0; i < sizeof(sync_sigs) / sizeof(sync_sigs[0]); i++)
		sigdelset(&set, sync_sigs[i]);
	pthread_sigmask(SIG_BLOCK, &set, old);
}

static int mp_gather(struct uffdwp_tracker *t)
{
	sigset_t old_mask;
	size_t psz = uw_page_size();
	int err = 0, stale = uw_segv_check(t);

	/* The pages written since the last gather, and (after the claims in
	 * flight meanwhile have ended) those their claims made writable. */
	take_faulted(t);
	claims_wait(t);
	/*
	 * Claims from here until the pages are read-only redo theirs, and
	 * wait while the sequence is odd: a handler of the program's that
	 * ran on this thread meanwhile and wrote a tracked page would wait
	 * for this very thread.  Asynchronous signals wait instead.
	 */
	async_signals_block(&old_mask);
	atomic_fetch_add(&t->protect_seq, 1);
	take_faulted(t);
	for (size_t w = 0; w < t->words && !err; w++) {
		uint64_t bits = atomic_exchange(&t->rearm[w], 0);

		if (!bits)
			continue;
		atomic_fetch_add(&prot_begun, 1);
		/* Protect runs of consecutive pages with one call each. */
		while (bits && !err) {
			int b = __builtin_ctzll(bits), e = b;

			while (e < 64 && (bits >> e) & 1)
				e++;
			for (int k = b; k < e && !err;) {
				size_t idx = w * 64 + k;
				uintptr_t a = uw_page_addr(&t->rs, idx);
				long reg = region_of(t, a);
				int run = 1;

				/* stay inside one region */
				while (k + run < e &&
				       uw_page_addr(&t->rs, idx + run) ==
				       a + run * psz)
					run++;
				/* A stale region is the program's. */
				if (!atomic_load(&t->stale[reg]) &&
				    mprotect((void *)a, run * psz,
					     t->prot[reg] & ~PROT_WRITE)) {
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
	atomic_fetch_add(&t->protect_seq, 1);
	pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
	if (err) {
		/* Not protected: the next gather tries again. */
		for (size_t w = 0; w < t->words; w++)
			atomic_fetch_or(&t->faulted[w],
					atomic_exchange(&t->rearm[w], 0));
		return err;
	}
	/* After the protect: a discard from now on is seen next time. */
	err = uw_pagemap_pass(t, false, false);
	return err ? err : stale;
}

static void mp_stop(struct uffdwp_tracker *t)
{
	uw_segv_detach(t, true);
	uw_free(t->faulted, t->words * 8);
	uw_free(t->rearm, t->words * 8);
	t->faulted = t->rearm = NULL;
}

const struct uw_tracker_ops uw_mprotect_ops = {
	.start = mp_start,
	.gather = mp_gather,
	.stop = mp_stop,
};
