// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-events: non-cooperative events on MISSING|WP registrations.
 *
 * Contract checked (issue tracker, area 10 "events"), with a uffd opened
 * with UFFD_FEATURE_EVENT_REMAP|EVENT_REMOVE|EVENT_UNMAP and ranges
 * registered MODE_MISSING|MODE_WP and write-protected:
 *  - mremap() delivers UFFD_EVENT_REMAP with from/to/len of the move, then
 *    (the old range is unmapped implicitly, as userfaultfd.rst says)
 *    UFFD_EVENT_UNMAP of the old range; the moved pages keep their
 *    protection and a write there faults WP at the new address;
 *  - madvise(MADV_DONTNEED) delivers UFFD_EVENT_REMOVE with start/end, and
 *    the range stays registered (a write then takes a MISSING fault);
 *  - munmap() delivers UFFD_EVENT_UNMAP with start/end;
 *  - while such an event is queued and unread (ctx->mmap_changing),
 *    UFFDIO_WRITEPROTECT on another registered range of the same uffd
 *    fails with EAGAIN and protects nothing; once the event is read and
 *    the thread that caused it has returned, the same call succeeds.
 *
 * The thread that changes the mapping blocks until its event is read, so
 * each change runs in a thread of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"

#define PAGES		8
#define EVENT_WAIT_MS	3000
#define QUIET_MS	200
#define WP_WRITE	(UFFD_PAGEFAULT_FLAG_WP | UFFD_PAGEFAULT_FLAG_WRITE)
#define EVENTS		(UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_EVENT_REMOVE | \
			 UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_PAGEFAULT_FLAG_WP)
#define MISSING_WP	(UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP)

static size_t area_len(void)
{
	return PAGES * page_size();
}

static char pattern(size_t off)
{
	return (char)(0x3b + off % 233);
}

/*
 * The uffd and up to two registered, protected areas A and B (B only when
 * asked for), plus a PROT_NONE reservation a mremap can move A onto.
 */
struct setup {
	int uffd;
	char *a, *b, *dest;
	bool stuck;		/* a thread may still run: never unmap */
};

static char *map_area(void)
{
	char *p = mmap(NULL, area_len(), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	for (size_t off = 0; off < area_len(); off++)
		p[off] = pattern(off);
	return p;
}

static bool register_and_protect(struct setup *s, char *p)
{
	int err = uffd_register(s->uffd, p, area_len(), MISSING_WP, NULL);

	if (err)
		return because("UFFDIO_REGISTER(MISSING|WP): %s", strerror(-err));
	return protect_checked(s->uffd, p, area_len());
}

static bool setup(struct setup *s, bool with_b)
{
	memset(s, 0, sizeof(*s));
	s->uffd = uffd_open(EVENTS, NULL);
	if (s->uffd < 0)
		return because("uffd_open(EVENT_REMAP|REMOVE|UNMAP): %s",
			       strerror(-s->uffd));
	s->a = map_area();
	s->dest = mmap(NULL, area_len(), PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (s->dest == MAP_FAILED)
		s->dest = NULL;
	if (with_b)
		s->b = map_area();
	if (!s->a || !s->dest || (with_b && !s->b))
		return because("mmap: %s", strerror(errno));
	return register_and_protect(s, s->a) &&
	       (!with_b || register_and_protect(s, s->b));
}

static void teardown(struct setup *s)
{
	if (s->uffd >= 0)
		close(s->uffd);
	if (s->stuck)
		return;
	/* Each may have been moved or unmapped already: munmap is harmless. */
	if (s->a)
		munmap(s->a, area_len());
	if (s->b)
		munmap(s->b, area_len());
	if (s->dest)
		munmap(s->dest, area_len());
}

/* A change of the address space, made by a thread of its own. */
enum change { CHANGE_REMAP, CHANGE_REMOVE, CHANGE_UNMAP };

struct changer {
	pthread_t thread;
	enum change what;
	char *addr, *dest;
	size_t len;
	volatile int done;
	long ret;
	int err;
};

static void *changer_main(void *arg)
{
	struct changer *c = arg;
	void *p;

	switch (c->what) {
	case CHANGE_REMAP:
		p = mremap(c->addr, c->len, c->len,
			   MREMAP_MAYMOVE | MREMAP_FIXED, c->dest);
		c->ret = p == MAP_FAILED ? -1 : (long)(uintptr_t)p;
		break;
	case CHANGE_REMOVE:
		c->ret = madvise(c->addr, c->len, MADV_DONTNEED);
		break;
	case CHANGE_UNMAP:
		c->ret = munmap(c->addr, c->len);
		break;
	}
	c->err = errno;
	__atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static bool changer_start(struct changer *c, enum change what, char *addr,
			  size_t len, char *dest)
{
	memset(c, 0, sizeof(*c));
	c->what = what;
	c->addr = addr;
	c->len = len;
	c->dest = dest;
	if (pthread_create(&c->thread, NULL, changer_main, c))
		return because("pthread_create failed");
	return true;
}

static bool changer_wait(struct changer *c, int timeout_ms)
{
	return joined_within(c->thread, &c->done, timeout_ms);
}

/* The changer must return, successfully, once its events are read. */
static bool changer_finished(struct changer *c, long want)
{
	if (!changer_wait(c, EVENT_WAIT_MS))
		return because("the changing thread still blocked after its "
			       "events were read");
	if (c->ret != want)
		return because("the change returned %#lx (%s), want %#lx",
			       c->ret, strerror(c->err), want);
	return true;
}

/*
 * On failure the changer may still wait for an unread event: read and
 * drop events until it returns.  If it never does, leak everything.
 */
static void changer_release(struct setup *s, struct changer *c)
{
	long long end = now_ms() + EVENT_WAIT_MS;
	struct uffd_msg msg;

	while (!__atomic_load_n(&c->done, __ATOMIC_ACQUIRE) && now_ms() < end)
		uffd_read_msg(s->uffd, &msg, 20);
	if (!changer_wait(c, 0)) {
		tap_diag("a changing thread is stuck; leaking its mappings");
		s->stuck = true;
	}
}

static bool read_event(struct setup *s, unsigned int event,
		       struct uffd_msg *msg)
{
	int n = uffd_read_msg(s->uffd, msg, EVENT_WAIT_MS);

	if (n < 0)
		return because("reading the uffd: %s", strerror(-n));
	if (n == 0)
		return because("no %s event within %d ms", uffd_event_name(event),
			       EVENT_WAIT_MS);
	if (msg->event != event)
		return because("got a %s event, want %s",
			       uffd_event_name(msg->event), uffd_event_name(event));
	return true;
}

/* A REMOVE or UNMAP event for exactly [start, end). */
static bool expect_range_event(struct setup *s, unsigned int event,
			       char *start, char *end)
{
	struct uffd_msg msg;

	if (!read_event(s, event, &msg))
		return false;
	if (msg.arg.remove.start != (uintptr_t)start ||
	    msg.arg.remove.end != (uintptr_t)end)
		return because("%s event for [%#llx, %#llx), want [%p, %p)",
			       uffd_event_name(event),
			       (unsigned long long)msg.arg.remove.start,
			       (unsigned long long)msg.arg.remove.end,
			       (void *)start, (void *)end);
	return true;
}

static bool expect_remap_event(struct setup *s, char *from, char *to,
			       size_t len)
{
	struct uffd_msg msg;

	if (!read_event(s, UFFD_EVENT_REMAP, &msg))
		return false;
	if (msg.arg.remap.from != (uintptr_t)from ||
	    msg.arg.remap.to != (uintptr_t)to || msg.arg.remap.len != len)
		return because("REMAP from %#llx to %#llx len %#llx, want from "
			       "%p to %p len %#zx",
			       (unsigned long long)msg.arg.remap.from,
			       (unsigned long long)msg.arg.remap.to,
			       (unsigned long long)msg.arg.remap.len,
			       (void *)from, (void *)to, len);
	return true;
}

static bool expect_no_message(struct setup *s, const char *when)
{
	return expect_quiet(s->uffd, QUIET_MS, when);
}

/*
 * Read one message: a page fault at PAGE with exactly FLAGS.  Otherwise
 * false, the reason naming WHAT was written and the fault WANTed.
 */
static bool fault_of(struct setup *s, char *page, uint64_t flags,
		     const char *what, const char *want)
{
	char prefix[128];

	if (expect_fault(s->uffd, page, flags, EVENT_WAIT_MS))
		return true;
	snprintf(prefix, sizeof(prefix), "%s (want %s)", what, want);
	return because_with(prefix);
}

/* Move A onto DEST; REMAP then the implicit UNMAP of the old range. */
static bool remap_events(struct setup *s)
{
	struct changer c;

	if (!changer_start(&c, CHANGE_REMAP, s->a, area_len(), s->dest))
		return false;
	if (!expect_remap_event(s, s->a, s->dest, area_len()) ||
	    !expect_range_event(s, UFFD_EVENT_UNMAP, s->a, s->a + area_len())) {
		changer_release(s, &c);
		return false;
	}
	if (!changer_finished(&c, (long)(uintptr_t)s->dest))
		return false;
	/* A is gone; DEST holds its pages now. */
	s->a = NULL;
	return expect_no_message(s, "after the mremap");
}

/* A write to page 5 of the moved area faults WP there; resolve it. */
static bool moved_pages_stay_protected(struct setup *s)
{
	char *page = s->dest + 5 * page_size();
	size_t kept = pages_with(s->dest, area_len(), PM_UFFD_WP);
	struct writer w;
	bool fault_ok;

	if (kept != PAGES)
		return because("%zu of %d moved pages have PM_UFFD_WP", kept,
			       PAGES);
	if (writer_start(&w, page, page_size(), 'R'))
		return because("pthread_create failed");
	fault_ok = fault_of(s, page, WP_WRITE, "write to a moved page",
				"WP|WRITE");
	uffd_wp(s->uffd, s->dest, area_len(), 0);
	if (!writer_wait(&w, EVENT_WAIT_MS)) {
		s->stuck = true;
		return because("writer not woken on the moved area");
	}
	if (!fault_ok)
		return false;
	if (page[0] != 'R' || page[1] != pattern(5 * page_size() + 1))
		return because("moved page 5 holds %#x %#x after the write",
			       (unsigned char)page[0], (unsigned char)page[1]);
	return true;
}

static void case_remap(void)
{
	struct setup s;
	bool events, kept = false;

	events = setup(&s, false) && remap_events(&s);
	tap_check(events, "events-remap", "%s", why);
	if (events)
		kept = moved_pages_stay_protected(&s);
	else
		because("not checked: the mremap events were wrong");
	tap_check(kept, "events-remap-keeps-wp", "%s", why);
	teardown(&s);
}

/* MADV_DONTNEED pages 2..4 of A: one REMOVE event. */
static bool remove_event(struct setup *s)
{
	char *start = s->a + 2 * page_size(), *end = s->a + 5 * page_size();
	struct changer c;

	if (!changer_start(&c, CHANGE_REMOVE, start, end - start, NULL))
		return false;
	if (!expect_range_event(s, UFFD_EVENT_REMOVE, start, end)) {
		changer_release(s, &c);
		return false;
	}
	return changer_finished(&c, 0) &&
	       expect_no_message(s, "after the madvise");
}

/* The removed page 3 is still registered: a write takes a MISSING fault. */
static bool removed_range_still_registered(struct setup *s)
{
	char *page = s->a + 3 * page_size();
	struct writer w;
	bool fault_ok;
	int err;

	if (pagemap_entry(page) & PM_PRESENT)
		return because("page 3 is still present after MADV_DONTNEED");
	if (writer_start(&w, page, page_size(), 'm'))
		return because("pthread_create failed");
	fault_ok = fault_of(s, page, UFFD_PAGEFAULT_FLAG_WRITE,
				"write to a removed page",
				"a MISSING write fault");
	err = uffd_zeropage(s->uffd, page, page_size(), 0);
	if (!writer_wait(&w, EVENT_WAIT_MS)) {
		/* Closing the uffd drops the registration and wakes it. */
		close(s->uffd);
		s->uffd = -1;
		if (!writer_wait(&w, EVENT_WAIT_MS))
			s->stuck = true;
		return because("writer not woken by UFFDIO_ZEROPAGE (%s)",
			       err ? strerror(-err) : "ok");
	}
	if (!fault_ok)
		return false;
	if (page[0] != 'm' || page[1] != 0)
		return because("removed page holds %#x %#x after the write",
			       (unsigned char)page[0], (unsigned char)page[1]);
	return true;
}

static void case_remove(void)
{
	struct setup s;
	bool events, kept = false;

	events = setup(&s, false) && remove_event(&s);
	tap_check(events, "events-remove", "%s", why);
	if (events)
		kept = removed_range_still_registered(&s);
	else
		because("not checked: the madvise event was wrong");
	tap_check(kept, "events-remove-keeps-registration", "%s", why);
	teardown(&s);
}

static bool unmap_event(struct setup *s)
{
	char *start = s->a + 1 * page_size(), *end = s->a + 4 * page_size();
	struct changer c;

	if (!changer_start(&c, CHANGE_UNMAP, start, end - start, NULL))
		return false;
	if (!expect_range_event(s, UFFD_EVENT_UNMAP, start, end)) {
		changer_release(s, &c);
		return false;
	}
	if (!changer_finished(&c, 0))
		return false;
	/* The rest of A keeps its registration and protection. */
	if (!page_wp(s->a) || !page_wp(s->a + 5 * page_size()))
		return because("the pages left mapped lost PM_UFFD_WP");
	return expect_no_message(s, "after the munmap");
}

static void case_unmap(void)
{
	struct setup s;
	bool ok = setup(&s, false) && unmap_event(&s);

	tap_check(ok, "events-unmap", "%s", why);
	teardown(&s);
}

/* Wait until the uffd is readable, without reading it. */
static bool event_pending(struct setup *s)
{
	struct pollfd p = { .fd = s->uffd, .events = POLLIN };
	int n = poll(&p, 1, EVENT_WAIT_MS);

	if (n < 0)
		return because("poll: %s", strerror(errno));
	if (n == 0)
		return because("no event became readable within %d ms",
			       EVENT_WAIT_MS);
	return true;
}

/* UFFDIO_WRITEPROTECT(B) while the event is unread: EAGAIN, no effect. */
static bool wp_refused_while_pending(struct setup *s)
{
	int err;

	/* B starts unprotected here so that an effect would show. */
	err = uffd_wp(s->uffd, s->b, area_len(), UFFDIO_WRITEPROTECT_MODE_WP);
	if (err != -EAGAIN)
		return because("UFFDIO_WRITEPROTECT with an unread event: %s, "
			       "want EAGAIN", err ? strerror(-err) : "success");
	if (pages_with(s->b, area_len(), PM_UFFD_WP))
		return because("the refused call protected %zu pages",
			       pages_with(s->b, area_len(), PM_UFFD_WP));
	return true;
}

static bool wp_works_again(struct setup *s)
{
	int err = uffd_wp(s->uffd, s->b, area_len(),
			  UFFDIO_WRITEPROTECT_MODE_WP);

	if (err)
		return because("UFFDIO_WRITEPROTECT after the event was read: "
			       "%s", strerror(-err));
	if (pages_with(s->b, area_len(), PM_UFFD_WP) != PAGES)
		return because("only %zu of %d pages protected after the event "
			       "was read", pages_with(s->b, area_len(),
						      PM_UFFD_WP), PAGES);
	return true;
}

/* Read the events CHANGE causes on A, in order; false on any mismatch. */
static bool read_change_events(struct setup *s, enum change what)
{
	char *end = s->a + area_len();

	switch (what) {
	case CHANGE_REMAP:
		/* EAGAIN must hold until the implicit UNMAP is read too. */
		return expect_remap_event(s, s->a, s->dest, area_len()) &&
		       (event_pending(s) || because_with("UNMAP after REMAP")) &&
		       (wp_refused_while_pending(s) ||
			because_with("between REMAP and UNMAP")) &&
		       expect_range_event(s, UFFD_EVENT_UNMAP, s->a, end);
	case CHANGE_REMOVE:
		return expect_range_event(s, UFFD_EVENT_REMOVE, s->a, end);
	case CHANGE_UNMAP:
		return expect_range_event(s, UFFD_EVENT_UNMAP, s->a, end);
	}
	return false;
}

static bool eagain_while_pending(struct setup *s, enum change what)
{
	long want = what == CHANGE_REMAP ? (long)(uintptr_t)s->dest : 0;
	struct changer c;
	int err;

	err = uffd_wp(s->uffd, s->b, area_len(), 0);
	if (err)
		return because("unprotecting B: %s", strerror(-err));
	if (!changer_start(&c, what, s->a, area_len(), s->dest))
		return false;
	if (!event_pending(s) || !wp_refused_while_pending(s) ||
	    !read_change_events(s, what)) {
		changer_release(s, &c);
		return false;
	}
	if (!changer_finished(&c, want))
		return false;
	if (what != CHANGE_REMOVE)
		s->a = NULL;
	return wp_works_again(s);
}

static void run_eagain(const char *name, enum change what)
{
	struct setup s;
	bool ok = setup(&s, true) && eagain_while_pending(&s, what);

	tap_check(ok, name, "%s", why);
	teardown(&s);
}

int main(void)
{
	watchdog(60);
	tap_plan(8);
	case_remap();
	case_remove();
	case_unmap();
	run_eagain("events-wp-eagain-while-unmap-unread", CHANGE_UNMAP);
	run_eagain("events-wp-eagain-while-remap-unread", CHANGE_REMAP);
	run_eagain("events-wp-eagain-while-remove-unread", CHANGE_REMOVE);
	return tap_done();
}
