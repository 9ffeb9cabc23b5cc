// SPDX-License-Identifier: GPL-2.0
/*
 * lib-hostile: every public function of libuffdwp (include/uffdwp.h) with
 * hostile arguments and concurrent misuse (issue #35).  The rule: an
 * error code, never a hang and never a signal.
 *
 * Each case runs in a child process of its own with a watchdog: the child
 * sets alarm(2), and the parent kills it after the same time plus a
 * margin, so a hang fails the case ("hung") instead of the suite, and a
 * signal fails it by name.  The child reports a failed check through a
 * shared page.
 *
 * Covered: NULL and garbage non-NULL pointers where the header promises
 * -EINVAL; zero, huge, unaligned and overflowing sizes; regions unmapped,
 * half unmapped, PROT_NONE, read-only, of mixed kinds, on the caller's own
 * stack; descriptors closed or of the wrong kind; snapshot files
 * truncated, foreign, or with a flipped byte; misuse while it runs:
 * munmap, mprotect, fork, close of the sink, free while writers run;
 * memory replaced under a session; the probe under a lack of descriptors;
 * thread creation refused (RLIMIT_AS); the functions of 0.4 (completion
 * descriptors, sized stats, regions added and removed, dirty ranges,
 * tracker ranges): garbage, misaligned, freed and other-kind handles,
 * bad sizes, unwritable buffers (nothing taken), regions added and
 * removed under writers and after munmap, fork.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"
#include "uffdwp.h"

static size_t psz;
static struct uffdwp_features F;
static void *const GARBAGE = (void *)(uintptr_t)0x10;	/* never mapped */

#define CHECK(cond, ...)						\
	do {								\
		if (!(cond))						\
			tap_leave(1, __VA_ARGS__);			\
	} while (0)
/* An expression that must give exactly WANT (a -errno or 0). */
#define EXPECT(expr, want)						\
	do {								\
		long _r = (long)(expr);					\
		if (_r != (long)(want))					\
			tap_leave(1, "line %d: %s = %ld (%s), want %ld", \
				  __LINE__, #expr, _r,			\
				  _r < 0 ? strerror((int)-_r) : "",	\
				  (long)(want));			\
	} while (0)
/* An expression that must fail (< 0) and not be WORSE. */
#define EXPECT_ERR(expr)						\
	do {								\
		long _r = (long)(expr);					\
		if (_r >= 0)						\
			tap_leave(1, "line %d: %s = %ld, want an error", \
				  __LINE__, #expr, _r);			\
	} while (0)

static void c_probe_emfile(void);

/* Run FN in a child with a watchdog of SECS seconds. */
static void run(const char *name, int secs, void (*fn)(void))
{
	struct timespec t0, t;
	int st = 0;
	pid_t pid, w;

	pid = tap_fork_case((unsigned int)secs);
	if (pid == 0) {
		/* The probe's cache starts empty in each case (the parent
		 * never calls the library); the EMFILE case probes first. */
		if (fn != c_probe_emfile)
			uffdwp_probe(&F);
		fn();
		_exit(0);
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		w = waitpid(pid, &st, WNOHANG);
		if (w == pid)
			break;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > secs + 5) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			tap_fail(name, "hung: no result in %d s (killed)", secs);
			return;
		}
		usleep(10000);
	}
	if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
		tap_fail(name, "hung: no result in %d s %s", secs, tap_msg);
	else if (WIFSIGNALED(st))
		tap_fail(name, "killed by signal %d (%s) %s", WTERMSIG(st),
			 strsignal(WTERMSIG(st)), tap_msg);
	else if (WEXITSTATUS(st) == 77)
		tap_skip(name, "%s", tap_msg);
	else
		tap_check(WEXITSTATUS(st) == 0, name, "%s", tap_msg);
}

static char *map_anon(size_t pages)
{
	char *p = mmap(NULL, pages * psz, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK(p != MAP_FAILED, "mmap: %s", strerror(errno));
	memset(p, 0x5a, pages * psz);
	return p;
}

static int tmpfile_fd(void)
{
	char path[] = "/tmp/uffdwp-hostile-XXXXXX";
	int fd = mkstemp(path);

	CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
	unlink(path);
	return fd;
}

static void need_wp(void)
{
	if (!F.wp)
		tap_leave(77, "kernel has no sync write-protect for anonymous memory");
}

/* ---- version, probe, open, names ---- */

static void c_version(void)
{
	int a, b;

	EXPECT(uffdwp_version(NULL, NULL), -EINVAL);
	EXPECT(uffdwp_version(&a, NULL), -EINVAL);
	EXPECT(uffdwp_version(NULL, &b), -EINVAL);
	EXPECT(uffdwp_version(&a, &b), 0);
	CHECK(!uffdwp_version_at_least(-1, 0) || a >= 0, "at_least(-1)");
	CHECK(!uffdwp_version_at_least(1 << 30, 0), "at_least(huge)");
	CHECK(uffdwp_version_at_least(0, -5), "at_least(0, -5)");
}

static void c_probe(void)
{
	struct uffdwp_features f;
	char buf[8];
	int n;

	EXPECT(uffdwp_probe(NULL), -EINVAL);
	EXPECT(uffdwp_probe_fresh(NULL), -EINVAL);
	EXPECT(uffdwp_probe(&f), 0);
	EXPECT(uffdwp_feature_names(NULL, buf, sizeof(buf)), -EINVAL);
	EXPECT(uffdwp_feature_names(&f, NULL, 5), -EINVAL);
	n = uffdwp_feature_names(&f, NULL, 0);
	CHECK(n >= 0, "names(NULL, 0) = %d", n);
	memset(buf, 'x', sizeof(buf));
	EXPECT(uffdwp_feature_names(&f, buf, 1), n);
	CHECK(buf[0] == 0 && buf[1] == 'x', "size 1: not one NUL");
	EXPECT(uffdwp_feature_names(&f, buf, sizeof(buf)), n);
	CHECK(memchr(buf, 0, sizeof(buf)), "not terminated");
}

/*
 * Issue #35 (B4): a probe that ran out of descriptors says nothing about
 * the kernel and must not be cached: once descriptors are free again,
 * uffdwp_probe() and a snapshot see the kernel's features.
 */
static void c_probe_emfile(void)
{
	struct uffdwp_features f;
	struct rlimit rl = { 24, 24 };
	int fds[64], n = 0;

	CHECK(!setrlimit(RLIMIT_NOFILE, &rl), "setrlimit: %s", strerror(errno));
	while (n < 64 && (fds[n] = open("/dev/null", O_RDONLY)) >= 0)
		n++;
	CHECK(errno == EMFILE, "could not use up descriptors");
	EXPECT(uffdwp_probe(&f), 0);
	CHECK(!f.wp, "probe found wp without a free descriptor?");
	while (n)
		close(fds[--n]);
	EXPECT(uffdwp_probe(&f), 0);
	uffdwp_probe_fresh(&F);
	need_wp();
	CHECK(f.wp, "probe still says no wp once descriptors are free: the "
		    "failed probe was cached");
	{
		char *p = map_anon(4);
		struct uffdwp_region r = { p, 4 * psz };
		int fd = tmpfile_fd();
		struct uffdwp_snapshot_opts o = { .sink_fd = fd };
		struct uffdwp_snapshot *s;

		EXPECT(uffdwp_snapshot_start(&s, &r, 1, &o), 0);
		EXPECT(uffdwp_snapshot_wait(s, 20000), 0);
		uffdwp_snapshot_free(s);
	}
}

static void c_open(void)
{
	int fd;

	EXPECT(uffdwp_open(~0u, 0, NULL), -EINVAL);
	EXPECT(uffdwp_open(1u << 31, 0, NULL), -EINVAL);
	EXPECT(uffdwp_open(UFFDWP_OPEN_NO_DEVICE | UFFDWP_OPEN_NO_SYSCALL, 0,
			   NULL), -EINVAL);
	fd = uffdwp_open(0, ~0ull, NULL);
	CHECK(fd < 0, "every feature bit accepted: %d", fd);
	fd = uffdwp_open(0, 0, NULL);
	CHECK(fd >= 0 || fd == -EPERM || fd == -ENOSYS, "open: %d", fd);
	if (fd >= 0)
		close(fd);
}

static void c_names(void)
{
	CHECK(!uffdwp_backend_name((enum uffdwp_backend)-1), "name(-1)");
	CHECK(!uffdwp_backend_name(UFFDWP_BACKEND_COUNT), "name(COUNT)");
	CHECK(!uffdwp_backend_name((enum uffdwp_backend)1000000), "name(big)");
	EXPECT(uffdwp_backend_from_name(NULL), -EINVAL);
	EXPECT(uffdwp_backend_from_name(""), -EINVAL);
	EXPECT(uffdwp_backend_from_name("mprotect "), -EINVAL);
	EXPECT(uffdwp_backend_available((enum uffdwp_backend)-1), -EINVAL);
	EXPECT(uffdwp_backend_available(UFFDWP_BACKEND_COUNT), -EINVAL);
	CHECK(uffdwp_backend_choose() > UFFDWP_BACKEND_AUTO &&
	      uffdwp_backend_choose() < UFFDWP_BACKEND_COUNT, "choose");
	EXPECT(uffdwp_tracker_backend(NULL), UFFDWP_BACKEND_AUTO);
}

/* ---- snapshots: arguments ---- */

static void c_snapshot_args(void)
{
	char *p = map_anon(8);
	int fd = tmpfile_fd();
	struct uffdwp_region r = { p, 8 * psz }, bad[2];
	struct uffdwp_snapshot_opts o = { .sink_fd = fd }, b;
	struct uffdwp_snapshot *s = GARBAGE;

	need_wp();
	EXPECT(uffdwp_snapshot_start(NULL, &r, 1, &o), -EINVAL);
	EXPECT(uffdwp_snapshot_start(&s, NULL, 1, &o), -EINVAL);
	CHECK(s == NULL, "*out not cleared on error");
	EXPECT(uffdwp_snapshot_start(&s, &r, 0, &o), -EINVAL);
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, NULL), -EINVAL);
	EXPECT(uffdwp_snapshot_start(&s, &r, SIZE_MAX, &o), -EINVAL);
	EXPECT(uffdwp_snapshot_start(&s, &r, (size_t)1 << 21, &o), -EINVAL);
	/* garbage non-NULL pointers: the header says -EINVAL */
	EXPECT(uffdwp_snapshot_start(&s, GARBAGE, 1, &o), -EINVAL);
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, GARBAGE), -EINVAL);
	EXPECT(uffdwp_snapshot_start(GARBAGE, &r, 1, &o), -EINVAL);
	/* the array's second element not readable */
	EXPECT(uffdwp_snapshot_start(&s, (void *)(p + 8 * psz - sizeof(r)), 2,
				     &o), -EINVAL);
	/* sizes */
	bad[0] = (struct uffdwp_region){ p + 1, psz };
	EXPECT(uffdwp_snapshot_start(&s, bad, 1, &o), -EINVAL);
	bad[0] = (struct uffdwp_region){ p, psz + 1 };
	EXPECT(uffdwp_snapshot_start(&s, bad, 1, &o), -EINVAL);
	bad[0] = (struct uffdwp_region){ p, 0 };
	EXPECT(uffdwp_snapshot_start(&s, bad, 1, &o), -EINVAL);
	bad[0] = (struct uffdwp_region){ p, SIZE_MAX - psz + 1 };
	EXPECT(uffdwp_snapshot_start(&s, bad, 1, &o), -EINVAL);
	bad[0] = (struct uffdwp_region){ NULL, psz };
	EXPECT(uffdwp_snapshot_start(&s, bad, 1, &o), -EINVAL);
	bad[0] = (struct uffdwp_region){ p, 4 * psz };
	bad[1] = (struct uffdwp_region){ p + 2 * psz, 4 * psz };
	EXPECT(uffdwp_snapshot_start(&s, bad, 2, &o), -EINVAL);
	/* options */
	b = o;
	b.sink = (uffdwp_sink_fn)GARBAGE;
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &b), -EINVAL);
	b = o;
	b.sink_fd = -1;
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &b), -EINVAL);
	b = o;
	b.sink_fd = 0;
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &b), -EINVAL);
	b = o;
	b.flags = 1u << 30;
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &b), -EINVAL);
	b = o;
	b.flags = UFFDWP_SNAP_DISCARD_ZERO | UFFDWP_SNAP_DISCARD_FAIL;
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &b), -EINVAL);
	b = o;
	b.flags = UFFDWP_SNAP_KERNEL_FAULTS | UFFDWP_SNAP_USER_MODE_ONLY;
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &b), -EINVAL);
	b = o;
	b.__reserved[7] = 1;
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &b), -EINVAL);
	/* descriptors */
	b = o;
	b.sink_fd = 1000;
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &b), -EBADF);
	/* a huge side buffer cap is a cap, not an allocation failure */
	b = o;
	b.side_cap = SIZE_MAX;
	{
		int err = uffdwp_snapshot_start(&s, &r, 1, &b);

		CHECK(err == 0 || err == -ENOMEM, "side_cap SIZE_MAX: %d", err);
		if (!err) {
			EXPECT(uffdwp_snapshot_wait(s, 20000), 0);
			uffdwp_snapshot_free(s);
		}
	}
	/* the handle calls */
	EXPECT(uffdwp_snapshot_wait(NULL, 0), -EINVAL);
	EXPECT(uffdwp_snapshot_cancel(NULL), -EINVAL);
	EXPECT(uffdwp_snapshot_stats(NULL, NULL), -EINVAL);
	uffdwp_snapshot_free(NULL);
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &o), 0);
	EXPECT(uffdwp_snapshot_stats(s, NULL), -EINVAL);
	EXPECT(uffdwp_snapshot_wait(s, 20000), 0);
	EXPECT(uffdwp_snapshot_cancel(s), -EALREADY);
	EXPECT(uffdwp_snapshot_cancel(s), -EALREADY);
	EXPECT(uffdwp_snapshot_wait(s, 0), 0);
	uffdwp_snapshot_free(s);
}

/* Regions of every bad kind, for snapshots, sessions and trackers. */
enum bad { B_UNMAPPED, B_HALF, B_NONE, B_RO, B_MIXED, B_N };
static const char *const bad_name[B_N] = { "unmapped", "half-unmapped",
	"PROT_NONE", "read-only", "mixed anonymous and shared file" };
static const int bad_err[B_N] = { -EFAULT, -EFAULT, -EINVAL, -EINVAL,
				  -EINVAL };

static struct uffdwp_region bad_region(enum bad k)
{
	char *p = map_anon(16);

	switch (k) {
	case B_UNMAPPED:
		munmap(p, 16 * psz);
		break;
	case B_HALF:
		munmap(p + 8 * psz, 8 * psz);
		break;
	case B_NONE:
		mprotect(p, 16 * psz, PROT_NONE);
		break;
	case B_RO:
		mprotect(p, 16 * psz, PROT_READ);
		break;
	case B_MIXED: {
		int fd = tmpfile_fd();

		CHECK(!ftruncate(fd, (off_t)(8 * psz)), "ftruncate");
		CHECK(mmap(p + 8 * psz, 8 * psz, PROT_READ | PROT_WRITE,
			   MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED,
		      "mmap file: %s", strerror(errno));
		break;
	}
	default:
		break;
	}
	return (struct uffdwp_region){ p, 16 * psz };
}

static void c_snapshot_regions(void)
{
	int fd = tmpfile_fd();
	struct uffdwp_snapshot_opts o = { .sink_fd = fd };
	struct uffdwp_snapshot *s;

	need_wp();
	for (int k = 0; k < B_N; k++) {
		struct uffdwp_region r = bad_region(k);
		int err = uffdwp_snapshot_start(&s, &r, 1, &o);

		CHECK(err == bad_err[k], "%s region: %d, want %d", bad_name[k],
		      err, bad_err[k]);
	}
}

/* A sink of the wrong kind: a read-only descriptor, a directory. */
static void c_snapshot_sink_kinds(void)
{
	char *p = map_anon(8);
	struct uffdwp_region r = { p, 8 * psz };
	int fds[2] = { open("/dev/null", O_RDONLY),
		       open("/tmp", O_RDONLY | O_DIRECTORY) };

	need_wp();
	for (int i = 0; i < 2; i++) {
		struct uffdwp_snapshot_opts o = { .sink_fd = fds[i] };
		struct uffdwp_snapshot *s;
		int err = uffdwp_snapshot_start(&s, &r, 1, &o);

		if (err)
			continue;	/* refused at once: fine */
		err = uffdwp_snapshot_wait(s, 20000);
		CHECK(err < 0 && err != -ETIMEDOUT,
		      "sink %d: wait = %d, want the write's error", i, err);
		uffdwp_snapshot_free(s);
	}
}

/* Writers for the misuse cases. */
struct writers {
	char *p;
	size_t len;
	volatile int stop;
	pthread_t th[2];
};

static void *writer_main(void *arg)
{
	struct writers *w = arg;

	while (!w->stop)
		for (size_t i = 0; i < w->len && !w->stop; i += psz)
			w->p[i]++;
	return NULL;
}

static void writers_start(struct writers *w, char *p, size_t len)
{
	w->p = p;
	w->len = len;
	w->stop = 0;
	for (int i = 0; i < 2; i++)
		pthread_create(&w->th[i], NULL, writer_main, w);
}

static void writers_stop(struct writers *w)
{
	w->stop = 1;
	for (int i = 0; i < 2; i++)
		pthread_join(w->th[i], NULL);
}

static int slow_sink(void *arg, const void *addr, const void *data, size_t len)
{
	(void)arg;
	(void)addr;
	(void)data;
	(void)len;
	usleep(20000);
	return 0;
}

/* Misuse while a snapshot runs: the sink closed, fork, cancel. */
static void c_snapshot_concurrent(void)
{
	size_t pages = 2048;
	char *p = map_anon(pages);
	struct uffdwp_region r = { p, pages * psz };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = slow_sink };
	struct uffdwp_snapshot *s;
	struct writers w;
	int fd = tmpfile_fd(), err;
	pid_t pid;

	need_wp();
	writers_start(&w, p, r.len);
	/* the caller closes its sink descriptor: ours is a duplicate */
	o = (struct uffdwp_snapshot_opts){ .sink_fd = fd };
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &o), 0);
	close(fd);
	EXPECT(uffdwp_snapshot_wait(s, 30000), 0);
	uffdwp_snapshot_free(s);
	/* fork while the copier runs; the child frees its copy */
	o = (struct uffdwp_snapshot_opts){ .sink_fd = -1, .sink = slow_sink };
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &o), 0);
	pid = fork();
	if (pid == 0) {
		int e1 = uffdwp_snapshot_wait(s, 0);

		uffdwp_snapshot_free(s);
		_exit(e1 == -ECHILD ? 0 : 1);
	}
	CHECK(pid > 0, "fork");
	{
		int st;

		waitpid(pid, &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "child: wait not -ECHILD or the child died (%#x)", st);
	}
	/* cancel twice and free while writers run */
	err = uffdwp_snapshot_cancel(s);
	CHECK(err == 0 || err == -EALREADY, "cancel: %d", err);
	EXPECT(uffdwp_snapshot_cancel(s), -EALREADY);
	err = uffdwp_snapshot_wait(s, 1000);
	CHECK(err == -ECANCELED || err == 0, "wait after cancel: %d", err);
	uffdwp_snapshot_free(s);
	/* munmap of part of the region while it runs: an error, no signal */
	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &o), 0);
	writers_stop(&w);
	munmap(p + pages / 2 * psz, pages / 2 * psz);
	err = uffdwp_snapshot_wait(s, 60000);
	CHECK(err == -EFAULT || err == 0, "wait after munmap: %d", err);
	uffdwp_snapshot_free(s);
}

/* A snapshot whose region holds the caller's own stack: an error or a
 * snapshot, never a hang (issue #35, B1). */
static void __attribute__((noinline)) grow_stack(void)
{
	volatile char deep[64 << 10];

	for (size_t i = 0; i < sizeof(deep); i += 512)
		deep[i] = 1;
}

static void own_stack_region(struct uffdwp_region *r)
{
	char here[64];

	/* the pages below this frame mapped (the stack grows on demand) */
	grow_stack();
	/* this frame's page and three below it (above may be the top) */
	uintptr_t a = ((uintptr_t)here & ~(uintptr_t)(psz - 1)) - 3 * psz;

	memset(here, 1, sizeof(here));
	r->addr = (void *)a;
	r->len = 4 * psz;
}

static void c_snapshot_own_stack(void)
{
	struct uffdwp_region r;
	int fd = tmpfile_fd(), err;
	struct uffdwp_snapshot_opts o = { .sink_fd = fd };
	struct uffdwp_snapshot *s;

	need_wp();
	own_stack_region(&r);
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (err) {
		CHECK(err == -EDEADLK || err == -EINVAL, "start: %d", err);
		return;
	}
	EXPECT(uffdwp_snapshot_wait(s, 20000), 0);
	uffdwp_snapshot_free(s);
	CHECK(lseek(fd, 0, SEEK_CUR) == (off_t)r.len, "sink got %ld bytes",
	      (long)lseek(fd, 0, SEEK_CUR));
}

/* A snapshot of the whole heap malloc works in, malloc running. */
static void c_snapshot_malloc_heap(void)
{
	size_t len = 64 * psz;
	char *blk = malloc(len + psz);
	uintptr_t a = ((uintptr_t)blk + psz - 1) & ~(uintptr_t)(psz - 1);
	struct uffdwp_region r = { (void *)a, len };
	int fd = tmpfile_fd();
	struct uffdwp_snapshot_opts o = { .sink_fd = fd };
	struct uffdwp_session *ss;

	need_wp();
	memset(blk, 3, len);
	EXPECT(uffdwp_session_new(&ss, &r, 1, NULL), 0);
	for (int i = 0; i < 3; i++) {
		EXPECT(uffdwp_session_snapshot(ss, fd, 0), 0);
		memset(blk + i * psz, i, psz);
		free(malloc(100));
		EXPECT(uffdwp_session_wait(ss, 20000), 0);
	}
	uffdwp_session_free(ss);
	(void)o;
}

static void c_session_own_stack(void)
{
	struct uffdwp_region r;
	int fd = tmpfile_fd(), err;
	struct uffdwp_session *ss;

	need_wp();
	own_stack_region(&r);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (err) {
		CHECK(err == -EDEADLK || err == -EINVAL, "new: %d", err);
		return;
	}
	for (int i = 0; i < 3; i++) {
		err = uffdwp_session_snapshot(ss, fd, 0);
		CHECK(!err || err == -EDEADLK, "snapshot %d: %d", i, err);
		if (!err)
			EXPECT(uffdwp_session_wait(ss, 20000), 0);
	}
	uffdwp_session_free(ss);
}

/* Thread creation refused (RLIMIT_AS): not the -EAGAIN of a discard. */
static void c_snapshot_no_threads(void)
{
	char *p = map_anon(8);
	struct uffdwp_region r = { p, 8 * psz };
	int fd = tmpfile_fd(), err;
	struct uffdwp_snapshot_opts o = { .sink_fd = fd, .side_cap = psz };
	struct uffdwp_snapshot *s;
	unsigned long vm = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	struct rlimit rl;

	need_wp();
	CHECK(f && fscanf(f, "%lu", &vm) == 1, "statm");
	fclose(f);
	/* uffdwp_probe() first: its scratch pages are not the point */
	uffdwp_probe(&F);
	rl.rlim_cur = rl.rlim_max = vm * psz + (6UL << 20);
	CHECK(!setrlimit(RLIMIT_AS, &rl), "setrlimit: %s", strerror(errno));
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err) {
		err = uffdwp_snapshot_wait(s, 20000);
		uffdwp_snapshot_free(s);
		tap_leave(77, "the snapshot found room for its threads (wait %d)",
			  err);
	}
	CHECK(err == -ENOMEM, "start under RLIMIT_AS: %d (%s), want -ENOMEM",
	      err, strerror(-err));
}

/* ---- sessions ---- */

static void c_session_args(void)
{
	char *p = map_anon(8);
	struct uffdwp_region r = { p, 8 * psz };
	struct uffdwp_session_opts so = { 0 };
	struct uffdwp_precopy_opts po = { 0 };
	struct uffdwp_snapshot_stats st;
	struct uffdwp_session *ss = GARBAGE;
	int fd = tmpfile_fd(), pfd[2], err;

	need_wp();
	EXPECT(uffdwp_session_new(NULL, &r, 1, NULL), -EINVAL);
	EXPECT(uffdwp_session_new(&ss, NULL, 1, NULL), -EINVAL);
	CHECK(ss == NULL, "*out not cleared");
	EXPECT(uffdwp_session_new(&ss, &r, 0, NULL), -EINVAL);
	EXPECT(uffdwp_session_new(&ss, GARBAGE, 1, NULL), -EINVAL);
	EXPECT(uffdwp_session_new(&ss, &r, 1, GARBAGE), -EINVAL);
	EXPECT(uffdwp_session_new(GARBAGE, &r, 1, NULL), -EINVAL);
	so.flags = 1u << 29;
	EXPECT(uffdwp_session_new(&ss, &r, 1, &so), -EINVAL);
	so.flags = 0;
	so.__reserved[5] = 9;
	EXPECT(uffdwp_session_new(&ss, &r, 1, &so), -EINVAL);
	for (int k = 0; k < B_N; k++) {
		struct uffdwp_region b = bad_region(k);

		err = uffdwp_session_new(&ss, &b, 1, NULL);
		CHECK(err == bad_err[k], "%s region: %d, want %d", bad_name[k],
		      err, bad_err[k]);
	}
	EXPECT(uffdwp_session_snapshot(NULL, fd, 0), -EINVAL);
	EXPECT(uffdwp_session_wait(NULL, 0), -EINVAL);
	EXPECT(uffdwp_session_stats(NULL, &st), -EINVAL);
	EXPECT(uffdwp_session_dirty(NULL), -EINVAL);
	EXPECT(uffdwp_session_precopy(NULL, fd, NULL), -EINVAL);
	uffdwp_session_free(NULL);
	EXPECT(uffdwp_session_new(&ss, &r, 1, NULL), 0);
	EXPECT(uffdwp_session_wait(ss, 0), -ENOENT);
	EXPECT(uffdwp_session_stats(ss, &st), -ENOENT);
	EXPECT(uffdwp_session_stats(ss, NULL), -EINVAL);
	EXPECT(uffdwp_session_snapshot(ss, -1, 0), -EINVAL);
	EXPECT(uffdwp_session_snapshot(ss, 999, 0), -EBADF);
	EXPECT(uffdwp_session_snapshot(ss, fd, 1u << 20), -EINVAL);
	EXPECT(uffdwp_session_precopy(ss, -1, NULL), -EINVAL);
	EXPECT(uffdwp_session_precopy(ss, fd, GARBAGE), -EINVAL);
	po.flags = 4;
	EXPECT(uffdwp_session_precopy(ss, fd, &po), -EINVAL);
	CHECK(!pipe(pfd), "pipe");
	err = uffdwp_session_precopy(ss, pfd[1], NULL);
	CHECK(err == -EINVAL || err == -EOPNOTSUPP, "precopy to a pipe: %d",
	      err);
	EXPECT(uffdwp_session_snapshot(ss, fd, 0), 0);
	err = uffdwp_session_snapshot(ss, fd, 0);
	CHECK(err == -EBUSY || err == 0, "second snapshot at once: %d", err);
	EXPECT(uffdwp_session_wait(ss, 20000), 0);
	uffdwp_session_free(ss);
}

/*
 * Memory replaced under a session between snapshots (issue #35, B8): the
 * next delta holds the new contents (the files rebuild the memory
 * exactly), or the snapshot fails; munmap alone is -EFAULT.
 */
static void replaced(int how)
{
	size_t pages = 64;
	char *p = map_anon(pages), *copy = map_anon(pages), *q = p + 8 * psz;
	struct uffdwp_region r = { p, pages * psz }, d = { copy, pages * psz };
	struct uffdwp_snapshot_info prev, info;
	struct uffdwp_session *ss;
	int fds[3], err;

	need_wp();
	EXPECT(uffdwp_session_new(&ss, &r, 1, NULL), 0);
	for (int i = 0; i < 3; i++)
		fds[i] = tmpfile_fd();
	EXPECT(uffdwp_session_snapshot(ss, fds[0], 0), 0);
	EXPECT(uffdwp_session_wait(ss, 20000), 0);
	memset(p, 1, psz);
	EXPECT(uffdwp_session_snapshot(ss, fds[1], 0), 0);
	EXPECT(uffdwp_session_wait(ss, 20000), 0);
	switch (how) {
	case 0:		/* mmap(MAP_FIXED) over part of it */
		CHECK(mmap(q, 8 * psz, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == q,
		      "mmap: %s", strerror(errno));
		break;
	case 1:		/* munmap, then mmap at the same place */
		munmap(q, 8 * psz);
		CHECK(mmap(q, 8 * psz, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
			   -1, 0) == q, "mmap: %s", strerror(errno));
		break;
	case 2: {	/* mremap away and back */
		char *away = mmap(NULL, 8 * psz, PROT_NONE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		CHECK(mremap(q, 8 * psz, 8 * psz, MREMAP_MAYMOVE | MREMAP_FIXED,
			     away) == away, "mremap: %s", strerror(errno));
		CHECK(mremap(away, 8 * psz, 8 * psz,
			     MREMAP_MAYMOVE | MREMAP_FIXED, q) == q,
		      "mremap back: %s", strerror(errno));
		break;
	}
	case 3:		/* munmap alone */
		munmap(q, 8 * psz);
		EXPECT(uffdwp_session_snapshot(ss, fds[2], 0), -EFAULT);
		EXPECT(uffdwp_session_snapshot(ss, fds[2], 0), -EFAULT);
		uffdwp_session_free(ss);
		return;
	}
	memset(q + psz, 0x77, 3 * psz);		/* written after it */
	memset(p + 40 * psz, 2, psz);
	err = uffdwp_session_snapshot(ss, fds[2], 0);
	if (err) {
		CHECK(err == -ESTALE || err == -EFAULT || err == -EINVAL,
		      "snapshot after the replacement: %d", err);
		uffdwp_session_free(ss);
		return;
	}
	EXPECT(uffdwp_session_wait(ss, 20000), 0);
	for (int i = 0; i < 3; i++) {
		lseek(fds[i], 0, SEEK_SET);
		EXPECT(uffdwp_snapshot_load(fds[i], &d, 1, i ? &prev : NULL,
					    &info), 0);
		prev = info;
	}
	for (size_t i = 0; i < pages; i++)
		CHECK(!memcmp(copy + i * psz, p + i * psz, psz),
		      "page %zu: the delta lost a write to replaced memory "
		      "(%lu pages in it)", i, (unsigned long)info.pages);
	uffdwp_session_free(ss);
}

static void c_replaced_mmap_fixed(void) { replaced(0); }
static void c_replaced_munmap_mmap(void) { replaced(1); }
static void c_replaced_mremap(void) { replaced(2); }
static void c_replaced_munmap(void) { replaced(3); }

/* ---- snapshot files ---- */

static int session_files(int *base, int *delta)
{
	char *p = map_anon(16);
	struct uffdwp_region r = { p, 16 * psz };
	struct uffdwp_session *ss;

	*base = tmpfile_fd();
	*delta = tmpfile_fd();
	EXPECT(uffdwp_session_new(&ss, &r, 1, NULL), 0);
	EXPECT(uffdwp_session_snapshot(ss, *base, 0), 0);
	EXPECT(uffdwp_session_wait(ss, 20000), 0);
	memset(p + 3 * psz, 9, 2 * psz);
	EXPECT(uffdwp_session_snapshot(ss, *delta, 0), 0);
	EXPECT(uffdwp_session_wait(ss, 20000), 0);
	uffdwp_session_free(ss);
	return 16;
}

static void c_files(void)
{
	int base, delta, pfd[2], fd, nul;
	size_t pages;
	char *dst, junk[4096];
	struct uffdwp_region d, rg[4];
	struct uffdwp_snapshot_info info, binfo;
	off_t len;

	need_wp();
	pages = (size_t)session_files(&base, &delta);
	dst = map_anon(pages);
	d = (struct uffdwp_region){ dst, pages * psz };
	EXPECT(uffdwp_snapshot_read_info(base, NULL, NULL, 0), -EINVAL);
	EXPECT(uffdwp_snapshot_read_info(base, &info, NULL, 3), -EINVAL);
	EXPECT(uffdwp_snapshot_read_info(-1, &info, NULL, 0), -EBADF);
	EXPECT(uffdwp_snapshot_read_info(12345, &info, NULL, 0), -EBADF);
	CHECK(!pipe(pfd), "pipe");
	EXPECT(uffdwp_snapshot_read_info(pfd[0], &info, NULL, 0), -ESPIPE);
	lseek(base, 0, SEEK_SET);
	EXPECT(uffdwp_snapshot_read_info(base, &info, rg, 4), 1);
	nul = open("/dev/zero", O_RDONLY);
	EXPECT(uffdwp_snapshot_read_info(nul, &info, NULL, 0), -EBADMSG);
	/* load */
	lseek(base, 0, SEEK_SET);
	EXPECT(uffdwp_snapshot_load(base, NULL, 1, NULL, NULL), -EINVAL);
	EXPECT(uffdwp_snapshot_load(base, &d, 0, NULL, NULL), -EINVAL);
	lseek(base, 0, SEEK_SET);
	EXPECT(uffdwp_snapshot_load(base, &d, 2, NULL, NULL), -EINVAL);
	EXPECT(uffdwp_snapshot_load(-1, &d, 1, NULL, NULL), -EBADF);
	EXPECT(uffdwp_snapshot_load(nul, &d, 1, NULL, NULL), -EBADMSG);
	close(pfd[1]);
	EXPECT(uffdwp_snapshot_load(pfd[0], &d, 1, NULL, NULL), -EBADMSG);
	/* a delta without its base, then after the wrong one */
	lseek(delta, 0, SEEK_SET);
	EXPECT(uffdwp_snapshot_load(delta, &d, 1, NULL, NULL), -ESTALE);
	lseek(base, 0, SEEK_SET);
	EXPECT(uffdwp_snapshot_load(base, &d, 1, NULL, &binfo), 0);
	binfo.session ^= 1;
	lseek(delta, 0, SEEK_SET);
	EXPECT(uffdwp_snapshot_load(delta, &d, 1, &binfo, NULL), -ESTALE);
	/* into read-only memory */
	mprotect(dst, pages * psz, PROT_READ);
	lseek(base, 0, SEEK_SET);
	EXPECT(uffdwp_snapshot_load(base, &d, 1, NULL, NULL), -EFAULT);
	mprotect(dst, pages * psz, PROT_READ | PROT_WRITE);
	/* a truncated file */
	len = lseek(base, 0, SEEK_END);
	fd = tmpfile_fd();
	for (off_t off = 0; off < len - 100; off += (off_t)sizeof(junk)) {
		size_t n = (size_t)(len - 100 - off) < sizeof(junk) ?
			   (size_t)(len - 100 - off) : sizeof(junk);

		CHECK(pread(base, junk, n, off) == (ssize_t)n, "pread");
		CHECK(pwrite(fd, junk, n, off) == (ssize_t)n, "pwrite");
	}
	lseek(fd, 0, SEEK_SET);
	EXPECT(uffdwp_snapshot_load(fd, &d, 1, NULL, NULL), -EBADMSG);
}

/*
 * Issue #35 (B7): every byte of a snapshot file is covered by a checksum:
 * a byte flipped anywhere makes load fail (-EBADMSG), never load quietly.
 */
static void c_files_flipped(void)
{
	int base, delta, bad = 0, tried = 0;
	size_t pages;
	char *dst;
	struct uffdwp_region d;
	struct uffdwp_snapshot_info binfo;
	off_t len;
	unsigned int seed = 35;

	need_wp();
	pages = (size_t)session_files(&base, &delta);
	dst = map_anon(pages);
	d = (struct uffdwp_region){ dst, pages * psz };
	lseek(base, 0, SEEK_SET);
	EXPECT(uffdwp_snapshot_load(base, &d, 1, NULL, &binfo), 0);
	len = lseek(delta, 0, SEEK_END);
	for (int i = 0; i < 400; i++) {
		off_t off = i < 200 ? (off_t)i * 37 % len :
				      (off_t)((size_t)rand_r(&seed) % (size_t)len);
		unsigned char c, x = (unsigned char)(1u << (i % 8));
		int err;

		CHECK(pread(delta, &c, 1, off) == 1, "pread");
		c ^= x;
		CHECK(pwrite(delta, &c, 1, off) == 1, "pwrite");
		lseek(delta, 0, SEEK_SET);
		err = uffdwp_snapshot_load(delta, &d, 1, &binfo, NULL);
		c ^= x;
		CHECK(pwrite(delta, &c, 1, off) == 1, "pwrite");
		tried++;
		if (err == 0)
			bad++;
		else
			CHECK(err == -EBADMSG || err == -EPROTONOSUPPORT ||
			      err == -ESTALE || err == -EINVAL,
			      "flip at %ld: %d", (long)off, err);
	}
	CHECK(!bad, "%d of %d deltas with a flipped byte loaded", bad, tried);
	lseek(delta, 0, SEEK_SET);
	EXPECT(uffdwp_snapshot_load(delta, &d, 1, &binfo, NULL), 0);
}

/* ---- trackers ---- */

static void c_tracker_args(void)
{
	char *p = map_anon(8);
	struct uffdwp_region r = { p, 8 * psz };
	struct uffdwp_tracker *t = GARBAGE;
	void *pages[4];

	EXPECT(uffdwp_tracker_new(NULL, &r, 1, 0), -EINVAL);
	EXPECT(uffdwp_tracker_new(&t, NULL, 1, 0), -EINVAL);
	CHECK(t == NULL, "*out not cleared");
	EXPECT(uffdwp_tracker_new(&t, &r, 0, 0), -EINVAL);
	EXPECT(uffdwp_tracker_new(&t, &r, SIZE_MAX, 0), -EINVAL);
	EXPECT(uffdwp_tracker_new(&t, GARBAGE, 1, 0), -EINVAL);
	EXPECT(uffdwp_tracker_new(GARBAGE, &r, 1, 0), -EINVAL);
	EXPECT(uffdwp_tracker_new(&t, &r, 1, (enum uffdwp_backend)-1), -EINVAL);
	EXPECT(uffdwp_tracker_new(&t, &r, 1, UFFDWP_BACKEND_COUNT), -EINVAL);
	EXPECT(uffdwp_tracker_collect(NULL, pages, 4), -EINVAL);
	uffdwp_tracker_free(NULL);
	for (int b = 1; b < UFFDWP_BACKEND_COUNT; b++) {
		if (uffdwp_backend_available(b))
			continue;
		EXPECT(uffdwp_tracker_new(&t, &r, 1, b), 0);
		EXPECT(uffdwp_tracker_collect(t, NULL, 4), -EINVAL);
		EXPECT(uffdwp_tracker_collect(t, NULL, 0), 0);
		EXPECT(uffdwp_tracker_collect(t, pages, 0), 0);
		EXPECT(uffdwp_tracker_backend(t), b);
		uffdwp_tracker_free(t);
	}
}

/* Trackers check regions as snapshots do (issue #35, B6). */
static void c_tracker_regions(void)
{
	int tried = 0;

	for (int b = 1; b < UFFDWP_BACKEND_COUNT; b++) {
		if (uffdwp_backend_available(b))
			continue;
		tried++;
		for (int k = 0; k < B_N; k++) {
			struct uffdwp_region r = bad_region(k);
			struct uffdwp_tracker *t;
			int err = uffdwp_tracker_new(&t, &r, 1, b);

			if (!err)
				uffdwp_tracker_free(t);
			CHECK(err == bad_err[k], "%s: %s region: %d, want %d",
			      uffdwp_backend_name(b), bad_name[k], err,
			      bad_err[k]);
		}
	}
	if (!tried)
		tap_leave(77, "no backend available");
}

/* The mprotect backend over the caller's own stack: an error, not a
 * SIGSEGV (issue #35, B1). */
static void c_tracker_own_stack(void)
{
	struct uffdwp_region r;
	struct uffdwp_tracker *t;
	void *pages[8];
	int err;

	own_stack_region(&r);
	for (int b = 1; b < UFFDWP_BACKEND_COUNT; b++) {
		if (uffdwp_backend_available(b))
			continue;
		err = uffdwp_tracker_new(&t, &r, 1, b);
		if (err) {
			CHECK(err == -EDEADLK || err == -EINVAL, "%s: %d",
			      uffdwp_backend_name(b), err);
			continue;
		}
		for (int i = 0; i < 3; i++) {
			ssize_t n = uffdwp_tracker_collect(t, pages, 8);

			CHECK(n >= 0, "%s: collect %zd",
			      uffdwp_backend_name(b), n);
		}
		uffdwp_tracker_free(t);
	}
}

/* A tracker inherited by fork() is inert in the child (issue #35, B3). */
static void c_tracker_fork(void)
{
	int tried = 0;

	for (int b = 1; b < UFFDWP_BACKEND_COUNT; b++) {
		char *p = map_anon(8);
		struct uffdwp_region r = { p, 8 * psz };
		struct uffdwp_tracker *t;
		void *pages[8];
		ssize_t n;
		pid_t pid;
		int st;

		if (uffdwp_backend_available(b))
			continue;
		tried++;
		EXPECT(uffdwp_tracker_new(&t, &r, 1, b), 0);
		pid = fork();
		if (pid == 0) {
			n = uffdwp_tracker_collect(t, pages, 8);
			uffdwp_tracker_free(t);
			p[0] = 1;	/* the child's memory is its own */
			_exit(n == -ECHILD ? 0 : 10);
		}
		CHECK(pid > 0, "fork");
		waitpid(pid, &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "%s: child's collect not -ECHILD, or it died (%#x)",
		      uffdwp_backend_name(b), st);
		p[2 * psz] = 7;
		n = uffdwp_tracker_collect(t, pages, 8);
		CHECK(n >= 1, "%s: parent's collect after the child's free: "
		      "%zd", uffdwp_backend_name(b), n);
		CHECK(pages[0] == p + 2 * psz || n > 1, "%s: wrong page",
		      uffdwp_backend_name(b));
		p[3 * psz] = 7;
		n = uffdwp_tracker_collect(t, pages, 8);
		CHECK(n == 1 && pages[0] == p + 3 * psz,
		      "%s: second collect %zd", uffdwp_backend_name(b), n);
		uffdwp_tracker_free(t);
	}
	if (!tried)
		tap_leave(77, "no backend available");
}

/* Misuse under a tracker: munmap, PROT_NONE, free while writers run. */
static void c_tracker_concurrent(void)
{
	for (int b = 1; b < UFFDWP_BACKEND_COUNT; b++) {
		size_t pages = 256;
		char *p = map_anon(pages);
		struct uffdwp_region r = { p, pages * psz };
		struct uffdwp_tracker *t;
		struct writers w;
		void *out[256];
		ssize_t n;

		if (uffdwp_backend_available(b))
			continue;
		EXPECT(uffdwp_tracker_new(&t, &r, 1, b), 0);
		writers_start(&w, p, pages / 2 * psz);
		for (int i = 0; i < 5; i++) {
			n = uffdwp_tracker_collect(t, out, 256);
			CHECK(n >= 0, "%s: collect with writers %zd",
			      uffdwp_backend_name(b), n);
		}
		uffdwp_tracker_free(t);		/* writers still run */
		writers_stop(&w);
		EXPECT(uffdwp_tracker_new(&t, &r, 1, b), 0);
		munmap(p + pages / 2 * psz, pages / 2 * psz);
		n = uffdwp_tracker_collect(t, out, 256);
		CHECK(n < 0 || n <= 256, "%s: collect after munmap %zd",
		      uffdwp_backend_name(b), n);
		mprotect(p, pages / 2 * psz, PROT_NONE);
		n = uffdwp_tracker_collect(t, out, 256);
		CHECK(n < 0 || n <= 256, "%s: collect after PROT_NONE %zd",
		      uffdwp_backend_name(b), n);
		uffdwp_tracker_free(t);
	}
}

/* ---- the functions of 0.4 ---- */

/* A page the caller may read but not write: an output buffer that
 * faults. */
static void *read_only_page(void)
{
	char *p = map_anon(1);

	CHECK(!mprotect(p, psz, PROT_READ), "mprotect");
	return p;
}

/*
 * Completion descriptors and sized stats: NULL, garbage, misaligned,
 * freed handles and handles of the other kind are -EINVAL; stats_v's
 * size 0, 4, 12, 4097, ~0 and an unwritable or unreadable struct are
 * -EINVAL.
 */
static void c_v04_handles(void)
{
	char *p = map_anon(8);
	struct uffdwp_region r = { p, 8 * psz };
	int fd = tmpfile_fd();
	struct uffdwp_snapshot_opts o = { .sink_fd = fd };
	struct uffdwp_stats_v v = { .size = sizeof(v) };
	struct uffdwp_stats_v *ro = read_only_page();
	static const uint32_t bad_size[] = { 0, 4, 12, 4097, 8192, ~0u };
	struct uffdwp_session *ss;
	struct uffdwp_snapshot *s;
	struct uffdwp_tracker *t;

	need_wp();
	EXPECT(uffdwp_snapshot_fd(NULL), -EINVAL);
	EXPECT(uffdwp_snapshot_fd(GARBAGE), -EINVAL);
	EXPECT(uffdwp_session_fd(NULL), -EINVAL);
	EXPECT(uffdwp_session_fd(GARBAGE), -EINVAL);
	EXPECT(uffdwp_snapshot_stats_v(NULL, &v), -EINVAL);
	EXPECT(uffdwp_session_stats_v(GARBAGE, &v), -EINVAL);
	/* A page of ours that is no handle, and one misaligned. */
	EXPECT(uffdwp_snapshot_fd((struct uffdwp_snapshot *)p), -EINVAL);
	EXPECT(uffdwp_session_fd((struct uffdwp_session *)(p + 8)), -EINVAL);

	EXPECT(uffdwp_snapshot_start(&s, &r, 1, &o), 0);
	EXPECT(uffdwp_snapshot_wait(s, 20000), 0);
	CHECK(uffdwp_snapshot_fd(s) >= 0, "snapshot_fd");
	/* A snapshot is no session, nor a tracker. */
	EXPECT(uffdwp_session_fd((struct uffdwp_session *)s), -EINVAL);
	EXPECT(uffdwp_session_stats_v((struct uffdwp_session *)s, &v), -EINVAL);
	EXPECT(uffdwp_tracker_collect_ranges((struct uffdwp_tracker *)s,
					     NULL, 0), -EINVAL);
	EXPECT(uffdwp_snapshot_stats_v(s, NULL), -EINVAL);
	EXPECT(uffdwp_snapshot_stats_v(s, GARBAGE), -EINVAL);
	EXPECT(uffdwp_snapshot_stats_v(s, ro), -EINVAL);
	for (size_t i = 0; i < sizeof(bad_size) / sizeof(bad_size[0]); i++) {
		v.size = bad_size[i];
		EXPECT(uffdwp_snapshot_stats_v(s, &v), -EINVAL);
	}
	v.size = sizeof(v);
	EXPECT(uffdwp_snapshot_stats_v(s, &v), 0);
	uffdwp_snapshot_free(s);
	/* Freed: its mapping is gone. */
	EXPECT(uffdwp_snapshot_fd(s), -EINVAL);
	EXPECT(uffdwp_snapshot_stats_v(s, &v), -EINVAL);

	EXPECT(uffdwp_session_new(&ss, &r, 1, NULL), 0);
	CHECK(uffdwp_session_fd(ss) >= 0, "session_fd");
	EXPECT(uffdwp_snapshot_fd((struct uffdwp_snapshot *)ss), -EINVAL);
	EXPECT(uffdwp_session_stats_v(ss, &v), -ENOENT);
	uffdwp_session_free(ss);
	EXPECT(uffdwp_session_fd(ss), -EINVAL);
	EXPECT(uffdwp_session_stats_v(ss, &v), -EINVAL);

	EXPECT(uffdwp_tracker_new(&t, &r, 1, UFFDWP_BACKEND_MPROTECT), 0);
	EXPECT(uffdwp_snapshot_fd((struct uffdwp_snapshot *)t), -EINVAL);
	EXPECT(uffdwp_session_fd((struct uffdwp_session *)t), -EINVAL);
	uffdwp_tracker_free(t);
}

/*
 * Regions added and removed, dirty ranges: hostile pointers, regions and
 * buffers; freed sessions; a child of fork() gets -ECHILD and changes
 * nothing of the parent's session.
 */
static void c_v04_session(void)
{
	char *p = map_anon(8), *q = map_anon(8);
	struct uffdwp_region r = { p, 8 * psz }, rq = { q, 8 * psz };
	struct uffdwp_region wrap = { p, (size_t)0 - psz }, out[4];
	struct uffdwp_region *ro = read_only_page();
	struct uffdwp_session *ss, *gone;
	int fd = tmpfile_fd(), st;
	pid_t pid;

	need_wp();
	EXPECT(uffdwp_session_add_region(NULL, &rq), -EINVAL);
	EXPECT(uffdwp_session_add_region(GARBAGE, &rq), -EINVAL);
	EXPECT(uffdwp_session_remove_region(NULL, &r), -EINVAL);
	EXPECT(uffdwp_session_dirty_ranges(NULL, out, 4), -EINVAL);
	EXPECT(uffdwp_session_dirty_ranges(GARBAGE, NULL, 0), -EINVAL);
	EXPECT(uffdwp_session_new(&ss, &r, 1, NULL), 0);
	EXPECT(uffdwp_session_add_region(ss, NULL), -EINVAL);
	EXPECT(uffdwp_session_add_region(ss, GARBAGE), -EINVAL);
	EXPECT(uffdwp_session_add_region(ss, &wrap), -EINVAL);
	EXPECT(uffdwp_session_remove_region(ss, GARBAGE), -EINVAL);
	EXPECT(uffdwp_session_remove_region(ss, &wrap), -EINVAL);
	for (int k = 0; k < B_N; k++) {
		struct uffdwp_region b = bad_region(k);
		int err = uffdwp_session_add_region(ss, &b);

		CHECK(err == bad_err[k], "add %s region: %d, want %d",
		      bad_name[k], err, bad_err[k]);
	}
	EXPECT(uffdwp_session_remove_region(ss, &rq), -ENOENT);
	EXPECT(uffdwp_session_remove_region(ss, &r), -EINVAL);
	EXPECT(uffdwp_session_snapshot(ss, fd, 0), 0);
	EXPECT(uffdwp_session_wait(ss, 20000), 0);
	p[0] = 1;
	p[2 * psz] = 1;
	EXPECT(uffdwp_session_dirty_ranges(ss, NULL, 4), -EINVAL);
	EXPECT(uffdwp_session_dirty_ranges(ss, GARBAGE, 4), -EINVAL);
	EXPECT(uffdwp_session_dirty_ranges(ss, ro, 4), -EINVAL);
	EXPECT(uffdwp_session_dirty_ranges(ss, NULL, 0), 2);
	EXPECT(uffdwp_session_dirty_ranges(ss, out, 1), 2);
	/* In a child: inert, the parent's session untouched. */
	fflush(stdout);
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		EXPECT(uffdwp_session_add_region(ss, &rq), -ECHILD);
		EXPECT(uffdwp_session_remove_region(ss, &r), -ECHILD);
		EXPECT(uffdwp_session_dirty_ranges(ss, out, 4), -ECHILD);
		EXPECT(uffdwp_session_fd(ss), -ECHILD);
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
	      !WEXITSTATUS(st), "child: status %#x %s", st, tap_msg);
	EXPECT(uffdwp_session_add_region(ss, &rq), 0);
	EXPECT(uffdwp_session_dirty(ss), 10);
	/* Removed after its memory was unmapped: still removed. */
	CHECK(!munmap(q, 8 * psz), "munmap");
	EXPECT(uffdwp_session_remove_region(ss, &rq), 0);
	EXPECT(uffdwp_session_dirty(ss), 2);
	EXPECT(uffdwp_session_snapshot(ss, fd, 0), 0);
	EXPECT(uffdwp_session_wait(ss, 20000), 0);
	gone = ss;
	uffdwp_session_free(ss);
	EXPECT(uffdwp_session_add_region(gone, &rq), -EINVAL);
	EXPECT(uffdwp_session_remove_region(gone, &r), -EINVAL);
	EXPECT(uffdwp_session_dirty_ranges(gone, NULL, 0), -EINVAL);
}

/*
 * Regions added and removed while writers run in them: a writer on a
 * region being removed goes on (its wait, if any, ends), the session's
 * snapshots go on succeeding; a region added with writers in it.
 */
static void c_v04_session_concurrent(void)
{
	char *p = map_anon(64), *q = map_anon(64);
	struct uffdwp_region r = { p, 64 * psz }, rq = { q, 64 * psz };
	struct uffdwp_region both[2] = { r, rq };
	struct uffdwp_session *ss;
	struct writers wp, wq;
	int fd = tmpfile_fd();

	need_wp();
	EXPECT(uffdwp_session_new(&ss, both, 2, NULL), 0);
	writers_start(&wp, p, 64 * psz);
	writers_start(&wq, q, 64 * psz);
	for (int i = 0; i < 10; i++) {
		EXPECT(uffdwp_session_snapshot(ss, fd, 0), 0);
		EXPECT(uffdwp_session_wait(ss, 20000), 0);
		EXPECT(uffdwp_session_remove_region(ss, &rq), 0);
		EXPECT(uffdwp_session_snapshot(ss, fd, 0), 0);
		EXPECT(uffdwp_session_wait(ss, 20000), 0);
		EXPECT(uffdwp_session_add_region(ss, &rq), 0);
	}
	writers_stop(&wq);
	writers_stop(&wp);
	uffdwp_session_free(ss);
}

/*
 * Tracker ranges: hostile handles and buffers are -EINVAL, and an
 * unwritable buffer takes nothing: the pages are in the next call.
 */
static void c_v04_tracker(void)
{
	char *p = map_anon(8);
	struct uffdwp_region r = { p, 8 * psz }, out[4];
	struct uffdwp_region *ro = read_only_page();
	struct uffdwp_tracker *t;

	EXPECT(uffdwp_tracker_collect_ranges(NULL, out, 4), -EINVAL);
	EXPECT(uffdwp_tracker_collect_ranges(GARBAGE, out, 4), -EINVAL);
	EXPECT(uffdwp_tracker_collect_ranges((struct uffdwp_tracker *)p,
					     out, 4), -EINVAL);
	for (int b = 1; b < UFFDWP_BACKEND_COUNT; b++) {
		if (uffdwp_backend_available(b))
			continue;
		EXPECT(uffdwp_tracker_new(&t, &r, 1, b), 0);
		p[psz] = 1;
		p[2 * psz] = 1;
		EXPECT(uffdwp_tracker_collect_ranges(t, NULL, 4), -EINVAL);
		EXPECT(uffdwp_tracker_collect_ranges(t, GARBAGE, 4), -EINVAL);
		EXPECT(uffdwp_tracker_collect_ranges(t, ro, 4), -EINVAL);
		EXPECT(uffdwp_tracker_collect_ranges(t, out, 4), 1);
		CHECK(out[0].addr == p + psz && out[0].len == 2 * psz,
		      "%s: range %p+%zu, want %p+%zu", uffdwp_backend_name(b),
		      out[0].addr, out[0].len, (void *)(p + psz), 2 * psz);
		uffdwp_tracker_free(t);
		EXPECT(uffdwp_tracker_collect_ranges(t, out, 4), -EINVAL);
	}
}

int main(void)
{
	static const struct {
		const char *name;
		int secs;
		void (*fn)(void);
	} cases[] = {
		{ "hostile/version", 10, c_version },
		{ "hostile/probe-names", 10, c_probe },
		{ "hostile/probe-not-cached-after-emfile", 30, c_probe_emfile },
		{ "hostile/open-flags", 10, c_open },
		{ "hostile/backend-names", 10, c_names },
		{ "hostile/snapshot-args", 60, c_snapshot_args },
		{ "hostile/snapshot-bad-regions", 30, c_snapshot_regions },
		{ "hostile/snapshot-sink-kinds", 60, c_snapshot_sink_kinds },
		{ "hostile/snapshot-concurrent-misuse", 120,
		  c_snapshot_concurrent },
		{ "hostile/snapshot-own-stack", 30, c_snapshot_own_stack },
		{ "hostile/session-malloc-heap", 30, c_snapshot_malloc_heap },
		{ "hostile/session-own-stack", 30, c_session_own_stack },
		{ "hostile/snapshot-no-threads-enomem", 30,
		  c_snapshot_no_threads },
		{ "hostile/session-args", 60, c_session_args },
		{ "hostile/session-replaced-mmap-fixed", 30,
		  c_replaced_mmap_fixed },
		{ "hostile/session-replaced-munmap-mmap", 30,
		  c_replaced_munmap_mmap },
		{ "hostile/session-replaced-mremap", 30, c_replaced_mremap },
		{ "hostile/session-munmap-efault", 30, c_replaced_munmap },
		{ "hostile/files", 60, c_files },
		{ "hostile/files-flipped-byte", 60, c_files_flipped },
		{ "hostile/tracker-args", 30, c_tracker_args },
		{ "hostile/tracker-bad-regions", 30, c_tracker_regions },
		{ "hostile/tracker-own-stack", 30, c_tracker_own_stack },
		{ "hostile/tracker-fork-inert", 30, c_tracker_fork },
		{ "hostile/tracker-concurrent-misuse", 60,
		  c_tracker_concurrent },
		{ "hostile/v04-handles", 30, c_v04_handles },
		{ "hostile/v04-session-regions", 60, c_v04_session },
		{ "hostile/v04-session-regions-concurrent", 120,
		  c_v04_session_concurrent },
		{ "hostile/v04-tracker-ranges", 30, c_v04_tracker },
	};
	size_t n = sizeof(cases) / sizeof(cases[0]);

	psz = (size_t)sysconf(_SC_PAGESIZE);
	if (!tap_child_init())
		return 1;
	tap_plan((int)n);
	for (size_t i = 0; i < n; i++)
		run(cases[i].name, cases[i].secs, cases[i].fn);
	return tap_done();
}
