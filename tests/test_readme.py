"""Every command of the README, run as written (and every command of docs/, checked).

- Quick start: the two set-up commands are the scripts, `.ci/run` runs the test one, and the
  demo's flags exist (`tests/test_demo.py` runs a shortened demo).
- Every `istanbul ...` line in a ```bash block of README.md and docs/*.md, and every
  `istanbul ...` quoted in their prose, names a subcommand and flags that the command's parser
  has; every `istanbul.NAME` in a ```python block exists; every repository path and link they
  name exists; docs/configuration.md's job spec validates; docs/kernels.md's engine example
  runs.
- The README's three uses run in subprocesses through an `istanbul` on PATH (the checkout's
  `python -m istanbul`): the Python drop-in and the encode/decode lines, the service with its
  client, and vocab train -> serve -> prepare -> submit -> trainer -> watch -> generate. Only
  sizes shrink (each substitution must still find its text in the README) and ports are free
  ones; a `# [ids]` or `# 'text'` comment after a line is checked against what it gives.
Real vocabularies (o200k_base, cl100k_base) come from ../shared/vocab.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from .conftest import REPO, shared_vocab

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))


# ---- reading the documents ----------------------------------------------------------------------

def sections(path: Path) -> dict[str, str]:
    """'## heading' -> its text (up to the next '## ')."""
    text = path.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.M)
    return {part.split("\n", 1)[0].strip(): part for part in parts[1:]}


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S)


def section(path: Path, prefix: str) -> str:
    found = [body for title, body in sections(path).items() if title.startswith(prefix)]
    assert len(found) == 1, f"{path.name}: no single section '## {prefix}...'"
    return found[0]


def shell_lines(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments kept."""
    return [line for line in re.sub(r"\\\n\s*", " ", block).splitlines() if line.strip()]


def split_comment(line: str) -> tuple[str, str]:
    """(command, comment) of a shell or Python line: the first '#' outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


# ---- flags: every istanbul command line names real subcommands and flags ------------------------

def parser() -> argparse.ArgumentParser:
    from istanbul.cli import build_parser
    return build_parser()


def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def istanbul_invocations(line: str) -> list[list[str]]:
    """The argument lists of every `istanbul ...` in a shell line (after `$(`, `|`, `&&`)."""
    command, _ = split_comment(line)
    found = []
    for match in re.finditer(r"(?:^|[\s($|;&])istanbul\s+([^|;&)<>]*)", command):
        try:
            words = shlex.split(match.group(1))
        except ValueError:
            words = match.group(1).split()
        found.append(words)
    return found


def check_invocation(root: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """Problems with `istanbul WORDS`: an unknown subcommand or flag."""
    target, path, problems = root, ["istanbul"], []
    for word in words:
        if word.startswith("-"):
            continue
        subs = subparsers(target)
        if not subs:
            break
        if word not in subs and re.fullmatch(r"[A-Z][A-Z_]*", word):
            break                               # a placeholder: `istanbul COMMAND --help`
        if word not in subs:
            problems.append(f"`{' '.join(path)}` has no subcommand {word!r}")
            return problems
        target = subs[word]
        path.append(word)
    known = {s for a in target._actions for s in a.option_strings}
    for word in words:
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
            flag = word.split("=", 1)[0]
            if flag not in known:
                problems.append(f"`{' '.join(path)}` has no option {flag}")
    return problems


def all_shell_blocks() -> list[tuple[str, str]]:
    out = []
    for path in [README, *DOCS]:
        for block in code_blocks(path.read_text(encoding="utf-8"), "bash"):
            out.extend((path.name, line) for line in shell_lines(block))
    return out


def inline_commands() -> list[tuple[str, str]]:
    """`istanbul ...` code spans in the prose (outside code blocks)."""
    out = []
    for path in [README, *DOCS]:
        text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
        out += [(path.name, span) for span in re.findall(r"`(istanbul [^`]+)`", text)
                if "error:" not in span]                 # an error message quoted
    return out


def test_every_istanbul_command_in_the_readme_and_docs_names_real_flags():
    root = parser()
    problems, seen = [], 0
    for name, line in all_shell_blocks() + inline_commands():
        for words in istanbul_invocations(line):
            seen += 1
            problems += [f"{name}: {line.strip()}\n    {p}" for p in check_invocation(root, words)]
    assert seen > 40, "the command lines were not found"
    assert not problems, "\n".join(problems)


def test_the_flag_check_catches_a_made_up_flag():
    root = parser()
    assert check_invocation(root, ["train", "--data", "web", "--steps", "3"]) == []
    assert check_invocation(root, ["train", "--stesp", "3"])
    assert check_invocation(root, ["kernels", "chek"])
    assert istanbul_invocations('JOB=$(istanbul submit --dataset web)  # x') == [
        ["submit", "--dataset", "web"]]


def test_every_python_block_compiles_and_names_real_api():
    import istanbul                   # its names are lazy: __all__ lists them, nothing imported
    missing = []
    for path in [README, *DOCS]:
        for block in code_blocks(path.read_text(encoding="utf-8"), "python"):
            tree = ast.parse(block)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id == "istanbul" and node.attr not in istanbul.__all__):
                    missing.append(f"{path.name}: istanbul.{node.attr}")
    assert not missing, missing


# ---- quick start: the two set-up commands --------------------------------------------------------

def test_quick_start_is_the_demo_and_the_test_scripts_ci_runs():
    block = code_blocks(section(README, "Quick start"), "bash")[0]
    commands = [split_comment(line)[0] for line in shell_lines(block)]
    assert commands == ["scripts/demo.sh", "scripts/test.sh"]
    for script in commands:
        assert (REPO / script).stat().st_mode & stat.S_IXUSR, f"{script} is not executable"
    demo = (REPO / "scripts/demo.sh").read_text(encoding="utf-8")
    assert re.search(r'^exec \.venv/bin/istanbul demo "\$@"$', demo, flags=re.M)
    test = (REPO / "scripts/test.sh").read_text(encoding="utf-8")
    assert re.search(r'^\s*exec \.venv/bin/python -m pytest -q "\$@"$', test, flags=re.M)
    ci = (REPO / ".ci/run").read_text(encoding="utf-8")
    assert re.search(r"^[A-Z_=0-9 ]*bash scripts/test\.sh$", ci, flags=re.M), \
        ".ci/run must run exactly the README's test command"
    # the arguments the README passes on
    text = section(README, "Quick start")
    for script, words in re.findall(r"`(scripts/demo\.sh) ([^`]*)`", text):
        assert check_invocation(parser(), ["demo", *shlex.split(words)]) == []
    assert "`scripts/test.sh -k " in text


# ---- running the README's uses -------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def shell_env(tmp_path):
    """An environment whose `istanbul` is this checkout's, with a private Redis data dir."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "istanbul"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m istanbul "$@"\n')
    shim.chmod(0o755)
    vocab = shared_vocab("o200k_base.tiktoken").parent
    shared_vocab("cl100k_base.tiktoken")
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                PYTHONPATH=str(REPO), ISTANBUL_VOCAB_DIR=str(vocab),
                ISTANBUL_DATA=str(tmp_path / "data"),
                XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))


def literal(comment: str):
    """The Python/JSON literal a comment starts with ('[1, 2], as tiktoken' -> [1, 2])."""
    match = re.match(r"(\[[^\]]*\]|'[^']*')", comment)
    return ast.literal_eval(match.group(1)) if match else None


def checked_python(block: str) -> str:
    """The block with each `expr  # LITERAL` / `name = expr  # LITERAL` line asserted."""
    out = []
    for line in block.splitlines():
        code, comment = split_comment(line)
        expected = literal(comment)
        if expected is None or not code.strip():
            out.append(line)
            continue
        indent = code[:len(code) - len(code.lstrip())]
        node = ast.parse(code.strip()).body[0]
        if isinstance(node, ast.Expr):
            out.append(f"{indent}assert ({code.strip()}) == {expected!r}, {code.strip()!r}")
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out.append(code)
            name = node.targets[0].id
            out.append(f"{indent}assert {name} == {expected!r}, ({name}, {code.strip()!r})")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def run_python(block: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", checked_python(block)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (block, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def check_output(line: str, stdout: str) -> None:
    """A line's `# [ids]` or `# text` comment against what it printed."""
    _, comment = split_comment(line)
    if comment.startswith("["):
        assert json.loads(stdout.strip().splitlines()[-1]) == literal(comment), (line, stdout)


def substitute(text: str, replacements: list[tuple[str, str]]) -> str:
    for old, new in replacements:
        assert old in text, f"the README no longer holds {old!r}: update this test"
        text = text.replace(old, new)
    return text


class Shell:
    """A README block run by bash in its own session; what it leaves in the background (a
    server, a daemon) is stopped with the whole session at the end."""

    def __init__(self, env: dict, cwd: Path):
        self.env, self.cwd, self.procs = env, cwd, []

    def run(self, script: str, timeout: float = 600) -> str:
        # Output into files, not pipes: what the script leaves running keeps them open.
        n = len(self.procs)
        out_path, err_path = self.cwd / f".shell{n}.out", self.cwd / f".shell{n}.err"
        with open(out_path, "w") as out_file, open(err_path, "w") as err_file:
            proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=self.cwd,
                                    env=self.env, stdout=out_file, stderr=err_file,
                                    start_new_session=True)
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            # A server that died leaves `until istanbul health ...` looping: stop at its
            # traceback or error line instead of at the timeout.
            err = err_path.read_text()
            crashed = ("Traceback (most recent call last)" in err
                       or re.search(r"^istanbul [a-z ]+: error:", err, flags=re.M))
            if crashed or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"{'crashed' if crashed else 'timed out'}: {script}\n"
                                     f"{out_path.read_text()[-2000:]}\n"
                                     f"{err_path.read_text()[-3000:]}")
            time.sleep(0.5)
        out, err = out_path.read_text(), err_path.read_text()
        assert proc.returncode == 0, (script, out[-2000:], err[-3000:])
        return out

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for proc in self.procs:      # the session's members drain and exit on SIGTERM
            try:
                proc.wait(timeout=30)    # bash itself, reaped (a zombie stays in the session)
            except subprocess.TimeoutExpired:
                pass
            try:
                subprocess.run(["bash", "-c", f"while pgrep -s {proc.pid} >/dev/null; do sleep 0.2; done"],
                               timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def shell(shell_env, tmp_path):
    sh = Shell(shell_env, tmp_path)
    yield sh
    sh.stop()


def test_use_1_the_tiktoken_drop_in_and_the_encode_decode_lines(shell_env, tmp_path):
    text = section(README, "1. ")
    (python,) = code_blocks(text, "python")
    run_python(python, shell_env, tmp_path)
    (block,) = code_blocks(text, "bash")
    lines = shell_lines(block)
    assert [istanbul_invocations(line)[0][0] for line in lines] == ["encode", "decode"]
    for line in lines:
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=tmp_path,
                             env=shell_env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, (line, out.stderr[-3000:])
        check_output(line, out.stdout)
    assert out.stdout == split_comment(lines[-1])[1]           # decode prints the text as is


def test_use_2_the_service_and_its_client(shell, shell_env, tmp_path):
    text = section(README, "2. ")
    port = str(free_port())
    (block,) = code_blocks(text, "bash")
    lines = shell_lines(substitute(block, [("50051", port)]))
    assert [istanbul_invocations(line)[0][0] for line in lines] == ["serve", "health", "encode"]
    out = shell.run("\n".join(lines), timeout=300)
    check_output(lines[-1], out)
    (python,) = code_blocks(text, "python")
    run_python(substitute(python, [("50051", port)]), shell_env, tmp_path)


def test_use_3_train_through_the_service_queue_and_daemon(shell, tmp_path):
    text = section(README, "3. ")
    (block,) = code_blocks(text, "bash")
    port = str(free_port())
    block = substitute(block, [
        ("50052", port),
        ("--size 8192", "--size 300"),
        ("--model small --steps 1000 --checkpoint-every 100",
         "--model tiny --steps 4 --checkpoint-every 2 --batch 2 --seq 32"),
    ])
    lines = shell_lines(block)
    assert [istanbul_invocations(line)[0][0] for line in lines] == [
        "vocab", "serve", "health", "prepare", "submit", "trainer", "watch", "generate"]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "heapq.py", "bisect.py", "shlex.py"):
        shutil.copy(stdlib / name, corpus / name)
    out = shell.run("\n".join(lines) + '\necho "JOB=$JOB"', timeout=900)
    assert (tmp_path / "web.tiktoken").is_file() and (tmp_path / "web.tiktoken.json").is_file()
    job = re.search(r"^JOB=(\S+)$", out, flags=re.M).group(1)
    assert (tmp_path / "ckpt" / job / "latest").exists()
    assert "def main(" in out


# ---- every path the README and docs name exists ---------------------------------------------------

TOP = ("shaders", "tokenizer_svc", "trainer_svc", "istanbul", "bench", "dev", "deploy", "scripts",
       "tests", "proto", "docs")
PATH_RE = re.compile(rf"`((?:{'|'.join(TOP)})/[^`\s]*)`")
LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def named_paths(path: Path) -> list[Path]:
    text = path.read_text(encoding="utf-8")
    found = [REPO / p.rstrip(".,;:") for p in PATH_RE.findall(text)
             if not re.search(r"[*<{]|[A-Z]{3,}", p)]         # globs and placeholders (DIR, JOB)
    found += [(path.parent / link).resolve() for link in LINK_RE.findall(text)
              if not re.match(r"[a-z]+://", link)]
    return found


# Files a reader makes.
NOT_IN_THE_TREE = {"deploy/.env", "deploy/tokens.txt"}


def test_every_path_the_readme_and_docs_name_exists():
    missing = []
    for doc in [README, REPO / "NOTES.md", *DOCS]:
        for p in named_paths(doc):
            name = str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)
            if not p.exists() and name not in NOT_IN_THE_TREE:
                missing.append(f"{doc.relative_to(REPO)}: {name}")
    assert not missing, "\n".join(missing)


def test_the_job_spec_file_of_the_docs_is_a_valid_spec():
    import textwrap
    import tomllib

    from trainer_svc.jobs.queue import JobSpec
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"^ *```toml\n(.*?)^ *```", text, flags=re.M | re.S)
    spec = JobSpec(**tomllib.loads(textwrap.dedent(block)))
    assert spec.model_overrides and spec.checkpoint_every


def test_the_engine_example_of_docs_kernels_runs(tmp_path):
    (block,) = code_blocks(section(REPO / "docs" / "kernels.md", "The engine"), "python")
    env = dict(os.environ, PYTHONPATH=str(REPO),
               XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    proc = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["[", "0.", "2.", "4.", "6.", "8.", "10.", "12.", "14.",
                                   "16.", "18.]"]


def test_the_rpc_table_of_docs_service_is_the_protocol():
    proto = (REPO / "proto/istanbul/tokenizer/v1/tokenizer.proto").read_text(encoding="utf-8")
    rpcs = set(re.findall(r"^\s*rpc (\w+)", proto, flags=re.M))
    table = section(REPO / "docs" / "service.md", "RPCs")
    named = {name for row in re.findall(r"^\| (`[^|]*)\|", table, flags=re.M)
             for name in re.findall(r"`(\w+)`", row)}
    assert named - {"tei"} >= rpcs and not (named - rpcs - {"tei"}), (named, rpcs)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_every_anchor_the_readme_and_docs_link_to_is_a_heading():
    broken, checked = [], 0
    for doc in [README, REPO / "NOTES.md", *DOCS]:
        for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)#([^)]+)\)",
                                         doc.read_text(encoding="utf-8")):
            page = (doc.parent / target).resolve()
            headings = re.findall(r"^#+ (.*)$", page.read_text(encoding="utf-8"), flags=re.M)
            checked += 1
            if anchor not in {slug(h) for h in headings}:
                broken.append(f"{doc.name}: {target}#{anchor}")
    assert checked >= 4 and not broken, (checked, broken)
