/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_conn.c — one TCP connection per server node, and the I/O loop
 * that drives all of them at once against a deadline.
 *
 * Sockets are non-blocking from the start (connect included); every wait is
 * a poll() bounded by the caller's deadline, so no server can hold a call
 * longer than that. Writes use send(MSG_NOSIGNAL): a peer that went away is
 * an error, never SIGPIPE. Replies are parsed by hiredis's redisReader (the
 * RESP protocol); bytes are read in KV_REMOTE_RBUF pieces and fed to it in
 * KV_FEED pieces with the replies taken out after each (its buffer drops
 * consumed bytes with a memmove of what is left, so feeding much more than
 * a reply at a time would move the same bytes many times). The reader never
 * holds more than one unfinished reply of at most KV_REPLY_MAX bytes, and a
 * read loop stops at the deadline, so a server that streams without end
 * costs bounded memory and time.
 *
 * A node that fails (connect refused or timed out, reset, EOF, protocol
 * error, no reply by the deadline) is closed, the entries still on its fifo
 * are failed through the caller's callback, and its backoff grows: no new
 * connect before backoff_ms << (fails - 1) (at most backoff_max_ms, with
 * +-25% jitter). A reply from the node resets it.
 *
 * A connect is TCP, then (rediss) the TLS handshake (kv_remote_tls.c), both
 * bounded by the connect's deadline; then, with credentials, the AUTH
 * command goes first in the node's output (fifo entry KV_FIFO_AUTH), so it
 * costs no round trip of its own. An AUTH refused fails the node with
 * KV_EAUTH: its waiting keys get KV_EAUTH, and so do connects during the
 * backoff that follows (fail_rc), so a wrong password never reads as a
 * server that is merely down.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "remote/kv_remote_int.h"

#define KV_FEED (16u << 10) /* bytes fed to the reader at a time */
/* Most bytes one unfinished reply may hold in the reader (a value and room
 * for the bulk string's framing): more is a broken or hostile server. */
#define KV_REPLY_MAX ((size_t)KV_REMOTE_MAX_PAYLOAD + KV_REC_FRAME_BYTES + 64)

uint64_t kv_remote_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int kv_remote_node_get(struct kv_remote *r, const kv_remote_addr_t *addr, uint32_t *idx)
{
    for (uint32_t i = 0; i < r->n_nodes; i++)
        if (r->nodes[i]->addr.port == addr->port && !strcmp(r->nodes[i]->addr.host, addr->host)) {
            *idx = i;
            return 0;
        }
    if (r->n_nodes == KV_REMOTE_MAX_NODES)
        return KV_ELIMIT;
    kv_remote_node_t *n = kv_mem_calloc(1, sizeof *n);
    if (!n)
        return KV_ENOMEM;
    n->addr = *addr;
    n->fd = -1;
    *idx = r->n_nodes;
    r->nodes[r->n_nodes++] = n;
    return 0;
}

void kv_remote_node_close(kv_remote_node_t *n)
{
    kv_remote_tls_close(n);
    if (n->fd >= 0)
        close(n->fd);
    if (n->reader)
        redisReaderFree(n->reader);
    n->fd = -1;
    n->reader = NULL;
    n->out_len = n->out_off = 0;
    n->fifo_n = n->fifo_head = 0;
}

void kv_remote_node_free(kv_remote_node_t *n)
{
    if (!n)
        return;
    kv_remote_node_close(n);
    kv_mem_free(n->out, n->out_cap);
    kv_mem_free(n->fifo, n->fifo_cap * sizeof *n->fifo);
    kv_mem_free(n, sizeof *n);
}

void kv_remote_node_fail(struct kv_remote *r, kv_remote_node_t *n)
{
    kv_remote_node_close(n);
    uint32_t shift = n->fails < 20 ? n->fails : 20;
    uint64_t ms = (uint64_t)r->cfg.backoff_ms << shift;
    if (ms > r->cfg.backoff_max_ms)
        ms = r->cfg.backoff_max_ms;
    /* jitter +-25% (xorshift), so that clients do not retry in step */
    r->rng ^= r->rng << 13, r->rng ^= r->rng >> 7, r->rng ^= r->rng << 17;
    uint64_t ns = ms * 1000000ull;
    ns = ns - ns / 4 + (r->rng % (ns / 2 + 1));
    n->fails++;
    n->retry_ns = kv_remote_now_ns() + ns;
}

/* Milliseconds from now to deadline for poll() (rounded up, >= 0). */
static int kv_poll_ms(uint64_t deadline)
{
    uint64_t now = kv_remote_now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > 1000000000 ? 1000000000 : (int)ms;
}

/* Non-blocking connect of fd to ai, waiting at most until deadline. */
static int kv_connect_one(const struct addrinfo *ai, uint64_t deadline, int *fd_out)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int rc = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        rc = errno == EINPROGRESS ? 0 : -errno;
        while (!rc) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int ms = kv_poll_ms(deadline);
            int k = ms ? poll(&p, 1, ms) : 0;
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                rc = k < 0 ? -errno : -ETIMEDOUT;
                break;
            }
            int err = 0;
            socklen_t len = sizeof err;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
            rc = err ? -err : 1;
        }
    }
    if (rc < 0) {
        close(fd);
        return rc;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *fd_out = fd;
    return 0;
}

int kv_remote_node_connect(struct kv_remote *r, kv_remote_node_t *n, uint64_t deadline)
{
    if (n->fd >= 0)
        return 0;
    uint64_t now = kv_remote_now_ns();
    if (now < n->retry_ns)
        return n->fail_rc ? n->fail_rc : KV_EIO; /* in backoff */
    if (now >= deadline)
        return -ETIMEDOUT;
    uint64_t cdl = now + (uint64_t)r->cfg.connect_timeout_ms * 1000000ull;
    if (cdl > deadline)
        cdl = deadline;
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)n->addr.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV}, *res = NULL;
    int rc = getaddrinfo(n->addr.host, port, &hints, &res) ? KV_EIO : -ECONNREFUSED;
    for (struct addrinfo *ai = res; ai && rc != 0 && rc != -ETIMEDOUT; ai = ai->ai_next)
        rc = kv_connect_one(ai, cdl, &n->fd);
    if (res)
        freeaddrinfo(res);
    if (!rc && r->tls) {
        rc = kv_remote_tls_connect(r->tls, n, cdl);
        if (rc && rc != KV_ENOMEM)
            kv_remote_count(r, KV_RC_TLS_FAILURES, 1);
    }
    if (!rc && !(n->reader = redisReaderCreate()))
        rc = KV_ENOMEM;
    if (!rc && r->auth) { /* AUTH first: reserve, then it cannot fail */
        rc = kv_remote_node_reserve(n, r->auth_len, 1);
        if (!rc) {
            kv_remote_node_push(n, KV_FIFO_AUTH);
            kv_remote_node_append(n, r->auth, r->auth_len);
        }
    }
    if (rc == KV_ENOMEM) { /* ours, not the node's: no backoff */
        kv_remote_node_close(n);
        return rc;
    }
    if (rc) {
        kv_remote_count(r, KV_RC_CONNECT_FAILURES, 1);
        if (n->fd >= 0 && rc == -ETIMEDOUT && r->tls)
            rc = KV_ETLS; /* TCP up, no TLS answer in time: not a TLS server? */
        kv_remote_node_fail(r, n);
        n->fail_rc = rc == KV_ETLS ? KV_ETLS : 0;
        return rc == -ETIMEDOUT || rc == KV_ETLS ? rc : KV_EIO;
    }
    n->epoch_connect = r->epoch;
    kv_remote_count(r, KV_RC_CONNECTS, 1);
    return 0;
}

int kv_remote_grow(void **arr, size_t *cap, size_t used, size_t need, size_t elem)
{
    if (*cap - used >= need)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c - used < need)
        c *= 2;
    void *p = kv_mem_realloc(*arr, *cap * elem, c * elem);
    if (!p)
        return KV_ENOMEM;
    *arr = p;
    *cap = c;
    return 0;
}

int kv_remote_node_reserve(kv_remote_node_t *n, size_t bytes, size_t entries)
{
    void *out = n->out, *fifo = n->fifo;
    int rc = kv_remote_grow(&out, &n->out_cap, n->out_len, bytes, 1);
    n->out = out;
    if (!rc)
        rc = kv_remote_grow(&fifo, &n->fifo_cap, n->fifo_n, entries, sizeof *n->fifo);
    n->fifo = fifo;
    return rc;
}

void kv_remote_node_append(kv_remote_node_t *n, const void *p, size_t len)
{
    if (len) /* (p may be NULL then: an empty iovec) */
        memcpy(n->out + n->out_len, p, len);
    n->out_len += len;
}

void kv_remote_node_push(kv_remote_node_t *n, uint32_t entry)
{
    n->fifo[n->fifo_n++] = entry;
}

size_t kv_remote_cmd_bytes(int argc, const size_t *lens)
{
    size_t total = 16; /* "*argc\r\n" */
    for (int i = 0; i < argc; i++)
        total += 24 + lens[i]; /* "$len\r\n" bytes "\r\n" */
    return total;
}

void kv_remote_node_cmd(kv_remote_node_t *n, int argc, const char *const *argv,
                        const size_t *lens)
{
    n->out_len += (size_t)sprintf(n->out + n->out_len, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) {
        n->out_len += (size_t)sprintf(n->out + n->out_len, "$%zu\r\n", lens[i]);
        kv_remote_node_append(n, argv[i], lens[i]);
        kv_remote_node_append(n, "\r\n", 2);
    }
}

int kv_remote_auth_refused(const void *reply)
{
    const redisReply *rep = reply;
    return rep->type == REDIS_REPLY_ERROR &&
           (!strncmp(rep->str, "NOAUTH", 6) || !strncmp(rep->str, "WRONGPASS", 9) ||
            !strncmp(rep->str, "NOPERM", 6));
}

/* Fail node i: every entry it still awaits gets status, then close it. */
static void kv_node_abort(struct kv_remote *r, uint32_t i, int status,
                          kv_remote_fail_fn on_fail, void *call)
{
    kv_remote_node_t *n = r->nodes[i];
    /* A connection from an earlier call that fails before its first reply
     * in this one was most likely closed while idle (a server restart):
     * retry its commands once on a new connection, no backoff. */
    int idle_drop = status == KV_EIO && n->epoch_connect != r->epoch &&
                    n->epoch_reply != r->epoch;
    n->fail_rc = status == KV_EAUTH ? KV_EAUTH : 0;
    for (size_t e = n->fifo_head; e < n->fifo_n; e++)
        on_fail(r, call, n->fifo[e], idle_drop ? KV_REMOTE_RETRY : status);
    if (idle_drop)
        kv_remote_node_close(n);
    else
        kv_remote_node_fail(r, n);
    if (r->mode == KV_REMOTE_MODE_CLUSTER)
        r->stale = 1; /* a failover may have moved its slots */
}

/* Send what the node has; 0, or an error that fails it. */
static int kv_node_send(kv_remote_node_t *n)
{
    while (n->out_off < n->out_len) {
        if (n->ssl) {
            long k = kv_remote_tls_send(n, n->out + n->out_off, n->out_len - n->out_off);
            if (k <= 0)
                return (int)k;
            n->out_off += (size_t)k;
            continue;
        }
        ssize_t k = send(n->fd, n->out + n->out_off, n->out_len - n->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno == EINTR ? 0 : KV_EIO;
        n->out_off += (size_t)k;
    }
    n->out_off = n->out_len = 0;
    return 0;
}

/* Read what the node sent and hand over every complete reply. */
static int kv_node_recv(struct kv_remote *r, uint32_t i, kv_remote_reply_fn on_reply,
                        void *call, uint64_t deadline)
{
    kv_remote_node_t *n = r->nodes[i];
    for (;;) {
        ssize_t k;
        if (n->ssl) { /* until it would block: poll() cannot see SSL's own buffer */
            long t = kv_remote_tls_recv(n, r->rbuf, KV_REMOTE_RBUF);
            if (t <= 0)
                return (int)t;
            k = t;
        } else {
            k = recv(n->fd, r->rbuf, KV_REMOTE_RBUF, MSG_DONTWAIT);
            if (k == 0)
                return KV_EIO; /* EOF */
            if (k < 0)
                return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : KV_EIO;
        }
        for (size_t off = 0; off < (size_t)k; off += KV_FEED) {
            size_t m = (size_t)k - off < KV_FEED ? (size_t)k - off : KV_FEED;
            redisReader *rd = n->reader;
            if (redisReaderFeed(rd, r->rbuf + off, m) != REDIS_OK)
                return KV_EIO;
            for (;;) {
                void *reply = NULL;
                if (redisReaderGetReply(n->reader, &reply) != REDIS_OK)
                    return KV_EIO; /* protocol error, or out of memory */
                if (!reply && rd->len - rd->pos > KV_REPLY_MAX)
                    return KV_EIO; /* a reply larger than any value: not ours */
                if (!reply)
                    break;
                if (n->fifo_head == n->fifo_n) {
                    freeReplyObject(reply); /* a reply nobody asked for */
                    return KV_EIO;
                }
                uint32_t entry = n->fifo[n->fifo_head++];
                if (entry == KV_FIFO_AUTH) {
                    int refused = ((redisReply *)reply)->type == REDIS_REPLY_ERROR;
                    freeReplyObject(reply);
                    if (refused) {
                        kv_remote_count(r, KV_RC_AUTH_FAILURES, 1);
                        return KV_EAUTH;
                    }
                    continue;
                }
                n->fails = 0;
                n->fail_rc = 0;
                n->epoch_reply = r->epoch;
                int rc = on_reply(r, call, i, entry, reply);
                if (rc)
                    return rc;
            }
        }
        if ((!n->ssl && (size_t)k < KV_REMOTE_RBUF) || kv_remote_now_ns() >= deadline)
            return 0; /* (a server streaming without end cannot hold us here) */
    }
}

void kv_remote_io(struct kv_remote *r, uint64_t deadline, kv_remote_reply_fn on_reply,
                  kv_remote_fail_fn on_fail, void *call)
{
    struct pollfd *pf = r->pfd;
    for (uint32_t i = 0; i < r->n_nodes; i++) /* send at once, poll after */
        if (r->nodes[i]->fd >= 0 && r->nodes[i]->out_len && kv_node_send(r->nodes[i]))
            kv_node_abort(r, i, KV_EIO, on_fail, call);
    for (;;) {
        nfds_t k = 0;
        for (uint32_t i = 0; i < r->n_nodes; i++) {
            kv_remote_node_t *n = r->nodes[i];
            if (n->fd < 0)
                continue;
            if (n->fifo_head == n->fifo_n) {
                n->fifo_head = n->fifo_n = 0;
                continue;
            }
            short ev = (short)(POLLIN | (n->out_off < n->out_len ? POLLOUT : 0));
            pf[k] = (struct pollfd){.fd = n->fd, .events = ev};
            r->pwho[k++] = i;
        }
        if (k == 0)
            return;
        int ms = kv_poll_ms(deadline);
        int ready = ms ? poll(pf, k, ms) : 0;
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready == 0 && ms && kv_poll_ms(deadline))
            continue; /* woke before the deadline (rounding) */
        if (ready <= 0) { /* the deadline passed, or poll failed */
            for (nfds_t j = 0; j < k; j++)
                kv_node_abort(r, r->pwho[j], ready ? KV_EIO : -ETIMEDOUT, on_fail, call);
            return;
        }
        for (nfds_t j = 0; j < k; j++) {
            kv_remote_node_t *n = r->nodes[r->pwho[j]];
            int rc = 0;
            if (pf[j].revents & POLLOUT)
                rc = kv_node_send(n);
            if (!rc && (pf[j].revents & (POLLIN | POLLERR | POLLHUP | POLLNVAL)))
                rc = kv_node_recv(r, r->pwho[j], on_reply, call, deadline);
            if (rc)
                kv_node_abort(r, r->pwho[j], rc, on_fail, call);
        }
    }
}
