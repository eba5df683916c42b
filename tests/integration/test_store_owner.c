/* SPDX-License-Identifier: MIT */
/*
 * test_store_owner.c — two stores on one page file, through the public API
 * (issue: they returned each other's data silently). For the io_uring
 * I/O queue (where it runs) and KV_OFFLOAD_PREAD:
 *   - within one process: while store A holds the file, a second
 *     kv_store_create with KV_OFFLOAD_OPEN is KV_EBUSY and one without it
 *     -EEXIST, and A's sequence still reads back bit-exact; once A is
 *     destroyed the second store opens and restores it bit-exact;
 *   - across processes: a child's KV_OFFLOAD_OPEN while this process holds
 *     the file is KV_EBUSY; a child holding the file makes ours KV_EBUSY;
 *     killed with SIGKILL, it leaves the file free and restorable;
 *   - a directory as the path: -EISDIR with and without KV_OFFLOAD_OPEN;
 *   - kv_strerror(KV_EBUSY) says what is going on.
 */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "test_store_offload_util.h"

static kv_store_t *store(const char *path, uint32_t flags, int *rc)
{
    kv_config_t c = kvs_config(path, flags, 256, 512);
    kv_store_t *st = NULL;
    *rc = kv_store_create(&c, &st);
    return *rc ? NULL : st;
}

/* Child: open the store with `flags`; _exit(0) iff the result is `want`. */
static pid_t child_open(const char *path, uint32_t flags, int want)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int rc;
        kv_store_t *st = store(path, flags, &rc);
        kv_store_destroy(st);
        _exit(rc == want ? 0 : 1);
    }
    return pid;
}

static int child_ok(pid_t pid)
{
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
}

/* The sequence back from the file equals ref. */
static void check_seq(kv_store_t *st, kv_seq_id_t seq, const kv_test_seq_t *ref)
{
    CHECK_OK(kv_seq_prefetch(st, seq));
    CHECK_OK(kv_seq_wait(st, seq));
    kv_test_seq_t now;
    CHECK_OK(kv_test_seq_take(st, seq, &now));
    CHECK(kv_test_seq_same(&now, ref));
    kv_test_seq_free(&now);
}

static void test_ioq(const kvt_dir_t *d, uint32_t ioq_flag)
{
    char path[4096];
    kvt_path(d, "owned.kvp", path);
    int rc;
    kv_store_t *a = store(path, ioq_flag, &rc);
    CHECK_OK(rc);
    if (!a)
        return;
    kv_seq_id_t seq;
    CHECK_OK(kv_seq_create(a, &seq));
    CHECK_OK(kvs_fill(a, seq, 70, 5, KVS_INT4));
    kv_test_seq_t ref;
    CHECK_OK(kv_test_seq_take(a, seq, &ref));
    CHECK_OK(kv_seq_offload(a, seq));
    CHECK_OK(kv_seq_wait(a, seq));
    CHECK_OK(kv_store_offload_sync(a));

    /* second store, this process, both I/O queues */
    const uint32_t eng[2] = {0, KV_OFFLOAD_PREAD};
    for (int i = 0; i < 2; i++) {
        CHECK(store(path, KV_OFFLOAD_OPEN | eng[i], &rc) == NULL);
        CHECK_EQ(rc, KV_EBUSY);
        CHECK(store(path, eng[i], &rc) == NULL);
        CHECK_EQ(rc, -EEXIST);
    }
    /* another process */
    CHECK(child_ok(child_open(path, KV_OFFLOAD_OPEN | ioq_flag, KV_EBUSY)));
    /* the owner saw nothing of it */
    check_seq(a, seq, &ref);
    CHECK_OK(kv_seq_offload(a, seq));
    CHECK_OK(kv_seq_wait(a, seq));
    CHECK_OK(kv_store_offload_sync(a));
    CHECK_OK(kv_store_check(a));
    kv_store_destroy(a);

    /* free now: the next store restores it */
    kv_store_t *b = store(path, KV_OFFLOAD_OPEN | ioq_flag, &rc);
    CHECK_OK(rc);
    if (b) {
        uint32_t n = 0;
        kv_seq_id_t ids[4];
        CHECK_OK(kv_store_seqs(b, ids, 4, &n));
        CHECK(n == 1 && ids[0] == seq);
        kv_stats_t s = kvs_stats(b);
        CHECK_EQ(s.seqs_dropped, 0);
        kv_store_destroy(b); /* still wholly on the file: stays recorded */
    }

    /* a child holds it: ours is refused; the child dies: ours opens */
    int p[2];
    CHECK(pipe(p) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        kv_store_t *c = store(path, KV_OFFLOAD_OPEN | ioq_flag, &rc);
        char ok = rc == 0 ? 'y' : 'n';
        if (write(p[1], &ok, 1) != 1 || !c)
            _exit(1);
        for (;;)
            pause(); /* until SIGKILL */
    }
    close(p[1]);
    char ok = 0;
    CHECK(read(p[0], &ok, 1) == 1 && ok == 'y');
    close(p[0]);
    CHECK(store(path, KV_OFFLOAD_OPEN | ioq_flag, &rc) == NULL);
    CHECK_EQ(rc, KV_EBUSY);
    kill(pid, SIGKILL);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status));
    b = store(path, KV_OFFLOAD_OPEN | ioq_flag, &rc);
    CHECK_OK(rc);
    if (b) {
        check_seq(b, seq, &ref);
        CHECK_OK(kv_seq_free(b, seq));
        kv_store_destroy(b);
    }
    kv_test_seq_free(&ref);
    kv_offload_unlink(path);
}

int main(void)
{
    kvt_dir_t d;
    kvt_dir_make(&d);
    uint32_t eng[2];
    int ne = kvt_ioqs(&d, eng);
    for (int i = 0; i < ne; i++) {
        fprintf(stderr, "ioq %s\n", kvt_ioq_name(eng[i]));
        test_ioq(&d, eng[i] == KV_OFFLOAD_IOQ_PREAD ? KV_OFFLOAD_PREAD : 0);
    }
    char path[4096];
    kvt_path(&d, "adir", path);
    CHECK(mkdir(path, 0755) == 0);
    int rc;
    CHECK(store(path, 0, &rc) == NULL);
    CHECK_EQ(rc, -EISDIR);
    CHECK(store(path, KV_OFFLOAD_OPEN, &rc) == NULL);
    CHECK_EQ(rc, -EISDIR);
    rmdir(path);
    CHECK(strstr(kv_strerror(KV_EBUSY), "owned by another store") != NULL);
    kvt_dir_remove(&d);
    return kv_test_end();
}
