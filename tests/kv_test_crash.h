/* SPDX-License-Identifier: MIT */
/*
 * kv_test_crash.h — the kill -9 harness the crash tests share
 * (tests/integration/test_store_crash.c, test_prefix_crash.c).
 *
 * A round forks a child that runs a workload on a page file and tells the
 * parent through a pipe what it is about to do; the parent reads those
 * messages until a random moment, kills the child with SIGKILL, reads what
 * is left in the pipe, and then checks the file against what it was told.
 *
 * Messages: every one is a test-defined struct of c->msg_size bytes (at
 * most PIPE_BUF: one write() each, so atomic) that starts with a
 * kvt_crash_hdr_t. Two types belong to the harness: KVT_CRASH_PHASE (id =
 * the phase the child enters; the round reports the last one) and
 * KVT_CRASH_ERR (a failed check in the child: rc and line). The test's
 * take() applies every other message to a model of what the file must
 * hold; the child applies its own messages to its copy (c->child_model)
 * before sending them, so the two models agree up to the kill.
 *
 * The child never returns from its workload: it is killed, or a failed
 * check ends it with _exit (no atexit handlers, so no LeakSanitizer pass:
 * a killed child's memory is not a leak). Also here: kv_store_create
 * retried while the killed child's lock lingers (KV_EBUSY), and a clock.
 */
#ifndef KV_TEST_CRASH_H
#define KV_TEST_CRASH_H

#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kv_test.h"

typedef struct kvt_crash_hdr {
    uint32_t type, id;
    int32_t rc, line; /* KVT_CRASH_ERR */
} kvt_crash_hdr_t;

#define KVT_CRASH_PHASE 0xfffffffeu
#define KVT_CRASH_ERR   0xffffffffu

/* Apply one test message to a model. */
typedef void (*kvt_crash_take_fn)(void *model, const void *msg);

typedef struct kvt_crash {
    size_t msg_size;         /* the test's message struct, <= PIPE_BUF  */
    kvt_crash_take_fn take;
    void *child_model;       /* the child's model (a copy after fork)   */
    int wfd;                 /* child: the pipe's write end             */
} kvt_crash_t;

static inline double kvt_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Child: apply msg to the child's model, then send it. */
static inline void kvt_crash_say(const kvt_crash_t *c, const void *msg)
{
    const kvt_crash_hdr_t *h = msg;
    if (h->type != KVT_CRASH_PHASE && h->type != KVT_CRASH_ERR)
        c->take(c->child_model, msg);
    if (write(c->wfd, msg, c->msg_size) != (ssize_t)c->msg_size)
        _exit(4);
}

/* Child: announce the phase it enters. */
static inline void kvt_crash_phase(const kvt_crash_t *c, uint32_t phase)
{
    unsigned char buf[PIPE_BUF] = {0};
    *(kvt_crash_hdr_t *)buf = (kvt_crash_hdr_t){.type = KVT_CRASH_PHASE, .id = phase};
    kvt_crash_say(c, buf);
}

/* Child: report a failed check (rc, line) and end. */
static inline void kvt_crash_fail(const kvt_crash_t *c, int rc, int line)
{
    unsigned char buf[PIPE_BUF] = {0};
    *(kvt_crash_hdr_t *)buf = (kvt_crash_hdr_t){.type = KVT_CRASH_ERR, .rc = rc, .line = line};
    if (write(c->wfd, buf, c->msg_size) < 0)
        _exit(5);
    _exit(3);
}

#define KVT_CHILD_CHECK(c, cond, rc_)                \
    do {                                             \
        if (!(cond))                                 \
            kvt_crash_fail((c), (rc_), __LINE__);    \
    } while (0)

/* Parent: apply messages to model until the deadline (until EOF when
 * deadline < 0). Returns 1 at EOF (the child is gone). */
static inline int kvt_crash_pump(const kvt_crash_t *c, int rfd, void *model, int *phase,
                                 int *err, double deadline)
{
    unsigned char buf[PIPE_BUF];
    for (;;) {
        int wait_ms = -1;
        if (deadline >= 0) {
            double left = deadline - kvt_now_s();
            if (left <= 0)
                return 0;
            wait_ms = (int)(left * 1000) + 1;
        }
        struct pollfd p = {.fd = rfd, .events = POLLIN};
        if (poll(&p, 1, wait_ms) <= 0)
            continue;
        ssize_t n = read(rfd, buf, c->msg_size);
        if (n == 0)
            return 1;
        if (n != (ssize_t)c->msg_size)
            continue;
        const kvt_crash_hdr_t *h = (const kvt_crash_hdr_t *)buf;
        if (h->type == KVT_CRASH_PHASE) {
            *phase = (int)h->id;
        } else if (h->type == KVT_CRASH_ERR) {
            fprintf(stderr, "child failed at line %d: %s\n", h->line, kv_strerror(h->rc));
            *err = 1;
        } else {
            c->take(model, buf);
        }
    }
}

/* One round: fork a child that runs child(arg) (which never returns), apply
 * its messages to model for `delay` seconds, kill it (SIGKILL), apply the
 * rest. *phase = the last phase it announced (-1: none). Returns 0 when
 * the child died of that SIGKILL without reporting a failure, else -1. */
static inline int kvt_crash_round(kvt_crash_t *c, void (*child)(void *), void *arg, void *model,
                                  double delay, int *phase)
{
    int p[2];
    if (pipe(p) != 0) {
        perror("pipe");
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        c->wfd = p[1];
        child(arg);
        _exit(6);
    }
    close(p[1]);
    int err = 0;
    *phase = -1;
    int gone = kvt_crash_pump(c, p[0], model, phase, &err, kvt_now_s() + delay);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!gone)
        kvt_crash_pump(c, p[0], model, phase, &err, -1);
    close(p[0]);
    if (err || !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
        fprintf(stderr, "the child ended on its own (status %d)\n", status);
        return -1;
    }
    return 0;
}

/* kv_store_create, retried for up to 5 s while it returns KV_EBUSY (the
 * killed child's file lock goes with its last reference, which the kernel
 * may drop a moment after the kill); *busy counts the retries. */
static inline int kvt_crash_open(const kv_config_t *c, kv_store_t **st, long *busy)
{
    int rc;
    for (int i = 0; (rc = kv_store_create(c, st)) == KV_EBUSY && i < 500; i++) {
        (*busy)++;
        usleep(10000);
    }
    return rc;
}

#endif /* KV_TEST_CRASH_H */
