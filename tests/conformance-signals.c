// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-signals: signals delivered to threads blocked in a uffd-wp
 * fault.
 *
 * Contract checked (issue tracker, area 8 "signals"):
 *  - A thread blocked in a WP fault that gets a non-fatal, unblocked signal
 *    runs its handler while the fault is still unresolved (page still
 *    protected, write not done).  When the handler returns the faulting
 *    instruction is retried and faults again, so the handler sees exactly
 *    two WP messages for the write; after resolution the write (an atomic
 *    increment) takes effect exactly once.
 *  - A signal the thread has blocked does not interrupt the fault: no retry
 *    message, no handler until the thread unblocks it after the write.
 *  - SIGKILL ends a process whose thread is blocked in a WP fault within a
 *    second, with the fault never resolved and the write never done.
 *
 * Kernel reference: fs/userfaultfd.c handle_userfault() sleeps
 * TASK_INTERRUPTIBLE for user faults and returns VM_FAULT_RETRY when woken;
 * arch/x86/mm/fault.c returns to user mode on fault_signal_pending(), so the
 * signal is delivered and the instruction restarts.
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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"

#define WAIT_MS		3000
#define START_VALUE	41

/* One populated, registered and write-protected anonymous page. */
struct wp_page {
	int uffd;
	int *counter;
};

static int wp_page_setup(struct wp_page *p, char *why, size_t whylen)
{
	int err;

	p->uffd = -1;
	p->counter = map_anon_aligned(page_size(), page_size());
	if (!p->counter) {
		snprintf(why, whylen, "mmap: %s", strerror(errno));
		return -1;
	}
	*p->counter = START_VALUE;
	p->uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			    UFFD_FEATURE_THREAD_ID, NULL);
	if (p->uffd < 0) {
		snprintf(why, whylen, "uffd_open: %s", strerror(-p->uffd));
		return -1;
	}
	err = uffd_register(p->uffd, p->counter, page_size(),
			    UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		err = uffd_wp(p->uffd, p->counter, page_size(),
			      UFFDIO_WRITEPROTECT_MODE_WP);
	if (err) {
		snprintf(why, whylen, "register/protect: %s", strerror(-err));
		return -1;
	}
	if (!(pagemap_entry_fresh(p->counter) & PM_UFFD_WP)) {
		snprintf(why, whylen, "pagemap shows no uffd-wp bit after "
			 "UFFDIO_WRITEPROTECT");
		return -1;
	}
	return 0;
}

static void wp_page_free(struct wp_page *p)
{
	if (p->uffd >= 0)
		close(p->uffd);
	if (p->counter)
		munmap(p->counter, page_size());
}

/* What the SIGUSR1 handler saw. */
static volatile int handler_runs;
static volatile pid_t handler_tid;
static volatile int handler_saw;
static int *handler_page;

static void on_usr1(int sig)
{
	(void)sig;
	handler_tid = syscall(SYS_gettid);
	handler_saw = *(volatile int *)handler_page;
	__atomic_add_fetch(&handler_runs, 1, __ATOMIC_SEQ_CST);
}

static void handler_reset(int *page)
{
	struct sigaction sa = { .sa_handler = on_usr1 };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	handler_page = page;
	handler_runs = 0;
	handler_tid = 0;
	handler_saw = 0;
}

/* A thread that increments the counter once, atomically. */
struct incrementer {
	pthread_t thread;
	int *counter;
	bool mask_usr1;		/* block SIGUSR1 during the increment */
	volatile pid_t tid;
	volatile int done;
	volatile int runs_at_done;	/* handler runs when the write was done */
	bool joined;
};

static void *incrementer_main(void *arg)
{
	struct incrementer *t = arg;
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	if (t->mask_usr1)
		pthread_sigmask(SIG_BLOCK, &set, NULL);
	__atomic_store_n(&t->tid, syscall(SYS_gettid), __ATOMIC_SEQ_CST);
	__atomic_add_fetch(t->counter, 1, __ATOMIC_SEQ_CST);
	t->runs_at_done = handler_runs;
	__atomic_store_n(&t->done, 1, __ATOMIC_SEQ_CST);
	if (t->mask_usr1)
		pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	return NULL;
}

static bool wait_flag(volatile int *flag, int want, int timeout_ms)
{
	long long end = now_ms() + timeout_ms;

	while (__atomic_load_n(flag, __ATOMIC_SEQ_CST) < want) {
		if (now_ms() >= end)
			return false;
		usleep(1000);
	}
	return true;
}

/* Is MSG the WP write fault of thread TID on PAGE? */
static bool is_wp_fault(const struct uffd_msg *msg, void *page, pid_t tid,
			char *why, size_t whylen)
{
	uint64_t want = UFFD_PAGEFAULT_FLAG_WP | UFFD_PAGEFAULT_FLAG_WRITE;

	if (msg->event == UFFD_EVENT_PAGEFAULT &&
	    (msg->arg.pagefault.flags & want) == want &&
	    (msg->arg.pagefault.address & ~(page_size() - 1)) ==
	    (uintptr_t)page && (pid_t)msg->arg.pagefault.feat.ptid == tid)
		return true;
	snprintf(why, whylen, "message event 0x%x flags 0x%llx addr 0x%llx "
		 "ptid %u; expected WP|WRITE at %p from tid %d", msg->event,
		 (unsigned long long)msg->arg.pagefault.flags,
		 (unsigned long long)msg->arg.pagefault.address,
		 msg->arg.pagefault.feat.ptid, page, tid);
	return false;
}

static void join_incrementer(struct incrementer *t)
{
	if (!t->joined)
		pthread_join(t->thread, NULL);
	t->joined = true;
}

/* Reap the incrementer, first unblocking it if it is still stuck. */
static void finish_incrementer(struct wp_page *p, struct incrementer *t)
{
	if (t->joined)
		return;
	if (!__atomic_load_n(&t->done, __ATOMIC_SEQ_CST))
		uffd_unregister(p->uffd, p->counter, page_size());
	if (wait_flag(&t->done, 1, WAIT_MS))
		join_incrementer(t);
	else
		pthread_detach(t->thread);
	t->joined = true;
}

/* ---- an unblocked, handled signal -------------------------------------- */

struct handled_result {
	bool ran_pending;		/* case 1 verdict */
	char why1[256];
	bool once;			/* case 2 verdict */
	char why2[256];
};

/* Signal the blocked thread; check its handler runs with the fault pending. */
static bool handled_signal_phase(struct wp_page *p, struct incrementer *t,
				 struct handled_result *res)
{
	int val;
	bool wp, done;

	pthread_kill(t->thread, SIGUSR1);
	if (!wait_flag(&handler_runs, 1, WAIT_MS)) {
		snprintf(res->why1, sizeof(res->why1), "handler did not run "
			 "within %d ms of pthread_kill", WAIT_MS);
		return false;
	}
	val = *(volatile int *)p->counter;
	wp = pagemap_entry_fresh(p->counter) & PM_UFFD_WP;
	done = __atomic_load_n(&t->done, __ATOMIC_SEQ_CST);
	if (done || val != START_VALUE || !wp || handler_saw != START_VALUE ||
	    handler_tid != t->tid) {
		snprintf(res->why1, sizeof(res->why1), "when the handler had "
			 "run: write done %d, value %d, page wp %d, handler saw "
			 "%d in tid %d (writer %d)", done, val, wp, handler_saw,
			 handler_tid, t->tid);
		return false;
	}
	res->ran_pending = true;
	return true;
}

/* Retry message, resolution, exactly one increment. */
static void handled_resolve_phase(struct wp_page *p, struct incrementer *t,
				  struct handled_result *res)
{
	struct uffd_msg msg;
	char *why = res->why2;
	size_t wl = sizeof(res->why2);
	int n, extra, err;

	n = uffd_read_msg(p->uffd, &msg, WAIT_MS);
	if (n != 1) {
		snprintf(why, wl, "no retry fault after the handler returned "
			 "(read %d): expected a second WP message", n);
		return;
	}
	if (!is_wp_fault(&msg, p->counter, t->tid, why, wl))
		return;
	if (__atomic_load_n(&t->done, __ATOMIC_SEQ_CST)) {
		snprintf(why, wl, "write completed before resolution");
		return;
	}
	err = uffd_wp(p->uffd, p->counter, page_size(), 0);
	if (err) {
		snprintf(why, wl, "unprotect: %s", strerror(-err));
		return;
	}
	if (!wait_flag(&t->done, 1, WAIT_MS)) {
		snprintf(why, wl, "writer still blocked after resolution");
		return;
	}
	join_incrementer(t);
	extra = uffd_read_msg(p->uffd, &msg, 200);
	res->once = *p->counter == START_VALUE + 1 && handler_runs == 1 &&
		    extra == 0;
	snprintf(why, wl, "counter %d (expected %d), handler ran %d times, "
		 "WP messages %d (expected 2)", *p->counter, START_VALUE + 1,
		 handler_runs, 2 + extra);
}

static void test_handled_signal(void)
{
	const char *n1 = "signals-handler-runs-while-wp-fault-pending";
	const char *n2 = "signals-write-completes-once-after-resolve";
	struct handled_result res = { 0 };
	struct incrementer t = { 0 };
	struct uffd_msg msg;
	struct wp_page p;
	int n;

	if (wp_page_setup(&p, res.why1, sizeof(res.why1))) {
		tap_fail(n1, "setup: %s", res.why1);
		tap_fail(n2, "setup failed");
		wp_page_free(&p);
		return;
	}
	handler_reset(p.counter);
	t.counter = p.counter;
	if (pthread_create(&t.thread, NULL, incrementer_main, &t))
		tap_bail("pthread_create failed");
	n = uffd_read_msg(p.uffd, &msg, WAIT_MS);
	if (n != 1) {
		snprintf(res.why1, sizeof(res.why1), "the increment raised no "
			 "WP message (read %d)", n);
	} else if (is_wp_fault(&msg, p.counter, t.tid, res.why1,
			       sizeof(res.why1)) &&
		   handled_signal_phase(&p, &t, &res)) {
		handled_resolve_phase(&p, &t, &res);
	}
	finish_incrementer(&p, &t);
	tap_check(res.ran_pending, n1, "%s", res.why1);
	tap_check(res.once, n2, "%s", res.ran_pending ? res.why2 :
		  "the fault/handler phase failed");
	wp_page_free(&p);
}

/* ---- a blocked (masked) signal ----------------------------------------- */

static bool masked_check(struct wp_page *p, struct incrementer *t, char *why,
			 size_t wl)
{
	struct uffd_msg msg;
	int n, err;

	n = uffd_read_msg(p->uffd, &msg, WAIT_MS);
	if (n != 1)
		return snprintf(why, wl, "no WP message (read %d)", n), false;
	if (!is_wp_fault(&msg, p->counter, t->tid, why, wl))
		return false;
	pthread_kill(t->thread, SIGUSR1);
	n = uffd_read_msg(p->uffd, &msg, 500);
	if (n != 0 || handler_runs || t->done || *p->counter != START_VALUE)
		return snprintf(why, wl, "masked signal disturbed the fault: "
				"second message %d, handler ran %d, write "
				"done %d, value %d", n, handler_runs, t->done,
				*p->counter), false;
	err = uffd_wp(p->uffd, p->counter, page_size(), 0);
	if (err)
		return snprintf(why, wl, "unprotect: %s", strerror(-err)),
		       false;
	if (!wait_flag(&t->done, 1, WAIT_MS) ||
	    !wait_flag(&handler_runs, 1, WAIT_MS))
		return snprintf(why, wl, "after resolution: write done %d, "
				"handler ran %d", t->done, handler_runs), false;
	join_incrementer(t);
	n = uffd_read_msg(p->uffd, &msg, 200);
	if (*p->counter != START_VALUE + 1 || t->runs_at_done != 0 ||
	    handler_runs != 1 || handler_saw != START_VALUE + 1 || n != 0)
		return snprintf(why, wl, "counter %d (expected %d), handler "
				"ran %d times (%d before the write), saw %d, "
				"%d extra messages", *p->counter,
				START_VALUE + 1, handler_runs, t->runs_at_done,
				handler_saw, n), false;
	return true;
}

static void test_masked_signal(void)
{
	const char *name = "signals-masked-signal-leaves-fault-pending";
	struct incrementer t = { .mask_usr1 = true };
	struct wp_page p;
	char why[256] = "";
	bool ok;

	if (wp_page_setup(&p, why, sizeof(why))) {
		tap_fail(name, "setup: %s", why);
		wp_page_free(&p);
		return;
	}
	handler_reset(p.counter);
	t.counter = p.counter;
	if (pthread_create(&t.thread, NULL, incrementer_main, &t))
		tap_bail("pthread_create failed");
	ok = masked_check(&p, &t, why, sizeof(why));
	finish_incrementer(&p, &t);
	tap_check(ok, name, "%s", why);
	wp_page_free(&p);
}

/* ---- SIGKILL ----------------------------------------------------------- */

/* Shared between the parent and the child that gets killed. */
struct kill_status {
	volatile int faulted;		/* the child read its WP message */
	volatile int written;		/* the blocked write completed */
	char why[200];
};

static void *kill_writer_main(void *arg)
{
	struct kill_status *st = arg;
	int *page = handler_page;

	__atomic_add_fetch(page, 1, __ATOMIC_SEQ_CST);
	st->written = 1;
	return NULL;
}

/* The child: owns the uffd, blocks a thread in a WP fault, never resolves. */
static void kill_child(struct kill_status *st, int fd)
{
	struct uffd_msg msg;
	struct wp_page p;
	pthread_t thread;

	if (wp_page_setup(&p, st->why, sizeof(st->why)))
		_exit(1);
	handler_page = p.counter;
	if (pthread_create(&thread, NULL, kill_writer_main, st))
		_exit(1);
	if (uffd_read_msg(p.uffd, &msg, WAIT_MS) != 1 ||
	    !is_wp_fault(&msg, p.counter, msg.arg.pagefault.feat.ptid,
			 st->why, sizeof(st->why)))
		_exit(1);
	st->faulted = 1;
	if (write(fd, "f", 1) != 1)
		_exit(1);
	for (;;)
		pause();
}

static bool reap_within(pid_t pid, int timeout_ms, int *status)
{
	long long end = now_ms() + timeout_ms;

	while (now_ms() < end) {
		if (waitpid(pid, status, WNOHANG) == pid)
			return true;
		usleep(1000);
	}
	return false;
}

static bool wait_readable(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;

	return poll(&p, 1, timeout_ms) == 1 && read(fd, &c, 1) == 1;
}

static void test_sigkill(void)
{
	const char *name = "signals-sigkill-ends-blocked-process";
	struct kill_status *st;
	long long t0, took;
	int pfd[2], status = 0;
	bool reaped;
	pid_t pid;

	st = mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (st == MAP_FAILED || pipe(pfd)) {
		tap_fail(name, "setup: %s", strerror(errno));
		return;
	}
	memset(st, 0, sizeof(*st));
	pid = fork();
	if (pid == 0) {
		close(pfd[0]);
		kill_child(st, pfd[1]);
	}
	close(pfd[1]);
	if (pid < 0) {
		tap_fail(name, "fork: %s", strerror(errno));
	} else if (!wait_readable(pfd[0], 2 * WAIT_MS) || !st->faulted) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		tap_fail(name, "child's thread did not block in a WP fault: %s",
			 st->why[0] ? st->why : "no message");
	} else {
		usleep(100 * 1000);	/* let it settle in the wait */
		t0 = now_ms();
		kill(pid, SIGKILL);
		reaped = reap_within(pid, 1000, &status);
		took = now_ms() - t0;
		if (!reaped) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
		}
		tap_check(reaped && WIFSIGNALED(status) &&
			  WTERMSIG(status) == SIGKILL && !st->written, name,
			  "reaped within 1 s %d (%lld ms), status 0x%x, write "
			  "completed %d", reaped, took, status, st->written);
	}
	close(pfd[0]);
	munmap(st, sizeof(*st));
}

int main(void)
{
	watchdog(60);
	tap_plan(4);
	test_handled_signal();
	test_masked_signal();
	test_sigkill();
	return tap_done();
}
