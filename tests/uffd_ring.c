// SPDX-License-Identifier: GPL-2.0
/* uffd_ring.c: helpers over the write-log ring uAPI (see uffd_ring.h). */
#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

#include <errno.h>
#include <linux/fs.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

bool ring_supported(void)
{
	uint64_t got = 0;
	int fd = uffd_open(0, &got);

	if (fd < 0)
		return false;
	close(fd);
	return got & UFFD_FEATURE_WP_RING;
}

bool set_mode_supported(void)
{
	struct uffdio_api api = { .api = UFFD_API,
				  .features = UFFD_FEATURE_WP_ASYNC };
	int fd = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
	bool ok;

	if (fd < 0)
		return false;
	ok = !ioctl(fd, UFFDIO_API, &api) &&
	     (api.ioctls & ((__u64)1 << _UFFDIO_SET_MODE));
	close(fd);
	return ok;
}

int uffd_set_async(int uffd, bool async)
{
	struct uffdio_set_mode m = { 0 };

	if (async)
		m.enable = UFFD_FEATURE_WP_ASYNC;
	else
		m.disable = UFFD_FEATURE_WP_ASYNC;
	return ioctl(uffd, UFFDIO_SET_MODE, &m) ? -errno : 0;
}

int ring_open(struct uring_view *r, uint64_t entries, uint64_t extra)
{
	struct uffdio_ring_setup setup = { .entries = entries };
	void *map;
	int err;

	r->hdr = NULL;
	r->consumer = 0;
	r->uffd = uffd_open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_RING |
			    extra, NULL);
	if (r->uffd < 0)
		return r->uffd;
	if (ioctl(r->uffd, UFFDIO_RING_SETUP, &setup)) {
		err = -errno;
		goto fail;
	}
	map = mmap(NULL, setup.mmap_size, PROT_READ, MAP_SHARED, r->uffd, 0);
	if (map == MAP_FAILED) {
		err = -errno;
		goto fail;
	}
	r->hdr = map;
	r->map_size = setup.mmap_size;
	r->slots = (const uint64_t *)((char *)map + r->hdr->entry_offset);
	return 0;
fail:
	close(r->uffd);
	r->uffd = -1;
	return err;
}

void ring_close(struct uring_view *r)
{
	if (r->hdr)
		munmap(r->hdr, r->map_size);
	if (r->uffd >= 0)
		close(r->uffd);
	r->hdr = NULL;
	r->uffd = -1;
}

char *ring_track(struct uring_view *r, size_t npages, bool populate)
{
	size_t len = npages * page_size();
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	if (populate)
		memset(p, 1, len);
	if (uffd_register(r->uffd, p, len, UFFDIO_REGISTER_MODE_WP, NULL) ||
	    uffd_wp(r->uffd, p, len, UFFDIO_WRITEPROTECT_MODE_WP)) {
		munmap(p, len);
		return NULL;
	}
	return p;
}

char *ring_tracked(struct uring_view *r, const char *name, uint64_t entries,
		   size_t npages)
{
	char *p;

	if (ring_open(r, entries, 0)) {
		tap_fail(name, "ring_open failed");
		return NULL;
	}
	p = ring_track(r, npages, true);
	if (!p) {
		tap_fail(name, "ring_track failed");
		ring_close(r);
	}
	return p;
}

uint64_t ring_producer(const struct uring_view *r)
{
	return __atomic_load_n(&r->hdr->producer, __ATOMIC_ACQUIRE);
}

uint64_t ring_consumer(const struct uring_view *r)
{
	return __atomic_load_n(&r->hdr->consumer, __ATOMIC_ACQUIRE);
}

bool ring_overflowed(struct uring_view *r)
{
	/* The count first: the kernel publishes it after the flag. */
	r->overflows_seen = __atomic_load_n(&r->hdr->overflows,
					    __ATOMIC_ACQUIRE);
	return __atomic_load_n(&r->hdr->flags, __ATOMIC_ACQUIRE) &
	       UFFD_RING_OVERFLOW;
}

uint64_t ring_entry(const struct uring_view *r, uint64_t i)
{
	return r->slots[i & (r->hdr->entries - 1)];
}

int ring_reset(struct uring_view *r, uint64_t consumer, uint64_t flags,
	       uint64_t *reprotected)
{
	struct uffdio_ring_reset reset = {
		.consumer = consumer, .flags = flags,
		.overflows = r->overflows_seen,
	};

	if (ioctl(r->uffd, UFFDIO_RING_RESET, &reset))
		return -errno;
	r->consumer = consumer;
	if (reprotected)
		*reprotected = reset.reprotected;
	return 0;
}

long scan_written_reprotect(void *addr, size_t len,
			    void (*fn)(unsigned long page, void *arg), void *arg)
{
	static __thread struct page_region vec[512];
	unsigned long start = (unsigned long)addr, end = start + len;
	long psz = page_size(), found = 0;
	int pm, i;

	pm = open("/proc/self/pagemap", O_RDONLY);
	if (pm < 0)
		return -errno;
	while (start < end) {
		struct pm_scan_arg a = {
			.size = sizeof(a),
			.flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
			.start = start, .end = end,
			.vec = (unsigned long)vec, .vec_len = 512,
			.category_mask = PAGE_IS_WRITTEN,
			.return_mask = PAGE_IS_WRITTEN,
		};
		long n = ioctl(pm, PAGEMAP_SCAN, &a);

		if (n < 0) {
			found = -errno;
			break;
		}
		for (i = 0; i < n; i++) {
			unsigned long p;

			for (p = vec[i].start; p < vec[i].end; p += psz) {
				if (fn)
					fn(p, arg);
				found++;
			}
		}
		if (a.walk_end <= start)
			break;
		start = a.walk_end;
	}
	close(pm);
	return found;
}
