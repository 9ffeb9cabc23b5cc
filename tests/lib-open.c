// SPDX-License-Identifier: GPL-2.0
/*
 * lib-open: libuffdwp's opening and feature probing.
 *  - uffdwp_probe() reports a consistent feature set, cached and fresh alike;
 *  - uffdwp_open() gives a non-blocking, close-on-exec fd with the features
 *    asked for, by either way (device node, syscall) the caller may use;
 *  - the default fd is user-mode-only: a kernel write into a protected page
 *    fails with EFAULT instead of waiting;
 *  - a feature the kernel lacks is -EOPNOTSUPP, bad flags -EINVAL;
 *  - feature and backend names round-trip.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_ring.h"
#include "uffdwp.h"

static struct uffdwp_features f;

static void t_probe(void)
{
	struct uffdwp_features g;
	int e1 = uffdwp_probe(&f), e2 = uffdwp_probe_fresh(&g);

	tap_diag("kernel features: api %#llx wp %d unpopulated %d async %d scan %d ring %d soft-dirty %d thp %d",
		 (unsigned long long)f.api_features, f.wp, f.wp_unpopulated,
		 f.wp_async, f.pagemap_scan, f.wp_ring, f.soft_dirty, f.thp);
	tap_check(!e1 && !e2 && uffdwp_probe(NULL) == -EINVAL &&
		  f.page_size == (size_t)sysconf(_SC_PAGESIZE) &&
		  (!f.wp_async || f.wp) && (!f.wp_unpopulated || f.wp) &&
		  (!f.wp_ring || f.wp_async) &&
		  f.wp == !!(f.api_features & UFFD_FEATURE_PAGEFAULT_FLAG_WP) &&
		  f.api_features == g.api_features && f.wp == g.wp &&
		  f.pagemap_scan == g.pagemap_scan,
		  "probe-consistent", "probe %d/%d, inconsistent set (wp %d async %d ring %d api %#llx vs %#llx)",
		  e1, e2, f.wp, f.wp_async, f.wp_ring,
		  (unsigned long long)f.api_features,
		  (unsigned long long)g.api_features);
}

/* Bit 55 (soft-dirty) of ADDR's pagemap entry: 1, 0, or -1. */
static int soft_dirty_of(void *addr)
{
	long psz = sysconf(_SC_PAGESIZE);
	int fd = open("/proc/self/pagemap", O_RDONLY);
	uint64_t e = 0;
	bool ok;

	if (fd < 0)
		return -1;
	ok = pread(fd, &e, 8, (off_t)((uintptr_t)addr / psz * 8)) == 8;
	close(fd);
	return ok ? (int)(e >> 55 & 1) : -1;
}

/* Probing changes nothing in the process: in particular it leaves the
 * soft-dirty bits of its pages alone (it used to write clear_refs). */
static void t_probe_no_side_effects(void)
{
	const char *name = "probe-keeps-soft-dirty";
	long psz = sysconf(_SC_PAGESIZE);
	char *p = mmap(NULL, psz, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_features g;
	int before, after, e;

	if (p == MAP_FAILED) {
		tap_fail(name, "mmap: %s", strerror(errno));
		return;
	}
	p[0] = 1;
	before = soft_dirty_of(p);
	e = uffdwp_probe_fresh(&g);
	after = soft_dirty_of(p);
	if (before != 1 && !f.soft_dirty)
		tap_skip(name, "this kernel has no soft-dirty to keep (bit 55 is %d)",
			 before);
	else
		tap_check(!e && before == 1 && after == 1 && g.soft_dirty,
			  name, "probe %d; the written page's soft-dirty bit %d before the probe, %d after; probe says soft-dirty %d",
			  e, before, after, g.soft_dirty);
	munmap(p, psz);
}

/* The loaded library's version is the one this test was compiled with. */
static void t_version(void)
{
	int major = -1, minor = -1, e = uffdwp_version(&major, &minor);

	tap_check(!e && major == UFFDWP_VERSION_MAJOR &&
		  minor == UFFDWP_VERSION_MINOR &&
		  uffdwp_version_at_least(UFFDWP_VERSION_MAJOR, 0) &&
		  uffdwp_version_at_least(UFFDWP_VERSION_MAJOR,
					  UFFDWP_VERSION_MINOR) &&
		  !uffdwp_version_at_least(UFFDWP_VERSION_MAJOR,
					   UFFDWP_VERSION_MINOR + 1) &&
		  !uffdwp_version_at_least(UFFDWP_VERSION_MAJOR + 1, 0) &&
		  uffdwp_version(NULL, &minor) == -EINVAL, "version",
		  "uffdwp_version %d: %d.%d, compiled with %d.%d", e, major,
		  minor, UFFDWP_VERSION_MAJOR, UFFDWP_VERSION_MINOR);
}

static void t_open_default(void)
{
	uint64_t got = 0;
	int fd = uffdwp_open(0, f.wp ? UFFD_FEATURE_PAGEFAULT_FLAG_WP : 0, &got);
	int fl, fdf;

	if (fd == -EPERM || fd == -ENOSYS) {
		tap_skip("open-default", "no userfaultfd for this process: %s",
			 strerror(-fd));
		return;
	}
	fl = fcntl(fd, F_GETFL);
	fdf = fcntl(fd, F_GETFD);
	tap_check(fd >= 0 && (fl & O_NONBLOCK) && (fdf & FD_CLOEXEC) &&
		  got == f.api_features, "open-default",
		  "fd %d flags %#x fdflags %#x got %#llx probe %#llx", fd, fl,
		  fdf, (unsigned long long)got,
		  (unsigned long long)f.api_features);
	if (fd >= 0)
		close(fd);
	fd = uffdwp_open(UFFDWP_OPEN_BLOCKING, 0, NULL);
	fl = fd >= 0 ? fcntl(fd, F_GETFL) : 0;
	tap_check(fd >= 0 && !(fl & O_NONBLOCK), "open-blocking",
		  "fd %d flags %#x", fd, fl);
	if (fd >= 0)
		close(fd);
}

static void t_open_ways(void)
{
	int fd = uffdwp_open(UFFDWP_OPEN_NO_SYSCALL, 0, NULL);

	if (access("/dev/userfaultfd", R_OK | W_OK))
		tap_skip("open-device", "/dev/userfaultfd not usable here: %s",
			 strerror(errno));
	else
		tap_check(fd >= 0, "open-device", "open via device: %s",
			  strerror(-fd));
	if (fd >= 0)
		close(fd);
	fd = uffdwp_open(UFFDWP_OPEN_NO_DEVICE, 0, NULL);
	if (fd == -EPERM)
		tap_skip("open-syscall", "userfaultfd(2) not allowed for this caller");
	else
		tap_check(fd >= 0, "open-syscall", "open via syscall: %s",
			  strerror(-fd));
	if (fd >= 0)
		close(fd);
}

/* Default fds are UFFD_USER_MODE_ONLY: read(2) into a protected page must
 * fail with EFAULT, not wait for a handler that never comes. */
static void t_user_mode_only(void)
{
	long psz = sysconf(_SC_PAGESIZE);
	char *p = mmap(NULL, psz, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdio_register reg = { .range = { (uintptr_t)p, psz },
				       .mode = UFFDIO_REGISTER_MODE_WP };
	struct uffdio_writeprotect wp = { .range = { (uintptr_t)p, psz },
					  .mode = UFFDIO_WRITEPROTECT_MODE_WP };
	int pfd[2], fd;
	ssize_t n;

	if (!f.wp) {
		tap_skip("open-user-mode-only", "kernel has no sync write-protect");
		return;
	}
	p[0] = 1;
	fd = uffdwp_open(0, UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (fd < 0 || pipe(pfd) || ioctl(fd, UFFDIO_REGISTER, &reg) ||
	    ioctl(fd, UFFDIO_WRITEPROTECT, &wp)) {
		tap_fail("open-user-mode-only", "setup: %s", strerror(errno));
		return;
	}
	if (write(pfd[1], "x", 1) != 1)
		tap_diag("pipe write failed");
	n = read(pfd[0], p, 1);
	tap_check(n < 0 && errno == EFAULT, "open-user-mode-only",
		  "read(2) into a protected page returned %zd (%s), want EFAULT",
		  n, n < 0 ? strerror(errno) : "ok");
	close(fd);
	close(pfd[0]);
	close(pfd[1]);
	munmap(p, psz);
}

static void t_bad_flags(void)
{
	int a = uffdwp_open(1u << 20, 0, NULL);
	int b = uffdwp_open(UFFDWP_OPEN_NO_DEVICE | UFFDWP_OPEN_NO_SYSCALL, 0, NULL);

	tap_check(a == -EINVAL && b == -EINVAL, "open-bad-flags",
		  "unknown flag %d, no way left %d (want -EINVAL)", a, b);
}

static void t_missing_feature(void)
{
	int fd = uffdwp_open(0, 1ULL << 62, NULL);

	tap_check(fd == -EOPNOTSUPP, "open-missing-feature",
		  "unknown feature bit 62: %d, want -EOPNOTSUPP", fd);
	if (fd >= 0)
		close(fd);
	if (f.wp_ring) {
		tap_skip("open-missing-ring", "this kernel has the WP ring");
		return;
	}
	fd = uffdwp_open(0, UFFD_FEATURE_WP_RING, NULL);
	tap_check(fd == -EOPNOTSUPP, "open-missing-ring",
		  "WP_RING on a kernel without it: %d, want -EOPNOTSUPP", fd);
	if (fd >= 0)
		close(fd);
}

static void t_names(void)
{
	char buf[256], small[4];
	int n = uffdwp_feature_names(&f, buf, sizeof(buf));
	int m = uffdwp_feature_names(&f, small, sizeof(small));
	bool ok = n >= 0 && m == n && (size_t)n == strlen(buf) &&
		  strlen(small) < sizeof(small) &&
		  (!f.wp || strstr(buf, "wp")) &&
		  (!f.pagemap_scan || strstr(buf, "pagemap-scan")) &&
		  uffdwp_feature_names(NULL, buf, 1) == -EINVAL;

	for (int b = 0; b < UFFDWP_BACKEND_COUNT; b++)
		ok &= uffdwp_backend_from_name(uffdwp_backend_name(b)) == b;
	ok &= uffdwp_backend_name(UFFDWP_BACKEND_COUNT) == NULL &&
	      uffdwp_backend_from_name("nope") == -EINVAL &&
	      uffdwp_backend_from_name(NULL) == -EINVAL &&
	      uffdwp_backend_available(99) == -EINVAL;
	tap_check(ok, "names", "feature names '%s' (%d/%d) or backend names wrong",
		  buf, n, m);
}

/*
 * probe-kernel-faults: uffdwp_features.kernel_faults says whether this
 * process may open a userfaultfd handling kernel-mode faults, as
 * uffdwp_open(UFFDWP_OPEN_KERNEL_FAULTS) finds, and the feature names
 * list "kernel-faults" exactly then; a snapshot falls back to user-mode
 * faults exactly when it is false.
 */
static void t_kernel_faults(void)
{
	int fd = uffdwp_open(UFFDWP_OPEN_KERNEL_FAULTS, 0, NULL);
	bool can = fd >= 0;
	char buf[256];
	bool named;

	if (fd >= 0)
		close(fd);
	uffdwp_feature_names(&f, buf, sizeof(buf));
	named = strstr(buf, "kernel-faults") != NULL;
	tap_check(f.kernel_faults == can && named == can, "probe-kernel-faults",
		  "kernel_faults %d, uffdwp_open(KERNEL_FAULTS) %d, names '%s'",
		  f.kernel_faults, fd, buf);
}

static void t_choose(void)
{
	enum uffdwp_backend b = uffdwp_backend_choose();
	bool ok = !uffdwp_backend_available(b);

	/* Nothing better than the choice may be available. */
	for (int k = UFFDWP_BACKEND_RING; k < (int)b; k++)
		ok &= uffdwp_backend_available(k) != 0;
	ok &= (b == UFFDWP_BACKEND_RING) == f.wp_ring;
	tap_check(ok, "backend-choice", "chose %s with ring %d scan %d async %d sd %d",
		  uffdwp_backend_name(b), f.wp_ring, f.pagemap_scan,
		  f.wp_async, f.soft_dirty);
}

int main(void)
{
	tap_plan(14);
	t_version();
	t_probe();
	t_probe_no_side_effects();
	t_open_default();
	t_open_ways();
	t_user_mode_only();
	t_bad_flags();
	t_missing_feature();
	t_names();
	t_kernel_faults();
	t_choose();
	return tap_done();
}
