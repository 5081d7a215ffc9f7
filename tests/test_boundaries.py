"""The architecture holds: import-linter's contracts in pyproject.toml (the two sides and
the layers) are kept, breaking one is caught, and the running dashboard imports no torch
(the CLI's handlers are imported by name at run time, which static analysis cannot see)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py"))
STATUSES = ("completed", "running", "diverged", "failed")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the project's contracts over the package under `root`."""
    script = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(no_cache=True))"
    )
    return subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120
    )


def test_every_import_contract_is_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout and "BROKEN" not in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("dashboard/tables.py", "import torch", "Only the training side imports torch"),
        ("views/charts/series.py", "import lightning", "Only the training side imports torch"),
        ("training/model.py", "import streamlit", "Only the dashboard imports streamlit"),
        ("core/spec.py", "from blockviz.store import RunStore", "Each layer imports only"),
        (
            "core/studies/outcomes.py",
            "from blockviz.core.studies import verdicts",
            "the verdicts sit",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    shutil.copytree(
        ROOT / "blockviz", tmp_path / "blockviz", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "blockviz" / module
    target.write_text(target.read_text() + f"\n{line}\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert f"{contract}" in result.stdout and "BROKEN" in result.stdout


# Every page rendered in one process, as a user would open them, then its modules checked.
NO_TORCH_SCRIPT = """
import json, sys
from streamlit.testing.v1 import AppTest
from blockviz.store import RunStore, StoreError, StoreLocked, default_store_path
from tests import fakes
store = RunStore(default_store_path())
fakes.populate(store, n_runs=4, n_steps=40, n_layer=2, statuses={statuses!r})
store.close()
at = AppTest.from_file({app!r}, default_timeout=60).run()
problems = [str(e.value) for e in at.exception]
for page in {pages!r}:
    at.switch_page(page).run()
    problems += [page + ": " + str(e.value) for e in at.exception]
heavy = sorted(m for m in ("torch", "lightning", "pytorch_lightning") if m in sys.modules)
print(json.dumps({{"heavy": heavy, "problems": problems}}))
"""


@pytest.mark.slow
def test_the_running_dashboard_imports_no_torch() -> None:
    script = NO_TORCH_SCRIPT.format(statuses=STATUSES, app=APP, pages=PAGES)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["problems"] == []
    assert report["heavy"] == [], f"the UI imported {report['heavy']}"
    assert {"pages/live.py", "pages/compare.py"} <= set(PAGES)


# ---------------------------------------------------------------------------- module shape

MAX_MODULE_LINES = 500
# The packages that gather their public API in __init__ (documented in docs/architecture.md).
API_PACKAGES = {"blockviz/views/charts/__init__.py", "blockviz/store/__init__.py"}


def _sources() -> list[Path]:
    return sorted([*(ROOT / "blockviz").rglob("*.py"), *(ROOT / "pages").glob("*.py")])


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in _sources()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, "split these by concern"


MAX_PAGE_LINES = 200  # a page lays out; its parts grow in dashboard/<page>/ (issue 36)


def test_pages_stay_thin() -> None:
    long = {
        page: n
        for page in PAGES
        if (n := len((ROOT / page).read_text(encoding="utf-8").splitlines())) > MAX_PAGE_LINES
    }
    assert long == {}, "move the parts into blockviz/dashboard/<page>/"


def test_no_private_name_crosses_a_module_boundary() -> None:
    import ast

    crossing = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("blockviz"):
                crossing += [
                    f"{path.relative_to(ROOT)}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    assert crossing == [], "give a name two modules share a public name"


def test_no_module_re_exports_what_another_defines() -> None:
    """A name has one import path: no `# noqa: F401` re-export and no `x as x`, outside the
    two packages that gather their API."""
    offenders = []
    for path in _sources():
        where = path.relative_to(ROOT).as_posix()
        if where in API_PACKAGES:
            continue
        text = path.read_text(encoding="utf-8")
        if "noqa: F401" in text or "noqa: F403" in text:
            offenders.append(where)
        for line in text.splitlines():
            words = line.replace(",", " ").split()
            if "as" in words and words.index("as") > 0:
                i = words.index("as")
                if i + 1 < len(words) and words[i - 1] == words[i + 1]:
                    offenders.append(f"{where}: {line.strip()}")
    assert offenders == []
