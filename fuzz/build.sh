#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# fuzz/build.sh — build the libFuzzer targets with clang and run each one.
#
#   fuzz/build.sh [SECONDS] [TARGET...]     (defaults: 30 s each; every target:
#       fuzz_tok fuzz_gguf fuzz_remote fuzz_pages fuzz_pagefile fuzz_restore fuzz_spec)
#
# Builds build-fuzz/<target> from fuzz/<target>.c and the sources it needs
# (compiled directly: this is not part of the CMake build; the library's
# objects, for the targets that link it, once into build-fuzz/obj/ and again
# only when a library source or header changed), puts the seed inputs into
# build-fuzz/corpus/<target>/ (written here for fuzz_tok and fuzz_gguf,
# copied from fuzz/corpus/<target>/ for the others; the corpus is kept
# between runs, so it grows), runs the target for SECONDS with its crash
# artifacts in build-fuzz/artifacts/, and prints one summary line per target:
#   fuzz <target>: <runs> runs in <s> s (<execs/s> execs/s), corpus <n>, ok|FAILED
# Exit status: 0 if every target ran clean, 1 if one crashed or failed a
# property (the reproducer is in build-fuzz/artifacts/), 2 on a build error.
# Environment: CC (default clang), FUZZ_FLAGS (extra libFuzzer flags),
# KVPAGE_MODEL / FUZZ_TOK_SYNTH (which vocabulary fuzz_tok uses; see
# fuzz/README.md).
set -euo pipefail

secs=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] &&
    targets=(fuzz_tok fuzz_gguf fuzz_remote fuzz_pages fuzz_pagefile fuzz_restore fuzz_spec)

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build-fuzz
cc=${CC:-clang}
m=$root/model
cflags=(-g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined
        -fno-sanitize-recover=undefined -fno-omit-frame-pointer
        -I"$root/include" -I"$m" -I"$root")

tok_src=("$m"/kv_tok*.c "$m"/kv_gguf.c "$m"/kv_gguf_get.c "$root"/store/kv_error.c)
lib_dirs=(alloc util formats pages kernels kernels/cpu store offload prefix remote)
libs=(-luring -lssl -lcrypto -lhiredis -lpthread)

# The library's objects, instrumented like the targets (metadata through the
# system allocator, as in the ASan build, so ASan sees it); rebuilt when a
# source or header of lib_dirs is newer than the stamp.
lib_objects() {
    local obj=$out/obj stamp=$out/obj/.stamp
    mkdir -p "$obj"
    if [ -f "$stamp" ] && [ -z "$(cd "$root" && find "${lib_dirs[@]}" include/kvpage \
            -maxdepth 1 \( -name '*.c' -o -name '*.h' \) -newer "$stamp" | head -1)" ]; then
        return 0
    fi
    local lflags=("${cflags[@]/fuzzer,address/fuzzer-no-link,address}" -DKV_MEM_SYSTEM=1
                  -DKVPAGE_VERSION_STRING='"fuzz"')
    echo "+ $cc ${lflags[*]} -c <library sources> (build-fuzz/obj)" >&2
    rm -f "$obj"/*.o
    local d src o n=0 fail=0 jobs
    jobs=$(nproc 2>/dev/null || echo 2)
    for d in "${lib_dirs[@]}"; do
        for src in "$root/$d"/*.c; do
            o=$obj/$(echo "${src#"$root"/}" | tr / _)
            "$cc" "${lflags[@]}" -c "$src" -o "${o%.c}.o" &
            n=$((n + 1))
            if [ $n -ge "$jobs" ]; then
                wait -n || fail=1
                n=$((n - 1))
            fi
        done
    done
    while [ $n -gt 0 ]; do
        wait -n || fail=1
        n=$((n - 1))
    done
    [ $fail -eq 0 ] && touch "$stamp"
}

sources_for() {
    case $1 in
    fuzz_pages | fuzz_pagefile | fuzz_restore | fuzz_spec)
        echo "-DKV_MEM_SYSTEM=1 -I$root/fuzz $out/obj/*.o ${libs[*]}" ;;
    fuzz_tok) echo "${tok_src[@]}" "$m"/kv_model_find.c "$m"/kv_sha256.c ;;
    fuzz_gguf)
        # the dequantization check needs kv_quant*.c to build with this clang
        if "$cc" -fsyntax-only -std=c11 -D_GNU_SOURCE -I"$root/include" -I"$m" \
            "$m"/kv_quant_avx2.c 2>/dev/null; then
            echo "${tok_src[@]}" "$m"/kv_quant.c "$m"/kv_quant_avx2.c
        else
            echo "fuzz_gguf: kv_quant_avx2.c does not build with $cc:" \
                 "row dequantization not checked" >&2
            echo "-DFUZZ_GGUF_NO_QUANT ${tok_src[*]}"
        fi ;;
    fuzz_remote) # the value frame and url parser of the remote tier (docs/prefix.md)
        echo "-DKV_MEM_SYSTEM=1 $root/remote/kv_remote_frame.c $root/remote/kv_remote_url.c" \
             "$root/remote/kv_remote_mac.c" \
             "$root/util/kv_crc32c.c $root/alloc/kv_mem.c $root/alloc/kv_fault.c" \
             "$root/store/kv_error.c -lcrypto -lpthread" ;;
    *) echo "unknown target $1" >&2; exit 2 ;;
    esac
}

# ---- seeds (written with printf so that nothing but a shell is needed) ------
le32() { printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) \
         $(($1 >> 16 & 255)) $(($1 >> 24 & 255)))"; }
le64() { le32 $(($1 & 0xffffffff)); le32 $(($1 >> 32)); }
gstr() { le64 ${#1}; printf '%s' "$1"; }   # ASCII only

seed_tok() {
    local d=$1
    printf '\x00Hello world! The quick brown fox.' >"$d/english"
    printf '\x00numbers 12345 and 3.14, 1,000,000' >"$d/numbers"
    printf '\x01<|im_start|>user\nHi<|im_end|>\n' >"$d/specials"
    printf '\x00a  b\t\tc\n\n\n d   ' >"$d/spaces"
    printf "\\x00don't I'll we've" >"$d/apostrophes"
    printf '\x00caf\xc3\xa9 \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x91\x8d x\xc2\xb2' >"$d/unicode"
    printf '\x00\xff\xfe\xc3\x28\xed\xa0\x80\x04\x80' >"$d/invalid"
}

seed_gguf() {
    local d=$1
    # one F32 tensor "t" of 4 values, alignment 32
    {
        printf 'GGUF'; le32 3; le64 1; le64 2
        gstr general.architecture; le32 8; gstr llama
        gstr general.alignment; le32 4; le32 32
        gstr t; le32 1; le64 4; le32 0; le64 0
    } >"$d/tensor.tmp"
    local n; n=$(wc -c <"$d/tensor.tmp")
    { cat "$d/tensor.tmp"; head -c $(( (32 - n % 32) % 32 )) /dev/zero
      printf '\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40'; } >"$d/tensor"
    rm -f "$d/tensor.tmp"
    # a tiny gpt2 tokenizer: tokens a b c ab <|e|>, one merge, types, eos
    {
        printf 'GGUF'; le32 3; le64 0; le64 6
        gstr tokenizer.ggml.model; le32 8; gstr gpt2
        gstr tokenizer.ggml.pre; le32 8; gstr smollm
        gstr tokenizer.ggml.tokens; le32 9; le32 8; le64 5
        gstr a; gstr b; gstr c; gstr ab; gstr '<|e|>'
        gstr tokenizer.ggml.token_type; le32 9; le32 5; le64 5
        le32 1; le32 1; le32 1; le32 1; le32 3
        gstr tokenizer.ggml.merges; le32 9; le32 8; le64 1; gstr 'a b'
        gstr tokenizer.ggml.eos_token_id; le32 4; le32 4
    } >"$d/tokenizer"
}

seed_remote() {
    local d=$1
    printf '\x01redis://127.0.0.1:6379' >"$d/url"
    printf '\x01redis://a:1,redis://[::1]:2,b-c.d_e:65535' >"$d/urls"
    printf '\x01rediss://app:p%%40ss@h:1,h:2' >"$d/url_cred"
    printf '\x01redis://:pw@[::1]:6379' >"$d/url_pass"
    printf '\x00KVRM\x01\x00\x40\x00' >"$d/value"
    printf '\x02\x00\x00\x00payload' >"$d/framed"       # intact
    printf '\x02\x10\x00\x04payload' >"$d/framed-bit"   # header byte 16 ^ 4
    printf '\x83\x00\x00\x00payload' >"$d/signed"       # signed, intact
    printf '\x83\x50\x00\x01payload' >"$d/signed-mac"   # signed, MAC byte 80 ^ 1
}

# fuzz/corpus/<target>/ (kept in the tree; fuzz/README.md says how it was made)
seed_tree() {
    local d=$1 t=$2
    [ -d "$root/fuzz/corpus/$t" ] && cp -n "$root/fuzz/corpus/$t"/* "$d"/ 2>/dev/null
    return 0
}
seed_pages() { seed_tree "$1" fuzz_pages; }
seed_pagefile() { seed_tree "$1" fuzz_pagefile; }
seed_restore() { seed_tree "$1" fuzz_restore; }
seed_spec() { seed_tree "$1" fuzz_spec; }

# Largest input per target: a page file with its slots needs more than 8 KiB.
max_len_for() {
    case $1 in
    fuzz_pagefile) echo 16384 ;;
    fuzz_restore) echo 32768 ;;
    *) echo 8192 ;;
    esac
}

# ---- build and run ---------------------------------------------------------
mkdir -p "$out/artifacts"
status=0
for t in "${targets[@]}"; do
    case $t in
    fuzz_pages | fuzz_pagefile | fuzz_restore | fuzz_spec)
        if ! lib_objects; then
            echo "fuzz $t: library build FAILED" >&2
            exit 2
        fi ;;
    esac
    src=$(sources_for "$t")
    echo "+ $cc ${cflags[*]} fuzz/$t.c <model sources> -o build-fuzz/$t" >&2
    # shellcheck disable=SC2086
    if ! "$cc" "${cflags[@]}" "$root/fuzz/$t.c" $src -lm -o "$out/$t"; then
        echo "fuzz $t: build FAILED" >&2
        exit 2
    fi
    corpus=$out/corpus/$t
    mkdir -p "$corpus"
    "seed_${t#fuzz_}" "$corpus"
    log=$out/$t.log
    echo "+ build-fuzz/$t -max_total_time=$secs -print_final_stats=1 -max_len=$(max_len_for "$t") build-fuzz/corpus/$t" >&2
    # shellcheck disable=SC2086
    if "$out/$t" -max_total_time="$secs" -print_final_stats=1 -timeout=10 \
        -max_len="$(max_len_for "$t")" \
        -artifact_prefix="$out/artifacts/$t-" ${FUZZ_FLAGS:-} "$corpus" >"$log" 2>&1; then
        verdict=ok
    else
        verdict=FAILED
        status=1
        tail -40 "$log" >&2
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    vocab=$(sed -n 's/^fuzz_tok: \(.*vocabulary.*\)$/, \1/p' "$log" | head -1)
    echo "fuzz $t: ${runs:-?} runs in $secs s (${rate:-?} execs/s), corpus $(ls "$corpus" | wc -l)$vocab, $verdict (log: build-fuzz/$t.log)"
done
exit $status
