/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_url.c — the servers of a remote tier url:
 *   url  = seed *("," seed)
 *   seed = ["redis://"] host ":" port       (the first seed needs the scheme)
 *   host = name or IPv4 ([A-Za-z0-9._-], 1..255 bytes) | "[" IPv6 "]"
 *   port = 1..65535, decimal
 * Nothing else (user, password, database, query) is accepted: KV_EINVAL.
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "remote/kv_remote_int.h"

static const char kv_scheme[] = "redis://";

static int kv_host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '-' || c == '_';
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

int kv_remote_url_parse(const char *url, kv_remote_addr_t **seeds, uint32_t *n)
{
    if (!url || strncmp(url, kv_scheme, sizeof kv_scheme - 1) != 0)
        return KV_EINVAL;
    kv_remote_addr_t tmp[KV_REMOTE_MAX_SEEDS];
    uint32_t k = 0;
    const char *s = url + sizeof kv_scheme - 1;
    for (;;) {
        if (k == KV_REMOTE_MAX_SEEDS)
            return KV_EINVAL;
        int rc = kv_seed_parse(s, &s, &tmp[k++]);
        if (rc)
            return rc;
        if (!*s)
            break;
        s++; /* ',' */
        if (strncmp(s, kv_scheme, sizeof kv_scheme - 1) == 0)
            s += sizeof kv_scheme - 1;
    }
    *seeds = kv_mem_alloc(k * sizeof **seeds);
    if (!*seeds)
        return KV_ENOMEM;
    memcpy(*seeds, tmp, k * sizeof tmp[0]);
    *n = k;
    return 0;
}
