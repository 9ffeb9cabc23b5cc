// SPDX-License-Identifier: GPL-2.0
/*
 * ring-stress: a differential stress test of the write-log ring's promise.
 *
 * A consumer that harvests the ring (entries up to the producer, then
 * UFFDIO_RING_RESET(consumer = producer), then the pages' contents; after
 * an overflow a reset with DISCARD | CLEAR_OVERFLOW and a PAGEMAP_SCAN
 * round with PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC) never misses a
 * change to a tracked page.
 *
 * The arena has four parts, each registered for async WP on one ring
 * context and write-protected: 4 KiB anonymous pages (anon-4k), PMD-mapped
 * THPs (thp), private hugetlb pages (hugetlb, when huge pages are
 * reserved) and a shared memfd (shmem).  Writer threads store unique
 * sequence values at random places; a disruptor thread does, at random,
 * operations that change a page or its protection without a write fault
 * (see ops[] below); the main thread is the consumer and keeps a shadow
 * copy of the arena from its harvests alone, with a small ring so that it
 * overflows and the PAGEMAP_SCAN recovery runs.
 *
 * Every epoch (a few seconds) writers and disruptor park, the consumer
 * harvests until the ring is empty, and then the shadow must equal memory
 * page by page, and every page must still be write-protected (or marked),
 * since a page left writable after a full harvest loses its next write.
 * A mismatch prints the seed, the part, the page, the values, the pagemap
 * entry and the last disruptor operations on the page; the page is then
 * resynchronised (protected again, copied) so one loss is reported once.
 *
 *   ring-stress [--seed N] [--seconds S] [--ops a,b,...|none] [--ring ENTRIES]
 *               [--writers N] [--epoch-ms MS]
 *
 * --ops restricts the disruptor to the operations named (to isolate one
 * that fails); "none" leaves writers and consumer alone.
 *
 * One TAP case per part plus "overall" (ioctls that failed, operations that
 * never succeeded, threads that did not park, entries outside the arena).
 *
 * Notes on the model (what the consumer may know besides the ring):
 *  - mremap: a window of the anon part is moved away and back by the
 *    disruptor, with writers kept out by a lock.  mremap sets the ring's
 *    overflow flag and, without UFFD_FEATURE_EVENT_REMAP, drops the
 *    window from the context, so the disruptor registers and protects it
 *    again and tells the consumer to copy the window afresh (the consumer
 *    knows its own mremap; the pages were protected before the copy).
 *  - set-mode: UFFDIO_SET_MODE to sync and back.  Nobody reads the fault
 *    messages: writers that hit a protected page in the sync window wait
 *    until async mode comes back, which wakes them and resolves (and logs)
 *    their writes.
 *  - fork: the child writes its copy of the private parts only; writes to
 *    the shared part through another process are out of the ring's reach
 *    by design.
 *  - move-out / move-back: UFFDIO_MOVE of arena pages to a scratch area
 *    registered with the same context, then (move-back) into the hole
 *    again.  Moving foreign content into the arena is the caller's own
 *    change (like UFFDIO_COPY) and is not done.
 *  - ksm-merge: the anon part is MADV_MERGEABLE and ksmd runs (scanning
 *    every 20 ms, smart scan off); the disruptor fills a few adjacent
 *    pages with one pattern of its own (writes the ring logs) so that
 *    ksmd merges them, protected or not, and later writes break the
 *    sharing.  ksmd's settings are put back at the end (run=2 unmerges).
 *    The case ksm-merged passes once ksmd shared a page during the run,
 *    and fails when it shared none in a run that tried the op at least 5
 *    times (the op would then disrupt nothing); a shorter run skips.
 */
#define _GNU_SOURCE
#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MADV_REMOVE
#define MADV_REMOVE 9
#endif
#ifndef MADV_COLD
#define MADV_COLD 20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#ifndef MREMAP_FIXED
#define MREMAP_FIXED 2
#endif
#ifndef UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
#endif

#define PAGE		4096UL
#define ANON_PAGES	512		/* 2 MiB of 4 KiB pages */
#define WIN_PAGES	64		/* the mremap window: anon's last pages */
#define THP_CHUNKS	4
#define HUGE_PAGES	4
#define SHMEM_PAGES	512
#define HIST		4		/* disruptor ops remembered per page */
#define MAX_REPORT	8		/* mismatches printed per epoch */

/* ---- arena ---- */

enum { P_ANON, P_THP, P_HUGETLB, P_SHMEM, NPARTS };
static const char *const part_name[NPARTS] = {
	"anon-4k", "thp", "hugetlb", "shmem",
};

struct part {
	char *mem, *shadow;
	size_t len, npages;	/* npages: 4 KiB pages */
	size_t unit;		/* protection unit: 4 KiB or 2 MiB */
	size_t base;		/* first global page number */
	int fd;
	bool on;
	char why[160];		/* why it is off */
	unsigned long stale, unprot;	/* pages found wrong, over all epochs */
	char first[700];	/* the first problem, for the TAP line */
};
static struct part parts[NPARTS];
static size_t total_pages;

static struct uring_view R;
static char *scratch;		/* UFFDIO_MOVE destination, 2 x 2 MiB */
#define SCRATCH_LEN (2 * HPAGE_SIZE)

/* Writers keep out of the mremap window while it moves. */
static pthread_rwlock_t win_lock;
static int win_dirty;		/* the consumer must copy the window */

/* ---- operations ---- */

enum op {
	OP_DONTNEED_4K, OP_DONTNEED_THP, OP_DONTNEED_HUGETLB, OP_FREE_PAGEOUT,
	OP_PAGEOUT, OP_COLD, OP_MIGRATE, OP_FORK, OP_MREMAP, OP_MOVE_OUT,
	OP_MOVE_BACK, OP_PUNCH, OP_REMOVE, OP_MPROTECT, OP_SET_MODE,
	OP_COLLAPSE, OP_KSM, NOPS
};
static const char *const op_name[NOPS] = {
	"dontneed-4k", "dontneed-thp", "dontneed-hugetlb", "free-pageout",
	"pageout", "cold", "migrate", "fork", "mremap", "move-out",
	"move-back", "punch-hole", "madv-remove", "mprotect", "set-mode",
	"collapse", "ksm-merge",
};
static bool op_on[NOPS];
static char op_off_why[NOPS][80];
static unsigned long op_tries[NOPS], op_ok[NOPS];
static int op_last_err[NOPS];

struct hist {
	uint8_t n;
	uint8_t op[HIST];
	uint32_t ms[HIST];
};
static struct hist *hist;

/* ---- run state ---- */

static unsigned long long seed;
static int seconds = 20, nwriters = 3, epoch_ms = 3000;
static uint64_t ring_entries = 128;
static long long t0;
static volatile int stop, pause_req;
/*
 * Each epoch writers write only the "hot" half of every part (groups of
 * HOT_GROUP pages, or single hugetlb pages, chosen by the epoch's salt);
 * the disruptor works everywhere.  A change the ring misses on a cold page
 * is not hidden by a later logged write before the epoch's check.
 */
#define HOT_GROUP 16
static volatile unsigned int hot_salt;
static int parked;
static bool two_nodes, have_move, have_set_mode, have_ksm;
/* ksmd's settings before the run (-1: not read), and what it shared */
static long ksm_run0 = -1, ksm_sleep0 = -1, ksm_scan0 = -1, ksm_smart0 = -1;
static long ksm_sharing_max;

static unsigned long n_writes[16], n_faulted[16];
static unsigned long harvests, entries_seen, scans, scan_pages, foreign;
static unsigned long reset_errors, reset_eagain, park_timeouts, sync_windows;
static unsigned long scan_errors, scans_deferred;
static int last_reset_err, last_scan_err;
static bool scan_pending;
static unsigned long long foreign_first;

static uint64_t rnd(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return (x * 0x2545F4914F6CDD1DULL) >> 16;	/* the good bits */
}

static uint32_t ms_now(void)
{
	return (uint32_t)(now_ms() - t0);
}

static void note(size_t gpage, size_t n, enum op op)
{
	uint32_t ms = ms_now();

	for (size_t i = gpage; i < gpage + n && i < total_pages; i++) {
		struct hist *h = &hist[i];

		h->op[h->n % HIST] = (uint8_t)op;
		h->ms[h->n % HIST] = ms;
		h->n++;
	}
}

static size_t gpage_of(int p, const char *addr)
{
	return parts[p].base + (size_t)(addr - parts[p].mem) / PAGE;
}

/* The part that holds ADDR, or -1. */
static int part_of(unsigned long addr)
{
	for (int p = 0; p < NPARTS; p++)
		if (parts[p].on && addr >= (unsigned long)parts[p].mem &&
		    addr < (unsigned long)parts[p].mem + parts[p].len)
			return p;
	return -1;
}

/* ---- writers ---- */

static __thread sigjmp_buf wjb;
static __thread volatile sig_atomic_t in_write;

static void on_fault(int sig, siginfo_t *si, void *uc)
{
	(void)si;
	(void)uc;
	if (in_write) {
		in_write = 0;
		siglongjmp(wjb, 1);
	}
	signal(sig, SIG_DFL);	/* not ours: die of it on return */
}

/* Store V at W; false if it faulted (SIGSEGV/SIGBUS) and was skipped. */
static __attribute__((noinline)) bool guarded_store(volatile uint64_t *w,
						    uint64_t v)
{
	if (sigsetjmp(wjb, 0))
		return false;
	in_write = 1;
	*w = v;
	in_write = 0;
	return true;
}

static void park(void)
{
	if (!pause_req)
		return;
	__atomic_add_fetch(&parked, 1, __ATOMIC_SEQ_CST);
	while (pause_req && !stop)
		usleep(1000);
	__atomic_sub_fetch(&parked, 1, __ATOMIC_SEQ_CST);
}

static bool hot(int p, size_t idx)
{
	size_t g = parts[p].unit == PAGE ? idx / HOT_GROUP
					 : idx * PAGE / parts[p].unit;

	return ((g * 2654435761u) >> 7 ^ hot_salt) & 1;
}

static bool in_window(int p, size_t idx)
{
	return p == P_ANON && idx >= ANON_PAGES - WIN_PAGES;
}

static int random_part(uint64_t *s)
{
	int on[NPARTS], n = 0;

	for (int p = 0; p < NPARTS; p++)
		if (parts[p].on)
			on[n++] = p;
	return on[rnd(s) % n];
}

static void *writer_main(void *arg)
{
	long id = (long)arg;
	uint64_t s = seed * 0x9E3779B97F4A7C15ULL + (uint64_t)id * 7919 + 1;
	uint64_t seq = 0, burst = 0;

	while (!stop) {
		int p;
		size_t idx, slot;
		volatile uint64_t *w;
		bool locked;

		park();
		/* Bursts and pauses: under TCG, writers that never sleep
		 * starve the disruptor and the consumer. */
		if (!burst--) {
			usleep(rnd(&s) % 1000);
			burst = rnd(&s) % 256;
		}
		do {
			p = random_part(&s);
			idx = rnd(&s) % parts[p].npages;
		} while (!hot(p, idx));
		slot = rnd(&s) % (PAGE / 8);
		w = (volatile uint64_t *)(parts[p].mem + idx * PAGE) + slot;
		locked = in_window(p, idx);
		if (locked)
			pthread_rwlock_rdlock(&win_lock);
		/* writer id in the top byte: every value is unique */
		if (guarded_store(w, ((uint64_t)(id + 1) << 56) | ++seq))
			n_writes[id]++;
		else
			n_faulted[id]++;	/* PROT_READ for a moment */
		if (locked)
			pthread_rwlock_unlock(&win_lock);
	}
	return NULL;
}

/* ---- disruptor ---- */

/* A random range of N (1..MAXN) protection units in one of the parts
 * allowed by MASK; false if none is on. */
static bool pick(uint64_t *s, unsigned int mask, size_t maxn, int *pp,
		 char **addr, size_t *len)
{
	int on[NPARTS], n = 0, p;
	size_t units, first, cnt;

	for (p = 0; p < NPARTS; p++)
		if (parts[p].on && (mask & (1u << p)))
			on[n++] = p;
	if (!n)
		return false;
	p = on[rnd(s) % n];
	units = parts[p].len / parts[p].unit;
	first = rnd(s) % units;
	cnt = 1 + rnd(s) % maxn;
	if (cnt > units - first)
		cnt = units - first;
	*pp = p;
	*addr = parts[p].mem + first * parts[p].unit;
	*len = cnt * parts[p].unit;
	return true;
}

#define M(p) (1u << (p))

static int do_madvise(enum op op, int p, char *a, size_t len, int advice)
{
	if (madvise(a, len, advice))
		return -errno;
	note(gpage_of(p, a), len / PAGE, op);
	return 0;
}

static int op_migrate(uint64_t *s)
{
	void *pages[16];
	int nodes[16], status[16], p, i, n;
	char *a;
	size_t len;

	if (!pick(s, M(P_ANON) | M(P_THP) | M(P_HUGETLB) | M(P_SHMEM), 16,
		  &p, &a, &len))
		return -ENOENT;
	n = (int)(len / parts[p].unit);
	if (n > 16)
		n = 16;
	for (i = 0; i < n; i++)
		pages[i] = a + i * parts[p].unit;
	/* Where are they?  Then send each to the other node. */
	if (sys_move_pages(n, pages, NULL, status, 0) < 0)
		return -errno;
	for (i = 0; i < n; i++)
		nodes[i] = status[i] == 1 ? 0 : 1;
	if (sys_move_pages(n, pages, nodes, status, MPOL_MF_MOVE) < 0)
		return -errno;
	for (i = 0; i < n; i++)
		note(gpage_of(p, pages[i]), parts[p].unit / PAGE, OP_MIGRATE);
	return 0;
}

static int op_fork(uint64_t *s)
{
	uint64_t cs = rnd(s);
	pid_t pid;
	int st;

	pid = fork();
	if (pid < 0)
		return -errno;
	if (!pid) {
		/* The child writes its copy of the private parts and exits. */
		for (int i = 0; i < 200; i++) {
			int p = (int)(rnd(&cs) % 3);	/* anon, thp, hugetlb */

			if (!parts[p].on)
				continue;
			parts[p].mem[(rnd(&cs) % parts[p].npages) * PAGE +
				     rnd(&cs) % PAGE] = (char)0xc5;
		}
		_exit(0);
	}
	if (waitpid(pid, &st, 0) < 0)
		return -errno;
	return WIFEXITED(st) && !WEXITSTATUS(st) ? 0 : -ECHILD;
}

static int op_mremap(void)
{
	char *win = parts[P_ANON].mem + (ANON_PAGES - WIN_PAGES) * PAGE;
	size_t len = WIN_PAGES * PAGE;
	int err = 0;
	char *tmp;

	/* A place to move it to (the same size never moves by itself). */
	tmp = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (tmp == MAP_FAILED)
		return -errno;
	pthread_rwlock_wrlock(&win_lock);
	if (mremap(win, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, tmp) ==
	    MAP_FAILED) {
		err = -errno;
		munmap(tmp, len);
		goto out;
	}
	if (mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, win) ==
	    MAP_FAILED) {
		err = -errno;
		fprintf(stderr, "ring-stress: mremap back failed: %s\n",
			strerror(errno));
		abort();	/* the arena has a hole: nothing more to test */
	}
	/* Without EVENT_REMAP the window left the context: take it back. */
	err = uffd_register(R.uffd, win, len, UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		err = uffd_wp(R.uffd, win, len, UFFDIO_WRITEPROTECT_MODE_WP);
	__atomic_store_n(&win_dirty, 1, __ATOMIC_RELEASE);
	note(gpage_of(P_ANON, win), WIN_PAGES, OP_MREMAP);
out:
	pthread_rwlock_unlock(&win_lock);
	return err;
}

/* UFFDIO_MOVE an arena page (or a whole THP) out, then maybe back. */
static int op_move(uint64_t *s, bool back)
{
	int p = rnd(s) & 1 ? P_THP : P_ANON;
	size_t len = PAGE, idx;
	char *a, *dst;
	int err;

	if (!parts[p].on)
		p = P_ANON;
	if (p == P_THP && rnd(s) % 4 == 0)
		len = HPAGE_SIZE;
	idx = rnd(s) % (parts[p].len / len);
	a = parts[p].mem + idx * len;
	dst = scratch + (len == PAGE ? (rnd(s) % 512) * PAGE : HPAGE_SIZE);
	madvise(scratch, SCRATCH_LEN, MADV_DONTNEED);
	err = uffd_move(R.uffd, dst, a, len, UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES);
	if (err)
		return err;
	note(gpage_of(p, a), len / PAGE, back ? OP_MOVE_BACK : OP_MOVE_OUT);
	if (back) {
		usleep(rnd(s) % 500);
		/* EEXIST: a writer filled the hole meanwhile; fine. */
		err = uffd_move(R.uffd, a, dst, len,
				UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES);
		if (err && err != -EEXIST)
			return err;
	}
	madvise(scratch, SCRATCH_LEN, MADV_DONTNEED);
	return 0;
}

static int op_set_mode(uint64_t *s)
{
	int err = uffd_set_async(R.uffd, false);

	if (err)
		return err;
	sync_windows++;
	usleep(1000 + rnd(s) % 20000);
	err = uffd_set_async(R.uffd, true);
	if (err) {
		fprintf(stderr, "ring-stress: UFFDIO_SET_MODE back to async failed: %s\n",
			strerror(-err));
		abort();	/* writers would block for ever */
	}
	return 0;
}

/* 2 to 9 adjacent anon pages filled with one pattern of this op's own,
 * for ksmd to merge. */
static int op_ksm(uint64_t *s)
{
	static uint64_t gen;
	long sharing = ksm_get("pages_sharing");
	uint64_t v = 0xD15CULL << 48 | ++gen;
	char *a, *end;
	size_t len;
	int p;

	if (sharing > ksm_sharing_max)
		ksm_sharing_max = sharing;
	if (!pick(s, M(P_ANON), 8, &p, &a, &len))
		return -ENOENT;
	end = parts[p].mem + parts[p].len;
	if (a + len < end)
		len += PAGE;
	else
		a -= PAGE;
	for (size_t i = 0; i < len / 8; i++)
		((volatile uint64_t *)a)[i] = v;
	note(gpage_of(p, a), len / PAGE, OP_KSM);
	return 0;
}

static int do_op(enum op op, uint64_t *s)
{
	int p, err;
	char *a;
	size_t len;

	switch (op) {
	case OP_DONTNEED_4K:
		if (!pick(s, M(P_ANON) | M(P_THP) | M(P_SHMEM), 8, &p, &a, &len))
			return -ENOENT;
		return do_madvise(op, p, a, len, MADV_DONTNEED);
	case OP_DONTNEED_THP:
		p = P_THP;
		a = parts[p].mem + (rnd(s) % THP_CHUNKS) * HPAGE_SIZE;
		return do_madvise(op, p, a, HPAGE_SIZE, MADV_DONTNEED);
	case OP_DONTNEED_HUGETLB:
		if (!pick(s, M(P_HUGETLB), 1, &p, &a, &len))
			return -ENOENT;
		return do_madvise(op, p, a, len, MADV_DONTNEED);
	case OP_FREE_PAGEOUT:
		if (!pick(s, M(P_ANON) | M(P_THP), 16, &p, &a, &len))
			return -ENOENT;
		if (p == P_THP && rnd(s) % 4 == 0) {
			a = parts[p].mem + (rnd(s) % THP_CHUNKS) * HPAGE_SIZE;
			len = HPAGE_SIZE;
		}
		err = do_madvise(op, p, a, len, MADV_FREE);
		if (!err) {
			usleep(rnd(s) % 1000);
			err = do_madvise(op, p, a, len, MADV_PAGEOUT);
		}
		return err;
	case OP_PAGEOUT:
		if (!pick(s, M(P_ANON) | M(P_THP) | M(P_SHMEM), 32, &p, &a, &len))
			return -ENOENT;
		return do_madvise(op, p, a, len, MADV_PAGEOUT);
	case OP_COLD:
		if (!pick(s, M(P_ANON) | M(P_THP) | M(P_SHMEM), 64, &p, &a, &len))
			return -ENOENT;
		return do_madvise(op, p, a, len, MADV_COLD);
	case OP_MIGRATE:
		return op_migrate(s);
	case OP_FORK:
		return op_fork(s);
	case OP_MREMAP:
		return op_mremap();
	case OP_MOVE_OUT:
		return op_move(s, false);
	case OP_MOVE_BACK:
		return op_move(s, true);
	case OP_PUNCH:
		if (!pick(s, M(P_SHMEM), 4, &p, &a, &len))
			return -ENOENT;
		if (fallocate(parts[p].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      a - parts[p].mem, len))
			return -errno;
		note(gpage_of(p, a), len / PAGE, op);
		return 0;
	case OP_REMOVE:
		if (!pick(s, M(P_SHMEM), 4, &p, &a, &len))
			return -ENOENT;
		return do_madvise(op, p, a, len, MADV_REMOVE);
	case OP_MPROTECT:
		if (!pick(s, M(P_ANON) | M(P_THP) | M(P_HUGETLB) | M(P_SHMEM),
			  16, &p, &a, &len))
			return -ENOENT;
		if (mprotect(a, len, PROT_READ))
			return -errno;
		note(gpage_of(p, a), len / PAGE, op);
		usleep(rnd(s) % 2000);
		if (mprotect(a, len, PROT_READ | PROT_WRITE)) {
			fprintf(stderr, "ring-stress: mprotect back failed: %s\n",
				strerror(errno));
			abort();
		}
		return 0;
	case OP_SET_MODE:
		return op_set_mode(s);
	case OP_KSM:
		return op_ksm(s);
	case OP_COLLAPSE:
		p = P_THP;
		a = parts[p].mem + (rnd(s) % THP_CHUNKS) * HPAGE_SIZE;
		return do_madvise(op, p, a, HPAGE_SIZE, MADV_COLLAPSE);
	default:
		return -EINVAL;
	}
}

/* Errors that say "not now" rather than "broken". */
static bool benign(int err)
{
	return err == -EAGAIN || err == -EBUSY || err == -EEXIST ||
	       err == -ENOMEM || err == -ENOENT;
}

static void *disruptor_main(void *arg)
{
	uint64_t s = seed * 0xD1B54A32D192ED03ULL + 12345;
	enum op list[NOPS];
	int n = 0;

	(void)arg;
	for (int o = 0; o < NOPS; o++)
		if (op_on[o])
			list[n++] = (enum op)o;
	while (!stop) {
		enum op op;
		int err;

		park();
		if (stop)
			break;
		if (!n) {		/* --ops with nothing this kernel has */
			usleep(1000);
			continue;
		}
		op = list[rnd(&s) % n];
		op_tries[op]++;
		err = do_op(op, &s);
		if (!err)
			op_ok[op]++;
		/* MADV_COLLAPSE refuses ranges with protected PTEs: it only
		 * succeeds on a chunk written all over since its last reset. */
		else if (!benign(err) && op != OP_COLLAPSE)
			op_last_err[op] = err;
		usleep(rnd(&s) % 500);
	}
	return NULL;
}

/* ---- consumer ---- */

static void copy_page_cb(unsigned long page, void *arg)
{
	int p = part_of(page);

	(void)arg;
	if (p >= 0)
		memcpy(parts[p].shadow + (page - (unsigned long)parts[p].mem),
		       (char *)page, PAGE);
}

/* Copy [a, a + len) of the arena (clipped to parts) into the shadow. */
static void copy_range(unsigned long a, unsigned long len)
{
	for (int p = 0; p < NPARTS; p++) {
		unsigned long lo = (unsigned long)parts[p].mem;
		unsigned long hi = lo + parts[p].len;
		unsigned long s = a < lo ? lo : a, e = a + len > hi ? hi : a + len;

		if (parts[p].on && s < e)
			memcpy(parts[p].shadow + (s - lo), (char *)s, e - s);
	}
}

static uint64_t *ebuf;

static void harvest(void)
{
	uint64_t prod = ring_producer(&R), n, i;
	int err;

	harvests++;
	if (ring_overflowed(&R)) {
		err = ring_reset(&R, prod, UFFDIO_RING_RESET_DISCARD |
				 UFFDIO_RING_RESET_CLEAR_OVERFLOW, NULL);
		if (err == -EAGAIN) {
			/* Part done, flag left set: scan anyway, again later. */
			R.consumer = ring_consumer(&R);
			reset_eagain++;
		} else if (err) {
			reset_errors++;
			last_reset_err = err;
			return;
		}
		scan_pending = true;
		pthread_rwlock_rdlock(&win_lock);
	} else {
		n = prod - R.consumer;
		for (i = 0; i < n; i++)
			ebuf[i] = ring_entry(&R, R.consumer + i);
		err = ring_reset(&R, prod, 0, NULL);
		if (err == -EAGAIN) {
			/* The entries above the kernel's consumer index stay in
			 * the ring; copying their pages now as well is harmless. */
			R.consumer = ring_consumer(&R);
			reset_eagain++;
		} else if (err) {
			reset_errors++;
			last_reset_err = err;
			return;
		}
		entries_seen += n;
		pthread_rwlock_rdlock(&win_lock);
		for (i = 0; i < n; i++) {
			unsigned long a = ebuf[i] & ~(PAGE - 1);
			unsigned long len = ebuf[i] & UFFD_RING_ENTRY_HUGE ?
					    HPAGE_SIZE : PAGE;

			if (part_of(a) < 0) {
				if (a - (unsigned long)scratch >= SCRATCH_LEN &&
				    !foreign++)
					foreign_first = ebuf[i];
				continue;
			}
			copy_range(a, len);
		}
	}
	/*
	 * The scan that follows a discarding reset.  While the disruptor has
	 * the context in sync mode PAGEMAP_SCAN refuses it (EPERM with
	 * PM_SCAN_CHECK_WPASYNC): the discarded pages stay writable and are
	 * scanned at the next harvest.
	 */
	if (scan_pending) {
		bool again = false;

		scans++;
		for (int p = 0; p < NPARTS; p++) {
			long got;

			if (!parts[p].on)
				continue;
			got = scan_written_reprotect(parts[p].mem, parts[p].len,
						     copy_page_cb, NULL);
			if (got == -EPERM) {
				again = true;
			} else if (got < 0) {
				scan_errors++;
				last_scan_err = (int)got;
			} else {
				scan_pages += got;
			}
		}
		scans_deferred += again;
		scan_pending = again;
	}
	if (__atomic_exchange_n(&win_dirty, 0, __ATOMIC_ACQ_REL))
		copy_range((unsigned long)parts[P_ANON].mem +
			   (ANON_PAGES - WIN_PAGES) * PAGE, WIN_PAGES * PAGE);
	pthread_rwlock_unlock(&win_lock);
}

static void describe_hist(size_t g, char *buf, size_t len)
{
	const struct hist *h = &hist[g];
	size_t off = 0;
	int k, first = h->n > HIST ? h->n - HIST : 0;

	buf[0] = 0;
	if (!h->n) {
		snprintf(buf, len, "no disruptor op on it");
		return;
	}
	for (k = first; k < h->n && off < len; k++)
		off += snprintf(buf + off, len - off, "%s%s@%ums",
				k > first ? ", " : "", op_name[h->op[k % HIST]],
				h->ms[k % HIST]);
}

/* With everything parked: harvest until the ring is empty, compare. */
static void quiet_check(int epoch)
{
	int reported = 0;

	for (int k = 0; k < 4; k++) {
		harvest();
		if (ring_producer(&R) == R.consumer && !ring_overflowed(&R) &&
		    !scan_pending)
			break;
	}
	for (int p = 0; p < NPARTS; p++) {
		struct part *pt = &parts[p];

		if (!pt->on)
			continue;
		for (size_t i = 0; i < pt->npages; i++) {
			char *m = pt->mem + i * PAGE, *sh = pt->shadow + i * PAGE;
			bool stale = memcmp(m, sh, PAGE) != 0;
			uint64_t pme = pagemap_entry(m);
			bool unprot = !(pme & PM_UFFD_WP);
			char h[200], line[700];
			char *u;

			if (!stale && !unprot)
				continue;
			describe_hist(pt->base + i, h, sizeof(h));
			if (stale) {
				long off = first_diff(m, sh, PAGE) & ~7L;
				uint64_t mv, sv;

				memcpy(&mv, m + off, 8);
				memcpy(&sv, sh + off, 8);
				pt->stale++;
				snprintf(line, sizeof(line),
					 "seed %llu epoch %d: %s page %zu (%p) changed without an entry: offset %ld memory %#llx (writer %d seq %llu) shadow %#llx; pagemap %#llx (%s%s%s); last ops: %s",
					 seed, epoch, part_name[p], i, (void *)m,
					 off, (unsigned long long)mv,
					 (int)(mv >> 56) - 1,
					 (unsigned long long)(mv & ((1ULL << 56) - 1)),
					 (unsigned long long)sv,
					 (unsigned long long)pme,
					 pme & PM_PRESENT ? "present" : "not present",
					 pme & PM_SWAP ? ",swap" : "",
					 pme & PM_UFFD_WP ? ",wp" : ",not wp", h);
			} else {
				pt->unprot++;
				snprintf(line, sizeof(line),
					 "seed %llu epoch %d: %s page %zu (%p) is not write-protected after a full harvest (pagemap %#llx, %s%s): its next write would not be logged; last ops: %s",
					 seed, epoch, part_name[p], i, (void *)m,
					 (unsigned long long)pme,
					 pme & PM_PRESENT ? "present" : "not present",
					 pme & PM_SWAP ? ",swap" : "", h);
			}
			if (!pt->first[0])
				snprintf(pt->first, sizeof(pt->first), "%s", line);
			if (reported++ < MAX_REPORT)
				tap_diag("%s", line);
			/* Resynchronise: protect the unit again, then copy it. */
			u = pt->mem + (i * PAGE / pt->unit) * pt->unit;
			uffd_wp(R.uffd, u, pt->unit, UFFDIO_WRITEPROTECT_MODE_WP);
			memcpy(pt->shadow + (u - pt->mem), u, pt->unit);
			/* one report per unit (a hugetlb page is 512 pages) */
			i = (size_t)(u - pt->mem + pt->unit) / PAGE - 1;
		}
	}
	if (reported > MAX_REPORT)
		tap_diag("epoch %d: %d more pages wrong (not printed)", epoch,
			 reported - MAX_REPORT);
}

/* ---- setup ---- */

static long hugepages_reserved(void)
{
	FILE *f = fopen("/proc/sys/vm/nr_hugepages", "r");
	long n = 0;

	if (f) {
		if (fscanf(f, "%ld", &n) != 1)
			n = 0;
		fclose(f);
	}
	return n;
}

static void setup_parts(void)
{
	struct part *pt;
	long hp;
	int p;

	pt = &parts[P_ANON];
	pt->len = ANON_PAGES * PAGE;
	pt->unit = PAGE;
	pt->mem = map_anon_aligned(pt->len, HPAGE_SIZE);
	if (pt->mem) {
		madvise(pt->mem, pt->len, MADV_NOHUGEPAGE);
		pt->on = true;
	}

	pt = &parts[P_THP];
	pt->len = THP_CHUNKS * HPAGE_SIZE;
	pt->unit = PAGE;
	pt->mem = map_anon_aligned(pt->len, HPAGE_SIZE);
	if (pt->mem) {
		long kb;

		madvise(pt->mem, pt->len, MADV_HUGEPAGE);
		fill_pattern(pt->mem, pt->len, (unsigned int)seed + 2);
		kb = smaps_field_kb(pt->mem, "AnonHugePages");
		if (kb < (long)(pt->len >> 10))
			snprintf(pt->why, sizeof(pt->why),
				 "no PMD-mapped THP for the part (AnonHugePages %ld kB of %zu)",
				 kb, pt->len >> 10);
		else
			pt->on = true;
	}

	pt = &parts[P_HUGETLB];
	pt->len = HUGE_PAGES * HPAGE_SIZE;
	pt->unit = HPAGE_SIZE;
	hp = hugepages_reserved();
	if (hp < 2 * HUGE_PAGES + 8) {
		snprintf(pt->why, sizeof(pt->why),
			 "%ld huge pages reserved (/proc/sys/vm/nr_hugepages), want %d",
			 hp, 2 * HUGE_PAGES + 8);
	} else {
		pt->mem = mmap(NULL, pt->len, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
		if (pt->mem == MAP_FAILED) {
			pt->mem = NULL;
			snprintf(pt->why, sizeof(pt->why), "MAP_HUGETLB: %s",
				 strerror(errno));
		} else {
			pt->on = true;
		}
	}

	pt = &parts[P_SHMEM];
	pt->len = SHMEM_PAGES * PAGE;
	pt->unit = PAGE;
	pt->fd = memfd_create("ring-stress", 0);
	if (pt->fd >= 0 && !ftruncate(pt->fd, pt->len)) {
		pt->mem = mmap(NULL, pt->len, PROT_READ | PROT_WRITE, MAP_SHARED,
			       pt->fd, 0);
		if (pt->mem == MAP_FAILED)
			pt->mem = NULL;
		else
			pt->on = true;
	}
	if (!pt->on)
		snprintf(pt->why, sizeof(pt->why), "memfd: %s", strerror(errno));

	for (p = 0; p < NPARTS; p++) {
		pt = &parts[p];
		pt->npages = pt->len / PAGE;
		pt->base = total_pages;
		total_pages += pt->npages;
		if (!pt->on)
			continue;
		if (p != P_THP)
			fill_pattern(pt->mem, pt->len, (unsigned int)seed + p);
		pt->shadow = malloc(pt->len);
		if (!pt->shadow)
			tap_bail("out of memory for the shadow");
	}
}

static void setup_ring(void)
{
	int err = ring_open(&R, ring_entries,
			    UFFD_FEATURE_MOVE | UFFD_FEATURE_WP_HUGETLBFS_SHMEM);

	have_move = !err;
	if (err)
		err = ring_open(&R, ring_entries, UFFD_FEATURE_WP_HUGETLBFS_SHMEM);
	if (err)
		tap_bail("ring_open(%llu entries): %s",
			 (unsigned long long)ring_entries, strerror(-err));
	for (int p = 0; p < NPARTS; p++) {
		struct part *pt = &parts[p];

		if (!pt->on)
			continue;
		err = uffd_register(R.uffd, pt->mem, pt->len,
				    UFFDIO_REGISTER_MODE_WP, NULL);
		if (!err)
			err = uffd_wp(R.uffd, pt->mem, pt->len,
				      UFFDIO_WRITEPROTECT_MODE_WP);
		if (err)
			tap_bail("register/protect %s: %s", part_name[p],
				 strerror(-err));
		memcpy(pt->shadow, pt->mem, pt->len);
	}
	scratch = map_anon_aligned(SCRATCH_LEN, HPAGE_SIZE);
	if (!scratch ||
	    uffd_register(R.uffd, scratch, SCRATCH_LEN, UFFDIO_REGISTER_MODE_WP,
			  NULL))
		have_move = false;
	ebuf = malloc(ring_entries * sizeof(*ebuf));
	hist = calloc(total_pages, sizeof(*hist));
	if (!ebuf || !hist)
		tap_bail("out of memory");
}

static void disable(enum op op, const char *why)
{
	if (!op_on[op])
		return;
	op_on[op] = false;
	snprintf(op_off_why[op], sizeof(op_off_why[op]), "%s", why);
}

/* The anon part mergeable and ksmd running; false (nothing changed that
 * matters) without KSM. */
static bool ksm_begin(void)
{
	int err;

	ksm_run0 = ksm_get("run");
	if (ksm_run0 < 0)
		return false;
	ksm_sleep0 = ksm_get("sleep_millisecs");
	ksm_scan0 = ksm_get("pages_to_scan");
	ksm_smart0 = ksm_get("smart_scan");
	if (madvise(parts[P_ANON].mem, parts[P_ANON].len, MADV_MERGEABLE))
		return false;
	/* smart scan would skip pages that did not merge at first */
	err = ksm_smart0 > 0 ? ksm_set("smart_scan", "0") : 0;
	if (!err)
		err = ksm_set("pages_to_scan", "1000");
	if (!err)
		err = ksm_set("sleep_millisecs", "20");
	if (!err)
		err = ksm_set("run", "1");
	return !err;
}

static void ksm_put_back(const char *name, long v)
{
	char val[32];

	snprintf(val, sizeof(val), "%ld", v);
	if (v >= 0 && ksm_set(name, val))
		tap_diag("ksm: putting back %s=%ld failed", name, v);
}

/* ksmd as it was (every page unmerged first). */
static void ksm_end(void)
{
	if (ksm_run0 < 0)
		return;
	if (ksm_set("run", "2"))
		tap_diag("ksm: run=2 (unmerge) failed");
	ksm_put_back("smart_scan", ksm_smart0);
	ksm_put_back("pages_to_scan", ksm_scan0);
	ksm_put_back("sleep_millisecs", ksm_sleep0);
	if (ksm_run0 != 0 && ksm_run0 != 2)
		ksm_put_back("run", ksm_run0);
}

static void setup_ops(const char *list)
{
	struct stat st;

	for (int o = 0; o < NOPS; o++)
		op_on[o] = !list;
	if (list) {
		char *dup = strdup(list), *save = NULL, *t;

		for (t = strtok_r(dup, ",", &save); t;
		     t = strtok_r(NULL, ",", &save)) {
			int o;

			if (!strcmp(t, "none"))	/* writers only */
				continue;
			for (o = 0; o < NOPS; o++)
				if (!strcmp(t, op_name[o]))
					break;
			if (o == NOPS) {
				fprintf(stderr, "ring-stress: unknown op '%s'; ops:", t);
				for (o = 0; o < NOPS; o++)
					fprintf(stderr, " %s", op_name[o]);
				fprintf(stderr, "\n");
				exit(2);
			}
			op_on[o] = true;
		}
		free(dup);
	}
	two_nodes = !stat("/sys/devices/system/node/node1", &st);
	have_set_mode = set_mode_supported();
	if (!two_nodes)
		disable(OP_MIGRATE, "one NUMA node");
	if (!have_move) {
		disable(OP_MOVE_OUT, "no UFFD_FEATURE_MOVE with the ring");
		disable(OP_MOVE_BACK, "no UFFD_FEATURE_MOVE with the ring");
	}
	if (!have_set_mode)
		disable(OP_SET_MODE, "no UFFDIO_SET_MODE");
	if (!parts[P_THP].on) {
		disable(OP_DONTNEED_THP, "no THP part");
		disable(OP_COLLAPSE, "no THP part");
	}
	if (!parts[P_HUGETLB].on)
		disable(OP_DONTNEED_HUGETLB, "no hugetlb part");
	if (!parts[P_SHMEM].on) {
		disable(OP_PUNCH, "no shmem part");
		disable(OP_REMOVE, "no shmem part");
	}
	if (op_on[OP_KSM] && !(have_ksm = ksm_begin()))
		disable(OP_KSM, "no KSM (/sys/kernel/mm/ksm)");
}

static void usage(void)
{
	fprintf(stderr, "usage: ring-stress [--seed N] [--seconds S] [--ops a,b,...] [--ring ENTRIES] [--writers N] [--epoch-ms MS]\nops:");
	for (int o = 0; o < NOPS; o++)
		fprintf(stderr, " %s", op_name[o]);
	fprintf(stderr, "\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *ops = NULL;
	pthread_t wt[16], dt;
	pthread_rwlockattr_t ra;
	struct sigaction sa;
	unsigned long writes = 0, faulted = 0;
	int epoch, i, bad_ops = 0;
	char buf[1024];
	size_t off;
	bool ok;

	seed = (unsigned long long)time(NULL);
	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			usage();
		if (!strcmp(a, "--seed"))
			seed = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--seconds"))
			seconds = atoi(v);
		else if (!strcmp(a, "--ops"))
			ops = v;
		else if (!strcmp(a, "--ring"))
			ring_entries = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--writers"))
			nwriters = atoi(v);
		else if (!strcmp(a, "--epoch-ms"))
			epoch_ms = atoi(v);
		else
			usage();
		i++;
	}
	if (seconds < 1 || nwriters < 1 || nwriters > 16 || epoch_ms < 100)
		usage();
	tap_diag("ring-stress: seed %llu, %d s, %d writers, ring %llu entries, ops %s",
		 seed, seconds, nwriters, (unsigned long long)ring_entries,
		 ops ? ops : "all");
	tap_plan(NPARTS + 2);
	if (!ring_supported()) {
		for (i = 0; i < NPARTS; i++)
			tap_skip(part_name[i], "this kernel has no write-log ring");
		tap_skip("ksm-merged", "this kernel has no write-log ring");
		tap_skip("overall", "this kernel has no write-log ring");
		return tap_done();
	}
	/* Setup and the final checks get time of their own. */
	watchdog(seconds + 240);
	t0 = now_ms();

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGBUS, &sa, NULL);
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra,
				      PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&win_lock, &ra);

	setup_parts();
	setup_ring();
	setup_ops(ops);
	for (i = 0; i < NPARTS; i++)
		if (!parts[i].on)
			tap_diag("part %s off: %s", part_name[i], parts[i].why);
	off = 0;
	buf[0] = 0;
	for (i = 0; i < NOPS; i++)
		if (!op_on[i] && op_off_why[i][0])
			off += snprintf(buf + off, sizeof(buf) - off, " %s (%s)",
					op_name[i], op_off_why[i]);
	if (off)
		tap_diag("ops left out:%s", buf);

	for (i = 0; i < nwriters; i++)
		pthread_create(&wt[i], NULL, writer_main, (void *)(long)i);
	pthread_create(&dt, NULL, disruptor_main, NULL);

	{
		uint64_t cs = seed ^ 0xABCDEF;
		long long end = now_ms() + seconds * 1000LL;

		for (epoch = 1;; epoch++) {
			long long eend = now_ms() + epoch_ms, waited;

			if (eend > end)
				eend = end;
			while (now_ms() < eend) {
				harvest();
				usleep(rnd(&cs) % 3000);
			}
			pause_req = 1;
			waited = now_ms();
			while (__atomic_load_n(&parked, __ATOMIC_SEQ_CST) <
			       nwriters + 1 && now_ms() - waited < 60000)
				usleep(1000);
			if (__atomic_load_n(&parked, __ATOMIC_SEQ_CST) <
			    nwriters + 1) {
				park_timeouts++;
				tap_diag("seed %llu epoch %d: only %d of %d threads parked within 60 s (a writer blocked in a fault?)",
					 seed, epoch,
					 __atomic_load_n(&parked, __ATOMIC_SEQ_CST),
					 nwriters + 1);
				break;
			}
			quiet_check(epoch);
			if (now_ms() >= end)
				break;
			hot_salt = (unsigned int)rnd(&cs);
			pause_req = 0;
		}
	}
	stop = 1;
	pause_req = 0;
	if (park_timeouts) {
		/* Threads are stuck in the kernel: report without joining. */
		for (i = 0; i < NPARTS; i++)
			tap_fail(part_name[i], "not checked: threads did not park");
		tap_fail("ksm-merged", "not checked: threads did not park");
		tap_fail("overall", "seed %llu: threads did not park within 60 s",
			 seed);
		ksm_end();
		fflush(NULL);
		_exit(1);
	}
	for (i = 0; i < nwriters; i++) {
		pthread_join(wt[i], NULL);
		writes += n_writes[i];
		faulted += n_faulted[i];
	}
	pthread_join(dt, NULL);

	for (i = 0; i < NPARTS; i++) {
		struct part *pt = &parts[i];

		if (!pt->on)
			tap_skip(part_name[i], "%s", pt->why);
		else
			tap_check(!pt->stale && !pt->unprot, part_name[i],
				  "seed %llu: %lu page-epochs changed without an entry, %lu left unprotected after a full harvest; first: %s",
				  seed, pt->stale, pt->unprot, pt->first);
	}
	off = 0;
	buf[0] = 0;
	for (i = 0; i < NOPS; i++) {
		if (!op_on[i])
			continue;
		off += snprintf(buf + off, sizeof(buf) - off, " %s %lu/%lu",
				op_name[i], op_ok[i], op_tries[i]);
		if (op_last_err[i])
			off += snprintf(buf + off, sizeof(buf) - off, "(%s)",
					strerror(-op_last_err[i]));
		if (op_tries[i] >= 5 && !op_ok[i] && i != OP_COLLAPSE)
			bad_ops++;
	}
	tap_diag("ops ok/tried:%s", buf);
	/* The ksm-merge op is only a disruptor if ksmd merged something. */
	if (have_ksm) {
		long sharing = ksm_get("pages_sharing");

		if (sharing > ksm_sharing_max)
			ksm_sharing_max = sharing;
		tap_diag("ksm: pages_sharing up to %ld during the run, %ld full scans",
			 ksm_sharing_max, ksm_get("full_scans"));
		ksm_end();
	}
	if (!op_on[OP_KSM])
		tap_skip("ksm-merged", "ksm-merge is off: %s",
			 op_off_why[OP_KSM][0] ? op_off_why[OP_KSM] : "not in --ops");
	else if (!ksm_sharing_max && op_tries[OP_KSM] < 5)
		tap_skip("ksm-merged", "ksm-merge ran %lu times (fewer than 5) and ksmd shared nothing",
			 op_tries[OP_KSM]);
	else
		tap_check(ksm_sharing_max > 0, "ksm-merged",
			  "seed %llu: ksmd shared no page in %lu ksm-merge ops",
			  seed, op_tries[OP_KSM]);
	tap_diag("writes %lu (+%lu hit PROT_READ), harvests %lu, entries %lu, overflow scans %lu (%lu pages, %lu deferred by sync mode), resets with EAGAIN %lu, sync windows %lu, foreign entries %lu",
		 writes, faulted, harvests, entries_seen, scans, scan_pages,
		 scans_deferred, reset_eagain, sync_windows, foreign);
	ok = !reset_errors && !scan_errors && !bad_ops && writes > 0 &&
	     harvests > 0;
	for (i = 0; i < NPARTS; i++)
		ok = ok && !parts[i].stale && !parts[i].unprot;
	tap_check(ok, "overall",
		  "seed %llu: reset errors %lu (last %s), scan errors %lu (last %s), ops that never succeeded %d, writes %lu, harvests %lu; parts with lost changes: see above",
		  seed, reset_errors, strerror(-last_reset_err), scan_errors,
		  strerror(-last_scan_err), bad_ops, writes, harvests);
	if (foreign)
		tap_diag("entries outside the arena: %lu, first %#llx", foreign,
			 foreign_first);
	tap_diag("ring-stress: seed %llu, %d epochs, %s", seed, epoch,
		 tap_done() ? "FAILED" : "passed");
	return tap_done();
}
