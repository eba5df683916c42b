/* SPDX-License-Identifier: MIT */
/*
 * kv_remote.c — the remote tier client: create/destroy, and the one engine
 * behind kv_remote_get, kv_remote_set and kv_remote_exists (see kv_remote.h).
 *
 * A call runs in rounds against one deadline (now + timeout_ms):
 *   0. if the mode is unknown or the slot map is stale, discover
 *      (kv_remote_cluster.c);
 *   1. every key still to send is routed (its ASK or MOVED target, the one
 *      server, or the master of its slot), its node connected if need be,
 *      and its command appended to the node's output (ASKING first after an
 *      ASK); a key whose node cannot be had is finished at once;
 *   2. kv_remote_io sends to and reads from all nodes at once; each reply
 *      finishes its key, or redirects it (MOVED patches the slot map and
 *      marks it stale; ASK pins the key to the target for the next round);
 *   3. another round while keys were redirected (at most max_redirects per
 *      key) or resent after an idle connection dropped.
 * Every key ends with exactly one status, counted once in the stats.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "remote/kv_remote_int.h"

enum { KV_OP_GET, KV_OP_SET, KV_OP_EXISTS };
enum { KV_ST_SEND, KV_ST_FLIGHT, KV_ST_DONE };

struct kv_op {
    uint32_t node;      /* target when pinned (after ASK / MOVED in single mode) */
    uint16_t redirects; /* redirections and resends so far                    */
    uint8_t pinned;     /* go to node                                         */
    uint8_t ask;        /* send ASKING first                                  */
    uint8_t state;      /* KV_ST_*                                            */
};
typedef struct kv_op kv_op_t;

typedef struct kv_call {
    int kind;                  /* KV_OP_*                                     */
    size_t n;
    kv_remote_get_t *gets;     /* KV_OP_GET                                   */
    kv_remote_set_t *sets;     /* KV_OP_SET                                   */
    const kv_remote_key_t *keys; /* KV_OP_EXISTS                              */
    int *exist;                /* KV_OP_EXISTS                                */
    kv_op_t *ops;              /* [n]                                         */
    size_t redo;               /* keys to send again next round               */
    int unrouted;              /* status of a key with no node: KV_EIO, or    */
                               /* discovery's -ETIMEDOUT, KV_EAUTH, KV_ETLS   */
    int done;                  /* keys that succeeded                         */
} kv_call_t;

static const kv_remote_key_t *kv_call_key(const kv_call_t *c, size_t i)
{
    return c->kind == KV_OP_GET ? &c->gets[i].key
         : c->kind == KV_OP_SET ? &c->sets[i].key : &c->keys[i];
}

/* Key i ends with status (0 / 1 success; see kv_remote.h). */
static void kv_finish(struct kv_remote *r, kv_call_t *c, size_t i, int status)
{
    c->ops[i].state = KV_ST_DONE;
    int ok = c->kind == KV_OP_EXISTS ? status == 1 : status == 0;
    if (c->kind == KV_OP_GET)
        c->gets[i].status = status;
    else if (c->kind == KV_OP_SET)
        c->sets[i].status = status;
    else
        c->exist[i] = status;
    c->done += ok;
    if (c->kind != KV_OP_SET)
        kv_remote_count(r, ok ? KV_RC_HITS : KV_RC_MISSES, 1);
    else if (ok)
        kv_remote_count(r, KV_RC_STORED, 1);
    if (status == -ETIMEDOUT)
        kv_remote_count(r, KV_RC_TIMEOUTS, 1);
    else if (status == KV_EAUTH)
        kv_remote_count(r, KV_RC_DENIED, 1);
    else if (status < 0 && status != KV_ENOENT && status != KV_ERANGE)
        kv_remote_count(r, KV_RC_ERRORS, 1);
}

/* Send key i again next round (a redirection or a resend). */
static void kv_redo(struct kv_remote *r, kv_call_t *c, size_t i)
{
    kv_op_t *op = &c->ops[i];
    if (++op->redirects > r->cfg.max_redirects) {
        kv_finish(r, c, i, KV_EIO);
        return;
    }
    op->state = KV_ST_SEND;
    c->redo++;
}

/* "MOVED slot host:port" / "ASK slot host:port": 1 if rep was one (key i
 * then redirected or finished), 0 otherwise. */
static int kv_redirect(struct kv_remote *r, kv_call_t *c, size_t i, uint32_t from,
                       const redisReply *rep)
{
    int moved = !strncmp(rep->str, "MOVED ", 6), ask = !strncmp(rep->str, "ASK ", 4);
    if (!moved && !ask)
        return 0;
    char *end;
    unsigned long slot = strtoul(rep->str + (moved ? 6 : 4), &end, 10);
    const char *hp = end + (*end == ' '), *colon = strrchr(hp, ':');
    kv_remote_addr_t a;
    size_t hl = colon ? (size_t)(colon - hp) : 0;
    unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
    if (*end != 0 || !colon || slot >= KV_REMOTE_SLOTS || port < 1 || port > 65535 ||
        hl > KV_REMOTE_MAX_HOST || (hl == 1 && hp[0] == '?')) {
        kv_finish(r, c, i, KV_EIO);
        return 1;
    }
    if (hl == 0) {
        a = r->nodes[from]->addr; /* ":port": the host we asked */
    } else {
        if (hp[0] == '[' && hl >= 2 && hp[hl - 1] == ']')
            hp++, hl -= 2;
        memcpy(a.host, hp, hl);
        a.host[hl] = 0;
    }
    a.port = (uint16_t)port;
    uint32_t idx;
    int rc = kv_remote_node_get(r, &a, &idx);
    if (rc) {
        kv_finish(r, c, i, rc);
        return 1;
    }
    kv_op_t *op = &c->ops[i];
    op->ask = (uint8_t)ask;
    op->pinned = (uint8_t)(ask || r->mode != KV_REMOTE_MODE_CLUSTER);
    op->node = idx;
    if (moved && r->mode == KV_REMOTE_MODE_CLUSTER)
        r->slot_node[slot] = (uint16_t)idx;
    else if (moved)
        r->mode = KV_REMOTE_MODE_UNKNOWN; /* one server turned cluster node */
    r->stale |= moved;
    kv_remote_count(r, moved ? KV_RC_MOVED : KV_RC_ASKED, 1);
    kv_redo(r, c, i);
    return 1;
}

/* The reply to a GET of key i: check the frame, copy the payload. */
static int kv_get_reply(struct kv_remote *r, kv_remote_get_t *g, const redisReply *rep)
{
    if (rep->type == REDIS_REPLY_NIL)
        return KV_ENOENT;
    const uint8_t *payload;
    size_t len;
    uint32_t format;
    int bad = rep->type != REDIS_REPLY_STRING /* WRONGTYPE and the like: not ours */
                  ? KV_ECORRUPT
                  : kv_remote_frame_open(r->mac, r->ns, &g->key, rep->str, rep->len, &payload,
                                         &len, &format);
    if (bad) {
        int server_error = rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "WRONGTYPE", 9);
        if (server_error)
            return KV_EIO;
        kv_remote_count(r, KV_RC_CORRUPT, 1);
        if (bad == KV_REMOTE_UNAUTH)
            kv_remote_count(r, KV_RC_UNAUTH, 1);
        return KV_ENOENT;
    }
    g->len = len;
    if (len > g->cap)
        return KV_ERANGE;
    if (len)
        memcpy(g->dst, payload, len);
    g->format = format;
    kv_remote_count(r, KV_RC_BYTES_IN, len);
    return 0;
}

static int kv_op_reply(struct kv_remote *r, void *vcall, uint32_t node, uint32_t entry,
                       void *vrep)
{
    kv_call_t *c = vcall;
    redisReply *rep = vrep;
    if (entry == KV_FIFO_ASKING) { /* an error here shows in the next reply */
        freeReplyObject(rep);
        return 0;
    }
    if (entry >= c->n || c->ops[entry].state != KV_ST_FLIGHT) {
        freeReplyObject(rep);
        return KV_EIO; /* out of step with the connection: drop it */
    }
    size_t i = entry;
    if (rep->type == REDIS_REPLY_ERROR && kv_redirect(r, c, i, node, rep)) {
        freeReplyObject(rep);
        return 0;
    }
    int st;
    if (kv_remote_auth_refused(rep)) {
        st = KV_EAUTH; /* never a miss that looks like a cold cache */
    } else if (c->kind == KV_OP_GET) {
        st = kv_get_reply(r, &c->gets[i], rep);
    } else if (c->kind == KV_OP_EXISTS) {
        st = rep->type == REDIS_REPLY_INTEGER ? rep->integer > 0 : KV_EIO;
    } else {
        st = rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "OK") ? 0 : KV_EIO;
        if (!st) {
            size_t len = 0;
            kv_remote_iov_len(c->sets[i].iov, c->sets[i].iovcnt, &len);
            kv_remote_count(r, KV_RC_BYTES_OUT, len);
        }
    }
    freeReplyObject(rep);
    kv_finish(r, c, i, st);
    return 0;
}

static void kv_op_fail(struct kv_remote *r, void *vcall, uint32_t entry, int status)
{
    kv_call_t *c = vcall;
    if (entry >= c->n || c->ops[entry].state != KV_ST_FLIGHT)
        return; /* ASKING, or already finished */
    if (status == KV_REMOTE_RETRY)
        kv_redo(r, c, entry);
    else
        kv_finish(r, c, entry, status);
}

/* Append key i's command to node nd (connected). 0 or KV_ENOMEM. */
static int kv_write_op(struct kv_remote *r, kv_call_t *c, size_t i, kv_remote_node_t *nd,
                       const char *key, size_t klen)
{
    static const char *const asking[] = {"ASKING"};
    static const size_t asking_len[] = {6};
    kv_op_t *op = &c->ops[i];
    size_t need = op->ask ? kv_remote_cmd_bytes(1, asking_len) : 0;
    if (c->kind != KV_OP_SET) {
        const char *argv[2] = {c->kind == KV_OP_GET ? "GET" : "EXISTS", key};
        size_t lens[2] = {c->kind == KV_OP_GET ? 3u : 6u, klen};
        need += kv_remote_cmd_bytes(2, lens);
        if (kv_remote_node_reserve(nd, need, 2u))
            return KV_ENOMEM;
        if (op->ask) {
            kv_remote_node_push(nd, KV_FIFO_ASKING);
            kv_remote_node_cmd(nd, 1, asking, asking_len);
        }
        kv_remote_node_cmd(nd, 2, argv, lens);
    } else {
        const kv_remote_set_t *s = &c->sets[i];
        size_t len = 0, hb = r->mac ? KV_REC_FRAME_SIGNED_BYTES : KV_REC_FRAME_BYTES;
        uint8_t hdr[KV_REC_FRAME_SIGNED_BYTES];
        kv_remote_iov_len(s->iov, s->iovcnt, &len); /* checked at the call */
        if (!r->mac)
            kv_remote_frame_header(r->ns, &s->key, s->format, s->iov, s->iovcnt, len, hdr);
        else if (kv_remote_frame_header_signed(r->mac, r->ns, &s->key, s->format, s->iov,
                                               s->iovcnt, len, hdr))
            return KV_EIO; /* libcrypto failed: not stored */
        char head[160], tail[64];
        int hl = snprintf(head, sizeof head, "*%d\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n",
                          r->cfg.ttl_ms ? 5 : 3, klen, key, len + hb);
        int tl = r->cfg.ttl_ms ? snprintf(tail, sizeof tail, "\r\n$2\r\nPX\r\n$%d\r\n%u\r\n",
                                          snprintf(NULL, 0, "%u", r->cfg.ttl_ms), r->cfg.ttl_ms)
                               : snprintf(tail, sizeof tail, "\r\n");
        need += (size_t)hl + hb + len + (size_t)tl;
        if (kv_remote_node_reserve(nd, need, 2u))
            return KV_ENOMEM;
        if (op->ask) {
            kv_remote_node_push(nd, KV_FIFO_ASKING);
            kv_remote_node_cmd(nd, 1, asking, asking_len);
        }
        kv_remote_node_append(nd, head, (size_t)hl);
        kv_remote_node_append(nd, hdr, hb);
        for (int v = 0; v < s->iovcnt; v++)
            kv_remote_node_append(nd, s->iov[v].iov_base, s->iov[v].iov_len);
        kv_remote_node_append(nd, tail, (size_t)tl);
    }
    kv_remote_node_push(nd, (uint32_t)i);
    op->state = KV_ST_FLIGHT;
    return 0;
}

/* Route and write every key still to send. */
static void kv_round_write(struct kv_remote *r, kv_call_t *c, uint64_t deadline)
{
    char key[KV_REMOTE_MAX_NS + 2 + 2 * KV_REMOTE_HASH_BYTES];
    int late = kv_remote_now_ns() >= deadline; /* (a redirect at the last moment) */
    for (size_t i = 0; i < c->n; i++) {
        kv_op_t *op = &c->ops[i];
        if (op->state != KV_ST_SEND)
            continue;
        if (late) {
            kv_finish(r, c, i, -ETIMEDOUT);
            continue;
        }
        int klen = kv_remote_key_string(r->ns, kv_call_key(c, i), key, sizeof key);
        uint32_t node = op->pinned ? op->node : KV_REMOTE_NO_NODE;
        if (!op->pinned && r->mode == KV_REMOTE_MODE_SINGLE)
            node = r->single;
        else if (!op->pinned && r->mode == KV_REMOTE_MODE_CLUSTER)
            node = r->slot_node[kv_remote_slot(key, (size_t)klen)];
        if (node == KV_REMOTE_NO_NODE) {
            r->stale |= r->mode == KV_REMOTE_MODE_CLUSTER;
            kv_finish(r, c, i, c->unrouted);
            continue;
        }
        kv_remote_node_t *nd = r->nodes[node];
        int rc = kv_remote_node_connect(r, nd, deadline);
        if (!rc)
            rc = kv_write_op(r, c, i, nd, key, (size_t)klen);
        if (rc)
            kv_finish(r, c, i, rc);
    }
}

static int kv_call_run(struct kv_remote *r, kv_call_t *c)
{
    if (c->n == 0)
        return 0;
    void *ops = r->ops; /* per-key state: grown, never shrunk */
    int rc = kv_remote_grow(&ops, &r->ops_cap, 0, c->n, sizeof *c->ops);
    r->ops = ops;
    if (rc)
        return rc;
    c->ops = r->ops;
    memset(c->ops, 0, c->n * sizeof *c->ops);
    r->epoch++;
    uint64_t deadline = kv_remote_now_ns() + (uint64_t)r->cfg.timeout_ms * 1000000ull;
    kv_remote_count(r, c->kind == KV_OP_SET ? KV_RC_SETS : KV_RC_GETS, c->n);
    c->unrouted = KV_EIO;
    if (r->mode == KV_REMOTE_MODE_UNKNOWN || r->stale) {
        int drc = kv_remote_discover(r, deadline);
        if (drc == -ETIMEDOUT || drc == KV_EAUTH || drc == KV_ETLS)
            c->unrouted = drc;
    }
    do {
        c->redo = 0;
        kv_round_write(r, c, deadline);
        kv_remote_io(r, deadline, kv_op_reply, kv_op_fail, c);
    } while (c->redo);
    for (size_t i = 0; i < c->n; i++) /* (none should be left: a safety net) */
        if (c->ops[i].state != KV_ST_DONE)
            kv_finish(r, c, i, KV_EIO);
    return c->done;
}

int kv_remote_get(kv_remote_t *r, kv_remote_get_t *items, size_t n)
{
    if (!r || (n && !items))
        return KV_EINVAL;
    if (n > KV_REMOTE_MAX_BATCH)
        return KV_ERANGE;
    for (size_t i = 0; i < n; i++)
        if (items[i].cap && !items[i].dst)
            return KV_EINVAL;
    for (size_t i = 0; i < n; i++)
        items[i].len = 0, items[i].format = 0;
    kv_call_t c = {.kind = KV_OP_GET, .n = n, .gets = items};
    return kv_call_run(r, &c);
}

int kv_remote_set(kv_remote_t *r, kv_remote_set_t *items, size_t n)
{
    if (!r || (n && !items))
        return KV_EINVAL;
    if (n > KV_REMOTE_MAX_BATCH)
        return KV_ERANGE;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        int rc = kv_remote_iov_len(items[i].iov, items[i].iovcnt, &len);
        if (rc)
            return rc;
    }
    kv_call_t c = {.kind = KV_OP_SET, .n = n, .sets = items};
    return kv_call_run(r, &c);
}

int kv_remote_exists(kv_remote_t *r, const kv_remote_key_t *keys, int *status, size_t n)
{
    if (!r || (n && (!keys || !status)))
        return KV_EINVAL;
    if (n > KV_REMOTE_MAX_BATCH)
        return KV_ERANGE;
    kv_call_t c = {.kind = KV_OP_EXISTS, .n = n, .keys = keys, .exist = status};
    return kv_call_run(r, &c);
}

int kv_remote_stats(const kv_remote_t *r, kv_remote_stats_t *o)
{
    if (!r || !o)
        return KV_EINVAL;
    uint64_t v[KV_RC_COUNT];
    for (int i = 0; i < KV_RC_COUNT; i++)
        v[i] = atomic_load_explicit(&((kv_remote_t *)r)->c[i], memory_order_relaxed);
    *o = (kv_remote_stats_t){
        .gets = v[KV_RC_GETS], .hits = v[KV_RC_HITS], .misses = v[KV_RC_MISSES],
        .corrupt = v[KV_RC_CORRUPT], .errors = v[KV_RC_ERRORS],
        .timeouts = v[KV_RC_TIMEOUTS], .sets = v[KV_RC_SETS], .stored = v[KV_RC_STORED],
        .bytes_in = v[KV_RC_BYTES_IN], .bytes_out = v[KV_RC_BYTES_OUT],
        .moved = v[KV_RC_MOVED], .asked = v[KV_RC_ASKED], .slot_maps = v[KV_RC_SLOT_MAPS],
        .connects = v[KV_RC_CONNECTS], .connect_failures = v[KV_RC_CONNECT_FAILURES],
        .unauth = v[KV_RC_UNAUTH], .auth_failures = v[KV_RC_AUTH_FAILURES],
        .denied = v[KV_RC_DENIED], .tls_failures = v[KV_RC_TLS_FAILURES]};
    return 0;
}

int kv_remote_probe(kv_remote_t *r)
{
    if (!r)
        return KV_EINVAL;
    r->epoch++;
    uint64_t deadline = kv_remote_now_ns() + (uint64_t)r->cfg.timeout_ms * 1000000ull;
    if (r->mode != KV_REMOTE_MODE_UNKNOWN) {
        r->stale = 1;
        r->map_ns = 0;
    }
    return kv_remote_discover(r, deadline);
}

/* ---- create / destroy --------------------------------------------------- */

static int kv_config_fill(const kv_remote_config_t *in, kv_remote_config_t *c)
{
    *c = *in;
    const char *ns = c->ns ? c->ns : "kvp";
    size_t nl = strlen(ns);
    if (nl == 0 || nl > KV_REMOTE_MAX_NS)
        return KV_EINVAL;
    for (size_t i = 0; i < nl; i++)
        if (ns[i] <= ' ' || ns[i] > '~')
            return KV_EINVAL;
    if (c->timeout_ms > KV_REMOTE_MAX_TIMEOUT_MS ||
        c->connect_timeout_ms > KV_REMOTE_MAX_TIMEOUT_MS ||
        c->backoff_ms > KV_REMOTE_MAX_TIMEOUT_MS ||
        c->backoff_max_ms > KV_REMOTE_MAX_TIMEOUT_MS || c->max_redirects > 64)
        return KV_ERANGE;
    if (!c->timeout_ms)
        c->timeout_ms = 1000;
    if (!c->connect_timeout_ms)
        c->connect_timeout_ms = c->timeout_ms < 200 ? c->timeout_ms : 200;
    if (!c->backoff_ms)
        c->backoff_ms = 50;
    if (!c->backoff_max_ms)
        c->backoff_max_ms = c->backoff_ms > 5000 ? c->backoff_ms : 5000;
    if (c->backoff_max_ms < c->backoff_ms)
        return KV_ERANGE;
    if (!c->max_redirects)
        c->max_redirects = 5;
    int rc = kv_remote_mac_check_key(c->mac_key, c->mac_key_len);
    if (!rc)
        rc = kv_remote_mac_check_key(c->mac_prev, c->mac_prev_len);
    if (!rc && c->mac_prev && !c->mac_key)
        rc = KV_EINVAL;
    c->mac_key = c->mac_prev = NULL; /* the keys live in the client's mac only */
    if (rc)
        return rc;
    if ((c->tls_cert_file == NULL) != (c->tls_key_file == NULL))
        return KV_EINVAL;
    if (c->password && (!c->password[0] || strlen(c->password) > KV_REMOTE_MAX_SECRET))
        return c->password[0] ? KV_ERANGE : KV_EINVAL;
    return 0;
}

/* "*N\r\n$4\r\nAUTH\r\n[user]password" as RESP, into r->auth. */
static int kv_auth_build(struct kv_remote *r, const char *user, const char *pass)
{
    const char *argv[3] = {"AUTH", user, pass};
    size_t lens[3] = {4, strlen(user), strlen(pass)};
    int argc = lens[1] ? 3 : 2;
    if (!lens[1])
        argv[1] = pass, lens[1] = lens[2];
    size_t cap = kv_remote_cmd_bytes(argc, lens);
    kv_remote_node_t tmp = {.out = kv_mem_alloc(cap), .out_cap = cap};
    if (!tmp.out)
        return KV_ENOMEM;
    kv_remote_node_cmd(&tmp, argc, argv, lens);
    r->auth = tmp.out;
    r->auth_len = tmp.out_len;
    r->auth_bytes = cap;
    return 0;
}

void kv_remote_destroy(kv_remote_t *r)
{
    if (!r)
        return;
    for (uint32_t i = 0; i < r->n_nodes; i++)
        kv_remote_node_free(r->nodes[i]);
    kv_remote_tls_ctx_free(r->tls);
    if (r->auth) {
        size_t cap = r->auth_bytes;
        kv_remote_wipe(r->auth, cap);
        kv_mem_free(r->auth, cap);
    }
    if (r->url)
        kv_remote_wipe(r->url, r->url_bytes);
    kv_mem_free(r->url, r->url_bytes);
    kv_mem_free(r->seeds, r->n_seeds * sizeof *r->seeds);
    kv_mem_free(r->nodes, KV_REMOTE_MAX_NODES * sizeof *r->nodes);
    kv_mem_free(r->slot_node, KV_REMOTE_SLOTS * sizeof *r->slot_node);
    kv_mem_free(r->rbuf, KV_REMOTE_RBUF);
    kv_mem_free(r->pfd, KV_REMOTE_MAX_NODES * sizeof *r->pfd);
    kv_mem_free(r->pwho, KV_REMOTE_MAX_NODES * sizeof *r->pwho);
    kv_mem_free(r->ops, r->ops_cap * sizeof *r->ops);
    kv_remote_mac_destroy(r->mac);
    kv_mem_free(r, sizeof *r);
}

int kv_remote_create(const kv_remote_config_t *cfg, kv_remote_t **out)
{
    if (!cfg || !out || !cfg->url)
        return KV_EINVAL;
    kv_remote_config_t c;
    int rc = kv_config_fill(cfg, &c);
    if (rc)
        return rc;
    kv_remote_url_t u;
    rc = kv_remote_url_parse(cfg->url, &u);
    if (rc)
        return rc;
    const char *pass = cfg->password ? cfg->password : u.pass;
    if ((cfg->password && u.pass[0]) || (u.user[0] && !pass[0]) ||
        (!u.tls && (cfg->tls_ca_file || cfg->tls_cert_file)))
        rc = KV_EINVAL; /* two passwords, a user without one, TLS files on redis:// */
    kv_remote_t *r = rc ? NULL : kv_mem_calloc(1, sizeof *r);
    if (!r) {
        kv_mem_free(u.seeds, u.n * sizeof *u.seeds);
        kv_remote_wipe(u.pass, sizeof u.pass);
        return rc ? rc : KV_ENOMEM;
    }
    r->seeds = u.seeds;
    r->n_seeds = u.n;
    rc = pass[0] ? kv_auth_build(r, u.user, pass) : 0;
    kv_remote_wipe(u.pass, sizeof u.pass);
    if (!rc && u.tls)
        rc = kv_remote_tls_ctx(&c, &r->tls);
    if (rc) {
        kv_remote_destroy(r);
        return rc;
    }
    size_t ul = strlen(cfg->url) + 1;
    r->url = kv_mem_alloc(ul);
    r->url_bytes = r->url ? ul : 0;
    r->nodes = kv_mem_calloc(KV_REMOTE_MAX_NODES, sizeof *r->nodes);
    r->slot_node = kv_mem_alloc(KV_REMOTE_SLOTS * sizeof *r->slot_node);
    r->rbuf = kv_mem_alloc(KV_REMOTE_RBUF);
    r->pfd = kv_mem_alloc(KV_REMOTE_MAX_NODES * sizeof *r->pfd);
    r->pwho = kv_mem_alloc(KV_REMOTE_MAX_NODES * sizeof *r->pwho);
    if (!r->url || !r->nodes || !r->slot_node || !r->rbuf || !r->pfd || !r->pwho) {
        kv_remote_destroy(r);
        return KV_ENOMEM;
    }
    if (cfg->mac_key &&
        (rc = kv_remote_mac_create(cfg->mac_key, cfg->mac_key_len, cfg->mac_prev,
                                   cfg->mac_prev_len, &r->mac))) {
        kv_remote_destroy(r);
        return rc;
    }
    memcpy(r->url, cfg->url, ul);
    strcpy(r->ns, cfg->ns ? cfg->ns : "kvp");
    c.url = r->url;
    c.ns = r->ns;
    c.password = c.tls_ca_file = c.tls_cert_file = c.tls_key_file = NULL; /* used up */
    r->cfg = c;
    for (uint32_t s = 0; s < KV_REMOTE_SLOTS; s++)
        r->slot_node[s] = KV_REMOTE_NO_NODE;
    r->rng = (uint64_t)(uintptr_t)r ^ kv_remote_now_ns() ^ 0x9E3779B97F4A7C15ull;
    *out = r;
    return 0;
}
