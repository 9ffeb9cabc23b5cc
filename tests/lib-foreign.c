// SPDX-License-Identifier: GPL-2.0
/*
 * lib-foreign: libuffdwp against what the program does to tracked memory
 * behind the library's back (issue #35, the items left open).
 *
 *  - The program's own mprotect() (munmap(), mmap()) on memory an mprotect
 *    or soft-dirty tracker holds: made writable again, its writes are not
 *    lost (collect says -ESTALE, then reports every page of the region,
 *    round after round); made PROT_NONE, or read-only again after the
 *    tracker made a page writable, a fault there is the program's (the
 *    process dies of SIGSEGV as without the library, or the program's
 *    own handler gets it), and no collect or free gives write access
 *    back.
 *  - Another thread's stack (found with pthread_getattr_np(3)) inside a
 *    tracked or snapshotted region while that thread keeps calling
 *    functions: every backend, snapshots and sessions either work or
 *    refuse with an error (-EDEADLK for mprotect and soft-dirty, whose
 *    SIGSEGV handler would have to run on that stack); never a hang, never
 *    a signal.  The same with the thread parked (asleep in read(2)), so
 *    that its pages stay protected until the free.
 *
 * Every case runs in a child with a watchdog (alarm(2)).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "uffdwp.h"

static size_t psz;

/* FN(ARG) in a child with a watchdog of SECS: "exit N" or "signal N". */
static int in_child(void (*fn)(int), int arg, unsigned int secs)
{
	int st;
	pid_t pid = tap_fork_case(secs);

	if (pid == 0) {
		fn(arg);
		_exit(0);
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return st;
}

static const char *status_text(int st, char *buf, size_t len)
{
	if (WIFSIGNALED(st))
		snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(st),
			 strsignal(WTERMSIG(st)));
	else
		snprintf(buf, len, "exit %d", WEXITSTATUS(st));
	return buf;
}

/* PAGES pages between PROT_NONE guards (a VMA of their own). */
static char *map_guarded(size_t pages)
{
	char *p = mmap(NULL, (pages + 2) * psz, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		tap_leave(1, "mmap: %s", strerror(errno));
	mprotect(p, psz, PROT_NONE);
	mprotect(p + (pages + 1) * psz, psz, PROT_NONE);
	madvise(p + psz, pages * psz, MADV_NOHUGEPAGE);
	memset(p + psz, 1, pages * psz);
	return p + psz;
}

/* The "rwx" of the mapping holding P, from /proc/self/maps. */
static void perms_of(const void *p, char out[4])
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512], perms[8];
	unsigned long lo, hi;

	strcpy(out, "?");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 &&
		    (uintptr_t)p >= lo && (uintptr_t)p < hi) {
			memcpy(out, perms, 3);
			out[3] = 0;
			break;
		}
	if (f)
		fclose(f);
}

/* Collect one round: a bit per page of [BASE, BASE + PAGES pages) in
 * *SET; the count, or the error. */
static long round_of(struct uffdwp_tracker *t, char *base, size_t pages,
		     uint64_t *set)
{
	void *pg[64];
	long total = 0;
	ssize_t n;

	*set = 0;
	do {
		n = uffdwp_tracker_collect(t, pg, 64);
		if (n < 0)
			return n;
		for (ssize_t i = 0; i < n; i++) {
			size_t k = (size_t)((char *)pg[i] - base) / psz;

			if (k < pages)
				*set |= 1ULL << k;
			total++;
		}
	} while (n == 64);
	return total;
}

/* A tracker of backend B on 8 pages between guards (at *P); the child
 * ends with CODE when there is none. */
static struct uffdwp_tracker *track_guarded(char **p, int b, int code)
{
	struct uffdwp_region r = { map_guarded(8), 8 * psz };
	struct uffdwp_tracker *t;

	*p = r.addr;
	if (uffdwp_tracker_new(&t, &r, 1, b))
		tap_leave(code, "tracker_new failed");
	return t;
}

static const enum uffdwp_backend segv_backends[] = {
	UFFDWP_BACKEND_MPROTECT, UFFDWP_BACKEND_SOFT_DIRTY,
};

/* ---- the program's own mprotect() ---- */

/*
 * Made writable again (mprotect backend: writes then raise no fault),
 * or (soft-dirty) read-only: the collect after it says -ESTALE, the next
 * calls report every page of the region, and so does every later round;
 * the protection the program set stays, through collects and free.
 */
static void c_made_writable(int b)
{
	char *p, perms[4];
	struct uffdwp_tracker *t;
	uint64_t set;
	long n;
	int want = b == UFFDWP_BACKEND_MPROTECT ? PROT_READ | PROT_WRITE :
		   PROT_READ;

	if (uffdwp_backend_available(b))
		tap_leave(77, "no %s backend here", uffdwp_backend_name(b));
	t = track_guarded(&p, b, 1);
	if ((n = round_of(t, p, 8, &set)) != 0)
		tap_leave(1, "quiet round: %ld", n);
	p[3 * psz] = 3;			/* tracked */
	mprotect(p, 8 * psz, want);
	if (b == UFFDWP_BACKEND_MPROTECT) {
		p[2 * psz] = 2;		/* no fault any more */
		p[5 * psz] = 5;
	}
	n = round_of(t, p, 8, &set);
	if (n != -ESTALE)
		tap_leave(1, "collect after the program's mprotect: %ld (want -ESTALE)",
			  n);
	n = round_of(t, p, 8, &set);
	if (n != 8 || set != 0xff)
		tap_leave(1, "the round after -ESTALE: %ld pages, set %#llx (want all 8)",
			  n, (unsigned long long)set);
	n = round_of(t, p, 8, &set);
	if (n != 8)
		tap_leave(1, "a later round: %ld pages (want all 8: nothing is seen there any more)",
			  n);
	perms_of(p, perms);
	if (strcmp(perms, want & PROT_WRITE ? "rw-" : "r--"))
		tap_leave(1, "after collect: %s, not the program's", perms);
	uffdwp_tracker_free(t);
	perms_of(p, perms);
	if (strcmp(perms, want & PROT_WRITE ? "rw-" : "r--"))
		tap_leave(1, "after free: %s, not the program's", perms);
}

/* Made PROT_NONE (a guard page): a read there is the program's fault. */
static void c_prot_none_dies(int b)
{
	char *p;

	track_guarded(&p, b, 3);
	mprotect(p + 3 * psz, psz, PROT_NONE);
	(void)*(volatile char *)(p + 3 * psz);	/* must die here */
	tap_leave(5, "read of a PROT_NONE page went on");
}

/* Written (the tracker made it writable), then read-only again by the
 * program: from the next collect (-ESTALE) on, a write there is the
 * program's fault. */
static void c_readonly_after_write_dies(int b)
{
	char *p;
	struct uffdwp_tracker *t = track_guarded(&p, b, 3);
	uint64_t set;
	long n;

	p[psz] = 1;
	mprotect(p + psz, psz, PROT_READ);
	p[2 * psz] = 1;				/* another fault between */
	if ((n = round_of(t, p, 8, &set)) != -ESTALE)
		tap_leave(4, "collect: %ld (want -ESTALE)", n);
	((volatile char *)p)[psz] = 2;		/* must die here */
	tap_leave(5, "write to a page the program made read-only went on");
}

/* The same with a collect in between: it says -ESTALE and leaves the
 * page read-only; a handler of the program's gets the fault. */
static atomic_int handler_calls;
static char *handler_page;

static void program_handler(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	if ((char *)((uintptr_t)si->si_addr & ~(uintptr_t)(psz - 1)) ==
	    handler_page)
		atomic_fetch_add(&handler_calls, 1);
	mprotect(handler_page, psz, PROT_READ | PROT_WRITE);
}

static void c_readonly_kept(int b)
{
	char *p = map_guarded(8), perms[4];
	struct uffdwp_region r = { p, 8 * psz };
	struct uffdwp_tracker *t;
	struct sigaction sa;
	uint64_t set;
	long n;

	if (uffdwp_tracker_new(&t, &r, 1, b))
		tap_leave(1, "tracker_new failed");
	/* the program's handler, the library's in front of it */
	uffdwp_tracker_free(t);
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = program_handler;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGSEGV, &sa, NULL);
	if (uffdwp_tracker_new(&t, &r, 1, b))
		tap_leave(1, "tracker_new failed");
	p[psz] = 1;
	mprotect(p + psz, psz, PROT_READ);
	n = round_of(t, p, 8, &set);
	if (n != -ESTALE)
		tap_leave(1, "collect: %ld (want -ESTALE)", n);
	perms_of(p + psz, perms);
	if (strcmp(perms, "r--"))
		tap_leave(1, "after collect: %s (the program made it r--)", perms);
	handler_page = p + psz;
	((volatile char *)p)[psz] = 2;
	if (atomic_load(&handler_calls) != 1)
		tap_leave(1, "the program's handler got %d faults (want 1)",
			  atomic_load(&handler_calls));
	n = round_of(t, p, 8, &set);
	if (n != 8)
		tap_leave(1, "round after -ESTALE: %ld (want 8)", n);
	uffdwp_tracker_free(t);
}

/* munmap() and mmap() again under an mprotect tracker. */
static void c_replaced(int b)
{
	char *p;
	struct uffdwp_tracker *t = track_guarded(&p, b, 1);
	uint64_t set;
	long n;

	munmap(p + 4 * psz, 2 * psz);
	if (mmap(p + 4 * psz, 2 * psz, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != p + 4 * psz)
		tap_leave(1, "mmap: %s", strerror(errno));
	p[4 * psz] = 4;			/* raises no fault */
	n = round_of(t, p, 8, &set);
	if (n != -ESTALE)
		tap_leave(1, "collect after munmap + mmap: %ld (want -ESTALE)", n);
	n = round_of(t, p, 8, &set);
	if (n != 8)
		tap_leave(1, "round after -ESTALE: %ld (want 8)", n);
	uffdwp_tracker_free(t);
}

/* ---- another thread's stack ---- */

static atomic_int spin_stop;
static atomic_ulong spin_calls;
/* Parked: after its first calls the thread sleeps in read(2) on this pipe
 * until spinner_check(), so that nothing of its stack (nor of its thread
 * descriptor, which glibc keeps at the stack's top) is written while the
 * case runs: the library's own joins must not need that page. */
static int park_pipe[2] = { -1, -1 };

static unsigned long __attribute__((noinline)) deep(int n)
{
	volatile char buf[256];

	buf[n % 256] = (char)n;
	return n ? deep(n - 1) + buf[n % 256] : 0;
}

static void *spinner(void *arg)
{
	(void)arg;
	while (!atomic_load(&spin_stop)) {
		deep(64);
		if (atomic_fetch_add(&spin_calls, 1) == 100 &&
		    park_pipe[0] >= 0) {
			char c;

			while (read(park_pipe[0], &c, 1) < 0 && errno == EINTR)
				;
		}
	}
	return NULL;
}

/* Start the spinner; its stack (pthread_getattr_np) in *R. */
static pthread_t stack_region(struct uffdwp_region *r)
{
	pthread_attr_t at;
	pthread_t th;
	void *stack;
	size_t size;

	if (pthread_create(&th, NULL, spinner, NULL))
		tap_leave(1, "pthread_create");
	if (pthread_getattr_np(th, &at) ||
	    pthread_attr_getstack(&at, &stack, &size))
		tap_leave(1, "pthread_getattr_np");
	pthread_attr_destroy(&at);
	uintptr_t a = ((uintptr_t)stack + psz - 1) & ~(uintptr_t)(psz - 1);
	uintptr_t e = ((uintptr_t)stack + size) & ~(uintptr_t)(psz - 1);

	r->addr = (void *)a;
	r->len = e - a;
	while (atomic_load(&spin_calls) < 101)
		usleep(1000);
	return th;
}

/* The spinner went on calling functions after the case. */
static void spinner_check(pthread_t th, const char *what)
{
	unsigned long before;

	if (park_pipe[1] >= 0 && write(park_pipe[1], "", 1) != 1)
		tap_leave(1, "write: %s", strerror(errno));
	before = atomic_load(&spin_calls);
	for (int i = 0; i < 2000 && atomic_load(&spin_calls) < before + 100; i++)
		usleep(1000);
	if (atomic_load(&spin_calls) < before + 100)
		tap_leave(1, "%s: the thread stopped calling functions (%lu calls)",
			  what, atomic_load(&spin_calls) - before);
	atomic_store(&spin_stop, 1);
	pthread_join(th, NULL);
}

static void c_stack_tracker(int b)
{
	struct uffdwp_region r;
	struct uffdwp_tracker *t = NULL;
	pthread_t th;
	int err;

	if (uffdwp_backend_available(b))
		tap_leave(77, "no %s backend here", uffdwp_backend_name(b));
	th = stack_region(&r);
	err = uffdwp_tracker_new(&t, &r, 1, b);
	if (err && b != UFFDWP_BACKEND_MPROTECT &&
	    b != UFFDWP_BACKEND_SOFT_DIRTY)
		tap_leave(1, "tracker_new: %d (want 0)", err);
	for (int i = 0; t && i < 5; i++) {
		void *pg[64];
		ssize_t n;

		usleep(20000);
		do
			n = uffdwp_tracker_collect(t, pg, 64);
		while (n == 64);
		if (n < 0)
			tap_leave(1, "collect: %zd", n);
	}
	spinner_check(th, uffdwp_backend_name(b));
	uffdwp_tracker_free(t);
	/* Their SIGSEGV handler would have to run on that stack. */
	if ((b == UFFDWP_BACKEND_MPROTECT || b == UFFDWP_BACKEND_SOFT_DIRTY) &&
	    err != -EDEADLK)
		tap_leave(1, "tracker_new: %d (want -EDEADLK)", err);
}

static int tmpfd(void)
{
	char path[] = "/tmp/uffdwp-foreign-XXXXXX";
	int fd = mkstemp(path);

	if (fd < 0)
		tap_leave(1, "mkstemp: %s", strerror(errno));
	unlink(path);
	return fd;
}

/* ARG: 1 a session (else one snapshot), 2 the thread parked. */
static void c_stack_snapshot(int arg)
{
	struct uffdwp_features f;
	struct uffdwp_region r;
	int session = arg & 1;
	pthread_t th;
	int fd = tmpfd(), err;

	uffdwp_probe(&f);
	if (!f.wp)
		tap_leave(77, "no sync write-protect here");
	if ((arg & 2) && pipe(park_pipe))
		tap_leave(1, "pipe: %s", strerror(errno));
	th = stack_region(&r);
	if (!session) {
		struct uffdwp_snapshot_opts o = { .sink_fd = fd };
		struct uffdwp_snapshot *s;

		err = uffdwp_snapshot_start(&s, &r, 1, &o);
		if (err)
			tap_leave(1, "snapshot_start: %d", err);
		if ((err = uffdwp_snapshot_wait(s, 20000)))
			tap_leave(1, "snapshot_wait: %d", err);
		uffdwp_snapshot_free(s);
		if (lseek(fd, 0, SEEK_CUR) != (off_t)r.len)
			tap_leave(1, "sink got %ld bytes of %zu",
				  (long)lseek(fd, 0, SEEK_CUR), r.len);
	} else {
		struct uffdwp_session *ss;

		err = uffdwp_session_new(&ss, &r, 1, NULL);
		if (err)
			tap_leave(1, "session_new: %d", err);
		for (int i = 0; i < 3; i++) {
			if ((err = uffdwp_session_snapshot(ss, fd, 0)))
				tap_leave(1, "snapshot %d: %d", i, err);
			if ((err = uffdwp_session_wait(ss, 20000)))
				tap_leave(1, "wait %d: %d", i, err);
			usleep(20000);
		}
		uffdwp_session_free(ss);
	}
	spinner_check(th, session ? "session" : "snapshot");
}

/* ---- the cases ---- */

static void run(const char *name, void (*fn)(int), int arg, bool must_die)
{
	char why[128];
	int st = in_child(fn, arg, 30);

	if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
		tap_skip(name, "%s", tap_msg);
		return;
	}
	if (must_die)
		tap_check(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, name,
			  "child %s (want killed by SIGSEGV, as without the library) %s",
			  status_text(st, why, sizeof(why)), tap_msg);
	else
		tap_check(WIFEXITED(st) && WEXITSTATUS(st) == 0, name,
			  "child %s %s", status_text(st, why, sizeof(why)), tap_msg);
}

int main(void)
{
	char name[96];

	psz = (size_t)sysconf(_SC_PAGESIZE);
	if (!tap_child_init())
		return 1;
	tap_plan(2 + 4 + 4 + 4);
	for (size_t i = 0; i < 2; i++) {
		int b = segv_backends[i];

		snprintf(name, sizeof(name), "foreign-mprotect-%s",
			 uffdwp_backend_name(b));
		run(name, c_made_writable, b, false);
	}
	run("foreign-prot-none-dies-mprotect", c_prot_none_dies,
	    UFFDWP_BACKEND_MPROTECT, true);
	run("foreign-readonly-after-write-dies-mprotect",
	    c_readonly_after_write_dies, UFFDWP_BACKEND_MPROTECT, true);
	run("foreign-readonly-kept-mprotect", c_readonly_kept,
	    UFFDWP_BACKEND_MPROTECT, false);
	run("foreign-replaced-mprotect", c_replaced, UFFDWP_BACKEND_MPROTECT,
	    false);
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++) {
		snprintf(name, sizeof(name), "foreign-thread-stack-%s",
			 uffdwp_backend_name(b));
		run(name, c_stack_tracker, b, false);
	}
	run("foreign-thread-stack-snapshot", c_stack_snapshot, 0, false);
	run("foreign-thread-stack-session", c_stack_snapshot, 1, false);
	/* The session freed while its pages are still protected: the joins
	 * of its threads touch the parked thread's descriptor (riscv64 hung
	 * there until the free let writers go first). */
	run("foreign-parked-thread-stack-snapshot", c_stack_snapshot, 2, false);
	run("foreign-parked-thread-stack-session", c_stack_snapshot, 3, false);
	return tap_done();
}
