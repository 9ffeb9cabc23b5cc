// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/* util.c: page size, clock, retried ioctl, private allocations. */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

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

int uw_ioctl(int fd, unsigned long req, void *arg)
{
	for (;;) {
		if (ioctl(fd, req, arg) == 0)
			return 0;
		if (errno != EINTR && errno != EAGAIN)
			return -errno;
	}
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
