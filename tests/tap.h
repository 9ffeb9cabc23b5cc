/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tap.h: the few TAP helpers our guest test programs share.
 *
 * Each program prints "1..N" first, then one line per case.  Output goes
 * straight to fd 1 with one write per line, so lines stay whole across
 * fork() and threads.  A case that cannot run for a reason outside the code
 * under test is a skip and must say why; a case whose behaviour is wrong is
 * "not ok" with the evidence in the diagnostic.
 */
#ifndef UFFDWP_TESTS_TAP_H
#define UFFDWP_TESTS_TAP_H

#include <stdbool.h>
#include <sys/types.h>

void tap_plan(int n);
/* Report one case.  The diagnostic (printf-style) is shown only on failure. */
bool tap_check(bool ok, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void tap_pass(const char *name);
void tap_fail(const char *name, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void tap_skip(const char *name, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* A "# ..." comment line. */
void tap_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Exit status for main(): 0 when every reported case passed or skipped and
 * the count matches the plan, 1 otherwise. */
int tap_done(void);
/* Give up: report the remaining planned cases as failed and exit. */
void tap_bail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/*
 * Cases run each in a child process with a watchdog.  tap_child_init(),
 * before the first: map the page shared with the children, tap_msg (false
 * when it cannot).  tap_fork_case(): tap_msg emptied, stdout flushed,
 * fork() (bailing out when it fails); the child (0 returned) has set
 * alarm(SECS).  tap_leave(), in the child: the reason into tap_msg, then
 * _exit(CODE).
 */
#define TAP_MSG_SIZE 4096
extern char *tap_msg;
bool tap_child_init(void);
pid_t tap_fork_case(unsigned int secs);
void tap_leave(int code, const char *fmt, ...)
	__attribute__((format(printf, 2, 3), noreturn));

#endif
