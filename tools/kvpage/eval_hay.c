/* SPDX-License-Identifier: MIT */
/*
 * eval_hay.c — haystack sources of `kvpage eval` (eval_hay.h): the files of
 * each kind, read with kv_cli_read_file (bounded, regular files only) and
 * hashed, and the cut into sentence units.
 *
 * The file lists are fixed (sorted, one text per license: older versions
 * and symlinked aliases of the same license left out), so a haystack is the
 * same on every Debian machine with the same package versions; the report
 * records each file's SHA-256.
 */
#include "eval_hay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_cli.h"
#include "kv_sha256.h"
#include "kvpage/kvpage.h"

static const char *const hay_names[EVAL_HAY_COUNT] = {"filler", "licenses", "fortunes"};

static const char FILLER[] = "The grass is green. The sky is blue. The sun is yellow. "
                             "Here we go. There and back again.";

#define LICENSE_DIR "/usr/share/common-licenses/"
static const char *const license_files[] = {
    "Apache-2.0", "Artistic", "BSD",     "CC0-1.0", "GFDL-1.3", "GPL-2",
    "GPL-3",      "LGPL-2.1", "LGPL-3", "MPL-1.1", "MPL-2.0",
};
#define FORTUNE_DIR "/usr/share/games/fortunes/"
static const char *const fortune_files[] = {"fortunes", "literature", "riddles"};

const char *eval_hay_name(eval_hay_kind_t kind)
{
    return (unsigned)kind < EVAL_HAY_COUNT ? hay_names[kind] : NULL;
}

int eval_hay_parse(const char *name, size_t len, eval_hay_kind_t *out)
{
    if (!name || !out)
        return KV_EINVAL;
    for (unsigned k = 0; k < EVAL_HAY_COUNT; k++)
        if (strlen(hay_names[k]) == len && !memcmp(name, hay_names[k], len)) {
            *out = (eval_hay_kind_t)k;
            return 0;
        }
    return KV_EINVAL;
}

/* ---- cutting text into units ----------------------------------------------- */

typedef struct cut {
    char *buf;           /* units, NUL-terminated one after another */
    size_t len, cap;
    size_t unit_len;     /* bytes of the open unit                  */
    int space, end;      /* a space is pending; the unit may end    */
    uint32_t n_units;
} cut_t;

static int cut_put(cut_t *c, char ch)
{
    if (c->len + 2 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 65536;
        char *p = realloc(c->buf, cap);
        if (!p)
            return KV_ENOMEM;
        c->buf = p;
        c->cap = cap;
    }
    c->buf[c->len++] = ch;
    return 0;
}

static int cut_close(cut_t *c)
{
    if (!c->unit_len)
        return 0;
    c->unit_len = 0;
    c->space = c->end = 0;
    c->n_units++;
    return cut_put(c, 0);
}

static int is_space(unsigned char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

/* One line's bytes (no newline). */
static int cut_line(cut_t *c, const char *s, size_t n)
{
    size_t a = 0, b = n;
    while (a < b && is_space((unsigned char)s[a]))
        a++;
    while (b > a && is_space((unsigned char)s[b - 1]))
        b--;
    if (b - a == 1 && s[a] == '%')
        return 0; /* a fortune separator */
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (is_space(ch)) {
            if (c->end || c->unit_len >= EVAL_HAY_UNIT_MAX)
                rc = cut_close(c);
            else
                c->space = c->unit_len > 0;
            continue;
        }
        if (ch < 0x20 || ch == 0x7f)
            continue;
        if (c->space && (rc = cut_put(c, ' ')))
            break;
        c->unit_len += c->space;
        c->space = 0;
        rc = cut_put(c, (char)ch);
        c->unit_len++;
        if (ch == '.' || ch == '!' || ch == '?')
            c->end = 1;
        else if (!(c->end && (ch == '"' || ch == '\'' || ch == ')' || ch == ']')))
            c->end = 0;
    }
    /* a line end is white space */
    if (!rc && (c->end || c->unit_len >= EVAL_HAY_UNIT_MAX))
        rc = cut_close(c);
    else
        c->space = c->unit_len > 0;
    return rc;
}

static int cut_text(cut_t *c, const char *s, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - s) : n;
        rc = cut_line(c, s + i, e - i);
        i = e + 1;
    }
    return rc ? rc : cut_close(c);
}

/* Make the unit table of the cut text into h (takes c's buffer). */
static int cut_finish(cut_t *c, eval_hay_t *h)
{
    if (!c->n_units) {
        free(c->buf);
        return KV_ERANGE;
    }
    h->units = malloc(c->n_units * sizeof *h->units);
    if (!h->units) {
        free(c->buf);
        return KV_ENOMEM;
    }
    h->text = c->buf;
    for (size_t i = 0, u = 0; u < c->n_units; u++) {
        h->units[u] = c->buf + i;
        i += strlen(c->buf + i) + 1;
    }
    h->n_units = c->n_units;
    return 0;
}

/* ---- sources ------------------------------------------------------------------ */

/* Read a source file (kv_cli_read_file: regular files only, bounded, a
 * message on failure) and describe it in f. KV_ENOENT: it is not there. */
static int read_source(const char *path, char **buf, size_t *len, eval_hay_file_t *f)
{
    if (access(path, F_OK) && errno == ENOENT)
        return KV_ENOENT;
    if (kv_cli_read_file("eval", "haystack file", path, EVAL_HAY_FILE_MAX, buf, len))
        return KV_EIO;
    snprintf(f->path, sizeof f->path, "%s", path);
    kv_sha256_t h;
    uint8_t d[32];
    kv_sha256_init(&h);
    kv_sha256_update(&h, *buf, *len);
    kv_sha256_final(&h, d);
    kv_sha256_hex(d, f->sha256);
    f->bytes = *len;
    return 0;
}

int eval_hay_from_texts(eval_hay_kind_t kind, const char *const *texts, uint32_t n,
                        eval_hay_t *out)
{
    if (!out || (unsigned)kind >= EVAL_HAY_COUNT || (!texts && n))
        return KV_EINVAL;
    *out = (eval_hay_t){.kind = kind};
    cut_t c = {.buf = NULL};
    int rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = cut_text(&c, texts[i], strlen(texts[i]));
    if (rc) {
        free(c.buf);
        return rc;
    }
    return cut_finish(&c, out);
}

int eval_hay_load(eval_hay_kind_t kind, eval_hay_t *out, char *err, size_t err_len)
{
    if (!out || (unsigned)kind >= EVAL_HAY_COUNT)
        return KV_EINVAL;
    if (kind == EVAL_HAY_FILLER) {
        const char *t = FILLER;
        return eval_hay_from_texts(kind, &t, 1, out);
    }
    const char *dir = kind == EVAL_HAY_LICENSES ? LICENSE_DIR : FORTUNE_DIR;
    const char *pkg = kind == EVAL_HAY_LICENSES ? "base-files" : "fortunes-min";
    const char *const *names = kind == EVAL_HAY_LICENSES ? license_files : fortune_files;
    uint32_t n = kind == EVAL_HAY_LICENSES
                     ? (uint32_t)(sizeof license_files / sizeof *license_files)
                     : (uint32_t)(sizeof fortune_files / sizeof *fortune_files);
    *out = (eval_hay_t){.kind = kind};
    cut_t c = {.buf = NULL};
    out->files = calloc(n, sizeof *out->files);
    int rc = out->files ? 0 : KV_ENOMEM;
    for (uint32_t i = 0; i < n && !rc; i++) {
        char path[512], *buf = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, "%s%s", dir, names[i]);
        rc = read_source(path, &buf, &len, &out->files[out->n_files]);
        if (rc == KV_ENOENT) { /* a missing file is left out; none at all fails */
            rc = 0;
            continue;
        }
        if (rc) {
            snprintf(err, err_len, "haystack %s: cannot use %s", hay_names[kind], path);
            break;
        }
        out->n_files++;
        rc = cut_text(&c, buf, len);
        free(buf);
    }
    if (!rc && !out->n_files) {
        snprintf(err, err_len, "haystack %s: no file of it under %s (install the Debian "
                 "package %s; scripts/setup.sh does)", hay_names[kind], dir, pkg);
        rc = KV_ENOENT;
    }
    if (rc)
        free(c.buf);
    else if ((rc = cut_finish(&c, out)) == KV_ERANGE) /* cut_finish frees c on error */
        snprintf(err, err_len, "haystack %s: its files hold no text", hay_names[kind]);
    if (rc) {
        free(out->files);
        *out = (eval_hay_t){.kind = kind};
    }
    return rc;
}

void eval_hay_free(eval_hay_t *h)
{
    if (!h)
        return;
    free(h->text);
    free(h->units);
    free(h->files);
    *h = (eval_hay_t){.kind = h->kind};
}
