# SPDX-License-Identifier: MIT
"""The binding's constants against include/kvpage/kvpage.h, their one
definition: kvpage/_consts.py is what python/gen_consts.py makes of the
header today (stale otherwise), every integer constant the header defines
is in it, a C program compiled against the header prints the same values,
and the public names (KV_E* codes, Format, Method, CONFIG_*, OFFLOAD_*, the
exception classes) are built from it, one class per error code."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvpage
from kvpage import _consts

PYDIR = Path(__file__).resolve().parents[1]
HEADER = PYDIR.parent / "include" / "kvpage" / "kvpage.h"
sys.path.insert(0, str(PYDIR))
import gen_consts  # noqa: E402

needs_header = pytest.mark.skipif(not HEADER.exists(), reason="no kvpage.h source tree")
GENERATED = {k: v for k, v in vars(_consts).items() if k.startswith("KV_")}


@needs_header
def test_generated_file_is_current():
    assert (PYDIR / "kvpage" / "_consts.py").read_text() == \
        gen_consts.render(gen_consts.parse(HEADER.read_text())), \
        "kvpage/_consts.py is stale: run python3 python/gen_consts.py"


@needs_header
def test_every_header_constant_is_generated():
    """A looser scan than the generator's: every KV_ macro but KV_API and
    every KV_ enum member of the header is in _consts."""
    text = HEADER.read_text()
    names = set(re.findall(r"^\s*#\s*define\s+(KV_\w+)", text, re.M)) - {"KV_API"}
    names |= set(re.findall(r"^\s+(KV_\w+)\s*=", text, re.M))
    assert names and names == set(GENERATED)


@needs_header
def test_values_match_the_compiled_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "consts.c"
    src.write_text("#include <kvpage/kvpage.h>\n#include <stdio.h>\nint main(void) {\n"
                   + "".join(f'printf("%lld\\n", (long long){n});\n' for n in GENERATED)
                   + "return 0;\n}\n")
    exe = tmp_path / "consts"
    subprocess.run([cc, "-std=c11", "-I", str(HEADER.parent.parent), str(src), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    assert [int(x) for x in out.split()] == list(GENERATED.values())


def test_public_names_come_from_the_header():
    codes = {n: v for n, v in GENERATED.items() if n.startswith("KV_E")}
    assert {n: getattr(kvpage, n) for n in codes} == codes
    assert kvpage.KV_OK == _consts.KV_OK == 0
    assert {f.name: int(f) for f in kvpage.Format} == \
        {n[len("KV_FMT_"):]: v for n, v in GENERATED.items()
         if n.startswith("KV_FMT_") and n not in ("KV_FMT_COUNT", "KV_FMT_ROT")}
    assert {m.name: int(m) for m in kvpage.Method} == \
        {n[len("KV_POLICY_"):]: v for n, v in GENERATED.items() if n.startswith("KV_POLICY_")}
    for name in ("CONFIG_NO_TCACHE", "CONFIG_INT8_ATTN", "OFFLOAD_WAIT", "OFFLOAD_OPEN",
                 "OFFLOAD_PREAD"):
        assert getattr(kvpage, name) == GENERATED["KV_" + name]
    assert kvpage._lib.kv_stats_t.pages_by_format.size == 8 * _consts.KV_FMT_COUNT
    # one exception class per code, each raising with its own code
    classes = {kvpage.error_class(v) for v in codes.values()}
    assert len(classes) == len(codes) and kvpage.KvError not in classes
    for v in codes.values():
        assert kvpage.error_class(v).code == v
