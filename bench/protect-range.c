// SPDX-License-Identifier: GPL-2.0
/*
 * protect-range: what it costs to write-protect and unprotect a populated
 * anonymous range in one call, UFFDIO_WRITEPROTECT against mprotect, with
 * and without THP, and how long another thread's mmap_lock users stall
 * meanwhile.
 *
 * One configuration = variant x size x THP.  Its range is mapped 2 MiB
 * aligned, madvised (MADV_HUGEPAGE / MADV_NOHUGEPAGE) and written once; each
 * repetition then times one protect call and one unprotect call over the
 * whole range while a prober thread loops mmap + touch + munmap of a private
 * page, logging when each iteration started and ended.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench_util.h"
#include "uffd_util.h"

#define BENCH "protect-range"
#define PSZ 4096UL
#define SAMPLES 64

enum variant { UFFD, MPROTECT };
static const char *const variant_name[] = { "uffd", "mprotect" };

/* ---- the prober: mmap + touch + munmap in a loop ------------------------ */

#define LOG_MAX (1UL << 20)

struct span {
	uint64_t s, e;
};

static struct span *plog;	/* LOG_MAX entries, written by the prober */
static unsigned long plog_n;	/* entries logged (release/acquire) */
static int prober_stop;
static int prober_err;

static void *prober_main(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&prober_stop, __ATOMIC_ACQUIRE)) {
		uint64_t s = bench_now_ns(), e;
		char *p = mmap(NULL, PSZ, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (p == MAP_FAILED) {
			prober_err = errno;
			return NULL;
		}
		*(volatile char *)p = 1;
		munmap(p, PSZ);
		e = bench_now_ns();
		if (plog_n == LOG_MAX) {
			prober_err = ENOSPC;
			return NULL;
		}
		plog[plog_n] = (struct span){ s, e };
		__atomic_store_n(&plog_n, plog_n + 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static pthread_t prober_start(void)
{
	pthread_t t;

	plog_n = 0;
	prober_stop = 0;
	prober_err = 0;
	errno = pthread_create(&t, NULL, prober_main, NULL);
	if (errno)
		bench_fail("pthread_create: %s", strerror(errno));
	/* Let it settle into its loop before the first window. */
	while (__atomic_load_n(&plog_n, __ATOMIC_ACQUIRE) < 3 && !prober_err)
		sched_yield();
	return t;
}

/* Stop the prober once an iteration began after AFTER (so the one that
 * straddled the end of the last window is logged). */
static void prober_stop_after(pthread_t t, uint64_t after)
{
	for (;;) {
		unsigned long n = __atomic_load_n(&plog_n, __ATOMIC_ACQUIRE);

		if (prober_err || (n && plog[n - 1].s > after))
			break;
		sched_yield();
	}
	__atomic_store_n(&prober_stop, 1, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	if (prober_err)
		bench_fail("prober: %s%s", strerror(prober_err),
			   prober_err == ENOSPC ? " (iteration log full)" : "");
}

static bool overlaps(const struct span *it, const struct span *w)
{
	return it->e >= w->s && it->s <= w->e;
}

/* Longest prober iteration overlapping one of the two windows; *OUTSIDE
 * gets the longest one overlapping neither (the noise floor). */
static uint64_t longest_stall(const struct span w[2], uint64_t *outside)
{
	uint64_t in = 0, out = 0;

	for (unsigned long i = 0; i < plog_n; i++) {
		uint64_t d = plog[i].e - plog[i].s;

		if (overlaps(&plog[i], &w[0]) || overlaps(&plog[i], &w[1])) {
			if (d > in)
				in = d;
		} else if (d > out) {
			out = d;
		}
	}
	*outside = out;
	return in;
}

/* ---- probes: does a write fault? -------------------------------------- */

static sigjmp_buf probe_jmp;
static volatile int probe_armed;
static volatile int probe_sig;

static void on_probe_fault(int sig)
{
	if (!probe_armed)
		_exit(1);	/* not ours: SIG_DFL would be the same */
	probe_sig = sig;
	siglongjmp(probe_jmp, 1);
}

/* Write to P once; returns 0 when the write went through, else the signal
 * it raised (SIGSEGV for mprotect, SIGBUS for uffd-wp with FEATURE_SIGBUS).
 * The faulting write is abandoned, so memory stays untouched. */
static int probe_write(char *p, char val)
{
	probe_sig = 0;
	if (sigsetjmp(probe_jmp, 1) == 0) {
		probe_armed = 1;
		*(volatile char *)p = val;
	}
	probe_armed = 0;
	return probe_sig;
}

static void install_probe_handlers(void)
{
	struct sigaction sa = { .sa_handler = on_probe_fault };

	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, NULL) || sigaction(SIGBUS, &sa, NULL))
		bench_fail("sigaction: %s", strerror(errno));
}

/* ---- one configuration ----------------------------------------------- */

struct config {
	enum variant v;
	size_t mib;
	bool thp;
};

static char *sample(char *mem, size_t len, int i)
{
	size_t pages = len / PSZ;

	/* First, last and evenly spaced pages in between, with an odd
	 * offset so small and huge page boundaries both get hit. */
	return mem + (i == SAMPLES - 1 ? pages - 1 :
		      (size_t)i * pages / SAMPLES + (i & 7)) * PSZ;
}

static void check_protected(const struct config *c, char *mem, size_t len,
			    const char *param)
{
	for (int i = 0; i < SAMPLES; i++) {
		char *p = sample(mem, len, i);
		int sig;

		if (c->v == UFFD && !(pagemap_entry(p) & PM_UFFD_WP))
			bench_fail("%s %s: page at +%#lx not uffd-wp after "
				   "protect", variant_name[c->v], param,
				   (unsigned long)(p - mem));
		sig = probe_write(p, 0x55);
		if (sig != (c->v == UFFD ? SIGBUS : SIGSEGV))
			bench_fail("%s %s: probe write at +%#lx after protect "
				   "got signal %d", variant_name[c->v], param,
				   (unsigned long)(p - mem), sig);
	}
}

static void check_unprotected(const struct config *c, char *mem, size_t len,
			      const char *param, char val)
{
	for (int i = 0; i < SAMPLES; i++) {
		char *p = sample(mem, len, i);
		int sig;

		if (c->v == UFFD && (pagemap_entry(p) & PM_UFFD_WP))
			bench_fail("%s %s: page at +%#lx still uffd-wp after "
				   "unprotect", variant_name[c->v], param,
				   (unsigned long)(p - mem));
		sig = probe_write(p, val);
		if (sig || *p != val)
			bench_fail("%s %s: write at +%#lx after unprotect: "
				   "signal %d, reads %d", variant_name[c->v],
				   param, (unsigned long)(p - mem), sig, *p);
	}
}

static int do_protect(const struct config *c, int uffd, char *mem, size_t len,
		      bool on)
{
	if (c->v == UFFD)
		return uffd_wp(uffd, mem, len, on ? UFFDIO_WRITEPROTECT_MODE_WP : 0);
	return mprotect(mem, len, on ? PROT_READ : PROT_READ | PROT_WRITE) ?
	       -errno : 0;
}

static void run_config(const struct config *c, int reps)
{
	size_t len = c->mib << 20;
	char param[64], *mem;
	long huge_kb;
	int uffd = -1, err;

	snprintf(param, sizeof(param), "size_mib=%zu;thp=%s", c->mib,
		 c->thp ? "on" : "off");
	mem = map_anon_aligned(len, HPAGE_SIZE);
	if (!mem)
		bench_fail("mmap %zu MiB: %s", c->mib, strerror(errno));
	if (madvise(mem, len, c->thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE))
		bench_fail("madvise %s: %s", c->thp ? "MADV_HUGEPAGE" :
			   "MADV_NOHUGEPAGE", strerror(errno));
	for (size_t off = 0; off < len; off += PSZ)
		mem[off] = 1;
	huge_kb = smaps_field_kb(mem, "AnonHugePages");
	bench_comment("%s %s: AnonHugePages %ld kB of %zu kB after populating",
		      variant_name[c->v], param, huge_kb, len >> 10);
	if (huge_kb < 0)
		bench_fail("no AnonHugePages for the range in /proc/self/smaps");
	if (!c->thp && huge_kb)
		bench_fail("%s: THP off yet %ld kB AnonHugePages", param, huge_kb);
	if (c->thp && !huge_kb)
		bench_fail("%s: MADV_HUGEPAGE gave no huge pages (THP disabled "
			   "in /sys/kernel/mm/transparent_hugepage?)", param);

	if (c->v == UFFD) {
		uint64_t ioctls = 0;

		/* FEATURE_SIGBUS: a page wrongly left protected raises SIGBUS
		 * at the probe instead of blocking the writer forever. */
		uffd = uffd_open(UFFD_FEATURE_SIGBUS, NULL);
		if (uffd < 0)
			bench_fail("userfaultfd: %s", strerror(-uffd));
		err = uffd_register(uffd, mem, len, UFFDIO_REGISTER_MODE_WP, &ioctls);
		if (err)
			bench_fail("UFFDIO_REGISTER mode WP: %s", strerror(-err));
		if (!(ioctls & (1ULL << _UFFDIO_WRITEPROTECT)))
			bench_fail("UFFDIO_REGISTER offers no UFFDIO_WRITEPROTECT");
	}

	for (int rep = 0; rep < reps; rep++) {
		struct span w[2];
		uint64_t stall, outside;
		pthread_t prober;

		/* Timed calls, no other thread running in this mm. */
		w[0].s = bench_now_ns();
		err = do_protect(c, uffd, mem, len, true);
		w[0].e = bench_now_ns();
		if (err)
			bench_fail("%s %s: protect: %s", variant_name[c->v],
				   param, strerror(-err));
		check_protected(c, mem, len, param);
		w[1].s = bench_now_ns();
		err = do_protect(c, uffd, mem, len, false);
		w[1].e = bench_now_ns();
		if (err)
			bench_fail("%s %s: unprotect: %s", variant_name[c->v],
				   param, strerror(-err));
		check_unprotected(c, mem, len, param, 2 + rep % 100);
		bench_sample(BENCH, variant_name[c->v], param, "protect_us",
			     (w[0].e - w[0].s) / 1e3, "us");
		bench_sample(BENCH, variant_name[c->v], param, "unprotect_us",
			     (w[1].e - w[1].s) / 1e3, "us");

		/* The same pair again with the prober running. */
		prober = prober_start();
		w[0].s = bench_now_ns();
		err = do_protect(c, uffd, mem, len, true);
		w[0].e = bench_now_ns();
		if (!err) {
			check_protected(c, mem, len, param);
			w[1].s = bench_now_ns();
			err = do_protect(c, uffd, mem, len, false);
			w[1].e = bench_now_ns();
		}
		prober_stop_after(prober, w[1].e);
		if (err)
			bench_fail("%s %s: protect/unprotect with the prober: %s",
				   variant_name[c->v], param, strerror(-err));
		check_unprotected(c, mem, len, param, 3 + rep % 100);
		stall = longest_stall(w, &outside);
		bench_sample(BENCH, variant_name[c->v], param, "stall_us",
			     stall / 1e3, "us");
		if (rep == reps - 1)
			bench_comment("%s %s: last rep: %lu prober iterations, "
				      "longest outside the windows %.1f us; "
				      "protect %.1f us, unprotect %.1f us with the "
				      "prober running", variant_name[c->v], param,
				      plog_n, outside / 1e3,
				      (w[0].e - w[0].s) / 1e3,
				      (w[1].e - w[1].s) / 1e3);
	}
	huge_kb = smaps_field_kb(mem, "AnonHugePages");
	bench_comment("%s %s: AnonHugePages %ld kB after the repetitions",
		      variant_name[c->v], param, huge_kb);
	if (uffd >= 0)
		close(uffd);
	if (munmap(mem, len))
		bench_fail("munmap: %s", strerror(errno));
}

int main(int argc, char **argv)
{
	static const size_t full_mib[] = { 64, 1024 };
	static const size_t quick_mib[] = { 8 };
	struct bench_opts o;
	const size_t *sizes;
	size_t nsizes;
	uint64_t start = bench_now_ns();

	bench_parse_args(argc, argv, &o, 5);
	sizes = o.quick ? quick_mib : full_mib;
	nsizes = o.quick ? 1 : 2;
	if (sysconf(_SC_PAGESIZE) != (long)PSZ)
		bench_fail("page size is %ld, this benchmark assumes 4096",
			   sysconf(_SC_PAGESIZE));
	plog = mmap(NULL, LOG_MAX * sizeof(*plog), PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (plog == MAP_FAILED)
		bench_fail("mmap prober log: %s", strerror(errno));
	install_probe_handlers();

	bench_comment("protect-range: one call write-protecting (protect_us) and "
		      "one unprotecting (unprotect_us) a whole populated private "
		      "anonymous range; uffd = UFFDIO_WRITEPROTECT mode WP / mode 0 "
		      "on a range registered MODE_WP, mprotect = PROT_READ / "
		      "PROT_READ|PROT_WRITE");
	bench_comment("thp=on: MADV_HUGEPAGE, thp=off: MADV_NOHUGEPAGE before "
		      "populating (AnonHugePages from /proc/self/smaps below)");
	bench_comment("protect_us/unprotect_us are timed with no other thread "
		      "in the process; then each rep protects and unprotects once "
		      "more with a prober thread looping mmap + write + munmap of "
		      "one private page (mmap/munmap need mmap_lock for writing; "
		      "the write faults under the per-VMA lock), logging each "
		      "iteration's start and end");
	bench_comment("stall_us = the longest prober iteration overlapping that "
		      "second protect or unprotect call, nothing subtracted (the "
		      "noise floor, the longest iteration outside the windows, "
		      "is in a comment per configuration)");
	bench_comment("checks per rep: 64 sample pages are uffd-wp (pagemap bit "
		      "57) / a probe write faults (SIGBUS, SIGSEGV) after protect, "
		      "and writes succeed after unprotect; %d repetitions per "
		      "figure", o.reps);

	for (size_t s = 0; s < nsizes; s++)
		for (int thp = 1; thp >= 0; thp--)
			for (int v = UFFD; v <= MPROTECT; v++) {
				struct config c = {
					.v = v, .mib = sizes[s], .thp = thp,
				};

				run_config(&c, o.reps);
			}
	bench_comment("protect-range done in %.1f s",
		      (bench_now_ns() - start) / 1e9);
	return 0;
}
