"""Expansion of loop-form WGSL templates into the straight-line form NVIDIA's compiler needs.

Why: through naga -> SPIR-V -> NVIDIA's compiler, a function-scope array indexed inside a
loop stays in local memory, even when every index is a constant after unrolling (the 8x8
matmul block: 2.3 TFLOP/s as `acc[(g * 4 + r) * GN + h]` in loops, 37 over named vec4
values; shaders/NOTES.md). So the kernels are written once as readable loops over small
register arrays, and this pass writes out what the compiler needs, when a kernel is made
(`Device.kernel(..., params=...)`, cached with the pipeline). Four mechanical steps:

1. `// @if NAME` / `// @else` / `// @endif` lines keep one branch by a boolean parameter.
2. `{{NAME}}` is replaced by the parameter's value (block sizes: `{{TM}}`, `{{FOLD}}`, ...).
3. Loops marked `// @unroll` on their `for (var i = A; i < B; i++) {` line, with constant
   A and B (after step 2), are written out: one copy of the body per i, i replaced by its
   value, a copy wrapped in `{ }` only when it declares names. In a copy, `if (c) {` whose
   condition is decided by constants loses its test (or its block); terms of a sum with a
   zero factor vanish and unit factors go (`r0 + 0u * TQ` -> `r0`, `1u * SA` -> `SA`).
   `// @unroll N` on a loop with a runtime bound `for (var i = 0u; i < B; i++)` writes out
   runs of N iterations (i, (i + 1u), ...) followed by a plain loop over the remainder: the
   same iterations in the same order (N = 1: the plain loop).
4. Function-scope arrays (`var c: array<vec4<f32>, 16>;`, nested for 2-D) become named
   values `c0 .. c15` (`s[1][2]` -> `s12`), zero-initialised; a declaration marked
   `// @let` declares nothing and each element's assignment becomes its `let`. Indices must
   be constant after unrolling; a constant index into a vector (`a[g][1]` past the array's
   dimensions, or `v[2u]` of a local vector) becomes a swizzle (`a0.y`, `v.z`).

Anything the pass cannot do is a TemplateError naming the line and what to change.
"""

from __future__ import annotations

import re

COMPONENTS = "xyzw"
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
FOR_LINE = re.compile(
    r"^(?P<indent>\s*)for \(var (?P<var>\w+) = (?P<start>[^;]+); (?P=var) < (?P<bound>[^;]+); "
    r"(?P=var)\+\+\) \{\s*//\s*@unroll(?:\s+(?P<run>\d+))?\b.*$")
ARRAY_DECL = re.compile(
    r"^(?P<indent>\s*)var (?P<name>\w+): (?P<type>array<.+>);\s*(?://\s*(?P<note>.*))?$")
IF_LINE = re.compile(r"^(?P<indent>\s*)if \((?P<cond>.*)\) \{\s*(?://.*)?$")
CONST_EXPR = re.compile(r"^[\d\s+\-*/%()u]+$")
ZEROS = {"f32": "0.0", "f16": "f16()", "u32": "0u", "i32": "0i", "bool": "false"}


class TemplateError(ValueError):
    """A kernel template the expansion pass cannot expand."""


def expand(text: str, params: dict, origin: str = "<template>") -> str:
    """The template `text` with `params` applied (see the module docstring)."""
    text = _conditionals(text, params, origin)
    text = _substitute(text, params, origin)
    lines = _unroll(text.split("\n"), origin)
    return "\n".join(_named_registers(lines, origin))


def const_value(expr: str):
    """The value of an integer expression of u32 literals, or None if it is not one."""
    expr = expr.strip()
    if not expr or not CONST_EXPR.match(expr):
        return None
    try:
        return int(eval(re.sub(r"(\d+)u", r"\1", expr).replace("/", "//"), {}, {}))
    except (SyntaxError, NameError, TypeError, ZeroDivisionError):   # "u" alone, "()", ...
        return None


# ---- steps 1 and 2 -------------------------------------------------------------------------

def _conditionals(text: str, params: dict, origin: str) -> str:
    out, stack = [], []   # stack: does each enclosing @if keep its current branch
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*//\s*@(if|else|endif)\b\s*(\w*)", line)
        if not m:
            if all(stack):
                out.append(line)
            continue
        word, name = m.groups()
        if word == "if":
            if name not in params:
                raise TemplateError(f"{origin}:{n}: `// @if {name}` needs the parameter {name}")
            stack.append(bool(params[name]))
        elif not stack:
            raise TemplateError(f"{origin}:{n}: `// @{word}` without `// @if`")
        elif word == "else":
            stack.append(not stack.pop())
        else:
            stack.pop()
    if stack:
        raise TemplateError(f"{origin}: `// @if` without `// @endif`")
    return "\n".join(out)


def _substitute(text: str, params: dict, origin: str) -> str:
    def value(m):
        name = m.group(1)
        if name not in params:
            raise TemplateError(f"{origin}: placeholder {{{{{name}}}}} has no parameter "
                                f"(given: {', '.join(sorted(params)) or 'none'})")
        v = params[name]
        return str(int(v)) if isinstance(v, bool) else str(v)
    return PLACEHOLDER.sub(value, text)


# ---- step 3: unrolling ---------------------------------------------------------------------

def _block_end(lines: list[str], start: int, origin: str) -> int:
    """Index of the line closing the `{` opened at the end of lines[start]."""
    depth = 0
    for i in range(start, len(lines)):
        code = lines[i].split("//", 1)[0]
        depth += code.count("{") - code.count("}")
        if depth == 0:
            return i
    raise TemplateError(f"{origin}:{start + 1}: unclosed block")


def _dedent(lines: list[str], n: int = 4) -> list[str]:
    return [ln[n:] if ln.startswith(" " * n) else ln.lstrip() for ln in lines]


def _indent(lines: list[str], n: int = 4) -> list[str]:
    return [" " * n + ln if ln.strip() else ln for ln in lines]


def _declares(body: list[str]) -> bool:
    """Whether the body declares a name at its own level (a copy then needs a scope)."""
    depth = 0
    for line in body:
        code = line.split("//", 1)[0]
        if depth == 0 and re.match(r"^\s*(let|var|const)\s", code):
            return True
        depth += code.count("{") - code.count("}")
    return False


def _unroll(lines: list[str], origin: str) -> list[str]:
    """Every marked loop written out, outermost first (a copy's inner loops come next)."""
    i = 0
    while i < len(lines):
        m = FOR_LINE.match(lines[i])
        if not m:
            i += 1
            continue
        lines = lines[:i] + _unroll_one(lines, i, m, origin)
    return lines


def _unroll_one(lines: list[str], i: int, m, origin: str) -> list[str]:
    """The lines from the marked loop at lines[i] on, with that loop written out."""
    line = lines[i]
    end = _block_end(lines, i, origin)
    if lines[end].strip() != "}":
        raise TemplateError(f"{origin}:{i + 1}: an unrolled loop must end with `}}` alone on "
                            "its line")
    indent, var = m.group("indent"), m.group("var")
    body = _dedent(lines[i + 1:end], len(indent) + 4)
    word = re.compile(rf"\b{var}\b")
    start, bound = const_value(m.group("start")), const_value(m.group("bound"))
    if m.group("run") and int(m.group("run")) <= 1:   # runs of 1: the plain loop
        return [line[:line.index("{") + 1]] + lines[i + 1:]
    if m.group("run"):
        if start != 0:
            raise TemplateError(f"{origin}:{i + 1}: `// @unroll N` loops must start at 0u")
        run = int(m.group("run"))
        b = m.group("bound").strip()
        out = ["{", f"    var {var} = 0u;",
               f"    for (; {var} + {run}u <= {b}; {var} += {run}u) {{"]
        for k in range(run):
            moved = body if k == 0 else [word.sub(f"({var} + {k}u)", ln) for ln in body]
            out += ["        {"] + _indent(moved, 12) + ["        }"]
        out += ["    }", f"    for (; {var} < {b}; {var}++) {{"] + _indent(body, 8) + ["    }", "}"]
    else:
        if start is None or bound is None:
            raise TemplateError(
                f"{origin}:{i + 1}: `// @unroll` needs constant bounds, got "
                f"{m.group('start')!r} .. {m.group('bound')!r} (use `// @unroll N` for runs of "
                "N over a runtime bound)")
        scoped = _declares(body)
        out = []
        for v in range(start, bound):
            copy = _decide_ifs([_fold(word.sub(f"{v}u", ln)) for ln in body], origin)
            out += ["{"] + _indent(copy) + ["}"] if scoped else copy
    return _indent(out, len(indent)) + lines[end + 1:]


def _fold(line: str) -> str:
    """Remove additive terms with a zero factor and unit factors of products."""
    atom = r"(?:\w+(?:\.\w+)*|\([^()]*\))"
    prev = None
    while prev != line:
        prev = line
        line = re.sub(rf" [+] 0u(?: [*/%] {atom})*(?! [*/%])(?=[\s,;)\]])", "", line)
        line = re.sub(rf"(?<=[\[(,=+] )1u \* (?={atom})", "", line)
        line = re.sub(rf"(?<=[\[(])1u \* (?={atom})", "", line)
    return line


def _truth(cond: str):
    """True/False when a condition is decided by constants (terms of || / && at its top
    level), else the condition with its decided terms removed."""
    for op, absorbing in (("||", True), ("&&", False)):
        terms = [t.strip() for t in cond.split(op)]
        if len(terms) > 1 and all(t.count("(") == t.count(")") for t in terms):
            kept = []
            for t in terms:
                v = _truth(t)
                if v is absorbing:
                    return absorbing
                if v is not (not absorbing):
                    kept.append(v if isinstance(v, str) else t)
            return (not absorbing) if not kept else f" {op} ".join(kept)
    m = re.match(r"^(.+?)\s*(==|!=|<=|>=|<|>)\s*(.+)$", cond)
    if m:
        a, b = const_value(m.group(1)), const_value(m.group(3))
        if a is not None and b is not None:
            return {"==": a == b, "!=": a != b, "<=": a <= b, ">=": a >= b, "<": a < b,
                    ">": a > b}[m.group(2)]
    return cond


def _decide_ifs(lines: list[str], origin: str) -> list[str]:
    out, i = [], 0
    while i < len(lines):
        m = IF_LINE.match(lines[i])
        v = _truth(m.group("cond")) if m else None
        if m and not isinstance(v, str):
            end = _block_end(lines, i, origin)
            if any(ln.strip().startswith("} else") for ln in lines[i + 1:end + 1]):
                raise TemplateError(f"{origin}: a constant `if` in an unrolled loop may not "
                                    f"have an else: {lines[i].strip()}")
            if v:
                out += _dedent(_decide_ifs(lines[i + 1:end], origin))
            i = end + 1
            continue
        if m and v != m.group("cond"):
            lines[i] = f"{m.group('indent')}if ({v}) {{"
        out.append(lines[i])
        i += 1
    return out


# ---- step 4: named registers ---------------------------------------------------------------

def _array_shape(typ: str, origin: str, n: int) -> tuple[list[int], str]:
    dims = []
    while typ.startswith("array<"):
        inner, _, size = typ[len("array<"):-1].rpartition(",")
        value = const_value(size)
        if value is None:
            raise TemplateError(f"{origin}:{n}: register array size {size.strip()!r} is not "
                                "a constant (use a {{placeholder}})")
        dims.append(value)
        typ = inner.strip()
    return dims, typ


def _zero(typ: str) -> str:
    return ZEROS.get(typ, f"{typ}()")


def _named_registers(lines: list[str], origin: str) -> list[str]:
    arrays, out = {}, []   # name -> (dims, element type, let-style)
    module_arrays = set(re.findall(r"var<(?:workgroup|storage|uniform|private)[^>]*>\s+(\w+)",
                                   "\n".join(lines)))
    for n, line in enumerate(lines, 1):
        m = ARRAY_DECL.match(line)
        if not m:
            out.append(line)
            continue
        dims, elem = _array_shape(m.group("type"), origin, n)
        let = (m.group("note") or "").startswith("@let")
        arrays[m.group("name")] = (dims, elem, let)
        if not let:
            names = [""]
            for d in dims:
                names = [f"{p}{k}" for p in names for k in range(d)]
            out += [f"{m.group('indent')}var {m.group('name')}{s} = {_zero(elem)};"
                    for s in names]
    result = []
    for n, line in enumerate(out, 1):   # code only: comments keep their text
        code, sep, comment = line.partition("//")
        for name, (dims, _, let) in arrays.items():
            code = _rename_elements(code, name, dims, f"{origin}:{n}")
            if let:
                code = re.sub(rf"^(\s*)({name}\d+) = ", r"\1let \2 = ", code)
        result.append(_local_swizzles(code, module_arrays | set(arrays)) + sep + comment)
    return result


def _bracket(text: str, start: int) -> int:
    """Index just past the `]` matching the `[` at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"[": 1, "]": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


def _rename_elements(text: str, name: str, dims: list[int], origin: str) -> str:
    out, pos = [], 0
    pattern = re.compile(rf"\b{name}\[")
    while True:
        m = pattern.search(text, pos)
        if not m:
            return "".join(out) + text[pos:]
        out.append(text[pos:m.start()])
        i, comps = m.end() - 1, []
        while i < len(text) and text[i] == "[":
            j = _bracket(text, i)
            value = const_value(text[i + 1:j - 1])
            if value is None:
                raise TemplateError(
                    f"{origin}: register array {name} indexed by "
                    f"{text[i + 1:j - 1]!r}, which is not constant: mark the loop around "
                    "it `// @unroll`")
            comps.append(value)
            i = j
        if len(comps) < len(dims):
            raise TemplateError(f"{origin}: register array {name} needs {len(dims)} indices")
        suffix = "".join(str(c) for c in comps[:len(dims)])
        swz = "".join("." + COMPONENTS[c] for c in comps[len(dims):])
        out.append(f"{name}{suffix}{swz}")
        pos = i


def _local_swizzles(text: str, arrays: set) -> str:
    """`v[2u]` of a function-local vector (not an array) -> `v.z`."""
    def swizzle(m):
        if m.group(1) in arrays:
            return m.group(0)
        return f"{m.group(1)}.{COMPONENTS[int(m.group(2))]}"
    return re.sub(r"\b(\w+)\[([0-3])u\]", swizzle, text)
