/* SPDX-License-Identifier: MIT */
/*
 * test_offload_owner.c — one owner per page file, and creation a crash
 * cannot wedge (offload/kv_offload.h, "One owner", kv_offload_create).
 *
 * For every I/O queue: a second kv_offload_open of a file this process holds
 * is KV_EBUSY, and so is one from a forked child (a separate process), both
 * while the first file object lives; once it is closed the file opens
 * again. The superblock names the holder's owner id, a new one per open,
 * and every slot and index entry carries the id of its writer.
 * Where locks do not work (simulated with KV_OFFLOAD_NO_LOCK), two opens of
 * one file allocate the same slot for the same key, generation and serial;
 * the owner id makes the other's page fail the check (KV_ECORRUPT, never
 * its bytes), and the displaced owner's sync is KV_EBUSY (its index is not
 * written over the new owner's).
 * Creation: a "<path>.new" left by a crash (garbage, any size) is replaced;
 * one whose lock is held (a create at work) is KV_EBUSY; a directory as the
 * path is -EISDIR for create and open; a FIFO opens neither (KV_EINVAL, and
 * the open does not block); an existing file is -EEXIST and left alone.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "offload/kv_offload_disk.h"
#include "test_offload_util.h"

enum { PB = 4096, CAP = 64 };

static uint8_t g_in[PB], g_out[PB], g_scratch[PB];

static kv_offload_config_t cfg(uint32_t ioq, uint32_t flags)
{
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = PB;
    c.capacity = CAP;
    c.ioq = ioq;
    c.queue_depth = 8;
    c.flags = flags;
    return c;
}

/* The superblock on disk. */
static kv_offload_sb_t sb_of(const char *path)
{
    kv_offload_sb_t sb = {0};
    uint8_t b[KV_REC_PF_SB_BYTES];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    CHECK(fd >= 0 && pread(fd, b, sizeof b, 0) == (ssize_t)sizeof b);
    CHECK_OK(kv_offload_sb_decode(b, &sb));
    if (fd >= 0)
        close(fd);
    return sb;
}

static kv_offload_slot_t put(kv_offload_file_t *f, uint64_t key, uint64_t gen, uint64_t fill)
{
    kvt_fill(g_in, PB, key, fill);
    kv_offload_wpage_t w = {.key = key, .generation = gen, .data = g_in, .bytes = PB};
    kv_offload_slot_t s = 0;
    CHECK_OK(kv_offload_write(f, &w, 1, &s, NULL));
    return s;
}

/* Status of reading (slot, key, gen) into g_out. */
static int get(kv_offload_file_t *f, kv_offload_slot_t s, uint64_t key, uint64_t gen)
{
    kv_offload_rpage_t q = {.slot = s, .key = key, .generation = gen, .data = g_out};
    int st = 1;
    int r = kv_offload_read(f, &q, 1, &st);
    return r ? r : st;
}

/* In a child process: kv_offload_open of path must return `want`. */
static void open_in_child(const char *path, uint32_t ioq, int want)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        kv_offload_config_t c = cfg(ioq, 0);
        kv_offload_file_t *f = NULL;
        int r = kv_offload_open(path, &c, &f);
        if (r == 0)
            kv_offload_crash(f);
        _exit(r == want ? 0 : 1);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_one_owner(const kvt_dir_t *d, uint32_t ioq)
{
    char path[4096];
    kvt_path(d, "owned.kvp", path);
    kv_offload_config_t c = cfg(ioq, 0);
    kv_offload_file_t *a = NULL, *b = NULL;
    CHECK_OK(kv_offload_create(path, &c, &a));
    kv_offload_stats_t st;
    kv_offload_stats(a, &st);
    kv_offload_sb_t sb = sb_of(path);
    CHECK(st.owner != 0);
    CHECK(sb.owner == st.owner);
    uint64_t owner0 = st.owner;
    kv_offload_slot_t s = put(a, 7, 1, 7);

    /* a second owner: in this process (any I/O queue), in another process */
    for (uint32_t e = KV_OFFLOAD_IOQ_AUTO; e <= KV_OFFLOAD_IOQ_PREAD; e++) {
        kv_offload_config_t c2 = cfg(e, 0);
        CHECK_EQ(kv_offload_open(path, &c2, &b), KV_EBUSY);
        CHECK_EQ(kv_offload_create(path, &c2, &b), -EEXIST);
    }
    open_in_child(path, ioq, KV_EBUSY);
    CHECK(b == NULL);
    /* the owner is unharmed */
    CHECK_EQ(get(a, s, 7, 1), 0);
    CHECK(kvt_same(g_out, PB, 7, 7, g_scratch));
    CHECK_OK(kv_offload_sync(a));
    CHECK_OK(kv_offload_close(a));

    /* free again: it opens, in a child and here; a new owner id each time */
    open_in_child(path, ioq, 0);
    CHECK_OK(kv_offload_open(path, &c, &a));
    kv_offload_stats(a, &st);
    CHECK(st.owner != owner0 && st.owner != 0);
    CHECK(sb_of(path).owner == st.owner);
    kv_offload_entry_t ent;
    uint64_t n = 0;
    CHECK_OK(kv_offload_list(a, &ent, 1, &n));
    CHECK_EQ(n, 1);
    CHECK_EQ(get(a, ent.slot, 7, 1), 0); /* written by the first owner: still good */
    CHECK(kvt_same(g_out, PB, 7, 7, g_scratch));
    kv_offload_close(a);
    CHECK_OK(kv_offload_unlink(path));
}

/* Two owners where locks do not work (NO_LOCK on the second open). */
static void test_no_lock(const kvt_dir_t *d, uint32_t ioq)
{
    char path[4096];
    kvt_path(d, "nolock.kvp", path);
    kv_offload_config_t c = cfg(ioq, 0), cn = cfg(ioq, KV_OFFLOAD_NO_LOCK);
    kv_offload_file_t *a = NULL, *b = NULL;
    CHECK_OK(kv_offload_create(path, &c, &a));
    CHECK_OK(kv_offload_close(a));
    CHECK_OK(kv_offload_open(path, &c, &a));
    CHECK_OK(kv_offload_open(path, &cn, &b)); /* the lock is not asked */
    /* same index, same free slots, same serials: the same slot for the same
     * key and generation */
    kv_offload_slot_t sa = put(a, 9, 1, 100);
    kv_offload_slot_t sb = put(b, 9, 1, 200);
    CHECK_EQ(kv_alloc_page_index(sa), kv_alloc_page_index(sb));
    CHECK_EQ(get(a, sa, 9, 1), KV_ECORRUPT); /* b's page: refused, never returned */
    CHECK(!kvt_same(g_out, PB, 9, 200, g_scratch));
    CHECK_EQ(get(b, sb, 9, 1), 0);
    CHECK(kvt_same(g_out, PB, 9, 200, g_scratch));
    /* the superblock names b: a's sync must not replace b's index */
    CHECK_EQ(kv_offload_sync(a), KV_EBUSY);
    CHECK_OK(kv_offload_sync(b));
    kv_offload_crash(a);
    CHECK_OK(kv_offload_close(b));
    /* what b synced is what the file holds */
    CHECK_OK(kv_offload_open(path, &c, &a));
    kv_offload_entry_t ent;
    uint64_t n = 0;
    CHECK_OK(kv_offload_list(a, &ent, 1, &n));
    CHECK_EQ(n, 1);
    CHECK_EQ(get(a, ent.slot, 9, 1), 0);
    CHECK(kvt_same(g_out, PB, 9, 200, g_scratch));
    kv_offload_close(a);
    CHECK_OK(kv_offload_unlink(path));
}

static void write_file(const char *path, size_t bytes)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
    for (size_t i = 0; fd >= 0 && i < bytes; i += PB) {
        kvt_fill(g_in, PB, i, 3);
        CHECK(write(fd, g_in, PB) == PB);
    }
    if (fd >= 0)
        close(fd);
}

static void test_create(const kvt_dir_t *d, uint32_t ioq)
{
    char path[4096], tmp[4200], idx[4200];
    kvt_path(d, "made.kvp", path);
    snprintf(tmp, sizeof tmp, "%s%s", path, KV_OFFLOAD_NEW_SUFFIX);
    snprintf(idx, sizeof idx, "%s.idx", path);
    kv_offload_config_t c = cfg(ioq, 0);
    kv_offload_file_t *f = NULL;

    /* a crash inside create left a half-made file and an index: replaced */
    write_file(tmp, 1u << 20);
    write_file(idx, 200);
    CHECK_OK(kv_offload_create(path, &c, &f));
    CHECK(access(tmp, F_OK) != 0);
    kv_offload_slot_t s = put(f, 3, 1, 3);
    CHECK_EQ(get(f, s, 3, 1), 0);
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_open(path, &c, &f));
    kv_offload_close(f);
    /* an existing file: -EEXIST, left as it was */
    struct stat st0, st1;
    CHECK(stat(path, &st0) == 0);
    CHECK_EQ(kv_offload_create(path, &c, &f), -EEXIST);
    CHECK(stat(path, &st1) == 0 && st1.st_ino == st0.st_ino && st1.st_size == st0.st_size);
    CHECK(access(idx, F_OK) == 0);
    CHECK_OK(kv_offload_open(path, &c, &f));
    kv_offload_close(f);
    CHECK_OK(kv_offload_unlink(path));

    /* a create at work (its lock on "<path>.new" held): KV_EBUSY */
    int fd = open(tmp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    CHECK(fd >= 0 && fcntl(fd, F_OFD_SETLK, &fl) == 0);
    CHECK_EQ(kv_offload_create(path, &c, &f), KV_EBUSY);
    CHECK(access(path, F_OK) != 0);
    close(fd);
    CHECK_OK(kv_offload_create(path, &c, &f));
    kv_offload_close(f);
    CHECK_OK(kv_offload_unlink(path));
    CHECK(access(tmp, F_OK) != 0 && access(idx, F_OK) != 0);

    /* a directory, a FIFO */
    kvt_path(d, "adir", path);
    CHECK(mkdir(path, 0755) == 0);
    CHECK_EQ(kv_offload_create(path, &c, &f), -EISDIR);
    CHECK_EQ(kv_offload_open(path, &c, &f), -EISDIR);
    CHECK(rmdir(path) == 0);
    kvt_path(d, "afifo", path);
    CHECK(mkfifo(path, 0644) == 0);
    CHECK_EQ(kv_offload_open(path, &c, &f), KV_EINVAL);
    CHECK_EQ(kv_offload_create(path, &c, &f), -EEXIST);
    unlink(path);
}

int main(void)
{
    kvt_dir_t d;
    kvt_dir_make(&d);
    uint32_t eng[2];
    int ne = kvt_ioqs(&d, eng);
    for (int i = 0; i < ne; i++) {
        fprintf(stderr, "ioq %s\n", kvt_ioq_name(eng[i]));
        test_one_owner(&d, eng[i]);
        test_no_lock(&d, eng[i]);
        test_create(&d, eng[i]);
    }
    kvt_dir_remove(&d);
    return kv_test_end();
}
