// SPDX-License-Identifier: GPL-2.0
/* tap.c: see tap.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"

static int planned, reported, failed;

static void emit(const char *buf, int n)
{
	while (n > 0) {
		ssize_t w = write(1, buf, n);

		if (w <= 0)
			return;
		buf += w;
		n -= w;
	}
}

static void line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void line(const char *fmt, ...)
{
	char buf[2048];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n > (int)sizeof(buf) - 2)
		n = sizeof(buf) - 2;
	/* Keep a diagnostic on its line: newlines inside become spaces. */
	for (int i = 0; i < n; i++)
		if (buf[i] == '\n')
			buf[i] = ' ';
	buf[n++] = '\n';
	emit(buf, n);
}

void tap_plan(int n)
{
	planned = n;
	line("1..%d", n);
}

static void result(int ok, const char *name, const char *directive,
		   const char *why)
{
	reported++;
	if (!ok)
		failed++;
	if (directive)
		line("ok %d %s # %s %s", reported, name, directive, why);
	else if (ok)
		line("ok %d %s", reported, name);
	else
		line("not ok %d %s # %s", reported, name, why);
}

#define FORMAT(buf, fmt)					\
	do {							\
		va_list ap;					\
		va_start(ap, fmt);				\
		vsnprintf(buf, sizeof(buf), fmt, ap);		\
		va_end(ap);					\
	} while (0)

bool tap_check(bool ok, const char *name, const char *fmt, ...)
{
	char why[1024] = "";

	if (!ok)
		FORMAT(why, fmt);
	result(ok, name, NULL, why);
	return ok;
}

void tap_pass(const char *name)
{
	result(1, name, NULL, "");
}

void tap_fail(const char *name, const char *fmt, ...)
{
	char why[1024];

	FORMAT(why, fmt);
	result(0, name, NULL, why);
}

void tap_skip(const char *name, const char *fmt, ...)
{
	char why[1024];

	FORMAT(why, fmt);
	result(1, name, "SKIP", why);
}

void tap_diag(const char *fmt, ...)
{
	char buf[1024];

	FORMAT(buf, fmt);
	line("# %s", buf);
}

int tap_done(void)
{
	if (reported != planned)
		line("# planned %d cases, reported %d", planned, reported);
	return failed || reported != planned;
}

void tap_bail(const char *fmt, ...)
{
	char buf[1024];

	FORMAT(buf, fmt);
	while (reported < planned) {
		reported++;
		failed++;
		line("not ok %d bail-out-%d # not run: %s", reported, reported, buf);
	}
	exit(1);
}

char *tap_msg;

bool tap_child_init(void)
{
	void *p = mmap(NULL, TAP_MSG_SIZE, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return false;
	tap_msg = p;
	return true;
}

pid_t tap_fork_case(unsigned int secs)
{
	pid_t pid;

	tap_msg[0] = 0;
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		tap_bail("fork: %s", strerror(errno));
	if (pid == 0)
		alarm(secs);
	return pid;
}

void tap_leave(int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tap_msg, TAP_MSG_SIZE, fmt, ap);
	va_end(ap);
	_exit(code);
}
