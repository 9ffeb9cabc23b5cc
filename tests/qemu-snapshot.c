// SPDX-License-Identifier: GPL-2.0
/*
 * qemu-snapshot.c: QEMU's background snapshot, the first real user of
 * uffd-wp, run on the guest kernel (the clients step, docs/clients.md).
 *
 * Debian's own qemu-system-x86_64, packed into the guest by
 * scripts/pack-qemu.sh, runs a small nested VM (clients/records-x86.c: one
 * vCPU rewriting 256-byte versioned records across its RAM, checking
 * itself on request).  The guest kernel has no networking, so QMP runs over
 * QEMU's stdin/stdout (pipes), the nested serial port over a `pipe:`
 * chardev (two FIFOs), and the migration stream goes to a file through
 * `exec:` (busybox sh and cat).
 *
 * Cases:
 *   qemu-boots                    the nested VM fills its RAM and answers
 *   background-snapshot-accepted  migrate-set-capabilities background-snapshot
 *                                 (with --expect-refusal, the capability
 *                                 must be refused: a kernel without uffd-wp;
 *                                 QEMU's message is printed)
 * per repetition r:
 *   bg-r-completes                migrate to a file with the capability; the
 *                                 VM answers on its serial port while the
 *                                 snapshot runs (it was not stopped)
 *   bg-r-source-intact            the running VM checks itself afterwards:
 *                                 every record right (no write lost while
 *                                 pages were protected and released)
 *   bg-r-restored                 a second QEMU started from the file
 *                                 (-incoming) checks itself: every record
 *                                 belongs to the instant of its CPU state
 *   stopcopy-r-completes, stopcopy-r-restored   the same with stop,
 *                                 migrate, cont
 *   savevm-r-completes, savevm-r-restored   HMP savevm into a qcow2 made
 *                                 with blockdev-create, then -loadvm
 *   mixed-copy-detected           (after the first stop-and-copy) the file
 *                                 with one record from a later instant must
 *                                 fail the restored VM's check, naming it
 * then the faults, each mid-snapshot (pages seen write-protected):
 *   bg-kill-releases              QEMU killed: reaped at once
 *   bg-cancel-cancels, bg-cancel-vm-runs-on     migrate_cancel (a VM of
 *                                 its own): cancelled; the VM runs on, its
 *                                 records right, no page left with the
 *                                 uffd-wp bit (pagemap)
 *   bg-enospc-fails, bg-enospc-vm-runs-on       the file system fills up
 *                                 (8 MiB tmpfs, a VM of its own): the
 *                                 snapshot fails; the same afterwards
 * The two -vm-runs-on cases skip in exactly the state QEMU 7.2 leaves
 * (its userfaultfd kept, a fault waiting on it: runs_on()).
 *
 * Figures (bench CSV rows, benchmark qemu-snapshot): downtime_ms (the VM
 * stopped: QEMU's own figure for the background snapshot, stop to cont
 * for stop-and-copy, the savevm command for savevm), total_ms (command to
 * completion), extra_mib (QEMU's VmHWM during the snapshot minus its VmRSS
 * before it; the peak is reset through /proc/PID/clear_refs), and
 * vm_pace_pct (the nested VM's record updates from just before to just
 * after the snapshot, in percent of its pace in the second before: what a
 * workload keeps of its speed while the snapshot is taken; not measured
 * for savevm).  The migration rate limit is lifted (max-bandwidth 16 GiB/s)
 * for every variant.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"

#define LINE_MAX_LEN	8192

static const char *qemu_bin = "/usr/bin/qemu-system-x86_64";
static const char *image = "/usr/share/uffdwp/records-x86.elf";
static const char *dir = "/tmp";
static int mem_mib = 64, reps = 3, boot_s = 600, op_s = 600;
static bool expect_refusal, do_savevm = true;
static char last_verify[512];	/* the last @verify answer of a restored VM */
static unsigned long long nrec;	/* records of the nested VM (its @ready) */

struct lbuf {
	int fd;
	char buf[LINE_MAX_LEN];
	size_t len;
};

struct vm {
	pid_t pid;
	char tag[32], fifo[256], errlog[256];
	struct lbuf qmp, ser;
	int qmp_in, ser_in;
};

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* One line from LB into OUT (without the line end) within TIMEOUT_MS:
 * 1, or 0 on timeout, -1 on EOF or error. */
static int read_line(struct lbuf *lb, char *out, size_t outsz, double timeout_ms)
{
	double deadline = now_ms() + timeout_ms;

	for (;;) {
		char *nl = memchr(lb->buf, '\n', lb->len);

		if (nl) {
			size_t n = (size_t)(nl - lb->buf), c = n < outsz - 1 ? n : outsz - 1;

			memcpy(out, lb->buf, c);
			out[c] = 0;
			if (c && out[c - 1] == '\r')
				out[c - 1] = 0;
			memmove(lb->buf, nl + 1, lb->len - n - 1);
			lb->len -= n + 1;
			return 1;
		}
		if (lb->len == sizeof(lb->buf))
			lb->len = 0;	/* a line longer than we care for */
		double left = deadline - now_ms();
		struct pollfd p = { .fd = lb->fd, .events = POLLIN };

		if (left <= 0)
			return 0;
		int r = poll(&p, 1, left > 1000 ? 1000 : (int)left + 1);

		if (r < 0 && errno != EINTR)
			return -1;
		if (r <= 0)
			continue;
		ssize_t n = read(lb->fd, lb->buf + lb->len, sizeof(lb->buf) - lb->len);

		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			return -1;
		if (n > 0)
			lb->len += (size_t)n;
	}
}

static int write_all(int fd, const char *s, size_t n)
{
	while (n) {
		ssize_t w = write(fd, s, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		s += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Send one QMP command and put its reply line (return or error) in OUT;
 * events met on the way are skipped.  0, or -1 (no reply: see QEMU's
 * stderr log). */
static int qmp(struct vm *vm, char *out, size_t outsz, double timeout_ms,
	       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int qmp(struct vm *vm, char *out, size_t outsz, double timeout_ms,
	       const char *fmt, ...)
{
	char cmd[2048];
	double deadline = now_ms() + timeout_ms;
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(cmd, sizeof(cmd) - 1, fmt, ap);
	va_end(ap);
	if (n < 0 || n >= (int)sizeof(cmd) - 1)
		return -1;
	cmd[n++] = '\n';
	if (write_all(vm->qmp_in, cmd, (size_t)n))
		return -1;
	for (;;) {
		double left = deadline - now_ms();

		if (left <= 0 || read_line(&vm->qmp, out, outsz, left) != 1)
			return -1;
		if (strstr(out, "\"return\"") || strstr(out, "\"error\""))
			return 0;
	}
}

/* The string value of "KEY": "..." in JSON text S, into OUT. */
static bool json_str(const char *s, const char *key, char *out, size_t outsz)
{
	char pat[64];
	const char *p, *e;

	snprintf(pat, sizeof(pat), "\"%s\": \"", key);
	p = strstr(s, pat);
	if (!p)
		return false;
	p += strlen(pat);
	e = strchr(p, '"');
	if (!e)
		return false;
	snprintf(out, outsz, "%.*s", (int)(e - p), p);
	return true;
}

/* The number after "KEY": in S, or -1. */
static double json_num(const char *s, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\": ", key);
	p = strstr(s, pat);
	return p ? strtod(p + strlen(pat), NULL) : -1;
}

static void show_err_log(struct vm *vm)
{
	char line[512];
	FILE *f = fopen(vm->errlog, "r");
	int n = 0;

	if (!f)
		return;
	while (n++ < 20 && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		tap_diag("%s stderr: %s", vm->tag, line);
	}
	fclose(f);
}

static long proc_kib(pid_t pid, const char *field)
{
	char path[64], line[256];
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, strlen(field)) && line[strlen(field)] == ':')
			v = strtol(line + strlen(field) + 1, NULL, 10);
	fclose(f);
	return v;
}

/* Reset the process's VmHWM to its VmRSS (clear_refs 5). */
static int reset_peak(pid_t pid)
{
	char path[64];
	int fd, r;

	snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)pid);
	fd = open(path, O_WRONLY);
	if (fd < 0)
		return -1;
	r = write(fd, "5", 1) == 1 ? 0 : -1;
	close(fd);
	return r;
}

/*
 * Start QEMU with the nested VM: QMP on stdio, the serial port on FIFOs.
 * EXTRA: NULL-terminated further arguments (-incoming ..., -loadvm ...).
 */
static int vm_start(struct vm *vm, const char *tag, const char *const *extra)
{
	char in[300], out[300], line[LINE_MAX_LEN], mem[16], chr[300];
	int to_q[2], from_q[2];

	memset(vm, 0, sizeof(*vm));
	vm->pid = -1;
	snprintf(vm->tag, sizeof(vm->tag), "%s", tag);
	snprintf(vm->fifo, sizeof(vm->fifo), "%s/qs-%s", dir, tag);
	snprintf(vm->errlog, sizeof(vm->errlog), "%s/qemu-%s.err", dir, tag);
	snprintf(in, sizeof(in), "%s.in", vm->fifo);
	snprintf(out, sizeof(out), "%s.out", vm->fifo);
	unlink(in);
	unlink(out);
	if (mkfifo(in, 0600) || mkfifo(out, 0600))
		return -errno;
	/* O_RDWR: neither side blocks waiting for the other to open. */
	vm->ser_in = open(in, O_RDWR | O_CLOEXEC);
	vm->ser.fd = open(out, O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (vm->ser_in < 0 || vm->ser.fd < 0)
		return -errno;
	if (pipe2(to_q, O_CLOEXEC) || pipe2(from_q, O_CLOEXEC))
		return -errno;
	snprintf(mem, sizeof(mem), "%d", mem_mib);
	snprintf(chr, sizeof(chr), "pipe,id=ser0,path=%s", vm->fifo);

	const char *argv[64] = {
		qemu_bin, "-M", "pc", "-accel", "tcg", "-m", mem,
		"-smp", "1", "-nodefaults", "-no-user-config",
		"-display", "none", "-vga", "none", "-no-reboot",
		"-kernel", image, "-chardev", chr, "-serial", "chardev:ser0",
		"-qmp", "stdio",
	};
	int argc = 0;

	while (argv[argc])
		argc++;
	for (int i = 0; extra && extra[i] && argc < 62; i++)
		argv[argc++] = extra[i];
	argv[argc] = NULL;

	vm->pid = fork();
	if (vm->pid < 0)
		return -errno;
	if (vm->pid == 0) {
		int err = open(vm->errlog, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		dup2(to_q[0], 0);
		dup2(from_q[1], 1);
		if (err >= 0)
			dup2(err, 2);
		execv(qemu_bin, (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", qemu_bin, strerror(errno));
		_exit(127);
	}
	close(to_q[0]);
	close(from_q[1]);
	vm->qmp_in = to_q[1];
	vm->qmp.fd = from_q[0];
	fcntl(vm->qmp.fd, F_SETFL, O_NONBLOCK);
	/* The greeting, then leave capabilities negotiation mode. */
	if (read_line(&vm->qmp, line, sizeof(line), 60000) != 1 || !strstr(line, "QMP"))
		return -EPROTO;
	if (qmp(vm, line, sizeof(line), 60000, "{\"execute\": \"qmp_capabilities\"}") ||
	    !strstr(line, "\"return\""))
		return -EPROTO;
	return 0;
}

static void vm_stop(struct vm *vm)
{
	char line[LINE_MAX_LEN];
	int status;

	if (vm->pid > 0) {
		qmp(vm, line, sizeof(line), 5000, "{\"execute\": \"quit\"}");
		for (int i = 0; i < 100 && waitpid(vm->pid, &status, WNOHANG) == 0; i++)
			usleep(50000);
		if (waitpid(vm->pid, &status, WNOHANG) == 0) {
			kill(vm->pid, SIGKILL);
			waitpid(vm->pid, &status, 0);
		}
	}
	if (vm->qmp_in > 0)
		close(vm->qmp_in);
	if (vm->qmp.fd > 0)
		close(vm->qmp.fd);
	if (vm->ser_in > 0)
		close(vm->ser_in);
	if (vm->ser.fd > 0)
		close(vm->ser.fd);
	vm->pid = -1;
}

/* The next serial line starting with PREFIX into OUT, within TIMEOUT_MS
 * (other lines are shown as diagnostics). */
static bool serial_expect(struct vm *vm, const char *prefix, char *out,
			  size_t outsz, double timeout_ms)
{
	double deadline = now_ms() + timeout_ms;

	for (;;) {
		double left = deadline - now_ms();

		if (left <= 0 || read_line(&vm->ser, out, outsz, left) != 1)
			return false;
		if (!strncmp(out, prefix, strlen(prefix)))
			return true;
		tap_diag("%s serial: %s", vm->tag, out);
	}
}

/* Ask the nested VM a one-letter question; its answer line in OUT. */
static bool ask(struct vm *vm, char c, const char *prefix, char *out,
		size_t outsz, double timeout_ms)
{
	if (write_all(vm->ser_in, &c, 1))
		return false;
	return serial_expect(vm, prefix, out, outsz, timeout_ms);
}

static long long updates_of(const char *line)
{
	const char *p = strstr(line, "updates=");

	return p ? atoll(p + 8) : -1;
}

/* Wait until query-migrate says completed or failed; *INFO its last reply.
 * While waiting, ask the VM for its status once and note the update count
 * if the answer comes back before completion (*DURING, else -1). */
static bool wait_migration(struct vm *vm, char *info, size_t infosz,
			   bool probe, long long *during)
{
	double deadline = now_ms() + op_s * 1000.0;
	char st[64], line[LINE_MAX_LEN];
	bool asked = false;

	*during = -1;
	while (now_ms() < deadline) {
		if (qmp(vm, info, infosz, 30000, "{\"execute\": \"query-migrate\"}"))
			return false;
		if (!json_str(info, "status", st, sizeof(st)))
			return false;
		if (!strcmp(st, "completed"))
			return true;
		if (!strcmp(st, "failed") || !strcmp(st, "cancelled"))
			return false;
		if (probe && !asked) {
			char c = 'S';

			asked = write_all(vm->ser_in, &c, 1) == 0;
		}
		if (probe && asked && *during < 0 &&
		    read_line(&vm->ser, line, sizeof(line), 5) == 1 &&
		    !strncmp(line, "@status", 7))
			*during = updates_of(line);
		usleep(5000);
	}
	return false;
}

static void sample(const char *variant, const char *metric, double v,
		   const char *unit)
{
	printf("qemu-snapshot,%s,mem_mib=%d,%s,%.3f,%s\n", variant, mem_mib,
	       metric, v, unit);
	fflush(stdout);
}

/* Start a QEMU from the snapshot (EXTRA: -incoming or -loadvm arguments),
 * let it run, and have the nested VM check itself.  OUT: its answer. */
static bool restore_and_check(const char *tag, const char *const *extra,
			      char *why, size_t whysz)
{
	char line[LINE_MAX_LEN], st[64] = "";
	double deadline = now_ms() + op_s * 1000.0;
	struct vm d;
	bool ok = false;
	int err = vm_start(&d, tag, extra);

	if (err) {
		snprintf(why, whysz, "QEMU did not start: %s", strerror(-err));
		show_err_log(&d);
		vm_stop(&d);
		return false;
	}
	for (;;) {
		if (now_ms() > deadline) {
			snprintf(why, whysz, "still %s after %d s", st, op_s);
			goto out;
		}
		if (qmp(&d, line, sizeof(line), 30000, "{\"execute\": \"query-status\"}") ||
		    !json_str(line, "status", st, sizeof(st))) {
			snprintf(why, whysz, "query-status: %.400s", line);
			show_err_log(&d);
			goto out;
		}
		if (strcmp(st, "inmigrate") && strcmp(st, "restore-vm"))
			break;
		usleep(20000);
	}
	if (strcmp(st, "running") &&
	    (qmp(&d, line, sizeof(line), 30000, "{\"execute\": \"cont\"}") ||
	     !strstr(line, "\"return\""))) {
		snprintf(why, whysz, "restored VM in state %s, cont: %.400s", st, line);
		goto out;
	}
	if (!ask(&d, 'V', "@verify", line, sizeof(line), op_s * 1000.0)) {
		snprintf(why, whysz, "restored VM did not answer its check");
		show_err_log(&d);
		goto out;
	}
	tap_diag("%s: %s", tag, line);
	snprintf(last_verify, sizeof(last_verify), "%.400s", line);
	if (strncmp(line, "@verify ok", 10)) {
		snprintf(why, whysz, "restored RAM mixes instants: %.400s", line);
		goto out;
	}
	/* And it runs on from there. */
	long long u0 = updates_of(line);

	if (!ask(&d, 'S', "@status", line, sizeof(line), 60000) ||
	    updates_of(line) <= u0) {
		snprintf(why, whysz, "restored VM checked out but does not run on (%.400s)", line);
		goto out;
	}
	ok = true;
out:
	vm_stop(&d);
	return ok;
}

static bool set_bg_cap(struct vm *vm, bool on, char *reply, size_t sz)
{
	return !qmp(vm, reply, sz, 60000,
		    "{\"execute\": \"migrate-set-capabilities\", \"arguments\": "
		    "{\"capabilities\": [{\"capability\": \"background-snapshot\", "
		    "\"state\": %s}]}}", on ? "true" : "false") &&
	       strstr(reply, "\"return\"");
}

struct figures {
	double downtime_ms, total_ms, extra_mib;
	long long during;	/* updates when the VM answered mid-snapshot
				   (-1: it did not), counted from the start */
	double rate_before;	/* updates/s in the second before */
	double pace_pct;	/* updates from just before to just after the
				   snapshot, against rate_before (-1: none) */
};

/* Background snapshot (BG) or stop-and-copy of SRC into FILE. */
static bool migrate_to_file(struct vm *src, bool bg, const char *file,
			    struct figures *f, char *why, size_t whysz)
{
	char line[LINE_MAX_LEN], info[LINE_MAX_LEN];
	long rss0;
	long long u0;
	double t0, t_stop = 0, t_cont;

	memset(f, 0, sizeof(*f));
	f->during = -1;
	f->pace_pct = -1;
	if (!set_bg_cap(src, bg, line, sizeof(line))) {
		snprintf(why, whysz, "migrate-set-capabilities: %.400s", line);
		return false;
	}
	/* The VM's own pace first: updates in one second. */
	double r0 = now_ms();

	if (!ask(src, 'S', "@status", line, sizeof(line), 60000)) {
		snprintf(why, whysz, "the VM does not answer before the snapshot");
		return false;
	}
	u0 = updates_of(line);
	usleep(1000000);
	if (!ask(src, 'S', "@status", line, sizeof(line), 60000)) {
		snprintf(why, whysz, "the VM does not answer before the snapshot");
		return false;
	}
	f->rate_before = (updates_of(line) - u0) * 1000.0 / (now_ms() - r0);
	u0 = updates_of(line);
	r0 = now_ms();
	rss0 = proc_kib(src->pid, "VmRSS");
	reset_peak(src->pid);
	t0 = now_ms();
	if (!bg) {
		if (qmp(src, line, sizeof(line), 60000, "{\"execute\": \"stop\"}") ||
		    !strstr(line, "\"return\"")) {
			snprintf(why, whysz, "stop: %.400s", line);
			return false;
		}
		t_stop = now_ms();
	}
	if (qmp(src, line, sizeof(line), 60000,
		"{\"execute\": \"migrate\", \"arguments\": {\"uri\": \"exec:cat > %s\"}}",
		file) || !strstr(line, "\"return\"")) {
		snprintf(why, whysz, "migrate: %.400s", line);
		return false;
	}
	if (!wait_migration(src, info, sizeof(info), bg, &f->during)) {
		snprintf(why, whysz, "migration did not complete: %.400s", info);
		show_err_log(src);
		return false;
	}
	f->total_ms = now_ms() - t0;
	if (!bg) {
		if (qmp(src, line, sizeof(line), 60000, "{\"execute\": \"cont\"}") ||
		    !strstr(line, "\"return\"")) {
			snprintf(why, whysz, "cont after stop-and-copy: %.400s", line);
			return false;
		}
		t_cont = now_ms();
		f->downtime_ms = t_cont - t_stop;
		f->total_ms = t_cont - t0;
	} else {
		f->downtime_ms = json_num(info, "downtime");
		if (f->during >= 0)
			f->during -= u0;
		/* The probe's answer may still be on its way. */
		else if (!serial_expect(src, "@status", line, sizeof(line), 60000))
			tap_diag("the status asked for during the snapshot never came");
	}
	f->extra_mib = (proc_kib(src->pid, "VmHWM") - rss0) / 1024.0;
	if (ask(src, 'S', "@status", line, sizeof(line), 60000) && f->rate_before > 0)
		f->pace_pct = 100.0 * (updates_of(line) - u0) /
			      (f->rate_before * (now_ms() - r0) / 1000.0);
	tap_diag("%s: QEMU total-time %.0f ms, downtime %.0f ms, setup %.0f ms; "
		 "measured %.1f ms stopped, %.1f ms in all; VmRSS before %ld KiB, "
		 "peak %+.1f MiB; the VM made %.0f updates/s before, %.2f%% of that pace "
		 "around the snapshot, %lld updates when it answered mid-snapshot",
		 bg ? "background" : "stop-and-copy",
		 json_num(info, "total-time"), json_num(info, "downtime"),
		 json_num(info, "setup-time"), f->downtime_ms, f->total_ms, rss0,
		 f->extra_mib, f->rate_before, f->pace_pct, f->during);
	return true;
}

/* A qcow2 image for savevm, made by QEMU itself (blockdev-create). */
static int wait_job(struct vm *vm, const char *id, char *line, size_t sz)
{
	double deadline = now_ms() + 120000;

	while (now_ms() < deadline) {
		if (qmp(vm, line, sz, 30000, "{\"execute\": \"query-jobs\"}"))
			return -1;
		/* One job at a time: the reply lists only ours. */
		if (strstr(line, id) && strstr(line, "\"concluded\"")) {
			bool failed = strstr(line, "\"error\"") != NULL;
			char tmp[LINE_MAX_LEN];

			qmp(vm, tmp, sizeof(tmp), 30000,
			    "{\"execute\": \"job-dismiss\", \"arguments\": {\"id\": \"%s\"}}", id);
			return failed ? -1 : 0;
		}
		usleep(20000);
	}
	return -1;
}

static bool make_qcow2(struct vm *vm, const char *path, char *why, size_t whysz)
{
	char line[LINE_MAX_LEN];

	unlink(path);
	if (qmp(vm, line, sizeof(line), 30000,
		"{\"execute\": \"blockdev-create\", \"arguments\": {\"job-id\": \"mkfile\", "
		"\"options\": {\"driver\": \"file\", \"filename\": \"%s\", \"size\": 0}}}", path) ||
	    !strstr(line, "\"return\"") || wait_job(vm, "mkfile", line, sizeof(line)) ||
	    qmp(vm, line, sizeof(line), 30000,
		"{\"execute\": \"blockdev-add\", \"arguments\": {\"driver\": \"file\", "
		"\"node-name\": \"f0\", \"filename\": \"%s\", \"locking\": \"off\"}}", path) ||
	    !strstr(line, "\"return\"") ||
	    qmp(vm, line, sizeof(line), 30000,
		"{\"execute\": \"blockdev-create\", \"arguments\": {\"job-id\": \"mkqcow2\", "
		"\"options\": {\"driver\": \"qcow2\", \"file\": \"f0\", \"size\": 1048576}}}") ||
	    !strstr(line, "\"return\"") || wait_job(vm, "mkqcow2", line, sizeof(line)) ||
	    qmp(vm, line, sizeof(line), 30000,
		"{\"execute\": \"blockdev-add\", \"arguments\": {\"driver\": \"qcow2\", "
		"\"node-name\": \"q0\", \"file\": \"f0\"}}") ||
	    !strstr(line, "\"return\"")) {
		snprintf(why, whysz, "qcow2 image for savevm: %.400s", line);
		return false;
	}
	return true;
}

static bool savevm(struct vm *src, const char *tag, struct figures *f,
		   char *why, size_t whysz)
{
	char line[LINE_MAX_LEN];
	long rss0 = proc_kib(src->pid, "VmRSS");
	double t0;

	memset(f, 0, sizeof(*f));
	f->during = f->pace_pct = -1;
	reset_peak(src->pid);
	t0 = now_ms();
	if (qmp(src, line, sizeof(line), op_s * 1000.0,
		"{\"execute\": \"human-monitor-command\", \"arguments\": "
		"{\"command-line\": \"savevm %s\"}}", tag) ||
	    strcmp(line, "{\"return\": \"\"}")) {
		snprintf(why, whysz, "savevm: %.400s", line);
		return false;
	}
	f->total_ms = f->downtime_ms = now_ms() - t0;
	f->extra_mib = (proc_kib(src->pid, "VmHWM") - rss0) / 1024.0;
	tap_diag("savevm: %.1f ms stopped (the whole command), peak %+.1f MiB",
		 f->downtime_ms, f->extra_mib);
	return true;
}

static void emit(const char *variant, const struct figures *f)
{
	sample(variant, "downtime_ms", f->downtime_ms, "ms");
	sample(variant, "total_ms", f->total_ms, "ms");
	sample(variant, "extra_mib", f->extra_mib, "MiB");
	if (f->pace_pct >= 0)
		sample(variant, "vm_pace_pct", f->pace_pct, "%");
}

/* Payload word I of record G at update S: the nested VM's scheme
 * (clients/records-x86.c, workload/workload.h). */
static uint64_t rec_word(uint64_t g, uint64_t s, int i)
{
	uint64_t x = (g << 32 | (uint64_t)i) ^ (s * 0x9E3779B97F4A7C15ull);

	x ^= x >> 29;
	return x * 0xBF58476D1CE4E5B9ull;
}

/*
 * Make FILE (a migration stream) a copy that mixes two instants: the first
 * record found in it gets the content its writer gives it one sweep later,
 * as a page saved after the VM wrote it would hold.  *G, *S_OLD and *S_NEW
 * say which and what; 0 or -1 (no record found).
 */
static int mix_one_record(const char *file, uint64_t *g, uint64_t *s_old,
			  uint64_t *s_new)
{
	int fd = open(file, O_RDWR);
	struct stat st;
	unsigned char *p;
	int ret = -1;

	if (fd < 0 || fstat(fd, &st) || st.st_size < 256) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return -1;
	for (off_t off = 0; off + 256 <= st.st_size; off++) {
		uint64_t b, e, w0, w1, pw;
		uint32_t writer, idx;

		memcpy(&b, p + off, 8);
		memcpy(&e, p + off + 248, 8);
		if (b != e || !b)
			continue;
		memcpy(&writer, p + off + 8, 4);
		memcpy(&idx, p + off + 12, 4);
		if (writer >= 4)
			continue;
		*g = (uint64_t)idx * 4 + writer;
		memcpy(&w0, p + off + 16, 8);
		memcpy(&w1, p + off + 24, 8);
		if (w0 != rec_word(*g, b, 0) || w1 != rec_word(*g, b, 1))
			continue;
		pw = (nrec - writer + 3) / 4;	/* the writer's records */
		*s_old = b;
		*s_new = b + pw;
		memcpy(p + off, s_new, 8);
		memcpy(p + off + 248, s_new, 8);
		for (int i = 0; i < 29; i++) {
			uint64_t v = rec_word(*g, *s_new, i);

			memcpy(p + off + 16 + 8 * i, &v, 8);
		}
		ret = 0;
		break;
	}
	munmap(p, (size_t)st.st_size);
	return ret;
}

/*
 * Pages of PID's guest RAM (its largest anonymous mapping of at least the
 * VM's size) that carry the uffd-wp bit (pagemap bit 57); *PAGES: how many
 * pages were read.  -1 when the mapping or pagemap cannot be read.
 */
static long wp_pages(pid_t pid, long *pages)
{
	char path[64], line[512];
	unsigned long best_lo = 0, best_hi = 0;
	long n = 0;
	FILE *f;
	int fd;

	*pages = 0;
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi, off, ino;
		char perms[8], dev[16], name[256] = "";

		if (sscanf(line, "%lx-%lx %7s %lx %15s %lu %255s", &lo, &hi, perms, &off,
			   dev, &ino, name) < 6 || ino || name[0] || strcmp(perms, "rw-p"))
			continue;
		if (hi - lo >= ((unsigned long)mem_mib << 20) && hi - lo > best_hi - best_lo)
			best_lo = lo, best_hi = hi;
	}
	fclose(f);
	if (!best_hi)
		return -1;
	snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	for (unsigned long a = best_lo; a < best_hi; a += 512 * 4096UL) {
		uint64_t e[512];
		ssize_t r = pread(fd, e, sizeof(e), (off_t)(a / 4096 * 8));

		if (r <= 0)
			break;
		for (ssize_t i = 0; i < r / 8; i++) {
			(*pages)++;
			n += (e[i] >> 57) & 1;
		}
	}
	close(fd);
	return n;
}

/* After a snapshot that did not complete: the VM runs on at a pace, its
 * records are right, and no page of its RAM is left write-protected. */
static bool vm_recovered(struct vm *vm, char *why, size_t whysz)
{
	char line[LINE_MAX_LEN];
	long long u0;
	long wp, pages;

	if (!ask(vm, 'S', "@status", line, sizeof(line), 60000)) {
		char st[64] = "?";

		if (!qmp(vm, line, sizeof(line), 30000, "{\"execute\": \"query-status\"}"))
			json_str(line, "status", st, sizeof(st));
		wp = wp_pages(vm->pid, &pages);
		snprintf(why, whysz, "the VM does not answer afterwards (QEMU: %s; %ld of %ld "
			 "pages of the guest RAM write-protected)", st, wp, pages);
		return false;
	}
	u0 = updates_of(line);
	usleep(500000);
	if (!ask(vm, 'S', "@status", line, sizeof(line), 60000) || updates_of(line) <= u0) {
		snprintf(why, whysz, "the VM does not run on afterwards");
		return false;
	}
	if (!ask(vm, 'V', "@verify", line, sizeof(line), op_s * 1000.0) ||
	    strncmp(line, "@verify ok", 10)) {
		snprintf(why, whysz, "the VM's records afterwards: %.400s", line);
		return false;
	}
	wp = wp_pages(vm->pid, &pages);
	if (wp != 0) {
		snprintf(why, whysz, "%ld of %ld pages of the guest RAM still write-protected afterwards",
			 wp, pages);
		return false;
	}
	tap_diag("%s: runs on, records right, 0 of %ld RAM pages write-protected",
		 vm->tag, pages);
	return true;
}

/* Start a background snapshot of VM into URI and return once it has been
 * active for WAIT_MS (or it ended: *STATUS says which). */
static bool bg_start(struct vm *vm, const char *uri, double wait_ms,
		     char *status, size_t stsz, char *why, size_t whysz)
{
	char line[LINE_MAX_LEN];
	double t0;
	long wp_seen = 0, pages;

	if (!set_bg_cap(vm, true, line, sizeof(line)) ||
	    qmp(vm, line, sizeof(line), 60000,
		"{\"execute\": \"migrate\", \"arguments\": {\"uri\": \"%s\"}}", uri) ||
	    !strstr(line, "\"return\"")) {
		snprintf(why, whysz, "migrate: %.400s", line);
		return false;
	}
	t0 = now_ms();
	for (;;) {
		if (qmp(vm, line, sizeof(line), 30000, "{\"execute\": \"query-migrate\"}") ||
		    !json_str(line, "status", status, stsz)) {
			snprintf(why, whysz, "query-migrate: %.400s", line);
			return false;
		}
		if (!strcmp(status, "active")) {
			long wp = wp_pages(vm->pid, &pages);

			if (wp > wp_seen)
				wp_seen = wp;
		}
		if (strcmp(status, "setup") && strcmp(status, "active"))
			break;
		/* Mid-snapshot: active, pages seen protected, WAIT_MS gone. */
		if (!strcmp(status, "active") && now_ms() - t0 >= wait_ms && wp_seen > 0)
			break;
		usleep(10000);
	}
	tap_diag("%s after %.0f ms; up to %ld pages of the guest RAM seen write-protected meanwhile",
		 status, now_ms() - t0, wp_seen);
	return true;
}

static bool wait_status(struct vm *vm, const char *want, char *info, size_t sz)
{
	char st[64] = "";
	double deadline = now_ms() + op_s * 1000.0;

	while (now_ms() < deadline) {
		if (qmp(vm, info, sz, 30000, "{\"execute\": \"query-migrate\"}") ||
		    !json_str(info, "status", st, sizeof(st)))
			return false;
		if (!strcmp(st, want))
			return true;
		if (strcmp(st, "setup") && strcmp(st, "active") && strcmp(st, "cancelling"))
			return false;
		usleep(20000);
	}
	return false;
}

static int source_start(struct vm *vm, const char *tag, char *why, size_t whysz);

/*
 * Faults waiting on PID's userfaultfd (the "total" of its fdinfo: queued
 * and read but not yet woken), or -1 when PID holds no userfaultfd.
 */
static long uffd_waiting(pid_t pid)
{
	char path[64], fdp[320], link[128], line[256];
	struct dirent *d;
	long total = -1;
	DIR *dp;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dp = opendir(path);
	if (!dp)
		return -1;
	while (total < 0 && (d = readdir(dp))) {
		ssize_t n;
		FILE *f;

		snprintf(fdp, sizeof(fdp), "%s/%s", path, d->d_name);
		n = readlink(fdp, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		if (!strstr(link, "userfaultfd"))
			continue;
		snprintf(fdp, sizeof(fdp), "/proc/%d/fdinfo/%s", (int)pid, d->d_name);
		f = fopen(fdp, "r");
		if (!f)
			continue;
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "total:", 6))
				total = strtol(line + 6, NULL, 10);
		fclose(f);
	}
	closedir(dp);
	return total;
}

/*
 * After a background snapshot that ended without completing (ENDED: it
 * did end as asked), case NAME: the VM runs on, its records right, no page
 * write-protected.  QEMU 7.2 does not let go of its userfaultfd when the
 * snapshot fails or is cancelled: the VM hangs with a vCPU's write fault
 * waiting on that userfaultfd (its fdinfo counts it) and most of its RAM
 * still protected.  That exact state
 * is QEMU's bug, not the kernel's (the context is alive and the fault waits
 * for its handler, as told): a skip saying so (declared in
 * lanes/LANE-clients.skips, so a QEMU that fixes it is noticed).  Anything
 * else that keeps the VM from running on fails.  Then the VM is stopped:
 * QEMU must go at once, the stuck vCPU too (the kernel's part).
 */
static void runs_on(struct vm *vm, bool ended, const char *name, const char *how)
{
	char why[1024];
	double t0;

	if (!ended) {
		tap_fail(name, "the snapshot did not end as asked");
	} else if (vm_recovered(vm, why, sizeof(why))) {
		tap_pass(name);
	} else if (uffd_waiting(vm->pid) > 0) {
		/* Killed with a vCPU stuck in the fault: gone at once. */
		int status;

		t0 = now_ms();
		kill(vm->pid, SIGKILL);
		while (waitpid(vm->pid, &status, WNOHANG) == 0 && now_ms() - t0 < 60000)
			usleep(10000);
		if (waitpid(vm->pid, &status, WNOHANG) == 0) {
			tap_fail(name, "%s; QEMU, killed with a fault waiting on its "
				 "userfaultfd, still there after 60 s", why);
			return;
		}
		tap_diag("%s: killed with a fault waiting on its userfaultfd, reaped after %.0f ms",
			 vm->tag, now_ms() - t0);
		vm->pid = -1;
		tap_skip(name, "QEMU 7.2 keeps its userfaultfd registered after a background "
			 "snapshot %s: a vCPU's write fault waits on it for ever (%.200s)",
			 how, why);
	} else {
		long w = uffd_waiting(vm->pid);

		tap_fail(name, w < 0 ? "%s; QEMU holds no userfaultfd" :
			 "%s; no fault waits on QEMU's userfaultfd", why);
	}
	vm_stop(vm);
}

/*
 * The snapshot's file system fills up: QEMU must fail the migration, and
 * the VM run on with every page writable.  Its own VM (QEMU 7.2 leaves
 * the VM hung here).  Two results: the failure, and what follows.
 */
static void case_enospc(void)
{
	const char *mnt = "/tmp/qemu-snapshot-small";
	char file[128], uri[160], st[64], info[LINE_MAX_LEN], why[1024] = "", msg[512] = "";
	bool failed = false;
	struct vm vm;

	if (source_start(&vm, "enospc", why, sizeof(why))) {
		tap_fail("bg-enospc-fails", "%s", why);
		tap_fail("bg-enospc-vm-runs-on", "no VM");
		vm_stop(&vm);
		return;
	}
	mkdir(mnt, 0700);
	if (mount("tmpfs", mnt, "tmpfs", 0, "size=8m")) {
		tap_fail("bg-enospc-fails", "mount a 8 MiB tmpfs on %s: %s", mnt,
			 strerror(errno));
		tap_fail("bg-enospc-vm-runs-on", "no snapshot");
		vm_stop(&vm);
		return;
	}
	snprintf(file, sizeof(file), "%s/snap.bin", mnt);
	snprintf(uri, sizeof(uri), "exec:cat > %s", file);
	if (bg_start(&vm, uri, 0, st, sizeof(st), why, sizeof(why))) {
		failed = wait_status(&vm, "failed", info, sizeof(info));
		if (failed) {
			json_str(info, "error-desc", msg, sizeof(msg));
			tap_diag("QEMU on a full file system: failed: \"%s\"", msg);
		} else {
			snprintf(why, sizeof(why), "the migration into 8 MiB did not fail: %.400s", info);
		}
	}
	tap_check(failed, "bg-enospc-fails", "%s", why);
	runs_on(&vm, failed, "bg-enospc-vm-runs-on", "fails on a write error");
	vm_stop(&vm);
	unlink(file);
	umount(mnt);
	rmdir(mnt);
}

/* migrate_cancel half way, in a VM of its own: the snapshot ends as
 * cancelled, and the VM runs on with every page writable. */
static void case_cancel(double bg_ms)
{
	char file[300], uri[400], st[64], info[LINE_MAX_LEN], line[LINE_MAX_LEN], why[1024] = "";
	bool ok = false;
	struct vm vm;

	if (source_start(&vm, "cancel", why, sizeof(why))) {
		tap_fail("bg-cancel-cancels", "%s", why);
		tap_fail("bg-cancel-vm-runs-on", "no VM");
		vm_stop(&vm);
		return;
	}
	snprintf(file, sizeof(file), "%s/snap-cancel.bin", dir);
	snprintf(uri, sizeof(uri), "exec:cat > %s", file);
	if (bg_start(&vm, uri, bg_ms / 10, st, sizeof(st), why, sizeof(why))) {
		if (strcmp(st, "active")) {
			snprintf(why, sizeof(why), "the snapshot was %s before migrate_cancel", st);
		} else if (qmp(&vm, line, sizeof(line), 60000, "{\"execute\": \"migrate_cancel\"}") ||
			   !strstr(line, "\"return\"")) {
			snprintf(why, sizeof(why), "migrate_cancel: %.400s", line);
		} else if (!wait_status(&vm, "cancelled", info, sizeof(info))) {
			snprintf(why, sizeof(why), "not cancelled: %.400s", info);
		} else {
			ok = true;
		}
	}
	tap_check(ok, "bg-cancel-cancels", "%s", why);
	runs_on(&vm, ok, "bg-cancel-vm-runs-on", "is cancelled");
	unlink(file);
}

/* QEMU killed during the snapshot: the kernel lets it go at once. */
static void case_kill(struct vm *vm, double bg_ms)
{
	char file[300], uri[400], st[64], why[1024] = "";
	bool ok = false;
	int status;

	snprintf(file, sizeof(file), "%s/snap-kill.bin", dir);
	snprintf(uri, sizeof(uri), "exec:cat > %s", file);
	if (bg_start(vm, uri, bg_ms / 10, st, sizeof(st), why, sizeof(why))) {
		if (strcmp(st, "active")) {
			snprintf(why, sizeof(why), "the snapshot was %s before the kill", st);
		} else {
			double t0 = now_ms();

			kill(vm->pid, SIGKILL);
			while (waitpid(vm->pid, &status, WNOHANG) == 0 && now_ms() - t0 < 60000)
				usleep(10000);
			if (waitpid(vm->pid, &status, WNOHANG) == 0) {
				snprintf(why, sizeof(why), "QEMU not gone 60 s after SIGKILL");
			} else {
				tap_diag("QEMU killed mid-snapshot, reaped after %.0f ms", now_ms() - t0);
				vm->pid = -1;
				ok = true;
			}
		}
	}
	tap_check(ok, "bg-kill-releases", "%s", why);
	unlink(file);
}

/* Start a source VM and wait until the nested VM is up; no rate limit
 * (7.2's default is 128 MiB/s): each variant goes as fast as the exec:
 * pipe and the file take it.  0, or -1 with WHY. */
static int source_start(struct vm *vm, const char *tag, char *why, size_t whysz)
{
	char line[LINE_MAX_LEN];
	double t0 = now_ms();
	int err = vm_start(vm, tag, NULL);

	if (err) {
		show_err_log(vm);
		snprintf(why, whysz, "QEMU did not start: %s", strerror(-err));
		return -1;
	}
	if (!serial_expect(vm, "@ready", line, sizeof(line), boot_s * 1000.0)) {
		show_err_log(vm);
		snprintf(why, whysz, "the nested VM did not come up within %d s", boot_s);
		return -1;
	}
	nrec = 0;
	{
		const char *p = strstr(line, "records=");

		nrec = p ? strtoull(p + 8, NULL, 10) : 0;
	}
	tap_diag("%s: nested VM up in %.1f s: %s", tag, (now_ms() - t0) / 1000, line);
	if (qmp(vm, line, sizeof(line), 10000,
		"{\"execute\": \"migrate-set-parameters\", \"arguments\": "
		"{\"max-bandwidth\": 17179869184}}") || !strstr(line, "\"return\""))
		tap_diag("migrate-set-parameters max-bandwidth: %s", line);
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: qemu-snapshot [--qemu PATH] [--image PATH] [--mem MIB] "
		"[--reps N] [--dir DIR] [--no-savevm] [--expect-refusal]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	char line[LINE_MAX_LEN], why[2048], name[64], file[300], qcow[300];
	struct figures f;
	struct vm src;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--expect-refusal")) {
			expect_refusal = true;
		} else if (!strcmp(a, "--no-savevm")) {
			do_savevm = false;
		} else if (v && !strcmp(a, "--qemu")) {
			qemu_bin = v, i++;
		} else if (v && !strcmp(a, "--image")) {
			image = v, i++;
		} else if (v && !strcmp(a, "--dir")) {
			dir = v, i++;
		} else if (v && !strcmp(a, "--mem")) {
			mem_mib = atoi(v), i++;
		} else if (v && !strcmp(a, "--reps")) {
			reps = atoi(v), i++;
		} else {
			usage();
		}
	}
	if (mem_mib < 16 || reps < 1 || reps > 50)
		usage();
	signal(SIGPIPE, SIG_IGN);
	tap_plan(expect_refusal ? 2 : 8 + reps * 7);
	tap_diag("QEMU %s, nested VM %s with %d MiB, %d repetitions", qemu_bin,
		 image, mem_mib, reps);

	if (source_start(&src, "src", why, sizeof(why))) {
		vm_stop(&src);
		tap_bail("%s", why);
	}
	tap_pass("qemu-boots");
	if (qmp(&src, line, sizeof(line), 10000, "{\"execute\": \"query-version\"}") == 0)
		tap_diag("query-version: %s", line);

	bool accepted = set_bg_cap(&src, true, line, sizeof(line));
	char msg[512] = "";

	if (!accepted)
		json_str(line, "desc", msg, sizeof(msg));
	if (expect_refusal) {
		if (!accepted)
			tap_diag("QEMU refuses background-snapshot: \"%s\"", msg);
		tap_check(!accepted && msg[0], "background-snapshot-refused",
			  "QEMU %s the capability on a kernel expected to lack uffd-wp: %s",
			  accepted ? "accepted" : "refused without a message", line);
		vm_stop(&src);
		return tap_done();
	}
	if (!tap_check(accepted, "background-snapshot-accepted",
		       "QEMU refuses the capability: %s", msg[0] ? msg : line)) {
		vm_stop(&src);
		tap_bail("no background snapshot");
	}

	snprintf(qcow, sizeof(qcow), "%s/savevm.qcow2", dir);
	bool have_qcow = false;
	double bg_ms = 3000;
	char qcow_why[512] = "--no-savevm";

	if (do_savevm)
		have_qcow = make_qcow2(&src, qcow, qcow_why, sizeof(qcow_why));

	for (int r = 1; r <= reps; r++) {
		/* The background snapshot. */
		snprintf(file, sizeof(file), "%s/snap-bg.bin", dir);
		snprintf(name, sizeof(name), "bg-%d-completes", r);
		bool done = migrate_to_file(&src, true, file, &f, why, sizeof(why));

		if (done && f.during <= 0) {
			done = false;
			snprintf(why, sizeof(why),
				 "the VM did not answer while the snapshot ran (%lld updates seen)",
				 f.during);
		}
		if (tap_check(done, name, "%s", why))
			emit("background", &f);
		if (done)
			bg_ms = f.total_ms;
		snprintf(name, sizeof(name), "bg-%d-source-intact", r);
		bool live = ask(&src, 'V', "@verify", line, sizeof(line), op_s * 1000.0);

		tap_check(live && !strncmp(line, "@verify ok", 10), name,
			  "the running VM after the snapshot: %s", live ? line : "no answer");
		snprintf(name, sizeof(name), "bg-%d-restored", r);
		if (done) {
			char uri[400];
			const char *ex[] = { "-incoming", uri, NULL };

			snprintf(uri, sizeof(uri), "exec:cat %s", file);
			tap_check(restore_and_check("dst-bg", ex, why, sizeof(why)),
				  name, "%s", why);
		} else {
			tap_fail(name, "no snapshot to restore");
		}
		unlink(file);

		/* Stop-and-copy. */
		snprintf(file, sizeof(file), "%s/snap-sc.bin", dir);
		snprintf(name, sizeof(name), "stopcopy-%d-completes", r);
		done = migrate_to_file(&src, false, file, &f, why, sizeof(why));
		if (tap_check(done, name, "%s", why))
			emit("stop_copy", &f);
		snprintf(name, sizeof(name), "stopcopy-%d-restored", r);
		if (done) {
			char uri[400];
			const char *ex[] = { "-incoming", uri, NULL };

			snprintf(uri, sizeof(uri), "exec:cat %s", file);
			tap_check(restore_and_check("dst-sc", ex, why, sizeof(why)),
				  name, "%s", why);
		} else {
			tap_fail(name, "no snapshot to restore");
		}
		/* The check can fail: the same file with one record from a
		 * later instant must be caught, that record named. */
		if (r == 1) {
			uint64_t g = 0, so = 0, sn = 0;
			char uri[400], want[128];
			const char *ex[] = { "-incoming", uri, NULL };
			bool found = done && !mix_one_record(file, &g, &so, &sn);

			snprintf(uri, sizeof(uri), "exec:cat %s", file);
			snprintf(want, sizeof(want), "@verify bad=1 first=%llu want=%llu got=%llu/%llu",
				 (unsigned long long)g, (unsigned long long)so,
				 (unsigned long long)sn, (unsigned long long)sn);
			last_verify[0] = 0;
			if (found) {
				tap_diag("mixed copy: record %llu at update %llu replaced by its update %llu",
					 (unsigned long long)g, (unsigned long long)so,
					 (unsigned long long)sn);
				restore_and_check("dst-mixed", ex, why, sizeof(why));
			}
			tap_check(found && !strncmp(last_verify, want, strlen(want)),
				  "mixed-copy-detected",
				  "%s", !found ? "no record found in the stop-and-copy file" :
				  last_verify[0] ? last_verify : why);
		}
		unlink(file);

		/* savevm into the qcow2 image, then -loadvm. */
		char snaptag[32];

		snprintf(snaptag, sizeof(snaptag), "s%d", r);
		snprintf(name, sizeof(name), "savevm-%d-completes", r);
		if (!have_qcow) {
			tap_skip(name, "%s", qcow_why);
			snprintf(name, sizeof(name), "savevm-%d-restored", r);
			tap_skip(name, "%s", qcow_why);
			continue;
		}
		done = savevm(&src, snaptag, &f, why, sizeof(why));
		if (tap_check(done, name, "%s", why))
			emit("savevm", &f);
		snprintf(name, sizeof(name), "savevm-%d-restored", r);
		if (done) {
			char bd1[400];
			const char *ex[] = {
				"-blockdev", bd1, "-blockdev",
				"driver=qcow2,node-name=q0,file=f0",
				"-loadvm", snaptag, NULL
			};

			snprintf(bd1, sizeof(bd1), "driver=file,node-name=f0,locking=off,filename=%s", qcow);
			tap_check(restore_and_check("dst-savevm", ex, why, sizeof(why)),
				  name, "%s", why);
		} else {
			tap_fail(name, "no snapshot to restore");
		}
	}
	unlink(qcow);

	/* Faults: a full file system, a cancel, a kill, each mid-snapshot. */
	case_kill(&src, bg_ms);
	vm_stop(&src);
	case_cancel(bg_ms);
	case_enospc();
	return tap_done();
}
