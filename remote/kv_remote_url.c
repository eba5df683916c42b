/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_url.c — the servers and credentials of a remote tier url:
 *   url    = scheme [cred "@"] seed *("," [scheme] seed)
 *   scheme = "redis://" | "rediss://"  (TLS; every seed's scheme the same)
 *   cred   = [user] [":" password]     (first seed only; %XX escapes)
 *   seed   = host ":" port
 *   host   = name or IPv4 ([A-Za-z0-9._-], 1..255 bytes) | "[" IPv6 "]"
 *   port   = 1..65535, decimal
 * A user or password is 1..KV_REMOTE_MAX_SECRET bytes of printable ASCII
 * other than '@', ':' (in the user), ',' and '/', which are written %XX.
 * Nothing else (database, query) is accepted: KV_EINVAL.
 *
 * kv_remote_url_redact is the one place a url is made printable: it never
 * fails to hide a password, even in a url that does not parse.
 * kv_remote_wipe erases secrets (explicit_bzero: not optimized away).
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "remote/kv_remote_int.h"

void kv_remote_wipe(void *p, size_t len)
{
    if (p && len)
        explicit_bzero(p, len);
}

static const char kv_plain[] = "redis://", kv_tls[] = "rediss://";

static int kv_host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '-' || c == '_';
}

/* Length of the scheme at s (0: none); *tls set when one. */
static size_t kv_scheme(const char *s, int *tls)
{
    if (!strncmp(s, kv_plain, sizeof kv_plain - 1))
        return *tls = 0, sizeof kv_plain - 1;
    if (!strncmp(s, kv_tls, sizeof kv_tls - 1))
        return *tls = 1, sizeof kv_tls - 1;
    return 0;
}

static int kv_hex(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decode s[0..n) (%XX escapes) into out (NUL-terminated). */
static int kv_cred_decode(const char *s, size_t n, char *out, int is_user)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c <= ' ' || c > '~' || c == ',' || c == '/' || c == '@' || (is_user && c == ':'))
            return KV_EINVAL;
        if (c == '%') {
            if (i + 2 >= n || kv_hex(s[i + 1]) < 0 || kv_hex(s[i + 2]) < 0)
                return KV_EINVAL;
            c = (char)(kv_hex(s[i + 1]) << 4 | kv_hex(s[i + 2]));
            if (c == 0)
                return KV_EINVAL;
            i += 2;
        }
        if (k == KV_REMOTE_MAX_SECRET)
            return KV_ERANGE;
        out[k++] = c;
    }
    out[k] = 0;
    return 0;
}

/* One seed at s (up to a ',' or the end); *end past it. */
static int kv_seed_parse(const char *s, const char **end, kv_remote_addr_t *a)
{
    const char *h = s, *he;
    if (*s == '[') {
        h = ++s;
        while (*s && ((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') ||
                      (*s >= 'A' && *s <= 'F') || *s == ':' || *s == '.'))
            s++;
        if (*s != ']')
            return KV_EINVAL;
        he = s++;
    } else {
        while (kv_host_char(*s))
            s++;
        he = s;
    }
    if (he == h || (size_t)(he - h) > KV_REMOTE_MAX_HOST || *s != ':')
        return KV_EINVAL;
    s++;
    uint32_t port = 0;
    const char *p0 = s;
    while (*s >= '0' && *s <= '9' && s - p0 < 6)
        port = port * 10 + (uint32_t)(*s++ - '0');
    if (s == p0 || port == 0 || port > 65535 || (*s && *s != ','))
        return KV_EINVAL;
    memcpy(a->host, h, (size_t)(he - h));
    a->host[he - h] = 0;
    a->port = (uint16_t)port;
    *end = s;
    return 0;
}

/* The credentials before the first seed's host, if any: *s moved past '@'. */
static int kv_cred_parse(const char **s, kv_remote_url_t *u)
{
    const char *at = *s;
    while (*at && *at != '@' && *at != ',' && *at != '/')
        at++;
    if (*at != '@')
        return 0;
    const char *colon = memchr(*s, ':', (size_t)(at - *s));
    const char *ue = colon ? colon : at;
    int rc = kv_cred_decode(*s, (size_t)(ue - *s), u->user, 1);
    if (!rc && colon)
        rc = kv_cred_decode(colon + 1, (size_t)(at - colon - 1), u->pass, 0);
    if (!rc && ((colon && !u->pass[0]) || (!colon && !u->user[0])))
        rc = KV_EINVAL; /* "user:@" or "@" */
    *s = at + 1;
    return rc;
}

int kv_remote_url_parse(const char *url, kv_remote_url_t *u)
{
    memset(u, 0, sizeof *u);
    size_t sl = url ? kv_scheme(url, &u->tls) : 0;
    if (!sl)
        return KV_EINVAL;
    kv_remote_addr_t tmp[KV_REMOTE_MAX_SEEDS];
    uint32_t k = 0;
    const char *s = url + sl;
    int rc = kv_cred_parse(&s, u);
    for (; !rc;) {
        if (k == KV_REMOTE_MAX_SEEDS)
            return KV_EINVAL;
        rc = kv_seed_parse(s, &s, &tmp[k++]);
        if (rc || !*s)
            break;
        s++; /* ',' */
        int tls = u->tls;
        size_t l = kv_scheme(s, &tls);
        if (tls != u->tls)
            rc = KV_EINVAL; /* one scheme for all */
        s += l;
    }
    if (rc) {
        kv_remote_wipe(u->pass, sizeof u->pass);
        return rc;
    }
    u->seeds = kv_mem_alloc(k * sizeof *u->seeds);
    if (!u->seeds) {
        kv_remote_wipe(u->pass, sizeof u->pass);
        return KV_ENOMEM;
    }
    memcpy(u->seeds, tmp, k * sizeof tmp[0]);
    u->n = k;
    return 0;
}

int kv_remote_url_redact(const char *url, char *buf, size_t cap)
{
    if (!url || (cap && !buf))
        return KV_EINVAL;
    /* everything between the first ':' after the scheme and the last '@' of
     * the url is hidden: a password with a stray '@' or ',' (which the
     * parser refuses) is hidden whole, as is one on a later seed */
    const char *s = strstr(url, "://"), *at = strrchr(url, '@'), *colon = NULL;
    s = s ? s + 3 : url;
    if (at && at > s)
        colon = memchr(s, ':', (size_t)(at - s));
    size_t n = strlen(url), head = colon ? (size_t)(colon - url) + 1 : n;
    size_t tail = colon ? n - (size_t)(at - url) : 0, k = 0;
    const char *parts[3] = {url, colon ? "***" : "", colon ? at : ""};
    size_t lens[3] = {head, colon ? 3u : 0u, tail};
    for (int p = 0; p < 3; p++)
        for (size_t j = 0; j < lens[p]; j++, k++)
            if (k + 1 < cap)
                buf[k] = parts[p][j];
    if (cap)
        buf[k < cap ? k : cap - 1] = 0;
    return k > (size_t)0x7FFFFFFF ? KV_ERANGE : (int)k;
}
