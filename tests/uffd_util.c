// SPDX-License-Identifier: GPL-2.0
/* uffd_util.c: see uffd_util.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/fs.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"
/* Host builds (-Ilib) on headers older than 6.7: PAGEMAP_SCAN as the
 * library has it, so that the helpers see what the library sees. */
#if !defined(PAGEMAP_SCAN) && defined(__has_include)
#if __has_include("uapi_compat.h")
#include "uapi_compat.h"
#endif
#endif

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

long page_size(void)
{
	static long psz;

	if (!psz)
		psz = sysconf(_SC_PAGESIZE);
	return psz;
}

static int ioc(int fd, unsigned long req, void *arg)
{
	return ioctl(fd, req, arg) ? -errno : 0;
}

int uffd_open_flags(int flags, uint64_t features, uint64_t *got)
{
	struct uffdio_api api = { .api = UFFD_API, .features = features };
	int fd = syscall(SYS_userfaultfd, flags), err;

	if (fd < 0)
		return -errno;
	err = ioc(fd, UFFDIO_API, &api);
	if (err) {
		close(fd);
		return err;
	}
	if (got)
		*got = api.features;
	return fd;
}

int uffd_open(uint64_t features, uint64_t *got)
{
	return uffd_open_flags(O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY,
			       features, got);
}

int uffd_register(int uffd, void *addr, size_t len, uint64_t mode,
		  uint64_t *ioctls)
{
	struct uffdio_register r = {
		.range = { .start = (uintptr_t)addr, .len = len },
		.mode = mode,
	};
	int err = ioc(uffd, UFFDIO_REGISTER, &r);

	if (!err && ioctls)
		*ioctls = r.ioctls;
	return err;
}

int uffd_unregister(int uffd, void *addr, size_t len)
{
	struct uffdio_range r = { .start = (uintptr_t)addr, .len = len };

	return ioc(uffd, UFFDIO_UNREGISTER, &r);
}

int uffd_wp(int uffd, void *addr, size_t len, uint64_t mode)
{
	struct uffdio_writeprotect w = {
		.range = { .start = (uintptr_t)addr, .len = len },
		.mode = mode,
	};

	return ioc(uffd, UFFDIO_WRITEPROTECT, &w);
}

int uffd_copy(int uffd, void *dst, const void *src, size_t len, uint64_t mode)
{
	struct uffdio_copy c = {
		.dst = (uintptr_t)dst, .src = (uintptr_t)src, .len = len,
		.mode = mode,
	};

	return ioc(uffd, UFFDIO_COPY, &c);
}

int uffd_move(int uffd, void *dst, void *src, size_t len, uint64_t mode)
{
	int err = -EAGAIN;

#ifndef UFFDIO_MOVE
	/* Built against headers older than 6.8 (make check-host on the
	 * build machine): no lib-* test moves pages. */
	(void)uffd; (void)dst; (void)src; (void)len; (void)mode;
	return -ENOSYS;
#endif

#ifdef UFFDIO_MOVE
	for (int tries = 0; tries < 100 && err == -EAGAIN; tries++) {
		struct uffdio_move mv = {
			.dst = (uintptr_t)dst, .src = (uintptr_t)src,
			.len = len, .mode = mode,
		};

		if (tries)
			usleep(1000);
		err = ioc(uffd, UFFDIO_MOVE, &mv);
	}
#endif
	return err;
}

long sys_move_pages(unsigned long count, void **pages, const int *nodes,
		    int *status, int flags)
{
	return syscall(SYS_move_pages, 0, count, pages, nodes, status, flags);
}

int uffd_zeropage(int uffd, void *dst, size_t len, uint64_t mode)
{
	struct uffdio_zeropage z = {
		.range = { .start = (uintptr_t)dst, .len = len },
		.mode = mode,
	};

	return ioc(uffd, UFFDIO_ZEROPAGE, &z);
}

int uffd_wake(int uffd, void *addr, size_t len)
{
	struct uffdio_range r = { .start = (uintptr_t)addr, .len = len };

	return ioc(uffd, UFFDIO_WAKE, &r);
}

int uffd_read_msg(int uffd, struct uffd_msg *msg, int timeout_ms)
{
	struct pollfd p = { .fd = uffd, .events = POLLIN };
	long long end = now_ms() + timeout_ms;

	for (;;) {
		long long left = end - now_ms();
		ssize_t n;
		int r;

		if (left < 0)
			left = 0;
		r = poll(&p, 1, left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return 0;
		n = read(uffd, msg, sizeof(*msg));
		if (n == sizeof(*msg))
			return 1;
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		return n < 0 ? -errno : -EIO;
	}
}

uint64_t pagemap_entry(void *addr)
{
	static int fd = -1;
	static pid_t owner;
	uint64_t e;

	/* After fork() the inherited fd still reads the parent's tables. */
	if (fd >= 0 && owner != getpid()) {
		close(fd);
		fd = -1;
	}
	if (fd < 0) {
		fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
		owner = getpid();
	}
	if (fd < 0)
		return 0;
	if (pread(fd, &e, sizeof(e), (uintptr_t)addr / page_size() * sizeof(e)) !=
	    sizeof(e))
		return 0;
	return e;
}

uint64_t pagemap_entry_fresh(void *addr)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	uint64_t e = 0;

	if (fd < 0)
		return 0;
	if (pread(fd, &e, sizeof(e), (uintptr_t)addr / page_size() * sizeof(e)) !=
	    sizeof(e))
		e = 0;
	close(fd);
	return e;
}

bool page_wp(void *addr)
{
	return pagemap_entry(addr) & PM_UFFD_WP;
}

size_t pages_with(void *addr, size_t len, uint64_t mask)
{
	return pages_matching(addr, len, mask, 0);
}

size_t pages_matching(void *addr, size_t len, uint64_t set, uint64_t clear)
{
	size_t n = 0;

	for (size_t off = 0; off < len; off += page_size()) {
		uint64_t e = pagemap_entry((char *)addr + off);

		n += (e & set) == set && !(e & clear);
	}
	return n;
}

/* A swap pagemap entry holds the swap type in bits 0-4, the offset above. */
#define PM_SWAP_TYPE(e)		((e) & 0x1f)
#define PM_SWAP_OFFSET(e)	(((e) & ((1ULL << 55) - 1)) >> 5)

bool pm_swapped(uint64_t e)
{
	return (e & PM_SWAP) && !(e & PM_PRESENT) && PM_SWAP_TYPE(e) == 0 &&
	       PM_SWAP_OFFSET(e) != 0;
}

size_t pages_swapped(void *addr, size_t len, uint64_t mask)
{
	size_t n = 0;

	for (size_t off = 0; off < len; off += page_size()) {
		uint64_t e = pagemap_entry((char *)addr + off);

		n += pm_swapped(e) && (e & mask) == mask;
	}
	return n;
}

int page_out(void *addr, size_t len, uint64_t mask)
{
	for (int tries = 0; tries < 20; tries++) {
		if (madvise(addr, len, MADV_PAGEOUT))
			return -errno;
		if (pages_swapped(addr, len, mask) == len / page_size())
			return 0;
		usleep(10000);
	}
	return -EAGAIN;
}

long smaps_field_kb(void *addr, const char *field)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	uintptr_t a = (uintptr_t)addr, lo, hi;
	char line[512];
	int inside = 0;
	long val = -1;
	size_t flen = strlen(field);

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 &&
		    strchr(line, '-') < strchr(line, ' ')) {
			inside = a >= lo && a < hi;
			continue;
		}
		if (inside && !strncmp(line, field, flen) && line[flen] == ':') {
			val = strtol(line + flen + 1, NULL, 10);
			break;
		}
	}
	fclose(f);
	return val;
}

void *map_anon_aligned(size_t len, size_t align)
{
	char *p = mmap(NULL, len + align, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uintptr_t start, end;

	if (p == MAP_FAILED)
		return NULL;
	start = ((uintptr_t)p + align - 1) & ~(align - 1);
	end = start + len;
	if (start > (uintptr_t)p)
		munmap(p, start - (uintptr_t)p);
	if ((uintptr_t)p + len + align > end)
		munmap((void *)end, (uintptr_t)p + len + align - end);
	return (void *)start;
}

static void *writer_main(void *arg)
{
	struct writer *w = arg;

	for (size_t off = 0; off < w->len; off += page_size())
		*(volatile char *)(w->addr + off) = w->val;
	__atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

int writer_start(struct writer *w, void *addr, size_t len, char val)
{
	w->addr = addr;
	w->len = len;
	w->val = val;
	w->done = 0;
	return -pthread_create(&w->thread, NULL, writer_main, w);
}

bool done_within(volatile int *done, int timeout_ms)
{
	long long end = now_ms() + timeout_ms;

	while (!__atomic_load_n(done, __ATOMIC_ACQUIRE)) {
		if (now_ms() >= end)
			return false;
		usleep(1000);
	}
	return true;
}

bool joined_within(pthread_t thread, volatile int *done, int timeout_ms)
{
	if (!done_within(done, timeout_ms))
		return false;
	pthread_join(thread, NULL);
	return true;
}

bool writer_wait(struct writer *w, int timeout_ms)
{
	if (!done_within(&w->done, timeout_ms))
		return false;
	if (w->done == 1) {	/* join once; later calls just report done */
		pthread_join(w->thread, NULL);
		w->done = 2;
	}
	return true;
}

bool writer_joined(struct writer *w, int timeout_ms)
{
	if (!w->addr)
		return true;
	if (!writer_wait(w, timeout_ms))
		return false;
	w->addr = NULL;
	return true;
}

static void *resolver_main(void *arg)
{
	struct resolver *r = arg;

	while (!r->stop) {
		struct uffd_msg msg;
		unsigned long addr;
		int n = uffd_read_msg(r->uffd, &msg, 50);

		if (n <= 0)
			continue;
		if (msg.event != UFFD_EVENT_PAGEFAULT ||
		    !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)) {
			r->other++;
			continue;
		}
		addr = msg.arg.pagefault.address & ~(page_size() - 1);
		r->last_flags = msg.arg.pagefault.flags;
		r->last_addr = addr;
		if (uffd_wp(r->uffd, (void *)addr, page_size(), 0))
			r->errors++;
		r->faults++;
	}
	return NULL;
}

int resolver_start(struct resolver *r, int uffd)
{
	memset(r, 0, sizeof(*r));
	r->uffd = uffd;
	return -pthread_create(&r->thread, NULL, resolver_main, r);
}

void resolver_stop(struct resolver *r)
{
	r->stop = 1;
	pthread_join(r->thread, NULL);
}

char why[512];

bool because(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return false;
}

bool because_with(const char *prefix)
{
	char reason[sizeof(why)];

	memcpy(reason, why, sizeof(reason));
	return because("%s: %s", prefix, reason);
}

const char *uffd_event_name(unsigned int event)
{
	switch (event) {
	case UFFD_EVENT_PAGEFAULT:	return "PAGEFAULT";
	case UFFD_EVENT_FORK:		return "FORK";
	case UFFD_EVENT_REMAP:		return "REMAP";
	case UFFD_EVENT_REMOVE:		return "REMOVE";
	case UFFD_EVENT_UNMAP:		return "UNMAP";
	default:			return "unknown";
	}
}

bool expect_fault(int uffd, const void *addr, uint64_t flags, int timeout_ms)
{
	struct uffd_msg msg;
	int n = uffd_read_msg(uffd, &msg, timeout_ms);

	if (n < 0)
		return because("reading the uffd: %s", strerror(-n));
	if (n == 0)
		return because("no message within %d ms (want a fault at %p "
			       "flags %#llx)", timeout_ms, addr,
			       (unsigned long long)flags);
	if (msg.event != UFFD_EVENT_PAGEFAULT)
		return because("event %s, want PAGEFAULT at %p",
			       uffd_event_name(msg.event), addr);
	if (msg.arg.pagefault.address != (uintptr_t)addr)
		return because("fault at %#llx, want %p",
			       (unsigned long long)msg.arg.pagefault.address,
			       addr);
	if (msg.arg.pagefault.flags != flags)
		return because("fault at %p: flags %#llx, want %#llx", addr,
			       (unsigned long long)msg.arg.pagefault.flags,
			       (unsigned long long)flags);
	return true;
}

bool expect_quiet(int uffd, int quiet_ms, const char *when)
{
	struct uffd_msg msg;
	int n = uffd_read_msg(uffd, &msg, quiet_ms);

	if (n < 0)
		return because("reading the uffd%s%s: %s", *when ? " " : "",
			       when, strerror(-n));
	if (n > 0)
		return because("unexpected %s message%s%s: flags %#llx addr "
			       "%#llx", uffd_event_name(msg.event),
			       *when ? " " : "", when,
			       (unsigned long long)msg.arg.pagefault.flags,
			       (unsigned long long)msg.arg.pagefault.address);
	return true;
}

bool protect_checked(int uffd, void *p, size_t len)
{
	int err = uffd_wp(uffd, p, len, UFFDIO_WRITEPROTECT_MODE_WP);
	size_t want = len / page_size(), got;

	if (err)
		return because("UFFDIO_WRITEPROTECT(MODE_WP) %p+%#zx: %s", p,
			       len, strerror(-err));
	got = pages_with(p, len, PM_UFFD_WP);
	if (got != want)
		return because("after MODE_WP %zu of %zu pages have PM_UFFD_WP",
			       got, want);
	return true;
}

void writer_release_wake(struct writer *w, int uffd, void *p, size_t len,
			 int timeout_ms, bool *stuck)
{
	uffd_wp(uffd, p, len, 0);
	uffd_wake(uffd, p, len);
	if (!writer_joined(w, timeout_ms)) {
		tap_diag("a writer thread is stuck; leaking its mapping");
		*stuck = true;
	}
}

static void on_alarm(int sig)
{
	static const char msg[] = "not ok 999 watchdog # the test program hung\n";

	(void)sig;
	if (write(1, msg, sizeof(msg) - 1) < 0)
		_exit(3);
	_exit(3);
}

void watchdog(int seconds)
{
	signal(SIGALRM, on_alarm);
	alarm(seconds);
}

long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

void fill_pattern(char *p, size_t len, unsigned int seed)
{
	unsigned int x = seed * 2654435761u + 1;

	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (char)x;
	}
}

long first_diff(const char *a, const char *b, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (a[i] != b[i])
			return i;
	return -1;
}

int pin_to_cpu0(void)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(0, &set);
	return sched_setaffinity(0, sizeof(set), &set) ? -errno : 0;
}

/* PAGEMAP_SCAN (PAGE_IS_HUGE) over [P, P + LEN). */
long pmd_mapped_blocks(void *p, size_t len)
{
#ifndef PAGEMAP_SCAN	/* host headers older than 6.7 */
	(void)p;
	(void)len;
	return -EOPNOTSUPP;
#else
	struct page_region vec[64];
	struct pm_scan_arg a = {
		.size = sizeof(a), .start = (uintptr_t)p,
		.end = (uintptr_t)p + len, .vec = (uintptr_t)vec,
		.vec_len = 64, .category_mask = PAGE_IS_HUGE,
		.return_mask = PAGE_IS_HUGE,
	};
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	long n, bytes = 0;

	if (fd < 0)
		return -errno;
	n = ioctl(fd, PAGEMAP_SCAN, &a);
	close(fd);
	if (n < 0)
		return -errno;
	for (long i = 0; i < n; i++)
		bytes += (long)(vec[i].end - vec[i].start);
	return bytes / (2L << 20);
#endif
}

char *pat_area_page(struct pat_area *a, int i)
{
	return a->base + (size_t)i * page_size();
}

/* LEN bytes of private anonymous memory, or NULL with because(). */
static char *map_private_rw(size_t len, const char *what)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p != MAP_FAILED)
		return p;
	because("mmap of the %s: %s", what, strerror(errno));
	return NULL;
}

bool pat_area_map(struct pat_area *a, int npages, char (*pattern)(int, size_t),
		  bool with_src)
{
	char *fill;

	memset(a, 0, sizeof(*a));
	a->uffd = -1;
	a->npages = npages;
	a->pattern = pattern;
	a->len = (size_t)npages * page_size();
	a->base = map_private_rw(a->len, "area");
	if (!a->base)
		return false;
	fill = a->base;
	if (with_src) {
		a->src = map_private_rw(a->len, "source");
		if (!a->src)
			return false;
		fill = a->src;
	}
	for (int i = 0; i < npages; i++)
		for (size_t off = 0; off < (size_t)page_size(); off++)
			fill[(size_t)i * page_size() + off] = pattern(i, off);
	return true;
}

void pat_area_teardown(struct pat_area *a)
{
	if (a->uffd >= 0)
		close(a->uffd);
	a->uffd = -1;
	if (a->base && !a->stuck)
		munmap(a->base, a->len);
	if (a->src)
		munmap(a->src, a->len);
}

bool pat_area_holds(struct pat_area *a, int i, bool written, char val)
{
	const char *page = pat_area_page(a, i);

	for (size_t off = 0; off < (size_t)page_size(); off++) {
		char want = written && !off ? val : a->pattern(i, off);

		if (page[off] != want)
			return because("page %d byte %zu is %#x, want %#x", i,
				       off, (unsigned char)page[off],
				       (unsigned char)want);
	}
	return true;
}

int write_knob(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC), err = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, val, strlen(val)) != (ssize_t)strlen(val))
		err = -errno;
	close(fd);
	return err;
}

int ksm_set(const char *name, const char *val)
{
	char path[128];

	snprintf(path, sizeof(path), "/sys/kernel/mm/ksm/%s", name);
	return write_knob(path, val);
}

long ksm_get(const char *name)
{
	char path[128], buf[32] = "";
	long v = -1;
	int fd;

	snprintf(path, sizeof(path), "/sys/kernel/mm/ksm/%s", name);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	if (read(fd, buf, sizeof(buf) - 1) > 0)
		v = strtol(buf, NULL, 10);
	close(fd);
	return v;
}
