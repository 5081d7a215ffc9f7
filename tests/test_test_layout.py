"""The test suite's own layout: no test module imports another (shared helpers live in
tests/helpers.py), and collecting the tests starts no process (no training)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def imported_modules(tree: ast.AST) -> list[str]:
    """Every module an `import` or `from ... import` names anywhere in the tree (inside
    functions too), with `from tests import x` read as `tests.x`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.append(base)
            found += [f"{base.rstrip('.')}.{alias.name}".lstrip(".") for alias in node.names]
    return found


def is_test_module(module: str) -> bool:
    return module.rsplit(".", 1)[-1].startswith("test_")


def test_no_test_module_imports_another() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            {
                m
                for m in imported_modules(ast.parse(path.read_text(encoding="utf-8")))
                if is_test_module(m)
            }
        )
        for path in sorted(TESTS.rglob("*.py"))
    }
    offenders = {path: modules for path, modules in offenders.items() if modules}
    assert offenders == {}, "move what they share into tests/helpers.py"


def test_the_import_check_sees_every_form() -> None:
    source = (
        "from tests.test_a import x\nfrom tests import test_b\nimport tests.test_c\n"
        "def f():\n    from .test_d import y\n"
        "from tests.helpers import shown\nimport pytest\n"
    )
    found = [m for m in imported_modules(ast.parse(source)) if is_test_module(m)]
    assert found == ["tests.test_a", "tests.test_b", "tests.test_c", ".test_d"]


# Collects with every way of starting a process recorded, then starts one itself to show
# that the recording works; prints what collection started as JSON on its last line.
COLLECT_ONLY = """
import json, multiprocessing.process, os, subprocess, sys
import pytest

started = []
popen_init = subprocess.Popen.__init__
def recording_init(self, args, *rest, **kwargs):
    started.append(str(args)[:300])
    popen_init(self, args, *rest, **kwargs)
subprocess.Popen.__init__ = recording_init
process_start = multiprocessing.process.BaseProcess.start
def recording_start(self):
    started.append(f"multiprocessing: {self!r}")
    process_start(self)
multiprocessing.process.BaseProcess.start = recording_start
for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
    def recording(*args, _real=getattr(os, name), _name=name, **kwargs):
        started.append(f"os.{_name}")
        return _real(*args, **kwargs)
    setattr(os, name, recording)

code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]])
during = list(started)
subprocess.run([sys.executable, "-c", "pass"], check=True)
print(json.dumps({"code": int(code), "started": during, "recorded": len(started) > len(during)}))
"""


def test_collecting_the_tests_that_use_real_runs_starts_no_process() -> None:
    """`pytest --collect-only` on the modules whose tests use the real and findings runs
    trains nothing: no subprocess, multiprocessing process or fork while collecting."""
    files = [
        "tests/test_findings_runs.py",
        "tests/pages/test_findings_pages.py",
        "tests/store/test_store.py",
    ]
    result = subprocess.run(
        [sys.executable, "-c", COLLECT_ONLY, *files],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] == 0, result.stdout[-3000:]
    assert report["recorded"], "the recording missed a subprocess it started itself"
    # The collected tests include ones that use both kinds of run.
    assert "tests/test_findings_runs.py::" in result.stdout
    assert "tests/pages/test_findings_pages.py::" in result.stdout
    assert report["started"] == []


# Folders of tests/ that are no package of blockviz: the pages (the Streamlit scripts).
NOT_PACKAGES = {"pages"}


def test_the_test_folders_mirror_the_package() -> None:
    """tests/<package>/test_<module>.py: every folder of tests/ is a blockviz package (or
    pages/), and a test file's name is unique across folders (pytest imports by it)."""
    folders = {
        path.parent.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("test_*.py")
        if path.parent != TESTS
    }
    for folder in sorted(folders):
        if folder in NOT_PACKAGES:
            assert (ROOT / folder).is_dir(), folder
            continue
        package = ROOT / "blockviz" / folder
        assert (package / "__init__.py").is_file(), f"tests/{folder} mirrors no package"
    names = [path.name for path in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), "two test files share a name"


def test_the_test_counts_docs_development_quotes_are_the_suites() -> None:
    """The counts in docs/development.md's generated block are what `make test` and `make
    test-fast` collect now (`scripts/test_report.py --counts` rewrites them)."""
    result = subprocess.run(
        [sys.executable, "scripts/test_report.py", "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
