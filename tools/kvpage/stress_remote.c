/* SPDX-License-Identifier: MIT */
/*
 * stress_remote.c — a private redis-server to kill and restart, and corrupt
 * values written into it with hiredis (stress_remote.h).
 *
 * Invariant: pid > 0 <=> our server process exists (running or killed and
 * not yet restarted: then pid is 0 and port/dir are kept for the restart).
 */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvpage/kvpage.h"
#include "stress_gen.h"
#include "stress_remote.h"
#include "util/kv_le.h"
#include "util/kv_rec.h"


static const char *const red_kinds[STRESS_BAD_COUNT] = {
    "garbage", "truncated", "header_bit", "payload_bit", "bad_crc",
    "other_key", "bad_record", "inf_page", "empty", "not_string",
};

const char *stress_redis_kind(int k)
{
    return k >= 0 && k < STRESS_BAD_COUNT ? red_kinds[k] : "?";
}

/* CRC-32C (Castagnoli, reflected 0x82F63B78), bitwise: the frame's crc. */
static uint32_t red_crc32c(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

/* The frame's crc of value v (len >= KV_REC_FRAME_BYTES): header bytes 0..59, payload. */
static uint32_t red_frame_crc(const uint8_t *v, size_t len)
{
    return red_crc32c(red_crc32c(0, v, 60), v + KV_REC_FRAME_BYTES, len - KV_REC_FRAME_BYTES);
}

static void red_close(stress_redis_t *r)
{
    if (r->ctx)
        redisFree(r->ctx);
    r->ctx = NULL;
}

static redisContext *red_ctx(stress_redis_t *r)
{
    if (r->ctx)
        return r->ctx;
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout(r->host, r->port, tv);
    if (!c || c->err || redisSetTimeout(c, tv) != REDIS_OK) {
        if (c)
            redisFree(c);
        return NULL;
    }
    r->ctx = c;
    return c;
}

/* One command; NULL (context dropped) on a connection error. */
static redisReply *red_cmd(stress_redis_t *r, const char *fmt, ...)
{
    redisContext *c = red_ctx(r);
    if (!c)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!rep)
        red_close(r);
    return rep;
}

/* Our server answers PING and reports our pid. */
static int red_serving(stress_redis_t *r)
{
    redisReply *rep = red_cmd(r, "INFO server");
    int ok = 0;
    if (rep && rep->type == REDIS_REPLY_STRING) {
        const char *p = strstr(rep->str, "process_id:");
        ok = p && atol(p + 11) == (long)r->pid;
    }
    if (rep)
        freeReplyObject(rep);
    if (!ok)
        red_close(r);
    return ok;
}

/* Start redis-server on r->port; 0 once it serves as our child, -1. */
static int red_launch(stress_redis_t *r)
{
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    pid_t ppid = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != ppid)
            _exit(127);
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) {
            dup2(nul, 0), dup2(nul, 1), dup2(nul, 2);
            close(nul);
        }
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
               "--dir", r->dir, "--save", "", "--appendonly", "no", "--daemonize", "no",
               "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    r->pid = pid;
    for (int i = 0; i < 200; i++) { /* 10 s */
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            r->pid = 0; /* exited: the port was taken, or no redis-server */
            return -1;
        }
        if (red_serving(r))
            return 0;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    stress_redis_kill(r);
    return -1;
}

int stress_redis_spawn(stress_redis_t *r, uint64_t seed, char *err, size_t err_len)
{
    memset(r, 0, sizeof *r);
    r->rng = seed ^ 0xC0FFEEull;
    r->crc_ok = -1;
    if (system("command -v redis-server >/dev/null 2>&1") != 0) {
        snprintf(err, err_len, "--remote local: redis-server is not installed "
                               "(scripts/setup.sh installs it)");
        return KV_ENOTSUP;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(r->dir, sizeof r->dir, "%s/kvpage-stress-redis.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(r->dir)) {
        snprintf(err, err_len, "--remote local: mkdtemp %s: %s", r->dir, strerror(errno));
        r->dir[0] = 0;
        return KV_EIO;
    }
    snprintf(r->host, sizeof r->host, "127.0.0.1");
    uint64_t s = r->rng ^ (uint64_t)getpid() << 20 ^ (uint64_t)time(NULL);
    for (int tries = 0; tries < 20; tries++) {
        r->port = 22000 + (int)stress_rng_below(&s, 10000);
        if (red_launch(r) == 0) {
            snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d", r->port);
            return 0;
        }
    }
    snprintf(err, err_len, "--remote local: redis-server did not start (20 ports tried)");
    stress_redis_stop(r);
    return KV_EIO;
}

int stress_redis_attach(stress_redis_t *r, const char *url, uint64_t seed, char *err,
                        size_t err_len)
{
    memset(r, 0, sizeof *r);
    r->rng = seed ^ 0xC0FFEEull;
    r->crc_ok = -1;
    if (strchr(url, '@')) { /* (and never print such a url: it may hold a password) */
        snprintf(err, err_len, "--remote-corrupt: a server without credentials only "
                               "(redis://host:port)");
        return KV_EINVAL;
    }
    const char *h = strncmp(url, "redis://", 8) == 0 ? url + 8 : NULL;
    const char *colon = h ? strchr(h, ':') : NULL;
    if (!h || !colon || colon == h || (size_t)(colon - h) >= sizeof r->host ||
        h[0] == '[') {
        snprintf(err, err_len, "--remote-corrupt: cannot take a host:port from '%s' "
                               "(redis://host:port)", url);
        return KV_EINVAL;
    }
    memcpy(r->host, h, (size_t)(colon - h));
    r->port = atoi(colon + 1);
    snprintf(r->url, sizeof r->url, "%s", url);
    return r->port > 0 && r->port < 65536 ? 0 : KV_EINVAL;
}

void stress_redis_kill(stress_redis_t *r)
{
    red_close(r);
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
    }
    r->pid = 0;
}

int stress_redis_restart(stress_redis_t *r)
{
    if (!r->dir[0])
        return -1;
    for (int i = 0; i < 50; i++) { /* the port may linger a moment */
        if (red_launch(r) == 0) {
            r->restarts++;
            return 0;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    r->restart_failures++;
    return -1;
}

void stress_redis_stop(stress_redis_t *r)
{
    stress_redis_kill(r);
    if (r->dir[0]) {
        char path[400];
        const char *left[] = {"dump.rdb", "appendonly.aof"};
        for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) {
            snprintf(path, sizeof path, "%s/%s", r->dir, left[i]);
            unlink(path);
        }
        rmdir(r->dir);
        r->dir[0] = 0;
    }
}

/* A random key of namespace ns into key (cap bytes); 0 or -1. */
static int red_random_key(stress_redis_t *r, const char *ns, char *key, size_t cap)
{
    const size_t nl = strlen(ns);
    for (int i = 0; i < 8; i++) {
        redisReply *rep = red_cmd(r, "RANDOMKEY");
        int ok = rep && rep->type == REDIS_REPLY_STRING && rep->len < cap &&
                 strncmp(rep->str, ns, nl) == 0 && rep->str[nl] == ':';
        const int none = !rep || rep->type == REDIS_REPLY_NIL; /* down, or empty */
        if (ok)
            memcpy(key, rep->str, rep->len + 1);
        if (rep)
            freeReplyObject(rep);
        if (ok)
            return 0;
        if (none)
            return -1;
    }
    return -1;
}

/* Key's value (a string of at least KV_REC_FRAME_BYTES bytes) into *v; 0 or -1. */
static int red_get(stress_redis_t *r, const char *key, uint8_t **v, size_t *len)
{
    redisReply *rep = red_cmd(r, "GET %s", key);
    int ok = rep && rep->type == REDIS_REPLY_STRING && rep->len >= KV_REC_FRAME_BYTES &&
             (*v = malloc(rep->len)) != NULL;
    if (ok) {
        memcpy(*v, rep->str, rep->len);
        *len = rep->len;
    }
    if (rep)
        freeReplyObject(rep);
    return ok ? 0 : -1;
}

/* The payload offset of the first page in record payload p (len bytes), or
 * 0 when the record does not parse. */
static size_t red_first_page(const uint8_t *p, size_t len, uint8_t *fmt0)
{
    if (len < KV_REC_REMOTE_HEAD_BYTES || kv_le_get32(p) != KV_REC_REMOTE_MAGIC)
        return 0;
    const uint32_t n_lists = kv_le_get32(p + 16);
    size_t off = KV_REC_REMOTE_HEAD_BYTES, ents = 0;
    if (n_lists == 0 || n_lists > 1u << 16 || off + 4ull * n_lists > len)
        return 0;
    for (uint32_t i = 0; i < n_lists; i++)
        ents += kv_le_get32(p + off + 4u * i);
    off += 4u * n_lists;
    if (ents == 0 || off + KV_REC_REMOTE_ENT_BYTES * ents >= len)
        return 0;
    *fmt0 = p[off];
    return off + KV_REC_REMOTE_ENT_BYTES * ents;
}

/* Value v (len bytes, a frame) made corrupt as kind k. Returns the new
 * length (v may be rewritten; *other is another key's value when k needs
 * one), or SIZE_MAX when this value cannot take kind k. */
static size_t red_spoil(stress_redis_t *r, int k, uint8_t *v, size_t len, const uint8_t *other,
                        size_t other_len)
{
    const size_t hb = KV_REC_FRAME_BYTES; /* an unsigned value's header */
    uint8_t *pay = len >= hb ? v + hb : v; /* (kind 0 only when shorter) */
    const size_t plen = len >= hb ? len - hb : 0;
    uint8_t fmt0 = 0xFF;
    size_t page;
    switch (k) {
    case 0: /* garbage */
        for (size_t i = 0; i < len; i++)
            v[i] = (uint8_t)stress_rng_next(&r->rng);
        return len;
    case 1: /* truncated */
        return stress_rng_below(&r->rng, (uint32_t)(len < UINT32_MAX ? len : UINT32_MAX));
    case 2: /* a header bit */
        v[stress_rng_below(&r->rng, hb)] ^= (uint8_t)(1u << stress_rng_below(&r->rng, 8));
        return len;
    case 3: /* a payload bit */
        if (!plen)
            return SIZE_MAX;
        pay[stress_rng_next(&r->rng) % plen] ^= (uint8_t)(1u << stress_rng_below(&r->rng, 8));
        return len;
    case 4: /* crc changed, the rest well framed */
        kv_le_put32(v + 60, kv_le_get32(v + 60) ^ (1u + stress_rng_below(&r->rng, 0xFFFF)));
        return len;
    case 5: /* another key's value: its own crc, the wrong echoed hash */
        if (!other || memcmp(other + 24, v + 24, 32) == 0)
            return SIZE_MAX;
        return other_len;
    case 6: /* re-framed: the record's start is wrong */
    case 7: /* re-framed: +Inf in an FP16 page */
        if (r->crc_ok != 1 || !(page = red_first_page(pay, plen, &fmt0)))
            return SIZE_MAX;
        if (k == 6) {
            kv_le_put32(pay + 8, kv_le_get32(pay + 8) + 16u * (1 + stress_rng_below(&r->rng, 4)));
        } else {
            if (fmt0 != KV_FMT_FP16 || page + 2 > plen)
                return SIZE_MAX;
            pay[page] = 0x00, pay[page + 1] = 0x7C; /* binary16 +Inf */
        }
        kv_le_put32(v + 60, red_frame_crc(v, len));
        return len;
    case 8: /* empty */
        return 0;
    default:
        return SIZE_MAX; /* 9: not a string, written by the caller */
    }
}

uint32_t stress_redis_corrupt(stress_redis_t *r, const char *ns, uint32_t n)
{
    uint32_t done = 0;
    char key[256], key2[256];
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *v = NULL, *o = NULL;
        size_t len = 0, olen = 0;
        if (red_random_key(r, ns, key, sizeof key)) {
            r->no_key++; /* empty (restarted) or down: later */
            return done;
        }
        int k = (int)(r->injected % STRESS_BAD_COUNT);
        if (red_get(r, key, &v, &len)) {
            /* not a frame any more (a list, empty, truncated: an earlier
             * injection nobody replaced yet): random bytes over it */
            len = 1 + stress_rng_below(&r->rng, 256);
            if (!(v = malloc(len)))
                return done;
            k = 0;
        } else if (r->crc_ok < 0) {
            r->crc_ok = red_frame_crc(v, len) == kv_le_get32(v + 60);
        }
        size_t nlen = SIZE_MAX;
        redisReply *rep = NULL;
        for (;;) { /* the next kind this value can take */
            if (k == 9) {
                redisReply *d = red_cmd(r, "DEL %s", key);
                if (d)
                    freeReplyObject(d);
                rep = red_cmd(r, "RPUSH %s %b", key, v, len);
                break;
            }
            if (k == 5 && !o && red_random_key(r, ns, key2, sizeof key2) == 0)
                red_get(r, key2, &o, &olen);
            nlen = red_spoil(r, k, v, len, o, olen);
            if (nlen != SIZE_MAX) {
                rep = red_cmd(r, "SET %s %b", key, k == 5 ? o : v, nlen);
                break;
            }
            k = (k + 1) % STRESS_BAD_COUNT;
        }
        const int ok = rep && (rep->type == REDIS_REPLY_STATUS || rep->type == REDIS_REPLY_INTEGER);
        if (rep)
            freeReplyObject(rep);
        free(v);
        free(o);
        if (!ok)
            return done; /* the server went away */
        r->injected++;
        r->by_kind[k]++;
        done++;
    }
    return done;
}
