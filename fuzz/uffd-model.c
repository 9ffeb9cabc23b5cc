// SPDX-License-Identifier: GPL-2.0
/*
 * fuzz-uffd's model: the PRNG, the pool of userfaultfds and regions with
 * word 0's shadow values, the resolver and writer threads, the range
 * picker, and the invariants' bookkeeping (failure(), judge(),
 * check_word()).  The invariants themselves are listed in fuzz/uffd.c.
 */
#define _GNU_SOURCE
#include "uffd.h"

/* ---- the run's state: the families' counts, where the run is ------------ */

const char *const family_name[F_N] = {
	"fuzz-readback", "fuzz-wp-cleared-on-write", "fuzz-sigbus-only-when-asked",
	"fuzz-ioctl-errno", "fuzz-fork-children", "fuzz-ring",
};
unsigned long fails[F_N], checks[F_N];
unsigned long total_fails, op_index;
const char *volatile op_name = "start";
uint64_t seed;
long psz;
char args[160];	/* the current call's arguments, for reports */

/* ---- PRNG (splitmix64: deterministic per seed) -------------------------- */

uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

uint64_t rs;	/* the main thread's stream */

uint64_t rnd(uint64_t n)
{
	return n ? rng_next(&rs) % n : 0;
}

bool chance(unsigned int percent)
{
	return rnd(100) < percent;
}

/* ---- reporting ---------------------------------------------------------- */

void failure(enum family f, const char *fmt, ...)
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
void judge(const char *what, int ret, int e, bool must_fail,
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

struct slot slots[NSLOTS];
struct region regions[NREGIONS];
pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
volatile int main_wants_pool;	/* the resolver steps aside */
unsigned long ring_opens, ring_setups, ring_open_err, ring_setup_err;
pthread_rwlock_t map_lock;	/* writers read, main changes maps */
uint64_t kernel_features;
bool have_ring, want_ring;
volatile int stop_threads, stop_writers;
char *src_buf;
int scan_fd = -1;
/* Where every thread is, for a hang report. */
volatile unsigned long writer_at[NWRITERS];
volatile int resolver_at;
volatile unsigned long last_addr, last_flags, last_count;
volatile int last_err;
volatile unsigned long zeropage_marker_refusals;
char *zero_page;

bool pool_has_sigbus(void)
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

void on_fault(int sig)
{
	if (fault_armed) {
		fault_armed = 0;
		siglongjmp(fault_jmp, sig);
	}
	signal(sig, SIG_DFL);	/* not ours: die on the retry */
}

/* Store VAL at P (or just load when !STORE): 0, or the signal that hit. */
int safe_access(volatile uint64_t *p, bool store, uint64_t val,
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
int npend;

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

void *resolver_main(void *arg)
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

void *writer_main(void *arg)
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

void region_new(struct region *r)
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

void region_drop(struct region *r)
{
	if (!r->addr)
		return;
	munmap(r->addr, (r->npages + r->guard) * psz);
	free(r->shadow);
	r->addr = NULL;
	r->shadow = NULL;
}

struct region *pick_region(void)
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

static struct range pick_range_(struct region *r);

struct range pick_range(struct region *r)
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

struct slot *pick_slot(void)
{
	struct slot *s = &slots[rnd(NSLOTS)];

	return s->fd >= 0 ? s : NULL;
}

void check_word(struct region *r, size_t i, const char *when)
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
