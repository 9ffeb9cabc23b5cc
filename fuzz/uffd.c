// SPDX-License-Identifier: GPL-2.0
/*
 * fuzz-uffd: a seeded random walk over the userfaultfd / uffd-wp uAPI.
 *
 *   fuzz-uffd [--seed N] [--ops N] [--seconds S] [--ring]
 *
 * The main thread draws every operation from a deterministic PRNG (seed
 * printed first, so a failure replays with the same --seed and --ops):
 * userfaultfd() with random flags, UFFDIO_API with random feature sets,
 * REGISTER/UNREGISTER/WRITEPROTECT/COPY/ZEROPAGE/WAKE/CONTINUE with valid
 * and hostile arguments, PAGEMAP_SCAN, the write-log ring ioctls (only when
 * UFFDIO_API reports UFFD_FEATURE_WP_RING), mmap/munmap/mremap/madvise and
 * fork, while two writer threads store into the same pages and a resolver
 * thread answers every sync fault (and reads every event) on every fd of a
 * small pool.  The main thread's own writes go to word 0 of each page, the
 * writers' to other words, so word 0 has a shadow value the main thread
 * knows exactly.
 *
 * Invariants (one TAP case per family):
 *  readback   word 0 of every page the main thread touches equals its shadow
 *             (before and after its own write): no write is ever lost;
 *  wp-cleared a write of the main thread that returned leaves no uffd-wp bit
 *             in pagemap (sync: the resolver unprotected it; async: the
 *             kernel did; unregistered: no bit may be left behind), and an
 *             async-registered page is then reported by PAGEMAP_SCAN as
 *             PAGE_IS_WRITTEN;
 *  sigbus     SIGBUS only while some fd of the pool has UFFD_FEATURE_SIGBUS,
 *             never SIGSEGV, and the word is unchanged after it;
 *  ioctl      every failing call returns -1 with an errno the kernel can
 *             return for that operation (its ERR_* set below), and calls
 *             that must fail (unaligned, zero length, unknown mode or
 *             feature bits, unmapped addresses, CONTINUE on anonymous
 *             memory, a second UFFDIO_API) do fail;
 *  fork       each forked child sees the parent's words, its own writes read
 *             back, and it exits 0 in time;
 *  ring       header and entries are sane, hostile ring calls fail.
 * A watchdog (alarm, re-armed every operation) fails the run if one
 * operation takes more than STALL_S seconds.
 */
#define _GNU_SOURCE
#include "uffd.h"

/* ---- driver ------------------------------------------------------------- */

struct op { void (*fn)(void); unsigned int weight; const char *name; };

static long long now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

#define OP(fn, w) { fn, w, #fn }
static const struct op ops[] = {
	OP(op_write, 110), OP(op_read, 100), OP(op_writeprotect, 70),
	OP(op_register, 100), OP(op_unregister, 40), OP(op_copy_zero, 80),
	OP(op_wake_continue, 180), OP(op_wrong_fd, 120), OP(op_scan, 100),
	OP(op_api_garbage, 50), OP(op_slot_reopen, 4), OP(op_madvise, 10),
	OP(op_remap_region, 5), OP(op_mremap, 5), OP(op_fork, 1),
	OP(op_ring, 60),
};
#define NOPS (sizeof(ops) / sizeof(ops[0]))
static long long op_us[NOPS];
static unsigned long op_n[NOPS];

/* For a hang report: where each thread sleeps in the kernel. */
static void dump_tasks(void)
{
	char path[300], buf[2048];
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n, fd;

	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/stack",
			 e->d_name);
		fd = open(path, O_RDONLY);
		if (fd < 0)
			continue;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		for (int i = 0; i < n; i++)
			if (buf[i] == '\n')
				buf[i] = '|';
		printf("# task %s stack %.*s\n", e->d_name, n > 0 ? n : 0, buf);
	}
	if (d)
		closedir(d);
	for (int i = 0; i < NWRITERS; i++)
		printf("# writer %d at %#lx\n", i, writer_at[i]);
	printf("# resolver at %d, %d pending; last fault %#lx wp %lu err %d "
	       "seen %lu times in a row\n", resolver_at, npend, last_addr,
	       last_flags, last_err, last_count);
	{
		FILE *f = fopen("/proc/self/maps", "r");

		while (f && fgets(buf, sizeof(buf), f))
			printf("# maps %s", buf);
	}
	printf("# pagemap of last fault %#" PRIx64 "\n",
	       pagemap_entry((void *)last_addr));
}

static void on_alarm(int sig)
{
	char buf[160];
	int n;

	(void)sig;
	signal(SIGALRM, SIG_DFL);	/* a dump that deadlocks still ends */
	alarm(10);
	dump_tasks();
	n = snprintf(buf, sizeof(buf), "not ok 99 fuzz-watchdog # op %lu (%s) "
		     "took over %d s; replay with --seed %" PRIu64 "\n",
		     op_index, op_name, STALL_S, seed);
	if (write(1, buf, n) < 0)
		_exit(3);
	n = snprintf(buf, sizeof(buf), "# fuzz: ops=%lu seed=%" PRIu64
		     " invariant_failures=%lu hung\n", op_index, seed,
		     total_fails + 1);
	if (write(1, buf, n) < 0)
		_exit(3);
	_exit(3);
}

static void usage(void)
{
	fprintf(stderr, "usage: fuzz-uffd [--seed N] [--ops N] [--seconds S] "
		"[--ring]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	unsigned long nops = 100000, total_w = 0;
	long seconds = 0;
	long long start, deadline = 0;
	pthread_t res, wr[NWRITERS];
	pthread_rwlockattr_t ra;
	struct sigaction sa = { .sa_handler = on_fault, .sa_flags = SA_NODEFER };
	uint64_t got = 0;
	int fd;

	seed = 1;
	for (int i = 1; i < argc; i++) {
		char *end = NULL;

		if (!strcmp(argv[i], "--ring")) {
			want_ring = true;
			continue;
		}
		if (i + 1 >= argc)
			usage();
		if (!strcmp(argv[i], "--seed"))
			seed = strtoull(argv[++i], &end, 0);
		else if (!strcmp(argv[i], "--ops"))
			nops = strtoul(argv[++i], &end, 0);
		else if (!strcmp(argv[i], "--seconds"))
			seconds = strtol(argv[++i], &end, 0);
		else
			usage();
		if (!end || *end)
			usage();
	}
	if (seconds > 0 && nops == 100000)
		nops = ~0UL;
	psz = page_size();
	rs = seed;
	setvbuf(stdout, NULL, _IONBF, 0);
	if (nops == ~0UL)
		tap_diag("fuzz-uffd seed=%" PRIu64 " ops=unbounded seconds=%ld "
			 "ring=%d (replay: fuzz-uffd --seed %" PRIu64 " --ops N, "
			 "N from the summary line)", seed, seconds, want_ring,
			 seed);
	else
		tap_diag("fuzz-uffd seed=%" PRIu64 " ops=%lu seconds=%ld ring=%d "
			 "(replay: fuzz-uffd --seed %" PRIu64 " --ops %lu)", seed,
			 nops, seconds, want_ring, seed, nops);
	tap_plan(1 + F_N);
	signal(SIGALRM, on_alarm);
	alarm(STALL_S);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);

	fd = uffd_open_flags(O_CLOEXEC | O_NONBLOCK, 0, &got);
	if (fd < 0)
		tap_bail("userfaultfd: %s", strerror(-fd));
	close(fd);
	kernel_features = got;
	have_ring = got & UFFD_FEATURE_WP_RING;
	tap_diag("kernel features %#" PRIx64 "%s", got,
		 have_ring ? " (with WP_RING)" : " (no WP_RING: ring ops off)");
	scan_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	src_buf = map_anon_aligned(SRC_PAGES * psz, psz);
	zero_page = map_anon_aligned(psz, psz);
	if (scan_fd < 0 || !src_buf || !zero_page)
		tap_bail("setup: %s", strerror(errno));
	for (int i = 0; i < SRC_PAGES; i++)
		*(uint64_t *)(src_buf + i * psz) = 0xc0b1000000ULL + i;
	for (int i = 0; i < NSLOTS; i++)
		slots[i].fd = -1;
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra,
		PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&map_lock, &ra);
	for (int i = 0; i < NREGIONS; i++)
		region_new(&regions[i]);
	for (int i = 0; i < NSLOTS; i++)
		op_slot_reopen();
	if (pthread_create(&res, NULL, resolver_main, NULL))
		tap_bail("pthread_create failed");
	for (long i = 0; i < NWRITERS; i++)
		if (pthread_create(&wr[i], NULL, writer_main, (void *)i))
			tap_bail("pthread_create failed");

	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		total_w += ops[i].weight;
	start = now_ms();
	if (seconds > 0)
		deadline = start + seconds * 1000LL;
	for (op_index = 0; op_index < nops; op_index++) {
		unsigned long w = rnd(total_w);
		long long t0;
		size_t k = 0;

		if ((op_index & 255) == 0) {
			alarm(STALL_S);
			if (deadline && now_ms() >= deadline)
				break;
		}
		while (w >= ops[k].weight)
			w -= ops[k++].weight;
		if (ops[k].fn == op_ring && !have_ring)
			continue;
		t0 = now_us();
		ops[k].fn();
		op_us[k] += now_us() - t0;
		op_n[k]++;
	}
	/* Writers first: one may wait on a fault only the resolver answers. */
	op_name = "shutdown";
	stop_writers = 1;
	for (int i = 0; i < NWRITERS; i++)
		pthread_join(wr[i], NULL);
	stop_threads = 1;
	pthread_join(res, NULL);
	/* Final sweep: every word 0 the main thread wrote is still there. */
	for (int i = 0; i < NREGIONS; i++)
		for (size_t p = 0; regions[i].addr && p < regions[i].npages; p++)
			if (regions[i].shadow[p])
				check_word(&regions[i], p, "final sweep");
	for (int i = 0; i < NSLOTS; i++)
		slot_close(&slots[i]);

	for (size_t k = 0; k < NOPS; k++)
		if (op_n[k])
			tap_diag("%-18s %7lu ops %8lld ms", ops[k].name, op_n[k],
				 op_us[k] / 1000);
	if (have_ring)
		tap_diag("ring: %lu fds with WP_RING (last open error %d), %lu "
			 "rings set up (last valid-setup error %d)", ring_opens,
			 (int)ring_open_err, ring_setups, (int)ring_setup_err);
	tap_diag("UFFDIO_ZEROPAGE refused (EEXIST) a MISSING fault on a "
		 "uffd-wp marker %lu times; resolved with UFFDIO_COPY",
		 zeropage_marker_refusals);
	{
		char name[96];

		/* The counts go after "#": collect.py keeps the case name. */
		snprintf(name, sizeof(name), "fuzz-ops # %lu ops in %lld ms",
			 op_index, now_ms() - start);
		tap_pass(name);
	}
	for (int f = 0; f < F_N; f++) {
		char name[96];

		snprintf(name, sizeof(name), "%s # %lu checks", family_name[f],
			 checks[f]);
		if (f == F_RING && !have_ring) {
			if (want_ring)
				tap_fail(family_name[f], "--ring given but the "
					 "kernel does not report "
					 "UFFD_FEATURE_WP_RING");
			else
				tap_skip(family_name[f], "kernel does not report "
					 "UFFD_FEATURE_WP_RING");
			continue;
		}
		if (fails[f])
			tap_fail(family_name[f], "%lu of %lu checks failed (see "
				 "FAIL lines; replay with --seed %" PRIu64 ")",
				 fails[f], checks[f], seed);
		else
			tap_pass(name);
	}
	printf("# fuzz: ops=%lu seed=%" PRIu64 " invariant_failures=%lu\n",
	       op_index, seed, total_fails);
	alarm(0);
	return tap_done();
}
