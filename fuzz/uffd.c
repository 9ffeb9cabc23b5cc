// SPDX-License-Identifier: GPL-2.0
/*
 * fuzz-uffd: a seeded random walk over the userfaultfd / uffd-wp uAPI.
 *
 *   fuzz-uffd [--seed N] [--ops N] [--seconds S] [--ring]
 *
 * The main thread draws every operation from a deterministic PRNG (seed
 * printed first, so a failure replays with the same --seed and --ops):
 * userfaultfd() with random flags, UFFDIO_API with random feature sets,
 * REGISTER/UNREGISTER/WRITEPROTECT/COPY/ZEROPAGE/WAKE/CONTINUE with valid
 * and hostile arguments, PAGEMAP_SCAN, the write-log ring ioctls (only when
 * UFFDIO_API reports UFFD_FEATURE_WP_RING), mmap/munmap/mremap/madvise and
 * fork, while two writer threads store into the same pages and a resolver
 * thread answers every sync fault (and reads every event) on every fd of a
 * small pool.  The main thread's own writes go to word 0 of each page, the
 * writers' to other words, so word 0 has a shadow value the main thread
 * knows exactly.
 *
 * Invariants (one TAP case per family):
 *  readback   word 0 of every page the main thread touches equals its shadow
 *             (before and after its own write): no write is ever lost;
 *  wp-cleared a write of the main thread that returned leaves no uffd-wp bit
 *             in pagemap (sync: the resolver unprotected it; async: the
 *             kernel did; unregistered: no bit may be left behind), and an
 *             async-registered page is then reported by PAGEMAP_SCAN as
 *             PAGE_IS_WRITTEN;
 *  sigbus     SIGBUS only while some fd of the pool has UFFD_FEATURE_SIGBUS,
 *             never SIGSEGV, and the word is unchanged after it;
 *  ioctl      every failing call returns -1 with an errno the kernel can
 *             return for that operation (its ERR_* set below), and calls
 *             that must fail (unaligned, zero length, unknown mode or
 *             feature bits, unmapped addresses, CONTINUE on anonymous
 *             memory, a second UFFDIO_API) do fail;
 *  fork       each forked child sees the parent's words, its own writes read
 *             back, and it exits 0 in time;
 *  ring       header and entries are sane, hostile ring calls fail.
 * A watchdog (alarm, re-armed every operation) fails the run if one
 * operation takes more than STALL_S seconds.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

/* The ring uAPI comes from uffd_ring.h; entries keep flags below the page. */

#ifndef UFFD_RING_ENTRY_ADDR_MASK	/* ring-uapi.md names it; the header may not */
#define UFFD_RING_ENTRY_ADDR_MASK	(~0xfffULL)
#endif

#define NSLOTS		4	/* userfaultfds in the pool */
#define NREGIONS	6	/* anonymous regions */
#define NWRITERS	2
#define STALL_S		60	/* one operation longer than this: hung */
#define MAX_REPORTS	8	/* failure lines printed per family */
#define SRC_PAGES	16	/* UFFDIO_COPY source buffer */
#define CHILD_WAIT_MS	20000

/*
 * The errnos each operation may fail with: what build/linux (6.12 plus this
 * series) returns for it, on the fuzzer's memory (private anonymous only: no
 * hugetlb, shmem or file paths).  ESRCH (or ENOMEM) for mmget_not_zero() and
 * EINTR for a killable lock cannot reach a live process; they stay because
 * the operation returns them.  E() fails to compile for an errno >= 64.
 */
#define E(x)	((1ULL << (x)) + 0 * sizeof(char[(x) < 64 ? 1 : -1]))
/* userfaultfd(): EPERM from userfaultfd_syscall_allowed(), ENOMEM ctx/file */
#define ERR_UFFD_OPEN	(E(EINVAL) | E(EPERM) | E(ENOMEM))
/* EPERM: EVENT_FORK without CAP_SYS_PTRACE; a second call fails the cmpxchg */
#define ERR_API		(E(EFAULT) | E(EINVAL) | E(EPERM))
/* EBUSY: another ctx owns a VMA; ENOMEM: mmget_not_zero(), VMA split/merge */
#define ERR_REGISTER	(E(EFAULT) | E(EINVAL) | E(EBUSY) | E(ENOMEM))
/* ENOMEM as for REGISTER (userfaultfd_clear_vma()) */
#define ERR_UNREGISTER	(E(EFAULT) | E(EINVAL) | E(ENOMEM))
#define ERR_WAKE	(E(EFAULT) | E(EINVAL))
/*
 * mwriteprotect_range(): ENOENT for a range not all uffd-wp registered,
 * EAGAIN for ctx->mmap_changing, ENOMEM for change_protection()'s page
 * tables for markers (WP_UNPOPULATED).
 */
#define ERR_WRITEPROTECT (E(EFAULT) | E(EINVAL) | E(EAGAIN) | E(ENOENT) | \
			  E(ENOMEM) | E(ESRCH))
/*
 * COPY and ZEROPAGE (mfill_atomic()): ENOENT for no registered VMA around
 * dst, EEXIST for a populated pte or a huge pmd, EAGAIN for mmap_changing,
 * a vanished pte table or a partial fill, ENOMEM for anon_vma, page tables
 * or the page, EFAULT for an unreadable source.  EINTR only ever follows a
 * filled page, which makes it a partial fill (EAGAIN).
 */
#define ERR_MFILL	(E(EFAULT) | E(EINVAL) | E(EAGAIN) | E(ENOENT) | \
			 E(EEXIST) | E(ENOMEM) | E(ESRCH))
/* mfill_atomic() refuses an anonymous VMA (EINVAL) before any pte */
#define ERR_CONTINUE	(E(EFAULT) | E(EINVAL) | E(EAGAIN) | E(ENOENT) | \
			 E(ENOMEM) | E(ESRCH))
/* do_pagemap_scan(): EPERM for CHECK_WPASYNC on a VMA that is not async */
#define ERR_SCAN	(E(EFAULT) | E(EINVAL) | E(ENOMEM) | E(EINTR) | \
			 E(EPERM) | E(ESRCH))
/* EPERM: over vm.uffd_ring_max_entries; EBUSY: a ring already, or registered */
#define ERR_RING_SETUP	(E(EFAULT) | E(EINVAL) | E(EPERM) | E(EBUSY) | \
			 E(ENOMEM) | E(ESRCH))
/* uffd_wp_log_reprotect(): EAGAIN mmap_changing, ENOMEM change_protection() */
#define ERR_RING_RESET	(E(EFAULT) | E(EINVAL) | E(EAGAIN) | E(EINTR) | \
			 E(ENOMEM) | E(ESRCH))
/* do_mmap(): EACCES for PROT_WRITE on the O_RDONLY fd; userfaultfd_mmap() */
#define ERR_RING_MMAP	(E(EACCES) | E(EINVAL) | E(ENOMEM) | E(EINTR))
/* A uffd ioctl on /proc/self/pagemap: do_pagemap_cmd()'s -ENOIOCTLCMD */
#define ERR_WRONG_FD	E(ENOTTY)
/* userfaultfd_ioctl() answers an unknown command with EINVAL, not ENOTTY */
#define ERR_UNKNOWN_IOCTL E(EINVAL)
/* EAGAIN: madvise_vma_behavior()'s ENOMEM; EINTR: mmap_write_lock_killable() */
#define ERR_MADVISE	(E(EINVAL) | E(ENOMEM) | E(EAGAIN) | E(EINTR))

enum family { F_READBACK, F_WPCLEAR, F_SIGBUS, F_IOCTL, F_FORK, F_RING, F_N };
static const char *const family_name[F_N] = {
	"fuzz-readback", "fuzz-wp-cleared-on-write", "fuzz-sigbus-only-when-asked",
	"fuzz-ioctl-errno", "fuzz-fork-children", "fuzz-ring",
};
static unsigned long fails[F_N], checks[F_N];
static unsigned long total_fails, op_index;
static const char *volatile op_name = "start";
static uint64_t seed;
static long psz;
static char args[160];	/* the current call's arguments, for reports */

/* ---- PRNG (splitmix64: deterministic per seed) -------------------------- */

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint64_t rs;	/* the main thread's stream */

static uint64_t rnd(uint64_t n)
{
	return n ? rng_next(&rs) % n : 0;
}

static bool chance(unsigned int percent)
{
	return rnd(100) < percent;
}

/* ---- reporting ---------------------------------------------------------- */

static void failure(enum family f, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void failure(enum family f, const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	total_fails++;
	if (++fails[f] > MAX_REPORTS)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	tap_diag("FAIL %s op=%lu (%s) seed=%" PRIu64 ": %s [%s]",
		 family_name[f], op_index, op_name, seed, buf, args);
}

/*
 * Judge one call: RET is its return, E its errno, ALLOWED the ERR_* set of
 * the operation.  MUST_FAIL: the arguments are invalid, success is a bug.
 */
static void judge(const char *what, int ret, int e, bool must_fail,
		  uint64_t allowed)
{
	checks[F_IOCTL]++;
	if (ret == 0 || ret > 0) {
		if (must_fail)
			failure(F_IOCTL, "%s succeeded with invalid arguments",
				what);
		return;
	}
	/* An errno past the mask (a leaked ERESTART*, say) is never allowed. */
	if (e < 0 || e >= 64 || !(allowed & (1ULL << e)))
		failure(F_IOCTL, "%s failed with errno %d (%s), not in the "
			"allowed set", what, e, strerror(e));
}

/* ---- the pool ----------------------------------------------------------- */

struct slot {
	int fd;			/* -1: empty */
	uint64_t features;
	struct uffd_ring_header *ring;	/* mapped ring or NULL */
	size_t ring_size;
	bool ring_set;
};

enum reg_state { RS_NONE, RS_REG, RS_UNKNOWN };

struct region {
	char *addr;		/* NULL: no region */
	size_t npages;
	size_t guard;		/* PROT_NONE pages after it (ours) */
	uint64_t *shadow;	/* word 0 of each page */
	enum reg_state state;
	int slot;		/* RS_REG: which slot */
	uint64_t mode;		/* RS_REG: registration mode */
	bool wp_dropped;	/* registered without MODE_WP at some point */
};

static struct slot slots[NSLOTS];
static struct region regions[NREGIONS];
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int main_wants_pool;	/* the resolver steps aside */
static unsigned long ring_opens, ring_setups, ring_open_err, ring_setup_err;
static pthread_rwlock_t map_lock;	/* writers read, main changes maps */
static uint64_t kernel_features;
static bool have_ring, want_ring;
static volatile int stop_threads, stop_writers;
static char *src_buf;
static int scan_fd = -1;
/* Where every thread is, for a hang report. */
static volatile unsigned long writer_at[NWRITERS];
static volatile int resolver_at;
static volatile unsigned long last_addr, last_flags, last_count;
static volatile int last_err;
static volatile unsigned long zeropage_marker_refusals;
static char *zero_page;

static bool pool_has_sigbus(void)
{
	for (int i = 0; i < NSLOTS; i++)
		if (slots[i].fd >= 0 &&
		    (slots[i].features & UFFD_FEATURE_SIGBUS))
			return true;
	return false;
}

/* ---- fault-safe memory access ------------------------------------------ */

static __thread sigjmp_buf fault_jmp;
static __thread volatile int fault_armed;

static void on_fault(int sig)
{
	if (fault_armed) {
		fault_armed = 0;
		siglongjmp(fault_jmp, sig);
	}
	signal(sig, SIG_DFL);	/* not ours: die on the retry */
}

/* Store VAL at P (or just load when !STORE): 0, or the signal that hit. */
static int safe_access(volatile uint64_t *p, bool store, uint64_t val,
		       uint64_t *out)
{
	int sig = sigsetjmp(fault_jmp, 1);

	if (sig)
		return sig;
	fault_armed = 1;
	if (store)
		*p = val;
	if (out)
		*out = *p;
	fault_armed = 0;
	return 0;
}

/* ---- resolver: answers faults and reads events on every pool fd -------- */

/*
 * A fault whose resolution got EAGAIN (an event such as UNMAP or REMAP is
 * queued and unread, ctx->mmap_changing) is kept here, not woken: read()
 * returns pending faults before events, so waking the thread would make it
 * fault again ahead of the event forever.  Retried after each read batch.
 */
struct pending { int fd; unsigned long addr; bool wp; };
static struct pending pend[256];
static int npend;

/* 0 resolved (and woken), -EAGAIN to retry later; anything else is woken
 * so the thread retries its fault (the range may be gone). */
static int try_resolve(int fd, unsigned long addr, bool wp)
{
	int err;

	if (wp)
		err = uffd_wp(fd, (void *)addr, psz, 0);
	else {
		err = uffd_zeropage(fd, (void *)addr, psz, 0);
		/*
		 * A MISSING fault on a uffd-wp pte marker (MISSING|WP range,
		 * page protected while unpopulated): UFFDIO_ZEROPAGE insists
		 * on pte_none() and says EEXIST although nothing is mapped,
		 * so waking would only repeat the fault.  UFFDIO_COPY accepts
		 * markers (pte_none_mostly()): fill with zeroes that way.
		 */
		if (err == -EEXIST) {
			err = uffd_copy(fd, (void *)addr, zero_page, psz, 0);
			if (!err)
				zeropage_marker_refusals++;
		}
		if (err == -EEXIST)
			err = uffd_wake(fd, (void *)addr, psz);
	}
	if (last_addr == addr)
		last_count++;
	else
		last_count = 1;
	last_addr = addr;
	last_flags = wp;
	last_err = err;
	if (err == -EAGAIN)
		return err;
	if (err)
		uffd_wake(fd, (void *)addr, psz);
	return 0;
}

static void resolve_one(int fd, const struct uffd_msg *m)
{
	unsigned long addr = m->arg.pagefault.address & ~(psz - 1);
	bool wp = m->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP;

	if (m->event == UFFD_EVENT_FORK) {
		/* The child's new uffd: closing it releases the child. */
		close((int)m->arg.fork.ufd);
		return;
	}
	if (m->event != UFFD_EVENT_PAGEFAULT)
		return;		/* REMAP/REMOVE/UNMAP: reading it is enough */
	if (try_resolve(fd, addr, wp) == -EAGAIN) {
		if (npend < (int)(sizeof(pend) / sizeof(pend[0])))
			pend[npend++] = (struct pending){ fd, addr, wp };
		else
			uffd_wake(fd, (void *)addr, psz);
	}
}

static void retry_pending(const struct pollfd *p, int n)
{
	int k = 0;

	for (int i = 0; i < npend; i++) {
		bool live = false;

		for (int j = 0; j < n; j++)
			live |= p[j].fd == pend[i].fd;
		/* A closed fd woke its waiters when it was released. */
		if (live && try_resolve(pend[i].fd, pend[i].addr,
					pend[i].wp) == -EAGAIN)
			pend[k++] = pend[i];
	}
	npend = k;
}

static void *resolver_main(void *arg)
{
	(void)arg;
	while (!stop_threads) {
		struct pollfd p[NSLOTS];
		int n = 0;

		resolver_at = 1;
		pthread_mutex_lock(&pool_lock);
		resolver_at = 2;
		for (int i = 0; i < NSLOTS; i++)
			if (slots[i].fd >= 0)
				p[n++] = (struct pollfd){ slots[i].fd, POLLIN, 0 };
		if (n && poll(p, n, npend ? 0 : 2) > 0) {
			resolver_at = 3;
			for (int i = 0; i < n; i++) {
				struct uffd_msg m;

				if (!(p[i].revents & POLLIN))
					continue;
				while (read(p[i].fd, &m, sizeof(m)) == sizeof(m))
					resolve_one(p[i].fd, &m);
			}
		}
		resolver_at = 4;
		retry_pending(p, n);
		pthread_mutex_unlock(&pool_lock);
		resolver_at = 5;
		if (!n || npend)
			usleep(npend ? 200 : 1000);
		while (main_wants_pool && !stop_threads)
			usleep(50);
	}
	return NULL;
}

/* ---- writer threads: other words of the same pages --------------------- */

static void *writer_main(void *arg)
{
	long id = (long)arg;
	uint64_t s = seed ^ (0xabcdef12345ULL * (id + 1)), v = 0;

	while (!stop_writers) {
		struct timespec ts = { 0, 200000 };

		pthread_rwlock_rdlock(&map_lock);
		for (int k = 0; k < 4; k++) {
			struct region *r = &regions[rng_next(&s) % NREGIONS];
			volatile uint64_t *w;

			if (!r->addr)
				continue;
			w = (uint64_t *)(r->addr +
					 rng_next(&s) % r->npages * psz) +
			    8 + id;
			writer_at[id] = (uintptr_t)w;
			safe_access(w, true, ++v, NULL);
			writer_at[id] = 0;
		}
		pthread_rwlock_unlock(&map_lock);
		nanosleep(&ts, NULL);
	}
	return NULL;
}

/* ---- regions ------------------------------------------------------------ */

static void region_new(struct region *r)
{
	static const size_t sizes[] = { 8, 16, 32, 64, 64, 512 };
	size_t np = sizes[rnd(6)], guard = chance(50) ? 4 : 0;
	char *p = map_anon_aligned((np + guard) * psz,
				   np == 512 ? HPAGE_SIZE : (size_t)psz);

	if (!p)
		return;
	if (guard)
		mprotect(p + np * psz, guard * psz, PROT_NONE);
	r->shadow = calloc(np, sizeof(uint64_t));
	if (!r->shadow) {
		munmap(p, (np + guard) * psz);
		return;
	}
	r->npages = np;
	r->guard = guard;
	r->state = RS_NONE;
	r->slot = -1;
	r->mode = 0;
	r->wp_dropped = false;
	r->addr = p;
}

static void region_drop(struct region *r)
{
	if (!r->addr)
		return;
	munmap(r->addr, (r->npages + r->guard) * psz);
	free(r->shadow);
	r->addr = NULL;
	r->shadow = NULL;
}

static struct region *pick_region(void)
{
	struct region *r = &regions[rnd(NREGIONS)];

	return r->addr ? r : NULL;
}

/* Every page of [start, start + len) has no mapping at all. */
static bool unmapped(uint64_t start, uint64_t len)
{
	unsigned char v;

	for (uint64_t a = start; a < start + len; a += psz)
		if (mincore((void *)a, psz, &v) == 0 || errno != ENOMEM)
			return false;
	return true;
}

/*
 * A range for an ioctl.  bad: structurally invalid (unaligned, empty,
 * wrapping, outside the user address space) -- every range ioctl must fail;
 * hole: valid but nothing is mapped there -- every ioctl that needs a VMA
 * must fail; whole: exactly one region.
 */
struct range { uint64_t start, len; bool valid, whole, bad, hole; };

static struct range pick_range_(struct region *r);

static struct range pick_range(struct region *r)
{
	struct range g = pick_range_(r);

	snprintf(args, sizeof(args), "range %#" PRIx64 "+%#" PRIx64
		 " bad %d hole %d whole %d; region %p %zu pages guard %zu "
		 "state %d slot %d", g.start, g.len, g.bad, g.hole, g.whole,
		 r ? r->addr : NULL, r ? r->npages : 0, r ? r->guard : 0,
		 r ? (int)r->state : -1, r ? r->slot : -1);
	return g;
}

static struct range pick_range_(struct region *r)
{
	static const uint64_t nowhere[] = {
		0x800, 0xffff800000000000ULL, 0xfffffffffffff000ULL,
		0xfffffffffffff000ULL,
	};
	struct range g = { 0 };
	size_t a, n;

	switch (rnd(r ? 11 : 1)) {
	case 0:		/* outside user space: must fail */
		g.start = nowhere[rnd(4)];
		g.len = psz << rnd(4);
		g.bad = true;
		return g;
	case 1:		/* unaligned start or length: must fail */
		g.start = (uintptr_t)r->addr + rnd(r->npages) * psz;
		g.len = psz;
		if (chance(50))
			g.start += 1 + rnd(psz - 1);
		else
			g.len += 1 + rnd(psz - 1);
		g.bad = true;
		return g;
	case 2:		/* empty or wrapping: must fail */
		g.start = (uintptr_t)r->addr;
		g.len = chance(50) ? 0 : (uint64_t)-psz;
		g.bad = true;
		return g;
	case 3:		/* just past the region (and its guard), if unmapped:
			 * never someone else's memory (a thread's stack) */
		g.start = (uintptr_t)r->addr + (r->npages + r->guard) * psz;
		g.len = (1 + rnd(4)) * psz;
		g.hole = unmapped(g.start, g.len);
		if (g.hole)
			return g;
		g.hole = false;
		/* fall through */
	case 4:		/* into the guard (still ours) */
		if (r->guard) {
			a = rnd(r->npages);
			g.start = (uintptr_t)r->addr + a * psz;
			g.len = (r->npages - a + 1 + rnd(r->guard)) * psz;
			return g;
		}
		/* fall through */
	case 5: case 6: case 7:
		g.start = (uintptr_t)r->addr;
		g.len = r->npages * psz;
		g.valid = g.whole = true;
		return g;
	default:
		a = rnd(r->npages);
		n = 1 + rnd(r->npages - a < 16 ? r->npages - a : 16);
		g.start = (uintptr_t)r->addr + a * psz;
		g.len = n * psz;
		g.valid = true;
		return g;
	}
}

static struct slot *pick_slot(void)
{
	struct slot *s = &slots[rnd(NSLOTS)];

	return s->fd >= 0 ? s : NULL;
}

/* ---- ops: userfaultfd() and UFFDIO_API --------------------------------- */

static void op_api_garbage(void)
{
	int flags, fd, ret, e;
	bool bad_flags;
	struct uffdio_api api = { .api = UFFD_API };

	op_name = "api-garbage";
	flags = O_CLOEXEC | O_NONBLOCK;
	if (chance(30))
		flags |= UFFD_USER_MODE_ONLY;
	bad_flags = chance(20);
	if (bad_flags)
		flags |= 1 << rnd(31);
	if (bad_flags && !(flags & ~(O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY)))
		bad_flags = false;
	fd = syscall(SYS_userfaultfd, flags);
	e = errno;
	judge("userfaultfd(flags)", fd < 0 ? -1 : 0, e, bad_flags,
	      ERR_UFFD_OPEN);
	if (fd < 0)
		return;
	switch (rnd(4)) {
	case 0:		/* garbage bits */
		api.features = rng_next(&rs);
		break;
	case 1:		/* wrong api */
		api.api = rnd(2) ? 0 : UFFD_API + 1 + rnd(1000);
		break;
	default:	/* a subset of what the kernel offers */
		api.features = rng_next(&rs) & kernel_features;
	}
	{
		uint64_t asked = api.features, api_v = api.api;
		bool bad = api_v != UFFD_API || (asked & ~kernel_features);

		ret = ioctl(fd, UFFDIO_API, &api);
		e = errno;
		judge("UFFDIO_API", ret, e, bad, ERR_API);
		if (ret == 0) {
			/* A second UFFDIO_API on the same fd must fail. */
			struct uffdio_api again = { .api = UFFD_API };

			ret = ioctl(fd, UFFDIO_API, &again);
			judge("second UFFDIO_API", ret, errno, true, ERR_API);
		}
	}
	close(fd);
}

static void slot_close(struct slot *s)
{
	int fd = s->fd;

	if (fd < 0)
		return;
	main_wants_pool = 1;
	pthread_mutex_lock(&pool_lock);
	s->fd = -1;
	pthread_mutex_unlock(&pool_lock);
	main_wants_pool = 0;
	close(fd);
	if (s->ring)
		munmap(s->ring, s->ring_size);
	s->ring = NULL;
	s->ring_set = false;
	for (int i = 0; i < NREGIONS; i++)
		if (regions[i].state == RS_REG && regions[i].slot == s - slots)
			regions[i].state = RS_NONE;
	/* Partially registered regions may have been this fd's too; unknown
	 * stays unknown. */
}

static void ring_setup(struct slot *s, bool hostile);

static void op_slot_reopen(void)
{
	struct slot *s = &slots[rnd(NSLOTS)];
	uint64_t f = UFFD_FEATURE_PAGEFAULT_FLAG_WP, got = 0;
	int fd, kind = rnd(10);

	op_name = "slot-reopen";
	slot_close(s);
	if (kind < 4)
		f |= UFFD_FEATURE_WP_ASYNC;
	else if (kind < 5)
		f = 0;
	if (chance(40))
		f |= UFFD_FEATURE_WP_UNPOPULATED;
	if (chance(30))
		f |= UFFD_FEATURE_EVENT_REMAP;
	if (chance(20))
		f |= UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP;
	if (chance(15))
		f |= UFFD_FEATURE_EVENT_FORK;
	if (!(f & UFFD_FEATURE_WP_ASYNC) && chance(15))
		f |= UFFD_FEATURE_SIGBUS;
	if (chance(20))
		f |= UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_EXACT_ADDRESS;
	if (have_ring && (f & UFFD_FEATURE_WP_ASYNC) && chance(want_ring ? 80 : 40))
		f |= UFFD_FEATURE_WP_RING;
	f &= kernel_features;
	fd = uffd_open_flags(O_CLOEXEC | O_NONBLOCK |
			     (chance(30) ? UFFD_USER_MODE_ONLY : 0), f, &got);
	if (fd < 0) {
		judge("open pool uffd", -1, -fd, false,
		      ERR_UFFD_OPEN | ERR_API);
		if (f & UFFD_FEATURE_WP_RING)
			ring_open_err = -fd;
		return;
	}
	if (f & UFFD_FEATURE_WP_RING)
		ring_opens++;
	s->features = f;
	main_wants_pool = 1;
	pthread_mutex_lock(&pool_lock);
	s->fd = fd;
	pthread_mutex_unlock(&pool_lock);
	main_wants_pool = 0;
	if (f & UFFD_FEATURE_WP_RING)
		ring_setup(s, chance(20));
}

/* ---- ops: REGISTER / UNREGISTER ----------------------------------------- */

static void set_state_after(struct region *r, const struct range *g, int slot,
			    uint64_t mode, bool reg)
{
	if (!r)
		return;
	if (g->whole) {
		r->state = reg ? RS_REG : RS_NONE;
		r->slot = slot;
		r->mode = mode;
	} else {
		r->state = RS_UNKNOWN;
	}
}

static void op_register(void)
{
	struct region *r = pick_region();
	struct slot *s = pick_slot();
	struct range g = pick_range(r);
	struct uffdio_register reg = { 0 };
	uint64_t mode;
	bool bad;
	int ret;

	op_name = "register";
	if (!s)
		return;
	mode = chance(70) ? UFFDIO_REGISTER_MODE_WP : 0;
	if (chance(30) || !mode)
		mode |= UFFDIO_REGISTER_MODE_MISSING;
	if (chance(5))
		mode = UFFDIO_REGISTER_MODE_MINOR;	/* anon: must fail */
	if (chance(3))
		mode = 1ULL << (3 + rnd(60));		/* unknown bit */
	if (chance(2))
		mode = 0;				/* no mode: EINVAL */
	bad = g.bad || g.hole || mode == 0 ||
	      (mode & ~(UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP));
	/* Another fd already owning the whole region: EBUSY. */
	if (r && g.whole && r->state == RS_REG && r->slot != s - slots)
		bad = true;
	reg.range.start = g.start;
	reg.range.len = g.len;
	reg.mode = mode;
	ret = ioctl(s->fd, UFFDIO_REGISTER, &reg);
	judge("UFFDIO_REGISTER", ret, errno, bad, ERR_REGISTER);
	if (ret == 0)
		set_state_after(r, &g, s - slots, mode, true);
	if (ret == 0 && r && !(mode & UFFDIO_REGISTER_MODE_WP))
		r->wp_dropped = true;
	else if (r && !g.bad && errno != EBUSY)
		r->state = RS_UNKNOWN;	/* e.g. ENOMEM midway */
}

static void op_unregister(void)
{
	struct region *r = pick_region();
	struct slot *s = pick_slot();
	struct range g = pick_range(r);
	struct uffdio_range rg = { g.start, g.len };
	int ret;

	op_name = "unregister";
	if (!s)
		return;
	ret = ioctl(s->fd, UFFDIO_UNREGISTER, &rg);
	judge("UFFDIO_UNREGISTER", ret, errno, g.bad || g.hole,
	      ERR_UNREGISTER);
	/*
	 * UNREGISTER has no owner check: through any uffd of this mm it
	 * drops whatever registration covers the range (fs/userfaultfd.c
	 * userfaultfd_unregister() only skips unregistered VMAs).
	 */
	if (ret == 0 && r)
		set_state_after(r, &g, -1, 0, false);
}

/* ---- ops: WRITEPROTECT / COPY / ZEROPAGE / WAKE / CONTINUE ------------- */

static void op_writeprotect(void)
{
	struct region *r = pick_region();
	struct slot *s = pick_slot();
	struct range g = pick_range(r);
	struct uffdio_writeprotect w = { { g.start, g.len }, 0 };
	bool bad = g.bad || g.hole, must_work;
	int ret;

	op_name = "writeprotect";
	if (!s)
		return;
	w.mode = chance(75) ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
	if (chance(20))
		w.mode |= UFFDIO_WRITEPROTECT_MODE_DONTWAKE;
	/* Protecting never wakes: WP|DONTWAKE is EINVAL. */
	if (w.mode == (UFFDIO_WRITEPROTECT_MODE_WP |
		       UFFDIO_WRITEPROTECT_MODE_DONTWAKE))
		bad = true;
	if (chance(3)) {
		w.mode |= 1ULL << (2 + rnd(60));
		bad = true;
	}
	must_work = !bad && r && g.valid && r->state == RS_REG &&
		    r->slot == s - slots && (r->mode & UFFDIO_REGISTER_MODE_WP);
	ret = ioctl(s->fd, UFFDIO_WRITEPROTECT, &w);
	judge("UFFDIO_WRITEPROTECT", ret, errno, bad, ERR_WRITEPROTECT);
	if (must_work && ret && errno != EAGAIN)
		failure(F_IOCTL, "UFFDIO_WRITEPROTECT of a WP-registered range "
			"failed: %s", strerror(errno));
	/* DONTWAKE unprotect may leave a sync writer waiting: wake it. */
	if (ret == 0 && (w.mode & UFFDIO_WRITEPROTECT_MODE_DONTWAKE))
		uffd_wake(s->fd, (void *)g.start, g.len);
}

static void op_copy_zero(void)
{
	struct region *r = pick_region();
	struct slot *s = pick_slot();
	struct range g = pick_range(r);
	bool bad = g.bad || g.hole, zero = chance(40);
	char *copy_src = src_buf;
	int ret, e;
	int64_t done;

	op_name = zero ? "zeropage" : "copy";
	if (!s)
		return;
	if (!zero && g.len > SRC_PAGES * (uint64_t)psz && !bad)
		g.len = SRC_PAGES * psz;
	if (zero) {
		struct uffdio_zeropage z = { { g.start, g.len }, 0, 0 };

		if (chance(3)) {
			z.mode = 1ULL << (1 + rnd(62));
			bad = true;
		}
		ret = ioctl(s->fd, UFFDIO_ZEROPAGE, &z);
		e = errno;
		done = z.zeropage;
	} else {
		struct uffdio_copy c = { g.start, (uintptr_t)src_buf, g.len, 0, 0 };

		if (chance(30))
			c.mode |= UFFDIO_COPY_MODE_WP;
		if (chance(3)) {
			c.mode |= 1ULL << (2 + rnd(61));
			bad = true;
		}
		if (chance(3)) {	/* unaligned source: allowed */
			c.src += 8;
		} else if (chance(3)) {	/* unmapped source: EFAULT */
			c.src = 0x1000;
			bad = true;
		}
		copy_src = (char *)(uintptr_t)c.src;
		ret = ioctl(s->fd, UFFDIO_COPY, &c);
		e = errno;
		done = c.copy;
	}
	judge(zero ? "UFFDIO_ZEROPAGE" : "UFFDIO_COPY", ret, e, bad, ERR_MFILL);
	/* Pages filled (all, or the part before the error) changed word 0. */
	if (r && !bad && (ret == 0 || done > 0)) {
		uint64_t filled = ret == 0 ? g.len : (uint64_t)done;
		size_t first = (g.start - (uintptr_t)r->addr) / psz;

		for (size_t i = 0; i * psz < filled && first + i < r->npages; i++)
			r->shadow[first + i] =
				zero ? 0 : *(uint64_t *)(copy_src + i * psz);
	}
	if (ret && (e == EEXIST || e == EAGAIN) && !bad)
		uffd_wake(s->fd, (void *)g.start, g.len);
}

static void op_wake_continue(void)
{
	struct region *r = pick_region();
	struct slot *s = pick_slot();
	struct range g = pick_range(r);
	int ret;

	op_name = "wake-continue";
	if (!s)
		return;
	if (chance(60)) {
		struct uffdio_range rg = { g.start, g.len };

		ret = ioctl(s->fd, UFFDIO_WAKE, &rg);
		judge("UFFDIO_WAKE", ret, errno, g.bad, ERR_WAKE);
	} else {
		/* Anonymous memory has no page cache: CONTINUE always fails. */
		struct uffdio_continue c = { { g.start, g.len }, 0, 0 };

		if (chance(30))
			c.mode = 1ULL << rnd(64);
		ret = ioctl(s->fd, UFFDIO_CONTINUE, &c);
		judge("UFFDIO_CONTINUE on anonymous memory", ret, errno, true,
		      ERR_CONTINUE);
	}
}

/* A uffd ioctl on something that is not a userfaultfd, or an unknown one. */
static void op_wrong_fd(void)
{
	struct uffdio_range rg = { 0x10000, 4096 };
	struct slot *s = pick_slot();
	int ret;

	op_name = "wrong-fd";
	if (chance(50) || !s) {
		ret = ioctl(scan_fd, UFFDIO_WAKE, &rg);
		judge("UFFDIO_WAKE on pagemap fd", ret, errno, true,
		      ERR_WRONG_FD);
	} else {
		ret = ioctl(s->fd, _IOWR(UFFDIO, 0x20 + rnd(32), struct uffdio_range),
			    &rg);
		judge("unknown uffd ioctl", ret, errno, true,
		      ERR_UNKNOWN_IOCTL);
	}
}

/* ---- ops: PAGEMAP_SCAN -------------------------------------------------- */

static void op_scan(void)
{
	struct region *r = pick_region();
	struct range g = pick_range(r);
	struct page_region vec[8];
	struct pm_scan_arg a = {
		.size = sizeof(a), .start = g.start, .end = g.start + g.len,
		.vec = (uintptr_t)vec, .vec_len = 8,
		.category_mask = PAGE_IS_WRITTEN, .return_mask = PAGE_IS_WRITTEN,
	};
	bool bad = false;
	long ret;

	op_name = "pagemap-scan";
	if (chance(40))
		a.flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC;
	switch (rnd(12)) {
	case 0: a.size = rnd(2) ? 8 : sizeof(a) + 8; bad = true; break;
	case 1: a.flags |= 1ULL << (2 + rnd(62)); bad = true; break;
	case 2: a.return_mask = 1ULL << (8 + rnd(56)); bad = true; break;
	case 3: a.category_mask = 1ULL << (8 + rnd(56)); bad = true; break;
	case 4: a.vec = 0; bad = true; break;
	}
	/* Unaligned start or a wrapping end must fail; a kernel address
	 * (g.bad) fails on access_ok() or finds no VMA: errno only. */
	if ((g.start & (psz - 1)) || a.end < a.start)
		bad = true;
	ret = ioctl(scan_fd, PAGEMAP_SCAN, &a);
	judge("PAGEMAP_SCAN", ret < 0 ? -1 : 0, errno, bad, ERR_SCAN);
}

/* ---- ops: the write-log ring ------------------------------------------- */

static bool ring_sane(struct slot *s, const char *when)
{
	struct uffd_ring_header *h = s->ring;
	uint64_t p, c, n;

	if (!h)
		return true;
	checks[F_RING]++;
	p = __atomic_load_n(&h->producer, __ATOMIC_ACQUIRE);
	c = h->consumer;
	n = h->entries;
	if (n < 64 || (n & (n - 1)) || c > p ||
	    (p - c > n && !(h->flags & UFFD_RING_OVERFLOW)) ||
	    h->entry_offset < sizeof(*h) || h->entry_offset + n * 8 > s->ring_size) {
		failure(F_RING, "%s: header producer %" PRIu64 " consumer %"
			PRIu64 " entries %" PRIu64 " flags %#" PRIx64
			" entry_offset %" PRIu64 " (mapping %zu)", when, p, c, n,
			(uint64_t)h->flags, (uint64_t)h->entry_offset,
			s->ring_size);
		return false;
	}
	for (uint64_t i = c; i < p && i < c + n && i < c + 64; i++) {
		uint64_t e = ((uint64_t *)((char *)h + h->entry_offset))[i & (n - 1)];

		if (e & ~UFFD_RING_ENTRY_ADDR_MASK & ~UFFD_RING_ENTRY_HUGE) {
			failure(F_RING, "%s: entry %" PRIu64 " = %#" PRIx64
				" has unknown flag bits", when, i, e);
			return false;
		}
	}
	return true;
}

static void ring_setup(struct slot *s, bool hostile)
{
	struct uffdio_ring_setup rs_arg = { .entries = 64ULL << rnd(6) };
	bool bad = false;
	void *m;
	int ret;

	if (hostile) {
		switch (rnd(4)) {
		case 0: rs_arg.entries = rnd(2) ? 0 : 63 + rnd(2) * 2; break;
		case 1: rs_arg.entries = 1ULL << (23 + rnd(40)); break;
		case 2: rs_arg.flags = 1ULL << rnd(64); break;
		default: rs_arg.entries = 32; break;
		}
		bad = true;
	}
	ret = ioctl(s->fd, UFFDIO_RING_SETUP, &rs_arg);
	judge("UFFDIO_RING_SETUP", ret, errno, bad, ERR_RING_SETUP);
	if (ret && !bad)
		ring_setup_err = errno;
	if (ret)
		return;
	ring_setups++;
	s->ring_set = true;
	/* Hostile mappings first: writable, wrong size, wrong offset. */
	m = mmap(NULL, rs_arg.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED,
		 s->fd, 0);
	judge("ring mmap PROT_WRITE", m == MAP_FAILED ? -1 : 0, errno, true,
	      ERR_RING_MMAP);
	if (m != MAP_FAILED)
		munmap(m, rs_arg.mmap_size);
	m = mmap(NULL, rs_arg.mmap_size + psz, PROT_READ, MAP_SHARED, s->fd, 0);
	judge("ring mmap too large", m == MAP_FAILED ? -1 : 0, errno, true,
	      ERR_RING_MMAP);
	if (m != MAP_FAILED)
		munmap(m, rs_arg.mmap_size + psz);
	m = mmap(NULL, rs_arg.mmap_size, PROT_READ, MAP_SHARED, s->fd, psz);
	judge("ring mmap offset", m == MAP_FAILED ? -1 : 0, errno, true,
	      ERR_RING_MMAP);
	if (m != MAP_FAILED)
		munmap(m, rs_arg.mmap_size);
	m = mmap(NULL, rs_arg.mmap_size, PROT_READ, MAP_SHARED, s->fd, 0);
	judge("ring mmap", m == MAP_FAILED ? -1 : 0, errno, false,
	      ERR_RING_MMAP);
	if (m == MAP_FAILED) {
		failure(F_RING, "valid ring mmap of %" PRIu64 " bytes failed: %s",
			(uint64_t)rs_arg.mmap_size, strerror(errno));
		return;
	}
	s->ring = m;
	s->ring_size = rs_arg.mmap_size;
	ring_sane(s, "after setup");
	/* A second setup must fail (EBUSY). */
	ret = ioctl(s->fd, UFFDIO_RING_SETUP, &rs_arg);
	judge("second UFFDIO_RING_SETUP", ret, errno, true,
	      ERR_RING_SETUP);
}

static void op_ring(void)
{
	struct slot *s = pick_slot();
	struct uffdio_ring_reset rr = { 0 };
	uint64_t p, c;
	bool bad = false;
	int ret;

	op_name = "ring";
	if (!s)
		return;
	if (!(s->features & UFFD_FEATURE_WP_RING)) {
		/* Setup on a fd without the feature must fail. */
		struct uffdio_ring_setup a = { .entries = 64 };

		ret = ioctl(s->fd, UFFDIO_RING_SETUP, &a);
		judge("UFFDIO_RING_SETUP without WP_RING", ret, errno, true,
		      ERR_RING_SETUP);
		return;
	}
	if (!s->ring) {
		rr.consumer = 0;
		ret = ioctl(s->fd, UFFDIO_RING_RESET, &rr);
		judge("UFFDIO_RING_RESET (no ring mapped)", ret, errno,
		      !s->ring_set, ERR_RING_RESET);
		return;
	}
	if (!ring_sane(s, "before reset"))
		return;
	p = __atomic_load_n(&s->ring->producer, __ATOMIC_ACQUIRE);
	c = s->ring->consumer;
	rr.consumer = p;
	/* the overflow count before the flag: it is published after it */
	rr.overflows = __atomic_load_n(&s->ring->overflows, __ATOMIC_ACQUIRE);
	if (__atomic_load_n(&s->ring->flags, __ATOMIC_ACQUIRE) &
	    UFFD_RING_OVERFLOW)
		rr.flags = UFFDIO_RING_RESET_CLEAR_OVERFLOW;
	switch (rnd(7)) {
	case 0: rr.consumer = p + 1 + rnd(1000); bad = true; break;
	case 1: if (c) { rr.consumer = c - 1; bad = true; } break;
	case 2: rr.flags |= 1ULL << (2 + rnd(62)); bad = true; break;
	case 3: rr.consumer = c + (p > c ? rnd(p - c) : 0); break;
	/* Leaves the pages writable: their next writes go unlogged. */
	case 4: rr.flags |= UFFDIO_RING_RESET_DISCARD; break;
	}
	ret = ioctl(s->fd, UFFDIO_RING_RESET, &rr);
	/* The producer may have moved on: p + 1 can become valid. */
	judge("UFFDIO_RING_RESET", ret, errno,
	      bad && !(rr.consumer > p &&
		       rr.consumer <= __atomic_load_n(&s->ring->producer,
						      __ATOMIC_ACQUIRE)),
	      ERR_RING_RESET);
	if (ret == 0 && !bad &&
	    (rr.reprotected > rr.consumer - c ||
	     ((rr.flags & UFFDIO_RING_RESET_DISCARD) && rr.reprotected)))
		failure(F_RING, "RING_RESET %" PRIu64 " -> %" PRIu64
			" flags %#" PRIx64 " reprotected %" PRIu64 " entries",
			c, (uint64_t)rr.consumer, (uint64_t)rr.flags,
			(uint64_t)rr.reprotected);
	ring_sane(s, "after reset");
}

/* ---- ops: memory -------------------------------------------------------- */

static void check_word(struct region *r, size_t i, const char *when)
{
	uint64_t v = 0;
	int sig = safe_access((uint64_t *)(r->addr + i * psz), false, 0, &v);

	checks[F_READBACK]++;
	if (sig) {
		checks[F_SIGBUS]++;
		if (sig != SIGBUS || !pool_has_sigbus())
			failure(F_SIGBUS, "%s read of page %zu of %p: signal %d "
				"(sigbus fd in pool: %d)", when, i, r->addr, sig,
				pool_has_sigbus());
		return;
	}
	if (v != r->shadow[i])
		failure(F_READBACK, "%s: page %zu of %p (%zu pages, state %d) "
			"word 0 is %#" PRIx64 ", expected %#" PRIx64, when, i,
			r->addr, r->npages, r->state, v, r->shadow[i]);
}

static void op_write(void)
{
	struct region *r = pick_region();
	size_t i;
	uint64_t val, back = 0, pm;
	char *page;
	int sig;

	op_name = "write";
	if (!r)
		return;
	i = rnd(r->npages);
	page = r->addr + i * psz;
	val = (op_index << 8) | 0x5a;
	check_word(r, i, "before write");
	sig = safe_access((uint64_t *)page, true, val, &back);
	checks[F_SIGBUS]++;
	if (sig) {
		if (sig != SIGBUS || !pool_has_sigbus())
			failure(F_SIGBUS, "write to page %zu of %p: signal %d "
				"(state %d, sigbus fd in pool: %d)", i, r->addr,
				sig, r->state, pool_has_sigbus());
		check_word(r, i, "after SIGBUS");
		return;
	}
	r->shadow[i] = val;
	checks[F_READBACK]++;
	if (back != val)
		failure(F_READBACK, "write of %#" PRIx64 " to page %zu of %p "
			"read back %#" PRIx64, val, i, r->addr, back);
	pm = pagemap_entry(page);
	checks[F_WPCLEAR]++;
	if (pm & PM_UFFD_WP)
		failure(F_WPCLEAR, "page %zu of %p still has the uffd-wp bit "
			"after a write returned (state %d slot %d mode %#" PRIx64
			", pagemap %#" PRIx64 ")%s", i, r->addr, r->state, r->slot,
			r->mode, pm, r->wp_dropped ? " -- the region was "
			"registered without MODE_WP before (known: see race/"
			"lifetime-reregister-without-wp-clears-bits)" :
			" -- NEW: no registration without MODE_WP seen");
	/* Async tracking: PAGEMAP_SCAN must call the page written. */
	if (r->state == RS_REG && (r->mode & UFFDIO_REGISTER_MODE_WP) &&
	    (slots[r->slot].features & UFFD_FEATURE_WP_ASYNC) && chance(25)) {
		struct page_region v[2];
		struct pm_scan_arg a = {
			.size = sizeof(a), .start = (uintptr_t)page,
			.end = (uintptr_t)page + psz, .vec = (uintptr_t)v,
			.vec_len = 2, .category_mask = PAGE_IS_WRITTEN,
			.return_mask = PAGE_IS_WRITTEN,
		};
		long n = ioctl(scan_fd, PAGEMAP_SCAN, &a);

		checks[F_WPCLEAR]++;
		if (n != 1 || v[0].start != (uintptr_t)page)
			failure(F_WPCLEAR, "PAGEMAP_SCAN does not report the "
				"written async page %zu of %p (returned %ld, %s)",
				i, r->addr, n, n < 0 ? strerror(errno) : "-");
	}
}

static void op_read(void)
{
	struct region *r = pick_region();

	op_name = "read";
	if (r)
		check_word(r, rnd(r->npages), "read");
}

static void op_remap_region(void)
{
	struct region *r = &regions[rnd(NREGIONS)];

	op_name = "munmap-mmap:wrlock";
	pthread_rwlock_wrlock(&map_lock);
	op_name = "munmap-mmap";
	if (r->addr && chance(30) && r->npages > 8) {
		/* Cut the tail off (and the guard with it). */
		size_t keep = r->npages / 2;

		op_name = "munmap-tail";
		munmap(r->addr + keep * psz, (r->npages - keep + r->guard) * psz);
		r->npages = keep;
		r->guard = 0;
	} else {
		region_drop(r);
		region_new(r);
	}
	pthread_rwlock_unlock(&map_lock);
}

static void op_mremap(void)
{
	struct region *r = pick_region();
	size_t newn;
	uint64_t *sh;
	char *p;

	op_name = "mremap";
	if (!r)
		return;
	newn = chance(50) ? r->npages : r->npages + rnd(8);
	sh = realloc(r->shadow, newn * sizeof(uint64_t));
	if (!sh)
		return;
	for (size_t i = r->npages; i < newn; i++)
		sh[i] = 0;
	r->shadow = sh;
	pthread_rwlock_wrlock(&map_lock);
	p = mremap(r->addr, r->npages * psz, newn * psz, MREMAP_MAYMOVE);
	if (p != MAP_FAILED) {
		if (p != r->addr && r->guard)
			munmap(r->addr + r->npages * psz, r->guard * psz);
		if (p != r->addr)
			r->guard = 0;
		r->addr = p;
		r->npages = newn;
		/* Without EVENT_REMAP the moved range is no longer registered. */
		if (r->state == RS_REG &&
		    !(slots[r->slot].features & UFFD_FEATURE_EVENT_REMAP))
			r->state = RS_NONE;
		else if (newn != r->npages || r->state == RS_REG)
			r->state = RS_UNKNOWN;
	}
	pthread_rwlock_unlock(&map_lock);
}

static void op_madvise(void)
{
	struct region *r = pick_region();
	size_t a, n;
	int adv, ret;

	op_name = "madvise";
	if (!r)
		return;
	a = rnd(r->npages);
	n = 1 + rnd(r->npages - a);
	/*
	 * No MADV_FREE: a lazyfree page's content is undefined (old or zero)
	 * until it is written again, and reclaim may drop it at any later
	 * time, which word 0's exact shadow cannot follow; tests/ring-paths.c
	 * covers what MADV_FREE does to protected pages.
	 */
	switch (rnd(20)) {
	case 0: case 1: case 2: case 3: case 4: case 5:
		adv = MADV_DONTNEED;
		op_name = "madv-dontneed";
		/* Whole huge regions too: zap_huge_pmd() of a PMD-mapped THP. */
		if (r->npages == 512 && chance(50)) {
			a = 0;
			n = 512;
		}
		break;
	case 6: case 7:
		adv = MADV_PAGEOUT;
		op_name = "madv-pageout";
		if (n > 32)
			n = 32;
		break;
	case 8:
		adv = MADV_COLLAPSE;
		op_name = "madv-collapse";
		if (r->npages < 512)
			return;
		a = 0;
		n = 512;
		break;
	case 9: case 10: case 11:
		adv = MADV_NOHUGEPAGE;
		break;
	default:
		adv = MADV_HUGEPAGE;
		a = 0;
		n = r->npages;
	}
	ret = madvise(r->addr + a * psz, n * psz, adv);
	if (ret && adv != MADV_COLLAPSE)
		judge("madvise", -1, errno, false, ERR_MADVISE);
	if (ret == 0 && adv == MADV_DONTNEED)
		for (size_t i = a; i < a + n; i++)
			r->shadow[i] = 0;
}

/* The child: its copy of word 0 matches the parent's, its writes stick.
 * The first mismatch is described on FD for the parent to report. */
static int child_run(uint64_t cseed, int fd)
{
	int bad = 0;
	uint64_t cs = cseed;
	char msg[256];

	for (int k = 0; k < 8; k++) {
		struct region *r = &regions[rng_next(&cs) % NREGIONS];
		size_t i;
		uint64_t v = 0, nv = 0xc0de0000ULL + k;
		char *page;
		int sig;

		if (!r->addr)
			continue;
		i = rng_next(&cs) % r->npages;
		page = r->addr + i * psz;
		sig = safe_access((uint64_t *)page, false, 0, &v);
		if (!sig && v != r->shadow[i] && !bad++)
			snprintf(msg, sizeof(msg), "child read %#" PRIx64 " at "
				 "page %zu of %p (%zu pages, state %d slot %d), "
				 "parent's word %#" PRIx64 ", child pagemap %#"
				 PRIx64, v, i, r->addr, r->npages, r->state,
				 r->slot, r->shadow[i], pagemap_entry(page));
		sig = safe_access((uint64_t *)page, true, nv, &v);
		if (!sig)
			r->shadow[i] = v;	/* the child's copy now */
		if (((sig && sig != SIGBUS) || (!sig && v != nv)) && !bad++)
			snprintf(msg, sizeof(msg), "child write of %#" PRIx64
				 " to page %zu of %p: signal %d, read back %#"
				 PRIx64, nv, i, r->addr, sig, v);
	}
	if (bad && write(fd, msg, strlen(msg)) < 0)
		bad++;
	/* The inherited fds act on the parent's mm; waking is harmless. */
	for (int i = 0; i < NSLOTS; i++)
		if (slots[i].fd >= 0 && regions[0].addr)
			uffd_wake(slots[i].fd, regions[0].addr, psz);
	if (rng_next(&cs) & 1)
		for (int i = 0; i < NREGIONS; i++)
			if (regions[i].addr)
				madvise(regions[i].addr, regions[i].npages * psz,
					MADV_DONTNEED);
	return bad > 100 ? 100 : bad;
}

static void op_fork(void)
{
	uint64_t cseed = rng_next(&rs);
	char msg[260] = "";
	long long end;
	int status, pfd[2];
	pid_t pid;

	op_name = "fork";
	if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK))
		return;
	pid = fork();
	if (pid == 0) {
		alarm(0);
		_exit(child_run(cseed, pfd[1]));
	}
	close(pfd[1]);
	checks[F_FORK]++;
	if (pid < 0) {
		if (errno != EAGAIN && errno != ENOMEM)
			failure(F_FORK, "fork: %s", strerror(errno));
		close(pfd[0]);
		return;
	}
	for (end = now_ms() + CHILD_WAIT_MS; now_ms() < end;) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			break;
		usleep(1000);
	}
	if (now_ms() >= end && waitpid(pid, &status, WNOHANG) != pid) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		failure(F_FORK, "child %d did not exit within %d ms", pid,
			CHILD_WAIT_MS);
		close(pfd[0]);
		return;
	}
	if (read(pfd[0], msg, sizeof(msg) - 1) < 0)
		msg[0] = 0;
	close(pfd[0]);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		failure(F_FORK, "child %d: %s %d: %s", pid,
			WIFEXITED(status) ? "exit" : "signal",
			WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
			msg);
}

/* ---- driver ------------------------------------------------------------- */

struct op { void (*fn)(void); unsigned int weight; const char *name; };

static long long now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

#define OP(fn, w) { fn, w, #fn }
static const struct op ops[] = {
	OP(op_write, 110), OP(op_read, 100), OP(op_writeprotect, 70),
	OP(op_register, 100), OP(op_unregister, 40), OP(op_copy_zero, 80),
	OP(op_wake_continue, 180), OP(op_wrong_fd, 120), OP(op_scan, 100),
	OP(op_api_garbage, 50), OP(op_slot_reopen, 4), OP(op_madvise, 10),
	OP(op_remap_region, 5), OP(op_mremap, 5), OP(op_fork, 1),
	OP(op_ring, 60),
};
#define NOPS (sizeof(ops) / sizeof(ops[0]))
static long long op_us[NOPS];
static unsigned long op_n[NOPS];

/* For a hang report: where each thread sleeps in the kernel. */
static void dump_tasks(void)
{
	char path[300], buf[2048];
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n, fd;

	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/stack",
			 e->d_name);
		fd = open(path, O_RDONLY);
		if (fd < 0)
			continue;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		for (int i = 0; i < n; i++)
			if (buf[i] == '\n')
				buf[i] = '|';
		printf("# task %s stack %.*s\n", e->d_name, n > 0 ? n : 0, buf);
	}
	if (d)
		closedir(d);
	for (int i = 0; i < NWRITERS; i++)
		printf("# writer %d at %#lx\n", i, writer_at[i]);
	printf("# resolver at %d, %d pending; last fault %#lx wp %lu err %d "
	       "seen %lu times in a row\n", resolver_at, npend, last_addr,
	       last_flags, last_err, last_count);
	{
		FILE *f = fopen("/proc/self/maps", "r");

		while (f && fgets(buf, sizeof(buf), f))
			printf("# maps %s", buf);
	}
	printf("# pagemap of last fault %#" PRIx64 "\n",
	       pagemap_entry((void *)last_addr));
}

static void on_alarm(int sig)
{
	char buf[160];
	int n;

	(void)sig;
	signal(SIGALRM, SIG_DFL);	/* a dump that deadlocks still ends */
	alarm(10);
	dump_tasks();
	n = snprintf(buf, sizeof(buf), "not ok 99 fuzz-watchdog # op %lu (%s) "
		     "took over %d s; replay with --seed %" PRIu64 "\n",
		     op_index, op_name, STALL_S, seed);
	if (write(1, buf, n) < 0)
		_exit(3);
	n = snprintf(buf, sizeof(buf), "# fuzz: ops=%lu seed=%" PRIu64
		     " invariant_failures=%lu hung\n", op_index, seed,
		     total_fails + 1);
	if (write(1, buf, n) < 0)
		_exit(3);
	_exit(3);
}

static void usage(void)
{
	fprintf(stderr, "usage: fuzz-uffd [--seed N] [--ops N] [--seconds S] "
		"[--ring]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	unsigned long nops = 100000, total_w = 0;
	long seconds = 0;
	long long start, deadline = 0;
	pthread_t res, wr[NWRITERS];
	pthread_rwlockattr_t ra;
	struct sigaction sa = { .sa_handler = on_fault, .sa_flags = SA_NODEFER };
	uint64_t got = 0;
	int fd;

	seed = 1;
	for (int i = 1; i < argc; i++) {
		char *end = NULL;

		if (!strcmp(argv[i], "--ring")) {
			want_ring = true;
			continue;
		}
		if (i + 1 >= argc)
			usage();
		if (!strcmp(argv[i], "--seed"))
			seed = strtoull(argv[++i], &end, 0);
		else if (!strcmp(argv[i], "--ops"))
			nops = strtoul(argv[++i], &end, 0);
		else if (!strcmp(argv[i], "--seconds"))
			seconds = strtol(argv[++i], &end, 0);
		else
			usage();
		if (!end || *end)
			usage();
	}
	if (seconds > 0 && nops == 100000)
		nops = ~0UL;
	psz = page_size();
	rs = seed;
	setvbuf(stdout, NULL, _IONBF, 0);
	if (nops == ~0UL)
		tap_diag("fuzz-uffd seed=%" PRIu64 " ops=unbounded seconds=%ld "
			 "ring=%d (replay: fuzz-uffd --seed %" PRIu64 " --ops N, "
			 "N from the summary line)", seed, seconds, want_ring,
			 seed);
	else
		tap_diag("fuzz-uffd seed=%" PRIu64 " ops=%lu seconds=%ld ring=%d "
			 "(replay: fuzz-uffd --seed %" PRIu64 " --ops %lu)", seed,
			 nops, seconds, want_ring, seed, nops);
	tap_plan(1 + F_N);
	signal(SIGALRM, on_alarm);
	alarm(STALL_S);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);

	fd = uffd_open_flags(O_CLOEXEC | O_NONBLOCK, 0, &got);
	if (fd < 0)
		tap_bail("userfaultfd: %s", strerror(-fd));
	close(fd);
	kernel_features = got;
	have_ring = got & UFFD_FEATURE_WP_RING;
	tap_diag("kernel features %#" PRIx64 "%s", got,
		 have_ring ? " (with WP_RING)" : " (no WP_RING: ring ops off)");
	scan_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	src_buf = map_anon_aligned(SRC_PAGES * psz, psz);
	zero_page = map_anon_aligned(psz, psz);
	if (scan_fd < 0 || !src_buf || !zero_page)
		tap_bail("setup: %s", strerror(errno));
	for (int i = 0; i < SRC_PAGES; i++)
		*(uint64_t *)(src_buf + i * psz) = 0xc0b1000000ULL + i;
	for (int i = 0; i < NSLOTS; i++)
		slots[i].fd = -1;
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra,
		PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&map_lock, &ra);
	for (int i = 0; i < NREGIONS; i++)
		region_new(&regions[i]);
	for (int i = 0; i < NSLOTS; i++)
		op_slot_reopen();
	if (pthread_create(&res, NULL, resolver_main, NULL))
		tap_bail("pthread_create failed");
	for (long i = 0; i < NWRITERS; i++)
		if (pthread_create(&wr[i], NULL, writer_main, (void *)i))
			tap_bail("pthread_create failed");

	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		total_w += ops[i].weight;
	start = now_ms();
	if (seconds > 0)
		deadline = start + seconds * 1000LL;
	for (op_index = 0; op_index < nops; op_index++) {
		unsigned long w = rnd(total_w);
		long long t0;
		size_t k = 0;

		if ((op_index & 255) == 0) {
			alarm(STALL_S);
			if (deadline && now_ms() >= deadline)
				break;
		}
		while (w >= ops[k].weight)
			w -= ops[k++].weight;
		if (ops[k].fn == op_ring && !have_ring)
			continue;
		t0 = now_us();
		ops[k].fn();
		op_us[k] += now_us() - t0;
		op_n[k]++;
	}
	/* Writers first: one may wait on a fault only the resolver answers. */
	op_name = "shutdown";
	stop_writers = 1;
	for (int i = 0; i < NWRITERS; i++)
		pthread_join(wr[i], NULL);
	stop_threads = 1;
	pthread_join(res, NULL);
	/* Final sweep: every word 0 the main thread wrote is still there. */
	for (int i = 0; i < NREGIONS; i++)
		for (size_t p = 0; regions[i].addr && p < regions[i].npages; p++)
			if (regions[i].shadow[p])
				check_word(&regions[i], p, "final sweep");
	for (int i = 0; i < NSLOTS; i++)
		slot_close(&slots[i]);

	for (size_t k = 0; k < NOPS; k++)
		if (op_n[k])
			tap_diag("%-18s %7lu ops %8lld ms", ops[k].name, op_n[k],
				 op_us[k] / 1000);
	if (have_ring)
		tap_diag("ring: %lu fds with WP_RING (last open error %d), %lu "
			 "rings set up (last valid-setup error %d)", ring_opens,
			 (int)ring_open_err, ring_setups, (int)ring_setup_err);
	tap_diag("UFFDIO_ZEROPAGE refused (EEXIST) a MISSING fault on a "
		 "uffd-wp marker %lu times; resolved with UFFDIO_COPY",
		 zeropage_marker_refusals);
	{
		char name[96];

		/* The counts go after "#": collect.py keeps the case name. */
		snprintf(name, sizeof(name), "fuzz-ops # %lu ops in %lld ms",
			 op_index, now_ms() - start);
		tap_pass(name);
	}
	for (int f = 0; f < F_N; f++) {
		char name[96];

		snprintf(name, sizeof(name), "%s # %lu checks", family_name[f],
			 checks[f]);
		if (f == F_RING && !have_ring) {
			if (want_ring)
				tap_fail(family_name[f], "--ring given but the "
					 "kernel does not report "
					 "UFFD_FEATURE_WP_RING");
			else
				tap_skip(family_name[f], "kernel does not report "
					 "UFFD_FEATURE_WP_RING");
			continue;
		}
		if (fails[f])
			tap_fail(family_name[f], "%lu of %lu checks failed (see "
				 "FAIL lines; replay with --seed %" PRIu64 ")",
				 fails[f], checks[f], seed);
		else
			tap_pass(name);
	}
	printf("# fuzz: ops=%lu seed=%" PRIu64 " invariant_failures=%lu\n",
	       op_index, seed, total_fails);
	alarm(0);
	return tap_done();
}
