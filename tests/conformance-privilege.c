// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-privilege: who may create a userfaultfd, and what it handles.
 *
 * Contract checked (issue tracker, area 14 "privilege"; see
 * Documentation/admin-guide/mm/userfaultfd.rst and sysctl/vm.rst):
 *  - With vm.unprivileged_userfaultfd=0 an unprivileged user gets EPERM
 *    from userfaultfd() without UFFD_USER_MODE_ONLY, and succeeds with it;
 *    that uffd really write-protects the user's own memory, but does not
 *    handle kernel-mode faults (a read() into a protected page fails with
 *    EFAULT and no message).
 *  - With vm.unprivileged_userfaultfd=1 the same user may create a uffd that
 *    also handles kernel-mode WP faults.
 *  - /dev/userfaultfd (root-owned, 0600 from devtmpfs) cannot be opened by
 *    an unprivileged user (EACCES); root opening it and issuing
 *    USERFAULTFD_IOC_NEW gets a full userfaultfd; a user who has access to
 *    the node gets one too, whatever vm.unprivileged_userfaultfd says.
 *
 * The guest runs as root; unprivileged work happens in a forked child that
 * switches to an unused uid/gid.  The sysctl and the device node's owner are
 * restored at the end.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"

#define UNPRIV_ID	4242
#define WAIT_MS		3000
#define SYSCTL		"/proc/sys/vm/unprivileged_userfaultfd"
#define DEV_UFFD	"/dev/userfaultfd"
#define WHY_LEN		240

/*
 * Directories opened (O_PATH) while still root.  The unprivileged child
 * looks names up relative to them, so the test does not depend on the
 * guest's "/" being searchable by others (the initramfs root is 0700).
 */
static int proc_fd = -1, dev_fd = -1;

/* ---- small helpers ------------------------------------------------------ */

static int write_sysctl(const char *val)
{
	int fd = open(SYSCTL, O_WRONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = write(fd, val, strlen(val));
	close(fd);
	return n == (ssize_t)strlen(val) ? 0 : -EIO;
}

static int read_sysctl(char *buf, size_t len)
{
	int fd = open(SYSCTL, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n <= 0)
		return -EIO;
	buf[n] = 0;
	return 0;
}

/*
 * pagemap_entry() keeps /proc/self/pagemap open, so in a forked child it
 * would read the parent's page table; this opens the caller's own.
 */
static uint64_t fresh_pagemap_entry(void *addr)
{
	int fd = openat(proc_fd, "self/pagemap", O_RDONLY | O_CLOEXEC);
	uint64_t e = 0;

	if (fd < 0)
		return 0;
	if (pread(fd, &e, sizeof(e), (uintptr_t)addr / page_size() * sizeof(e)) !=
	    sizeof(e))
		e = 0;
	close(fd);
	return e;
}

static int uffd_api(int fd, uint64_t features)
{
	struct uffdio_api api = { .api = UFFD_API, .features = features };

	return ioctl(fd, UFFDIO_API, &api) ? -errno : 0;
}

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

/* ---- WP round trips through a given uffd ------------------------------- */

/* A registered, populated and write-protected page for one round trip. */
static char *protected_page(int uffd, char *why)
{
	char *page = map_anon_aligned(page_size(), page_size());
	int err;

	if (!page)
		return fail(why, "mmap: %s", strerror(errno)), NULL;
	memset(page, 'A', page_size());
	err = uffd_register(uffd, page, page_size(), UFFDIO_REGISTER_MODE_WP,
			    NULL);
	if (!err)
		err = uffd_wp(uffd, page, page_size(),
			      UFFDIO_WRITEPROTECT_MODE_WP);
	if (err) {
		munmap(page, page_size());
		return fail(why, "register/protect: %s", strerror(-err)), NULL;
	}
	if (!(fresh_pagemap_entry(page) & PM_UFFD_WP)) {
		munmap(page, page_size());
		return fail(why, "pagemap: no uffd-wp bit after protect"), NULL;
	}
	return page;
}

static bool check_wp_msg(const struct uffd_msg *msg, void *page, char *why)
{
	uint64_t want = UFFD_PAGEFAULT_FLAG_WP | UFFD_PAGEFAULT_FLAG_WRITE;

	if (msg->event == UFFD_EVENT_PAGEFAULT &&
	    (msg->arg.pagefault.flags & want) == want &&
	    (msg->arg.pagefault.address & ~(page_size() - 1)) ==
	    (uintptr_t)page)
		return true;
	return fail(why, "message event 0x%x flags 0x%llx addr 0x%llx, "
		    "expected WP|WRITE at %p", msg->event,
		    (unsigned long long)msg->arg.pagefault.flags,
		    (unsigned long long)msg->arg.pagefault.address, page);
}

/* Resolve the fault on PAGE, wait for DONE, check nothing else arrives. */
static bool resolve_and_wait(int uffd, char *page, volatile int *done,
			     char *why)
{
	struct uffd_msg msg;
	int err;

	if (*done || page[0] != 'A')
		return fail(why, "write went through while protected "
			    "(done %d, '%c')", *done, page[0]);
	err = uffd_wp(uffd, page, page_size(), 0);
	if (err)
		return fail(why, "unprotect: %s", strerror(-err));
	if (!done_within(done, WAIT_MS))
		return fail(why, "still blocked after unprotect");
	if (uffd_read_msg(uffd, &msg, 100) != 0)
		return fail(why, "extra message (event 0x%x)", msg.event);
	return true;
}

struct user_writer {
	char *page;
	volatile int done;
};

static void *user_writer_main(void *arg)
{
	struct user_writer *w = arg;

	*(volatile char *)w->page = 'B';
	__atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

/* A user-mode write to a protected page: message, block, resolve, done. */
static bool user_fault_roundtrip(int uffd, char *why)
{
	struct user_writer w = { .page = protected_page(uffd, why) };
	struct uffd_msg msg;
	pthread_t thread;
	bool ok;
	int n;

	if (!w.page)
		return false;
	if (pthread_create(&thread, NULL, user_writer_main, &w)) {
		munmap(w.page, page_size());
		return fail(why, "pthread_create failed");
	}
	n = uffd_read_msg(uffd, &msg, WAIT_MS);
	if (n != 1)
		ok = fail(why, "user write raised no WP message (%d)", n);
	else
		ok = check_wp_msg(&msg, w.page, why) &&
		     resolve_and_wait(uffd, w.page, &w.done, why);
	if (!w.done)
		uffd_unregister(uffd, w.page, page_size());
	pthread_join(thread, NULL);
	if (ok && (w.page[0] != 'B' ||
		   (fresh_pagemap_entry(w.page) & PM_UFFD_WP)))
		ok = fail(why, "after resolve: '%c', wp %d", w.page[0],
			  !!(fresh_pagemap_entry(w.page) & PM_UFFD_WP));
	munmap(w.page, page_size());
	return ok;
}

static const char kdata[] = "written by the kernel";

struct kernel_reader {
	int fd;			/* pipe read end */
	char *page;
	volatile ssize_t got;
	volatile int err;
	volatile int done;
};

static void *kernel_reader_main(void *arg)
{
	struct kernel_reader *r = arg;

	r->got = read(r->fd, r->page, sizeof(kdata));
	r->err = r->got < 0 ? errno : 0;
	__atomic_store_n(&r->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

/* A kernel-mode write (read() from a pipe) into a protected page. */
static bool kernel_fault_roundtrip(int uffd, char *why)
{
	struct kernel_reader r = { .page = protected_page(uffd, why) };
	struct uffd_msg msg;
	pthread_t thread;
	int pfd[2], n;
	bool ok;

	if (!r.page)
		return false;
	if (pipe(pfd) || write(pfd[1], kdata, sizeof(kdata)) != sizeof(kdata)) {
		munmap(r.page, page_size());
		return fail(why, "pipe: %s", strerror(errno));
	}
	r.fd = pfd[0];
	if (pthread_create(&thread, NULL, kernel_reader_main, &r)) {
		close(pfd[0]);
		close(pfd[1]);
		munmap(r.page, page_size());
		return fail(why, "pthread_create failed");
	}
	n = uffd_read_msg(uffd, &msg, WAIT_MS);
	if (n != 1)
		ok = fail(why, "kernel write raised no WP message (%d); read() "
			  "done %d returned %zd errno %d", n, r.done, r.got,
			  r.err);
	else
		ok = check_wp_msg(&msg, r.page, why) &&
		     resolve_and_wait(uffd, r.page, &r.done, why);
	if (!r.done)
		uffd_unregister(uffd, r.page, page_size());
	pthread_join(thread, NULL);
	if (ok && (r.got != sizeof(kdata) || memcmp(r.page, kdata, r.got)))
		ok = fail(why, "read() into the page returned %zd (errno %d)",
			  r.got, r.err);
	close(pfd[0]);
	close(pfd[1]);
	munmap(r.page, page_size());
	return ok;
}

/* ---- running as an unprivileged user ----------------------------------- */

struct child_result {
	int ok;
	char why[WHY_LEN];
};

static bool drop_privileges(char *why)
{
	gid_t gid = UNPRIV_ID;

	if (setgroups(1, &gid) || setgid(UNPRIV_ID) || setuid(UNPRIV_ID))
		return fail(why, "dropping to uid %d: %s", UNPRIV_ID,
			    strerror(errno));
	/*
	 * Changing uid made us non-dumpable, which makes /proc/self/pagemap
	 * root's.  Our own test memory is no secret.
	 */
	prctl(PR_SET_DUMPABLE, 1);
	if (geteuid() != UNPRIV_ID || getegid() != UNPRIV_ID)
		return fail(why, "still euid %d egid %d", geteuid(),
			    getegid());
	return true;
}

static bool wait_child(pid_t pid, int timeout_ms, int *status)
{
	long long end = now_ms() + timeout_ms;

	while (now_ms() < end) {
		if (waitpid(pid, status, WNOHANG) == pid)
			return true;
		usleep(2000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, status, 0);
	return false;
}

/* Run FN in a child as uid/gid UNPRIV_ID; its verdict and diagnostic. */
static bool as_unprivileged(bool (*fn)(char *why), char *why)
{
	struct child_result res = { 0 };
	struct pollfd p;
	int pfd[2], status;
	pid_t pid;

	if (pipe(pfd))
		return fail(why, "pipe: %s", strerror(errno));
	pid = fork();
	if (pid == 0) {
		close(pfd[0]);
		res.ok = drop_privileges(res.why) && fn(res.why);
		_exit(write(pfd[1], &res, sizeof(res)) == sizeof(res) ? 0 : 1);
	}
	close(pfd[1]);
	if (pid < 0) {
		close(pfd[0]);
		return fail(why, "fork: %s", strerror(errno));
	}
	p = (struct pollfd){ .fd = pfd[0], .events = POLLIN };
	if (poll(&p, 1, 3 * WAIT_MS) != 1 ||
	    read(pfd[0], &res, sizeof(res)) != sizeof(res))
		snprintf(res.why, sizeof(res.why), "no verdict from the "
			 "unprivileged child (hung?)");
	close(pfd[0]);
	if (!wait_child(pid, WAIT_MS, &status) && res.ok)
		return fail(why, "unprivileged child did not exit");
	memcpy(why, res.why, WHY_LEN);
	return res.ok;
}

/* ---- unprivileged userfaultfd(2) --------------------------------------- */

static bool unpriv_syscall_eperm(char *why)
{
	int fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	if (fd >= 0) {
		close(fd);
		return fail(why, "userfaultfd(0) succeeded for uid %d with "
			    "unprivileged_userfaultfd=0", UNPRIV_ID);
	}
	if (errno != EPERM)
		return fail(why, "userfaultfd(0) failed with %s, expected EPERM",
			    strerror(errno));
	return true;
}

static bool unpriv_user_mode_only_wp(char *why)
{
	int uffd = uffd_open_flags(O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY,
				   UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	bool ok;

	if (uffd < 0)
		return fail(why, "userfaultfd(UFFD_USER_MODE_ONLY): %s",
			    strerror(-uffd));
	ok = user_fault_roundtrip(uffd, why);
	close(uffd);
	return ok;
}

/* A user-mode-only uffd must not catch the kernel's write: read() fails. */
static bool unpriv_user_mode_only_kernel_efault(char *why)
{
	int uffd = uffd_open_flags(O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY,
				   UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	struct uffd_msg msg;
	int pfd[2] = { -1, -1 }, err, n;
	char *page;
	ssize_t got;
	bool ok;

	if (uffd < 0)
		return fail(why, "userfaultfd(UFFD_USER_MODE_ONLY): %s",
			    strerror(-uffd));
	page = protected_page(uffd, why);
	if (!page || pipe(pfd) ||
	    write(pfd[1], kdata, sizeof(kdata)) != sizeof(kdata)) {
		close(uffd);
		return page ? fail(why, "pipe: %s", strerror(errno)) : false;
	}
	got = read(pfd[0], page, sizeof(kdata));
	err = got < 0 ? errno : 0;
	n = uffd_read_msg(uffd, &msg, 200);
	ok = got == -1 && err == EFAULT && n == 0 && page[0] == 'A' &&
	     (fresh_pagemap_entry(page) & PM_UFFD_WP);
	if (!ok)
		fail(why, "read() into the protected page returned %zd (%s), "
		     "messages %d, page '%c', wp %d; expected EFAULT, none, "
		     "'A', 1", got, strerror(err), n, page[0],
		     !!(fresh_pagemap_entry(page) & PM_UFFD_WP));
	close(pfd[0]);
	close(pfd[1]);
	munmap(page, page_size());
	close(uffd);
	return ok;
}

static bool unpriv_syscall_full(char *why)
{
	int uffd = uffd_open_flags(O_CLOEXEC | O_NONBLOCK,
				   UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	bool ok;

	if (uffd < 0)
		return fail(why, "userfaultfd(0) with unprivileged_userfaultfd"
			    "=1: %s", strerror(-uffd));
	ok = kernel_fault_roundtrip(uffd, why);
	close(uffd);
	return ok;
}

static void run_unpriv_case(const char *name, const char *sysctl,
			    bool (*fn)(char *why))
{
	char why[WHY_LEN] = "";
	int err = write_sysctl(sysctl);

	if (err) {
		tap_fail(name, "setting %s to %s: %s", SYSCTL, sysctl,
			 strerror(-err));
		return;
	}
	tap_check(as_unprivileged(fn, why), name, "%s", why);
}

/* ---- /dev/userfaultfd -------------------------------------------------- */

struct dev_state {
	bool created;		/* we made the node with mknod */
	struct stat st;		/* as found (or created) */
};

static int dev_prepare(struct dev_state *d, char *why)
{
	unsigned int maj, min;
	FILE *f;

	if (!fstatat(dev_fd, "userfaultfd", &d->st, 0))
		return 0;
	f = fopen("/sys/class/misc/userfaultfd/dev", "r");
	if (!f || fscanf(f, "%u:%u", &maj, &min) != 2) {
		if (f)
			fclose(f);
		fail(why, "no %s and no misc device in sysfs", DEV_UFFD);
		return -1;
	}
	fclose(f);
	if (mknodat(dev_fd, "userfaultfd", S_IFCHR | 0600, makedev(maj, min)) ||
	    fstatat(dev_fd, "userfaultfd", &d->st, 0)) {
		fail(why, "mknod %s: %s", DEV_UFFD, strerror(errno));
		return -1;
	}
	d->created = true;
	tap_diag("%s was missing; created it from sysfs (%u:%u)", DEV_UFFD,
		 maj, min);
	return 0;
}

static void dev_restore(struct dev_state *d)
{
	if (d->created) {
		unlinkat(dev_fd, "userfaultfd", 0);
		return;
	}
	if (fchownat(dev_fd, "userfaultfd", d->st.st_uid, d->st.st_gid, 0) ||
	    fchmodat(dev_fd, "userfaultfd", d->st.st_mode & 07777, 0))
		tap_diag("restoring %s: %s", DEV_UFFD, strerror(errno));
}

static bool dev_open_denied(char *why)
{
	int fd = openat(dev_fd, "null", O_RDWR | O_CLOEXEC);

	/* The lookup itself works: a world-writable node opens. */
	if (fd < 0)
		return fail(why, "open /dev/null as uid %d: %s", UNPRIV_ID,
			    strerror(errno));
	close(fd);
	fd = openat(dev_fd, "userfaultfd", O_RDWR | O_CLOEXEC);
	if (fd >= 0) {
		close(fd);
		return fail(why, "uid %d opened the root-only %s", UNPRIV_ID,
			    DEV_UFFD);
	}
	if (errno != EACCES)
		return fail(why, "open %s: %s, expected EACCES", DEV_UFFD,
			    strerror(errno));
	return true;
}

/* Open the node, USERFAULTFD_IOC_NEW without UFFD_USER_MODE_ONLY, API. */
static int dev_new_uffd(char *why)
{
	int dev = openat(dev_fd, "userfaultfd", O_RDWR | O_CLOEXEC), uffd, err;

	if (dev < 0)
		return fail(why, "open %s: %s", DEV_UFFD, strerror(errno)), -1;
	uffd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
	close(dev);
	if (uffd < 0)
		return fail(why, "USERFAULTFD_IOC_NEW: %s", strerror(errno)), -1;
	err = uffd_api(uffd, UFFD_FEATURE_PAGEFAULT_FLAG_WP);
	if (err) {
		close(uffd);
		return fail(why, "UFFDIO_API on the new uffd: %s",
			    strerror(-err)), -1;
	}
	return uffd;
}

/* The uffd from the node handles both user and kernel WP faults. */
static bool dev_full_uffd(char *why)
{
	int uffd = dev_new_uffd(why);
	bool ok;

	if (uffd < 0)
		return false;
	ok = user_fault_roundtrip(uffd, why) &&
	     kernel_fault_roundtrip(uffd, why);
	close(uffd);
	return ok;
}

static void test_dev(void)
{
	const char *n1 = "privilege-dev-unprivileged-open-eacces";
	const char *n2 = "privilege-dev-root-ioc-new-full-uffd";
	const char *n3 = "privilege-dev-access-overrides-sysctl";
	struct dev_state d = { 0 };
	char why[WHY_LEN] = "";
	mode_t mode;

	if (dev_prepare(&d, why)) {
		tap_fail(n1, "%s", why);
		tap_fail(n2, "%s", why);
		tap_fail(n3, "%s", why);
		return;
	}
	mode = d.st.st_mode & 07777;
	if (!S_ISCHR(d.st.st_mode) || d.st.st_uid != 0 || (mode & 077))
		tap_fail(n1, "%s is not a root-only char device: mode 0%o "
			 "uid %d", DEV_UFFD, d.st.st_mode, d.st.st_uid);
	else
		tap_check(as_unprivileged(dev_open_denied, why), n1, "%s", why);

	why[0] = 0;
	tap_check(dev_full_uffd(why), n2, "root: %s", why);

	why[0] = 0;
	if (write_sysctl("0") ||
	    fchownat(dev_fd, "userfaultfd", UNPRIV_ID, UNPRIV_ID, 0))
		tap_fail(n3, "setup (sysctl 0, chown): %s", strerror(errno));
	else
		tap_check(as_unprivileged(dev_full_uffd, why), n3,
			  "owner uid %d, unprivileged_userfaultfd=0: %s",
			  UNPRIV_ID, why);
	dev_restore(&d);
}

int main(void)
{
	char saved[16];
	int err;

	watchdog(60);
	tap_plan(7);
	if (getuid() != 0)
		tap_bail("must run as root in the guest (uid %d)", getuid());
	err = read_sysctl(saved, sizeof(saved));
	if (err)
		tap_bail("%s: %s", SYSCTL, strerror(-err));
	proc_fd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
	dev_fd = open("/dev", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (proc_fd < 0 || dev_fd < 0)
		tap_bail("opening /proc and /dev: %s", strerror(errno));
	run_unpriv_case("privilege-unpriv-syscall-eperm", "0",
			unpriv_syscall_eperm);
	run_unpriv_case("privilege-unpriv-user-mode-only-wp", "0",
			unpriv_user_mode_only_wp);
	run_unpriv_case("privilege-user-mode-only-kernel-write-efault", "0",
			unpriv_user_mode_only_kernel_efault);
	run_unpriv_case("privilege-unpriv-sysctl-1-handles-kernel-faults", "1",
			unpriv_syscall_full);
	test_dev();
	if (write_sysctl(saved))
		tap_diag("could not restore %s to %s", SYSCTL, saved);
	return tap_done();
}
