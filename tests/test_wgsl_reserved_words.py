"""No kernel names anything with a word WGSL reserves.

The tensor-core kernels compile only where the device has subgroup matrices (the H200 under
Dawn), so neither CI compiler ever parses them: a parameter named `active` (reserved in WGSL)
passed every CI run and failed its first H200 compile. This reads the text of every kernel of
every ladder case, templates expanded with the case's own parameters, so a reserved word fails
here instead.
"""

from __future__ import annotations

import re

import pytest

from istanbul.shaders import ladder, source

# WGSL's reserved words (the spec's "Reserved Words" section): not keywords today, but no
# identifier may be spelled like one, and Tint rejects them.
RESERVED = set("""
NULL Self abstract active alignas alignof as asm asm_fragment async attribute auto await
become binding_array cast catch class co_await co_return co_yield coherent column_major common
compile compile_fragment concept const_cast consteval constexpr constinit crate debugger
decltype delete demote demote_to_helper do dynamic_cast enum explicit export extends extern
external fallthrough filter final finally friend from fxgroup get goto groupshared highp impl
implements import inline instanceof interface layout lowp macro macro_rules match mediump meta
mod module move mut mutable namespace new nil noexcept noinline nointerpolation noperspective
null nullptr of operator package packoffset partition pass patch pixelfragment precise
precision premerge priv protected pub public readonly ref regardless register
reinterpret_cast require resource restrict self set shared sizeof smooth snorm static
static_assert static_cast std subroutine super target template this thread_local throw trait
try type typedef typeid typename typeof union unless unorm unsafe unsized use using varying
virtual volatile wgsl where with writeonly yield
""".split())

COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
ALL_FEATURES = ("shader-f16", "subgroup", "subgroup-matrix")


def _kernel_texts():
    seen = set()
    for case in ladder.load_cases().values():
        for spec in ladder.kernel_specs(case, None):
            file, name = spec[0], spec[1]
            params = spec[3] if len(spec) > 3 else None
            key = (file, name, None if params is None else tuple(sorted(params.items())))
            if key in seen:
                continue
            seen.add(key)
            wgsl = source.load_file(file)
            yield (f"{case.name}: {file}:{name}",
                   source.compose(ALL_FEATURES, wgsl, name, params=params, compiler="tint"))


def test_the_list_is_the_spec_s():
    # a few entries checked by hand against the WGSL spec; `active` is the one that broke
    assert {"active", "filter", "target", "shared", "writeonly"} <= RESERVED
    assert not {"let", "var", "fn", "override"} & RESERVED   # keywords, not reserved words


@pytest.mark.parametrize("where,code", list(_kernel_texts()), ids=lambda v: v if
                         isinstance(v, str) and ":" in v and len(v) < 200 else "")
def test_no_reserved_identifier(where, code):
    words = set(IDENTIFIER.findall(COMMENT.sub(" ", code))) & RESERVED
    assert not words, f"{where} uses WGSL reserved words as names: {sorted(words)}"
