// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * handle.c: telling a live handle from a dead one, and writing into the
 * caller's buffers without a fault, for the functions added in 0.4.
 *
 * Every handle (snapshot, session, tracker) is a mapping of its own whose
 * first word is its kind's magic while it lives; free clears the word and
 * unmaps.  A freed handle (unmapped, or mapped again by something else
 * that does not start with the magic), a garbage pointer or a handle of
 * another kind is then -EINVAL instead of a crash: the word is read with
 * process_vm_readv(2) on ourselves.  A handle freed and whose address a
 * new handle of the same kind took is that new handle: not detectable.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "snapshot.h"

bool uw_handle_live(const void *h, uint32_t magic)
{
	uint32_t word;

	/* Handles are page-aligned mappings of the library's. */
	if (!h || (uintptr_t)h % uw_page_size())
		return false;
	return !uw_read_self(&word, (uintptr_t)h, sizeof(word)) &&
	       word == magic;
}

int uw_copy_out(void *dst, const void *src, size_t len)
{
	struct iovec l = { (void *)src, len }, r = { dst, len };
	ssize_t n;

	if (!len)
		return 0;
	if (!dst)
		return -EINVAL;
	do
		n = process_vm_writev(getpid(), &l, 1, &r, 1, 0);
	while (n < 0 && errno == EINTR);
	if (n == (ssize_t)len)
		return 0;
	if (n >= 0 || errno == EFAULT || errno == ENOMEM)
		return -EINVAL;
	/* process_vm_writev(2) refused (seccomp, ENOSYS): a plain copy. */
	memcpy(dst, src, len);
	return 0;
}

struct uffdwp_snapshot *uw_session_of(struct uffdwp_session *ss)
{
	return uw_handle_live(ss, UW_SESSION_MAGIC) ?
	       (struct uffdwp_snapshot *)ss : NULL;
}

struct uffdwp_snapshot *uw_snapshot_of(struct uffdwp_snapshot *s)
{
	return uw_handle_live(s, UW_SNAPSHOT_MAGIC) ? s : NULL;
}
