"""The documentation: the MkDocs site builds in strict mode (a broken link, a missing anchor or a page left out
of the nav fails it), and README.md stays a short front page whose links into docs/ resolve."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
README_MAX_LINES = 250

# [text](target) and ![alt](target); a target ends at whitespace (an optional "title" follows) or `)`
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def test_mkdocs_builds_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO_ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr}\n{proc.stdout}"
    assert (tmp_path / "index.html").is_file()


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension gives a heading (its default slugify)."""
    text = re.sub(r"[`*_]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def test_readme_is_short_and_its_links_resolve():
    text = README.read_text(encoding="utf-8")
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move text to docs/"
    targets = LINK.findall(FENCE.sub("", text))
    relative = [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]
    assert any(t.startswith("docs/") for t in relative), "README.md links to no docs/ page"
    broken = []
    for target in relative:
        path, _, anchor = target.partition("#")
        file = (REPO_ROOT / path).resolve()
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {path}")
    assert not broken, "README.md links that do not resolve:\n" + "\n".join(broken)
