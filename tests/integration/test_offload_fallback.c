/* SPDX-License-Identifier: MIT */
/*
 * test_offload_fallback.c — the page file where things are missing.
 *
 * Checks: (1) io_uring refused by the kernel (io_uring_setup returns
 * -ENOSYS, then -EPERM: a seccomp filter in a child process makes it so):
 * IOQ_AUTO runs on the pread I/O queue and round-trips pages, IOQ_URING
 * reports KV_ENOTSUP and leaves no file behind; (2) O_DIRECT refused by the
 * filesystem (openat with O_DIRECT returns -EINVAL, same technique): the
 * file is created and reopened buffered (stats.direct == 0) and works;
 * (3) a tmpfs file (/dev/shm, when present) works whatever tmpfs says about
 * O_DIRECT and its alignment; (4) every metadata allocation of create,
 * open, write, read and list failing in turn (kv_fault_arm): KV_ENOMEM, no
 * file left by a failed create, no change to an open file, no leak.
 */
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "alloc/kv_mem.h"
#include "test_offload_util.h"

enum { PB = 2048 };
static uint8_t g_in[8][PB], g_out[PB], g_scratch[PB];

/* Write 8 pages, read them back, close, reopen, read again. Returns the
 * I/O queue name and direct flag seen. */
static void roundtrip(const char *path, const kv_offload_config_t *c, const char **ioq,
                      uint32_t *direct, uint32_t *direct2)
{
    kv_offload_file_t *f;
    CHECK_OK(kv_offload_create(path, c, &f));
    if (!f)
        return;
    kv_offload_wpage_t w[8];
    kv_offload_slot_t s[8];
    for (int i = 0; i < 8; i++) {
        kvt_fill(g_in[i], PB, (uint64_t)i, 2);
        w[i] = (kv_offload_wpage_t){.key = (uint64_t)i, .generation = 2, .data = g_in[i],
                                    .bytes = PB};
    }
    CHECK_OK(kv_offload_write(f, w, 8, s, NULL));
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    *ioq = st.ioq;
    *direct = st.direct;
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_open(path, c, &f));
    kv_offload_entry_t e[8];
    uint64_t n = 0;
    CHECK_OK(kv_offload_list(f, e, 8, &n));
    CHECK_EQ(n, 8);
    long bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        kv_offload_rpage_t q = {.slot = e[i].slot, .key = e[i].key,
                                .generation = e[i].generation, .data = g_out};
        bad += kv_offload_read(f, &q, 1, NULL) != 0 ||
               !kvt_same(g_out, PB, e[i].key, 2, g_scratch);
    }
    CHECK_EQ(bad, 0);
    kv_offload_stats(f, &st);
    *direct2 = st.direct;
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_unlink(path));
}

static kv_offload_config_t cfg(uint32_t ioq)
{
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = PB;
    c.capacity = 16;
    c.ioq = ioq;
    return c;
}

/* Install a seccomp filter: syscall nr fails with err; for openat only when
 * its flags (arg 2) include O_DIRECT. x86-64 and aarch64 syscall numbers
 * come from <sys/syscall.h>; the arch is not checked (one ABI per test). */
static int deny(long nr, int err, int only_odirect)
{
    struct sock_filter any[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((uint32_t)err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_filter odirect[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECT, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((uint32_t)err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {
        .len = (unsigned short)(only_odirect ? sizeof odirect / sizeof odirect[0]
                                             : sizeof any / sizeof any[0]),
        .filter = only_odirect ? odirect : any};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0 ? 0 : -1;
}

/* Run body in a child under a filter; the child's checks decide its status. */
static void in_child(const kvt_dir_t *dir, long nr, int err, int only_odirect, int which)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (deny(nr, err, only_odirect) != 0) {
            fprintf(stderr, "seccomp unavailable: case %d not run\n", which);
            _exit(0);
        }
        char path[4096];
        kvt_path(dir, "fb.kvp", path);
        const char *ioq = "";
        uint32_t d1 = 9, d2 = 9;
        if (which == 0) { /* io_uring refused */
            kv_offload_config_t c = cfg(KV_OFFLOAD_IOQ_URING);
            kv_offload_file_t *f = NULL;
            CHECK_EQ(kv_offload_create(path, &c, &f), KV_ENOTSUP);
            CHECK(f == NULL);
            CHECK(access(path, F_OK) != 0);
            c = cfg(KV_OFFLOAD_IOQ_AUTO);
            roundtrip(path, &c, &ioq, &d1, &d2);
            CHECK(!strcmp(ioq, "pread"));
        } else { /* O_DIRECT refused */
            kv_offload_config_t c = cfg(KV_OFFLOAD_IOQ_AUTO);
            roundtrip(path, &c, &ioq, &d1, &d2);
            CHECK_EQ(d1, 0);
            CHECK_EQ(d2, 0);
        }
        fflush(NULL);
        _exit(kv_test_end());
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* (4) each allocation failing in turn */
static void oom(const kvt_dir_t *dir)
{
    char path[4096];
    kvt_path(dir, "oom.kvp", path);
    kv_offload_config_t c = cfg(KV_OFFLOAD_IOQ_AUTO);
    uint64_t live0 = kv_mem_live_bytes();
    kv_offload_file_t *f = NULL;
    int fails = 0;
    for (uint64_t n = 1; n < 10000; n++) {
        kv_fault_arm(n);
        int r = kv_offload_create(path, &c, &f);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (r == 0 && !fired)
            break;
        if (r == 0) { /* an allocation whose failure is absorbed */
            kv_offload_close(f);
            kv_offload_unlink(path);
            continue;
        }
        fails++;
        CHECK_EQ(r, KV_ENOMEM);
        CHECK(access(path, F_OK) != 0);
        CHECK_EQ(kv_mem_live_bytes(), live0);
    }
    CHECK(fails > 3);
    /* f is open now: write / read / list / open under failures */
    kv_offload_wpage_t w[4];
    kv_offload_slot_t s[4];
    for (int i = 0; i < 4; i++) {
        kvt_fill(g_in[i], PB, 50 + (uint64_t)i, 1);
        w[i] = (kv_offload_wpage_t){.key = 50 + (uint64_t)i, .generation = 1,
                                    .data = g_in[i], .bytes = PB};
    }
    kv_fault_arm(1);
    CHECK_EQ(kv_offload_write(f, w, 4, s, NULL), KV_ENOMEM);
    kv_fault_arm(0);
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    CHECK_EQ(st.slots_used, 0);
    CHECK_OK(kv_offload_write(f, w, 4, s, NULL));
    kv_offload_rpage_t q = {.slot = s[0], .key = 50, .generation = 1, .data = g_out};
    kv_fault_arm(1);
    CHECK_EQ(kv_offload_read(f, &q, 1, NULL), KV_ENOMEM);
    kv_fault_arm(0);
    kv_offload_entry_t e[4];
    uint64_t n = 0;
    kv_fault_arm(1);
    CHECK_EQ(kv_offload_list(f, e, 4, &n), KV_ENOMEM);
    kv_fault_arm(0);
    CHECK(kvt_idle(f));
    CHECK_OK(kv_offload_read(f, &q, 1, NULL));
    CHECK(kvt_same(g_out, PB, 50, 1, g_scratch));
    CHECK_OK(kv_offload_close(f));
    uint64_t live1 = kv_mem_live_bytes();
    fails = 0;
    for (uint64_t k = 1; k < 10000; k++) {
        kv_fault_arm(k);
        int r = kv_offload_open(path, &c, &f);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (r == 0) {
            CHECK_OK(kv_offload_list(f, e, 4, &n));
            CHECK_EQ(n, 4);
            kv_offload_close(f);
            if (!fired)
                break;
            continue;
        }
        fails++;
        CHECK_EQ(r, KV_ENOMEM);
        CHECK_EQ(kv_mem_live_bytes(), live1);
    }
    CHECK(fails > 3);
    CHECK_OK(kv_offload_unlink(path));
    CHECK_EQ(kv_mem_live_bytes(), live0);
}

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    kvt_dir_t dir;
    kvt_dir_make(&dir);
    in_child(&dir, __NR_io_uring_setup, ENOSYS, 0, 0);
    in_child(&dir, __NR_io_uring_setup, EPERM, 0, 0);
    in_child(&dir, __NR_openat, EINVAL, 1, 1);

    /* (3) tmpfs */
    if (access("/dev/shm", W_OK) == 0) {
        kvt_dir_t shm;
        snprintf(shm.path, sizeof shm.path, "/dev/shm/offload-test-XXXXXX");
        if (mkdtemp(shm.path)) {
            char path[4096];
            kvt_path(&shm, "t.kvp", path);
            kv_offload_config_t c = cfg(KV_OFFLOAD_IOQ_AUTO);
            const char *ioq = "";
            uint32_t d1 = 9, d2 = 9;
            roundtrip(path, &c, &ioq, &d1, &d2);
            CHECK(d1 <= 1 && d1 == d2);
            kvt_dir_remove(&shm);
        }
    }
    oom(&dir);
    kvt_dir_remove(&dir);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
