/* SPDX-License-Identifier: MIT */
/*
 * test_remote_cluster.c — the remote tier client against a real Redis
 * Cluster of 3 masters (started by this test on free loopback ports):
 *   - kv_remote_slot agrees with the server's CLUSTER KEYSLOT (hash tags
 *     included); 3000 keys in about 2700 distinct slots make round trips,
 *     and every node holds some;
 *   - a client given one seed (behind a dead one) finds the whole cluster;
 *   - a slot resharded by hand: during the migration (IMPORTING/MIGRATING,
 *     one key moved with MIGRATE) a GET and a SET are answered ASK and
 *     followed with ASKING; after it (SETSLOT NODE) a GET is answered MOVED,
 *     followed, and the slot map is fetched again;
 *   - a master SIGSTOPped: its keys time out within the call's timeout, the
 *     others' keys are served in the same call; SIGKILLed: errors for its
 *     keys only; restarted: its keys are served again (as misses: the
 *     servers keep no data across a restart).
 */
#include <errno.h>
#include <signal.h>

#include "kv_test_redis.h"
#include "kv_test_remote.h"

static kv_tredis_t srv;

static uint32_t key_slot(uint64_t id)
{
    char k[128];
    kv_remote_key_t key = kv_tr_key(id);
    int n = kv_remote_key_string("c", &key, k, sizeof k);
    return kv_remote_slot(k, (size_t)n);
}

/* Node (0..2) that owns the slot of string key k: the one that does not
 * answer MOVED. */
static int owner_of(const char *k)
{
    for (int i = 0; i < 3; i++) {
        redisReply *r = kv_tredis_cmd(&srv, i, "EXISTS %s", k);
        int mine = r && r->type == REDIS_REPLY_INTEGER;
        if (r)
            freeReplyObject(r);
        if (mine)
            return i;
    }
    return -1;
}

static int owner_of_id(uint64_t id)
{
    char k[128];
    kv_remote_key_t key = kv_tr_key(id);
    kv_remote_key_string("c", &key, k, sizeof k);
    return owner_of(k);
}

static void test_slots(void)
{
    const char *tricky[] = {"123456789", "{user1000}.following", "{user1000}.followers",
                            "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{}", "{a", "a}b{c}",
                            ""};
    for (size_t i = 0; i < sizeof tricky / sizeof *tricky; i++) {
        redisReply *r = kv_tredis_cmd(&srv, 0, "CLUSTER KEYSLOT %s", tricky[i]);
        CHECK(r && r->type == REDIS_REPLY_INTEGER);
        if (r && r->type == REDIS_REPLY_INTEGER)
            CHECK_EQ(kv_remote_slot(tricky[i], strlen(tricky[i])), r->integer);
        if (r)
            freeReplyObject(r);
    }
    CHECK_EQ(kv_remote_slot("123456789", 9), 0x31C3 & 16383);
    CHECK_EQ(kv_remote_slot("{user1000}.following", 20), kv_remote_slot("user1000", 8));
    for (uint64_t id = 0; id < 50; id++) {
        char k[128];
        kv_remote_key_t key = kv_tr_key(id);
        kv_remote_key_string("c", &key, k, sizeof k);
        redisReply *r = kv_tredis_cmd(&srv, 0, "CLUSTER KEYSLOT %s", k);
        CHECK(r && r->type == REDIS_REPLY_INTEGER && (uint32_t)r->integer == key_slot(id));
        if (r)
            freeReplyObject(r);
    }
}

static void test_many_slots(void)
{
    kv_remote_t *r = kv_tr_client(srv.url, "c", 3000);
    enum { N = 3000 };
    static uint8_t bufs[N][200];
    static struct iovec iv[N];
    static kv_remote_set_t s[N];
    static kv_remote_get_t g[N];
    static uint8_t seen[16384];
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        kv_tr_fill(bufs[i], 200, (uint64_t)i);
        iv[i] = (struct iovec){bufs[i], 200};
        s[i] = (kv_remote_set_t){.key = kv_tr_key((uint64_t)i), .format = (uint32_t)i,
                                 .iov = &iv[i], .iovcnt = 1};
        uint32_t sl = key_slot((uint64_t)i);
        distinct += !seen[sl];
        seen[sl] = 1;
    }
    CHECK(distinct > 2500);
    CHECK_EQ(kv_remote_set(r, s, N), N);
    memset(bufs, 0, sizeof bufs);
    for (int i = 0; i < N; i++)
        g[i] = (kv_remote_get_t){.key = kv_tr_key((uint64_t)i), .dst = bufs[i], .cap = 200};
    CHECK_EQ(kv_remote_get(r, g, N), N);
    int good = 0;
    for (int i = 0; i < N; i++)
        good += g[i].status == 0 && g[i].format == (uint32_t)i &&
                kv_tr_is(bufs[i], 200, (uint64_t)i);
    CHECK_EQ(good, N);
    long long total = 0;
    for (int n = 0; n < 3; n++) {
        redisReply *rep = kv_tredis_cmd(&srv, n, "DBSIZE");
        CHECK(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 500);
        total += rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : 0;
        if (rep)
            freeReplyObject(rep);
    }
    CHECK_EQ(total, N);
    kv_remote_stats_t st;
    CHECK_OK(kv_remote_stats(r, &st));
    CHECK_EQ(st.slot_maps, 1);
    CHECK_EQ(st.moved + st.asked + st.errors, 0);
    CHECK_EQ(st.connects, 3);
    kv_remote_destroy(r);

    /* one live seed behind a dead one: the whole cluster is found */
    char url[256];
    snprintf(url, sizeof url, "redis://127.0.0.1:1,127.0.0.1:%d", srv.port[1]);
    r = kv_tr_client(url, "c", 3000);
    for (int i = 0; i < N; i++)
        g[i] = (kv_remote_get_t){.key = kv_tr_key((uint64_t)i), .dst = bufs[i], .cap = 200};
    CHECK_EQ(kv_remote_get(r, g, N), N);
    kv_remote_destroy(r);
}

static char *node_id(int i, char *buf)
{
    redisReply *r = kv_tredis_cmd(&srv, i, "CLUSTER MYID");
    CHECK(r && r->type == REDIS_REPLY_STRING && r->len < 64);
    buf[0] = 0;
    if (r && r->type == REDIS_REPLY_STRING && r->len < 64)
        memcpy(buf, r->str, r->len + 1);
    if (r)
        freeReplyObject(r);
    return buf;
}

static void ok_reply(redisReply *r, const char *what)
{
    int ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok)
        fprintf(stderr, "%s: %s\n", what, r && r->str ? r->str : "(no reply)");
    CHECK(ok);
    if (r)
        freeReplyObject(r);
}

static void test_reshard(void)
{
    kv_remote_t *r = kv_tr_client(srv.url, "c", 3000);
    /* three keys of one slot: k1, k2 stored now, k3 only set mid-migration */
    uint64_t k1 = 100000, ids[3] = {k1, 0, 0};
    uint32_t slot = key_slot(k1);
    for (uint64_t id = k1 + 1, found = 1; found < 3; id++)
        if (key_slot(id) == slot)
            ids[found++] = id;
    CHECK_OK(kv_tr_set(r, ids[0], 1000));
    CHECK_OK(kv_tr_set(r, ids[1], 1000));
    int a = owner_of_id(ids[0]), b = (a + 1) % 3, c = (a + 2) % 3;
    CHECK(a >= 0);
    char ida[64], idb[64], key[3][128];
    node_id(a, ida);
    node_id(b, idb);
    for (int i = 0; i < 3; i++) {
        kv_remote_key_t kk = kv_tr_key(ids[i]);
        kv_remote_key_string("c", &kk, key[i], sizeof key[i]);
    }
    ok_reply(kv_tredis_cmd(&srv, b, "CLUSTER SETSLOT %u IMPORTING %s", slot, ida), "importing");
    ok_reply(kv_tredis_cmd(&srv, a, "CLUSTER SETSLOT %u MIGRATING %s", slot, idb), "migrating");
    ok_reply(kv_tredis_cmd(&srv, a, "MIGRATE 127.0.0.1 %d %b 0 5000 KEYS %s", srv.port[b],
                           "", (size_t)0, key[0]), "migrate k1");

    /* during the migration: k1 is on b (ASK), k2 still on a, k3 new (ASK) */
    kv_remote_stats_t st0, st;
    CHECK_OK(kv_remote_stats(r, &st0));
    CHECK_OK(kv_tr_get(r, ids[0], 1000, NULL));
    CHECK_OK(kv_tr_get(r, ids[1], 1000, NULL));
    CHECK_OK(kv_tr_set(r, ids[2], 1000));
    CHECK_OK(kv_remote_stats(r, &st));
    CHECK_EQ(st.asked - st0.asked, 2);
    CHECK_EQ(st.moved, st0.moved);
    /* k3 is on b (seen with ASKING first, as the slot is still a's) */
    redisContext *cb = kv_tredis_connect(&srv, b);
    redisReply *rep = cb ? redisCommand(cb, "ASKING") : NULL;
    if (rep)
        freeReplyObject(rep);
    rep = cb ? redisCommand(cb, "EXISTS %s", key[2]) : NULL;
    CHECK(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 1);
    if (rep)
        freeReplyObject(rep);
    if (cb)
        redisFree(cb);
    CHECK_OK(kv_tr_get(r, ids[2], 1000, NULL));

    /* finish: k2 moves, the slot is b's everywhere */
    ok_reply(kv_tredis_cmd(&srv, a, "MIGRATE 127.0.0.1 %d %b 0 5000 KEYS %s", srv.port[b],
                           "", (size_t)0, key[1]), "migrate k2");
    for (int n = 0; n < 3; n++) {
        int who[3] = {b, a, c};
        ok_reply(kv_tredis_cmd(&srv, who[n], "CLUSTER SETSLOT %u NODE %s", slot, idb),
                 "setslot node");
    }
    for (int i = 0; i < 100 && owner_of(key[0]) != b; i++)
        usleep(20 * 1000);
    CHECK_EQ(owner_of(key[0]), b);
    CHECK_OK(kv_remote_stats(r, &st0));
    CHECK_OK(kv_tr_get(r, ids[0], 1000, NULL)); /* the client's map says a: MOVED */
    CHECK_OK(kv_remote_stats(r, &st));
    CHECK_EQ(st.moved - st0.moved, 1);
    usleep(60 * 1000); /* past the client's map refresh spacing (backoff_ms) */
    CHECK_OK(kv_tr_get(r, ids[1], 1000, NULL)); /* after a new map: no redirect */
    CHECK_OK(kv_tr_get(r, ids[2], 1000, NULL));
    CHECK_OK(kv_remote_stats(r, &st0));
    CHECK_EQ(st0.moved, st.moved);
    CHECK_EQ(st0.slot_maps, st.slot_maps + 1);
    kv_remote_destroy(r);
}

static void test_node_down(void)
{
    kv_remote_t *r = kv_tr_client(srv.url, "c", 400);
    enum { N = 300 };
    static uint8_t bufs[N][100];
    static kv_remote_get_t g[N];
    int own[N], on_victim = 0, victim = 2;
    for (int i = 0; i < N; i++) {
        CHECK_OK(kv_tr_set(r, 200000 + (uint64_t)i, 100));
        own[i] = owner_of_id(200000 + (uint64_t)i);
        on_victim += own[i] == victim;
    }
    CHECK(on_victim > 30 && on_victim < N - 30);
    for (int phase = 0; phase < 3; phase++) { /* stopped, killed, restarted */
        if (phase == 0)
            CHECK_OK(kv_tredis_signal(&srv, victim, SIGSTOP));
        if (phase == 1) {
            CHECK_OK(kv_tredis_signal(&srv, victim, SIGKILL));
            CHECK_OK(kv_tredis_signal(&srv, victim, SIGCONT));
            usleep(100 * 1000);
        }
        if (phase == 2) {
            CHECK_OK(kv_tredis_restart(&srv, victim));
            usleep(300 * 1000); /* past the node's backoff */
        }
        for (int i = 0; i < N; i++)
            g[i] = (kv_remote_get_t){.key = kv_tr_key(200000 + (uint64_t)i), .dst = bufs[i],
                                     .cap = 100};
        double t0 = kv_tr_now();
        int hits = kv_remote_get(r, g, N);
        double dt = kv_tr_now() - t0;
        CHECK(dt < 0.4 + 0.5);
        int want = phase == 0 ? -ETIMEDOUT : phase == 1 ? KV_EIO : KV_ENOENT, good = 0;
        for (int i = 0; i < N; i++)
            good += own[i] == victim
                        ? g[i].status == want
                        : g[i].status == 0 && kv_tr_is(bufs[i], 100, 200000 + (uint64_t)i);
        CHECK_EQ(hits, N - on_victim);
        CHECK_EQ(good, N);
    }
    /* the restarted node stores and serves again */
    int back = 0;
    for (int i = 0; i < N; i++)
        if (own[i] == victim)
            back += kv_tr_set(r, 200000 + (uint64_t)i, 100) == 0 &&
                    kv_tr_get(r, 200000 + (uint64_t)i, 100, NULL) == 0;
    CHECK_EQ(back, on_victim);
    kv_remote_destroy(r);
}

int main(void)
{
    kv_tredis_start(&srv, "cluster");
    test_slots();
    test_many_slots();
    test_reshard();
    test_node_down();
    kv_tredis_stop(&srv);
    return kv_test_end();
}
