// SPDX-License-Identifier: GPL-2.0
/*
 * race-wp: uffd-wp write protection racing the mm operations that move,
 * copy, split or drop page table entries, with writers running all along.
 *
 * Every case: writer threads each own a set of pages and store a sequence
 * number into their pages round after round, reading each store back at
 * once; a disruptor keeps write-protecting the whole region and racing one
 * operation against the writers:
 *   fork        fork() (the child checks its copy is unprotected and writes
 *               it), the child exits;
 *   thp-split   mprotect() and MADV_NOHUGEPAGE of parts of a THP, then
 *               MADV_HUGEPAGE/MADV_COLLAPSE, splitting and refusing collapse;
 *   migration   move_pages() of the region to the other NUMA node and back;
 *   swap        MADV_PAGEOUT of the region (zram swap);
 *   mremap      mremap() of the registered region back and forth without
 *               UFFD_FEATURE_EVENT_REMAP: the moved range loses its
 *               registration and must lose every uffd-wp bit with it.
 * Each runs once with sync WP (a resolver thread unprotects on each fault)
 * and once with UFFD_FEATURE_WP_ASYNC.  Checked: no write is lost (each
 * read-back, and every page's final value, is the writer's last store), no
 * writer is left blocked (watchdog), and afterwards protection still works:
 * a write to a protected page raises a WP fault (sync) or clears the bit
 * (async) -- the operation left no writable pte behind a uffd-wp bit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"


#define NW		2
#define ROUNDS		1000000	/* in practice RUN_MS ends it */
#define RUN_MS		3000	/* writers per variant */
#define WAIT_MS		5000
#define WHY_LEN		300

static long psz;

static bool fail(char *why, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static bool fail(char *why, const char *fmt, ...)
{
	va_list ap;

	if (why[0])
		return false;	/* keep the first reason */
	va_start(ap, fmt);
	vsnprintf(why, WHY_LEN, fmt, ap);
	va_end(ap);
	return false;
}

struct race {
	char *volatile base;
	size_t npages;
	int uffd;
	bool async;
	bool moving;		/* SIGSEGV is expected (mremap) */
	volatile int stop;	/* resolver */
	volatile int writers_done;
	uint64_t *last;		/* per page: the last store that returned */
	volatile unsigned long lost, segv, faults;
	char why[WHY_LEN];
	pthread_mutex_t why_lock;
};

static __thread sigjmp_buf segv_jmp;
static __thread volatile int segv_armed;

static void on_segv(int sig)
{
	if (segv_armed) {
		segv_armed = 0;
		siglongjmp(segv_jmp, sig);
	}
	signal(sig, SIG_DFL);
}

/* ---- writers ------------------------------------------------------------ */

/* Store V into page P's word 0 at the current base and load it back: 0, or
 * the signal that hit (SIGSEGV while the region is being moved). */
static __attribute__((noinline)) int store_load(struct race *r, size_t p,
						 uint64_t v, uint64_t *back)
{
	volatile uint64_t *word;
	int sig = sigsetjmp(segv_jmp, 1);

	if (sig)
		return sig;
	segv_armed = 1;
	word = (uint64_t *)(r->base + p * psz);
	*word = v;
	*back = *word;
	segv_armed = 0;
	return 0;
}

struct wctx {
	struct race *r;
	int id;
	pthread_t thread;
};

static void *writer_main(void *arg)
{
	struct wctx *w = arg;
	struct race *r = w->r;
	long long end = now_ms() + RUN_MS;

	for (uint64_t round = 1; round <= ROUNDS && now_ms() < end; round++) {
		for (size_t p = w->id; p < r->npages; p += NW) {
			uint64_t v = (round << 20) | p, back = 0;
			int tries = 0;

			while (store_load(r, p, v, &back)) {
				r->segv++;
				if (!r->moving || ++tries > 100000)
					break;
				usleep(50);
			}
			if (back != v) {
				r->lost++;
				pthread_mutex_lock(&r->why_lock);
				fail(r->why, "writer %d: page %zu read back %#"
				     PRIx64 " right after storing %#" PRIx64
				     " (round %" PRIu64 ")", w->id, p, back, v,
				     round);
				pthread_mutex_unlock(&r->why_lock);
				continue;
			}
			r->last[p] = v;
		}
	}
	__atomic_add_fetch(&r->writers_done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

/* ---- resolver: unprotect the faulting page; wake if that fails --------- */

static void *resolver_main(void *arg)
{
	struct race *r = arg;

	while (!r->stop) {
		struct uffd_msg m;
		unsigned long a;

		if (uffd_read_msg(r->uffd, &m, 20) != 1 ||
		    m.event != UFFD_EVENT_PAGEFAULT)
			continue;
		a = m.arg.pagefault.address & ~(psz - 1);
		r->faults++;
		if (uffd_wp(r->uffd, (void *)a, psz, 0))
			uffd_wake(r->uffd, (void *)a, psz);
	}
	return NULL;
}

/* ---- the harness ---------------------------------------------------------- */

typedef void (*disrupt_fn)(struct race *r, int iter);

/* mremap case: the region moves between the halves of this area. */
static char *mremap_area;

static int setup_uffd(struct race *r)
{
	uint64_t f = UFFD_FEATURE_PAGEFAULT_FLAG_WP;
	int err;

	if (r->async)
		f |= UFFD_FEATURE_WP_ASYNC;
	r->uffd = uffd_open(f, NULL);
	if (r->uffd < 0)
		return r->uffd;
	err = uffd_register(r->uffd, r->base, r->npages * psz,
			    UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		err = uffd_wp(r->uffd, r->base, r->npages * psz,
			      UFFDIO_WRITEPROTECT_MODE_WP);
	return err;
}

/*
 * Protection still works on the region: a write to a protected page raises
 * a WP fault (sync) or clears its bit (async).  Needs the range registered.
 */
static void check_wp_works(struct race *r)
{
	for (size_t p = 0; p < r->npages; p += r->npages / 8) {
		char *page = r->base + p * psz;
		struct writer w;
		struct uffd_msg m;
		int err = uffd_wp(r->uffd, page, psz, UFFDIO_WRITEPROTECT_MODE_WP);

		if (err) {
			fail(r->why, "protect page %zu afterwards: %s", p,
			     strerror(-err));
			return;
		}
		if (!page_wp(page)) {
			fail(r->why, "page %zu: no uffd-wp bit right after "
			     "UFFDIO_WRITEPROTECT", p);
			return;
		}
		writer_start(&w, page + 8, 8, 'z');	/* not word 0 */
		if (!r->async) {
			if (uffd_read_msg(r->uffd, &m, WAIT_MS) != 1 ||
			    m.event != UFFD_EVENT_PAGEFAULT ||
			    !(m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)) {
				fail(r->why, "page %zu: a write to the protected "
				     "page raised no WP fault (done %d)", p,
				     w.done);
				uffd_wake(r->uffd, page, psz);
			}
			uffd_wp(r->uffd, page, psz, 0);
		}
		if (!writer_wait(&w, WAIT_MS)) {
			fail(r->why, "page %zu: writer blocked", p);
			uffd_wp(r->uffd, page, psz, 0);
			writer_wait(&w, WAIT_MS);
			return;
		}
		if (page_wp(page))
			fail(r->why, "page %zu: uffd-wp bit still set after the "
			     "write completed", p);
	}
}

static bool run_variant(size_t npages, bool thp, bool async, bool moving,
			disrupt_fn disrupt, char *why)
{
	struct race r = { .npages = npages, .async = async, .moving = moving };
	struct wctx w[NW];
	pthread_t res;
	int err, iter = 0;
	char *mem;

	pthread_mutex_init(&r.why_lock, NULL);
	if (moving) {	/* two halves of a reserved area; it starts in one */
		mremap_area = mmap(NULL, 2 * npages * psz, PROT_NONE,
				   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
				   -1, 0);
		mem = mremap_area == MAP_FAILED ? NULL :
		      mmap(mremap_area, npages * psz, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		if (mem == MAP_FAILED)
			mem = NULL;
	} else {
		mem = map_anon_aligned(npages * psz,
				       thp ? HPAGE_SIZE : (size_t)psz);
	}
	r.last = calloc(npages, sizeof(uint64_t));
	if (!mem || !r.last)
		return fail(why, "mmap: %s", strerror(errno));
	if (thp)
		madvise(mem, npages * psz, MADV_HUGEPAGE);
	for (size_t p = 0; p < npages; p++)
		mem[p * psz + 64] = 1;	/* populate */
	r.base = mem;
	err = setup_uffd(&r);
	if (err)
		return fail(why, "userfaultfd setup: %s", strerror(-err));
	if (!async)
		pthread_create(&res, NULL, resolver_main, &r);
	for (int i = 0; i < NW; i++) {
		w[i] = (struct wctx){ .r = &r, .id = i };
		pthread_create(&w[i].thread, NULL, writer_main, &w[i]);
	}
	while (__atomic_load_n(&r.writers_done, __ATOMIC_SEQ_CST) < NW) {
		disrupt(&r, iter++);
		if (!moving)
			uffd_wp(r.uffd, r.base, npages * psz,
				UFFDIO_WRITEPROTECT_MODE_WP);
	}
	for (int i = 0; i < NW; i++)
		pthread_join(w[i].thread, NULL);
	for (size_t p = 0; p < npages; p++) {
		uint64_t v = *(volatile uint64_t *)(r.base + p * psz);

		if (v != r.last[p]) {
			r.lost++;
			fail(r.why, "page %zu holds %#" PRIx64 ", its writer's "
			     "last store was %#" PRIx64, p, v, r.last[p]);
		}
	}
	if (r.segv && !moving)
		fail(r.why, "%lu SIGSEGVs in writers", r.segv);
	if (moving) {	/* the range ended unregistered: register it again */
		uffd_unregister(r.uffd, r.base, npages * psz);
		err = uffd_register(r.uffd, r.base, npages * psz,
				    UFFDIO_REGISTER_MODE_WP, NULL);
		if (err)
			fail(r.why, "register again: %s", strerror(-err));
	}
	r.stop = 1;	/* the check reads the messages itself */
	if (!async)
		pthread_join(res, NULL);
	if (!r.why[0])
		check_wp_works(&r);
	tap_diag("  %s: %d disruptions, %lu WP faults resolved, %lu SIGSEGV "
		 "retries, %lu lost writes", async ? "async" : "sync", iter,
		 r.faults, r.segv, r.lost);
	close(r.uffd);
	munmap(moving ? mremap_area : r.base, (moving ? 2 : 1) * npages * psz);
	free(r.last);
	memcpy(why, r.why, WHY_LEN);
	return !why[0];
}

static void run_case(const char *name, size_t npages, bool thp, bool moving,
		     disrupt_fn disrupt)
{
	char why[WHY_LEN] = "";
	bool ok;

	tap_diag("%s", name);
	ok = run_variant(npages, thp, false, moving, disrupt, why);
	if (ok)
		ok = run_variant(npages, thp, true, moving, disrupt, why);
	tap_check(ok, name, "%s", why);
}

/* ---- disruptors ----------------------------------------------------------- */

static void disrupt_fork(struct race *r, int iter)
{
	int status;
	pid_t pid = fork();

	(void)iter;
	if (pid == 0) {
		int bad = 0;

		for (size_t p = 0; p < r->npages; p++) {
			char *page = r->base + p * psz;

			/* No EVENT_FORK: the child's copy is not protected. */
			if (pagemap_entry(page) & PM_UFFD_WP)
				bad |= 1;
			*(volatile uint64_t *)(page + 16) = p;
			if (*(volatile uint64_t *)(page + 16) != p)
				bad |= 2;
		}
		_exit(bad);
	}
	if (pid < 0)
		return;
	waitpid(pid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		fail(r->why, "fork child: status %#x (1: its copy had uffd-wp "
		     "bits, 2: its write did not stick)", status);
}

static void disrupt_thp(struct race *r, int iter)
{
	size_t off = (iter * 37 % (r->npages - 32)) & ~7UL;
	char *a = r->base + off * psz;

	mprotect(a, 16 * psz, PROT_READ | PROT_WRITE | PROT_EXEC);
	madvise(r->base + ((off + 128) % (r->npages - 64)) * psz, 64 * psz,
		MADV_NOHUGEPAGE);
	mprotect(a, 16 * psz, PROT_READ | PROT_WRITE);
	madvise(r->base, r->npages * psz, MADV_HUGEPAGE);
	if (iter % 8 == 7)
		madvise(r->base, HPAGE_SIZE, MADV_COLLAPSE);
}

static void disrupt_migrate(struct race *r, int iter)
{
	enum { N = 64 };
	void *pages[N];
	int nodes[N], status[N];
	size_t n = r->npages < N ? r->npages : N;

	for (size_t i = 0; i < n; i++) {
		pages[i] = r->base + i * psz;
		nodes[i] = iter & 1;
	}
	if (sys_move_pages(n, pages, nodes, status, MPOL_MF_MOVE) < 0)
		fail(r->why, "move_pages to node %d: %s", iter & 1,
		     strerror(errno));
}

static void disrupt_swap(struct race *r, int iter)
{
	(void)iter;
	if (madvise(r->base, r->npages * psz, MADV_PAGEOUT))
		fail(r->why, "MADV_PAGEOUT: %s", strerror(errno));
}


static void disrupt_mremap(struct race *r, int iter)
{
	size_t len = r->npages * psz;
	char *from = r->base, *to = from == mremap_area ? mremap_area + len :
				    mremap_area;
	char *p;
	int err;

	(void)iter;
	err = uffd_register(r->uffd, from, len, UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		err = uffd_wp(r->uffd, from, len, UFFDIO_WRITEPROTECT_MODE_WP);
	if (err) {
		fail(r->why, "register/protect at %p: %s", from, strerror(-err));
		return;
	}
	p = mremap(from, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to);
	if (p == MAP_FAILED) {
		fail(r->why, "mremap: %s", strerror(errno));
		return;
	}
	r->base = p;
	/* Without EVENT_REMAP the moved range is not registered... */
	err = uffd_wp(r->uffd, p, len, UFFDIO_WRITEPROTECT_MODE_WP);
	if (err != -ENOENT)
		fail(r->why, "UFFDIO_WRITEPROTECT of the moved range returned "
		     "%d, expected -ENOENT (not registered)", err);
	/* ... and must carry no uffd-wp bit (only writers run: they clear). */
	for (size_t i = 0; i < r->npages; i++)
		if (page_wp(p + i * psz)) {
			fail(r->why, "page %zu keeps its uffd-wp bit after "
			     "mremap without EVENT_REMAP (pagemap %#" PRIx64
			     ")", i, pagemap_entry(p + i * psz));
			break;
		}
	/* Keep the old half reserved so nothing else lands there. */
	mmap(from, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
	     MAP_NORESERVE, -1, 0);
}

static bool have_node1(void)
{
	return access("/sys/devices/system/node/node1", F_OK) == 0;
}

int main(void)
{
	struct sigaction sa = { .sa_handler = on_segv, .sa_flags = SA_NODEFER };
	int fd;

	psz = page_size();
	watchdog(280);
	sigaction(SIGSEGV, &sa, NULL);
	tap_plan(5);
	fd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_ASYNC,
		       NULL);
	if (fd < 0)
		tap_bail("userfaultfd with WP_ASYNC: %s", strerror(-fd));
	close(fd);
	run_case("race-wp-vs-fork", 64, false, false, disrupt_fork);
	run_case("race-wp-vs-thp-split", 1024, true, false, disrupt_thp);
	if (have_node1())
		run_case("race-wp-vs-migration", 64, false, false,
			 disrupt_migrate);
	else
		tap_skip("race-wp-vs-migration", "the guest has one NUMA node");
	run_case("race-wp-vs-swap-out", 64, false, false, disrupt_swap);
	run_case("race-wp-vs-mremap-no-event-remap", 64, false, true,
		 disrupt_mremap);
	return tap_done();
}
