// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapshot-fd.c: a pollable completion.  Each snapshot and session has
 * an eventfd (O_CLOEXEC, O_NONBLOCK) that holds a count while the
 * current snapshot is done: uw_snap_finish() adds one when DONE becomes
 * true, a session's next instant empties it when DONE becomes false, both
 * under s->lock, so the descriptor is readable exactly when
 * uffdwp_snapshot_wait() (uffdwp_session_wait()) would not wait.  The
 * caller only polls it; the library never reads it except to empty it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <unistd.h>

#include "snapshot.h"

void uw_done_signal(struct uffdwp_snapshot *s)
{
	uint64_t one = 1;

	if (s->done_fd >= 0 && write(s->done_fd, &one, sizeof(one)) < 0) {
		/* an eventfd at its maximum is readable anyway */
	}
}

void uw_done_drain(struct uffdwp_snapshot *s)
{
	uint64_t n;

	if (s->done_fd >= 0 && read(s->done_fd, &n, sizeof(n)) < 0) {
		/* EAGAIN: it was empty */
	}
}

int uffdwp_snapshot_fd(struct uffdwp_snapshot *s)
{
	s = uw_snapshot_of(s);
	if (!s)
		return -EINVAL;
	if (uw_snap_foreign(s))
		return -ECHILD;
	return s->done_fd;
}

int uffdwp_session_fd(struct uffdwp_session *ss)
{
	struct uffdwp_snapshot *s = uw_session_of(ss);

	if (!s)
		return -EINVAL;
	if (uw_snap_foreign(s))
		return -ECHILD;
	return s->done_fd;
}
