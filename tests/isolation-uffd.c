// SPDX-License-Identifier: GPL-2.0
/*
 * isolation-uffd: what a userfaultfd reaches when it ends up in another,
 * less privileged process.
 *
 * A userfaultfd is bound to the mm of the process that created it
 * (ctx->mm, fs/userfaultfd.c new_userfaultfd()); its ioctls act on that mm
 * whoever calls them -- only UFFDIO_MOVE checks current->mm.  So an fd that
 * a root process leaks across fork() into a child that then drops to an
 * unprivileged uid stays a handle on the parent's memory.  That is the
 * usual fd-as-capability rule (like an inherited /proc/PID/mem fd), and it
 * is safe as long as the fd only gives what the creator could do:
 *  - WRITEPROTECT from the child protects the parent's page, never the
 *    child's own copy (the child's VMA is not registered without
 *    EVENT_FORK), and the protection works (the parent's pagemap shows it);
 *  - nothing copies the parent's memory out: UFFDIO_MOVE across mms is
 *    EINVAL, and UFFDIO_COPY only copies the child's data *into* holes of
 *    the parent (onto a populated page it is EEXIST and the parent's data
 *    is untouched);
 *  - REGISTER of an address mapped only in the child fails (the range is
 *    looked up in the parent's mm): the fd cannot be turned on the child;
 *  - once the creator's mm is gone, every ioctl fails (ESRCH/ENOMEM),
 *    nothing is reached.
 * vm.unprivileged_userfaultfd and /dev/userfaultfd are covered by
 * conformance-privilege.
 * Ring cases (only with UFFD_FEATURE_WP_RING): the ring mapping exposes the
 * ring and nothing else -- reading past it faults, writing it faults, and
 * an unprivileged child holding the fd can map it read-only only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

#define NOBODY		65534
#define WAIT_MS		5000
#define WHY_LEN		300

static long psz;

struct verdict {
	int ok;
	char why[WHY_LEN];
};

static bool fail(char *why, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static bool fail(char *why, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, WHY_LEN, fmt, ap);
	va_end(ap);
	return false;
}

static bool drop_to_nobody(char *why)
{
	gid_t g = NOBODY;

	if (setgroups(1, &g) || setgid(NOBODY) || setuid(NOBODY))
		return fail(why, "dropping to uid %d: %s", NOBODY,
			    strerror(errno));
	prctl(PR_SET_DUMPABLE, 1);	/* our own pagemap stays readable */
	if (getuid() != NOBODY || geteuid() != NOBODY)
		return fail(why, "still uid %d", geteuid());
	return true;
}

/* Fork; the child drops to nobody and runs FN(ARG); its verdict. */
static bool in_nobody_child(bool (*fn)(void *arg, char *why), void *arg,
			    char *why)
{
	struct verdict v = { 0 };
	struct pollfd p;
	int pfd[2], status;
	pid_t pid;

	if (pipe(pfd))
		return fail(why, "pipe: %s", strerror(errno));
	pid = fork();
	if (pid == 0) {
		close(pfd[0]);
		v.ok = drop_to_nobody(v.why) && fn(arg, v.why);
		_exit(write(pfd[1], &v, sizeof(v)) == sizeof(v) ? 0 : 1);
	}
	close(pfd[1]);
	if (pid < 0)
		return fail(why, "fork: %s", strerror(errno));
	p = (struct pollfd){ .fd = pfd[0], .events = POLLIN };
	if (poll(&p, 1, WAIT_MS) != 1 || read(pfd[0], &v, sizeof(v)) != sizeof(v))
		snprintf(v.why, sizeof(v.why), "no verdict from the child");
	close(pfd[0]);
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	memcpy(why, v.why, WHY_LEN);
	return v.ok;
}

/* ---- an inherited uffd acts on its creator's mm ------------------------- */

struct shared_setup {
	int uffd;
	char *page;		/* registered WP in the parent, 'P' */
	char *hole;		/* registered MISSING in the parent, empty */
	pid_t creator;
};

static bool child_wp_parent(void *arg, char *why)
{
	struct shared_setup *s = arg;
	int err = uffd_wp(s->uffd, s->page, psz, UFFDIO_WRITEPROTECT_MODE_WP);

	if (err)
		return fail(why, "child's UFFDIO_WRITEPROTECT: %s", strerror(-err));
	/* The child's own copy is not protected: its write just works. */
	if (pagemap_entry(s->page) & PM_UFFD_WP)
		return fail(why, "the child's own page got the uffd-wp bit");
	s->page[1] = 'c';
	if (s->page[1] != 'c' || s->page[0] != 'P')
		return fail(why, "child's page reads '%c%c'", s->page[0],
			    s->page[1]);
	return true;
}

static bool inherited_wp_acts_on_owner(char *why)
{
	struct shared_setup s = { .uffd = -1 };
	bool ok;
	int err;

	s.page = map_anon_aligned(psz, psz);
	s.uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (!s.page || s.uffd < 0)
		return fail(why, "setup failed");
	memset(s.page, 'P', psz);
	err = uffd_register(s.uffd, s.page, psz, UFFDIO_REGISTER_MODE_WP, NULL);
	if (err)
		return fail(why, "register: %s", strerror(-err));
	if (page_wp(s.page))
		return fail(why, "page protected before the child ran");
	ok = in_nobody_child(child_wp_parent, &s, why);
	if (ok && !page_wp(s.page))
		ok = fail(why, "the child's WRITEPROTECT did not reach the "
			  "uffd's own mm (parent pagemap %#" PRIx64 ")",
			  pagemap_entry(s.page));
	if (ok && (s.page[0] != 'P' || s.page[1] != 'P'))
		ok = fail(why, "parent's page changed: '%c%c'", s.page[0],
			  s.page[1]);
	close(s.uffd);
	munmap(s.page, psz);
	return ok;
}

static bool child_cannot_read(void *arg, char *why)
{
	struct shared_setup *s = arg;
	char *mine = map_anon_aligned(psz, psz), *only_mine;
	struct uffdio_move mv;
	struct uffdio_copy c;
	int err;

	if (!mine)
		return fail(why, "mmap: %s", strerror(errno));
	memset(mine, 'c', psz);
	/* MOVE would take the parent's page away: refused across mms. */
	mv = (struct uffdio_move){ .dst = (uintptr_t)mine,
				   .src = (uintptr_t)s->page, .len = psz };
	if (!ioctl(s->uffd, UFFDIO_MOVE, &mv))
		return fail(why, "UFFDIO_MOVE across mms succeeded");
	if (errno != EINVAL)
		return fail(why, "UFFDIO_MOVE across mms: %s, expected EINVAL",
			    strerror(errno));
	if (mine[0] != 'c')
		return fail(why, "the child's page changed after MOVE: '%c'",
			    mine[0]);
	/* COPY goes child -> parent; onto a populated page it is EEXIST. */
	c = (struct uffdio_copy){ .dst = (uintptr_t)s->page,
				  .src = (uintptr_t)mine, .len = psz };
	if (!ioctl(s->uffd, UFFDIO_COPY, &c))
		return fail(why, "UFFDIO_COPY onto the parent's populated page "
			    "succeeded");
	if (errno != EEXIST && errno != EINVAL && errno != ENOENT)
		return fail(why, "UFFDIO_COPY onto a populated page: %s",
			    strerror(errno));
	/* REGISTER looks the range up in the parent's mm. */
	only_mine = mmap(NULL, 16 * psz, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (only_mine == MAP_FAILED)
		return fail(why, "mmap: %s", strerror(errno));
	err = uffd_register(s->uffd, only_mine, 16 * psz,
			    UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		return fail(why, "REGISTER of a range mapped only in the child "
			    "succeeded (the parent has it mapped too?)");
	return true;
}

static bool inherited_cannot_read_owner(char *why)
{
	struct shared_setup s = { .uffd = -1 };
	bool ok;
	int err;

	s.page = map_anon_aligned(psz, psz);
	s.uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_MOVE,
			   NULL);
	if (!s.page || s.uffd < 0)
		return fail(why, "setup failed");
	memset(s.page, 'P', psz);
	err = uffd_register(s.uffd, s.page, psz, UFFDIO_REGISTER_MODE_MISSING |
			    UFFDIO_REGISTER_MODE_WP, NULL);
	if (err)
		return fail(why, "register: %s", strerror(-err));
	ok = in_nobody_child(child_cannot_read, &s, why);
	for (long i = 0; ok && i < psz; i++)
		if (s.page[i] != 'P')
			ok = fail(why, "parent's byte %ld is '%c' after the "
				  "child's ioctls", i, s.page[i]);
	close(s.uffd);
	munmap(s.page, psz);
	return ok;
}

/* ---- the creator's mm gone --------------------------------------------- */

static bool child_after_owner_exit(void *arg, char *why)
{
	struct shared_setup *s = arg;
	long long end = now_ms() + WAIT_MS;
	struct uffdio_copy c;
	int err;

	/* Wait until the middle process (the uffd's creator) is gone. */
	while (getppid() == s->creator) {
		if (now_ms() > end)
			return fail(why, "creator did not exit");
		usleep(1000);
	}
	err = uffd_wp(s->uffd, s->page, psz, UFFDIO_WRITEPROTECT_MODE_WP);
	if (!err)
		return fail(why, "WRITEPROTECT through a uffd whose mm is gone "
			    "succeeded");
	if (err != -ESRCH && err != -ENOMEM && err != -EINVAL && err != -ENOENT)
		return fail(why, "WRITEPROTECT after owner exit: %s",
			    strerror(-err));
	c = (struct uffdio_copy){ .dst = (uintptr_t)s->hole,
				  .src = (uintptr_t)s->page, .len = psz };
	if (!ioctl(s->uffd, UFFDIO_COPY, &c))
		return fail(why, "COPY through a uffd whose mm is gone "
			    "succeeded");
	err = uffd_register(s->uffd, s->page, psz, UFFDIO_REGISTER_MODE_WP,
			    NULL);
	if (!err)
		return fail(why, "REGISTER through a uffd whose mm is gone "
			    "succeeded");
	return true;
}

static bool owner_gone(char *why)
{
	struct verdict v = { 0 };
	int pfd[2], status;
	struct pollfd p;
	pid_t mid;

	if (pipe(pfd))
		return fail(why, "pipe: %s", strerror(errno));
	mid = fork();
	if (mid == 0) {
		/* The creator: uffd, registered memory, a child, then exit. */
		struct shared_setup s = { .uffd = -1 };
		pid_t c;

		prctl(PR_SET_PDEATHSIG, 0);
		s.page = map_anon_aligned(psz, psz);
		s.hole = map_anon_aligned(psz, psz);
		s.uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
		if (!s.page || !s.hole || s.uffd < 0 ||
		    uffd_register(s.uffd, s.page, psz, UFFDIO_REGISTER_MODE_WP,
				  NULL) ||
		    uffd_register(s.uffd, s.hole, psz,
				  UFFDIO_REGISTER_MODE_MISSING, NULL))
			_exit(2);
		memset(s.page, 'M', psz);
		s.creator = getpid();
		c = fork();
		if (c == 0) {
			close(pfd[0]);
			v.ok = drop_to_nobody(v.why) &&
			       child_after_owner_exit(&s, v.why);
			_exit(write(pfd[1], &v, sizeof(v)) == sizeof(v) ? 0 : 1);
		}
		_exit(c < 0 ? 3 : 0);
	}
	close(pfd[1]);
	if (mid < 0)
		return fail(why, "fork: %s", strerror(errno));
	waitpid(mid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		return fail(why, "creator process failed (status %#x)", status);
	p = (struct pollfd){ .fd = pfd[0], .events = POLLIN };
	if (poll(&p, 1, 2 * WAIT_MS) != 1 ||
	    read(pfd[0], &v, sizeof(v)) != sizeof(v))
		snprintf(v.why, sizeof(v.why), "no verdict from the orphan");
	close(pfd[0]);
	memcpy(why, v.why, WHY_LEN);
	return v.ok;
}

/* ---- the ring mapping ---------------------------------------------------- */

static sigjmp_buf probe_jmp;

static void on_probe_fault(int sig)
{
	siglongjmp(probe_jmp, sig);
}

/* 0 if the access worked, else the signal. */
static int probe(volatile char *p, bool write)
{
	struct sigaction sa = { .sa_handler = on_probe_fault }, o1, o2;
	int sig;

	sigaction(SIGSEGV, &sa, &o1);
	sigaction(SIGBUS, &sa, &o2);
	sig = sigsetjmp(probe_jmp, 1);
	if (!sig) {
		if (write)
			*p = 1;
		else
			(void)*p;
	}
	sigaction(SIGSEGV, &o1, NULL);
	sigaction(SIGBUS, &o2, NULL);
	return sig;
}

static bool ring_bounds(void *arg, char *why)
{
	int uffd = ((size_t *)arg)[0];
	size_t len = ((size_t *)arg)[1];
	char *m;

	/* Map the ring (set up by the parent) as the unprivileged child. */
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, uffd, 0);
	if (m != MAP_FAILED)
		return fail(why, "writable mapping of the ring succeeded");
	m = mmap(NULL, len, PROT_READ, MAP_SHARED, uffd, 0);
	if (m == MAP_FAILED)
		return fail(why, "read-only ring mmap: %s", strerror(errno));
	if (probe(m, false))
		return fail(why, "reading the ring header faulted");
	if (!probe(m, true))
		return fail(why, "writing the read-only ring mapping worked");
	if (mprotect(m, len, PROT_READ | PROT_WRITE) == 0)
		return fail(why, "mprotect of the ring to writable worked");
	munmap(m, len);
	/* A mapping one page larger than the ring must be refused, so the
	 * page after the ring can never be read through it. */
	m = mmap(NULL, len + psz, PROT_READ, MAP_SHARED, uffd, 0);
	if (m != MAP_FAILED) {
		int sig = probe(m + len, false);

		munmap(m, len + psz);
		if (!sig)
			return fail(why, "an oversized ring mapping reads %ld "
				    "bytes past the ring", psz);
	}
	return true;
}

static bool ring_mapping(char *why)
{
	struct uffdio_ring_setup rs = { .entries = 64 };
	size_t arg[2];
	bool ok;
	int uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			     UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING, NULL);

	if (uffd < 0)
		return fail(why, "userfaultfd with WP_RING: %s", strerror(-uffd));
	if (ioctl(uffd, UFFDIO_RING_SETUP, &rs))
		return fail(why, "RING_SETUP: %s", strerror(errno));
	arg[0] = uffd;
	arg[1] = rs.mmap_size;
	ok = in_nobody_child(ring_bounds, arg, why);
	close(uffd);
	return ok;
}

static void run(const char *name, bool (*fn)(char *why))
{
	char why[WHY_LEN] = "";

	tap_check(fn(why), name, "%s", why);
}

int main(void)
{
	uint64_t got = 0;
	int fd;

	psz = page_size();
	watchdog(120);
	tap_plan(4);
	if (getuid() != 0)
		tap_bail("must run as root in the guest (uid %d)", getuid());
	fd = uffd_open(0, &got);
	if (fd < 0)
		tap_bail("userfaultfd: %s", strerror(-fd));
	close(fd);
	run("isolation-inherited-uffd-acts-on-owner-mm-only",
	    inherited_wp_acts_on_owner);
	run("isolation-inherited-uffd-cannot-read-owner",
	    inherited_cannot_read_owner);
	run("isolation-uffd-after-owner-exit-reaches-nothing", owner_gone);
	if (got & UFFD_FEATURE_WP_RING)
		run("isolation-ring-mapping-read-only-and-bounded", ring_mapping);
	else
		tap_skip("isolation-ring-mapping-read-only-and-bounded",
			 "kernel does not report UFFD_FEATURE_WP_RING");
	return tap_done();
}
