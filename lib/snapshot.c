// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapshot.c: point-in-time copy of memory regions while the process runs.
 *
 * Three parties share one lock and a state word per page:
 *   PENDING  protected, nobody copied it yet;
 *   COPYING  the copier is reading it (still protected, so unchanged);
 *   DONE     sent (or about to be) to the sink; may be unprotected;
 *   SAVED+n  a writer faulted on it first: its old contents are in side
 *            buffer slot n, the page is unprotected.
 * The fault handler (one thread) turns PENDING into SAVED, waiting while the
 * page is COPYING or the side buffer is full.  The copier walks the regions
 * in address order in chunks of at most 2 MiB (aligned, so a THP extent is
 * unprotected in one piece and not split), copying PENDING pages from
 * memory and SAVED pages from their slot, then unprotects the chunk.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define ST_PENDING	0u
#define ST_COPYING	1u
#define ST_DONE		2u
#define ST_SAVED	3u	/* + slot */

#define CHUNK		UW_HPAGE_SIZE
#define DEFAULT_CAP	(16UL << 20)
#define MSGS		32
/* The fd sink issues write(2)s of at most this much: on some kernels the
 * cost of one write(2) into tmpfs grows faster than its length (a 2 MiB
 * write took ~1.4 s in the riscv64 TCG guest, 128 x 16 KiB ~35 ms).  It
 * also matches pipe and socket buffers. */
#define SINK_WRITE_MAX	(16UL << 10)
#define SNAP_FLAGS	(UFFDWP_SNAP_KERNEL_FAULTS | UFFDWP_SNAP_NO_UNPOPULATED | \
			 UFFDWP_SNAP_USER_MODE_ONLY)

struct uffdwp_snapshot {
	size_t self_len;
	struct uw_regions rs;
	struct uffdwp_snapshot_opts opts;
	int uffd, stop_fd;
	pthread_t handler, copier;
	bool handler_started, copier_started, registered;

	pthread_mutex_t lock;
	pthread_cond_t changed;		/* page state or free slots changed */
	pthread_cond_t finished;	/* done became true */
	bool go;			/* protect phase over */
	bool cancel;
	bool done;
	int error;

	uint32_t *state;
	size_t state_len;
	char *side;
	uint32_t *free_slot;		/* stack of free slot numbers */
	size_t nslots, nfree, slots_len;
	char *chunk;

	struct uffdwp_snapshot_stats st;
	uint64_t t_start;
};

static void finish(struct uffdwp_snapshot *s, int err)
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

static int unprotect_all(struct uffdwp_snapshot *s)
{
	int ret = 0;

	if (!s->registered)
		return 0;
	for (size_t i = 0; i < s->rs.nr; i++) {
		int err = uw_protect(s->uffd, (uintptr_t)s->rs.r[i].addr,
				     s->rs.r[i].len, false, true);
		if (err && !ret)
			ret = err;
	}
	return ret;
}

/* ---- fault handler ---- */

static void save_page(struct uffdwp_snapshot *s, uintptr_t addr)
{
	size_t psz = uw_page_size();
	long idx = uw_page_index(&s->rs, addr);
	bool waited = false;

	if (idx >= 0) {
		pthread_mutex_lock(&s->lock);
		while (!s->cancel) {
			uint32_t st = s->state[idx];

			if (st == ST_COPYING) {
				pthread_cond_wait(&s->changed, &s->lock);
				continue;
			}
			if (st != ST_PENDING)
				break;
			if (!s->nfree) {
				if (!waited)
					s->st.side_waits++;
				waited = true;
				pthread_cond_wait(&s->changed, &s->lock);
				continue;
			}
			uint32_t slot = s->free_slot[--s->nfree];

			memcpy(s->side + (size_t)slot * psz, (void *)addr, psz);
			s->state[idx] = ST_SAVED + slot;
			s->st.saved++;
			if ((s->nslots - s->nfree) * psz > s->st.side_peak)
				s->st.side_peak = (s->nslots - s->nfree) * psz;
			break;
		}
		s->st.faults++;
		pthread_mutex_unlock(&s->lock);
	}
	/* Unprotect (mode 0) also wakes the writer. */
	if (uw_protect(s->uffd, addr, psz, false, true) &&
	    !__atomic_load_n(&s->cancel, __ATOMIC_ACQUIRE)) {
		/* Cannot happen on a live region; never leave a writer stuck. */
		unprotect_all(s);
	}
}

static void *handler_main(void *arg)
{
	struct uffdwp_snapshot *s = arg;
	struct uffd_msg msg[MSGS];
	struct pollfd pfd[2] = {
		{ .fd = s->uffd, .events = POLLIN },
		{ .fd = s->stop_fd, .events = POLLIN },
	};

	pthread_mutex_lock(&s->lock);
	while (!s->go && !s->cancel)
		pthread_cond_wait(&s->changed, &s->lock);
	pthread_mutex_unlock(&s->lock);
	for (;;) {
		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pfd[1].revents)
			break;
		ssize_t n = read(s->uffd, msg, sizeof(msg));

		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			break;
		}
		for (size_t i = 0; i < (size_t)n / sizeof(msg[0]); i++) {
			if (msg[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			save_page(s, (uintptr_t)msg[i].arg.pagefault.address &
				     ~(uintptr_t)(uw_page_size() - 1));
		}
	}
	return NULL;
}

/* ---- copier ---- */

static int sink(struct uffdwp_snapshot *s, uintptr_t addr, size_t len)
{
	const char *p = s->chunk;

	if (s->opts.sink)
		return s->opts.sink(s->opts.sink_arg, (void *)addr, p, len);
	while (len) {
		ssize_t w = write(s->opts.sink_fd, p,
				  len < SINK_WRITE_MAX ? len : SINK_WRITE_MAX);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		if (w == 0)	/* the sink takes no more bytes */
			return -ENOSPC;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

static int copy_chunk(struct uffdwp_snapshot *s, uintptr_t addr, size_t len)
{
	size_t psz = uw_page_size(), n = len / psz;
	size_t first = (size_t)uw_page_index(&s->rs, addr);
	uint32_t *st = s->state + first;
	int err;

	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < n; i++)
		if (st[i] == ST_PENDING)
			st[i] = ST_COPYING;
	pthread_mutex_unlock(&s->lock);

	/* Protected pages cannot change: copy them without the lock. */
	for (size_t i = 0; i < n;) {
		size_t j = i;

		while (j < n && st[j] == ST_COPYING)
			j++;
		if (j > i)
			memcpy(s->chunk + i * psz, (void *)(addr + i * psz),
			       (j - i) * psz);
		i = j + (j == i);
	}

	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < n; i++) {
		if (st[i] >= ST_SAVED) {
			uint32_t slot = st[i] - ST_SAVED;

			memcpy(s->chunk + i * psz, s->side + (size_t)slot * psz,
			       psz);
			s->free_slot[s->nfree++] = slot;
		}
		st[i] = ST_DONE;
	}
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);

	err = uw_protect(s->uffd, addr, len, false, true);
	if (err)
		return -EIO;
	err = sink(s, addr, len);
	if (err)
		return err < 0 ? err : -EIO;
	pthread_mutex_lock(&s->lock);
	s->st.pages_copied += n;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static void *copier_main(void *arg)
{
	struct uffdwp_snapshot *s = arg;
	int err = 0;

	pthread_mutex_lock(&s->lock);
	while (!s->go && !s->cancel)
		pthread_cond_wait(&s->changed, &s->lock);
	pthread_mutex_unlock(&s->lock);
	for (size_t r = 0; r < s->rs.nr && !err; r++) {
		uintptr_t a = (uintptr_t)s->rs.r[r].addr;
		uintptr_t end = a + s->rs.r[r].len;

		while (a < end && !err) {
			uintptr_t next = (a & ~(uintptr_t)(CHUNK - 1)) + CHUNK;

			if (next > end)
				next = end;
			if (__atomic_load_n(&s->cancel, __ATOMIC_ACQUIRE))
				err = -ECANCELED;
			else
				err = copy_chunk(s, a, next - a);
			a = next;
		}
	}
	if (err) {
		/* Let every writer go: nothing more will be saved. */
		pthread_mutex_lock(&s->lock);
		s->cancel = true;
		pthread_cond_broadcast(&s->changed);
		pthread_mutex_unlock(&s->lock);
		unprotect_all(s);
	}
	finish(s, err);
	return NULL;
}

/* ---- setup and API ---- */

static int start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	int err;

	/* Our threads take no signals: a handler running on them could
	 * write a protected page and wait for itself. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return -err;
}

static int alloc_buffers(struct uffdwp_snapshot *s, size_t cap)
{
	size_t psz = uw_page_size();

	s->nslots = cap / psz ? cap / psz : 1;
	if (s->nslots > UINT32_MAX - ST_SAVED)
		s->nslots = UINT32_MAX - ST_SAVED;
	s->state_len = (s->rs.pages * sizeof(uint32_t) + psz - 1) / psz * psz;
	s->slots_len = (s->nslots * sizeof(uint32_t) + psz - 1) / psz * psz;
	s->state = uw_alloc(s->state_len);
	s->free_slot = uw_alloc(s->slots_len);
	s->side = uw_alloc(s->nslots * psz);
	s->chunk = uw_alloc(CHUNK);
	if (!s->state || !s->free_slot || !s->side || !s->chunk)
		return -ENOMEM;
	for (size_t i = 0; i < s->nslots; i++)
		s->free_slot[i] = (uint32_t)(s->nslots - 1 - i);
	s->nfree = s->nslots;
	s->st.side_cap = s->nslots * psz;
	s->st.fixed_bytes = CHUNK + s->state_len + s->slots_len;
	s->st.pages = s->rs.pages;
	return 0;
}

static void destroy(struct uffdwp_snapshot *s)
{
	size_t psz = uw_page_size();

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
		unprotect_all(s);
		uw_unregister(s->uffd, &s->rs);
	}
	if (s->uffd >= 0)
		close(s->uffd);
	if (s->stop_fd >= 0)
		close(s->stop_fd);
	uw_free(s->state, s->state_len);
	uw_free(s->free_slot, s->slots_len);
	uw_free(s->side, s->nslots * psz);
	uw_free(s->chunk, CHUNK);
	uw_regions_fini(&s->rs);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->changed);
	pthread_cond_destroy(&s->finished);
	uw_free(s, s->self_len);
}

int uffdwp_snapshot_start(struct uffdwp_snapshot **out,
			  const struct uffdwp_region *regions, size_t nr,
			  const struct uffdwp_snapshot_opts *opts)
{
	size_t psz = uw_page_size(), self_len;
	struct uffdwp_features f;
	struct uffdwp_snapshot *s;
	pthread_condattr_t ca;
	uint64_t features = UFFD_FEATURE_PAGEFAULT_FLAG_WP, t0;
	int err;

	for (size_t i = 0; opts && i < sizeof(opts->__reserved) / 8; i++)
		if (opts->__reserved[i])
			return -EINVAL;
	if (!out || !opts || (opts->flags & ~SNAP_FLAGS) ||
	    (opts->flags & UFFDWP_SNAP_KERNEL_FAULTS &&
	     opts->flags & UFFDWP_SNAP_USER_MODE_ONLY) ||
	    (opts->sink_fd >= 0) == (opts->sink != NULL) ||
	    /* a zero-filled struct must not stream memory to stdin */
	    opts->sink_fd == 0)
		return -EINVAL;
	*out = NULL;
	self_len = (sizeof(*s) + psz - 1) / psz * psz;
	s = uw_alloc(self_len);
	if (!s)
		return -ENOMEM;
	memset(s, 0, sizeof(*s));
	s->self_len = self_len;
	s->uffd = s->stop_fd = -1;
	s->opts = *opts;
	s->t_start = uw_now_ns();
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->changed, NULL);
	pthread_cond_init(&s->finished, &ca);
	pthread_condattr_destroy(&ca);

	err = uw_regions_init(&s->rs, regions, nr);
	if (err)
		goto fail;
	uffdwp_probe(&f);
	if (!f.wp) {
		err = -EOPNOTSUPP;
		goto fail;
	}
	s->st.used_unpopulated = f.wp_unpopulated &&
				 !(opts->flags & UFFDWP_SNAP_NO_UNPOPULATED);
	if (s->st.used_unpopulated)
		features |= UFFD_FEATURE_WP_UNPOPULATED;
	/*
	 * Kernel-mode faults by default: read(2) or recv(2) into a page the
	 * copier has not reached must wait for it like a user write, not fail
	 * with EFAULT.  Only where the process may not handle them fall back
	 * to user-mode-only, and say so in the stats.
	 */
	err = -EPERM;
	if (!(opts->flags & UFFDWP_SNAP_USER_MODE_ONLY))
		err = uffdwp_open(UFFDWP_OPEN_KERNEL_FAULTS, features, NULL);
	if (err == -EPERM && !(opts->flags & UFFDWP_SNAP_KERNEL_FAULTS)) {
		s->st.user_mode_only = true;
		err = uffdwp_open(0, features, NULL);
	}
	if (err < 0)
		goto fail;
	s->uffd = err;
	err = alloc_buffers(s, opts->side_cap ? opts->side_cap : DEFAULT_CAP);
	if (err)
		goto fail;
	/* On failure uw_register_wp() undoes what it did. */
	err = uw_register_wp(s->uffd, &s->rs);
	if (err)
		goto fail;
	s->registered = true;
	if (!s->st.used_unpopulated) {
		err = uw_populate_read(&s->rs);
		if (err)
			goto fail;
	}
	s->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (s->stop_fd < 0) {
		err = -errno;
		goto fail;
	}
	err = start_thread(&s->handler, handler_main, s);
	if (err)
		goto fail;
	s->handler_started = true;
	err = start_thread(&s->copier, copier_main, s);
	if (err)
		goto fail;
	s->copier_started = true;

	/* The snapshot instant: faults raised meanwhile wait until it ends. */
	t0 = uw_now_ns();
	for (size_t i = 0; i < s->rs.nr && !err; i++)
		err = uw_protect(s->uffd, (uintptr_t)s->rs.r[i].addr,
				 s->rs.r[i].len, true, false);
	s->st.pause_ns = uw_now_ns() - t0;
	pthread_mutex_lock(&s->lock);
	if (err)
		s->cancel = true;
	s->go = true;
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
	if (err)
		goto fail;
	s->st.start_ns = uw_now_ns() - s->t_start;
	*out = s;
	return 0;

fail:
	pthread_mutex_lock(&s->lock);
	s->cancel = true;
	s->go = true;
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
	destroy(s);
	return err;
}

int uffdwp_snapshot_wait(struct uffdwp_snapshot *s, int timeout_ms)
{
	struct timespec ts;
	int err = 0;

	if (!s)
		return -EINVAL;
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
	pthread_mutex_lock(&s->lock);
	if (s->done) {
		pthread_mutex_unlock(&s->lock);
		return -EALREADY;
	}
	__atomic_store_n(&s->cancel, true, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
	/* Writers go at once; the copier stops before its next chunk. */
	unprotect_all(s);
	uffdwp_snapshot_wait(s, -1);
	return 0;
}

int uffdwp_snapshot_stats(struct uffdwp_snapshot *s,
			  struct uffdwp_snapshot_stats *st)
{
	if (!s || !st)
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	*st = s->st;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

void uffdwp_snapshot_free(struct uffdwp_snapshot *s)
{
	if (!s)
		return;
	uffdwp_snapshot_cancel(s);
	destroy(s);
}
