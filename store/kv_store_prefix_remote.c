/* SPDX-License-Identifier: MIT */
/*
 * kv_store_prefix_remote.c — the prefix cache's remote tier: nodes in Redis
 * or Valkey (one server or a Redis Cluster) through remote/ (kv_remote_*),
 * shared by every store that has the same fingerprint and salt
 * (docs/prefix.md, "The remote tier in the store").
 *
 * Publish: every node kv_seq_prefix_publish links is queued with the
 * remote's publisher (kv_remote_pub_put: it copies, a thread of its own
 * stores; never blocks: a full queue drops, counted) under the node's key
 * (the chained block hash), as one value: the record below, then the pages.
 *
 * Fetch: a match that stopped in the host tier asks the remote for the
 * chain's following keys (the boundaries where nodes can end: multiples of
 * the rule's step) in pipelined batches (kv_remote_get, bounded by the
 * configured timeout). Values are taken in chain order while each one
 * checks (remote/'s frame: crc32c, or with a key the MAC, echoed key,
 * namespace; then here: the record's magic, version, geometry, start = the
 * tokens matched so far, end = the key's boundary, parent = the last node's
 * key, every entry full, of
 * its list's target format, unflagged, the length exact, and every page's
 * FP16 values (FP16 rows; INT scales and minimums) finite) and its pages
 * can be had from the pool (no eviction for a fetch): each becomes a host
 * node holding fresh pages. The first key that is missing, fails, or does
 * not fit ends the fetch: a miss from there on, never a wrong token.
 *
 * Record: the remote node record "KVPR" (util/kv_rec.h), then the pages.
 * A value with another magic or version is refused like any bad value
 * (counted in r_bad): so are values of the same layout under "KVPN", which
 * kvpage wrote before the record had a magic of its own (a miss: the next
 * publish of that node overwrites it).
 *
 * Deployment (kv_config_t.prefix_remote_ns, _mac, _mac_prev): the key
 * prefix goes to both clients as their namespace; the MAC keys are read
 * from their sources here, once, handed to both clients (which keep them
 * in their HMAC contexts) and wiped from this file's buffers. A value the
 * fetch's client refuses as unauthenticated is counted in r_bad and
 * r_unauth (remote/ counts it corrupt and unauth).
 *
 * Init: the password is read from its file or variable and the paths are
 * copied (kv_store_prefix_sec.c), both clients are made with them and the
 * MAC keys, and the server is probed once: a refusal (KV_EAUTH), a TLS
 * failure (KV_ETLS) or memory running out (KV_ENOMEM) fails the store's
 * create; a server that is down does not.
 *
 * Ownership: s->pfx owns the client and the publisher and the copies of the
 * config's strings; the publisher owns its copies of queued values.
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "formats/kv_fmt_layout.h"
#include "kv_store_prefix_int.h"
#include "remote/kv_remote.h"
#include "util/kv_le.h"
#include "util/kv_rec.h"

#define FETCH_KEYS 64u             /* keys per batch, at most            */
#define FETCH_BYTES (32u << 20)    /* value buffers per batch, at most   */
#define PUB_ITEMS 4096u
#define PUB_BYTES (512ull << 20)

static size_t rec_meta(uint32_t n_lists, uint32_t n_ents)
{
    return KV_REC_REMOTE_HEAD_BYTES + 4u * (size_t)n_lists +
           KV_REC_REMOTE_ENT_BYTES * (size_t)n_ents;
}

/* The namespace rule of remote/ (kv_remote_create checks it again). */
static int ns_ok(const char *ns)
{
    size_t n = strlen(ns);
    for (size_t i = 0; i < n; i++)
        if (ns[i] <= ' ' || ns[i] > '~')
            return 0;
    return n >= 1 && n <= KV_REMOTE_MAX_NS;
}

int kv_pfx_remote_resolve(const kv_config_t *c)
{
    if (!c->prefix_remote)
        return c->prefix_remote_timeout_ms || c->prefix_remote_ns || c->prefix_remote_mac ||
                       c->prefix_remote_mac_prev ? KV_EINVAL : 0;
    if (!c->prefix_remote[0] || (c->prefix_remote_ns && !ns_ok(c->prefix_remote_ns)) ||
        kv_remote_secret_check(c->prefix_remote_mac) ||
        kv_remote_secret_check(c->prefix_remote_mac_prev) ||
        (c->prefix_remote_mac_prev && !c->prefix_remote_mac))
        return KV_EINVAL;
    return c->prefix_remote_timeout_ms > KV_REMOTE_MAX_TIMEOUT_MS ? KV_ERANGE : 0;
}

/* Copy *field (a string of the config, or NULL) into the store: 0 or KV_ENOMEM. */
static int keep_str(kv_pfx_t *p, const char **field, char **copy, size_t *bytes)
{
    if (!*field)
        return 0;
    size_t n = strlen(*field) + 1;
    if (!(*copy = kv_mem_alloc(n)))
        return KV_ENOMEM;
    memcpy(*copy, *field, n);
    *bytes = n;
    p->bytes += n;
    *field = *copy;
    return 0;
}

/* The clients, with the password and the MAC keys read from their sources
 * (wiped after). */
static int make_clients(kv_store_t *s)
{
    kv_pfx_t *p = s->pfx;
    uint8_t key[2][KV_REMOTE_MAC_KEY_MAX];
    size_t kl[2] = {0, 0};
    char pass[KV_REMOTE_MAX_SECRET + 3]; /* (and "\r\n") */
    int rc = kv_pfx_sec_password(&s->cfg, pass, sizeof pass);
    if (!rc && s->cfg.prefix_remote_mac)
        rc = kv_remote_secret_load(s->cfg.prefix_remote_mac, key[0], &kl[0]);
    if (!rc && s->cfg.prefix_remote_mac_prev)
        rc = kv_remote_secret_load(s->cfg.prefix_remote_mac_prev, key[1], &kl[1]);
    kv_remote_config_t rc_cfg = {.url = s->cfg.prefix_remote,
                                 .ns = s->cfg.prefix_remote_ns,
                                 .timeout_ms = s->cfg.prefix_remote_timeout_ms,
                                 .password = !rc && pass[0] ? pass : NULL,
                                 .tls_ca_file = s->cfg.prefix_remote_tls_ca,
                                 .tls_cert_file = s->cfg.prefix_remote_tls_cert,
                                 .tls_key_file = s->cfg.prefix_remote_tls_key,
                                 .mac_key = kl[0] ? key[0] : NULL,
                                 .mac_key_len = (uint32_t)kl[0],
                                 .mac_prev = kl[1] ? key[1] : NULL,
                                 .mac_prev_len = (uint32_t)kl[1]};
    if (!rc)
        rc = kv_remote_create(&rc_cfg, &p->remote);
    if (!rc)
        rc = kv_remote_pub_create(&rc_cfg, PUB_ITEMS, PUB_BYTES, 0, &p->pub);
    kv_remote_wipe(key, sizeof key);
    kv_remote_wipe(pass, sizeof pass);
    return rc;
}

int kv_pfx_remote_init(kv_store_t *s)
{
    kv_pfx_t *p = s->pfx;
    if (!s->cfg.prefix_remote)
        return 0;
    const char **f[3] = {&s->cfg.prefix_remote_ns, &s->cfg.prefix_remote_mac,
                         &s->cfg.prefix_remote_mac_prev};
    const char *url = s->cfg.prefix_remote;
    int rv = keep_str(p, &url, &p->url, &p->url_bytes);
    s->cfg.prefix_remote = p->url ? p->url : s->cfg.prefix_remote; /* the store's copy */
    for (int i = 0; i < 3 && !rv; i++)
        rv = keep_str(p, f[i], &p->rstr[i], &p->rstr_bytes[i]);
    if (!rv)
        rv = kv_pfx_sec_copy(s);
    if (!rv)
        rv = make_clients(s);
    if (!rv) { /* refused credentials, TLS or memory fail create; a server down does not */
        int pr = kv_remote_probe(p->remote);
        rv = pr == KV_EAUTH || pr == KV_ETLS || pr == KV_ENOMEM ? pr : 0;
    }
    if (rv) {
        kv_pfx_remote_fini(s);
        return rv;
    }
    return 0;
}

int kv_store_prefix_flush(kv_store_t *s, uint32_t timeout_ms)
{
    if (!s || !s->pfx || !s->pfx->pub)
        return 0;
    return kv_remote_pub_flush(s->pfx->pub, timeout_ms);
}

void kv_pfx_remote_fini(kv_store_t *s)
{
    kv_pfx_t *p = s->pfx;
    if (!p)
        return;
    if (p->pub) /* what was published reaches the server, within the timeout */
        (void)kv_remote_pub_flush(p->pub, s->cfg.prefix_remote_timeout_ms
                                              ? s->cfg.prefix_remote_timeout_ms : 1000);
    kv_remote_pub_destroy(p->pub);
    kv_remote_destroy(p->remote);
    kv_mem_free(p->url, p->url_bytes);
    p->bytes -= p->url_bytes;
    p->pub = NULL;
    p->remote = NULL;
    p->url = NULL;
    p->url_bytes = 0;
    for (int i = 0; i < 3; i++) {
        kv_mem_free(p->rstr[i], p->rstr_bytes[i]);
        p->bytes -= p->rstr_bytes[i];
        p->rstr[i] = NULL;
        p->rstr_bytes[i] = 0;
    }
    s->cfg.prefix_remote = NULL;
    s->cfg.prefix_remote_ns = s->cfg.prefix_remote_mac = s->cfg.prefix_remote_mac_prev = NULL;
    kv_pfx_sec_free(s);
}

/* ---- publish -------------------------------------------------------------------- */

void kv_pfx_remote_put(kv_store_t *s, const kv_pfx_node_t *x)
{
    kv_pfx_t *p = s->pfx;
    if (!p->pub)
        return;
    const uint32_t L = s->cfg.n_layers * s->cfg.n_kv_heads;
    if (x->n_ents + 1 > 1024) { /* the publisher's iovec bound */
        p->r_dropped++;
        return;
    }
    size_t meta = rec_meta(L, x->n_ents);
    size_t iob = (size_t)(x->n_ents + 1) * sizeof(struct iovec);
    uint8_t *m = kv_mem_alloc(meta);
    struct iovec *v = kv_mem_alloc(iob);
    if (!m || !v) {
        kv_mem_free(m, meta);
        kv_mem_free(v, iob);
        p->r_dropped++;
        return;
    }
    kv_le_put32(m, KV_REC_REMOTE_MAGIC), kv_le_put32(m + 4, KV_REC_REMOTE_VERSION);
    kv_le_put32(m + 8, x->start), kv_le_put32(m + 12, x->end);
    kv_le_put32(m + 16, L), kv_le_put32(m + 20, s->cfg.page_bytes);
    memset(m + 24, 0, 32);
    if (x->parent)
        memcpy(m + 24, x->parent->key.b, 32);
    uint32_t fmts = 0;
    for (uint32_t li = 0; li < L; li++)
        kv_le_put32(m + KV_REC_REMOTE_HEAD_BYTES + 4u * li, x->off[li + 1] - x->off[li]);
    uint8_t *e = m + KV_REC_REMOTE_HEAD_BYTES + 4u * (size_t)L;
    v[0].iov_base = m;
    v[0].iov_len = meta;
    for (uint32_t i = 0; i < x->n_ents; i++) {
        const kv_page_ent_t *en = &x->ents[i];
        uint8_t *ei = e + KV_REC_REMOTE_ENT_BYTES * (size_t)i;
        ei[0] = en->format, ei[1] = 0;
        kv_le_put16(ei + 2, en->n_tokens);
        fmts |= 1u << en->format;
        v[i + 1].iov_base = kv_page_addr(s->pt, en->id);
        v[i + 1].iov_len = s->cfg.page_bytes;
    }
    kv_remote_key_t key;
    memcpy(key.hash, x->key.b, sizeof key.hash);
    if (kv_remote_pub_put(p->pub, &key, fmts, v, (int)x->n_ents + 1) == 0)
        p->r_put++;
    else
        p->r_dropped++;
    kv_mem_free(v, iob);
    kv_mem_free(m, meta);
}

/* ---- fetch ---------------------------------------------------------------------- */

static int half_finite(const uint8_t *p, size_t n_halves)
{
    for (size_t i = 0; i < n_halves; i++)
        if ((p[2 * i + 1] & 0x7C) == 0x7C)
            return 0;
    return 1;
}

/* 1 if a page of format fmt (full: tpp tokens) has finite FP16 values:
 * FP16 rows, or INT groups' scales and minimums. */
static int page_ok(const kv_store_t *s, uint32_t fmt, const uint8_t *pg, uint32_t tpp)
{
    const uint32_t D = s->cfg.head_dim;
    if (fmt == KV_FMT_FP16)
        return half_finite(pg, (size_t)kv_fmt_fp16_bytes(D, tpp) / 2u);
    kv_fmt_int_layout_t l = kv_fmt_int_layout(D, kv_fmt_int_bits(fmt));
    for (uint32_t g = 0; g < tpp / KV_FMT_INT_GROUP; g++)
        if (!half_finite(pg + (size_t)g * l.group_bytes + l.k_scale,
                         (l.group_bytes - l.k_scale) / 2u)) /* the 4 parameter arrays */
            return 0;
    return 1;
}

/* Tokens per page of fmt in this store. */
static uint32_t tpp_of(const kv_store_t *s, uint32_t fmt)
{
    return kv_format_get(fmt)->tokens_per_page(kv_page_table_geom(s->pt));
}

/* Entries a node [a, b) has in this sequence's lists (full pages). */
static uint32_t ents_for(const kv_store_t *s, const uint8_t *targets, uint32_t a, uint32_t b)
{
    const uint32_t L = s->cfg.n_layers * s->cfg.n_kv_heads;
    uint32_t n = 0;
    for (uint32_t li = 0; li < L; li++)
        n += (b - a) / tpp_of(s, targets[li]);
    return n;
}

/* Validate value v (len bytes) as the node [got, b) after last, and install
 * it: 1 installed (*out), 0 rejected (counted bad) or no pool page (-1). */
static int install(kv_store_t *s, const uint8_t *v, size_t len, uint32_t got, uint32_t b,
                   kv_pfx_node_t *last, const uint8_t *targets, const kv_prefix_hash_t *key,
                   kv_pfx_node_t **out)
{
    kv_pfx_t *p = s->pfx;
    const uint32_t L = s->cfg.n_layers * s->cfg.n_kv_heads, PB = s->cfg.page_bytes;
    static const uint8_t zero[32];
    const uint8_t *cnt = v + KV_REC_REMOTE_HEAD_BYTES; /* entries per list */
    if (len < KV_REC_REMOTE_HEAD_BYTES + 4u * (size_t)L ||
        kv_le_get32(v) != KV_REC_REMOTE_MAGIC || kv_le_get32(v + 4) != KV_REC_REMOTE_VERSION ||
        kv_le_get32(v + 8) != got || kv_le_get32(v + 12) != b || kv_le_get32(v + 16) != L ||
        kv_le_get32(v + 20) != PB ||
        memcmp(v + 24, last ? last->key.b : zero, 32))
        return 0;
    uint32_t n_ents = 0;
    for (uint32_t li = 0; li < L; li++) {
        uint32_t m = kv_le_get32(cnt + 4u * li);
        if (m != (b - got) / tpp_of(s, targets[li]) || (b - got) % tpp_of(s, targets[li]))
            return 0;
        n_ents += m;
    }
    const size_t meta = rec_meta(L, n_ents);
    if (len != meta + (size_t)n_ents * PB)
        return 0;
    const uint8_t *e = cnt + 4u * (size_t)L, *pages = v + meta;
    for (uint32_t li = 0, i = 0; li < L; li++)
        for (uint32_t k = 0; k < kv_le_get32(cnt + 4u * li); k++, i++) {
            const uint8_t *ei = e + KV_REC_REMOTE_ENT_BYTES * (size_t)i;
            uint32_t fmt = ei[0], nt = kv_le_get16(ei + 2);
            if (fmt != targets[li] || ei[1] || nt != tpp_of(s, fmt) ||
                !page_ok(s, fmt, pages + (size_t)i * PB, nt))
                return 0;
        }
    kv_pfx_node_t *x = kv_pfx_node_alloc(L, n_ents, 0);
    if (!x || kv_pfx_reserve(p, 1)) {
        kv_mem_free(x, x ? x->bytes : 0);
        return -1;
    }
    uint32_t i = 0;
    for (uint32_t li = 0; li < L; li++) {
        x->off[li] = i;
        for (uint32_t k = 0; k < kv_le_get32(cnt + 4u * li); k++, i++) {
            kv_page_ent_t *en = &x->ents[i];
            const uint8_t *ei = e + KV_REC_REMOTE_ENT_BYTES * (size_t)i;
            en->format = ei[0];
            en->flags = 0;
            en->n_tokens = (uint16_t)kv_le_get16(ei + 2);
            if (kv_page_ref_new(s->pt, en->format, &en->id)) { /* pool full: stop */
                for (uint32_t j = 0; j < i; j++)
                    kv_page_ref_drop(s->pt, x->ents[j].id, x->ents[j].format);
                kv_mem_free(x, x->bytes);
                return -1;
            }
            memcpy(kv_page_addr(s->pt, en->id), pages + (size_t)i * PB, PB);
        }
    }
    x->off[L] = i;
    x->start = got;
    x->end = b;
    x->key = *key;
    x->parent = last;
    kv_pfx_link(s, x, 0);
    p->r_bytes_in += len;
    *out = x;
    return 1;
}

void kv_pfx_remote_fetch(kv_store_t *s, const kv_prefix_hash_t *h, uint32_t nb,
                         uint32_t cap, uint32_t step, const uint8_t *targets,
                         uint32_t *got, kv_pfx_node_t **last)
{
    kv_pfx_t *p = s->pfx;
    const uint32_t B = kv_store_fp16_tpp(s);
    const uint32_t L = s->cfg.n_layers * s->cfg.n_kv_heads;
    kv_remote_get_t *it = kv_mem_calloc(FETCH_KEYS, sizeof *it);
    if (!it)
        return;
    for (int more = 1; more;) {
        more = 0;
        /* the next boundaries after *got, each a node of one step */
        const uint32_t one = ents_for(s, targets, 0, step);
        const size_t vcap = rec_meta(L, one) + (size_t)one * s->cfg.page_bytes;
        uint32_t n = 0, b = *got + step;
        size_t bytes = 0;
        while (n < FETCH_KEYS && b <= cap && b / B <= nb && bytes + vcap <= FETCH_BYTES) {
            memcpy(it[n].key.hash, h[b / B - 1].b, 32);
            it[n].cap = vcap;
            n++, b += step, bytes += vcap;
        }
        if (n == 0)
            break;
        uint8_t *buf = kv_mem_alloc(bytes);
        if (!buf)
            break;
        for (uint32_t i = 0; i < n; i++)
            it[i].dst = buf + (size_t)i * vcap;
        kv_remote_stats_t r0, r1;
        kv_remote_stats(p->remote, &r0);
        int got_n = kv_remote_get(p->remote, it, n);
        kv_remote_stats(p->remote, &r1);
        p->r_bad += r1.corrupt - r0.corrupt; /* failed the frame's checks */
        p->r_unauth += r1.unauth - r0.unauth; /* of those, not authenticated */
        if (got_n < 0) { /* nothing sent (no memory): no status was set */
            p->r_errors++;
            kv_mem_free(buf, bytes);
            break;
        }
        uint32_t i = 0;
        for (; i < n; i++) {
            kv_pfx_node_t *x = NULL;
            const uint32_t end = *got + step;
            int r = it[i].status;
            if (r == KV_ENOENT || r == KV_ERANGE) /* absent, corrupt, or a longer node */
                break;
            if (r) { /* (a refusal is counted apart: prefix_remote_denied) */
                p->r_errors += r != KV_EAUTH;
                break;
            }
            r = install(s, it[i].dst, it[i].len, *got, end, *last, targets, &h[end / B - 1], &x);
            if (r <= 0) {
                p->r_bad += r == 0;
                break;
            }
            p->r_hits++;
            *got = end;
            *last = x;
        }
        kv_mem_free(buf, bytes);
        more = i == n; /* all taken: the next batch (none left: n 0, stop) */
    }
    kv_mem_free(it, FETCH_KEYS * sizeof *it);
}
