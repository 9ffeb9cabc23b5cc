// SPDX-License-Identifier: GPL-2.0
/* wp_probe.c: see wp_probe.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "uffd_util.h"
#include "wp_probe.h"

int wp_uffd_open(void *addr, size_t len, uint64_t features, uint64_t mode,
		 bool protect, char *why, size_t wlen)
{
	uint64_t got = 0;
	int uffd = uffd_open(features, &got), err;

	if (uffd < 0) {
		snprintf(why, wlen, "UFFDIO_API features %#llx: %s",
			 (unsigned long long)features, strerror(-uffd));
		return uffd;
	}
	if ((got & features) != features) {
		snprintf(why, wlen, "UFFDIO_API features %#llx lack %#llx",
			 (unsigned long long)got, (unsigned long long)features);
		err = -EOPNOTSUPP;
		goto fail;
	}
	err = uffd_register(uffd, addr, len, mode, NULL);
	if (err) {
		snprintf(why, wlen, "UFFDIO_REGISTER mode %#llx: %s",
			 (unsigned long long)mode, strerror(-err));
		goto fail;
	}
	if (protect) {
		err = uffd_wp(uffd, addr, len, UFFDIO_WRITEPROTECT_MODE_WP);
		if (err) {
			snprintf(why, wlen, "UFFDIO_WRITEPROTECT(MODE_WP): %s",
				 strerror(-err));
			goto fail;
		}
	}
	return uffd;
fail:
	close(uffd);
	return err;
}

int wp_area_create(struct wp_area *a, size_t len, char *why, size_t wlen)
{
	int err;

	memset(a, 0, sizeof(*a));
	a->uffd = -1;
	a->len = len;
	a->p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a->p == MAP_FAILED) {
		err = -errno;
		a->p = NULL;
		snprintf(why, wlen, "mmap: %s", strerror(-err));
		return err;
	}
	a->expect = calloc(1, len);
	if (!a->expect) {
		snprintf(why, wlen, "out of memory for the expected contents");
		return -ENOMEM;
	}
	return 0;
}

void wp_area_fill(struct wp_area *a, unsigned int seed)
{
	fill_pattern(a->p, a->len, seed);
	memcpy(a->expect, a->p, a->len);
}

int wp_area_arm(struct wp_area *a, uint64_t features, bool protect,
		char *why, size_t wlen)
{
	a->uffd = wp_uffd_open(a->p, a->len, features, UFFDIO_REGISTER_MODE_WP,
			       protect, why, wlen);
	return a->uffd < 0 ? a->uffd : 0;
}

void wp_area_destroy(struct wp_area *a)
{
	if (a->uffd >= 0)
		close(a->uffd);
	free(a->expect);
	if (a->p && !a->leak)
		munmap(a->p, a->len);
}

bool wp_area_data_ok(const struct wp_area *a, char *why, size_t wlen)
{
	long d = first_diff(a->p, a->expect, a->len);

	if (d < 0)
		return true;
	snprintf(why, wlen, "data differs at offset %ld (page %ld)", d,
		 d / page_size());
	return false;
}

/*
 * Let writer W, blocked in a fault on [res, res + res_len), go: dropping
 * the registration drops the protection, then wake it.  True if W then
 * finishes within WP_PROBE_WAIT_MS.
 */
static bool release_writer(int uffd, struct writer *w, char *res,
			   size_t res_len)
{
	uffd_unregister(uffd, res, res_len);
	uffd_wake(uffd, res, res_len);
	return writer_wait(w, WP_PROBE_WAIT_MS);
}

/* What happened to one store made by probe_run(). */
struct probe {
	bool got_msg;		/* a message came within WP_PROBE_WAIT_MS */
	struct uffd_msg msg;	/* that first message */
	bool blocked;		/* the writer had not finished by then */
	int resolve_err;	/* what unprotecting returned */
	bool finished;		/* the writer finished after that */
	bool extra;		/* another message came after it finished */
};

/*
 * Store VAL at ADDR from a writer thread, take the first message while the
 * writer is blocked, unprotect [res, res + res_len) and wait for the
 * writer.  Returns 0 with *PR filled in, -errno if the writer could not be
 * started, or -ETIMEDOUT if it is still stuck after being unregistered
 * and woken (its struct writer is leaked: the thread still runs).
 */
static int probe_run(int uffd, char *addr, char val, char *res,
		     size_t res_len, struct probe *pr)
{
	struct writer *w = calloc(1, sizeof(*w));
	int err;

	memset(pr, 0, sizeof(*pr));
	if (!w)
		return -ENOMEM;
	err = writer_start(w, addr, 1, val);
	if (err) {
		free(w);
		return err;
	}
	pr->got_msg = uffd_read_msg(uffd, &pr->msg, WP_PROBE_WAIT_MS) == 1;
	pr->blocked = !__atomic_load_n(&w->done, __ATOMIC_ACQUIRE);
	pr->resolve_err = uffd_wp(uffd, res, res_len, 0);
	pr->finished = writer_wait(w, WP_PROBE_WAIT_MS);
	if (!pr->finished) {
		if (!release_writer(uffd, w, res, res_len))
			return -ETIMEDOUT;
	} else {
		struct uffd_msg more;

		pr->extra = uffd_read_msg(uffd, &more, WP_PROBE_QUIET_MS) == 1;
	}
	free(w);
	return 0;
}

/* True if PR is exactly one WP write fault at WANT; else WHY says why not. */
static bool probe_ok(const struct probe *pr, const void *want, char *why,
		     size_t wlen)
{
	const struct uffd_msg *m = &pr->msg;
	unsigned long long flags = m->arg.pagefault.flags;

	if (!pr->got_msg)
		snprintf(why, wlen, "no fault message within %d ms",
			 WP_PROBE_WAIT_MS);
	else if (m->event != UFFD_EVENT_PAGEFAULT)
		snprintf(why, wlen, "message event %u, want PAGEFAULT", m->event);
	else if (!(flags & UFFD_PAGEFAULT_FLAG_WP))
		snprintf(why, wlen, "fault flags %#llx, want WP|WRITE (without "
			 "WP: a MISSING fault)", flags);
	else if (!(flags & UFFD_PAGEFAULT_FLAG_WRITE))
		snprintf(why, wlen, "fault flags %#llx, want WP|WRITE", flags);
	else if (m->arg.pagefault.address != (uintptr_t)want)
		snprintf(why, wlen, "fault address %#llx, want %p",
			 (unsigned long long)m->arg.pagefault.address, want);
	else if (!pr->blocked)
		snprintf(why, wlen, "the write completed before it was resolved");
	else if (pr->resolve_err)
		snprintf(why, wlen, "unprotect to resolve: %s",
			 strerror(-pr->resolve_err));
	else if (!pr->finished)
		snprintf(why, wlen, "the write did not complete after resolving");
	else if (pr->extra)
		snprintf(why, wlen, "a second message after resolving");
	else
		return true;
	return false;
}

bool wp_write_faults_once(int uffd, char *addr, char val, const void *want,
			  char *res, size_t res_len, bool *stuck, char *why,
			  size_t wlen)
{
	struct probe pr;
	int err = probe_run(uffd, addr, val, res, res_len, &pr);

	if (err == -ETIMEDOUT) {
		*stuck = true;
		snprintf(why, wlen, "the writer at %p never finished",
			 (void *)addr);
		return false;
	}
	if (err) {
		snprintf(why, wlen, "starting the writer: %s", strerror(-err));
		return false;
	}
	return probe_ok(&pr, want, why, wlen);
}

bool wp_write_no_fault(int uffd, char *addr, char val, bool *stuck,
		       char *why, size_t wlen)
{
	char *page = (char *)((uintptr_t)addr & ~(page_size() - 1));
	struct writer *w = calloc(1, sizeof(*w));
	struct uffd_msg msg;
	int err = w ? writer_start(w, addr, 1, val) : -ENOMEM;

	if (err) {
		free(w);
		snprintf(why, wlen, "starting the writer: %s", strerror(-err));
		return false;
	}
	if (!writer_wait(w, WP_PROBE_WAIT_MS)) {
		if (release_writer(uffd, w, page, page_size()))
			free(w);
		else
			*stuck = true;	/* leak W: its thread still runs */
		snprintf(why, wlen, "the write at %p blocked", (void *)addr);
		return false;
	}
	free(w);
	if (uffd_read_msg(uffd, &msg, WP_PROBE_QUIET_MS) == 1) {
		snprintf(why, wlen, "the write at %p sent a message (event %u, "
			 "flags %#llx)", (void *)addr, msg.event,
			 (unsigned long long)msg.arg.pagefault.flags);
		return false;
	}
	return true;
}

bool wp_area_fault_page(struct wp_area *a, int idx, char val, char *why,
			size_t wlen)
{
	size_t psz = (size_t)page_size();
	char *page = a->p + idx * psz;

	a->expect[idx * psz] = val;
	return wp_write_faults_once(a->uffd, page, val, page, page, psz,
				    &a->leak, why, wlen);
}
