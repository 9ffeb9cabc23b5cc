// SPDX-License-Identifier: GPL-2.0
/* bench_util.c: see bench_util.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

static void usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s [--quick] [--reps N]\n"
		"  --quick   tiny sizes, 1 repetition (correctness checks only)\n"
		"  --reps N  repetitions per figure (1..100000)\n"
		"Prints CSV rows benchmark,variant,param,metric,value,unit and\n"
		"'#' comments; exits 1 if a correctness check fails.\n", prog);
}

void bench_parse_args(int argc, char **argv, struct bench_opts *o,
		      int default_reps)
{
	o->quick = false;
	o->reps_set = false;
	o->reps = default_reps;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = NULL;
		char *end;
		long n;

		if (!strcmp(a, "--quick")) {
			o->quick = true;
			continue;
		}
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(argv[0]);
			exit(0);
		}
		if (!strcmp(a, "--reps")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "%s: --reps needs a number\n", argv[0]);
				exit(2);
			}
			val = argv[++i];
		} else if (!strncmp(a, "--reps=", 7)) {
			val = a + 7;
		} else {
			fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a);
			usage(argv[0]);
			exit(2);
		}
		errno = 0;
		n = strtol(val, &end, 10);
		if (errno || end == val || *end || n < 1 || n > 100000) {
			fprintf(stderr, "%s: --reps wants 1..100000, not '%s'\n",
				argv[0], val);
			exit(2);
		}
		o->reps = n;
		o->reps_set = true;
	}
	if (o->quick && !o->reps_set)
		o->reps = 1;
}

const char *bench_take_opt(int *argc, char **argv, const char *name)
{
	size_t len = strlen(name);

	for (int i = 1; i < *argc; i++) {
		const char *val;
		int used;

		if (!strcmp(argv[i], name)) {
			if (i + 1 >= *argc) {
				fprintf(stderr, "%s: %s needs a value\n", argv[0], name);
				exit(2);
			}
			val = argv[i + 1];
			used = 2;
		} else if (!strncmp(argv[i], name, len) && argv[i][len] == '=') {
			val = argv[i] + len + 1;
			used = 1;
		} else {
			continue;
		}
		memmove(&argv[i], &argv[i + used], (*argc - i - used + 1) * sizeof(*argv));
		*argc -= used;
		return val;
	}
	return NULL;
}

size_t bench_parse_list(const char *name, const char *list, size_t *out,
			size_t max_n, size_t min, size_t max, size_t mult)
{
	const char *p = list;
	size_t n = 0;

	while (*p) {
		char *end;
		unsigned long v;

		errno = 0;
		v = strtoul(p, &end, 10);
		if (errno || end == p || (*end && *end != ',') || v < min ||
		    v > max || v % mult || n == max_n) {
			fprintf(stderr, "%s wants up to %zu comma-separated multiples of %zu in %zu..%zu, not '%s'\n",
				name, max_n, mult, min, max, list);
			exit(2);
		}
		out[n++] = v;
		p = *end ? end + 1 : end;
	}
	if (!n) {
		fprintf(stderr, "%s: empty list\n", name);
		exit(2);
	}
	return n;
}

uint64_t bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static void put_line(const char *buf, int len)
{
	if (len < 0)
		return;
	if (len > 1023)
		len = 1023;
	/* One write per line; a short write to the console is not retried. */
	if (write(1, buf, len) < 0)
		return;
}

void bench_sample(const char *bench, const char *variant, const char *param,
		  const char *metric, double value, const char *unit)
{
	char buf[1024];

	put_line(buf, snprintf(buf, sizeof(buf), "%s,%s,%s,%s,%.10g,%s\n",
			       bench, variant, param, metric, value, unit));
}

static int vformat(char *buf, size_t size, const char *prefix,
		   const char *fmt, va_list ap)
{
	int n = snprintf(buf, size, "%s", prefix);

	n += vsnprintf(buf + n, size - n - 1, fmt, ap);
	if (n > (int)size - 2)
		n = size - 2;
	buf[n++] = '\n';
	buf[n] = 0;
	return n;
}

void bench_comment(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vformat(buf, sizeof(buf), "# ", fmt, ap);
	va_end(ap);
	put_line(buf, n);
}

static bool same_file(int a, int b)
{
	struct stat sa, sb;

	return !fstat(a, &sa) && !fstat(b, &sb) && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

void bench_fail(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vformat(buf, sizeof(buf), "# FAIL: ", fmt, ap);
	va_end(ap);
	put_line(buf, n);
	if (!same_file(1, 2) && write(2, buf, n) < 0)
		exit(1);
	exit(1);
}

long bench_vma_count(void)
{
	char buf[65536];
	long lines = 0;
	ssize_t n;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		for (ssize_t i = 0; i < n; i++)
			lines += buf[i] == '\n';
	if (n < 0) {
		int e = errno;

		close(fd);
		errno = e;
		return -1;
	}
	close(fd);
	return lines;
}

int bench_write_file(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC), err = 0;
	size_t len = strlen(val);

	if (fd < 0)
		return -errno;
	errno = 0;
	if (write(fd, val, len) != (ssize_t)len)
		err = errno ? -errno : -EIO;
	close(fd);
	return err;
}

int bench_read_long(const char *path, long *val)
{
	char buf[64], *end;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return n < 0 ? -errno : -EIO;
	buf[n] = 0;
	errno = 0;
	*val = strtol(buf, &end, 10);
	if (errno || end == buf)
		return -EINVAL;
	return 0;
}
