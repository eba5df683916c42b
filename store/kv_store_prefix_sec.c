/* SPDX-License-Identifier: MIT */
/*
 * kv_store_prefix_sec.c — the remote tier's security settings in the store:
 * the kv_config_t fields of credentials and TLS (checked, copied), the
 * password read from its file or environment variable at create, and the
 * refusal counters of kv_stats_t, and kv_prefix_remote_redact (docs/prefix.md,
 * "Authentication and TLS").
 *
 * Invariants: the password lives only on the stack of kv_pfx_sec_password's
 * caller, which wipes it once the clients have their copies; s->cfg holds
 * the store's copies of the paths and names (one kv_mem block, p->sec),
 * never a secret.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc/kv_mem.h"
#include "kv_store_prefix_int.h"
#include "remote/kv_remote.h"

/* The fields, in kv_config_t's order. */
static const char **kv_sec_field(kv_config_t *c, int i)
{
    const char **f[] = {&c->prefix_remote_password_file, &c->prefix_remote_password_env,
                        &c->prefix_remote_tls_ca, &c->prefix_remote_tls_cert,
                        &c->prefix_remote_tls_key};
    return f[i];
}
#define KV_SEC_FIELDS 5

int kv_pfx_sec_resolve(const kv_config_t *c)
{
    kv_config_t t = *c;
    int any = 0;
    for (int i = 0; i < KV_SEC_FIELDS; i++) {
        const char *v = *kv_sec_field(&t, i);
        if (v && !v[0])
            return KV_EINVAL;
        any |= v != NULL;
    }
    if (!any)
        return 0;
    if (!c->prefix_remote || !c->prefix_cache)
        return KV_EINVAL;
    if (c->prefix_remote_password_file && c->prefix_remote_password_env)
        return KV_EINVAL;
    if ((c->prefix_remote_tls_cert == NULL) != (c->prefix_remote_tls_key == NULL))
        return KV_EINVAL;
    int tls = !strncmp(c->prefix_remote, "rediss://", 9);
    if (!tls && (c->prefix_remote_tls_ca || c->prefix_remote_tls_cert))
        return KV_EINVAL; /* TLS files for a plaintext url: a mistake */
    return 0;
}

int kv_pfx_sec_copy(kv_store_t *s)
{
    kv_pfx_t *p = s->pfx;
    size_t n = 0;
    for (int i = 0; i < KV_SEC_FIELDS; i++) {
        const char *v = *kv_sec_field(&s->cfg, i);
        n += v ? strlen(v) + 1 : 0;
    }
    if (!n)
        return 0;
    char *b = kv_mem_alloc(n);
    if (!b)
        return KV_ENOMEM;
    p->sec = b;
    p->sec_bytes = n;
    p->bytes += n;
    for (int i = 0; i < KV_SEC_FIELDS; i++) {
        const char **f = kv_sec_field(&s->cfg, i);
        if (!*f)
            continue;
        size_t l = strlen(*f) + 1;
        memcpy(b, *f, l);
        *f = b; /* the store's copy */
        b += l;
    }
    return 0;
}

void kv_pfx_sec_free(kv_store_t *s)
{
    kv_pfx_t *p = s->pfx;
    kv_mem_free(p->sec, p->sec_bytes);
    p->bytes -= p->sec_bytes;
    p->sec = NULL;
    p->sec_bytes = 0;
    for (int i = 0; i < KV_SEC_FIELDS; i++)
        *kv_sec_field(&s->cfg, i) = NULL;
}

/* The first line of the file at path into buf[cap]. */
static int kv_sec_read(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t k = 0;
    int rc = 0;
    while (k < cap) {
        ssize_t m = read(fd, buf + k, cap - k);
        if (m < 0 && errno == EINTR)
            continue;
        if (m < 0)
            rc = -errno;
        if (m <= 0)
            break;
        k += (size_t)m;
    }
    close(fd);
    size_t l = 0;
    while (l < k && buf[l] != '\n')
        l++;
    if (!rc && l == k && k == cap)
        rc = KV_ERANGE; /* no end of line within the longest password */
    if (l && buf[l - 1] == '\r')
        l--;
    kv_remote_wipe(buf + l, k - l); /* (the rest of the file) */
    buf[l < cap ? l : cap - 1] = 0;
    return rc;
}

int kv_pfx_sec_password(const kv_config_t *c, char *buf, size_t cap)
{
    buf[0] = 0;
    int rc = 0;
    if (c->prefix_remote_password_file) {
        rc = kv_sec_read(c->prefix_remote_password_file, buf, cap - 1);
        if (!rc && !buf[0])
            rc = KV_EINVAL; /* an empty password: a mistake */
    } else if (c->prefix_remote_password_env) {
        const char *v = getenv(c->prefix_remote_password_env);
        size_t l = v ? strlen(v) : 0;
        rc = !l ? KV_EINVAL : l > cap - 1 ? KV_ERANGE : 0;
        if (!rc)
            memcpy(buf, v, l + 1);
    }
    if (!rc && strlen(buf) > KV_REMOTE_MAX_SECRET)
        rc = KV_ERANGE;
    if (rc)
        kv_remote_wipe(buf, cap);
    return rc;
}

int kv_prefix_remote_redact(const char *url, char *buf, size_t cap)
{
    return kv_remote_url_redact(url, buf, cap);
}

void kv_pfx_sec_stats(const kv_store_t *s, kv_stats_t *out)
{
    const kv_pfx_t *p = s->pfx;
    kv_remote_stats_t a = {0};
    kv_remote_pub_stats_t b = {0};
    if (p->remote)
        kv_remote_stats(p->remote, &a);
    if (p->pub)
        kv_remote_pub_stats(p->pub, &b);
    out->prefix_remote_denied = a.denied + b.client.denied;
    out->prefix_remote_auth_failures = a.auth_failures + b.client.auth_failures;
    out->prefix_remote_tls_failures = a.tls_failures + b.client.tls_failures;
}
