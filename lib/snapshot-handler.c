// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapshot-handler.c: the snapshot engine's fault handler.  It reads the
 * userfaultfd's messages, claims a faulting page (PENDING -> CLAIMED),
 * saves its old contents to a side buffer slot or the spill file, and
 * unprotects it, which wakes the writer; a fault in a PMD-mapped block
 * saves the whole block.  It also handles discards (UFFD_EVENT_REMOVE) and
 * the -EAGAIN of a pending event.  Why this keeps the copy consistent: the
 * top of snapshot.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "snapshot-parts.h"

static bool take_slot(struct uffdwp_snapshot *s, uint32_t *slot)
{
	bool ok = false;

	pthread_mutex_lock(&s->slot_lock);
	if (s->nfree) {
		*slot = s->free_slot[--s->nfree];
		if (s->nfree < s->nfree_min)
			s->nfree_min = s->nfree;
		ok = true;
	}
	pthread_mutex_unlock(&s->slot_lock);
	return ok;
}

/* Save the old contents of the N claimed pages from page index IDX (at
 * ADDR): to side buffer slots while there are free ones, the rest to the
 * spill file in runs, counting them in *SAVED and *SPILLED.  Returns 0, or
 * the spill file's -errno after failing the snapshot (uw_snap_abort()). */
static int save_claimed(struct uffdwp_snapshot *s, size_t idx, uintptr_t addr,
			size_t n, size_t *saved, size_t *spilled)
{
	size_t psz = uw_page_size();
	int err = 0;

	for (size_t i = 0; i < n && !err;) {
		struct iovec iov[SAVE_RUN];
		uint32_t slot[SAVE_RUN];
		size_t k = 0;

		if (atomic_load_explicit(&s->state[idx + i],
					 memory_order_relaxed) != ST_CLAIMED) {
			i++;
			continue;
		}
		/* A run of claimed pages into free slots, read in one call
		 * that fails rather than faults on memory gone. */
		while (k < SAVE_RUN && i + k < n &&
		       atomic_load_explicit(&s->state[idx + i + k],
					    memory_order_relaxed) ==
				ST_CLAIMED && take_slot(s, &slot[k])) {
			iov[k].iov_base = s->side + (size_t)slot[k] * psz;
			iov[k].iov_len = psz;
			k++;
		}
		if (k) {
			err = uw_read_self_v(iov, k, addr + i * psz, k * psz);
			if (err) {
				pthread_mutex_lock(&s->slot_lock);
				for (size_t m = 0; m < k; m++)
					s->free_slot[s->nfree++] = slot[m];
				pthread_mutex_unlock(&s->slot_lock);
				uw_snap_abort(s, err);
				break;
			}
			for (size_t m = 0; m < k; m++)
				atomic_store_explicit(&s->state[idx + i + m],
						      ST_SAVED + slot[m],
						      memory_order_release);
			*saved += k;
			i += k;
			continue;
		}
		/* The side buffer is full: spill this run of claimed pages. */
		size_t j = i;

		while (j < n && atomic_load_explicit(&s->state[idx + j],
						     memory_order_relaxed) ==
				ST_CLAIMED)
			j++;
		/* Claimed pages are in the set: consecutive in the file. */
		err = uw_io_all(s->spill_fd, (char *)(addr + i * psz),
			     (j - i) * psz, spill_off(s, idx + i), IO_PWRITE);
		/* Fail the snapshot before the copier can see these pages
		 * settle without their contents. */
		if (err)
			uw_snap_abort(s, err);
		for (size_t k = i; k < j; k++)
			atomic_store_explicit(&s->state[idx + k],
					      err ? ST_DONE : ST_SPILLED,
					      memory_order_release);
		if (!err)
			*spilled += j - i;
		i = j;
	}
	/* After a failure, settle the pages not reached either: a copier
	 * inside their chunk waits for every CLAIMED page. */
	for (size_t k = 0; err && k < n; k++)
		if (atomic_load_explicit(&s->state[idx + k],
					 memory_order_relaxed) == ST_CLAIMED)
			atomic_store_explicit(&s->state[idx + k], ST_DONE,
					      memory_order_release);
	return err;
}

/*
 * A write fault at ADDR: the page, or its whole 2 MiB block when that was
 * PMD-mapped, is saved (if not copied yet) and unprotected.  Pages the
 * copier is reading are left to it: its unprotect wakes the writer (in a
 * session its wake-up, and the writer faults again on a copied page).
 */
static void handle_fault(struct uffdwp_snapshot *s, uintptr_t addr)
{
	size_t psz = uw_page_size(), n = 1, claimed = 0, saved = 0, spilled = 0;
	long idx = uw_page_index(&s->rs, addr);
	bool copier_has_it = false, huge = false, counted;
	uint64_t t0 = uw_now_ns();
	int err = 0;

	/* Not in a region (any more: uffdwp_session_remove_region() took it
	 * away after the fault was read): nothing to save or unprotect, only
	 * a writer to let go. */
	if (idx < 0) {
		uw_wake(s->uffd, addr, psz);
		return;
	}
	if (in_huge(s, (size_t)idx)) {
		uintptr_t block = addr & ~(uintptr_t)(UW_HPAGE_SIZE - 1);

		idx -= (long)((addr - block) / psz);
		addr = block;
		n = UW_HPAGE_SIZE / psz;
		huge = true;
	}
	/* Announced before the cancel is looked at: the copier closes the
	 * sink (maybe our spill file) only when no save is under way. */
	atomic_fetch_add(&s->saving, 1);
	counted = idx >= 0 && !cancelled(s);
	for (size_t i = 0; counted && i < n; i++) {
		uint32_t old = ST_PENDING;

		if (atomic_compare_exchange_strong_explicit(
			    &s->state[idx + i], &old, ST_CLAIMED,
			    memory_order_acquire, memory_order_relaxed))
			claimed++;
		else if (old == ST_COPYING)
			copier_has_it = true;
	}
	if (claimed)
		err = save_claimed(s, (size_t)idx, addr, n, &saved, &spilled);
	atomic_fetch_sub(&s->saving, 1);
	/* A session's next snapshot stores whatever gets unprotected. */
	for (size_t i = 0; s->session && idx >= 0 && i < n; i++)
		uw_bit_set(s->dirty, (size_t)idx + i);
	/* Counted before the writer is woken: it may read the stats next. */
	pthread_mutex_lock(&s->lock);
	s->st.faults += counted;
	s->st.huge_saves += huge && claimed;
	s->st.saved += saved;
	s->st.spilled += spilled;
	if (!s->sink_positional) {
		s->spill_bytes += spilled * psz;
		if (s->spill_bytes > s->st.spill_peak)
			s->st.spill_peak = s->spill_bytes;
	}
	pthread_mutex_unlock(&s->lock);
	/*
	 * Unprotect (mode 0) also wakes the writer.  Not when the copier is
	 * reading the page (its unprotect follows) or a failed save already
	 * unprotected everything.
	 */
	if (!err && !copier_has_it) {
		int e = uw_snap_wp(s, addr, n * psz, false, true);

		/* Only on a region unmapped meanwhile; never leave a writer
		 * stuck. */
		if (e && !cancelled(s))
			uw_snap_abort(s, uw_snap_gone_err(e));
	}
	t0 = uw_now_ns() - t0;
	/* Only this thread raises it: a relaxed store is enough. */
	if (t0 > __atomic_load_n(&s->st.fault_max_ns, __ATOMIC_RELAXED))
		__atomic_store_n(&s->st.fault_max_ns, t0, __ATOMIC_RELAXED);
}

/*
 * [START, END) is being discarded (UFFD_EVENT_REMOVE: the kernel zaps it
 * right after this message was read, so its contents cannot be saved any
 * more).  In a session those pages count as written; a running snapshot
 * that had not copied one of them fails with -EAGAIN.
 */
static void handle_remove(struct uffdwp_snapshot *s, uintptr_t start,
			  uintptr_t end)
{
	size_t psz = uw_page_size();
	bool lost = false;

	start &= ~(uintptr_t)(psz - 1);

	for (size_t r = 0; r < s->rs.nr; r++) {
		uintptr_t a = (uintptr_t)s->rs.r[r].addr;
		uintptr_t e = a + s->rs.r[r].len;

		if (a < start)
			a = start;
		if (e > end)
			e = end;
		for (size_t i = a < e ? (size_t)uw_page_index(&s->rs, a) : 0;
		     a < e; a += psz, i++) {
			uint32_t st = atomic_load_explicit(&s->state[i],
							   memory_order_acquire);

			if (s->session)
				uw_bit_set(s->dirty, i);
			if (!in_set(s, i))
				continue;
			/* A save made while the zap ran may be torn (another
			 * thread may have read the event meanwhile): the
			 * copier stores every page of ZEROED it has not
			 * reached yet as zeroes, or fails. */
			if (st == ST_DONE)
				continue;
			uw_bit_set(s->zeroed, i);
			lost |= st == ST_PENDING || st == ST_COPYING ||
				st == ST_CLAIMED;
		}
	}
	if (lost && !s->discard_zero && !cancelled(s))
		uw_snap_abort(s, -EAGAIN);
}

/*
 * [START, END) was unmapped, mapped over or moved (UFFD_EVENT_UNMAP,
 * UFFD_EVENT_REMAP: sessions only): its pages in the regions count as
 * written, and the next instant registers the regions again (session.c).
 * A snapshot running meanwhile fails as before when its copier reads
 * memory gone (-EFAULT).
 */
static void handle_replaced(struct uffdwp_snapshot *s, uintptr_t start,
			    uintptr_t end)
{
	bool hit = false;

	for (size_t r = 0; r < s->rs.nr; r++) {
		uintptr_t a = (uintptr_t)s->rs.r[r].addr;

		hit |= start < a + s->rs.r[r].len && a < end;
	}
	if (!s->session || !hit)
		return;
	uw_mark_pages(&s->rs, s->dirty, start, end - start);
	atomic_store(&s->replaced, true);
	atomic_fetch_add(&s->nreplaced, 1);
}

/* Keep fault message M for the handler (under read_lock); false when
 * there is no room and no memory for more. */
static bool defer_fault(struct uffdwp_snapshot *s, const struct uffd_msg *m)
{
	if (s->ndeferred == s->deferred_cap) {
		size_t cap = s->deferred_cap ? 2 * s->deferred_cap :
			     uw_page_size() / sizeof(*m);
		struct uffd_msg *q = uw_alloc(cap * sizeof(*m));

		if (!q)
			return false;
		if (s->deferred)
			memcpy(q, s->deferred, s->ndeferred * sizeof(*m));
		uw_free(s->deferred, s->deferred_cap * sizeof(*m));
		s->deferred = q;
		s->deferred_cap = cap;
	}
	s->deferred[s->ndeferred++] = *m;
	return true;
}

/* A deferred fault, if any (FIFO order does not matter: each is a thread
 * of its own). */
bool uw_snap_next_deferred(struct uffdwp_snapshot *s, struct uffd_msg *m)
{
	bool ok = false;

	pthread_mutex_lock(&s->read_lock);
	if (s->ndeferred) {
		*m = s->deferred[--s->ndeferred];
		ok = true;
	}
	pthread_mutex_unlock(&s->read_lock);
	return ok;
}

static void kick_handler(struct uffdwp_snapshot *s)
{
	uint64_t one = 1;

	if (s->kick_fd >= 0 && write(s->kick_fd, &one, sizeof(one)) < 0) {
		/* an eventfd at its maximum is readable anyway */
	}
}

/*
 * Read one batch of messages: handle its discards at once and keep its
 * faults for the handler.  Any thread may (READ_LOCK serialises them; it
 * is recursive: a discard that aborts the snapshot unprotects, which may
 * read again).  Returns the number read, 0 when none was queued, or
 * -errno.
 */
static ssize_t read_batch(struct uffdwp_snapshot *s)
{
	struct uffd_msg msg[MSGS];
	bool kick = false;
	ssize_t n;

	pthread_mutex_lock(&s->read_lock);
	atomic_fetch_add(&s->readers, 1);
	n = read(s->uffd, msg, sizeof(msg));
	if (n < 0)
		n = errno == EAGAIN || errno == EINTR ? 0 : -errno;
	else
		n /= (ssize_t)sizeof(msg[0]);
	for (ssize_t i = 0; i < n; i++) {
		if (msg[i].event == UFFD_EVENT_REMOVE)
			handle_remove(s, msg[i].arg.remove.start,
				      msg[i].arg.remove.end);
		else if (msg[i].event == UFFD_EVENT_UNMAP)
			handle_replaced(s, msg[i].arg.remove.start,
					msg[i].arg.remove.end);
		else if (msg[i].event == UFFD_EVENT_REMAP) {
			handle_replaced(s, msg[i].arg.remap.from,
					msg[i].arg.remap.from +
					msg[i].arg.remap.len);
			handle_replaced(s, msg[i].arg.remap.to,
					msg[i].arg.remap.to +
					msg[i].arg.remap.len);
		} else if (msg[i].event != UFFD_EVENT_PAGEFAULT)
			continue;
		else if (defer_fault(s, &msg[i]))
			kick = true;
		else {
			/* Out of memory: give up the snapshot, not the
			 * writer. */
			uw_snap_abort(s, -ENOMEM);
			uw_wake(s->uffd, msg[i].arg.pagefault.address &
					 ~(uintptr_t)(uw_page_size() - 1),
				uw_page_size());
		}
	}
	atomic_fetch_sub(&s->readers, 1);
	pthread_mutex_unlock(&s->read_lock);
	if (kick && !pthread_equal(pthread_self(), s->handler))
		kick_handler(s);
	return n;
}

/* Every message queued now read (an ioctl said -EAGAIN: an event waits).
 * Returns how many were read. */
static size_t drain(struct uffdwp_snapshot *s)
{
	size_t total = 0;
	ssize_t n;

	while ((n = read_batch(s)) > 0)
		total += (size_t)n;
	return total;
}

int uw_snap_ioctl(struct uffdwp_snapshot *s, unsigned long req, void *arg)
{
	for (;;) {
		int err = uw_ioctl(s->uffd, req, arg);

		if (err != -EAGAIN)
			return err;
		/* The event's message may not be queued yet (the kernel
		 * raises mmap_changing first): let its thread run. */
		if (!drain(s)) {
			struct timespec ts = { 0, 20000 };

			nanosleep(&ts, NULL);
		}
	}
}

int uw_snap_gone_err(int err)
{
	/* -ENOENT: no registered mapping left in the range (munmap()). */
	return err == -ENOENT || err == -EFAULT ? -EFAULT : -EIO;
}

int uw_snap_wp(struct uffdwp_snapshot *s, uintptr_t addr, size_t len,
	       bool wp, bool wake)
{
	struct uffdio_writeprotect w = {
		.range = { .start = addr, .len = len },
		/* The kernel refuses WP together with DONTWAKE. */
		.mode = wp ? UFFDIO_WRITEPROTECT_MODE_WP :
			wake ? 0 : UFFDIO_WRITEPROTECT_MODE_DONTWAKE,
	};

	return uw_snap_ioctl(s, UFFDIO_WRITEPROTECT, &w);
}

/*
 * Read and handle one batch of messages.  A session's instant (session.c)
 * takes the instant lock, and the handler holds it to read a batch and
 * handle its discards, then for each fault: so no fault is handled during
 * an instant (its writer stays blocked until the instant is over), and no
 * discard read before an instant is handled after it (the kernel zaps the
 * range as soon as the event is read).  A fault read before an instant
 * (by the handler, or by a thread whose protect said -EAGAIN) and handled
 * after it is handled right: its write has not happened.
 * False when the handler should stop.
 */
static bool handle_batch(struct uffdwp_snapshot *s)
{
	struct uffd_msg m;
	ssize_t n;

	if (s->session)
		pthread_mutex_lock(&s->instant_lock);
	n = read_batch(s);
	if (s->session)
		pthread_mutex_unlock(&s->instant_lock);
	while (uw_snap_next_deferred(s, &m)) {
		if (s->session)
			pthread_mutex_lock(&s->instant_lock);
		/* In async mode (pre-copy) the kernel resolved this write and
		 * logged it; unprotecting now could undo a later protect. */
		if (!s->async_mode)
			handle_fault(s, (uintptr_t)m.arg.pagefault.address &
					~(uintptr_t)(uw_page_size() - 1));
		if (s->session)
			pthread_mutex_unlock(&s->instant_lock);
	}
	return n >= 0;
}

void *uw_snap_handler_main(void *arg)
{
	struct uffdwp_snapshot *s = arg;
	struct pollfd pfd[3] = {
		{ .fd = s->uffd, .events = POLLIN },
		{ .fd = s->stop_fd, .events = POLLIN },
		{ .fd = s->kick_fd, .events = POLLIN },
	};
	uint64_t kicks;

	/* A one-off snapshot's handler starts at the end of the protect
	 * phase; a session's instants take its instant lock instead. */
	pthread_mutex_lock(&s->lock);
	while (!s->session && !s->go && !s->cancel)
		pthread_cond_wait(&s->changed, &s->lock);
	pthread_mutex_unlock(&s->lock);
	for (;;) {
		if (poll(pfd, 3, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pfd[1].revents)
			break;
		if (pfd[2].revents &&
		    read(s->kick_fd, &kicks, sizeof(kicks)) < 0) {
			/* EAGAIN: another read took the count */
		}
		if (!handle_batch(s))
			break;
	}
	return NULL;
}
