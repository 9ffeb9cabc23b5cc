// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-fork: uffd-wp across fork().
 *
 * Contract checked (issue tracker, area 7 "fork"):
 *  - Without UFFD_FEATURE_EVENT_FORK the child's copy of a write-protected
 *    page is not protected: the child's pagemap has no uffd-wp bit, its
 *    write completes without blocking and without a message on the parent's
 *    uffd, and the parent's page stays protected and unchanged.
 *  - With UFFD_FEATURE_EVENT_FORK a UFFD_EVENT_FORK message arrives whose
 *    arg.fork.ufd is a new userfaultfd for the child; the child's pages are
 *    protected, and the child's write raises a WP fault on that new uffd
 *    (not on the parent's), which the parent resolves.
 *  - A protected page shared copy-on-write between parent and child: the
 *    parent's write takes the WP fault first (the page is still the shared
 *    one while the fault is pending), then breaks COW after resolution; the
 *    child's copy keeps its old contents and frame.
 *
 * Kernel reference: fs/userfaultfd.c dup_userfaultfd() drops the uffd
 * context of the child's VMA when EVENT_FORK is off; mm/memory.c
 * copy_present_pte() clears the pte's uffd-wp bit when the child VMA is not
 * uffd-wp registered; do_wp_page() checks userfaultfd_pte_wp() before COW.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"

#define NPAGES		4
#define PM_PFN_MASK	((1ULL << 55) - 1)
#define CHILD_MS	5000

/* A populated, registered and write-protected private anonymous area. */
struct wp_area {
	int uffd;
	char *addr;
	size_t len;
};

static int wp_area_setup(struct wp_area *a, size_t npages, uint64_t features,
			 char fill, char *why, size_t whylen)
{
	int err;

	a->uffd = -1;
	a->len = npages * page_size();
	a->addr = map_anon_aligned(a->len, page_size());
	if (!a->addr) {
		snprintf(why, whylen, "mmap: %s", strerror(errno));
		return -1;
	}
	memset(a->addr, fill, a->len);
	a->uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP | features, NULL);
	if (a->uffd < 0) {
		snprintf(why, whylen, "uffd_open(features 0x%llx): %s",
			 (unsigned long long)features, strerror(-a->uffd));
		return -1;
	}
	err = uffd_register(a->uffd, a->addr, a->len, UFFDIO_REGISTER_MODE_WP,
			    NULL);
	if (!err)
		err = uffd_wp(a->uffd, a->addr, a->len,
			      UFFDIO_WRITEPROTECT_MODE_WP);
	if (err) {
		snprintf(why, whylen, "register/protect: %s", strerror(-err));
		return -1;
	}
	if (pages_with(a->addr, a->len, PM_UFFD_WP | PM_PRESENT) != npages) {
		snprintf(why, whylen, "parent pagemap: %zu of %zu pages WP",
			 pages_with(a->addr, a->len, PM_UFFD_WP), npages);
		return -1;
	}
	return 0;
}

static void wp_area_free(struct wp_area *a)
{
	if (a->uffd >= 0)
		close(a->uffd);
	if (a->addr)
		munmap(a->addr, a->len);
}

static size_t own_pages_with(char *addr, size_t npages, uint64_t mask)
{
	size_t n = 0;

	for (size_t i = 0; i < npages; i++)
		if ((pagemap_entry_fresh(addr + i * page_size()) & mask) == mask)
			n++;
	return n;
}

static bool read_full(int fd, void *buf, size_t len, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	long long end = now_ms() + timeout_ms;
	char *b = buf;

	while (len) {
		long long left = end - now_ms();
		ssize_t n;

		if (left <= 0 || poll(&p, 1, left) <= 0)
			return false;
		n = read(fd, b, len);
		if (n <= 0)
			return false;
		b += n;
		len -= n;
	}
	return true;
}

static void write_full(int fd, const void *buf, size_t len)
{
	if (write(fd, buf, len) != (ssize_t)len)
		_exit(99);
}

/* Reap PID within TIMEOUT_MS; on timeout SIGKILL it and return false. */
static bool wait_child(pid_t pid, int timeout_ms, int *status)
{
	long long end = now_ms() + timeout_ms;

	for (;;) {
		pid_t r = waitpid(pid, status, WNOHANG);

		if (r == pid)
			return true;
		if (r < 0 && errno != EINTR)
			return false;
		if (now_ms() >= end)
			break;
		usleep(2000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, status, 0);
	return false;
}

static bool child_exited_ok(pid_t pid, char *why, size_t whylen)
{
	int status = 0;

	if (!wait_child(pid, CHILD_MS, &status)) {
		snprintf(why, whylen, "child did not exit within %d ms "
			 "(blocked in a fault?)", CHILD_MS);
		return false;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		snprintf(why, whylen, "child status 0x%x", status);
		return false;
	}
	return true;
}

/* ---- fork without EVENT_FORK ------------------------------------------ */

struct plain_child_report {
	int present;		/* pages present in the child before writing */
	int wp;			/* of them with the uffd-wp bit */
	int wrote;		/* pages that read back the child's value */
	int wp_after;		/* uffd-wp pages after the writes */
};

static void plain_child(char *addr, int fd)
{
	struct plain_child_report rep = { 0 };

	rep.present = own_pages_with(addr, NPAGES, PM_PRESENT);
	rep.wp = own_pages_with(addr, NPAGES, PM_UFFD_WP);
	for (int i = 0; i < NPAGES; i++)
		*(volatile char *)(addr + i * page_size()) = 'C';
	for (int i = 0; i < NPAGES; i++)
		rep.wrote += addr[i * page_size()] == 'C';
	rep.wp_after = own_pages_with(addr, NPAGES, PM_UFFD_WP);
	write_full(fd, &rep, sizeof(rep));
	_exit(0);
}

static void test_no_event_child_unprotected(void)
{
	const char *name = "fork-no-event-child-unprotected";
	struct plain_child_report rep;
	struct wp_area a;
	struct uffd_msg msg;
	char why[256] = "";
	int pfd[2], n;
	pid_t pid;
	bool ok;

	if (wp_area_setup(&a, NPAGES, 0, 'A', why, sizeof(why)) ||
	    pipe(pfd)) {
		tap_fail(name, "setup: %s", why);
		wp_area_free(&a);
		return;
	}
	pid = fork();
	if (pid == 0) {
		close(pfd[0]);
		plain_child(a.addr, pfd[1]);
	}
	close(pfd[1]);
	ok = pid > 0 && read_full(pfd[0], &rep, sizeof(rep), CHILD_MS);
	if (pid < 0)
		snprintf(why, sizeof(why), "fork: %s", strerror(errno));
	else if (!ok)
		snprintf(why, sizeof(why), "no report from the child within "
			 "%d ms: its write blocked", CHILD_MS);
	if (pid > 0 && !child_exited_ok(pid, why + strlen(why),
					sizeof(why) - strlen(why)))
		ok = false;
	close(pfd[0]);
	if (!ok) {
		tap_fail(name, "%s", why);
		wp_area_free(&a);
		return;
	}
	n = uffd_read_msg(a.uffd, &msg, 300);
	if (rep.present != NPAGES)
		tap_fail(name, "child has %d of %d pages present after fork",
			 rep.present, NPAGES);
	else if (rep.wp || rep.wp_after)
		tap_fail(name, "child pagemap: %d pages uffd-wp after fork, %d "
			 "after writing (expected none)", rep.wp, rep.wp_after);
	else if (rep.wrote != NPAGES)
		tap_fail(name, "child read back %d of %d writes", rep.wrote,
			 NPAGES);
	else if (n != 0)
		tap_fail(name, "parent uffd got a message (read %d, event 0x%x "
			 "addr 0x%llx) for the child's write", n, msg.event,
			 (unsigned long long)msg.arg.pagefault.address);
	else
		tap_check(a.addr[0] == 'A' && a.addr[a.len - 1] == 'A' &&
			  pages_with(a.addr, a.len, PM_UFFD_WP) == NPAGES, name,
			  "parent page changed ('%c') or lost WP (%zu of %d)",
			  a.addr[0], pages_with(a.addr, a.len, PM_UFFD_WP),
			  NPAGES);
	wp_area_free(&a);
}

/* ---- fork with EVENT_FORK ---------------------------------------------- */

struct event_reader {
	pthread_t thread;
	int uffd;
	int got;		/* uffd_read_msg() result */
	struct uffd_msg msg;
};

/*
 * fork() does not return in the parent before the fork event is read, so a
 * second thread reads it.  If nothing arrives it closes the uffd, which
 * releases the context and lets a waiting fork() go on.
 */
static void *event_reader_main(void *arg)
{
	struct event_reader *r = arg;

	r->got = uffd_read_msg(r->uffd, &r->msg, CHILD_MS);
	if (r->got != 1) {
		close(r->uffd);
		r->uffd = -1;
	}
	return NULL;
}

struct event_child_report {
	int wp_before;		/* uffd-wp pages right after fork */
	int wrote;		/* 1 if the write to page 1 read back */
	int others_intact;	/* pages other than page 1 still 'A' */
	int wp_after;		/* uffd-wp pages after the resolved write */
	int page1_wp_after;
};

static void event_child(char *addr, int fd)
{
	struct event_child_report rep = { 0 };
	char *page1 = addr + page_size();

	rep.wp_before = own_pages_with(addr, NPAGES, PM_UFFD_WP | PM_PRESENT);
	*(volatile char *)page1 = 'C';
	rep.wrote = *page1 == 'C';
	for (int i = 0; i < NPAGES; i++)
		if (i != 1)
			rep.others_intact += addr[i * page_size()] == 'A';
	rep.wp_after = own_pages_with(addr, NPAGES, PM_UFFD_WP);
	rep.page1_wp_after = !!(pagemap_entry_fresh(page1) & PM_UFFD_WP);
	write_full(fd, &rep, sizeof(rep));
	_exit(0);
}

static bool is_userfaultfd(int fd)
{
	char path[64], link[64];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return false;
	link[n] = 0;
	return !strcmp(link, "anon_inode:[userfaultfd]");
}

/* Check the fork event; report the first case. */
static bool check_fork_event(struct event_reader *r, int parent_uffd)
{
	const char *name = "fork-event-delivers-child-uffd";
	int ufd = r->msg.arg.fork.ufd;

	if (r->got != 1)
		return tap_check(false, name, "no fork event within %d ms "
				 "(read returned %d)", CHILD_MS, r->got);
	if (r->msg.event != UFFD_EVENT_FORK)
		return tap_check(false, name, "first message is event 0x%x, "
				 "not UFFD_EVENT_FORK", r->msg.event);
	return tap_check(ufd >= 0 && ufd != parent_uffd && is_userfaultfd(ufd),
			 name, "arg.fork.ufd %d is not a new userfaultfd "
			 "(parent uffd %d)", ufd, parent_uffd);
}

/* Resolve the child's WP fault arriving on UFD; report the second case. */
static void serve_child_fault(struct wp_area *a, int ufd, pid_t pid, int rfd)
{
	const char *name = "fork-event-child-write-faults-on-child-uffd";
	char *page1 = a->addr + page_size();
	struct event_child_report rep;
	struct uffd_msg msg, stray;
	char why[256] = "";
	int n, stray_n, err;
	bool ok;

	n = uffd_read_msg(ufd, &msg, CHILD_MS);
	stray_n = uffd_read_msg(a->uffd, &stray, 0);
	err = n == 1 ? uffd_wp(ufd, page1, page_size(), 0) : 0;
	ok = read_full(rfd, &rep, sizeof(rep), CHILD_MS);
	if (!child_exited_ok(pid, why, sizeof(why)))
		ok = false;
	if (n != 1)
		tap_fail(name, "no message on the child's uffd within %d ms "
			 "(%d); %s", CHILD_MS, n, why);
	else if (msg.event != UFFD_EVENT_PAGEFAULT ||
		 !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) ||
		 (msg.arg.pagefault.address & ~(page_size() - 1)) !=
		 (uintptr_t)page1)
		tap_fail(name, "child's uffd message: event 0x%x flags 0x%llx "
			 "addr 0x%llx, expected a WP fault at %p", msg.event,
			 (unsigned long long)msg.arg.pagefault.flags,
			 (unsigned long long)msg.arg.pagefault.address, page1);
	else if (stray_n != 0)
		tap_fail(name, "parent's uffd also got a message (event 0x%x)",
			 stray.event);
	else if (err)
		tap_fail(name, "unprotect through the child's uffd: %s",
			 strerror(-err));
	else if (!ok)
		tap_fail(name, "child: %s", why[0] ? why : "no report");
	else if (rep.wp_before != NPAGES)
		tap_fail(name, "child pagemap: %d of %d pages uffd-wp after fork",
			 rep.wp_before, NPAGES);
	else if (!rep.wrote || rep.others_intact != NPAGES - 1)
		tap_fail(name, "child data: wrote %d, intact %d of %d",
			 rep.wrote, rep.others_intact, NPAGES - 1);
	else if (rep.page1_wp_after || rep.wp_after != NPAGES - 1)
		tap_fail(name, "child pagemap after resolve: page 1 wp %d, %d "
			 "pages wp (expected %d)", rep.page1_wp_after,
			 rep.wp_after, NPAGES - 1);
	else
		tap_check(pages_with(a->addr, a->len, PM_UFFD_WP) == NPAGES &&
			  page1[0] == 'A', name, "parent lost protection (%zu "
			  "of %d WP) or data ('%c') through the child's uffd",
			  pages_with(a->addr, a->len, PM_UFFD_WP), NPAGES,
			  page1[0]);
}

static void test_event_fork(void)
{
	struct event_reader r = { 0 };
	struct wp_area a;
	char why[256] = "";
	int pfd[2];
	pid_t pid;

	if (wp_area_setup(&a, NPAGES, UFFD_FEATURE_EVENT_FORK, 'A', why,
			  sizeof(why)) || pipe(pfd)) {
		tap_fail("fork-event-delivers-child-uffd", "setup: %s", why);
		tap_fail("fork-event-child-write-faults-on-child-uffd",
			 "setup failed");
		wp_area_free(&a);
		return;
	}
	r.uffd = a.uffd;
	if (pthread_create(&r.thread, NULL, event_reader_main, &r))
		tap_bail("pthread_create failed");
	pid = fork();
	if (pid == 0) {
		close(pfd[0]);
		event_child(a.addr, pfd[1]);
	}
	close(pfd[1]);
	pthread_join(r.thread, NULL);
	if (r.uffd < 0)
		a.uffd = -1;	/* the reader closed it */
	if (pid < 0) {
		tap_fail("fork-event-delivers-child-uffd", "fork: %s",
			 strerror(errno));
		tap_fail("fork-event-child-write-faults-on-child-uffd",
			 "no child");
	} else if (!check_fork_event(&r, a.uffd)) {
		tap_fail("fork-event-child-write-faults-on-child-uffd",
			 "no child uffd to serve");
		wait_child(pid, CHILD_MS, &(int){0});
	} else {
		serve_child_fault(&a, r.msg.arg.fork.ufd, pid, pfd[0]);
		close(r.msg.arg.fork.ufd);
	}
	close(pfd[0]);
	wp_area_free(&a);
}

/* ---- copy-on-write ----------------------------------------------------- */

struct cow_child_report {
	uint64_t entry;
	char val;
};

static void cow_child(char *addr, int to_parent, int from_parent)
{
	struct cow_child_report rep = { pagemap_entry_fresh(addr), addr[0] };
	char go;

	write_full(to_parent, &rep, sizeof(rep));
	if (!read_full(from_parent, &go, 1, 2 * CHILD_MS))
		_exit(2);
	rep.entry = pagemap_entry_fresh(addr);
	rep.val = *(volatile char *)addr;
	write_full(to_parent, &rep, sizeof(rep));
	_exit(0);
}

struct cow_state {
	struct wp_area a;
	int up[2], down[2];	/* child->parent, parent->child */
	pid_t pid;
	uint64_t shared_pfn;
};

/* The parent's write: WP fault first, frame still shared while pending. */
static bool cow_parent_write(struct cow_state *s, char *why, size_t whylen)
{
	uint64_t pending_entry;
	struct uffd_msg msg;
	struct writer w;
	char pending_val;
	int n, err;

	if (writer_start(&w, s->a.addr, page_size(), 'P'))
		return snprintf(why, whylen, "writer_start failed"), false;
	n = uffd_read_msg(s->a.uffd, &msg, CHILD_MS);
	pending_entry = pagemap_entry(s->a.addr);
	pending_val = s->a.addr[0];
	err = n == 1 ? uffd_wp(s->a.uffd, s->a.addr, page_size(), 0) : 0;
	if (!writer_wait(&w, CHILD_MS)) {
		snprintf(why, whylen, "parent writer still blocked (msg %d, "
			 "resolve %d)", n, err);
		/* Unblock it so the thread can be reaped; then report. */
		uffd_unregister(s->a.uffd, s->a.addr, s->a.len);
		writer_wait(&w, CHILD_MS);
		return false;
	}
	if (n != 1)
		return snprintf(why, whylen, "parent write raised no WP "
				"message (%d) and went through", n), false;
	if (msg.event != UFFD_EVENT_PAGEFAULT ||
	    !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) ||
	    !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE) ||
	    (msg.arg.pagefault.address & ~(page_size() - 1)) !=
	    (uintptr_t)s->a.addr)
		return snprintf(why, whylen, "message event 0x%x flags 0x%llx "
				"addr 0x%llx", msg.event,
				(unsigned long long)msg.arg.pagefault.flags,
				(unsigned long long)msg.arg.pagefault.address),
		       false;
	if (err)
		return snprintf(why, whylen, "unprotect: %s", strerror(-err)),
		       false;
	if ((pending_entry & PM_PFN_MASK) != s->shared_pfn || pending_val != 'A')
		return snprintf(why, whylen, "COW broken before the WP fault "
				"was resolved: pfn 0x%llx (shared 0x%llx), "
				"value '%c'", (unsigned long long)
				(pending_entry & PM_PFN_MASK),
				(unsigned long long)s->shared_pfn,
				pending_val), false;
	return true;
}

static bool cow_after(struct cow_state *s, char *why, size_t whylen)
{
	uint64_t e = pagemap_entry(s->a.addr);
	struct cow_child_report rep;

	if (s->a.addr[0] != 'P' || (e & PM_UFFD_WP) ||
	    (e & PM_PFN_MASK) == s->shared_pfn)
		return snprintf(why, whylen, "parent after write: '%c', wp %d, "
				"pfn 0x%llx (shared 0x%llx): COW not broken",
				s->a.addr[0], !!(e & PM_UFFD_WP),
				(unsigned long long)(e & PM_PFN_MASK),
				(unsigned long long)s->shared_pfn), false;
	write_full(s->down[1], "g", 1);
	if (!read_full(s->up[0], &rep, sizeof(rep), CHILD_MS))
		return snprintf(why, whylen, "no final child report"), false;
	if (rep.val != 'A' || (rep.entry & PM_PFN_MASK) != s->shared_pfn)
		return snprintf(why, whylen, "child's copy changed: '%c', pfn "
				"0x%llx (was 0x%llx)", rep.val,
				(unsigned long long)(rep.entry & PM_PFN_MASK),
				(unsigned long long)s->shared_pfn), false;
	return true;
}

static void cow_run(struct cow_state *s, const char *name)
{
	struct cow_child_report rep;
	char why[256] = "";
	uint64_t pe;
	bool ok;

	if (!read_full(s->up[0], &rep, sizeof(rep), CHILD_MS)) {
		tap_fail(name, "no report from the child");
		return;
	}
	pe = pagemap_entry(s->a.addr);
	s->shared_pfn = rep.entry & PM_PFN_MASK;
	if (!s->shared_pfn || !(pe & PM_PFN_MASK)) {
		tap_skip(name, "pagemap hides PFNs (needs CAP_SYS_ADMIN)");
		return;
	}
	if ((pe & PM_PFN_MASK) != s->shared_pfn || rep.val != 'A') {
		tap_fail(name, "page not shared after fork: parent pfn 0x%llx, "
			 "child pfn 0x%llx, child value '%c'",
			 (unsigned long long)(pe & PM_PFN_MASK),
			 (unsigned long long)s->shared_pfn, rep.val);
		return;
	}
	ok = cow_parent_write(s, why, sizeof(why)) &&
	     cow_after(s, why, sizeof(why));
	tap_check(ok, name, "%s", why);
}

static void test_cow_wp_before_break(void)
{
	const char *name = "fork-cow-parent-wp-fault-before-cow-break";
	struct cow_state s;
	char why[256] = "";

	memset(&s, 0, sizeof(s));
	if (wp_area_setup(&s.a, 1, 0, 'A', why, sizeof(why)) ||
	    pipe(s.up) || pipe(s.down)) {
		tap_fail(name, "setup: %s", why);
		wp_area_free(&s.a);
		return;
	}
	s.pid = fork();
	if (s.pid == 0) {
		close(s.up[0]);
		close(s.down[1]);
		cow_child(s.a.addr, s.up[1], s.down[0]);
	}
	close(s.up[1]);
	close(s.down[0]);
	if (s.pid < 0)
		tap_fail(name, "fork: %s", strerror(errno));
	else
		cow_run(&s, name);
	close(s.down[1]);
	close(s.up[0]);
	if (s.pid > 0)
		wait_child(s.pid, CHILD_MS, &(int){0});
	wp_area_free(&s.a);
}

int main(void)
{
	watchdog(60);
	tap_plan(4);
	test_no_event_child_unprotected();
	test_event_fork();
	test_cow_wp_before_break();
	return tap_done();
}
