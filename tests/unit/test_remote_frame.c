/* SPDX-License-Identifier: MIT */
/*
 * test_remote_frame.c — the remote tier's parts that need no Redis:
 *   - key strings, hash slots (CRC16 known answers, hash tags);
 *   - the value frame: round trip, every header byte and payload bits
 *     checked, wrong key / namespace, short values, bad arguments;
 *   - url and config validation (every bad-input path of create), and of
 *     get / set / exists;
 *   - misbehaving servers, each a socket of this test: nothing listening
 *     (KV_EIO at once, then backoff), a listener that never accepts (the
 *     kernel completes the connect, no reply: -ETIMEDOUT at the deadline), a
 *     server that trickles a reply one byte at a time (-ETIMEDOUT, not a
 *     hang), one that answers garbage (a protocol error: KV_EIO) and one that
 *     answers a GET with a status reply (corrupt, a miss).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kv_test_remote.h"
#include "util/kv_crc32c.h"

static void test_keys_slots(void)
{
    kv_remote_key_t k;
    for (int i = 0; i < 32; i++)
        k.hash[i] = (uint8_t)(i * 17);
    char buf[128];
    CHECK_EQ(kv_remote_key_string("ns", &k, buf, sizeof buf), 67);
    CHECK(strncmp(buf, "ns:0011223344", 13) == 0 && buf[67] == 0);
    CHECK_EQ(kv_remote_key_string("ns", &k, buf, 68), 67);
    CHECK_EQ(kv_remote_key_string("ns", &k, buf, 67), KV_ERANGE);
    CHECK_EQ(kv_remote_key_string(NULL, &k, buf, 68), KV_EINVAL);
    CHECK_EQ(kv_remote_key_string("ns", NULL, buf, 68), KV_EINVAL);
    CHECK_EQ(kv_remote_key_string("ns", &k, NULL, 68), KV_EINVAL);
    /* Redis Cluster specification: "123456789" -> CRC16 0x31C3 */
    CHECK_EQ(kv_remote_slot("123456789", 9), 0x31C3);
    CHECK_EQ(kv_remote_slot("", 0), 0);
    CHECK_EQ(kv_remote_slot("{123456789}.x", 13), 0x31C3);
    CHECK_EQ(kv_remote_slot("a{123456789}{b}", 15), 0x31C3);
    CHECK(kv_remote_slot("{}123456789", 11) != 0x31C3); /* empty tag: whole key */
    CHECK_EQ(kv_remote_slot("{{123456789}", 12), kv_remote_slot("{123456789", 10));
}

static size_t frame(uint8_t *v, const char *ns, uint64_t id, size_t n)
{
    kv_tr_fill(v + 64, n, id);
    struct iovec io[2] = {{v + 64, n / 2}, {v + 64 + n / 2, n - n / 2}};
    kv_remote_key_t k = kv_tr_key(id);
    CHECK_OK(kv_remote_frame_header(ns, &k, 77, io, 2, n, v));
    return 64 + n;
}

static void test_frame(void)
{
    static uint8_t v[64 + 1000];
    const uint8_t *p;
    size_t len = 0, n = frame(v, "ns", 1, 1000);
    uint32_t fmt = 0;
    kv_remote_key_t k1 = kv_tr_key(1), k2 = kv_tr_key(2);
    CHECK_OK(kv_remote_frame_check("ns", &k1, v, n, &p, &len, &fmt));
    CHECK(p == v + 64 && len == 1000 && fmt == 77 && kv_tr_is(p, 1000, 1));
    CHECK(memcmp(v, "KVRM\1\0\x40\0", 8) == 0);
    CHECK(memcmp(v + 24, k1.hash, 32) == 0);
    CHECK_EQ(kv_remote_frame_check("ns", &k2, v, n, &p, &len, &fmt), KV_ECORRUPT);
    CHECK_EQ(kv_remote_frame_check("nt", &k1, v, n, &p, &len, &fmt), KV_ECORRUPT);
    CHECK_EQ(kv_remote_frame_check("ns", &k1, v, n - 1, &p, &len, &fmt), KV_ECORRUPT);
    CHECK_EQ(kv_remote_frame_check("ns", &k1, v, 63, &p, &len, &fmt), KV_ECORRUPT);
    CHECK_EQ(kv_remote_frame_check("ns", &k1, NULL, n, &p, &len, &fmt), KV_ECORRUPT);
    int caught = 0;
    for (size_t b = 0; b < n; b += b < 64 ? 1 : 37) { /* every header byte, payload */
        v[b] ^= 0x10;
        caught += kv_remote_frame_check("ns", &k1, v, n, &p, &len, &fmt) == KV_ECORRUPT;
        v[b] ^= 0x10;
    }
    CHECK_EQ(caught, 64 + (1000 + 36) / 37);
    CHECK_OK(kv_remote_frame_check("ns", &k1, v, n, &p, &len, &fmt));
    /* an empty payload */
    n = frame(v, "ns", 3, 0);
    kv_remote_key_t k3 = kv_tr_key(3);
    CHECK_OK(kv_remote_frame_check("ns", &k3, v, n, &p, &len, &fmt));
    CHECK_EQ(len, 0);
    /* bad arguments of the header */
    struct iovec bad = {NULL, 4}, ok = {v, 4};
    CHECK_EQ(kv_remote_frame_header(NULL, &k1, 0, &ok, 1, 4, v), KV_EINVAL);
    CHECK_EQ(kv_remote_frame_header("ns", NULL, 0, &ok, 1, 4, v), KV_EINVAL);
    CHECK_EQ(kv_remote_frame_header("ns", &k1, 0, &ok, 1, 4, NULL), KV_EINVAL);
    CHECK_EQ(kv_remote_frame_header("ns", &k1, 0, &bad, 1, 4, v), KV_EINVAL);
    CHECK_EQ(kv_remote_frame_header("ns", &k1, 0, NULL, 1, 4, v), KV_EINVAL);
    CHECK_EQ(kv_remote_frame_header("ns", &k1, 0, &ok, -1, 4, v), KV_EINVAL);
    CHECK_EQ(kv_remote_frame_header("ns", &k1, 0, &ok, 1, 5, v), KV_ERANGE);
}

static int create_rc(const char *url, const char *ns, kv_remote_config_t base)
{
    base.url = url;
    base.ns = ns;
    kv_remote_t *r = NULL;
    int rc = kv_remote_create(&base, &r);
    CHECK(rc == 0 ? r != NULL : r == NULL);
    kv_remote_destroy(r);
    return rc;
}

static void test_config(void)
{
    kv_remote_config_t z = {0};
    const char *good[] = {"redis://127.0.0.1:6379", "redis://a:1,b:2", "redis://a:1,redis://b:2",
                          "redis://[::1]:6379", "redis://host-name.x_y:65535",
                          "redis://u:p@h:1", "redis://:p@h:1,h:2", "rediss://h:1"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        CHECK_OK(create_rc(good[i], NULL, z));
    const char *bad[] = {"", "redis://", "redis://h", "redis://h:", "redis://h:0",
                         "redis://h:65536", "redis://h:1234567", "http://h:1",
                         "redis://user@h:1", "redis://h:1/0", "redis://h:1,", "redis://h:1,,h:2",
                         "redis://[::1:1", "redis://[]:1", "redis://h:1 ", "redis:// h:1",
                         "redis://h:-1", "rediss://h:1,redis://h:2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_EQ(create_rc(bad[i], NULL, z), KV_EINVAL);
    static char url[64 * 12 + 16], host[300];
    strcpy(url, "redis://");
    for (int i = 0; i < 64; i++)
        strcat(url, i ? ",h:1" : "h:1");
    CHECK_OK(create_rc(url, NULL, z));
    strcat(url, ",h:1");
    CHECK_EQ(create_rc(url, NULL, z), KV_EINVAL); /* 65 seeds */
    memset(host, 'a', 255);
    snprintf(url, sizeof url, "redis://%.255s:1", host);
    CHECK_OK(create_rc(url, NULL, z));
    snprintf(url, sizeof url, "redis://%.255sa:1", host);
    CHECK_EQ(create_rc(url, NULL, z), KV_EINVAL);
    /* namespaces */
    char ns[66];
    memset(ns, 'n', 65);
    ns[65] = 0;
    CHECK_EQ(create_rc(good[0], ns, z), KV_EINVAL);
    ns[64] = 0;
    CHECK_OK(create_rc(good[0], ns, z));
    CHECK_EQ(create_rc(good[0], "", z), KV_EINVAL);
    CHECK_EQ(create_rc(good[0], "a b", z), KV_EINVAL);
    CHECK_EQ(create_rc(good[0], "a\x7f", z), KV_EINVAL);
    CHECK_OK(create_rc(good[0], "{tenant}:x", z));
    /* times */
    kv_remote_config_t c = z;
    c.timeout_ms = KV_REMOTE_MAX_TIMEOUT_MS + 1;
    CHECK_EQ(create_rc(good[0], NULL, c), KV_ERANGE);
    c = z, c.connect_timeout_ms = KV_REMOTE_MAX_TIMEOUT_MS + 1;
    CHECK_EQ(create_rc(good[0], NULL, c), KV_ERANGE);
    c = z, c.backoff_ms = 100, c.backoff_max_ms = 99;
    CHECK_EQ(create_rc(good[0], NULL, c), KV_ERANGE);
    c = z, c.backoff_ms = 6000; /* max defaults to at least the first delay */
    CHECK_OK(create_rc(good[0], NULL, c));
    c = z, c.max_redirects = 65;
    CHECK_EQ(create_rc(good[0], NULL, c), KV_ERANGE);
    kv_remote_t *r = NULL;
    CHECK_EQ(kv_remote_create(NULL, &r), KV_EINVAL);
    c = z, c.url = good[0];
    CHECK_EQ(kv_remote_create(&c, NULL), KV_EINVAL);
    CHECK_EQ(kv_remote_create(&z, &r), KV_EINVAL); /* no url */
    kv_remote_destroy(NULL);

    /* calls: bad input is refused before anything is sent (no server here) */
    CHECK_OK(kv_remote_create(&c, &r));
    kv_remote_get_t g = {.dst = NULL, .cap = 4};
    kv_remote_key_t k = kv_tr_key(1);
    struct iovec badv = {NULL, 3}, hugev = {(void *)&k, (size_t)KV_REMOTE_MAX_PAYLOAD + 1};
    kv_remote_set_t s = {.iov = &badv, .iovcnt = 1};
    int ex;
    kv_remote_stats_t st;
    CHECK_EQ(kv_remote_get(NULL, &g, 1), KV_EINVAL);
    CHECK_EQ(kv_remote_get(r, NULL, 1), KV_EINVAL);
    CHECK_EQ(kv_remote_get(r, &g, 1), KV_EINVAL);
    CHECK_EQ(kv_remote_get(r, &g, (size_t)KV_REMOTE_MAX_BATCH + 1), KV_ERANGE);
    CHECK_EQ(kv_remote_get(r, NULL, 0), 0);
    CHECK_EQ(kv_remote_set(NULL, &s, 1), KV_EINVAL);
    CHECK_EQ(kv_remote_set(r, NULL, 1), KV_EINVAL);
    CHECK_EQ(kv_remote_set(r, &s, 1), KV_EINVAL);
    s.iovcnt = -1;
    CHECK_EQ(kv_remote_set(r, &s, 1), KV_EINVAL);
    s.iov = &hugev, s.iovcnt = 1;
    CHECK_EQ(kv_remote_set(r, &s, 1), KV_ERANGE);
    CHECK_EQ(kv_remote_set(r, &s, (size_t)KV_REMOTE_MAX_BATCH + 1), KV_ERANGE);
    CHECK_EQ(kv_remote_exists(NULL, &k, &ex, 1), KV_EINVAL);
    CHECK_EQ(kv_remote_exists(r, NULL, &ex, 1), KV_EINVAL);
    CHECK_EQ(kv_remote_exists(r, &k, NULL, 1), KV_EINVAL);
    CHECK_EQ(kv_remote_exists(r, &k, &ex, (size_t)KV_REMOTE_MAX_BATCH + 1), KV_ERANGE);
    CHECK_EQ(kv_remote_stats(NULL, &st), KV_EINVAL);
    CHECK_EQ(kv_remote_stats(r, NULL), KV_EINVAL);
    CHECK_OK(kv_remote_stats(r, &st));
    CHECK_EQ(st.gets + st.sets + st.connects + st.connect_failures, 0); /* nothing sent */
    kv_remote_destroy(r);
}

/* ---- misbehaving servers ------------------------------------------------ */

enum { SRV_SILENT, SRV_TRICKLE, SRV_GARBAGE, SRV_STATUS };

typedef struct fake {
    int lfd, port, mode;
    pthread_t th;
    volatile int stop;
} fake_t;

/* Answer one request read from fd according to the mode. */
static void *fake_main(void *arg)
{
    fake_t *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    char req[4096];
    while (fd >= 0 && !f->stop) {
        ssize_t n = recv(fd, req, sizeof req - 1, 0);
        if (n <= 0)
            break;
        req[n] = 0;
        const char *out = NULL;
        if (strstr(req, "SLOTS"))
            out = "-ERR This instance has cluster support disabled\r\n";
        else if (f->mode == SRV_GARBAGE)
            out = "?what\r\n";
        else if (f->mode == SRV_STATUS)
            out = "+OK\r\n";
        if (out) {
            send(fd, out, strlen(out), MSG_NOSIGNAL);
            continue;
        }
        send(fd, "$1000\r\n", 7, MSG_NOSIGNAL); /* trickle: 1 byte / 20 ms */
        for (int i = 0; i < 100 && !f->stop; i++) {
            if (send(fd, "x", 1, MSG_NOSIGNAL) != 1)
                break;
            usleep(20 * 1000);
        }
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

static void fake_start(fake_t *f, int mode)
{
    memset(f, 0, sizeof *f);
    f->mode = mode;
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    CHECK(bind(f->lfd, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(f->lfd, 8) == 0);
    getsockname(f->lfd, (struct sockaddr *)&a, &al);
    f->port = ntohs(a.sin_port);
    if (mode != SRV_SILENT)
        pthread_create(&f->th, NULL, fake_main, f);
}

static void fake_stop(fake_t *f)
{
    f->stop = 1;
    shutdown(f->lfd, SHUT_RDWR);
    if (f->mode != SRV_SILENT)
        pthread_join(f->th, NULL);
    close(f->lfd);
}

static kv_remote_t *client_port(int port, uint32_t timeout_ms)
{
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    return kv_tr_client(url, "f", timeout_ms);
}

static void test_servers(void)
{
    /* nothing listening: a port that was free a moment ago */
    fake_t f;
    fake_start(&f, SRV_SILENT);
    int port = f.port;
    fake_stop(&f);
    kv_remote_t *r = client_port(port, 1000);
    double t0 = kv_tr_now();
    CHECK_EQ(kv_tr_get(r, 1, 100, NULL), KV_EIO);
    CHECK_EQ(kv_tr_set(r, 1, 100), KV_EIO); /* in backoff: no new connect */
    CHECK(kv_tr_now() - t0 < 0.5);
    kv_remote_stats_t st;
    CHECK_OK(kv_remote_stats(r, &st));
    CHECK_EQ(st.connect_failures, 1);
    CHECK_EQ(st.errors, 2);
    CHECK_EQ(st.misses, 1);
    kv_remote_destroy(r);

    /* a listener that never accepts; one that trickles */
    for (int mode = SRV_SILENT; mode <= SRV_TRICKLE; mode++) {
        fake_start(&f, mode);
        r = client_port(f.port, 300);
        t0 = kv_tr_now();
        CHECK_EQ(kv_tr_get(r, 1, 2000, NULL), -ETIMEDOUT);
        double dt = kv_tr_now() - t0;
        CHECK(dt >= 0.28 && dt < 0.3 + 0.5);
        CHECK_OK(kv_remote_stats(r, &st));
        CHECK_EQ(st.timeouts, 1);
        kv_remote_destroy(r);
        fake_stop(&f);
    }

    /* garbage: a protocol error fails the key, not the process */
    fake_start(&f, SRV_GARBAGE);
    r = client_port(f.port, 1000);
    CHECK_EQ(kv_tr_get(r, 1, 100, NULL), KV_EIO);
    kv_remote_destroy(r);
    fake_stop(&f);

    /* a GET answered with a status reply: not a value of ours */
    fake_start(&f, SRV_STATUS);
    r = client_port(f.port, 1000);
    CHECK_EQ(kv_tr_get(r, 1, 100, NULL), KV_ENOENT);
    CHECK_OK(kv_remote_stats(r, &st));
    CHECK_EQ(st.corrupt, 1);
    kv_remote_destroy(r);
    fake_stop(&f);
}

int main(void)
{
    test_keys_slots();
    test_frame();
    test_config();
    test_servers();
    return kv_test_end();
}
