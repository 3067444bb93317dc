"""The training commands on one machine (docs/training.md, "On one machine, no server", where
the README sends a reader), run as shown in subprocesses.

Only the sizes shrink for CI: every step count (`--steps`, `--checkpoint-every`,
`--eval-every`) is divided by 100 and the train commands get `--batch 2 --seq 32
--eval-batches 1`; files, flags and their order are the page's. a.py and b.py are two
standard-library sources. Needs the real gpt2 vocabulary (../shared/vocab).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from .conftest import REPO, shared_vocab

SCALED = ("--steps", "--checkpoint-every", "--eval-every")


def readme_commands() -> list[list[str]]:
    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    section = text[text.index("## On one machine, no server"):]
    block = section[section.index("```bash\n") + 8:]
    block = block[:block.index("```")]
    joined = re.sub(r"\\\n\s*", " ", block)
    commands = []
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            commands.append(shlex.split(line))
    return commands


def small(argv: list[str]) -> list[str]:
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg in SCALED:
            out[i + 1] = str(max(1, int(out[i + 1]) // 100))
    if out[1] == "train":
        out += ["--batch", "2", "--seq", "32", "--eval-batches", "1"]
    return out


def test_every_training_command_of_the_readme_runs(tmp_path):
    gpt2 = shared_vocab("gpt2.tiktoken")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    shutil.copy(stdlib / "textwrap.py", tmp_path / "a.py")
    shutil.copy(stdlib / "heapq.py", tmp_path / "b.py")
    env = dict(os.environ, ISTANBUL_VOCAB_DIR=str(gpt2.parent), PYTHONPATH=str(REPO),
               XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    commands = readme_commands()
    assert [c[:2] for c in commands] == [["istanbul", "prepare"], ["istanbul", "train"],
                                        ["istanbul", "train"], ["istanbul", "train"],
                                        ["istanbul", "generate"], ["istanbul", "export"]]
    outputs = []
    for argv in commands:
        argv = small(argv)
        proc = subprocess.run([sys.executable, "-m", "istanbul", *argv[1:]], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])
        outputs.append(proc.stdout)
    assert sorted(p.name for p in (tmp_path / "web").glob("shard_*.shard"))
    assert "step 2/2 loss=" in outputs[1] and "eval_loss=" in outputs[1]
    assert "resumed from" in outputs[2] and "step 3/3 loss=" in outputs[2]
    assert "step 2/2 loss=" in outputs[3]
    assert outputs[4].startswith("def main(")
    assert (tmp_path / "out" / "hf" / "config.json").is_file()
