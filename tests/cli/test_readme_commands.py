"""README's commands work as written on a fresh clone after `make run` (issue 35).

Each command README tells a reader to type (its bash blocks, and inline code that starts
with `.venv/bin/`, `python` or `make`) is checked without running it: it runs in the `.venv`
that `make run` made; a blockviz command parses with the real argument parser (a renamed
flag fails here); a `make` target and variable exist in the Makefile; a script exists; and
a run a command names was created, under that name, by an earlier command.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex

import pytest

from blockviz.cli import build_parser
from tests.helpers import ROOT

FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
TYPED = (".venv/bin/", "python", "make ")
# Commands whose positional arguments name runs, and the argument that holds them.
RUN_ARGUMENTS = {"show": "run", "stop": "run", "fork": "run", "replay": "run", "export": "runs"}


def typed_commands(text: str, inline: bool = True) -> list[str]:
    """The commands a Markdown page tells its reader to type, in the page's order: each
    line of a bash block (continuations joined), and (`inline`) inline code that starts
    like one."""
    found: list[tuple[int, str]] = []
    for block in FENCED.finditer(text):
        if block.group(1) == "bash":
            lines = block.group(2).replace("\\\n", " ").splitlines()
            found += [(block.start(), line) for line in lines if line.strip()]
    if not inline:
        return [command for _, command in found]
    prose = FENCED.sub(lambda m: " " * len(m.group(0)), text)
    found += [
        (m.start(), m.group(1)) for m in INLINE.finditer(prose) if m.group(1).startswith(TYPED)
    ]
    return [command for _, command in sorted(found, key=lambda pair: pair[0])]


def makefile_names() -> tuple[set[str], set[str]]:
    """The Makefile's targets and its variables."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", text, re.MULTILINE))
    variables = set(re.findall(r"^(\w+)\s*[?:]?=", text, re.MULTILINE))
    return targets, variables


def parse_blockviz(argv: list[str], command: str) -> argparse.Namespace | None:
    """The flags of a blockviz command, parsed as `python -m blockviz` would (None for
    --help); the test fails naming the command when they do not parse."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exit_:
        assert exit_.code == 0, f"README's `{command}` does not parse (see the line above)"
        return None


def check(command: str, created: set[str]) -> None:
    """Fail unless `command` works as written after `make run`; add the runs it names."""
    tokens = shlex.split(command, comments=True)
    launcher, rest = tokens[0], tokens[1:]
    if launcher == "make":
        targets, variables = makefile_names()
        for word in rest:
            name, is_variable, _ = word.partition("=")
            known = variables if is_variable else targets
            assert name in known, f"README's `{command}`: the Makefile has no {name}"
        return
    assert launcher == ".venv/bin/python", (
        f"README's `{command}` does not run in the .venv that `make run` made"
    )
    if rest[0] != "-m":
        assert (ROOT / rest[0]).is_file(), f"README's `{command}`: no file {rest[0]}"
        return
    if rest[1] != "blockviz":
        assert importlib.util.find_spec(rest[1]), f"README's `{command}`: no module {rest[1]}"
        return
    args = parse_blockviz(rest[2:], command)
    if args is None:
        return
    named = getattr(args, RUN_ARGUMENTS.get(args.command, "resume"), None)
    for run in [named] if isinstance(named, str) else named or []:
        assert run in created or run.isupper(), (
            f"README's `{command}` names run {run!r}, which no command before it creates "
            f"(they create {sorted(created)})"
        )
    if getattr(args, "name", None) and args.command in ("train", "fork", "replay"):
        created.add(args.name)


def test_every_readme_command_works_as_written_after_make_run():
    commands = typed_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(commands) >= 10, commands
    created: set[str] = set()
    for command in commands:
        check(command, created)
    assert {"pre-starter", "post-starter", "no-norm-starter"} <= created


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("python -m blockviz runs", "does not run in the .venv"),
        ("blockviz runs", "does not run in the .venv"),
        (".venv/bin/python -m blockviz train --n_layers 2", "does not parse"),
        (".venv/bin/python -m blockviz fork post-starter --step 100", "names run 'post-starter'"),
        (".venv/bin/python benchmarks/no_such_script.py", "no file"),
        ("make serve", "the Makefile has no serve"),
        ("make run HOST=0.0.0.0", "the Makefile has no HOST"),
    ],
)
def test_the_check_refuses_what_would_fail(command, problem):
    with pytest.raises(AssertionError, match=re.escape(problem)):
        check(command, set())


def test_commands_are_found_in_order_with_continuations_and_comments():
    page = (
        "Run `make run`, then `.venv/bin/python -m blockviz train --name a`:\n\n"
        "```bash\n.venv/bin/python -m blockviz fork a --step 1 \\\n    --lr 0.1  # a comment\n```\n"
        "and `blockviz show` in prose is a mention.\n"
    )
    assert typed_commands(page) == [
        "make run",
        ".venv/bin/python -m blockviz train --name a",
        ".venv/bin/python -m blockviz fork a --step 1      --lr 0.1  # a comment",
    ]
    created: set[str] = set()
    for command in typed_commands(page):
        check(command, created)
    assert created == {"a"}


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_no_bash_block_runs_a_python_outside_the_venv(page):
    """README's inline commands are checked above; a page's inline code may also say what
    the dashboard runs (`python -m blockviz train --config ...`), so only its bash blocks,
    which a reader copies, are held to the .venv here (an exported script, run by any
    Python with torch, is not blockviz's)."""
    path = ROOT / page if page == "README.md" else ROOT / "docs" / page
    for command in typed_commands(path.read_text(encoding="utf-8"), inline=False):
        words = [*command.split(), ""]
        if words[0] in ("python", "python3"):
            module = words[2] if words[1] == "-m" else ""
            runs_blockviz = module.startswith("blockviz") or (ROOT / words[1]).is_file()
        else:
            runs_blockviz = words[0] == "blockviz"
        assert not runs_blockviz, f"{page}: `{command}` does not run in the .venv"
