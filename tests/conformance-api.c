// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-api: the userfaultfd API surface of write-protection.
 *
 * Contract checked (issue tracker, area 1 "api"):
 *  - UFFDIO_API offers UFFD_FEATURE_PAGEFAULT_FLAG_WP, and a uffd may ask
 *    for it;
 *  - UFFDIO_REGISTER with MODE_WP, and with MODE_MISSING|MODE_WP, on private
 *    anonymous memory succeeds and returns ioctls that include
 *    _UFFDIO_WRITEPROTECT, and that ioctl then really protects the range;
 *    MODE_MISSING alone does not advertise it (and it then gives ENOENT);
 *  - registering WP on a VMA without VM_MAYWRITE (MAP_SHARED of a file
 *    opened read-only) is refused and leaves nothing registered.  The
 *    tracker says EINVAL; 6.12 answers EPERM (fs/userfaultfd.c, the
 *    VM_MAYWRITE check in userfaultfd_register() runs before the later
 *    WP-specific EINVAL check, which is therefore unreachable), so this
 *    case asserts EPERM.  A MAP_PRIVATE mapping of the same read-only file
 *    keeps VM_MAYWRITE and must register.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"

#define PAGES		4
#define WP_IOCTL	((uint64_t)1 << _UFFDIO_WRITEPROTECT)
#define COPY_IOCTL	((uint64_t)1 << _UFFDIO_COPY)
#define WAKE_IOCTL	((uint64_t)1 << _UFFDIO_WAKE)

static size_t area_len(void)
{
	return PAGES * page_size();
}

/* A populated private anonymous area of PAGES pages, or NULL. */
static char *map_populated(void)
{
	char *p = mmap(NULL, area_len(), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	memset(p, 0x5a, area_len());
	return p;
}

static void case_offers_wp_feature(void)
{
	const char *name = "api-offers-pagefault-flag-wp";
	uint64_t offered = 0, granted = 0;
	int fd, fd2;

	fd = uffd_open(0, &offered);
	if (fd < 0) {
		tap_fail(name, "userfaultfd + UFFDIO_API: %s", strerror(-fd));
		return;
	}
	close(fd);
	fd2 = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, &granted);
	if (fd2 >= 0)
		close(fd2);
	tap_check((offered & UFFD_FEATURE_PAGEFAULT_FLAG_WP) && fd2 >= 0 &&
		  (granted & UFFD_FEATURE_PAGEFAULT_FLAG_WP), name,
		  "features offered %#llx; asking for PAGEFAULT_FLAG_WP: %s, "
		  "reported %#llx", (unsigned long long)offered,
		  fd2 < 0 ? strerror(-fd2) : "ok",
		  (unsigned long long)granted);
}

/* The advertised UFFDIO_WRITEPROTECT must work: protect and unprotect. */
static bool wp_ioctl_works(int uffd, char *p)
{
	int err = uffd_wp(uffd, p, area_len(), UFFDIO_WRITEPROTECT_MODE_WP);
	size_t n;

	if (err)
		return because("UFFDIO_WRITEPROTECT(MODE_WP): %s", strerror(-err));
	n = pages_with(p, area_len(), PM_UFFD_WP);
	if (n != PAGES)
		return because("after MODE_WP %zu of %d pages have PM_UFFD_WP",
			       n, PAGES);
	err = uffd_wp(uffd, p, area_len(), 0);
	if (err)
		return because("UFFDIO_WRITEPROTECT(0): %s", strerror(-err));
	n = pages_with(p, area_len(), PM_UFFD_WP);
	if (n)
		return because("after mode 0 %zu pages still have PM_UFFD_WP", n);
	return true;
}

/* Register a fresh populated area with MODE and check the ioctls it gets. */
static bool register_gives_ioctls(uint64_t mode, uint64_t must_have)
{
	uint64_t ioctls = 0;
	char *p = map_populated();
	int uffd, err;
	bool ok = false;

	if (!p)
		return because("mmap: %s", strerror(errno));
	uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (uffd < 0) {
		munmap(p, area_len());
		return because("uffd_open: %s", strerror(-uffd));
	}
	err = uffd_register(uffd, p, area_len(), mode, &ioctls);
	if (err)
		because("UFFDIO_REGISTER mode %#llx: %s", (unsigned long long)mode,
			strerror(-err));
	else if ((ioctls & must_have) != must_have)
		because("ioctls %#llx lack %#llx", (unsigned long long)ioctls,
			(unsigned long long)(must_have & ~ioctls));
	else
		ok = wp_ioctl_works(uffd, p);
	close(uffd);
	munmap(p, area_len());
	return ok;
}

static void case_register_wp(void)
{
	tap_check(register_gives_ioctls(UFFDIO_REGISTER_MODE_WP,
					WP_IOCTL | WAKE_IOCTL),
		  "api-register-wp-advertises-writeprotect", "%s", why);
}

static void case_register_missing_wp(void)
{
	tap_check(register_gives_ioctls(UFFDIO_REGISTER_MODE_MISSING |
					UFFDIO_REGISTER_MODE_WP,
					WP_IOCTL | WAKE_IOCTL | COPY_IOCTL),
		  "api-register-missing-wp-advertises-writeprotect", "%s", why);
}

static bool missing_only_lacks_wp(void)
{
	uint64_t ioctls = 0;
	char *p = map_populated();
	int uffd, err;
	bool ok = false;

	if (!p)
		return because("mmap: %s", strerror(errno));
	uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (uffd < 0) {
		munmap(p, area_len());
		return because("uffd_open: %s", strerror(-uffd));
	}
	err = uffd_register(uffd, p, area_len(), UFFDIO_REGISTER_MODE_MISSING,
			    &ioctls);
	if (err) {
		because("UFFDIO_REGISTER(MISSING): %s", strerror(-err));
	} else if (ioctls & WP_IOCTL) {
		because("MISSING-only registration advertises _UFFDIO_WRITEPROTECT "
			"(ioctls %#llx)", (unsigned long long)ioctls);
	} else {
		err = uffd_wp(uffd, p, area_len(), UFFDIO_WRITEPROTECT_MODE_WP);
		if (err != -ENOENT)
			because("UFFDIO_WRITEPROTECT on it gave %s, want ENOENT",
				err ? strerror(-err) : "success");
		else if (pages_with(p, area_len(), PM_UFFD_WP))
			because("pages got PM_UFFD_WP although the call failed");
		else
			ok = true;
	}
	close(uffd);
	munmap(p, area_len());
	return ok;
}

static void case_register_missing_only(void)
{
	tap_check(missing_only_lacks_wp(),
		  "api-register-missing-only-lacks-writeprotect", "%s", why);
}

/* A file of PAGES pages in /tmp, reopened read-only; returns the fd. */
static int readonly_tmp_file(void)
{
	char path[] = "/tmp/conformance-api-XXXXXX";
	char *buf;
	int fd = mkstemp(path), ro;

	if (fd < 0)
		return -errno;
	buf = malloc(area_len());
	if (!buf) {
		close(fd);
		unlink(path);
		return -ENOMEM;
	}
	memset(buf, 0x3c, area_len());
	if (write(fd, buf, area_len()) != (ssize_t)area_len()) {
		free(buf);
		close(fd);
		unlink(path);
		return -EIO;
	}
	free(buf);
	close(fd);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	if (ro < 0)
		ro = -errno;
	unlink(path);
	return ro;
}

/* Map the read-only file FD with FLAGS, touch it, register it with MODE. */
static int register_file_map(int fd, int flags, uint64_t mode, int *uffd_out,
			     char **map_out, uint64_t *ioctls)
{
	char *p = mmap(NULL, area_len(), PROT_READ, flags, fd, 0);
	volatile char sink;
	int uffd;

	if (p == MAP_FAILED)
		return -errno;
	for (size_t off = 0; off < area_len(); off += page_size())
		sink = p[off];
	(void)sink;
	uffd = uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (uffd < 0) {
		munmap(p, area_len());
		return uffd;
	}
	*uffd_out = uffd;
	*map_out = p;
	return uffd_register(uffd, p, area_len(), mode, ioctls);
}

static bool shared_readonly_refused(uint64_t mode)
{
	uint64_t ioctls = 0;
	char *p = NULL;
	int fd = readonly_tmp_file(), uffd = -1, err;
	bool ok = false;

	if (fd < 0)
		return because("creating the /tmp file: %s", strerror(-fd));
	err = register_file_map(fd, MAP_SHARED, mode, &uffd, &p, &ioctls);
	close(fd);
	if (uffd < 0)
		return because("setup: %s", strerror(-err));
	if (err != -EPERM) {
		because("UFFDIO_REGISTER mode %#llx on MAP_SHARED of an O_RDONLY "
			"file: %s, want EPERM", (unsigned long long)mode,
			err ? strerror(-err) : "success");
	} else {
		/* Nothing may have been registered. */
		err = uffd_wp(uffd, p, area_len(), UFFDIO_WRITEPROTECT_MODE_WP);
		if (err != -ENOENT)
			because("after the refusal UFFDIO_WRITEPROTECT gave %s, "
				"want ENOENT", err ? strerror(-err) : "success");
		else
			ok = true;
	}
	close(uffd);
	munmap(p, area_len());
	return ok;
}

static void case_shared_readonly_file(void)
{
	tap_check(shared_readonly_refused(UFFDIO_REGISTER_MODE_WP) &&
		  shared_readonly_refused(UFFDIO_REGISTER_MODE_MISSING |
					  UFFDIO_REGISTER_MODE_WP),
		  "api-register-wp-needs-maywrite", "%s", why);
}

static bool private_readonly_registers(void)
{
	uint64_t ioctls = 0;
	char *p = NULL;
	int fd = readonly_tmp_file(), uffd = -1, err;
	bool ok = false;

	if (fd < 0)
		return because("creating the /tmp file: %s", strerror(-fd));
	err = register_file_map(fd, MAP_PRIVATE, UFFDIO_REGISTER_MODE_WP,
				&uffd, &p, &ioctls);
	close(fd);
	if (uffd < 0)
		return because("setup: %s", strerror(-err));
	if (err) {
		because("UFFDIO_REGISTER(WP) on MAP_PRIVATE of an O_RDONLY file: %s",
			strerror(-err));
	} else if (!(ioctls & WP_IOCTL)) {
		because("ioctls %#llx lack _UFFDIO_WRITEPROTECT",
			(unsigned long long)ioctls);
	} else {
		err = uffd_wp(uffd, p, area_len(), UFFDIO_WRITEPROTECT_MODE_WP);
		if (err)
			because("UFFDIO_WRITEPROTECT(MODE_WP): %s", strerror(-err));
		else if (pages_with(p, area_len(), PM_UFFD_WP) != PAGES)
			because("only %zu of %d pages have PM_UFFD_WP",
				pages_with(p, area_len(), PM_UFFD_WP), PAGES);
		else
			ok = true;
	}
	close(uffd);
	munmap(p, area_len());
	return ok;
}

static void case_private_readonly_file(void)
{
	tap_check(private_readonly_registers(),
		  "api-register-wp-private-file-mapping", "%s", why);
}

int main(void)
{
	watchdog(60);
	tap_plan(6);
	case_offers_wp_feature();
	case_register_wp();
	case_register_missing_wp();
	case_register_missing_only();
	case_shared_readonly_file();
	case_private_readonly_file();
	return tap_done();
}
