// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * tracker_scan.c: the PAGEMAP_SCAN backend.  The regions are registered
 * with a WP_ASYNC userfaultfd and protected; the kernel resolves write
 * faults itself by clearing the page's WP bit, and one PAGEMAP_SCAN with
 * PM_SCAN_WP_MATCHING reports the pages without it (PAGE_IS_WRITTEN) and
 * protects them again atomically.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "internal.h"

#define VEC_LEN 512

int uw_async_start(struct uffdwp_tracker *t, uint64_t extra,
		   int (*setup)(struct uffdwp_tracker *t))
{
	struct uffdwp_features f;
	uint64_t features = UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			    UFFD_FEATURE_WP_ASYNC | extra;
	int err;

	uffdwp_probe(&f);
	if (f.wp_unpopulated)
		features |= UFFD_FEATURE_WP_UNPOPULATED;
	t->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (t->pagemap_fd < 0)
		return -errno;
	t->vec_len = VEC_LEN;
	t->vec = uw_alloc(VEC_LEN * sizeof(*t->vec));
	if (!t->vec)
		return -ENOMEM;
	err = uffdwp_open(0, features, NULL);
	if (err < 0)
		return err;
	t->uffd = err;
	if (setup) {
		err = setup(t);
		if (err)
			return err;
	}
	err = uw_register_wp(t->uffd, &t->rs);
	if (err)
		return err;
	t->registered = true;
	if (!f.wp_unpopulated) {
		err = uw_populate_read(&t->rs);
		if (err)
			return err;
	}
	for (size_t i = 0; i < t->rs.nr; i++) {
		err = uw_protect(t->uffd, (uintptr_t)t->rs.r[i].addr,
				 t->rs.r[i].len, true, false);
		if (err)
			return err;
	}
	return 0;
}

void uw_async_stop(struct uffdwp_tracker *t)
{
	if (t->registered)
		uw_unregister(t->uffd, &t->rs);
	t->registered = false;
	if (t->uffd >= 0) {
		close(t->uffd);
		t->uffd = -1;
	}
	if (t->pagemap_fd >= 0) {
		close(t->pagemap_fd);
		t->pagemap_fd = -1;
	}
	uw_free(t->vec, t->vec_len * sizeof(*t->vec));
	t->vec = NULL;
}

static void mark_written(void *arg, uintptr_t start, uintptr_t end)
{
	uw_mark_range(arg, start, end - start);
}

int uw_scan_written(struct uffdwp_tracker *t)
{
	return uw_scan_regions(t->pagemap_fd, &t->rs,
			       PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
			       PAGE_IS_WRITTEN, t->vec, t->vec_len,
			       mark_written, t);
}

static int scan_start(struct uffdwp_tracker *t)
{
	return uw_async_start(t, 0, NULL);
}

const struct uw_tracker_ops uw_scan_ops = {
	.start = scan_start,
	.gather = uw_scan_written,
	.stop = uw_async_stop,
};
