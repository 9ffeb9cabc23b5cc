// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * tracker_softdirty.c: the soft-dirty backend.  Writing "4" to
 * /proc/self/clear_refs clears the soft-dirty bit of every page of the
 * process; the kernel sets it again on the next write, and pagemap shows it
 * as bit 55.  Collect reads the bits of the regions, then clears them all.
 * A write between the read and the clear is lost (no atomic read-and-clear
 * exists), hence the last-but-one place in the order of preference.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "internal.h"

#define PM_SOFT_DIRTY_BIT	(1ULL << 55)
#define BATCH			4096	/* pagemap entries per pread */

static atomic_bool soft_dirty_used;

int uw_soft_dirty_claim(void)
{
	bool no = false;

	return atomic_compare_exchange_strong(&soft_dirty_used, &no, true) ?
	       0 : -EBUSY;
}

void uw_soft_dirty_release(void)
{
	atomic_store(&soft_dirty_used, false);
}

bool uw_soft_dirty_in_use(void)
{
	return atomic_load(&soft_dirty_used);
}

int uw_clear_refs_soft_dirty(void)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC), err = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, "4", 1) != 1)
		err = -errno;
	close(fd);
	return err;
}

static int sd_start(struct uffdwp_tracker *t)
{
	int err = uw_soft_dirty_claim();

	if (err)
		return err;
	t->slot = 0;		/* marks the claim as ours */
	t->vec_len = BATCH * 8 / sizeof(*t->vec);
	t->vec = uw_alloc(BATCH * 8);
	if (!t->vec)
		return -ENOMEM;
	t->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (t->pagemap_fd < 0)
		return -errno;
	return uw_clear_refs_soft_dirty();
}

static int sd_gather(struct uffdwp_tracker *t)
{
	uint64_t *e = (uint64_t *)t->vec;
	size_t psz = uw_page_size();

	for (size_t i = 0; i < t->rs.nr; i++) {
		size_t pages = t->rs.r[i].len / psz;
		uintptr_t base = (uintptr_t)t->rs.r[i].addr;

		for (size_t done = 0; done < pages;) {
			size_t n = pages - done < BATCH ? pages - done : BATCH;
			off_t off = (off_t)((base / psz + done) * 8);
			ssize_t got = pread(t->pagemap_fd, e, n * 8, off);

			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0)
				return -errno;
			if (got == 0)
				return -EIO;
			n = (size_t)got / 8;
			for (size_t k = 0; k < n; k++)
				if (e[k] & PM_SOFT_DIRTY_BIT)
					uw_bit_set(t->pending, t->rs.first[i] +
						   done + k);
			done += n;
		}
	}
	return uw_clear_refs_soft_dirty();
}

static void sd_stop(struct uffdwp_tracker *t)
{
	if (t->pagemap_fd >= 0)
		close(t->pagemap_fd);
	t->pagemap_fd = -1;
	uw_free(t->vec, BATCH * 8);
	t->vec = NULL;
	if (t->slot == 0)
		uw_soft_dirty_release();
	t->slot = -1;
}

const struct uw_tracker_ops uw_softdirty_ops = {
	.start = sd_start,
	.gather = sd_gather,
	.stop = sd_stop,
};
