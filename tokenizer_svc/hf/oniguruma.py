"""tokenizer.json regexes for Python's `regex` with the meaning Oniguruma gives them.

`tokenizers` matches its Split patterns with Oniguruma (Ruby syntax, older Unicode tables);
`oniguruma_pattern` rewrites a pattern so that `regex` matches exactly what Oniguruma would,
from the "tokenizers" Unicode table read out of `tokenizers` itself (the kernels'
unicode_table.py). Used by the reference pre-tokenizer, the normalizers' Replace and the
tokenizer.json pipeline.
"""

from __future__ import annotations

from istanbul.shaders.kernels.bpe.reference import table_class_item
from istanbul.shaders.kernels.bpe.unicode_table import load_table


# Escapes that mean the same in Oniguruma (Ruby syntax) and Python's `regex`.
_PLAIN_ESCAPES = set("tnrfv\\^$.|?*+()[]{}-/'\"#&~!%,:;<=>@`_ ")
_ONIG_SHORTHANDS = {"s": "S", "d": "D", "w": "W"}


def oniguruma_pattern(pattern: str) -> str:
    """A tokenizer.json regex rewritten for Python's `regex` with Oniguruma's meaning.

    `tokenizers` matches Split patterns with Oniguruma (Ruby syntax, Unicode tables older than
    `regex`'s). The rewrite makes every Unicode-dependent construct explicit, from the
    "tokenizers" table read out of `tokenizers` itself: `\\p{X}` (every general category),
    `\\P{X}`, `\\s \\d \\w` and their negations, the ASCII letters of `(?i:...)` groups (their
    case folds); and Ruby's line anchors: `^`/`$` match at line starts/ends. Anything else
    that may differ between the engines (`\\b`, `\\h`, `\\R`, `\\X`, inline flags other than a
    simple `(?i:...)` group, negated classes inside classes, ...) raises ValueError naming it,
    so a tokenizer.json is refused at load time rather than tokenized differently.
    """
    from istanbul.shaders.kernels.bpe.unicode_table import CATEGORY_KEY
    table = load_table("tokenizers")
    body = _onig_class


    out, i, in_class, fold_depth = [], 0, False, None
    depth = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            if i + 1 >= n:
                raise ValueError(f"pattern {pattern!r} ends with a lone backslash")
            nxt = pattern[i + 1]
            if nxt in "pP":
                if pattern[i + 2:i + 3] != "{" or "}" not in pattern[i:]:
                    raise ValueError(f"unsupported escape \\{nxt} without braces in {pattern!r}")
                close = pattern.index("}", i)
                name = pattern[i + 3:close]
                negated = nxt == "P"
                if name.startswith("^"):
                    name, negated = name[1:], not negated
                if name not in CATEGORY_KEY:
                    raise ValueError(f"Unicode class {pattern[i:close + 1]!r} is not supported "
                                     f"(general categories only: {', '.join(CATEGORY_KEY)})")
                klass = body(CATEGORY_KEY[name])
                if negated and in_class:
                    raise ValueError(f"a negated class {pattern[i:close + 1]!r} inside [...] is "
                                     "not supported")
                out.append(klass if in_class else (f"[^{klass}]" if negated else f"[{klass}]"))
                i = close + 1
                continue
            if nxt in _ONIG_SHORTHANDS or nxt.lower() in _ONIG_SHORTHANDS:
                klass = body(_ONIG_SHORTHANDS[nxt.lower()])
                if nxt.isupper():
                    if in_class:
                        raise ValueError(f"\\{nxt} inside [...] is not supported")
                    out.append(f"[^{klass}]")
                else:
                    out.append(klass if in_class else f"[{klass}]")
                i += 2
                continue
            if nxt in "xu":  # \xHH, \x{H..}, \uHHHH: same code point in both engines
                end = pattern.index("}", i) + 1 if pattern[i + 2:i + 3] == "{" else \
                    i + (4 if nxt == "x" else 6)
                out.append(pattern[i:end])
                i = end
                continue
            if nxt in "Az":
                out.append("\\A" if nxt == "A" else "\\Z")  # Python's \Z is the very end
                i += 2
                continue
            if nxt not in _PLAIN_ESCAPES:
                raise ValueError(f"escape \\{nxt} in {pattern!r} is not supported (its meaning "
                                 "differs between Oniguruma and Python's regex or is unverified)")
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if ch == "[":
                raise ValueError(f"nested character class in {pattern!r} is not supported")
            if pattern[i:i + 2] in ("--", "&&", "||", "~~"):
                raise ValueError(f"{pattern[i:i + 2]!r} inside [...] in {pattern!r} is not "
                                 "supported (escape it)")
            if ch == "]":
                in_class = False
            elif fold_depth is not None and ch.isascii() and ch.isalpha():
                if pattern[i + 1:i + 2] == "-":
                    raise ValueError(f"a letter range inside (?i:...) in {pattern!r} is not "
                                     "supported")
                out.append("".join(f"\\U{c:08x}" for c in table.case_folds[ch.lower()]))
                i += 1
                continue
            out.append(ch)
            i += 1
            continue
        if ch == "[":
            in_class = True
            out.append(ch)
            i += 1
            if pattern[i:i + 1] == "^":
                out.append("^")
                i += 1
            if pattern[i:i + 1] == "]":  # a literal ] first in a class
                out.append("\\]")
                i += 1
            continue
        if ch == "(":
            depth += 1
            if pattern.startswith("(?i:", i):
                if fold_depth is not None:
                    raise ValueError(f"nested (?i:...) groups in {pattern!r}")
                fold_depth = depth
                out.append("(?:")
                i += 4
                continue
            if pattern.startswith("(?", i) and pattern[i + 2:i + 3] not in (":", "=", "!", "<",
                                                                           ">"):
                raise ValueError(f"inline flags {pattern[i:i + 5]!r}... in {pattern!r} are not "
                                 "supported (only (?i:...) groups)")
            if pattern.startswith("(?<", i) and pattern[i + 3:i + 4] not in ("=", "!"):
                raise ValueError(f"named groups in {pattern!r} are not supported")
            out.append(ch)
            i += 1
            continue
        if ch == ")":
            if fold_depth == depth:
                fold_depth = None
            depth -= 1
            out.append(ch)
            i += 1
            continue
        if ch == "$":
            out.append("(?![^\\n])")  # Ruby: end of any line
            i += 1
            continue
        if ch == "^":
            out.append("(?<![^\\n])")  # Ruby: start of any line
            i += 1
            continue
        if fold_depth is not None and ch.isascii() and ch.isalpha():
            folds = table.case_folds[ch.lower()]
            out.append("[" + "".join(f"\\U{c:08x}" for c in folds) + "]")
            i += 1
            continue
        out.append(ch)
        i += 1
    if in_class:
        raise ValueError(f"unterminated character class in {pattern!r}")
    return "(?V1)" + "".join(out)


def _onig_class(key: str) -> str:
    """Oniguruma's class `key` (the "tokenizers" table) as a VERSION1 class item."""
    return table_class_item("tokenizers", key)
