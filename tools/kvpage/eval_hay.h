/* SPDX-License-Identifier: MIT */
/*
 * eval_hay.h — the haystacks of `kvpage eval`'s retrieval items: where the
 * text around a needle comes from.
 *
 *   filler    the neutral sentence set of the passkey literature (Mohtashami
 *             & Jaggi 2023), "The grass is green. The sky is blue. ...",
 *             cycled: easy, every item reads the same
 *   licenses  Debian's license texts (/usr/share/common-licenses, base-files):
 *             legal English prose
 *   fortunes  Debian's fortune cookies (/usr/share/games/fortunes, package
 *             fortunes-min: quotations from literature, aphorisms, riddles):
 *             short passages of varied, literary English
 *
 * A haystack is its text cut into units, one sentence each (a unit ends after
 * . ! or ? and any closing quotes/brackets, before white space; a sentence
 * longer than EVAL_HAY_UNIT_MAX bytes is cut at the next space after it).
 * White space runs become one space; fortune separator lines ("%") and
 * control characters are dropped. An item takes consecutive units from a
 * start its seed picks (eval_task.h), so items of a real-text haystack read
 * different passages.
 *
 * Ownership: eval_hay_t owns its text, unit table and file list;
 * eval_hay_free releases them (a zeroed struct is safe to free).
 * Errors: 0 or a negative KV_E* code, with a one-line reason in err.
 */
#ifndef EVAL_HAY_H
#define EVAL_HAY_H

#include <stddef.h>
#include <stdint.h>

typedef enum eval_hay_kind {
    EVAL_HAY_FILLER = 0,
    EVAL_HAY_LICENSES = 1,
    EVAL_HAY_FORTUNES = 2,
    EVAL_HAY_COUNT = 3,
} eval_hay_kind_t;

#define EVAL_HAY_UNIT_MAX 320u        /* bytes before a long sentence is cut */
#define EVAL_HAY_FILE_MAX (8u << 20)  /* bytes: a larger source file is refused */

typedef struct eval_hay_file {
    char path[512];
    char sha256[65];   /* lowercase hex of the whole file */
    uint64_t bytes;
} eval_hay_file_t;

typedef struct eval_hay {
    eval_hay_kind_t kind;
    char *text;              /* the units, each NUL-terminated (owned)      */
    const char **units;      /* [n_units] into text                         */
    uint32_t n_units;
    eval_hay_file_t *files;  /* [n_files] the sources read (none: filler)   */
    uint32_t n_files;
} eval_hay_t;

/* "filler", "licenses", "fortunes"; NULL outside the enum. */
const char *eval_hay_name(eval_hay_kind_t kind);
/* The kind named by name[0..len), or KV_EINVAL. */
int eval_hay_parse(const char *name, size_t len, eval_hay_kind_t *out);

/* Load a haystack from its Debian files (the filler needs none); a missing
 * file is left out. Errors: KV_ENOENT (every file missing: the message
 * names the package), KV_EIO (a file that is not a regular file, is over
 * EVAL_HAY_FILE_MAX or cannot be read: kv_cli_read_file printed why),
 * KV_ERANGE (no text in them), KV_ENOMEM. */
int eval_hay_load(eval_hay_kind_t kind, eval_hay_t *out, char *err, size_t err_len);

/* A haystack from texts[0..n) in memory (tests; no files recorded). */
int eval_hay_from_texts(eval_hay_kind_t kind, const char *const *texts, uint32_t n,
                        eval_hay_t *out);

void eval_hay_free(eval_hay_t *h);

#endif /* EVAL_HAY_H */
