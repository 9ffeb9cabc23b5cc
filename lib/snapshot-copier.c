// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapshot-copier.c: the snapshot engine's copier thread.  It walks the
 * regions in address order in 2 MiB-aligned chunks, reads PENDING pages
 * from memory (COPYING), takes SAVED and SPILLED ones from where the
 * handler put them, unprotects the chunk and hands it to the sink; a
 * session's file gets its header and trailer here.  Why this keeps the copy
 * consistent: the top of snapshot.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "snapshot-parts.h"

void (*uw_snap_before_chunk)(void);

/* The sum of page IDX as the file holds it (a positional sink). */
static int sum_from_file(struct uffdwp_snapshot *s, size_t idx)
{
	size_t psz = uw_page_size();
	int err = uw_io_all(s->opts.sink_fd, s->page_buf, psz,
			    file_off(s, idx), IO_PREAD);

	if (!err)
		s->sums[file_pos(s, idx)] =
			uw_file_sum(file_pos(s, idx) + 1, s->page_buf, psz);
	return err;
}

static bool spilled_at(struct uffdwp_snapshot *s, size_t first, size_t i)
{
	return s->sink_positional &&
	       atomic_load_explicit(&s->state[first + i],
				    memory_order_relaxed) == ST_SPILLED;
}

/* Hand the chunk buffer (LEN bytes from ADDR, page index FIRST) to the
 * sink: the pages of the set, in runs.  A positional sink gets every run
 * not already spilled into it at the runs' own offsets. */
static int sink(struct uffdwp_snapshot *s, uintptr_t addr, size_t first,
		size_t len)
{
	size_t psz = uw_page_size(), n = len / psz;
	char *p = s->chunk;

	if (s->opts.sink)
		return s->opts.sink(s->opts.sink_arg, (void *)addr, p, len);
	/* A session file: each stored page's sum, by its position. */
	for (size_t i = 0; s->sums && i < n; i++) {
		int err;

		if (!in_set(s, first + i))
			continue;
		if (!spilled_at(s, first, i)) {
			s->sums[file_pos(s, first + i)] =
				uw_file_sum(file_pos(s, first + i) + 1,
					    p + i * psz, psz);
			continue;
		}
		/* spilled into the file by the handler: read it back */
		err = sum_from_file(s, first + i);
		if (err)
			return err;
	}
	for (size_t i = 0; i < n;) {
		size_t j = i;
		int err;

		while (j < n && in_set(s, first + j) && !spilled_at(s, first, j))
			j++;
		if (j == i) {
			i++;
			continue;
		}
		err = s->sink_positional ?
		      uw_io_all(s->opts.sink_fd, p + i * psz, (j - i) * psz,
			     file_off(s, first + i), IO_PWRITE) :
		      uw_io_all(s->opts.sink_fd, p + i * psz, (j - i) * psz, 0,
			     IO_WRITE);
		if (err)
			return err;
		i = j;
	}
	return 0;
}

/* Wait for the handler to finish saving page FIRST + I (a page copy). */
static uint32_t settled(struct uffdwp_snapshot *s, size_t idx)
{
	uint32_t st;

	while ((st = atomic_load_explicit(&s->state[idx],
					  memory_order_acquire)) == ST_CLAIMED)
		sched_yield();
	return st;
}

/* Fill the chunk buffer's page I (page index FIRST + I) from where the
 * handler saved it.  Returns 0 or -errno of the spill file. */
static int fetch_saved(struct uffdwp_snapshot *s, size_t first, size_t i,
		       uint32_t st)
{
	size_t psz = uw_page_size();
	off_t off = spill_off(s, first + i);
	int err;

	if (st >= ST_SAVED) {
		uint32_t slot = st - ST_SAVED;

		memcpy(s->chunk + i * psz, s->side + (size_t)slot * psz, psz);
		pthread_mutex_lock(&s->slot_lock);
		s->free_slot[s->nfree++] = slot;
		pthread_mutex_unlock(&s->slot_lock);
		return 0;
	}
	if (st != ST_SPILLED || s->sink_positional)
		return 0;
	err = uw_io_all(s->spill_fd, s->chunk + i * psz, psz, off, IO_PREAD);
	if (err)
		return err;
	/* Give the memory back; failing to is not worth failing for. */
	fallocate(s->spill_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		  off, (off_t)psz);
	pthread_mutex_lock(&s->lock);
	s->spill_bytes -= psz;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

struct lost_check {
	struct uffdwp_snapshot *s;
	bool lost;
};

static void note_written(void *arg, uintptr_t start, uintptr_t end)
{
	struct lost_check *c = arg;

	for (; start < end && !c->lost; start += uw_page_size())
		c->lost = atomic_load_explicit(
			&c->s->state[uw_page_index(&c->s->rs, start)],
			memory_order_relaxed) == ST_COPYING;
}

/*
 * After the copier's memcpy: is every page it read from memory (COPYING)
 * still write-protected?  One that is not lost its contents without a
 * write fault: discarded (MADV_DONTNEED and the like), and the copier may
 * have read the zeroes that replaced it.  The handler's UFFD_EVENT_REMOVE
 * check cannot see that in time: the kernel zaps as soon as the event is
 * read, before the handler looks at the pages.  -EAGAIN then, else 0 (also
 * without PAGEMAP_SCAN, where this cannot be checked, and after a cancel).
 */
static int check_protected(struct uffdwp_snapshot *s, uintptr_t addr,
			   size_t len)
{
	struct page_region vec[SCAN_VEC];
	struct uffdwp_region r = { (void *)addr, len };
	struct uw_regions one = { .nr = 1, .r = &r };
	struct lost_check c = { s, false };

	if (s->pagemap_fd < 0 ||
	    uw_scan_regions(s->pagemap_fd, &one, 0, PAGE_IS_WRITTEN, vec,
			    SCAN_VEC, note_written, &c))
		return 0;
	/* A cancel (or the handler's abort) unprotects everything first:
	 * then the chunk is dropped anyway, with that error. */
	return c.lost && !cancelled(s) ? -EAGAIN : 0;
}

static int copy_chunk(struct uffdwp_snapshot *s, uintptr_t addr, size_t len)
{
	size_t psz = uw_page_size(), n = len / psz;
	size_t first = (size_t)uw_page_index(&s->rs, addr);
	_Atomic uint32_t *st = s->state + first;
	int err = 0, werr;

	for (size_t i = 0; i < n; i++) {
		uint32_t old = ST_PENDING;

		atomic_compare_exchange_strong_explicit(&st[i], &old,
							ST_COPYING,
							memory_order_acquire,
							memory_order_relaxed);
	}
	/* Protected pages cannot change: copy them as they are (a region
	 * unmapped or made inaccessible meanwhile: -EFAULT, no signal). */
	bool read_memory = false;

	for (size_t i = 0; i < n;) {
		size_t j = i;

		while (j < n && atomic_load_explicit(&st[j],
						     memory_order_relaxed) ==
				ST_COPYING)
			j++;
		if (j > i) {
			int e = uw_read_self(s->chunk + i * psz,
					     addr + i * psz, (j - i) * psz);

			if (e && !err)
				err = e;
			read_memory = true;
		}
		i = j + (j == i);
	}
	/* Only pages read from memory can have been discarded under us. */
	if (read_memory && !err && !s->discard_zero)
		err = check_protected(s, addr, len);
	for (size_t i = 0; i < n; i++)
		settled(s, first + i);
	/*
	 * A discard that could have changed what was read or saved above was
	 * read (the kernel zaps only then) before now: once no thread is
	 * between reading messages and handling their discards, its pages
	 * are in ZEROED (or the snapshot is aborted).
	 */
	while (atomic_load(&s->readers))
		sched_yield();
	for (size_t i = 0; i < n; i++) {
		uint32_t now = atomic_load_explicit(&st[i],
						    memory_order_acquire);
		int e = fetch_saved(s, first, i, now);
		bool gone = in_set(s, first + i) &&
			    uw_bit_test(s->zeroed, first + i);
		bool zero = gone && s->discard_zero;

		if (e && !err)
			err = e;
		/* DISCARD_FAIL: a page discarded before it was sent. */
		if (gone && !zero && !err)
			err = -EAGAIN;
		if (zero)
			memset(s->chunk + i * psz, 0, psz);
		/* A page spilled into a positional sink stays SPILLED: the
		 * sink skips it (unless it is to be stored as zeroes). */
		if (!(now == ST_SPILLED && s->sink_positional && !zero))
			atomic_store_explicit(&st[i], ST_DONE,
					      memory_order_release);
	}
	/* A session keeps the pages protected to see the next write: only
	 * wake the writers that faulted on pages of the chunk. */
	werr = s->session ? uw_wake(s->uffd, addr, len) :
	       uw_snap_wp(s, addr, len, false, true);
	if (werr)
		return err ? err : uw_snap_gone_err(werr);
	if (err)
		return err;
	if (cancelled(s))	/* a page of it may be missing */
		return -ECANCELED;
	err = sink(s, addr, first, len);
	if (err)
		return err < 0 ? err : -EIO;
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < n; i++)
		s->st.pages_copied += in_set(s, first + i);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* Does the chunk of N pages from page index FIRST hold a page of the set? */
static bool chunk_in_set(struct uffdwp_snapshot *s, size_t first, size_t n)
{
	for (size_t i = 0; s->set && i < n; i++) {
		if (i % 64 == 0 && (first + i) % 64 == 0 && n - i >= 64 &&
		    !atomic_load_explicit(&s->set[(first + i) / 64],
					  memory_order_relaxed)) {
			i += 63;
			continue;
		}
		if (uw_bit_test(s->set, first + i))
			return true;
	}
	return !s->set;
}

int uw_snap_dup_sink(int fd)
{
	int d = fcntl(fd, F_DUPFD_CLOEXEC, 3);

	return d < 0 ? -errno : d;
}

/*
 * The copier is done with the sink: close our duplicate of it, so that
 * the caller's file (a pipe's reader) sees no more of us.  After a
 * failure the handler may still be in a save into the sink (a positional
 * spill): wait until none is, none can start once the cancel is seen.
 */
static void release_sink(struct uffdwp_snapshot *s, int err)
{
	if (!s->sink_owned || s->opts.sink_fd < 0)
		return;
	while (err && atomic_load(&s->saving))
		sched_yield();
	if (s->spill_fd == s->opts.sink_fd)
		s->spill_fd = -1;
	close(s->opts.sink_fd);
	s->opts.sink_fd = -1;
}

/* The sink's first bytes: the file header of a session snapshot. */
static int write_prefix(struct uffdwp_snapshot *s)
{
	if (!s->prefix)
		return 0;
	uw_file_prefix(s->prefix, &s->rs, s->full_layout ? NULL : s->set,
		       s->kind, s->file_flags, s->session_id, s->st.epoch,
		       s->st.pages);
	return uw_io_all(s->opts.sink_fd, s->prefix, (size_t)s->data_off,
		      s->spill_base, s->sink_positional ? IO_PWRITE : IO_WRITE);
}

/*
 * After the pages: their sums (a pre-copy's pages outside the last set
 * were written by its rounds: read back from the file for theirs), the
 * sums' sum and the magic.
 */
static int write_trailer(struct uffdwp_snapshot *s)
{
	size_t len = uw_file_trailer_len(s->st.pages);
	int err = 0;

	for (size_t i = 0; s->full_layout && i < s->rs.pages && !err; i++)
		if (!in_set(s, i))
			err = sum_from_file(s, i);
	if (err)
		return err;
	uw_file_trailer((char *)s->sums, s->sums, s->st.pages);
	return uw_io_all(s->opts.sink_fd, (char *)s->sums, len,
			 s->spill_base + s->data_off +
			 (off_t)(s->st.pages * uw_page_size()),
			 s->sink_positional ? IO_PWRITE : IO_WRITE);
}

void *uw_snap_copier_main(void *arg)
{
	struct uffdwp_snapshot *s = arg;
	int err = 0;

	pthread_mutex_lock(&s->lock);
	while (!s->go && !s->cancel)
		pthread_cond_wait(&s->changed, &s->lock);
	pthread_mutex_unlock(&s->lock);
	err = write_prefix(s);
	for (size_t r = 0; r < s->rs.nr && !err; r++) {
		uintptr_t a = (uintptr_t)s->rs.r[r].addr;
		uintptr_t end = a + s->rs.r[r].len;

		while (a < end && !err) {
			uintptr_t next = (a & ~(uintptr_t)(CHUNK - 1)) + CHUNK;
			size_t first = (size_t)uw_page_index(&s->rs, a);

			if (next > end)
				next = end;
			if (!chunk_in_set(s, first, (next - a) / uw_page_size())) {
				a = next;
				continue;
			}
			if (uw_snap_before_chunk)
				uw_snap_before_chunk();
			if (cancelled(s))
				err = -ECANCELED;
			else
				err = copy_chunk(s, a, next - a);
			a = next;
		}
	}
	if (!err && s->prefix)
		err = write_trailer(s);
	if (!err && s->sink_positional &&
	    lseek(s->opts.sink_fd, s->spill_base + s->data_off +
		  (off_t)(s->st.pages * uw_page_size() +
			  (s->prefix ? uw_file_trailer_len(s->st.pages) : 0)),
		  SEEK_SET) < 0)
		err = -errno;
	if (err) {
		/* Let every writer go: nothing more will be saved. */
		pthread_mutex_lock(&s->lock);
		__atomic_store_n(&s->cancel, true, __ATOMIC_SEQ_CST);
		s->need_base = true;
		if (err == -ECANCELED && s->handler_error)
			err = s->handler_error;
		pthread_cond_broadcast(&s->changed);
		pthread_mutex_unlock(&s->lock);
		uw_snap_unprotect_all(s);
	}
	release_sink(s, err);
	/* A session's writes until its next instant: async where it can
	 * (session-async.c), before the caller learns the copy is done. */
	if (!err)
		uw_session_go_async(s, false);
	uw_snap_finish(s, err);
	return NULL;
}
