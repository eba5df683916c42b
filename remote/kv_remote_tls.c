/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_tls.c — TLS for the remote tier ("rediss://"), through OpenSSL.
 *
 * One SSL_CTX per client: TLS 1.2 or later, the server's certificate always
 * verified (SSL_VERIFY_PEER) against cfg.tls_ca_file or, without one, the
 * system's store; a client certificate and key when given. One SSL per
 * connection, over the node's non-blocking socket: the handshake runs in a
 * poll() loop against the connect's deadline, like the TCP connect, and
 * checks the certificate's name against the node's host (a host name: SNI
 * and the certificate's DNS names; an IP address: its IP addresses). A
 * handshake that fails or does not finish by the deadline closes the
 * connection before anything is sent (fail closed) and is counted.
 *
 * Reads and writes never block: SSL_read/SSL_write answer WANT_READ or
 * WANT_WRITE and the caller's poll loop waits. OpenSSL reaches the socket
 * through a BIO of ours whose writes use send(MSG_NOSIGNAL): a server that
 * went away is an error, never SIGPIPE (OpenSSL's socket BIO uses write()). Partial writes are enabled
 * and the write buffer may move between retries (kv_remote_conn.c grows it).
 * OpenSSL's allocations are its own (as hiredis's); the places that would
 * allocate a context or a connection consult kv_fault_hit so that tests
 * reach their failure paths.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "remote/kv_remote_int.h"

int kv_remote_tls_ctx(const kv_remote_config_t *cfg, void **out)
{
    if (kv_fault_hit())
        return KV_ENOMEM;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        return KV_ENOMEM;
    int ok = SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) == 1;
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (ok)
        ok = cfg->tls_ca_file ? SSL_CTX_load_verify_locations(ctx, cfg->tls_ca_file, NULL) == 1
                              : SSL_CTX_set_default_verify_paths(ctx) == 1;
    if (ok && cfg->tls_cert_file)
        ok = SSL_CTX_use_certificate_chain_file(ctx, cfg->tls_cert_file) == 1 &&
             SSL_CTX_use_PrivateKey_file(ctx, cfg->tls_key_file, SSL_FILETYPE_PEM) == 1 &&
             SSL_CTX_check_private_key(ctx) == 1;
    ERR_clear_error(); /* (the thread's queue: not ours to leave filled) */
    if (!ok) {
        SSL_CTX_free(ctx);
        return KV_ETLS;
    }
    *out = ctx;
    return 0;
}

void kv_remote_tls_ctx_free(void *ctx)
{
    SSL_CTX_free(ctx);
}

/* ---- the socket BIO: send(MSG_NOSIGNAL) / recv, the fd in the BIO's data */

static int kv_bio_write(BIO *b, const char *p, int n)
{
    BIO_clear_retry_flags(b);
    ssize_t k = send((int)(intptr_t)BIO_get_data(b), p, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)k;
}

static int kv_bio_read(BIO *b, char *p, int n)
{
    BIO_clear_retry_flags(b);
    ssize_t k = recv((int)(intptr_t)BIO_get_data(b), p, (size_t)n, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_read(b);
    return (int)k;
}

static long kv_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b, (void)num, (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int kv_bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static BIO_METHOD *kv_bio_method; /* made once, kept for the process's life */
static pthread_once_t kv_bio_once = PTHREAD_ONCE_INIT;

static void kv_bio_init(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "kv_remote");
    if (m && BIO_meth_set_write(m, kv_bio_write) && BIO_meth_set_read(m, kv_bio_read) &&
        BIO_meth_set_ctrl(m, kv_bio_ctrl) && BIO_meth_set_create(m, kv_bio_create)) {
        kv_bio_method = m;
        return;
    }
    BIO_meth_free(m);
}

/* Milliseconds to deadline, rounded up (0: passed). */
static int kv_ms_left(uint64_t deadline)
{
    uint64_t now = kv_remote_now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > 1000000000 ? 1000000000 : (int)ms;
}

int kv_remote_tls_connect(void *ctx, kv_remote_node_t *n, uint64_t deadline)
{
    pthread_once(&kv_bio_once, kv_bio_init);
    SSL *s = kv_fault_hit() || !kv_bio_method ? NULL : SSL_new(ctx);
    BIO *bio = s ? BIO_new(kv_bio_method) : NULL;
    if (!bio) {
        SSL_free(s);
        return KV_ENOMEM;
    }
    BIO_set_data(bio, (void *)(intptr_t)n->fd);
    SSL_set_bio(s, bio, bio); /* (s owns it) */
    unsigned char ip[16];
    int is_ip = inet_pton(AF_INET, n->addr.host, ip) == 1 ||
                inet_pton(AF_INET6, n->addr.host, ip) == 1;
    int ok = 1;
    if (is_ip)
        ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s), n->addr.host) == 1;
    else if (ok)
        ok = SSL_set_tlsext_host_name(s, n->addr.host) == 1 && SSL_set1_host(s, n->addr.host) == 1;
    int rc = ok ? 1 : KV_ENOMEM;
    while (rc == 1) {
        int k = SSL_connect(s);
        if (k == 1) {
            rc = 0;
            break;
        }
        int e = SSL_get_error(s, k);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
            rc = KV_ETLS; /* verification failed, not a TLS server, reset... */
            break;
        }
        struct pollfd p = {.fd = n->fd, .events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT};
        int ms = kv_ms_left(deadline);
        int got = ms ? poll(&p, 1, ms) : 0;
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            rc = got < 0 ? KV_EIO : -ETIMEDOUT;
    }
    ERR_clear_error();
    if (rc) {
        SSL_free(s);
        return rc;
    }
    n->ssl = s;
    return 0;
}

/* What an SSL_read/SSL_write result k means: bytes, 0 (wait), KV_EIO. */
static long kv_tls_result(SSL *s, int k)
{
    if (k > 0)
        return k;
    int e = SSL_get_error(s, k);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    if (e == SSL_ERROR_SYSCALL && errno == EINTR)
        return 0;
    ERR_clear_error();
    return KV_EIO; /* EOF (close_notify or not), reset, protocol error */
}

long kv_remote_tls_send(kv_remote_node_t *n, const void *p, size_t len)
{
    int m = len > (1u << 30) ? 1 << 30 : (int)len;
    return kv_tls_result(n->ssl, SSL_write(n->ssl, p, m));
}

long kv_remote_tls_recv(kv_remote_node_t *n, void *p, size_t len)
{
    int m = len > (1u << 30) ? 1 << 30 : (int)len;
    return kv_tls_result(n->ssl, SSL_read(n->ssl, p, m));
}

void kv_remote_tls_close(kv_remote_node_t *n)
{
    if (!n->ssl)
        return;
    SSL_free(n->ssl); /* no close_notify: the socket is closed right after */
    n->ssl = NULL;
}
