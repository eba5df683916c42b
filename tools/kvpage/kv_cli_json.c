/* SPDX-License-Identifier: MIT */
/*
 * kv_cli_json.c — the one JSON string writer of the `kvpage` tool's reports
 * (run, eval, plan, stress): every string a report prints goes through it,
 * so no report can emit invalid JSON whatever bytes a prompt, a path or a
 * policy spec holds.
 *
 * Escapes quotes, backslashes and control bytes; passes valid UTF-8 through
 * (no overlongs, no surrogates); writes each invalid byte as U+FFFD.
 */
#include <string.h>

#include "kv_cli.h"

void kv_cli_json_strn(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
            i++;
        } else if (c == '\n') {
            fputs("\\n", f);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else if (c < 0x80) {
            fputc(c, f);
            i++;
        } else {
            size_t len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
            int ok = len && i + len <= n;
            for (size_t j = 1; ok && j < len; j++)
                ok = ((unsigned char)s[i + j] & 0xc0) == 0x80;
            if (ok && len == 3) /* no overlongs, no surrogates */
                ok = !(c == 0xe0 && (unsigned char)s[i + 1] < 0xa0) &&
                     !(c == 0xed && (unsigned char)s[i + 1] >= 0xa0);
            if (ok && len == 4)
                ok = !(c == 0xf0 && (unsigned char)s[i + 1] < 0x90) &&
                     !(c == 0xf4 && (unsigned char)s[i + 1] >= 0x90);
            if (ok) {
                fwrite(s + i, 1, len, f);
                i += len;
            } else {
                fputs("\\ufffd", f);
                i++;
            }
        }
    }
    fputc('"', f);
}

void kv_cli_json_str(FILE *f, const char *s)
{
    kv_cli_json_strn(f, s, strlen(s));
}
