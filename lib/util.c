// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/* util.c: page size, clock, retried ioctl, private allocations, reading
 * our own memory without faulting. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "snapshot.h"

size_t uw_page_size(void)
{
	static size_t psz;

	if (!psz)
		psz = (size_t)sysconf(_SC_PAGESIZE);
	return psz;
}

uint64_t uw_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * Retried on EINTR only.  -EAGAIN (a userfaultfd's mmap_changing: a
 * non-cooperative event such as UFFD_EVENT_REMOVE is pending) goes back to
 * the caller: the event stays pending until somebody reads it, and when
 * that somebody is the caller, retrying here would spin for ever
 * (uw_snap_wp() in snapshot-handler.c reads the events and retries).
 */
int uw_ioctl(int fd, unsigned long req, void *arg)
{
	for (;;) {
		if (ioctl(fd, req, arg) == 0)
			return 0;
		if (errno != EINTR)
			return -errno;
	}
}

/* 0: process_vm_readv() on ourselves works; 1: it does not (seccomp,
 * ENOSYS), so plain copies are used. */
static int readv_broken;

int uw_read_self_v(const struct iovec *local, size_t nlocal, uintptr_t src,
		   size_t len)
{
	struct iovec remote = { (void *)src, len };
	ssize_t n;

	if (!__atomic_load_n(&readv_broken, __ATOMIC_RELAXED)) {
		do
			n = process_vm_readv(getpid(), local, nlocal, &remote,
					     1, 0);
		while (n < 0 && errno == EINTR);
		if (n == (ssize_t)len)
			return 0;
		if (n >= 0 || errno == EFAULT || errno == ENOMEM)
			return -EFAULT;
		if (errno != ENOSYS && errno != EPERM)
			return -errno;
		__atomic_store_n(&readv_broken, 1, __ATOMIC_RELAXED);
	}
	for (size_t i = 0; i < nlocal; i++) {
		memcpy(local[i].iov_base, (const void *)src, local[i].iov_len);
		src += local[i].iov_len;
	}
	return 0;
}

int uw_read_self(void *dst, uintptr_t src, size_t len)
{
	struct iovec l = { dst, len };

	return uw_read_self_v(&l, 1, src, len);
}

void *uw_alloc(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

void uw_free(void *p, size_t len)
{
	if (p)
		munmap(p, len);
}

int uw_copy_in(void *dst, const void *src, size_t len)
{
	return uw_read_self(dst, (uintptr_t)src, len) ? -EINVAL : 0;
}

int uw_store_ptr(void *out, void *val)
{
	struct iovec l = { &val, sizeof(val) }, r = { out, sizeof(val) };
	ssize_t n;

	if (!__atomic_load_n(&readv_broken, __ATOMIC_RELAXED)) {
		do
			n = process_vm_writev(getpid(), &l, 1, &r, 1, 0);
		while (n < 0 && errno == EINTR);
		if (n == (ssize_t)sizeof(val))
			return 0;
		if (n >= 0 || errno == EFAULT || errno == ENOMEM)
			return -EINVAL;
	}
	memcpy(out, &val, sizeof(val));
	return 0;
}
