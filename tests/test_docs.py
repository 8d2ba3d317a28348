"""The README stays a short user's guide and the documentation site under docs/ builds cleanly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# The two set-up commands users copy; CI runs the second one. They must not change.
SETUP_COMMANDS = (
    "python3.11 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/splitserve model pull"
    " && .venv/bin/splitserve up",
    "python3.11 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest",
)
README_MAX_LINES = 300
# Paths of a developer's machine, never of the project.
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|root|home)/")
FENCED_SH = re.compile(r"^```sh\n(.*?)\n```$", re.MULTILINE | re.DOTALL)
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")


def test_mkdocs_build_is_strict_clean(tmp_path: Path) -> None:
    # Not `-q`: quiet mode hides the warnings that --strict counts, and the build then passes.
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = [line for line in result.stderr.splitlines() if not line.startswith("INFO")]
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(report)[-4000:]


def test_readme_is_a_short_guide() -> None:
    count = len(README.read_text().splitlines())
    assert count < README_MAX_LINES, f"README.md has {count} lines, the limit is {README_MAX_LINES}"


def test_readme_setup_commands_unchanged() -> None:
    blocks = FENCED_SH.findall(README.read_text())
    assert tuple(blocks[:2]) == SETUP_COMMANDS, f"the README's first two sh blocks: {blocks[:2]}"


def test_readme_links_resolve() -> None:
    for target in LINK_TARGET.findall(README.read_text()):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        path = ROOT / target.split("#", 1)[0]
        assert path.exists(), f"README.md links to {target}, which does not exist"


def test_no_machine_paths_in_docs() -> None:
    for path in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            rel = path.relative_to(ROOT)
            assert not MACHINE_PATH.search(line), f"{rel}:{number} names a machine path: {line}"
