// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * session.c: a series of snapshots of the same regions, a base and then
 * deltas.  The engine is snapshot.c's (its head comment says what a
 * session changes in the handler and the copier).
 *
 * An instant: join the previous copier, map the huge blocks again, then,
 * holding the handler's instant lock (so no fault or discard is handled
 * meanwhile), turn the dirty bitmap into the snapshot's page
 * set (every page for a base), make those pages PENDING and protect them
 * again, and let the handler go.  Every other page has stayed protected
 * since the previous instant and is unchanged since: the earlier files
 * hold it.  The pause costs a pass over the bitmap (one bit per page) and
 * a protect per run of written pages; nothing in it walks the page tables
 * of pages that were not written.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "snapshot.h"

static struct uffdwp_snapshot *of(struct uffdwp_session *ss)
{
	return (struct uffdwp_snapshot *)ss;
}

int uffdwp_session_new(struct uffdwp_session **out,
		       const struct uffdwp_region *regions, size_t nr,
		       const struct uffdwp_session_opts *opts)
{
	struct uffdwp_snapshot_opts o = { .sink_fd = -1 };
	struct uffdwp_session_opts copy = { 0 };
	struct uffdwp_snapshot *s;
	int err;

	/* The caller's pointers reached without a fault (-EINVAL). */
	if (!out || uw_store_ptr(out, NULL) ||
	    (opts && uw_copy_in(&copy, opts, sizeof(copy))) ||
	    uw_snap_check_flags(copy.flags, copy.__reserved,
				sizeof(copy.__reserved) / 8))
		return -EINVAL;
	o.side_cap = copy.side_cap;
	o.flags = copy.flags;
	err = uw_snap_create(&s, regions, nr, &o, true);
	if (!err)
		*out = (struct uffdwp_session *)s;
	return err;
}

/* Keep the handler from reading messages (faults and discards queue in
 * the kernel) until uw_session_release(). */
void uw_session_hold(struct uffdwp_snapshot *s)
{
	pthread_mutex_lock(&s->instant_lock);
}

void uw_session_release(struct uffdwp_snapshot *s)
{
	pthread_mutex_unlock(&s->instant_lock);
}

#define PM_UFFD_WP	(1ULL << 57)
#define PM_BATCH	4096

/*
 * Memory replaced under the session since the last instant
 * (mmap(MAP_FIXED) over a region, munmap() and mmap() again, mremap()
 * away and back: what an allocator's decommit does).  The new memory is
 * not registered with our userfaultfd and not write-protected, so its
 * writes raise no fault and set no dirty bit: a delta would silently
 * miss them.  Every page that is neither dirty nor write-protected
 * (pagemap bit 57, PM_UFFD_WP, shown for present and swapped pages and
 * for the markers of unpopulated ones) is such a page, or one whose
 * protection the kernel dropped some other way (a lazily freed page
 * reclaimed, a page merged by KSM on a kernel without patch 1): its
 * content is taken as changed, it joins the set, and the regions are
 * registered again (a no-op where they still are) so that it can be
 * protected.  Under the instant lock, so the handler marks nothing
 * meanwhile.  Costs a pagemap read of every page of the regions (8
 * bytes a page) in the pause.  0, or -EFAULT when part of a region is not
 * mapped any more, -EINVAL when its memory is of another kind or
 * protection now.
 */
int uw_session_check_replaced(struct uffdwp_snapshot *s)
{
	size_t psz = uw_page_size(), found = 0;
	uint64_t *e;
	int err = 0;

	if (s->pagemap_fd < 0)
		return 0;	/* no /proc: the check is skipped */
	e = uw_alloc(PM_BATCH * 8);
	if (!e)
		return -ENOMEM;
	for (size_t i = 0; i < s->rs.nr && !err; i++) {
		size_t pages = s->rs.r[i].len / psz;
		uintptr_t base = (uintptr_t)s->rs.r[i].addr;

		for (size_t done = 0; done < pages && !err;) {
			size_t n = pages - done < PM_BATCH ? pages - done :
							     PM_BATCH;
			ssize_t got = pread(s->pagemap_fd, e, n * 8,
					    (off_t)((base / psz + done) * 8));

			if (got < 0 && errno == EINTR)
				continue;
			if (got < 8) {
				err = got < 0 ? -errno : -EIO;
				break;
			}
			n = (size_t)got / 8;
			for (size_t k = 0; k < n; k++) {
				size_t idx = s->rs.first[i] + done + k;

				if (e[k] & PM_UFFD_WP ||
				    uw_bit_test(s->dirty, idx))
					continue;
				uw_bit_set(s->dirty, idx);
				found++;
			}
			done += n;
		}
	}
	uw_free(e, PM_BATCH * 8);
	if (err || !found)
		return err;
	return uw_session_reregister(s);
}

/* After memory was replaced: -EFAULT/-EINVAL when a region is unmapped
 * or of another kind now, else the regions registered again (a no-op
 * where they still are) so that the new memory can be protected. */
int uw_session_reregister(struct uffdwp_snapshot *s)
{
	bool anon;
	int err;

	/* Unmapped (pagemap reads a hole as empty) or of another kind now. */
	err = uw_regions_check_maps(&s->rs, &anon);
	for (size_t i = 0; i < s->rs.nr && !err; i++) {
		struct uffdio_register r = {
			.range = { .start = (uintptr_t)s->rs.r[i].addr,
				   .len = s->rs.r[i].len },
			.mode = UFFDIO_REGISTER_MODE_WP,
		};

		err = uw_snap_ioctl(s, UFFDIO_REGISTER, &r);
	}
	return err;
}

/*
 * Where the kernel has UFFD_EVENT_UNMAP and UFFD_EVENT_REMAP, a session
 * asks for them and learns of replaced memory from them instead of the
 * pagemap pass above: the pause then costs nothing for it.  They are
 * exact: munmap(), mmap() over a region and mremap() raise the context's
 * mmap_changing before they change anything and keep it raised until
 * their event has been read (the caller waits), and while it is raised
 * UFFDIO_WRITEPROTECT says -EAGAIN, on which uw_snap_wp() reads every
 * queued message (handle_replaced() marks the pages dirty).  So the
 * instant, under the instant lock, first protects one page that is
 * protected anyway (the first of the first region, or its 2 MiB block
 * when that is PMD-mapped: a written page is in the set and protected in
 * this pause too): once that succeeds, every
 * replacement begun before it is in the dirty bitmap.  One begun later
 * makes one of the pause's protect calls, or the same probe at its end,
 * read its event: then the set is taken again (sync_events() says so).
 * Pages that lose their protection without an event (KSM merging them,
 * on a kernel without this series' patch 1) still need the pagemap pass:
 * it runs, in the pause as before, while KSM runs.
 */
static int probe_events(struct uffdwp_snapshot *s)
{
	/* All of a PMD-mapped block: protecting part of it would split it. */
	size_t len = s->huge && uw_bit_test(s->huge, 0) ? UW_HPAGE_SIZE :
		     uw_page_size();

	return uw_snap_wp(s, (uintptr_t)s->rs.r[0].addr, len, true, false);
}

/* Before the set is taken: the replacements so far in the bitmap. */
static int sync_events(struct uffdwp_snapshot *s, unsigned long *seen)
{
	int err;

	if (!s->replace_events)
		return uw_session_check_replaced(s);
	err = probe_events(s);
	/* Part of the first region unmapped: the reregister says -EFAULT. */
	if (err == -ENOENT)
		atomic_store(&s->replaced, true);
	else if (err)
		return err;
	*seen = atomic_load(&s->nreplaced);
	if (s->ksm_check)
		err = uw_session_check_replaced(s);
	if (!err && atomic_exchange(&s->replaced, false))
		err = uw_session_reregister(s);
	*seen = atomic_load(&s->nreplaced);
	return err;
}

/*
 * FN on each run of pages of the set (runs end at region ends).  Runs less
 * than GAP pages apart are joined, the pages between them included: for
 * protecting the set, whose other pages are protected already, one call
 * over a short gap costs less than a call per run (a delta of scattered
 * writes would otherwise pause for a call per written page).
 */
static int for_each_run(struct uffdwp_snapshot *s, size_t gap,
			int (*fn)(struct uffdwp_snapshot *s, uintptr_t addr,
				  size_t len))
{
	size_t psz = uw_page_size();

	for (size_t r = 0; r < s->rs.nr; r++) {
		size_t first = s->rs.first[r], n = s->rs.r[r].len / psz;

		for (size_t i = 0; i < n;) {
			size_t b = first + i, j = i;
			uint64_t w = atomic_load_explicit(&s->set[b / 64],
							  memory_order_relaxed) >>
				     (b % 64);
			int err;

			if (!w) {
				i += 64 - b % 64;
				continue;
			}
			if (!(w & 1)) {
				i += (size_t)__builtin_ctzll(w);
				continue;
			}
			for (;;) {
				size_t k;

				while (j < n && uw_bit_test(s->set, first + j))
					j++;
				/* the next set page within GAP joins the run */
				for (k = j; k < n && k - j < gap &&
				     !uw_bit_test(s->set, first + k); k++)
					;
				if (k == j || k >= n || k - j >= gap)
					break;
				j = k;
			}
			err = fn(s, (uintptr_t)s->rs.r[r].addr + i * psz,
				 (j - i) * psz);
			if (err)
				return err;
			i = j;
		}
	}
	return 0;
}

/*
 * Pages between two runs of the set that one protect call covers as well:
 * walking up to this many PTEs that are protected already costs less than
 * another ioctl (the page tables of a 2 MiB range, one PTE table).
 */
#define PROTECT_GAP	512

static int protect_run(struct uffdwp_snapshot *s, uintptr_t addr, size_t len)
{
	return uw_snap_wp(s, addr, len, true, false);
}

static int populate_run(struct uffdwp_snapshot *s, uintptr_t addr,
			size_t len)
{
	(void)s;
	return uw_populate_range(addr, len);
}

/* The snapshot's page set (every page for a BASE) from the dirty bitmap,
 * its ranks, and its pages made PENDING.  Returns the number of pages. */
static uint64_t take_set(struct uffdwp_snapshot *s, bool base)
{
	uint64_t pages = 0;

	for (size_t w = 0; w < s->words; w++) {
		uint64_t v = atomic_exchange_explicit(&s->dirty[w], 0,
						      memory_order_relaxed);

		if (base)
			v = w + 1 < s->words || !(s->rs.pages % 64) ? ~0ULL :
			    (1ULL << (s->rs.pages % 64)) - 1;
		atomic_store_explicit(&s->set[w], v, memory_order_relaxed);
		atomic_store_explicit(&s->zeroed[w], 0, memory_order_relaxed);
		s->rank[w] = pages;
		pages += (uint64_t)__builtin_popcountll(v);
		/* The other pages are DONE since the previous snapshot. */
		while (v) {
			size_t i = w * 64 + (size_t)__builtin_ctzll(v);

			atomic_store_explicit(&s->state[i], ST_PENDING,
					      memory_order_relaxed);
			v &= v - 1;
		}
	}
	return pages;
}

/* Every side buffer slot free again (a failed snapshot may leave some
 * taken), and the peak measured from here. */
static void reset_slots(struct uffdwp_snapshot *s)
{
	pthread_mutex_lock(&s->slot_lock);
	if (s->nfree != s->nslots)
		for (size_t i = 0; i < s->nslots; i++)
			s->free_slot[i] = (uint32_t)(s->nslots - 1 - i);
	s->nfree = s->nfree_min = s->nslots;
	pthread_mutex_unlock(&s->slot_lock);
}

/* Start this snapshot's counters; the handler is held. */
static void reset_stats(struct uffdwp_snapshot *s, uint64_t pages, bool base,
			uint64_t t_start)
{
	struct uffdwp_snapshot_stats keep = s->st;

	pthread_mutex_lock(&s->lock);
	memset(&s->st, 0, sizeof(s->st));
	s->st.side_cap = keep.side_cap;
	s->st.fixed_bytes = keep.fixed_bytes;
	s->st.used_unpopulated = keep.used_unpopulated;
	s->st.user_mode_only = keep.user_mode_only;
	s->st.pages = pages;
	s->st.epoch = s->taken;
	s->st.huge_blocks = s->nhuge;
	s->kind = base ? UFFDWP_FILE_BASE : UFFDWP_FILE_DELTA;
	/* A delta after regions were added or removed says so. */
	s->file_flags = !base && s->regions_changed ?
			UFFDWP_FILE_REGIONS_CHANGED : 0;
	s->done = s->cancel = s->go = false;
	uw_done_drain(s);
	s->error = s->handler_error = 0;
	s->t_start = t_start;
	pthread_mutex_unlock(&s->lock);
}

/* The instant failed before anything was saved: nothing is tracked any
 * more, so let every writer go and make the next snapshot a base. */
static int fail_instant(struct uffdwp_snapshot *s, int err)
{
	pthread_mutex_lock(&s->lock);
	s->cancel = s->need_base = true;
	pthread_mutex_unlock(&s->lock);
	uw_snap_unprotect_all(s);
	uw_snap_finish(s, err);
	return err;
}

int uw_session_idle(struct uffdwp_snapshot *s)
{
	bool busy;

	pthread_mutex_lock(&s->lock);
	busy = !s->done;
	pthread_mutex_unlock(&s->lock);
	if (busy)
		return -EBUSY;
	if (s->copier_started) {
		pthread_join(s->copier, NULL);
		s->copier_started = false;
	}
	return 0;
}

int uw_session_prepare(struct uffdwp_snapshot *s, int fd)
{
	int err = uw_session_idle(s), dup;

	if (err)
		return err;
	/* Our own duplicate of FD (the copier closes it when done). */
	dup = uw_snap_dup_sink(fd);
	if (dup < 0)
		return dup;
	if (s->sink_owned && s->opts.sink_fd >= 0)
		close(s->opts.sink_fd);
	s->opts.sink_fd = dup;
	s->sink_owned = true;
	return uw_snap_setup_spill(s);
}

struct held {
	struct uffdwp_snapshot *s;
	bool base;
	uint64_t t_start;
	int (*prepare)(struct uffdwp_snapshot *s, void *arg);
	void *arg;
};

/*
 * What an instant does under the instant lock, run aside
 * (uw_run_aside(): the caller's own stack or its libc's memory may be in
 * a region, and a fault there would wait for the handler, which waits
 * for this lock).  Touches only the library's memory.
 */
static int instant_held(void *arg)
{
	struct held *h = arg;
	struct uffdwp_snapshot *s = h->s;
	uint64_t t0, pages;
	bool base = h->base;
	int err = 0;

	uw_session_hold(s);
	t0 = uw_now_ns();
	/* A pre-copy leaves async mode in its own PREPARE; a session that
	 * ran async since its last snapshot does here (session-async.c). */
	if (h->prepare)
		err = h->prepare(s, h->arg);
	else
		err = uw_session_leave_async(s);
	if (err) {
		uw_session_release(s);
		return err;
	}
	/* A pre-copy's set is what was written since its last round. */
	base = !s->full_layout && (s->need_base || base);
	/* Memory replaced under the session since the last instant: its
	 * pages join the set (or the instant fails, see there). */
	for (int tries = 0;; tries++) {
		unsigned long seen = 0;

		if (!base)
			err = sync_events(s, &seen);
		pages = err ? 0 : take_set(s, base);
		reset_slots(s);
		/* A pre-copy's file is a base: every page, most of them
		 * written already, the set's pages by this copier. */
		reset_stats(s, s->full_layout ? s->rs.pages : pages,
			    base || s->full_layout, h->t_start);
		if (!err && !s->st.used_unpopulated)
			err = for_each_run(s, 0, populate_run);
		if (!err)
			err = for_each_run(s, PROTECT_GAP, protect_run);
		if (err || base || !s->replace_events)
			break;
		err = probe_events(s);
		if ((!err || err == -ENOENT) &&
		    atomic_load(&s->nreplaced) == seen)
			break;
		/* Memory replaced during the pause: its pages are in the
		 * dirty bitmap; take the set again with them. */
		err = 0;
		for (size_t w = 0; w < s->words; w++)
			atomic_fetch_or(&s->dirty[w], atomic_load(&s->set[w]));
		if (tries == 3) {
			err = -EAGAIN;
			break;
		}
	}
	if (!err) {
		s->need_base = false;
		s->regions_changed = false;
		s->taken++;
	}
	uw_session_release(s);
	pthread_mutex_lock(&s->lock);
	s->st.pause_ns = uw_now_ns() - t0;
	pthread_mutex_unlock(&s->lock);
	return err;
}

int uw_session_instant(struct uffdwp_snapshot *s, bool base, uint64_t t_start,
		       int (*prepare)(struct uffdwp_snapshot *s, void *arg),
		       void *arg)
{
	struct held *h;
	int err;

	uw_snap_find_huge(s);
	s->ksm_check = uw_ksm_running();
	/* The hand-over lives in the library's memory, not on our stack. */
	h = uw_alloc(sizeof(*h));
	if (!h)
		return fail_instant(s, -ENOMEM);
	*h = (struct held){ s, base, t_start, prepare, arg };
	err = uw_run_aside(instant_held, h);
	uw_free(h, sizeof(*h));
	if (err)
		return fail_instant(s, err);
	err = uw_snap_start_thread(&s->copier, uw_snap_copier_main, s);
	if (err)
		return fail_instant(s, err);
	s->copier_started = true;
	pthread_mutex_lock(&s->lock);
	s->go = true;
	s->st.start_ns = uw_now_ns() - t_start;
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* Whether KSM may merge pages (/sys/kernel/mm/ksm/run not 0); read
 * before the pause. */
bool uw_ksm_running(void)
{
	char c = '0';
	int fd = open("/sys/kernel/mm/ksm/run", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return false;
	if (read(fd, &c, 1) != 1)
		c = '0';
	close(fd);
	return c != '0';
}

static int check_maps(struct uffdwp_snapshot *s)
{
	bool anon;

	return uw_regions_check_maps(&s->rs, &anon);
}

int uffdwp_session_snapshot(struct uffdwp_session *ss, int fd,
			    unsigned int flags)
{
	struct uffdwp_snapshot *s = of(ss);
	uint64_t t_start = uw_now_ns();
	int err;

	if (!ss || fd < 0 || (flags & ~UFFDWP_SESSION_BASE))
		return -EINVAL;
	if (uw_snap_foreign(s))
		return -ECHILD;
	err = uw_session_prepare(s, fd);
	if (err)
		return err;
	/* A region unmapped (-EFAULT) or changed in kind or protection
	 * (-EINVAL) since the last instant: no snapshot of it. */
	err = check_maps(s);
	if (err)
		return err;
	s->full_layout = false;
	return uw_session_instant(s, flags & UFFDWP_SESSION_BASE, t_start,
				  NULL, NULL);
}

int uffdwp_session_wait(struct uffdwp_session *ss, int timeout_ms)
{
	if (!ss)
		return -EINVAL;
	if (uw_snap_foreign(of(ss)))
		return -ECHILD;
	if (!of(ss)->taken)
		return -ENOENT;
	return uffdwp_snapshot_wait(of(ss), timeout_ms);
}

int uffdwp_session_stats(struct uffdwp_session *ss,
			 struct uffdwp_snapshot_stats *st)
{
	if (!ss || !st)
		return -EINVAL;
	if (uw_snap_foreign(of(ss)))
		return -ECHILD;
	if (!of(ss)->taken)
		return -ENOENT;
	return uffdwp_snapshot_stats(of(ss), st);
}

ssize_t uffdwp_session_dirty(struct uffdwp_session *ss)
{
	struct uffdwp_snapshot *s = of(ss);

	if (!ss)
		return -EINVAL;
	if (uw_snap_foreign(s))
		return -ECHILD;
	/* In async mode the pages written since are in the ring too. */
	return uw_session_count_dirty(s);
}

void uffdwp_session_free(struct uffdwp_session *ss)
{
	if (!ss)
		return;
	if (uw_snap_foreign(of(ss))) {
		uw_snap_forget(of(ss));
		return;
	}
	uffdwp_snapshot_cancel(of(ss));
	uw_snap_destroy(of(ss));
}
