/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_cluster.c — what the servers are: one Redis, or a Redis Cluster
 * and its slot map.
 *
 * CLUSTER SLOTS is asked of the known nodes first (those in the current map,
 * connected ones before the others), then of the seeds of the url, until
 * one answers within the call's deadline:
 *   - an array: a cluster; every [start, end, [host, port, ...], replicas...]
 *     entry maps slots start..end to that master (an empty host means the
 *     node that was asked; "?" an unknown one: those slots stay unserved);
 *   - an error saying cluster support is disabled, or -NOPERM (an ACL user
 *     that may not ask): a single server, that one;
 *   - -NOAUTH / -WRONGPASS: KV_EAUTH (counted), then the next candidate;
 *   - anything else (CLUSTERDOWN, LOADING, a reply that does not parse): the
 *     next candidate.
 * The new map replaces the old one only when a whole reply parsed. Fetches
 * are spaced by at least backoff_ms (a node that stays down would otherwise
 * cost a CLUSTER SLOTS round trip per call).
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "remote/kv_remote_int.h"

static int kv_slots_reply(struct kv_remote *r, void *call, uint32_t node, uint32_t entry,
                          void *reply)
{
    if (entry != KV_FIFO_SLOTS || r->slots_reply) {
        freeReplyObject(reply);
        return KV_EIO;
    }
    r->slots_reply = reply;
    return 0;
}

static void kv_slots_fail(struct kv_remote *r, void *call, uint32_t entry, int status)
{
    *(int *)call = status == KV_REMOTE_RETRY ? KV_EIO : status;
}

/* Parse a CLUSTER SLOTS reply from node `asked` into map. 0 or KV_EIO (not
 * a slot map), KV_ENOMEM / KV_ELIMIT (a node could not be added). */
static int kv_slots_parse(struct kv_remote *r, const redisReply *rep, uint32_t asked,
                          uint16_t *map)
{
    if (rep->type != REDIS_REPLY_ARRAY)
        return KV_EIO;
    for (uint32_t s = 0; s < KV_REMOTE_SLOTS; s++)
        map[s] = KV_REMOTE_NO_NODE;
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i], *m;
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            (m = e->element[2])->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            m->element[0]->type != REDIS_REPLY_STRING ||
            m->element[1]->type != REDIS_REPLY_INTEGER)
            return KV_EIO;
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        long long port = m->element[1]->integer;
        const redisReply *host = m->element[0];
        if (lo < 0 || hi < lo || hi >= KV_REMOTE_SLOTS || port < 1 || port > 65535 ||
            host->len > KV_REMOTE_MAX_HOST)
            return KV_EIO;
        if (host->len == 1 && host->str[0] == '?')
            continue; /* unknown endpoint */
        kv_remote_addr_t a;
        if (host->len == 0) {
            a = r->nodes[asked]->addr;
        } else {
            memcpy(a.host, host->str, host->len);
            a.host[host->len] = 0;
        }
        a.port = (uint16_t)port;
        uint32_t idx;
        int rc = kv_remote_node_get(r, &a, &idx);
        if (rc)
            return rc;
        for (long long s = lo; s <= hi; s++)
            map[s] = (uint16_t)idx;
    }
    return 0;
}

/* Ask node idx; 0 when it told us what the servers are. */
static int kv_ask_node(struct kv_remote *r, uint32_t idx, uint64_t deadline, uint16_t *map)
{
    static const char *const argv[] = {"CLUSTER", "SLOTS"};
    static const size_t lens[] = {7, 5};
    kv_remote_node_t *n = r->nodes[idx];
    int rc = kv_remote_node_connect(r, n, deadline);
    if (rc)
        return rc;
    rc = kv_remote_node_reserve(n, kv_remote_cmd_bytes(2, lens), 1);
    if (rc)
        return rc;
    kv_remote_node_push(n, KV_FIFO_SLOTS);
    kv_remote_node_cmd(n, 2, argv, lens);
    int failed = 0;
    kv_remote_io(r, deadline, kv_slots_reply, kv_slots_fail, &failed);
    redisReply *rep = r->slots_reply;
    r->slots_reply = NULL;
    if (!rep)
        return failed ? failed : KV_EIO;
    rc = KV_EIO;
    int noperm = rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "NOPERM", 6);
    if (noperm || (rep->type == REDIS_REPLY_ERROR && strstr(rep->str, "cluster support disabled"))) {
        r->mode = KV_REMOTE_MODE_SINGLE; /* (an ACL user without +cluster|slots) */
        r->single = idx;
        rc = 0;
    } else if (kv_remote_auth_refused(rep)) { /* -NOAUTH: no password given */
        kv_remote_count(r, KV_RC_AUTH_FAILURES, 1);
        rc = KV_EAUTH;
    } else if (!(rc = kv_slots_parse(r, rep, idx, map))) {
        memcpy(r->slot_node, map, KV_REMOTE_SLOTS * sizeof *map);
        r->mode = KV_REMOTE_MODE_CLUSTER;
    }
    freeReplyObject(rep);
    return rc;
}

int kv_remote_discover(struct kv_remote *r, uint64_t deadline)
{
    uint64_t now = kv_remote_now_ns();
    if (r->mode != KV_REMOTE_MODE_UNKNOWN && now < r->map_ns)
        return 0; /* fetched a moment ago */
    r->map_ns = now + (uint64_t)r->cfg.backoff_ms * 1000000ull;
    uint16_t *map = kv_mem_alloc(KV_REMOTE_SLOTS * sizeof *map);
    if (!map)
        return KV_ENOMEM;
    int rc = KV_EIO, nomem = 0;
    /* known nodes, connected first (pass 0), then the seeds (pass 2) */
    uint32_t known = r->n_nodes;
    for (int pass = 0; pass < 3 && rc; pass++) {
        uint32_t count = pass < 2 ? known : r->n_seeds;
        for (uint32_t i = 0; i < count && rc && rc != -ETIMEDOUT; i++) {
            uint32_t idx = i;
            if (pass < 2 && (r->nodes[i]->fd >= 0) != (pass == 0))
                continue;
            int g = pass == 2 ? kv_remote_node_get(r, &r->seeds[i], &idx) : 0;
            nomem |= g == KV_ENOMEM;
            if (g)
                continue;
            if (pass == 2 && idx < known)
                continue; /* already asked */
            rc = kv_ask_node(r, idx, deadline, map);
        }
    }
    kv_mem_free(map, KV_REMOTE_SLOTS * sizeof *map);
    if (rc == KV_EIO && nomem)
        rc = KV_ENOMEM; /* a seed not asked for want of memory, not a server down */
    if (!rc) {
        r->stale = 0;
        kv_remote_count(r, KV_RC_SLOT_MAPS, r->mode == KV_REMOTE_MODE_CLUSTER);
    }
    return rc;
}
