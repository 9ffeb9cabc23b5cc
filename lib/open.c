// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/* open.c: opening a userfaultfd (device first, then syscall), UFFDIO_API,
 * and the register/protect helpers the snapshot and trackers share. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#define OPEN_FLAGS_ALL (UFFDWP_OPEN_KERNEL_FAULTS | UFFDWP_OPEN_NO_DEVICE | \
			UFFDWP_OPEN_NO_SYSCALL | UFFDWP_OPEN_BLOCKING)

static int open_device(int uflags)
{
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC), fd;

	if (dev < 0)
		return -errno;
	fd = ioctl(dev, USERFAULTFD_IOC_NEW, uflags);
	fd = fd < 0 ? -errno : fd;
	close(dev);
	return fd;
}

static int open_syscall(int uflags)
{
#ifdef SYS_userfaultfd
	int fd = (int)syscall(SYS_userfaultfd, uflags);

	return fd < 0 ? -errno : fd;
#else
	(void)uflags;
	return -ENOSYS;
#endif
}

/* A bare userfaultfd, before UFFDIO_API. */
static int open_raw(unsigned int flags)
{
	int uflags = O_CLOEXEC, dev_err = -ENOENT, fd;

	if (!(flags & UFFDWP_OPEN_BLOCKING))
		uflags |= O_NONBLOCK;
	if (!(flags & UFFDWP_OPEN_KERNEL_FAULTS))
		uflags |= UFFD_USER_MODE_ONLY;
	if (!(flags & UFFDWP_OPEN_NO_DEVICE)) {
		fd = open_device(uflags);
		if (fd >= 0)
			return fd;
		dev_err = fd;
	}
	if (flags & UFFDWP_OPEN_NO_SYSCALL)
		return dev_err == -EACCES ? -EPERM : dev_err;
	fd = open_syscall(uflags);
	if (fd >= 0)
		return fd;
	/* The device existed but was not ours to open: say "permission". */
	if (fd == -ENOSYS && (dev_err == -EACCES || dev_err == -EPERM))
		return -EPERM;
	return fd;
}

static int api(int fd, uint64_t features, uint64_t *got)
{
	struct uffdio_api a = { .api = UFFD_API, .features = features };
	int err = uw_ioctl(fd, UFFDIO_API, &a);

	if (!err && got)
		*got = a.features;
	return err;
}

int uffdwp_open(unsigned int flags, uint64_t features, uint64_t *got)
{
	uint64_t supported = 0;
	int fd, err;

	if ((flags & ~OPEN_FLAGS_ALL) ||
	    (flags & UFFDWP_OPEN_NO_DEVICE && flags & UFFDWP_OPEN_NO_SYSCALL))
		return -EINVAL;
	fd = open_raw(flags);
	if (fd < 0)
		return fd;
	err = api(fd, features, got);
	if (!err)
		return fd;
	close(fd);
	if (err != -EINVAL || !features)
		return err;
	/* Tell a missing feature from another EINVAL with a fresh fd. */
	fd = open_raw(flags);
	if (fd < 0)
		return err;
	if (!api(fd, 0, &supported) && (supported & features) != features)
		err = -EOPNOTSUPP;
	close(fd);
	return err;
}

int uw_register_wp(int uffd, const struct uw_regions *rs)
{
	for (size_t i = 0; i < rs->nr; i++) {
		struct uffdio_register r = {
			.range = { .start = (uintptr_t)rs->r[i].addr,
				   .len = rs->r[i].len },
			.mode = UFFDIO_REGISTER_MODE_WP,
		};
		int err = uw_ioctl(uffd, UFFDIO_REGISTER, &r);

		if (!err && !(r.ioctls & (1ULL << _UFFDIO_WRITEPROTECT)))
			err = -EOPNOTSUPP;
		if (err) {
			while (i--) {
				struct uffdio_range u = {
					.start = (uintptr_t)rs->r[i].addr,
					.len = rs->r[i].len,
				};
				uw_ioctl(uffd, UFFDIO_UNREGISTER, &u);
			}
			return err;
		}
	}
	return 0;
}

void uw_unregister(int uffd, const struct uw_regions *rs)
{
	for (size_t i = 0; i < rs->nr; i++) {
		struct uffdio_range u = { .start = (uintptr_t)rs->r[i].addr,
					  .len = rs->r[i].len };

		uw_ioctl(uffd, UFFDIO_UNREGISTER, &u);
	}
}

int uw_protect(int uffd, uintptr_t addr, size_t len, bool wp, bool wake)
{
	struct uffdio_writeprotect w = {
		.range = { .start = addr, .len = len },
		/* The kernel refuses WP together with DONTWAKE. */
		.mode = wp ? UFFDIO_WRITEPROTECT_MODE_WP :
			wake ? 0 : UFFDIO_WRITEPROTECT_MODE_DONTWAKE,
	};

	return uw_ioctl(uffd, UFFDIO_WRITEPROTECT, &w);
}

int uw_wake(int uffd, uintptr_t addr, size_t len)
{
	struct uffdio_range r = { .start = addr, .len = len };

	return uw_ioctl(uffd, UFFDIO_WAKE, &r);
}
