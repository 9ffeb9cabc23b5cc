// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapshot.c: point-in-time copy of memory regions while the process runs:
 * setup, the public calls, and (here) why the copy is consistent.  The
 * parts: snapshot-handler.c (the fault handler), snapshot-copier.c (the
 * copier), snapshot-spill.c (the spill file), snapshot-huge.c (the huge
 * block map); what they share beyond snapshot.h: snapshot-parts.h.
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

#include "snapshot-parts.h"

void uw_snap_finish(struct uffdwp_snapshot *s, int err)
{
	pthread_mutex_lock(&s->lock);
	if (!s->done) {
		s->done = true;
		s->error = err;
		s->st.done = true;
		s->st.error = err;
		s->st.total_ns = uw_now_ns() - s->t_start;
		uw_done_signal(s);
	}
	pthread_cond_broadcast(&s->finished);
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
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
	if (s->done_fd >= 0)
		close(s->done_fd);
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
	s->magic = 0;
	/* The ring was not inherited (the kernel maps it VM_DONTCOPY): the
	 * child may have mapped its own memory at that address since. */
	s->ring = NULL;
	release_memory(s);
	uw_free(s, s->self_len);
}

void uw_snap_destroy(struct uffdwp_snapshot *s)
{
	struct uffd_msg m;

	s->magic = 0;
	/*
	 * A session keeps its pages protected between snapshots, and only
	 * its handler lets a write there go.  Joining our threads below
	 * writes glibc's list of thread stacks, whose neighbours may be
	 * another thread's descriptor at the top of its stack, in a region
	 * (riscv64 hung here): let every writer go while the handler still
	 * runs.
	 */
	uw_snap_unprotect_all(s);
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
		while (uw_snap_next_deferred(s, &m))
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
	s->done_fd = -1;
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
	s->anon_only = anon_private;
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
	/* A session learns of memory replaced under it (munmap, mmap over
	 * it, mremap) from events, outside its instants' pause. */
	s->replace_events = session &&
		(f.api_features & (UFFD_FEATURE_EVENT_UNMAP |
				   UFFD_FEATURE_EVENT_REMAP)) ==
		(UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMAP);
	if (s->replace_events)
		features |= UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMAP;
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
	s->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->stop_fd < 0 || s->kick_fd < 0 || s->done_fd < 0) {
		err = -errno;
		goto fail;
	}
	err = uw_snap_start_thread(&s->handler, uw_snap_handler_main, s);
	if (err)
		goto fail;
	s->handler_started = true;
	s->magic = session ? UW_SESSION_MAGIC : UW_SNAPSHOT_MAGIC;
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
