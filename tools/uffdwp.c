// SPDX-License-Identifier: GPL-2.0
/*
 * uffdwp: what libuffdwp can do on this kernel, and a live-snapshot demo.
 *
 *   uffdwp info
 *   uffdwp demo [--size-mib N] [--threads N] [--out FILE] [--cap-mib N]
 *               [--write-s N]
 *   uffdwp restore --out IMAGE BASE [DELTA...]
 *
 * demo: N writer threads keep updating versioned records in an arena while
 * a snapshot is taken with libuffdwp (streamed to FILE) and then one with
 * fork() (the child writes FILE.fork), three rounds of each; each file is
 * checked record by record against its snapshot instant (see
 * workload/workload.c), and the two are compared by their medians: pause,
 * extra memory, worst write.  Progress is printed every 2 s.  The
 * writers stop --write-s seconds after a libuffdwp snapshot's instant
 * (default 20, 0: they run until the copy is done) so a slow guest still
 * finishes; the copy and the check are the same either way.  Then, where
 * the kernel has UFFDIO_SET_MODE, a base taken with pre-copy
 * (uffdwp_session_precopy()), and a session (a base, and a delta after 1%
 * was written), each checked the same way.  The last line names the files and how to restore one.
 * Exit 0 only if everything verified; 1 if not; 2 on bad arguments.
 *
 * restore: rebuild the memory image a session's snapshot files describe
 * (the regions one after the other, in address order) from a base and its
 * deltas in epoch order, into IMAGE.  When a delta says the session's
 * regions changed (UFFDWP_FILE_REGIONS_CHANGED), the image takes that
 * delta's regions from then on (a region kept keeps its bytes).  Exit 0 when every file applied; 1
 * when one could not be (the message names the file and the reason); 2 on
 * bad arguments.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "uffdwp.h"
#include "workload.h"

#define USAGE_INFO "usage: uffdwp info\n"
#define USAGE_DEMO \
	"usage: uffdwp demo [--size-mib N] [--threads N] [--out FILE] [--cap-mib N]\n" \
	"                   [--write-s N]\n"
#define USAGE_RESTORE "usage: uffdwp restore --out IMAGE BASE [DELTA...]\n"

static int usage(const char *fmt, const char *arg)
{
	if (fmt) {
		fprintf(stderr, "uffdwp: ");
		fprintf(stderr, fmt, arg);
		fprintf(stderr, "\n");
	}
	/* the three usages, "usage: " written once */
	fprintf(stderr, "%s       %s       %s       uffdwp --version | --help | COMMAND --help\n",
		USAGE_INFO, USAGE_DEMO + 7, USAGE_RESTORE + 7);
	return 2;
}

/* COMMAND --help: its usage and what it does, on stdout. */
static int help(const char *cmd)
{
	if (!strcmp(cmd, "info"))
		printf(USAGE_INFO
		       "Print the kernel's userfaultfd features, the tracker backends\n"
		       "available here and the one AUTO would choose.\n");
	else if (!strcmp(cmd, "demo"))
		printf(USAGE_DEMO
		       "Snapshot an arena of versioned records while writer threads update\n"
		       "it, with fork() and with libuffdwp side by side (pause, extra\n"
		       "memory, worst write), then a pre-copied base and a session's base\n"
		       "and delta; each file is checked record by record against its\n"
		       "instant.  --size-mib: arena size (64); --threads: writers (2);\n"
		       "--out: snapshot file (/tmp/uffdwp-demo.snap); --cap-mib: side\n"
		       "buffer cap (16); --write-s: stop writers this long after the\n"
		       "instant (20, 0 never).  Exit 0 only if verified, 2 on bad\n"
		       "arguments.\n");
	else
		printf(USAGE_RESTORE
		       "Rebuild a memory image (the regions one after the other, in\n"
		       "address order) from a session's base and its deltas, in epoch\n"
		       "order.  Every file's checksums are verified (format 2).\n");
	return 0;
}

static bool wants_help(int argc, char **argv)
{
	for (int i = 2; i < argc; i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return true;
	return false;
}

static const char *yes(bool b)
{
	return b ? "yes" : "no";
}

static int cmd_info(void)
{
	struct uffdwp_features f;
	char names[256];

	uffdwp_probe(&f);
	uffdwp_feature_names(&f, names, sizeof(names));
	printf("libuffdwp %d.%d\n", UFFDWP_VERSION_MAJOR, UFFDWP_VERSION_MINOR);
	printf("userfaultfd via /dev/userfaultfd: %s\n", yes(f.device));
	printf("userfaultfd via syscall:          %s\n", yes(f.syscall));
	printf("UFFDIO_API features:              %#llx\n",
	       (unsigned long long)f.api_features);
	printf("sync write-protect (snapshots):   %s\n", yes(f.wp));
	printf("WP_UNPOPULATED:                   %s\n", yes(f.wp_unpopulated));
	printf("WP_ASYNC:                         %s\n", yes(f.wp_async));
	printf("PAGEMAP_SCAN:                     %s\n", yes(f.pagemap_scan));
	printf("WP_RING write log:                %s\n", yes(f.wp_ring));
	printf("soft-dirty:                       %s\n", yes(f.soft_dirty));
	printf("transparent hugepages:            %s\n", yes(f.thp));
	printf("kernel-mode faults allowed:       %s\n", yes(f.kernel_faults));
	printf("features: %s\n", names);
	if (!f.wp)
		printf("snapshot: unavailable (no sync write-protect on anonymous memory)\n");
	else if (f.kernel_faults)
		printf("snapshot: available\n");
	else
		printf("snapshot: available, user-mode faults only (read(2) and other system calls writing into memory being snapshotted fail with EFAULT; allow with CAP_SYS_PTRACE, vm.unprivileged_userfaultfd=1 or access to /dev/userfaultfd)\n");
	printf("tracker backends:");
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++) {
		int err = uffdwp_backend_available(b);

		printf(" %s=%s", uffdwp_backend_name(b),
		       err ? strerror(-err) : "ok");
	}
	printf("\ntracker backend chosen: %s\n",
	       uffdwp_backend_name(uffdwp_backend_choose()));
	return 0;
}

static bool parse_num(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return false;
	*out = v;
	return true;
}

/*
 * The session part of the demo: a base with the writers running, then a
 * delta after they wrote 1% of the pages, both checked.  Returns 0 when
 * both verified.
 */
static int demo_session(struct wl *wl, const char *out)
{
	struct wl_result base, delta;
	char bpath[PATH_MAX], dpath[PATH_MAX];
	uint64_t pages = 0;
	int err;

	snprintf(bpath, sizeof(bpath), "%s.base", out);
	snprintf(dpath, sizeof(dpath), "%s.delta", out);
	printf("session: a base with the writers running, then a delta after they wrote 1%% of the pages (%s, %s)\n",
	       bpath, dpath);
	err = wl_start(wl);
	if (!err) {
		usleep(100000);
		err = wl_snap_session(wl, bpath, dpath, 10, &base, &delta,
				      &pages);
	}
	if (err) {
		fprintf(stderr, "uffdwp demo: session: %s\n", strerror(-err));
		return 1;
	}
	printf("base:  pause %.1f us, total %.1f ms, %llu write faults\n",
	       base.pause_us, base.total_ms, (unsigned long long)base.faults);
	printf("delta: %llu pages (%.2f%% of the arena), pause %.1f us (%.1f%% of the base's), total %.1f ms (%.1f%%), file %s\n",
	       (unsigned long long)pages,
	       100.0 * (double)pages * (double)sysconf(_SC_PAGESIZE) / (double)wl->len,
	       delta.pause_us, base.pause_us > 0 ? 100 * delta.pause_us / base.pause_us : 0,
	       delta.total_ms, base.total_ms > 0 ? 100 * delta.total_ms / base.total_ms : 0,
	       dpath);
	if (base.verified)
		printf("verdict (base):  VERIFIED - the base is the arena at its instant\n");
	else
		printf("verdict (base):  FAILED - %s\n", base.why);
	if (delta.verified)
		printf("verdict (delta): VERIFIED - base + deltas are the arena at the delta's instant\n");
	else
		printf("verdict (delta): FAILED - %s\n", delta.why);
	return base.verified && delta.verified ? 0 : 1;
}

/*
 * The pre-copy part of the demo: a base taken with pre-copy rounds while
 * the writers run paced (8 updates per ms each), checked; its pause next
 * to the median ones of the libuffdwp snapshots (PAUSE_US) and of fork
 * (FORK_PAUSE_US).  Returns 0 when verified or when the kernel cannot
 * pre-copy (said so).
 */
static int demo_precopy(struct wl *wl, const char *out, double pause_us,
			double fork_pause_us)
{
	struct uffdwp_snapshot_stats st = { 0 };
	struct uffdwp_features f;
	char path[PATH_MAX];
	struct wl_result res;
	int err;

	uffdwp_probe(&f);
	if (!f.set_mode || !f.wp_ring) {
		printf("pre-copy: not available on this kernel (set_mode %d, wp_ring %d)\n",
		       f.set_mode, f.wp_ring);
		return 0;
	}
	snprintf(path, sizeof(path), "%s.precopy", out);
	printf("pre-copy: a base copied in rounds while the writers run (each paced at 8 updates/ms), then a pause for what they wrote in the last round (%s)\n",
	       path);
	wl->rate_per_ms = 8;
	err = wl_start(wl);
	if (!err) {
		usleep(100000);
		err = wl_snap_precopy(wl, path, &res, &st);
	}
	wl_stop(wl);
	wl->rate_per_ms = 0;
	if (err) {
		fprintf(stderr, "uffdwp demo: pre-copy: %s\n", strerror(-err));
		return 1;
	}
	printf("pre-copy: %llu rounds wrote %llu pages (%.0f%% of the arena), the instant protected %llu\n",
	       (unsigned long long)st.precopy_rounds,
	       (unsigned long long)st.precopy_pages,
	       100.0 * (double)st.precopy_pages * (double)sysconf(_SC_PAGESIZE) /
	       (double)wl->len, (unsigned long long)st.pages_copied);
	printf("pre-copy: pause %.1f us (the snapshots' median: %.1f us, %.1fx; fork's: %.1f us, %.1fx), worst write %.1f us, total %.1f ms\n",
	       res.pause_us, pause_us,
	       res.pause_us > 0 ? pause_us / res.pause_us : 0, fork_pause_us,
	       res.pause_us > 0 ? fork_pause_us / res.pause_us : 0, res.max_us,
	       res.total_ms);
	if (res.verified) {
		printf("verdict (pre-copied base): VERIFIED - the pre-copied base is the arena at its instant\n");
		return 0;
	}
	printf("verdict (pre-copied base): FAILED - %s\n", res.why);
	return 1;
}

/* How libuffdwp's U compares with fork's F, for the comparison table. */
static const char *times(char *buf, size_t len, double f, double u)
{
	if (f > 0 && u > 0 && f >= u)
		snprintf(buf, len, "libuffdwp %.1fx less", f / u);
	else if (f > 0 && u > 0)
		snprintf(buf, len, "libuffdwp %.1fx more", u / f);
	else
		snprintf(buf, len, "-");
	return buf;
}

/* Rounds of fork and libuffdwp, taken in turn: the table shows medians. */
#define DEMO_ROUNDS	3

static double median3(double a, double b, double c)
{
	return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

/* The median of field F over the three results R. */
#define MED(r, f)	median3((r)[0].f, (r)[1].f, (r)[2].f)

/*
 * fork() beside libuffdwp: the same arena, the same writers, DEMO_ROUNDS
 * snapshots each; the medians of the pause, the extra memory, the worst
 * single write (the writers' longest update while the snapshot ran) and
 * the total, and the verdicts (VERIFIED only if every round's file was
 * the arena at its instant).
 */
static void demo_compare(const struct wl_result *f, const struct wl_result *u,
			 bool f_ok, bool u_ok)
{
	char b[64];

	printf("\n%-22s %14s %14s   (median of %d rounds each)\n", "",
	       "fork()", "libuffdwp", DEMO_ROUNDS);
	printf("%-22s %11.1f us %11.1f us   %s\n", "pause", MED(f, pause_us),
	       MED(u, pause_us),
	       times(b, sizeof(b), MED(f, pause_us), MED(u, pause_us)));
	printf("%-22s %10.2f MiB %10.2f MiB   %s\n", "extra memory (peak)",
	       MED(f, extra_mib), MED(u, extra_mib),
	       times(b, sizeof(b), MED(f, extra_mib), MED(u, extra_mib)));
	printf("%-22s %11.1f us %11.1f us   %s\n", "worst write",
	       MED(f, max_us), MED(u, max_us),
	       times(b, sizeof(b), MED(f, max_us), MED(u, max_us)));
	printf("%-22s %11.1f ms %11.1f ms\n", "snapshot total",
	       MED(f, total_ms), MED(u, total_ms));
	printf("%-22s %14s %14s\n\n", "verdict", f_ok ? "VERIFIED" : "FAILED",
	       u_ok ? "VERIFIED" : "FAILED");
}

static int cmd_demo(int argc, char **argv)
{
	long size_mib = 64, threads = 2, cap_mib = 16, write_s = 20;
	const char *out = "/tmp/uffdwp-demo.snap";
	struct wl_result res, fres[DEMO_ROUNDS], ures[DEMO_ROUNDS];
	bool fork_ok = true, uffdwp_ok = true;
	char fork_path[PATH_MAX];
	struct wl wl;
	int err;

	for (int i = 2; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		long *num = NULL, min = 1, max = 0;

		if (!strcmp(o, "--size-mib"))
			num = &size_mib, max = 1L << 20;
		else if (!strcmp(o, "--threads"))
			num = &threads, max = 64;
		else if (!strcmp(o, "--cap-mib"))
			num = &cap_mib, max = 1L << 20;
		else if (!strcmp(o, "--write-s"))
			num = &write_s, min = 0, max = 3600;
		else if (strcmp(o, "--out"))
			return usage("unknown option '%s'", o);
		if (!v)
			return usage("option '%s' needs a value", o);
		if (num && !parse_num(v, min, max, num))
			return usage("bad number '%s'", v);
		if (!num && !*v)
			return usage("empty file name for --out%s", "");
		if (!num)
			out = v;
		i++;
	}
	if ((size_t)size_mib << 20 < (size_t)threads * 2 * sizeof(struct wl_rec))
		return usage("arena too small for the threads%s", "");

	printf("demo: %ld MiB arena, %ld writer thread(s), side buffer cap %ld MiB, snapshot to %s\n",
	       size_mib, threads, cap_mib, out);
	if (write_s)
		printf("demo: writers stop %ld s after the snapshot instant if the copy is still running\n",
		       write_s);
	err = wl_init(&wl, (size_t)size_mib << 20, (int)threads, true);
	wl.progress = stdout;
	wl.progress_ms = 2000;
	wl.write_ms = (unsigned int)write_s * 1000;
	if (err) {
		fprintf(stderr, "uffdwp demo: setting up the arena: %s\n",
			strerror(-err));
		wl_destroy(&wl);
		return 1;
	}
	snprintf(fork_path, sizeof(fork_path), "%s.fork", out);
	printf("%d rounds: libuffdwp (to %s), then fork (the child writes the arena to %s), the writers running\n",
	       DEMO_ROUNDS, out, fork_path);
	for (int r = 0; r < DEMO_ROUNDS; r++) {
		/*
		 * libuffdwp first: it keeps the arena's huge pages (a write
		 * saves and unprotects a whole block), while fork()'s
		 * copy-on-write splits them, so its first round is the one
		 * on the huge-page arena, shown in detail (with progress).
		 */
		wl.progress = r == 0 ? stdout : NULL;
		err = wl_start(&wl);
		if (!err) {
			usleep(100000);		/* writers at full speed */
			err = wl_snap_uffdwp(&wl, out, (size_t)cap_mib << 20,
					     &ures[r]);
		}
		wl_stop(&wl);
		if (err) {
			fprintf(stderr, "uffdwp demo: snapshot: %s\n",
				strerror(-err));
			wl_destroy(&wl);
			return 1;
		}
		printf("round %d: libuffdwp pause %10.1f us, extra %6.2f MiB, worst write %10.1f us: %s\n",
		       r + 1, ures[r].pause_us, ures[r].extra_mib,
		       ures[r].max_us, ures[r].verified ? "verified" : ures[r].why);
		uffdwp_ok &= ures[r].verified;
		err = wl_start(&wl);
		if (!err) {
			usleep(100000);
			err = wl_snap_fork(&wl, fork_path, &fres[r]);
		}
		wl_stop(&wl);
		if (err) {
			fprintf(stderr, "uffdwp demo: fork snapshot: %s\n",
				strerror(-err));
			wl_destroy(&wl);
			return 1;
		}
		printf("round %d: fork      pause %10.1f us, extra %6.2f MiB, worst write %10.1f us: %s\n",
		       r + 1, fres[r].pause_us, fres[r].extra_mib,
		       fres[r].max_us, fres[r].verified ? "verified" : fres[r].why);
		fork_ok &= fres[r].verified;
	}
	res = ures[0];
	printf("the first libuffdwp round in detail:\n");
	printf("pause (protect phase):   %.1f us\n", res.pause_us);
	printf("snapshot total:          %.1f ms (writers ran %.1f ms of it)\n",
	       res.total_ms, res.write_ms);
	printf("writer updates meanwhile: %llu; latency p50 %.2f us, p99 %.2f us, max %.1f us\n",
	       (unsigned long long)res.updates, res.p50_us, res.p99_us,
	       res.max_us);
	printf("write faults handled:    %llu (pages saved before copy: %llu in the side buffer, %llu spilled; no writer waits for the copier)\n",
	       (unsigned long long)res.faults, (unsigned long long)res.saved,
	       (unsigned long long)res.spilled);
	printf("huge pages:              %llu PMD-mapped 2 MiB blocks at the instant, %llu written and saved whole (kept huge)\n",
	       (unsigned long long)res.huge_blocks,
	       (unsigned long long)res.huge_saves);
	printf("longest fault handling:  %.1f us (the worst write adds the pause and the wake-up)\n",
	       res.fault_max_us);
	printf("extra memory (peak):     %.2f MiB\n", res.extra_mib);
	printf("records checked:         %llu (%llu caught mid-update)\n",
	       (unsigned long long)wl.nrec, (unsigned long long)res.torn);
	if (res.verified)
		printf("verdict: VERIFIED - the file is the arena at the snapshot instant\n");
	else
		printf("verdict: FAILED - %s\n", res.why);
	demo_compare(fres, ures, fork_ok, uffdwp_ok);
	res.verified = fork_ok && uffdwp_ok;
	if (res.verified && demo_precopy(&wl, out, MED(ures, pause_us),
					 MED(fres, pause_us)))
		res.verified = false;
	if (res.verified && demo_session(&wl, out))
		res.verified = false;
	wl_destroy(&wl);
	printf("files: %s (libuffdwp) and %s (fork) hold the raw arena; %s.precopy and %s.base are snapshot files "
	       "(%s.delta follows a delta kept in memory); rebuild the arena from one: uffdwp restore --out /tmp/arena.img %s.base\n",
	       out, fork_path, out, out, out, out);
	return res.verified ? 0 : 1;
}

static const char *load_error(int err)
{
	switch (err) {
	case -EBADMSG:
		return "not a uffdwp snapshot file, truncated, or a checksum does not match (the file was changed)";
	case -EPROTONOSUPPORT:
		return "snapshot format version (or byte order) this build cannot read";
	case -ESTALE:
		return "not the next delta of the files before it (wrong session or epoch)";
	case -EINVAL:
		return "its regions differ from the base's";
	default:
		return strerror(-err);
	}
}

/* After an error: the regions FILE records, next to those of BASE (whose
 * lengths are in DST; their addresses are the image's by now). */
static void print_ranges(const char *file, const struct uffdwp_region *dst,
			 int n, const char *base)
{
	struct uffdwp_snapshot_info info;
	struct uffdwp_region r[8];
	int fd = open(file, O_RDONLY | O_CLOEXEC);
	int got = fd < 0 ? -errno : uffdwp_snapshot_read_info(fd, &info, r, 8);

	if (fd >= 0)
		close(fd);
	for (int k = 0; k < got && k < 8; k++)
		fprintf(stderr, "uffdwp restore: %s: region %d: %p-%p (%zu bytes)%s\n",
			file, k, r[k].addr, (char *)r[k].addr + r[k].len,
			r[k].len, k < n && dst[k].len != r[k].len ?
			" (length differs from the base's)" : "");
	for (int k = 0; k < n && k < 8 && strcmp(file, base); k++)
		fprintf(stderr, "uffdwp restore: %s: region %d: %zu bytes at image offset %zu\n",
			base, k, dst[k].len,
			(size_t)((char *)dst[k].addr - (char *)dst[0].addr));
}

/*
 * The image being rebuilt: the regions of the last file applied, one
 * after the other in address order (REC: their recorded addresses; DST:
 * where each lies in IMG).
 */
struct image {
	int n;
	struct uffdwp_region *rec, *dst;
	char *img;
	size_t total;
};

static void image_free(struct image *im)
{
	if (im->img && im->img != MAP_FAILED)
		munmap(im->img, im->total ? im->total : 1);
	free(im->rec);
	free(im->dst);
	memset(im, 0, sizeof(*im));
}

/*
 * The image laid out for the regions FILE (open as FD) records; a region
 * the image had already (same address and length) keeps its bytes, a new
 * one starts as zeroes (a delta after the regions changed stores it in
 * full).  0 or -errno.
 */
static int image_layout(struct image *im, int fd)
{
	struct uffdwp_snapshot_info info;
	struct image nw = { 0 };
	int n = uffdwp_snapshot_read_info(fd, &info, NULL, 0);

	if (n > 0) {
		nw.rec = calloc((size_t)n, sizeof(*nw.rec));
		nw.dst = calloc((size_t)n, sizeof(*nw.dst));
		n = nw.rec && nw.dst ?
		    uffdwp_snapshot_read_info(fd, &info, nw.rec, (size_t)n) :
		    -ENOMEM;
	}
	if (n < 0) {
		image_free(&nw);
		return n;
	}
	nw.n = n;
	for (int k = 0; k < n; k++)
		nw.total += nw.rec[k].len;
	nw.img = mmap(NULL, nw.total ? nw.total : 1, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (nw.img == MAP_FAILED) {
		image_free(&nw);
		return -ENOMEM;
	}
	for (size_t off = 0, k = 0; k < (size_t)n; off += nw.rec[k++].len) {
		nw.dst[k] = (struct uffdwp_region){ nw.img + off, nw.rec[k].len };
		for (int j = 0; j < im->n; j++)
			if (im->rec[j].addr == nw.rec[k].addr &&
			    im->rec[j].len == nw.rec[k].len)
				memcpy(nw.dst[k].addr, im->dst[j].addr,
				       nw.rec[k].len);
	}
	image_free(im);
	*im = nw;
	return 0;
}

/* All of the image into OUT: 0 or -errno. */
static int image_write(const struct image *im, const char *out)
{
	int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int err = fd < 0 ? -errno : 0;

	for (size_t done = 0; !err && done < im->total;) {
		ssize_t n = write(fd, im->img + done, im->total - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			err = n < 0 ? -errno : -EIO;
		else
			done += (size_t)n;
	}
	if (!err && fsync(fd))
		err = -errno;
	if (fd >= 0 && close(fd) && !err)
		err = -errno;
	return err;
}

static int cmd_restore(int argc, char **argv)
{
	struct uffdwp_snapshot_info info = { 0 }, prev = { 0 };
	struct image im = { 0 };
	const char *out = NULL;
	int i = 2, fd, ret = 1, err;

	if (i + 1 < argc && !strcmp(argv[i], "--out")) {
		out = argv[i + 1];
		i += 2;
	}
	if (!out || !*out)
		return usage("restore needs --out IMAGE%s", "");
	if (i >= argc)
		return usage("restore needs a base snapshot file%s", "");
	for (int f = i; f < argc; f++) {
		fd = open(argv[f], O_RDONLY | O_CLOEXEC);
		err = fd < 0 ? -errno : 0;
		/* The base's regions, or a delta's after the session's
		 * regions were added or removed (the image then follows). */
		if (!err && f > i) {
			int n = uffdwp_snapshot_read_info(fd, &info, NULL, 0);

			err = n < 0 ? n : 0;
		}
		if (!err && (f == i ||
			     (info.flags & UFFDWP_FILE_REGIONS_CHANGED)))
			err = image_layout(&im, fd);
		if (!err)
			err = uffdwp_snapshot_load(fd, im.dst, (size_t)im.n,
						   f > i ? &prev : NULL, &info);
		if (fd >= 0)
			close(fd);
		if (err) {
			fprintf(stderr, "uffdwp restore: %s: %s\n", argv[f],
				load_error(err));
			if (im.n)
				print_ranges(argv[f], im.dst, im.n, argv[i]);
			goto done;
		}
		printf("%s: %s, epoch %llu, %llu of %llu pages%s\n", argv[f],
		       info.kind == UFFDWP_FILE_BASE ? "base" : "delta",
		       (unsigned long long)info.epoch,
		       (unsigned long long)info.pages,
		       (unsigned long long)info.pages_total,
		       info.flags & UFFDWP_FILE_REGIONS_CHANGED ?
		       ", regions changed" : "");
		prev = info;
	}
	err = image_write(&im, out);
	if (err) {
		fprintf(stderr, "uffdwp restore: %s: %s\n", out, strerror(-err));
		goto done;
	}
	printf("restored %s: %d region(s), %zu bytes, session %016llx at epoch %llu\n",
	       out, im.n, im.total, (unsigned long long)info.session,
	       (unsigned long long)info.epoch);
	ret = 0;
done:
	image_free(&im);
	return ret;
}

int main(int argc, char **argv)
{
	/* stdout is often a pipe (the guest harness): line-buffer it so a run
	 * killed by a timeout still shows how far it got. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		return usage("missing command%s", "");
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
		int major = 0, minor = 0;

		uffdwp_version(&major, &minor);
		printf("uffdwp %d.%d (libuffdwp %d.%d loaded; snapshot file format 2)\n",
		       UFFDWP_VERSION_MAJOR, UFFDWP_VERSION_MINOR, major, minor);
		return 0;
	}
	if ((!strcmp(argv[1], "info") || !strcmp(argv[1], "demo") ||
	     !strcmp(argv[1], "restore")) && wants_help(argc, argv))
		return help(argv[1]);
	if (!strcmp(argv[1], "info")) {
		if (argc > 2)
			return usage("info takes no arguments (got '%s')", argv[2]);
		return cmd_info();
	}
	if (!strcmp(argv[1], "demo"))
		return cmd_demo(argc, argv);
	if (!strcmp(argv[1], "restore"))
		return cmd_restore(argc, argv);
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(NULL, NULL);
		return 0;
	}
	return usage("unknown command '%s'", argv[1]);
}
