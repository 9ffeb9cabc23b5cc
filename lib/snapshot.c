// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapshot.c: point-in-time copy of memory regions while the process runs.
 *
 * Two threads share an atomic state word per page:
 *   PENDING  protected, nobody copied it yet;
 *   COPYING  the copier is reading it (still protected, so unchanged);
 *   CLAIMED  the fault handler is saving its old contents;
 *   SAVED+n  saved in side buffer slot n, the page may be unprotected;
 *   SPILLED  saved in the spill file (the side buffer was full);
 *   DONE     in the copier's chunk buffer; may be unprotected.
 *
 * A writer never waits for the copier.  The fault handler claims the
 * faulting page (PENDING -> CLAIMED), copies it to a free side buffer slot
 * or, when the cap is reached, to the spill file with pwrite(2), and
 * unprotects it, which wakes the writer.  A page the copier is reading is
 * left alone: the copier unprotects its chunk (waking the writer) right
 * after its memcpy, before the sink sees the data.  The copier walks the
 * regions in address order in 2 MiB-aligned chunks, copies PENDING pages
 * from memory, SAVED ones from their slot and SPILLED ones from the spill
 * file, then unprotects the chunk and hands it to the sink.
 *
 * The spill file is the sink itself when the sink is a regular file
 * written at known offsets (a page's bytes go where the stream puts them,
 * and the copier skips them), else a memfd (pages punched out as the
 * copier drains them).  The cap bounds the side buffer, never a writer's
 * wait.
 *
 * Huge pages stay huge: before the snapshot instant PAGEMAP_SCAN finds the
 * PMD-mapped 2 MiB blocks; a fault in one saves all of the block's pages
 * and unprotects the block as one, so the kernel keeps the PMD mapping
 * (unprotecting 4 KiB of it would split it).
 *
 * Sessions use the same machinery on a userfaultfd that outlives each
 * snapshot.  The copier leaves copied pages protected (it only wakes the
 * writers that faulted on its chunk); the handler marks every page it
 * unprotects in a dirty bitmap.  The next instant takes the handler's
 * instant lock (so no message is handled meanwhile), takes the dirty
 * bitmap as the new snapshot's page set, protects just those pages again
 * and lets the handler go: the pause and the copy follow what was written.
 * Session snapshots go to the sink in the snapshot file format
 * (snapfile.c): a page's place in the file is its rank among the stored
 * pages.
 *
 * Discarded pages (MADV_DONTNEED and the like): UFFD_EVENT_REMOVE marks
 * them dirty.  A page of the set not copied yet when it is discarded is
 * stored as zeroes (DISCARD_ZERO: what the program reads from memory it
 * gave back; the default for private anonymous memory), or fails the
 * snapshot with -EAGAIN (DISCARD_FAIL).  The kernel zaps as soon as the
 * event is read, so the copier, after reading a chunk, waits until no
 * thread is between reading messages and handling their discards, and
 * then trusts the ZEROED bits; in DISCARD_FAIL mode it also checks that
 * every page it read was still protected (check_protected()).
 *
 * Events and -EAGAIN: while an event (UFFD_EVENT_REMOVE) waits to be read,
 * UFFDIO_WRITEPROTECT fails with -EAGAIN, and the thread that raised it
 * (madvise()) waits for the read.  So no thread of ours retries blindly:
 * on -EAGAIN it reads the messages itself (uw_snap_wp()), handles the
 * discards at once and leaves the faults to the handler (DEFERRED, woken
 * by KICK_FD), which handles them only when it may (after the protect
 * phase, outside an instant).
 *
 * Memory of the regions is read with process_vm_readv(2) on ourselves, so
 * a region unmapped or made PROT_NONE under a snapshot fails it with
 * -EFAULT instead of killing the process.  After fork() the child's copy
 * of a handle is inert (uw_snap_foreign()): freeing it releases the
 * child's memory and descriptors and touches nothing of the parent's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "snapshot.h"

#define MSGS		32
#define SCAN_VEC	256
#define SAVE_RUN	512	/* pages read in one process_vm_readv(2) */
/* The fd sink issues write(2)s of at most this much: on some kernels the
 * cost of one write(2) into tmpfs grows faster than its length (a 2 MiB
 * write took ~1.4 s in the riscv64 TCG guest, 128 x 16 KiB ~35 ms).  It
 * also matches pipe and socket buffers. */
#define SINK_WRITE_MAX	(16UL << 10)
void (*uw_snap_before_chunk)(void);

void uw_snap_finish(struct uffdwp_snapshot *s, int err)
{
	pthread_mutex_lock(&s->lock);
	if (!s->done) {
		s->done = true;
		s->error = err;
		s->st.done = true;
		s->st.error = err;
		s->st.total_ns = uw_now_ns() - s->t_start;
	}
	pthread_cond_broadcast(&s->finished);
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
}

/* Sequentially consistent: with SAVING, it tells the copier when no save
 * can start any more (release_sink()). */
static bool cancelled(struct uffdwp_snapshot *s)
{
	return __atomic_load_n(&s->cancel, __ATOMIC_SEQ_CST);
}

/*
 * Unprotect every region and wake its writers.  A region that fails as a
 * whole (part of it unmapped and something else mapped there) is done
 * again chunk by chunk, so that no writer elsewhere in it stays blocked.
 */
int uw_snap_unprotect_all(struct uffdwp_snapshot *s)
{
	int ret = 0;

	if (!s->registered)
		return 0;
	for (size_t i = 0; i < s->rs.nr; i++) {
		uintptr_t a = (uintptr_t)s->rs.r[i].addr;
		uintptr_t end = a + s->rs.r[i].len;
		int err = uw_snap_wp(s, a, s->rs.r[i].len, false, true);

		if (err && !ret)
			ret = err;
		while (err && a < end) {
			uintptr_t next = (a & ~(uintptr_t)(CHUNK - 1)) + CHUNK;

			if (next > end)
				next = end;
			uw_snap_wp(s, a, next - a, false, true);
			a = next;
		}
	}
	return ret;
}

/* Stop saving: record ERR (the first one wins), let every writer go. */
void uw_snap_abort(struct uffdwp_snapshot *s, int err)
{
	pthread_mutex_lock(&s->lock);
	if (!s->handler_error)
		s->handler_error = err;
	__atomic_store_n(&s->cancel, true, __ATOMIC_SEQ_CST);
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
	uw_snap_unprotect_all(s);
}

static bool in_huge(struct uffdwp_snapshot *s, size_t idx)
{
	return s->huge && uw_bit_test(s->huge, idx);
}

/* Is page IDX in this snapshot? */
static bool in_set(struct uffdwp_snapshot *s, size_t idx)
{
	return !s->set || uw_bit_test(s->set, idx);
}

/* Where page IDX of the snapshot goes in a positional sink file: after
 * the prefix, at its rank among the stored pages. */
static off_t file_off(struct uffdwp_snapshot *s, size_t idx)
{
	size_t r = idx;

	if (s->set && !s->full_layout) {
		uint64_t below = (1ULL << (idx % 64)) - 1;

		r = s->rank[idx / 64] + (size_t)__builtin_popcountll(
			atomic_load_explicit(&s->set[idx / 64],
					     memory_order_relaxed) & below);
	}
	return s->spill_base + s->data_off + (off_t)(r * uw_page_size());
}

/* Where the handler spills page IDX: its place in a positional sink, else
 * its page index in the memfd. */
/* The position of page IDX among the file's stored pages. */
static size_t file_pos(struct uffdwp_snapshot *s, size_t idx)
{
	return (size_t)(file_off(s, idx) - s->spill_base - s->data_off) /
	       uw_page_size();
}

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

static off_t spill_off(struct uffdwp_snapshot *s, size_t idx)
{
	return s->sink_positional ? file_off(s, idx) :
	       (off_t)(idx * uw_page_size());
}


/*
 * All of [P, P + LEN) written to FD (IO_WRITE: at its offset; IO_PWRITE:
 * at OFF) or read from it at OFF, in pieces of at most SINK_WRITE_MAX,
 * retried on EINTR.  0 or -errno; -ENOSPC when FD takes no more bytes,
 * -EIO when a read finds the end of the file (a page never spilled).
 */
int uw_io_all(int fd, char *p, size_t len, off_t off, enum uw_io op)
{
	while (len) {
		size_t piece = len < SINK_WRITE_MAX ? len : SINK_WRITE_MAX;
		ssize_t n = op == IO_WRITE ? write(fd, p, piece) :
			    op == IO_PWRITE ? pwrite(fd, p, piece, off) :
			    pread(fd, p, piece, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return op == IO_PREAD ? -EIO : -ENOSPC;
		p += n;
		off += n;
		len -= (size_t)n;
	}
	return 0;
}

/* ---- fault handler ---- */

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

	if (idx >= 0 && in_huge(s, (size_t)idx)) {
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
	if (!err && !copier_has_it &&
	    uw_snap_wp(s, addr, n * psz, false, true) && !cancelled(s))
		/* Cannot happen on a live region; never leave a writer stuck. */
		uw_snap_abort(s, -EIO);
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
static bool next_deferred(struct uffdwp_snapshot *s, struct uffd_msg *m)
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
		else if (msg[i].event != UFFD_EVENT_PAGEFAULT)
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
	while (next_deferred(s, &m)) {
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

static void *handler_main(void *arg)
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

/* ---- copier ---- */

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
	int err = 0;

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
	if (s->session ? uw_wake(s->uffd, addr, len) :
	    uw_snap_wp(s, addr, len, false, true))
		return err ? err : -EIO;
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
		       s->kind, s->session_id, s->st.epoch, s->st.pages);
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
	uw_snap_finish(s, err);
	return NULL;
}

/* ---- setup and API ---- */

static int start_thread(pthread_t *t, const pthread_attr_t *attr,
			void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	int err;

	/* Our threads take no signals: a handler running on them could
	 * write a protected page and wait for itself. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = pthread_create(t, attr, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	/* EAGAIN is "no resources for a thread" (RLIMIT_NPROC, RLIMIT_AS,
	 * memory): -ENOMEM, not the -EAGAIN of pages discarded. */
	return err == EAGAIN ? -ENOMEM : -err;
}

int uw_snap_start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
	return start_thread(t, NULL, fn, arg);
}

/*
 * Running the protect phase (and a session's instant) aside.  Between
 * the first protect and the moment the handler may run (go, or the
 * instant lock released) no thread that the phase needs may write a
 * protected page: its fault would wait for the handler, which waits for
 * the phase.  The caller's thread cannot promise that: its own stack,
 * its thread-local storage, or memory its libc writes (the mapping after
 * .bss, malloc's arenas) may lie in a region.  So the phase runs on a
 * thread of the library's own, on a stack (and thread-local storage,
 * which glibc puts at its top) the library mapped, touching nothing but
 * the library's memory, while the caller waits in pthread_join(): a
 * fault of the caller's there is a writer's like any other, handled once
 * the phase is over.
 */
#define ASIDE_STACK	(256UL << 10)

struct aside {
	int (*fn)(void *arg);
	void *arg;
	int ret;
};

static void *aside_main(void *p)
{
	struct aside *a = p;

	a->ret = a->fn(a->arg);
	return NULL;
}

int uw_run_aside(int (*fn)(void *arg), void *arg)
{
	char *stack = uw_alloc(ASIDE_STACK);
	struct aside *a;
	pthread_attr_t at;
	pthread_t t;
	int err;

	if (!stack)
		return -ENOMEM;
	/* The hand-over in the library's memory too (the lowest bytes;
	 * the thread's stack grows down from the top). */
	a = (struct aside *)stack;
	a->fn = fn;
	a->arg = arg;
	a->ret = 0;
	err = pthread_attr_init(&at);
	if (!err)
		err = pthread_attr_setstack(&at, stack + 4096,
					    ASIDE_STACK - 4096);
	if (!err) {
		err = start_thread(&t, &at, aside_main, a);
		pthread_attr_destroy(&at);
	} else {
		err = -err;
	}
	if (!err) {
		pthread_join(t, NULL);
		err = a->ret;
	}
	uw_free(stack, ASIDE_STACK);
	return err;
}

static size_t page_round(size_t n)
{
	size_t psz = uw_page_size();

	return (n + psz - 1) / psz * psz;
}

static int alloc_buffers(struct uffdwp_snapshot *s, size_t cap)
{
	size_t psz = uw_page_size();

	s->nslots = cap / psz ? cap / psz : 1;
	if (s->nslots > UINT32_MAX - ST_SAVED)
		s->nslots = UINT32_MAX - ST_SAVED;
	s->state_len = page_round(s->rs.pages * sizeof(uint32_t));
	s->huge_len = page_round((s->rs.pages + 63) / 64 * 8);
	s->slots_len = page_round(s->nslots * sizeof(uint32_t));
	s->state = uw_alloc(s->state_len);
	s->huge = uw_alloc(s->huge_len);
	s->zeroed = uw_alloc(s->huge_len);
	s->free_slot = uw_alloc(s->slots_len);
	s->side = uw_alloc(s->nslots * psz);
	s->chunk = uw_alloc(CHUNK);
	if (!s->state || !s->huge || !s->zeroed || !s->free_slot || !s->side ||
	    !s->chunk)
		return -ENOMEM;
	for (size_t i = 0; i < s->nslots; i++)
		s->free_slot[i] = (uint32_t)(s->nslots - 1 - i);
	s->nfree = s->nfree_min = s->nslots;
	s->st.side_cap = s->nslots * psz;
	s->st.fixed_bytes = CHUNK + s->state_len + 2 * s->huge_len +
			    s->slots_len;
	s->st.pages = s->rs.pages;
	if (!s->session)
		return 0;
	s->words = (s->rs.pages + 63) / 64;
	s->bitmap_len = page_round(s->words * 8);
	s->data_off = (off_t)uw_file_data_off(s->rs.nr, s->rs.pages, psz);
	s->set = uw_alloc(s->bitmap_len);
	s->dirty = uw_alloc(s->bitmap_len);
	s->rank = uw_alloc(s->bitmap_len);
	s->prefix = uw_alloc((size_t)s->data_off);
	s->sums_len = page_round(uw_file_trailer_len(s->rs.pages));
	s->sums = uw_alloc(s->sums_len);
	s->page_buf = uw_alloc(psz);
	if (!s->set || !s->dirty || !s->rank || !s->prefix || !s->sums ||
	    !s->page_buf)
		return -ENOMEM;
	s->st.fixed_bytes += 3 * s->bitmap_len + (size_t)s->data_off +
			     s->sums_len + psz;
	return 0;
}

/*
 * Where spilled pages go.  A regular file sink without O_APPEND is written
 * at offsets from its current position, so a page can go straight to its
 * place in it; anything else spills to a memfd (kept by a session from one
 * snapshot to the next).
 */
int uw_snap_setup_spill(struct uffdwp_snapshot *s)
{
	int fd = s->opts.sink_fd, fl;
	struct stat sb;
	off_t pos;

	s->spill_bytes = 0;
	if (!s->opts.sink && !fstat(fd, &sb) && S_ISREG(sb.st_mode) &&
	    (fl = fcntl(fd, F_GETFL)) >= 0 && !(fl & O_APPEND) &&
	    (pos = lseek(fd, 0, SEEK_CUR)) >= 0) {
		s->sink_positional = true;
		s->spill_fd = fd;
		s->spill_base = pos;
		return 0;
	}
	s->sink_positional = false;
	s->spill_base = 0;
	if (s->memfd < 0)
		s->memfd = memfd_create("uffdwp-spill", MFD_CLOEXEC);
	else if (ftruncate(s->memfd, 0)) {
		/* Left-over pages are overwritten before they are read. */
	}
	if (s->memfd < 0)
		return -errno;
	s->spill_fd = s->memfd;
	return 0;
}

/* Mark the pages of the 2 MiB blocks inside [START, END). */
static void mark_huge(void *arg, uintptr_t start, uintptr_t end)
{
	struct uffdwp_snapshot *s = arg;
	size_t psz = uw_page_size();
	uintptr_t b = (start + UW_HPAGE_SIZE - 1) & ~(uintptr_t)(UW_HPAGE_SIZE - 1);

	for (; b + UW_HPAGE_SIZE <= end; b += UW_HPAGE_SIZE) {
		size_t i = (size_t)uw_page_index(&s->rs, b);

		for (size_t p = 0; p < UW_HPAGE_SIZE / psz; p++)
			uw_bit_set(s->huge, i + p);
		s->nhuge++;
	}
}

/* Mark the pages of every 2 MiB block that is PMD-mapped now (forgetting
 * earlier marks).  Best effort: without PAGEMAP_SCAN every fault saves a
 * single page. */
void uw_snap_find_huge(struct uffdwp_snapshot *s)
{
	struct page_region vec[SCAN_VEC];

	for (size_t w = 0; w < s->huge_len / 8; w++)
		atomic_store_explicit(&s->huge[w], 0, memory_order_relaxed);
	s->nhuge = 0;
	if (s->pagemap_fd >= 0)
		uw_scan_regions(s->pagemap_fd, &s->rs, 0, PAGE_IS_HUGE, vec,
				SCAN_VEC, mark_huge, s);
}

/* S's memory and descriptors (both the owner's destroy and a child's
 * forget end here). */
static void release_memory(struct uffdwp_snapshot *s)
{
	size_t psz = uw_page_size();

	if (s->ring)
		munmap(s->ring, s->ring_len);
	if (s->uffd >= 0)
		close(s->uffd);
	if (s->stop_fd >= 0)
		close(s->stop_fd);
	if (s->kick_fd >= 0)
		close(s->kick_fd);
	if (s->memfd >= 0)
		close(s->memfd);
	if (s->pagemap_fd >= 0)
		close(s->pagemap_fd);
	if (s->sink_owned && s->opts.sink_fd >= 0)
		close(s->opts.sink_fd);
	uw_free(s->state, s->state_len);
	uw_free(s->huge, s->huge_len);
	uw_free(s->zeroed, s->huge_len);
	uw_free(s->free_slot, s->slots_len);
	uw_free(s->side, s->nslots * psz);
	uw_free(s->chunk, CHUNK);
	uw_free(s->set, s->bitmap_len);
	uw_free(s->dirty, s->bitmap_len);
	uw_free(s->rank, s->bitmap_len);
	uw_free(s->prefix, (size_t)s->data_off);
	uw_free(s->sums, s->sums_len);
	uw_free(s->page_buf, uw_page_size());
	uw_free(s->deferred, s->deferred_cap * sizeof(*s->deferred));
	uw_regions_fini(&s->rs);
}

bool uw_snap_foreign(const struct uffdwp_snapshot *s)
{
	return s->owner != getpid();
}

/* In a child of fork(): the parent's threads are not here, its locks may
 * be held for ever, and the userfaultfd is the parent's (an ioctl on it
 * would act on the parent's memory).  Only our copies go. */
void uw_snap_forget(struct uffdwp_snapshot *s)
{
	release_memory(s);
	uw_free(s, s->self_len);
}

void uw_snap_destroy(struct uffdwp_snapshot *s)
{
	struct uffd_msg m;

	if (s->stop_fd >= 0) {
		uint64_t one = 1;

		if (write(s->stop_fd, &one, sizeof(one)) < 0) {
			/* eventfd writes of 1 cannot fail short of overflow */
		}
	}
	if (s->copier_started)
		pthread_join(s->copier, NULL);
	if (s->handler_started)
		pthread_join(s->handler, NULL);
	if (s->registered) {
		/* No handler any more: this thread reads what is pending. */
		uw_snap_unprotect_all(s);
		while (next_deferred(s, &m))
			uw_wake(s->uffd, m.arg.pagefault.address &
					 ~(uintptr_t)(uw_page_size() - 1),
				uw_page_size());
		uw_unregister(s->uffd, &s->rs);
	}
	release_memory(s);
	pthread_mutex_destroy(&s->read_lock);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->slot_lock);
	pthread_mutex_destroy(&s->instant_lock);
	pthread_cond_destroy(&s->changed);
	pthread_cond_destroy(&s->finished);
	uw_free(s, s->self_len);
}

int uw_snap_check_flags(unsigned int flags, const uint64_t *reserved,
		       size_t nreserved)
{
	for (size_t i = 0; i < nreserved; i++)
		if (reserved[i])
			return -EINVAL;
	if ((flags & ~SNAP_FLAGS) ||
	    (flags & UFFDWP_SNAP_KERNEL_FAULTS &&
	     flags & UFFDWP_SNAP_USER_MODE_ONLY) ||
	    (flags & UFFDWP_SNAP_DISCARD_ZERO &&
	     flags & UFFDWP_SNAP_DISCARD_FAIL))
		return -EINVAL;
	return 0;
}

/* Setting up failed with ERR: let any thread started go, and free. */
static int discard(struct uffdwp_snapshot *s, int err)
{
	pthread_mutex_lock(&s->lock);
	s->cancel = true;
	s->go = true;
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
	uw_snap_destroy(s);
	return err;
}

/*
 * A userfaultfd with FEATURES for S, or -errno.  Kernel-mode faults by
 * default: read(2) or recv(2) into a page the copier has not reached must
 * wait for it like a user write, not fail with EFAULT.  Only where the
 * process may not handle them fall back to user-mode-only, and say so in
 * the stats.
 */
static int open_uffd(struct uffdwp_snapshot *s, uint64_t features)
{
	int fd = -EPERM;

	s->st.user_mode_only = false;
	if (!(s->opts.flags & UFFDWP_SNAP_USER_MODE_ONLY))
		fd = uffdwp_open(UFFDWP_OPEN_KERNEL_FAULTS, features, NULL);
	if (fd == -EPERM && !(s->opts.flags & UFFDWP_SNAP_KERNEL_FAULTS)) {
		s->st.user_mode_only = true;
		fd = uffdwp_open(0, features, NULL);
	}
	return fd;
}

/*
 * Give S's new userfaultfd (WP_ASYNC | WP_RING) its ring, before any
 * registration, and put it in sync mode.  The ring holds an entry per
 * page up to 64Ki entries, fewer where vm.uffd_ring_max_entries or memory
 * says so; a pre-copy round that writes more falls back to a scan.
 */
static int attach_ring(struct uffdwp_snapshot *s)
{
	struct uffdio_set_mode sync = { .disable = UFFD_FEATURE_WP_ASYNC };
	uint64_t entries = 64;
	int err;

	while (entries < s->rs.pages && entries < (1u << 16))
		entries <<= 1;
	while ((err = uw_ring_map(s->uffd, entries, &s->ring,
				  &s->ring_len)) &&
	       (err == -EPERM || err == -ENOMEM) && entries > 64)
		entries >>= 1;
	if (err)
		return err;
	s->ring_consumer = 0;
	err = uw_ioctl(s->uffd, UFFDIO_SET_MODE, &sync);
	if (err) {
		munmap(s->ring, s->ring_len);
		s->ring = NULL;
	}
	return err;
}

/*
 * What a snapshot and a session share: the object, the userfaultfd (in
 * sync WP mode, with kernel-mode faults where the process may), the
 * buffers, the registration and the fault handler thread.
 */
int uw_snap_create(struct uffdwp_snapshot **out,
		  const struct uffdwp_region *regions, size_t nr,
		  const struct uffdwp_snapshot_opts *opts, bool session)
{
	size_t self_len = page_round(sizeof(struct uffdwp_snapshot));
	uint64_t features = UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			    UFFD_FEATURE_EVENT_REMOVE;
	struct uffdwp_features f;
	struct uffdwp_snapshot *s;
	pthread_condattr_t ca;
	pthread_mutexattr_t ma;
	bool anon_private;
	int err;

	/* Before anything is allocated: our own mappings could otherwise
	 * land in a region that is not mapped, and be protected. */
	err = uw_regions_mapped(regions, nr);
	if (err)
		return err;
	s = uw_alloc(self_len);
	if (!s)
		return -ENOMEM;
	memset(s, 0, sizeof(*s));
	s->self_len = self_len;
	s->owner = getpid();
	s->uffd = s->stop_fd = s->kick_fd = s->spill_fd = s->memfd = -1;
	s->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	s->opts = *opts;
	s->session = session;
	s->t_start = uw_now_ns();
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&s->read_lock, &ma);
	pthread_mutexattr_destroy(&ma);
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->slot_lock, NULL);
	pthread_mutex_init(&s->instant_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->changed, NULL);
	pthread_cond_init(&s->finished, &ca);
	pthread_condattr_destroy(&ca);
	if (session) {
		/* No snapshot runs yet: nothing to save, nothing to wait for. */
		s->cancel = s->done = s->need_base = true;
		if (getrandom(&s->session_id, sizeof(s->session_id), 0) !=
		    sizeof(s->session_id))
			s->session_id = uw_now_ns() ^ ((uint64_t)getpid() << 32);
	}

	err = uw_regions_init(&s->rs, regions, nr);
	if (!err)
		err = uw_regions_check_maps(&s->rs, &anon_private);
	if (err)
		goto fail;
	/* Discarded pages read as zeroes where the kernel says so: private
	 * anonymous memory. */
	s->discard_zero = opts->flags & UFFDWP_SNAP_DISCARD_ZERO ||
			  (!(opts->flags & UFFDWP_SNAP_DISCARD_FAIL) &&
			   anon_private);
	err = uw_probe(&f);
	if (!f.wp) {
		/* Out of descriptors or memory is not "unsupported". */
		err = err ? err : -EOPNOTSUPP;
		goto fail;
	}
	s->st.used_unpopulated = f.wp_unpopulated &&
				 !(opts->flags & UFFDWP_SNAP_NO_UNPOPULATED);
	if (s->st.used_unpopulated)
		features |= UFFD_FEATURE_WP_UNPOPULATED;
	/* A session that can pre-copy: async WP and the ring, switched to
	 * sync until a pre-copy asks for async (falls back without). */
	if (session && f.set_mode && f.wp_ring && s->st.used_unpopulated) {
		s->uffd = open_uffd(s, features | UFFD_FEATURE_WP_ASYNC |
				       UFFD_FEATURE_WP_RING);
		if (s->uffd >= 0 && attach_ring(s)) {
			close(s->uffd);
			s->uffd = -1;
		}
	}
	if (s->uffd < 0) {
		err = open_uffd(s, features);
		if (err < 0)
			goto fail;
		s->uffd = err;
	}
	err = alloc_buffers(s, opts->side_cap ? opts->side_cap : DEFAULT_CAP);
	if (err)
		goto fail;
	/* On failure uw_register_wp() undoes what it did. */
	err = uw_register_wp(s->uffd, &s->rs);
	if (err)
		goto fail;
	s->registered = true;
	s->stop_fd = eventfd(0, EFD_CLOEXEC);
	s->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->stop_fd < 0 || s->kick_fd < 0) {
		err = -errno;
		goto fail;
	}
	err = uw_snap_start_thread(&s->handler, handler_main, s);
	if (err)
		goto fail;
	s->handler_started = true;
	*out = s;
	return 0;

fail:
	return discard(s, err);
}

/*
 * The protect phase of a one-off snapshot (run aside): protect every
 * region, then let the handler go.  Faults raised meanwhile wait until it
 * ends.  Touches only the library's memory.
 */
static int protect_phase(void *arg)
{
	struct uffdwp_snapshot *s = arg;
	uint64_t t0 = uw_now_ns();
	int err = 0;

	for (size_t i = 0; i < s->rs.nr && !err; i++)
		err = uw_snap_wp(s, (uintptr_t)s->rs.r[i].addr,
				 s->rs.r[i].len, true, false);
	pthread_mutex_lock(&s->lock);
	s->st.pause_ns = uw_now_ns() - t0;
	if (err)
		s->cancel = true;
	s->go = true;
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
	return err;
}

int uffdwp_snapshot_start(struct uffdwp_snapshot **out,
			  const struct uffdwp_region *regions, size_t nr,
			  const struct uffdwp_snapshot_opts *opts)
{
	struct uffdwp_snapshot_opts o, copy;
	struct uffdwp_snapshot *s;
	int err;

	/* The caller's pointers reached without a fault: a bad one is
	 * -EINVAL, not a crash. */
	if (!out || !opts || uw_store_ptr(out, NULL) ||
	    uw_copy_in(&copy, opts, sizeof(copy)) ||
	    uw_snap_check_flags(copy.flags, copy.__reserved,
			sizeof(copy.__reserved) / 8) ||
	    (copy.sink_fd >= 0) == (copy.sink != NULL) ||
	    /* a zero-filled struct must not stream memory to stdin */
	    copy.sink_fd == 0)
		return -EINVAL;
	/* Our own duplicate of the sink: closing the caller's descriptor
	 * (and opening another under its number) cannot redirect us. */
	o = copy;
	if (o.sink_fd >= 0) {
		o.sink_fd = uw_snap_dup_sink(copy.sink_fd);
		if (o.sink_fd < 0)
			return o.sink_fd;
	}
	err = uw_snap_create(&s, regions, nr, &o, false);
	if (err) {
		if (o.sink_fd >= 0)
			close(o.sink_fd);
		return err;
	}
	s->sink_owned = o.sink_fd >= 0;
	err = uw_snap_setup_spill(s);
	if (!err && !s->st.used_unpopulated)
		err = uw_populate_read(&s->rs);
	if (err)
		goto fail;
	uw_snap_find_huge(s);
	s->st.huge_blocks = s->nhuge;
	err = uw_snap_start_thread(&s->copier, uw_snap_copier_main, s);
	if (err)
		goto fail;
	s->copier_started = true;

	/* The snapshot instant, on a thread of ours (uw_run_aside()). */
	err = uw_run_aside(protect_phase, s);
	if (err)
		goto fail;
	s->st.start_ns = uw_now_ns() - s->t_start;
	*out = s;
	return 0;

fail:
	return discard(s, err);
}

int uffdwp_snapshot_wait(struct uffdwp_snapshot *s, int timeout_ms)
{
	struct timespec ts;
	int err = 0;

	if (!s)
		return -EINVAL;
	if (uw_snap_foreign(s))
		return -ECHILD;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	if (timeout_ms >= 0) {
		ts.tv_sec += timeout_ms / 1000;
		ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
	}
	pthread_mutex_lock(&s->lock);
	while (!s->done && !err) {
		if (timeout_ms < 0)
			pthread_cond_wait(&s->finished, &s->lock);
		else if (pthread_cond_timedwait(&s->finished, &s->lock, &ts) ==
			 ETIMEDOUT)
			err = -ETIMEDOUT;
	}
	if (s->done)
		err = s->error;
	pthread_mutex_unlock(&s->lock);
	return err;
}

int uffdwp_snapshot_cancel(struct uffdwp_snapshot *s)
{
	if (!s)
		return -EINVAL;
	if (uw_snap_foreign(s))
		return -ECHILD;
	pthread_mutex_lock(&s->lock);
	if (s->done) {
		pthread_mutex_unlock(&s->lock);
		return -EALREADY;
	}
	__atomic_store_n(&s->cancel, true, __ATOMIC_SEQ_CST);
	s->need_base = true;
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
	/* Writers go at once; the copier stops before its next chunk. */
	uw_snap_unprotect_all(s);
	uffdwp_snapshot_wait(s, -1);
	return 0;
}

int uffdwp_snapshot_stats(struct uffdwp_snapshot *s,
			  struct uffdwp_snapshot_stats *st)
{
	if (!s || !st)
		return -EINVAL;
	if (uw_snap_foreign(s))
		return -ECHILD;
	pthread_mutex_lock(&s->lock);
	*st = s->st;
	pthread_mutex_unlock(&s->lock);
	st->fault_max_ns = __atomic_load_n(&s->st.fault_max_ns, __ATOMIC_RELAXED);
	pthread_mutex_lock(&s->slot_lock);
	st->side_peak = (s->nslots - s->nfree_min) * uw_page_size();
	pthread_mutex_unlock(&s->slot_lock);
	return 0;
}

void uffdwp_snapshot_free(struct uffdwp_snapshot *s)
{
	if (!s)
		return;
	if (uw_snap_foreign(s)) {
		uw_snap_forget(s);
		return;
	}
	uffdwp_snapshot_cancel(s);
	uw_snap_destroy(s);
}
