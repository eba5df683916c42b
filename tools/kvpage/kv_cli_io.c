/* SPDX-License-Identifier: MIT */
/*
 * kv_cli_io.c — the files the `kvpage` commands read and write, checked.
 *
 * Reading: only regular files (a directory, FIFO, device or socket is
 * named as such, and a FIFO never blocks the open), never more than the
 * caller's limit (checked against the size before reading, and again
 * while reading, so a growing file cannot get past it), with a message
 * that says which of those it was. Writing: output files are opened
 * before a command does its work (a bad --html or --json path fails at
 * once, not after the run), and every write is checked at the end
 * (ferror, fclose; stdout by main.c): output that was lost -- a full
 * disk, >/dev/full -- makes the command fail with a message instead of
 * exiting 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_cli.h"

/* "a directory", "a FIFO", ... for a file that is not regular. */
static const char *cli_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
           : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int kv_cli_read_file(const char *cmd, const char *what, const char *path, size_t max,
                     char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    const char *why = NULL;
    char detail[96] = "";
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        why = errno == ENOENT ? "no such file" : strerror(errno);
    } else if (fstat(fd, &st) != 0) {
        why = strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(detail, sizeof detail, "is %s, not a regular file", cli_kind(st.st_mode));
    } else if ((uint64_t)st.st_size > max) {
        snprintf(detail, sizeof detail, "is %llu bytes, more than the limit of %zu",
                 (unsigned long long)st.st_size, max);
    } else {
        size_t cap = (size_t)st.st_size + 1, n = 0; /* one more: growth shows */
        char *b = malloc(cap + 1);
        ssize_t r = 1;
        while (b && n < cap && (r = read(fd, b + n, cap - n)) != 0) {
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0)
                break;
            n += (size_t)r;
        }
        if (!b) {
            why = "out of memory";
        } else if (r < 0) {
            why = strerror(errno);
        } else if (n > max) {
            snprintf(detail, sizeof detail, "grew past the limit of %zu bytes while read", max);
        } else {
            b[n] = 0;
            *buf = b;
            *len = n;
            b = NULL;
        }
        free(b);
    }
    if (fd >= 0)
        close(fd);
    if (*buf)
        return 0;
    if (cmd)
        fprintf(stderr, "kvpage %s: %s '%s' %s%s\n", cmd, what, path, why ? "cannot be read: " : "",
                why ? why : detail);
    return -1;
}

FILE *kv_cli_out_open(const char *cmd, const char *opt, const char *path)
{
    if (!strcmp(path, "-"))
        return stdout;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kvpage %s: %s '%s' is a directory; give a file name\n", cmd, opt, path);
        return NULL;
    }
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "kvpage %s: %s '%s' cannot be written: %s\n", cmd, opt, path,
                strerror(errno));
    return f;
}

int kv_cli_out_close(const char *cmd, const char *path, FILE *f)
{
    if (!f)
        return 0;
    errno = 0;
    int bad = fflush(f) != 0 || ferror(f);
    int e = errno;
    if (f != stdout && fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad)
        fprintf(stderr, "kvpage %s: writing %s failed (%s): the output is incomplete\n", cmd,
                f == stdout ? "to standard output" : path,
                e ? strerror(e) : "an earlier write failed");
    return bad ? -1 : 0;
}

int kv_cli_stdout_close(const char *cmd)
{
    int rc = kv_cli_out_close(cmd, "-", stdout);
    errno = 0;
    if (fclose(stdout) != 0 && rc == 0) { /* the last chance to hear of it */
        fprintf(stderr, "kvpage %s: writing to standard output failed (%s): the output is "
                "incomplete\n", cmd, strerror(errno));
        rc = -1;
    }
    return rc;
}

int kv_cli_exe_path(const char *rel, char *buf, size_t len)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash)
        return -1;
    *slash = 0;
    int w = snprintf(buf, len, "%s/%s", exe, rel);
    return w < 0 || (size_t)w >= len ? -1 : 0;
}
