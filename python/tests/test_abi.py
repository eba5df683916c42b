# SPDX-License-Identifier: MIT
"""The ctypes mirrors of kvpage.h's structs (kvpage/_lib.py) against the
header itself: a C program compiled here prints sizeof and every field's
offsetof, which must equal ctypes'. Skipped where no C compiler or no
header (an installed package without the source tree) is found."""
import shutil
import subprocess
from pathlib import Path

import pytest

from kvpage import _lib

HEADER = Path(__file__).resolve().parents[2] / "include" / "kvpage" / "kvpage.h"
STRUCTS = [_lib.kv_config_t, _lib.kv_stats_t, _lib.kv_estimate_t, _lib.kv_residency_t,
           _lib.kv_decode_t, _lib.kv_prefill_t, _lib.kv_merge_opts_t, _lib.kv_format_info_t,
           _lib.kv_policy_info_t]


def test_struct_layouts_match_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc or not HEADER.exists():
        pytest.skip("no C compiler or no kvpage.h source tree")
    lines, want = [], []
    for s in STRUCTS:
        name = s.__name__
        lines.append(f'printf("%zu\\n", sizeof({name}));')
        want.append(__import__("ctypes").sizeof(s))
        for field, *_ in s._fields_:
            lines.append(f'printf("%zu\\n", offsetof({name}, {field}));')
            want.append(getattr(s, field).offset)
    src = tmp_path / "abi.c"
    src.write_text("#include <kvpage/kvpage.h>\n#include <stddef.h>\n#include <stdio.h>\n"
                   "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "abi"
    subprocess.run([cc, "-std=c11", "-I", str(HEADER.parent.parent), str(src), "-o", str(exe)],
                   check=True)
    got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True,
                                          text=True).stdout.split()]
    assert got == want
    # and every field of the C structs is mirrored: the last field ends the struct
    for s in STRUCTS:
        last = getattr(s, s._fields_[-1][0])
        assert __import__("ctypes").sizeof(s) - (last.offset + last.size) < 8
