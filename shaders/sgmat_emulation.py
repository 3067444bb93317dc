"""Subgroup matrices emulated in plain WGSL, so the tensor-core kernels run on any device
with `shader-f16` (lavapipe on CI), where Dawn's chromium-experimental-subgroup-matrix is
missing. A source transform of one composed kernel module (shaders/source.py's output):

- each matrix type becomes a struct: a left or right operand holds the whole matrix in
  every invocation of the subgroup (loads read all of it), a result holds this invocation's
  share, element e of the 16 x 16 at lane e % 32 (as the hardware spreads accumulators);
- subgroupMatrixLoad / Store / MultiplyAccumulate become functions over those structs
  (row-major element (r, c) at offset + r * stride + c, column-major at offset + c * stride
  + r; products accumulate in f32 from f16 operands, exact as on the tensor cores). Loads
  come in both overloads: the deprecated bool one, <T>(&p, offset, col_major, stride), on
  arrays of f16 or f32, and the template one, <T, row_major | col_major>(&p, offset,
  stride), on those and on array<vec4<u32>> of f16 matrices (8 halves per element, offset
  and stride counting elements: row-major (r, c) at half 8 offset + 8 r stride + c, column-
  major at 8 offset + 8 c stride + r; issue 49's 16-byte staging). Tint compiles no bool-form
  load from an array of vectors, so neither does this; stores keep the bool form. An f32
  result matrix loaded at an odd element offset reads NaN: the H200 reads such loads wrong
  (dev/tensor_core_matmul/README.md, sgmat_offset_probe.py), so the emulation must not pass a kernel that does it;
- the subgroups are the emulated ones of 32 invocations the kernels are written for:
  subgroup_id = local_invocation_index / 32, subgroup_invocation_id = .. % 32, and
  subgroupShuffleXor goes through workgroup memory between two barriers (so it must be
  called in workgroup-uniform control flow, as the kernels do).

The result is slow (every operand element is read by every invocation) and exact: it checks
a kernel's indexing, masking, barriers and epilogues against the ladder's references on a
CPU. A kernel that relies on more than the WGSL memory model guarantees (a subgroup's
invocations writing what others of it still read, without a barrier) fails here, as it may
on hardware with a different subgroup size or schedule. Enabled by Device(...,
emulate_subgroup_matrix=True) or $ISTANBUL_EMULATE_SUBGROUP_MATRIX=1 (engine.py).
"""

from __future__ import annotations

import re

SUBGROUP = 32          # the subgroup size the kernels are written for (NVIDIA's)
CONFIG = {"component_type": "f16", "result_component_type": "f32", "m": 16, "n": 16, "k": 16,
          "min_subgroup_size": SUBGROUP, "max_subgroup_size": SUBGROUP, "emulated": True}

MATRIX_TYPE = re.compile(r"subgroup_matrix_(left|right|result)\s*<\s*(f16|f32)\s*,\s*(\d+)\s*,"
                         r"\s*(\d+)\s*>")
CALLS = ("subgroupMatrixLoad", "subgroupMatrixStore", "subgroupMatrixMultiplyAccumulate",
         "subgroupShuffleXor")
CALL = re.compile(r"\b(" + "|".join(CALLS) + r")\b")
ENABLE = re.compile(r"^\s*enable\s+chromium_experimental_subgroup_matrix\s*;\s*$", re.M)
POINTER = re.compile(r"^&\s*\(?\s*([A-Za-z_]\w*)\s*\)?$")
SUBGROUP_BUILTINS = ("subgroup_id", "subgroup_invocation_id", "subgroup_size")
# element (r, c) of a matrix at `offset`, row- or column-major with `stride` (the helpers' names)
ELEMENT_AT = "select(offset + r * stride + c, offset + c * stride + r, col_major)"
# the same in halves of an array<vec4<u32>> (8 halves per element, offset and stride in elements)
HALF_AT = "select(8u * (offset + r * stride) + c, 8u * (offset + c * stride) + r, col_major)"
MAJORS = ("row_major", "col_major")


class EmulationError(ValueError):
    """The module uses a subgroup construct this emulation does not cover."""


def uses_subgroup_matrix(code: str) -> bool:
    return "subgroup_matrix_" in code or "subgroupMatrix" in code


class _Matrix:
    def __init__(self, kind: str, elem: str, cols: int, rows: int):
        self.kind, self.elem, self.cols, self.rows = kind, elem, cols, rows
        self.name = f"Sgm{kind.capitalize()}_{elem}_{cols}x{rows}"
        if kind == "result" and (cols * rows) % SUBGROUP:
            raise EmulationError(f"{self.name}: {cols * rows} elements do not spread over "
                                 f"{SUBGROUP} invocations")

    @property
    def stored(self) -> int:   # elements each invocation holds
        n = self.cols * self.rows
        return n // SUBGROUP if self.kind == "result" else n

    def struct(self) -> str:
        return f"struct {self.name} {{ v: array<{self.elem}, {self.stored}>, }}\n"

    def elements(self) -> str:
        """A loop header over this invocation's elements, binding r and c (and i, the index
        into v)."""
        if self.kind == "result":
            return (f"for (var i = 0u; i < {self.stored}u; i++) {{\n"
                    f"        let e = sgm_lane + {SUBGROUP}u * i;\n"
                    f"        let r = e / {self.cols}u;\n        let c = e % {self.cols}u;\n")
        return (f"for (var i = 0u; i < {self.stored}u; i++) {{\n"
                f"        let r = i / {self.cols}u;\n        let c = i % {self.cols}u;\n")


def call_args(text: str, start: int) -> tuple[list[str], int]:
    """The top-level comma-separated arguments of the call whose '(' is at `start`, and the
    index just past its ')'."""
    depth, args, cur = 0, [], start + 1
    for i in range(start, len(text)):
        ch = text[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth == 0:
                args.append(text[cur:i].strip())
                return args, i + 1
        elif ch == "," and depth == 1:
            args.append(text[cur:i].strip())
            cur = i + 1
    raise EmulationError(f"unbalanced call at offset {start}")


def _template_arg(text: str, start: int) -> tuple[str, int]:
    """The text between the '<' at `start` and its matching '>', and the index past it."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "<":
            depth += 1
        elif text[i] == ">":
            depth -= 1
            if depth == 0:
                return text[start + 1:i].strip(), i + 1
    raise EmulationError("unbalanced template argument")


def _array_element(code: str, name: str) -> str:
    """The element type of the module-scope array `name` ("f16", "vec4<u32>", ...)."""
    m = re.search(r"var\s*(?:<[^>]*>)?\s+" + re.escape(name)
                  + r"\s*:\s*array\s*<\s*(\w+(?:\s*<\s*\w+\s*>)?)", code)
    if not m:
        raise EmulationError(f"{name}: not a module-scope array (subgroup matrices load from "
                             "and store to storage or workgroup arrays)")
    return re.sub(r"\s+", "", m.group(1))


def _pointer_target(arg: str) -> str:
    m = POINTER.match(arg)
    if not m:
        raise EmulationError(f"subgroup matrix pointer {arg!r}: only &name of a module-scope "
                             "array is emulated")
    return m.group(1)


def emulate(code: str) -> str:
    """`code` (one kernel module) with subgroup matrices and the subgroup builtins it uses
    rewritten in plain WGSL (see the module doc)."""
    code = _strip_comments(ENABLE.sub("", code))   # (names in comments are not calls)
    types: dict[str, _Matrix] = {}

    def type_name(m) -> str:
        t = _Matrix(m.group(1), m.group(2), int(m.group(3)), int(m.group(4)))
        types.setdefault(t.name, t)
        return t.name

    code = MATRIX_TYPE.sub(type_name, code)
    helpers: dict[str, str] = {}
    # innermost calls first: the last match in the text is never inside a later one
    while True:
        found = list(CALL.finditer(code))
        if not found:
            break
        m = found[-1]
        fn, pos = m.group(1), m.end()
        while code[pos].isspace():
            pos += 1
        template = None
        if code[pos] == "<":
            template, pos = _template_arg(code, pos)
            while code[pos].isspace():
                pos += 1
        if code[pos] != "(":
            raise EmulationError(f"{fn} is not called at offset {m.start()}")
        args, end = call_args(code, pos)
        code = code[:m.start()] + _rewrite(fn, template, args, code, types, helpers) + code[end:]
    code = _entry_points(code, "sgm_shuffle_xor_f32" in helpers)
    for name in ("subgroupMatrix", "subgroup_matrix"):
        if name in code:
            raise EmulationError(f"{name}...: left after emulation")
    # any other subgroup operation the kernel reaches would run on the device's real
    # subgroups (lavapipe's 8 invocations), not on the emulated 32 (the preamble's
    # reductions are there in every module, mostly unused)
    for fn, body in _reachable_functions(code):
        other = re.search(r"\b(subgroup[A-Z]\w*|quad[A-Z]\w*)\s*\(", body)
        if other:
            raise EmulationError(f"{other.group(1)} (in {fn}): not emulated (only "
                                 "subgroupShuffleXor next to subgroup matrices)")
    return (code + "\n// ---- emulated subgroup matrices (shaders/sgmat_emulation.py) ----\n"
            + "var<private> sgm_lid: u32;\nvar<private> sgm_lane: u32;\n"
            + "".join(t.struct() for t in types.values()) + "".join(helpers.values()))


FUNCTION = re.compile(r"\bfn\s+(\w+)\s*\(")


def _reachable_functions(code: str) -> list[tuple[str, str]]:
    """(name, body) of the entry points and every function they call, directly or not."""
    bodies, entries = {}, set()
    for m in FUNCTION.finditer(code):
        _, end = call_args(code, m.end() - 1)
        start = code.index("{", end)
        depth, i = 0, start
        while True:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
            if depth == 0:
                break
        bodies[m.group(1)] = code[start:i]
        if re.search(r"@compute[^;{}]*$", code[max(0, m.start() - 200):m.start()]):
            entries.add(m.group(1))
    seen, todo = set(), list(entries)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [c for c in re.findall(r"\b(\w+)\s*\(", bodies[name]) if c in bodies]
    return [(name, bodies[name]) for name in sorted(seen)]


def _strip_comments(code: str) -> str:
    return re.sub(r"//[^\n]*", "", code)


def _rewrite(fn: str, template, args: list, code: str, types: dict, helpers: dict) -> str:
    if fn == "subgroupMatrixLoad":
        parts = [x.strip() for x in (template or "").split(",")]
        if len(parts) == 2 and parts[1] in MAJORS and len(args) == 3:
            # the template form: <T, row_major|col_major>(&p, offset, stride)
            args = [args[0], args[1], "true" if parts[1] == "col_major" else "false", args[2]]
            form = "template"
        elif len(parts) == 1 and len(args) == 4:
            form = "bool"   # <T>(&p, offset, col_major, stride): the deprecated overload
        else:
            raise EmulationError(f"subgroupMatrixLoad<{template}>({', '.join(args)})")
        if parts[0] not in types:
            raise EmulationError(f"subgroupMatrixLoad<{template}>: unknown matrix type")
        t, target = types[parts[0]], _pointer_target(args[0])
        elem = _array_element(code, target)
        if elem == "vec4<u32>":
            # 8 halves per element; offset and stride count elements (16 bytes)
            if form != "template" or t.elem != "f16":
                raise EmulationError(
                    f"subgroupMatrixLoad from {target} (array<vec4<u32>>): only the template "
                    "form <T, row_major|col_major> of an f16 matrix loads from 8-half "
                    "elements (Tint compiles no other)")
            name = f"sgm_load_{t.name}_{target}_{'cm' if args[2] == 'true' else 'rm'}"
            value = (f"f16(unpack2x16float({target}[h / 8u][(h % 8u) / 2u])[h % 2u])")
            helpers.setdefault(name, (
                f"fn {name}(offset: u32, stride: u32) -> {t.name} {{\n"
                f"    let col_major = {args[2]};\n"
                f"    var m: {t.name};\n    {t.elements()}"
                f"        let h = {HALF_AT};\n"
                f"        m.v[i] = {value};\n    }}\n    return m;\n}}\n"))
            return f"{name}({args[1]}, {args[3]})"
        if elem not in ("f16", "f32"):
            raise EmulationError(f"subgroupMatrixLoad from {target} (array<{elem}>): arrays "
                                 "of f16, f32 or (template form) vec4<u32> only")
        name = f"sgm_load_{t.name}_{target}"
        value = f"{target}[{ELEMENT_AT}]"
        if t.kind == "result" and t.elem == "f32":
            # the H200 misreads these at odd offsets: read NaN there, as wrong as it gets
            # (not a NaN constant: WGSL rejects those; `offset & 0u` is a runtime zero)
            value = (f"select({value}, bitcast<f32>(0x7fc00000u | (offset & 0u)), "
                     "(offset & 1u) != 0u)")
        helpers.setdefault(name, (
            f"fn {name}(offset: u32, col_major: bool, stride: u32) -> {t.name} {{\n"
            f"    var m: {t.name};\n    {t.elements()}"
            f"        m.v[i] = {value};\n    }}\n    return m;\n}}\n"))
        return f"{name}({args[1]}, {args[2]}, {args[3]})"
    if fn == "subgroupMatrixStore":
        if len(args) != 5:
            raise EmulationError(f"subgroupMatrixStore({', '.join(args)})")
        target = _pointer_target(args[0])
        elem = _array_element(code, target)
        # the stored value's type: the one matrix type of that element type (results: the
        # kernels store accumulators only)
        candidates = [t for t in types.values() if t.elem == elem and t.kind == "result"]
        if len(candidates) != 1:
            raise EmulationError(f"subgroupMatrixStore to {target} (array<{elem}>): "
                                 f"{len(candidates)} result types of {elem}")
        t = candidates[0]
        name = f"sgm_store_{t.name}_{target}"
        helpers.setdefault(name, (
            f"fn {name}(offset: u32, m: {t.name}, col_major: bool, stride: u32) {{\n"
            f"    {t.elements()}"
            f"        {target}[{ELEMENT_AT}] = m.v[i];\n    }}\n}}\n"))
        return f"{name}({args[1]}, {args[2]}, {args[3]}, {args[4]})"
    if fn == "subgroupMatrixMultiplyAccumulate":
        if len(args) != 3:
            raise EmulationError(f"subgroupMatrixMultiplyAccumulate({', '.join(args)})")
        left = [t for t in types.values() if t.kind == "left"]
        right = [t for t in types.values() if t.kind == "right"]
        result = [t for t in types.values() if t.kind == "result"]
        triples = [(a, b, c) for a in left for b in right for c in result
                   if a.cols == b.rows and a.rows == c.rows and b.cols == c.cols]
        if len(triples) != 1:
            raise EmulationError(f"subgroupMatrixMultiplyAccumulate: {len(triples)} "
                                 "left x right -> result type combinations in the module")
        a, b, c = triples[0]
        name = f"sgm_mma_{c.name}"
        helpers.setdefault(name, (
            f"fn {name}(a: {a.name}, b: {b.name}, acc: {c.name}) -> {c.name} {{\n"
            f"    var out = acc;\n    {c.elements()}"
            f"        var s = out.v[i];\n"
            f"        for (var k = 0u; k < {a.cols}u; k++) {{\n"
            f"            s += f32(a.v[r * {a.cols}u + k]) * f32(b.v[k * {b.cols}u + c]);\n"
            f"        }}\n        out.v[i] = s;\n    }}\n    return out;\n}}\n"))
        return f"{name}({', '.join(args)})"
    # subgroupShuffleXor(x, mask): f32 values through workgroup memory
    if len(args) != 2:
        raise EmulationError(f"subgroupShuffleXor({', '.join(args)})")
    helpers.setdefault("sgm_shuffle_xor_f32", (
        "fn sgm_shuffle_xor_f32(x: f32, mask: u32) -> f32 {\n"
        "    workgroupBarrier();   // the previous exchange is read\n"
        "    sgm_xchg_f32[sgm_lid] = x;\n    workgroupBarrier();\n"
        f"    return sgm_xchg_f32[(sgm_lid & ~{SUBGROUP - 1}u) | (sgm_lane ^ (mask & "
        f"{SUBGROUP - 1}u))];\n}}\n"))
    return f"sgm_shuffle_xor_f32(f32({args[0]}), {args[1]})"


ENTRY = re.compile(r"@compute\s+@workgroup_size\s*\(([^)]*)\)\s*fn\s+(\w+)\s*\(")


def _entry_points(code: str, exchange: bool) -> str:
    """Each entry point gets sgm_lid / sgm_lane set first, its subgroup builtins become
    lets of the emulated subgroup, and (with `exchange`) the shuffle's workgroup array."""
    out, pos, size = [], 0, None
    for m in ENTRY.finditer(code):
        dims = [d.strip() for d in m.group(1).split(",") if d.strip()]
        if len(dims) != 1:
            raise EmulationError(f"{m.group(2)}: only 1-D workgroups are emulated")
        if size not in (None, dims[0]):
            raise EmulationError("entry points of different workgroup sizes in one module")
        size = dims[0]
        args, end = call_args(code, m.end() - 1)
        params, lets, lid = [], [], None
        for a in args:
            b = re.match(r"@builtin\((\w+)\)\s*(\w+)\s*:", a)
            if b and b.group(1) == "local_invocation_index":
                lid = b.group(2)
            if b and b.group(1) in SUBGROUP_BUILTINS:
                lets.append((b.group(1), b.group(2)))
            elif a:
                params.append(a)
        if lid is None:
            lid = "sgm_local_index"
            params.append(f"@builtin(local_invocation_index) {lid}: u32")
        brace = code.index("{", end)
        body = [f"\n    sgm_lid = {lid};\n    sgm_lane = {lid} % {SUBGROUP}u;\n"]
        value = {"subgroup_id": f"{lid} / {SUBGROUP}u", "subgroup_invocation_id": "sgm_lane",
                 "subgroup_size": f"{SUBGROUP}u"}
        body += [f"    let {name} = {value[kind]};\n" for kind, name in lets]
        out.append(code[pos:m.start()] + code[m.start():m.end()] + ",\n    ".join(params)
                   + ")" + code[end:brace + 1] + "".join(body))
        pos = brace + 1
    out.append(code[pos:])
    code = "".join(out)
    if re.search(r"@builtin\(subgroup_", code):
        raise EmulationError("a subgroup builtin outside an entry point's parameters")
    if exchange:
        if size is None:
            raise EmulationError("subgroupShuffleXor without an entry point")
        code += f"var<workgroup> sgm_xchg_f32: array<f32, {size}>;\n"
    return code
