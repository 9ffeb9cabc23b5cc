// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * tracker_softdirty.c: the soft-dirty backend.  Writing "4" to
 * /proc/self/clear_refs clears the soft-dirty bit of every page of the
 * process; the kernel sets it again on the next write, and pagemap shows it
 * as bit 55.  Collect reads the bits of the regions, then clears them all.
 *
 * No atomic read-and-clear exists, so a write between the read and the
 * clear would be lost.  Collect therefore holds the writers out of the
 * regions for that window: it takes PROT_WRITE away from them, and a write
 * meanwhile waits in the SIGSEGV handler of the mprotect backend
 * (tracker_mprotect.c) until the window ends, then is retried.  The same
 * pagemap pass finds the pages the program discarded (tracker.c).  A write
 * by the kernel into the regions during collect (read(2) into them) fails
 * with EFAULT, as with the mprotect backend all the time.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "internal.h"

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
	t->registered = true;	/* marks the claim as ours */
	err = uw_segv_attach(t, false);
	if (!err)
		err = uw_pagemap_open(t);
	/* The pages' state before the clear (the start of tracking): a
	 * discard from now on is seen by the first collect. */
	if (!err)
		err = uw_pagemap_pass(t, false, true);
	if (!err)
		err = uw_clear_refs_soft_dirty();
	return err;
}

static int sd_gather(struct uffdwp_tracker *t)
{
	/* Before the hold: between collects the regions have their own
	 * protection, which the release would otherwise put back over
	 * the program's. */
	int stale = uw_segv_check(t);
	int err = uw_segv_hold(t), err2;

	if (!err)
		err = uw_pagemap_pass(t, true, false);
	if (!err)
		err = uw_clear_refs_soft_dirty();
	err2 = uw_segv_release(t);
	return err ? err : err2 ? err2 : stale;
}

static void sd_stop(struct uffdwp_tracker *t)
{
	uw_segv_detach(t, false);
	uw_pagemap_close(t);
	if (t->registered)
		uw_soft_dirty_release();
	t->registered = false;
}

const struct uw_tracker_ops uw_softdirty_ops = {
	.start = sd_start,
	.gather = sd_gather,
	.stop = sd_stop,
};
