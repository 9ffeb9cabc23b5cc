// SPDX-License-Identifier: GPL-2.0
/*
 * PID 1 of the test guest.
 *
 * Mounts the file systems the tests need, turns a zram device into swap,
 * then runs every entry of /plan with a timeout and reports on the console:
 *
 *   @@BOOT <uname>                  once the guest is set up
 *   @@BEGIN <name> <kind>           before an entry runs
 *   @@O <line>                      each line the entry printed
 *   @@END <name> <status> ms=<t>    status: exit=N, signal=N or timeout
 *   @@DONE                          after the last entry
 *
 * The host (scripts/collect.py) turns these into TAP; "kind" tells it how
 * to read an entry's output.  Every line of ours starts with "@@" so that
 * kernel messages interleaved on the same console are easy to tell apart.
 *
 * A plan line is: NAME KIND TIMEOUT_S ARGV...  ('#' starts a comment).
 * ARGV may start with cd=DIR: the program then runs in DIR instead of /tmp
 * (kselftests that exec themselves by a relative path expect their own
 * directory, as the kselftest runner gives them).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/swap.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 64
#define ZRAM_SIZE "512M"

static void say(const char *fmt, ...)
{
	char buf[4096];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n > (int)sizeof(buf) - 2)
		n = sizeof(buf) - 2;
	buf[n++] = '\n';
	/* One write per line keeps our lines whole on the console. */
	if (write(1, buf, n) < 0)
		return;
}

static void mount_or_warn(const char *src, const char *dst, const char *type,
			  const char *opts)
{
	mkdir(dst, 0755);
	if (mount(src, dst, type, 0, opts))
		say("@@WARN mount %s on %s: %s", type, dst, strerror(errno));
}

/* Whether the kernel command line has WORD as one of its words. */
static bool cmdline_has(const char *word)
{
	char buf[4096], *tok, *save = NULL;
	int fd = open("/proc/cmdline", O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	for (tok = strtok_r(buf, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save))
		if (!strcmp(tok, word))
			return true;
	return false;
}

static int write_file(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = write(fd, val, strlen(val));
	close(fd);
	return n < 0 ? -errno : 0;
}

static void setup_console(void)
{
	int fd = open("/dev/console", O_RDWR | O_NOCTTY);

	if (fd < 0)
		return;
	dup2(fd, 0);
	dup2(fd, 1);
	dup2(fd, 2);
	if (fd > 2)
		close(fd);
}

/* Write a version-1 swap header ("mkswap") to a block device. */
static int make_swap(const char *dev, unsigned long long bytes)
{
	long psz = sysconf(_SC_PAGESIZE);
	unsigned char *hdr = calloc(1, psz);
	unsigned int *w;
	int fd, ret = -1;

	if (!hdr)
		return -1;
	w = (unsigned int *)(hdr + 1024);
	w[0] = 1;				/* version */
	w[1] = bytes / psz - 1;			/* last usable page */
	w[2] = 0;				/* no bad pages */
	memcpy(hdr + psz - 10, "SWAPSPACE2", 10);
	fd = open(dev, O_WRONLY);
	if (fd >= 0) {
		if (pwrite(fd, hdr, psz, 0) == psz && fsync(fd) == 0)
			ret = 0;
		close(fd);
	}
	free(hdr);
	return ret;
}

static void setup_swap(void)
{
	int err = write_file("/sys/block/zram0/disksize", ZRAM_SIZE);

	if (err) {
		say("@@WARN zram disksize: %s", strerror(-err));
		return;
	}
	if (make_swap("/dev/zram0", 512ULL << 20)) {
		say("@@WARN mkswap /dev/zram0: %s", strerror(errno));
		return;
	}
	if (swapon("/dev/zram0", 0))
		say("@@WARN swapon /dev/zram0: %s", strerror(errno));
}

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* Forward a child's output, one "@@O" line per line it printed. */
struct linebuf {
	char buf[8192];
	size_t len;
};

static void forward(struct linebuf *lb, const char *data, size_t n, int flush)
{
	size_t i;

	for (i = 0; i < n; i++) {
		char c = data[i];

		if (c == '\n' || lb->len == sizeof(lb->buf) - 1) {
			lb->buf[lb->len] = 0;
			say("@@O %s", lb->buf);
			lb->len = 0;
			if (c == '\n')
				continue;
		}
		if (c != '\r')
			lb->buf[lb->len++] = c;
	}
	if (flush && lb->len) {
		lb->buf[lb->len] = 0;
		say("@@O %s", lb->buf);
		lb->len = 0;
	}
}

static void run_entry(const char *name, const char *kind, int timeout_s,
		      char **argv)
{
	static struct linebuf lb;
	long long start = now_ms(), deadline = start + timeout_s * 1000LL;
	int pfd[2], status = 0, timed_out = 0, exited = 0;
	pid_t pid;

	say("@@BEGIN %s %s", name, kind);
	if (pipe2(pfd, O_CLOEXEC)) {
		say("@@END %s error=pipe ms=0", name);
		return;
	}
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);

		setsid();
		dup2(null, 0);
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		if (!strncmp(argv[0], "cd=", 3)) {
			if (chdir(argv[0] + 3)) {
				fprintf(stderr, "chdir %s: %s\n", argv[0] + 3,
					strerror(errno));
				_exit(127);
			}
			argv++;
		}
		execv(argv[0], argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(pfd[1]);
	if (pid < 0) {
		close(pfd[0]);
		say("@@END %s error=fork ms=0", name);
		return;
	}
	lb.len = 0;
	for (;;) {
		struct pollfd p = { .fd = pfd[0], .events = POLLIN };
		long long left = deadline - now_ms();
		char data[4096];
		ssize_t n;

		if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
			/* Give leftovers holding the pipe a moment, no more. */
			exited = 1;
			if (deadline > now_ms() + 1000)
				deadline = now_ms() + 1000;
			continue;
		}
		if (left <= 0) {
			timed_out = !exited;
			break;
		}
		if (poll(&p, 1, left > 200 ? 200 : (int)left) <= 0)
			continue;
		n = read(pfd[0], data, sizeof(data));
		if (n <= 0) {
			if (exited)
				break;
			/* EOF before exit: wait for the child, under the deadline. */
			close(pfd[0]);
			pfd[0] = -1;
			while (!exited && now_ms() < deadline) {
				if (waitpid(pid, &status, WNOHANG) == pid)
					exited = 1;
				else
					usleep(20000);
			}
			timed_out = !exited;
			break;
		}
		forward(&lb, data, n, 0);
	}
	forward(&lb, NULL, 0, 1);
	/* Kill the whole session: the entry and anything it left behind. */
	kill(-pid, SIGKILL);
	if (pfd[0] >= 0)
		close(pfd[0]);
	while (!exited && waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (timed_out)
		say("@@END %s timeout ms=%lld", name, now_ms() - start);
	else if (WIFSIGNALED(status))
		say("@@END %s signal=%d ms=%lld", name, WTERMSIG(status),
		    now_ms() - start);
	else
		say("@@END %s exit=%d ms=%lld", name, WEXITSTATUS(status),
		    now_ms() - start);
}

/* Reap orphans that were reparented to us. */
static void reap(void)
{
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

static void run_plan(const char *path)
{
	FILE *f = fopen(path, "r");
	char line[4096];

	if (!f) {
		say("@@WARN no plan at %s: %s", path, strerror(errno));
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		char *argv[MAX_ARGS + 1], *name, *kind, *tmo, *save, *tok;
		int argc = 0;

		line[strcspn(line, "#\n")] = 0;
		name = strtok_r(line, " \t", &save);
		if (!name)
			continue;
		kind = strtok_r(NULL, " \t", &save);
		tmo = strtok_r(NULL, " \t", &save);
		while (argc < MAX_ARGS && (tok = strtok_r(NULL, " \t", &save)))
			argv[argc++] = tok;
		argv[argc] = NULL;
		if (!kind || !tmo || argc == 0 || atoi(tmo) <= 0) {
			say("@@BEGIN %s bad-plan-line", name);
			say("@@END %s error=plan ms=0", name);
			continue;
		}
		run_entry(name, kind, atoi(tmo), argv);
		reap();
	}
	fclose(f);
}

int main(void)
{
	struct utsname u;

	mount_or_warn("devtmpfs", "/dev", "devtmpfs", NULL);
	setup_console();
	mount_or_warn("proc", "/proc", "proc", NULL);
	mount_or_warn("sysfs", "/sys", "sysfs", NULL);
	mount_or_warn("debugfs", "/sys/kernel/debug", "debugfs", NULL);
	mount_or_warn("tmpfs", "/tmp", "tmpfs", "mode=1777");
	mount_or_warn("tmpfs", "/dev/shm", "tmpfs", "mode=1777");
	/* a lane booted where the kernel has no huge page size (the hash MMU
	 * under QEMU) says so with uffdwp.no_hugetlbfs: nothing to mount */
	if (cmdline_has("uffdwp.no_hugetlbfs"))
		say("# no hugetlbfs: the lane boots without huge page sizes");
	else
		mount_or_warn("hugetlbfs", "/mnt/huge", "hugetlbfs", "mode=1777");
	setup_swap();
	setenv("PATH", "/bin", 1);
	setenv("HOME", "/tmp", 1);
	if (chdir("/tmp"))
		say("@@WARN chdir /tmp: %s", strerror(errno));
	uname(&u);
	say("@@BOOT %s %s %s", u.sysname, u.release, u.machine);
	run_plan("/plan");
	say("@@DONE");
	sync();
	reboot(RB_POWER_OFF);
	reboot(RB_AUTOBOOT);
	for (;;)
		pause();
}
