"""The numbers docs/development.md quotes about the test suite, measured instead of typed.

    .venv/bin/python scripts/test_report.py           # run the suite twice, timed; write
    .venv/bin/python scripts/test_report.py --counts  # only the counts: no run, times kept
    .venv/bin/python scripts/test_report.py --check   # exit 1 if the block's counts are stale

It runs pytest as `make test-fast` and then `make test` do (the Makefile's XDIST and FAST
arguments; not `make` itself, which would first install the venv), then rewrites the block
between BEGIN and END in docs/development.md: how many tests each target collects, each
one's wall time, the machine (cores, CPU, load average just before) and the date, and
`make test`'s 15 slowest tests. A failing run writes nothing and exits 1. The counts are
deterministic, and tests/test_test_layout.py checks them with --check; the times are true
only of the run the block names.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "development.md"
MAKEFILE = ROOT / "Makefile"
BEGIN = "<!-- BEGIN test-report: written by scripts/test_report.py; do not edit by hand -->"
END = "<!-- END test-report -->"
SLOWEST = 15
# What pytest --collect-only ends with: "2885 tests collected" or, where -m deselects some,
# "2547/2885 tests collected (338 deselected)".
_COLLECTED = re.compile(r"^(?:(\d+)/)?(\d+) tests? collected", re.MULTILINE)
_COUNTS = re.compile(
    r"`make test` collects \*\*([\d,]+)\*\* tests; `make test-fast`, \*\*([\d,]+)\*\*"
)


def counts_text(counts: tuple[int, int]) -> str:
    """The block's first words, which _COUNTS reads back."""
    return f"`make test` collects **{counts[0]:,}** tests; `make test-fast`, **{counts[1]:,}**"


def counts_line(counts: tuple[int, int]) -> str:
    """The block's first line."""
    return f"- {counts_text(counts)}\n  (the others are marked `slow` or `browser`)."


def make_variable(name: str) -> list[str]:
    """The arguments a `NAME := ...` line of the Makefile holds."""
    found = re.search(rf"^{name} :?= (.*)$", MAKEFILE.read_text(encoding="utf-8"), re.MULTILINE)
    if found is None:
        sys.exit(f"the Makefile has no `{name} := ...` line")
    return shlex.split(found.group(1))


def collected() -> tuple[int, int]:
    """How many tests `make test` and `make test-fast` collect: one --collect-only run with
    test-fast's marker expression reports both."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*command, *make_variable("FAST")], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    found = _COLLECTED.search(done.stdout)
    if done.returncode != 0 or found is None:
        sys.exit(f"collecting the tests failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    fast, everything = found.group(1), found.group(2)
    return int(everything), int(fast or everything)


def current_block() -> str:
    """The block as docs/development.md has it now, BEGIN and END included."""
    doc = DOC.read_text(encoding="utf-8")
    if BEGIN not in doc or END not in doc:
        sys.exit(f"{DOC.relative_to(ROOT)} has no {BEGIN} ... {END} block")
    return doc[doc.index(BEGIN) : doc.index(END) + len(END)]


def quoted_counts() -> tuple[int, int] | None:
    """The two counts the block in docs/development.md quotes; None before the first run."""
    found = _COUNTS.search(current_block())
    if found is None:
        return None
    return int(found.group(1).replace(",", "")), int(found.group(2).replace(",", ""))


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_suite(*extra: str) -> tuple[int, float, str]:
    """Run `make test`'s pytest with extra arguments; its exit status, seconds and summary."""
    command = [sys.executable, "-m", "pytest", *make_variable("XDIST"), *extra]
    command += ["-q", "-p", "no:cacheprovider"]
    print("$", shlex.join(command), flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    print(done.stdout[-5000:])
    last = done.stdout.strip().splitlines()[-1:] or [""]
    # "= 2880 passed, 5 skipped in 431.20s (0:07:11) =" -> "2880 passed, 5 skipped"
    return done.returncode, seconds, re.sub(r" in [\d.]+s.*", "", last[0].strip("= "))


def slowest(junit: Path) -> list[tuple[float, str]]:
    """The SLOWEST tests of a JUnit report (setup, call and teardown), slowest first."""
    cases = ET.parse(junit).getroot().iter("testcase")
    timed = [
        (float(case.get("time", 0)), f"{case.get('classname')}::{case.get('name')}")
        for case in cases
    ]
    return sorted(timed, reverse=True)[:SLOWEST]


def test_id(classname_and_name: str) -> str:
    """tests.cli.test_x::test_y (JUnit's spelling) -> tests/cli/test_x.py::test_y; a class
    inside a module stays after the file's `::`."""
    classname, name = classname_and_name.split("::", 1)
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (ROOT / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name])
    return classname_and_name


def minutes(seconds: float) -> str:
    """431.2 -> '7 min 11 s'."""
    whole, rest = divmod(round(seconds), 60)
    return f"{whole} min {rest:02d} s"


def block(
    counts: tuple[int, int],
    timed: dict[str, tuple[float, str, tuple[float, float, float]]],
    top: list[tuple[float, str]],
) -> str:
    """The block docs/development.md shows, BEGIN and END included; timed holds each make
    target's seconds, pytest summary and the load average just before it started."""
    cores = os.cpu_count()
    took = "\n".join(
        f"  - `make {target}`: **{minutes(seconds)}** ({summary});\n    load average just "
        f"before it {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (1, 5, 15 min)"
        for target, (seconds, summary, load) in timed.items()
    )
    today = datetime.date.today().isoformat()
    rows = "\n".join(f"| {s:.1f} | `{test_id(name)}` |" for s, name in top)
    return f"""{BEGIN}
{counts_line(counts)}
- Measured {today} on {cores} cores ({cpu_model()}); pytest's wall time,
  without make's setup:
{took}
- `make test`'s {SLOWEST} slowest tests, in seconds of setup, call and teardown (a module's shared
  fixture counts in its first test):

| s | test |
|---:|---|
{rows}
{END}"""


def write_block(text: str) -> None:
    """Put text in place of the block in docs/development.md."""
    DOC.write_text(DOC.read_text(encoding="utf-8").replace(current_block(), text), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--counts",
        action="store_true",
        help="rewrite only the counts (a --collect-only run); keep the measured times",
    )
    what.add_argument(
        "--check",
        action="store_true",
        help="run nothing but --collect-only; exit 1 if the block's counts are not the suite's",
    )
    args = parser.parse_args(argv)
    counts = collected()
    if args.check:
        quoted = quoted_counts()
        if quoted != counts:
            print(
                f"{DOC.relative_to(ROOT)} quotes {quoted} tests (make test, make test-fast); "
                f"they collect {counts}: run scripts/test_report.py --counts",
                file=sys.stderr,
            )
            return 1
        return 0
    if args.counts:
        if quoted_counts() is None:  # an empty block: the counts alone
            write_block(f"{BEGIN}\n{counts_line(counts)}\n{END}")
        else:
            write_block(_COUNTS.sub(counts_text(counts), current_block()))
        print(f"wrote {DOC.relative_to(ROOT)}: {counts[0]:,} and {counts[1]:,} tests")
        return 0
    timed = {}
    with tempfile.TemporaryDirectory() as folder:
        junit = Path(folder) / "junit.xml"
        targets = {"test-fast": make_variable("FAST"), "test": [f"--junitxml={junit}"]}
        for target, extra in targets.items():
            load = os.getloadavg()
            code, seconds, summary = run_suite(*extra)
            if code != 0:
                print(f"make {target} failed ({summary}); {DOC.name} is unchanged", file=sys.stderr)
                return 1
            timed[target] = (seconds, summary, load)
        top = slowest(junit)
    write_block(block(counts, timed, top))
    print(f"wrote {DOC.relative_to(ROOT)}: {counts[0]:,} tests, {timed['test'][0]:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
