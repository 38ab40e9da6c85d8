"""The docs stay honest: the site builds strictly (broken links and anchors fail), every link in README.md
points at a file (and heading) that exists, the README's Python snippet runs, and nothing a user reads
speaks of the project's development history."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug (what MkDocs and GitHub anchors agree on for plain headings)."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"[-\s]+", "-", text).strip("-")


def _anchors(md: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M)}


def test_readme_links_point_at_files_that_exist():
    links = LINK.findall(README.read_text())
    assert links, "README.md has no links into docs/"
    missing = []
    for target in links:
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (README.parent / path) if path else README
        if not file.exists():
            missing.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            missing.append(target)
    assert not missing, f"README.md links to what does not exist: {missing}"


def test_readme_leads_with_the_make_targets():
    first_block = README.read_text().split("```")[1]
    lines = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert lines[:2] == ["make demo", "make test"], lines


def test_no_development_history_where_users_read():
    pages = [README] + sorted((ROOT / "docs").rglob("*.md"))
    bad = re.compile(r"\b(session \d+|sessions? \d+-\d+|this round|this session|end of session)\b", re.I)
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages for m in bad.finditer(p.read_text())]
    assert not hits, hits


def test_every_environment_variable_is_documented():
    """Each MNNTOOL_* variable the package reads has its entry in docs/reference/environment.md."""
    page = (ROOT / "docs" / "reference" / "environment.md").read_text()
    read = {m for p in (ROOT / "mnntool").rglob("*.py") for m in re.findall(r"MNNTOOL_[A-Z0-9_]*[A-Z0-9]", p.read_text())}
    assert read, "no MNNTOOL_ variable found in the package"
    missing = sorted(v for v in read if f"`{v}`" not in page)
    assert not missing, f"not in docs/reference/environment.md: {missing}"


def test_readme_python_snippet_runs(tmp_path, monkeypatch, fixture_model):
    pytest.importorskip("onnxruntime")
    from fixtures.calib import make

    snippet = re.search(r"```python\n(.*?)```", README.read_text(), flags=re.S).group(1)
    (tmp_path / "build" / "fixtures").mkdir(parents=True)
    (tmp_path / "build" / "fixtures" / "mobilenetv2.onnx").symlink_to(fixture_model("mobilenetv2"))
    make(tmp_path / "build" / "calib", 4)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)
    assert scope["y"].shape == (1, 1000)
    assert "pass" in scope["report"]


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings")),
                    reason="the docs extra is not installed (pip install -e '.[docs]')")
def test_docs_site_builds_strictly(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # not --quiet: it hides the warnings, and --strict then has none to count
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in ("mnntool convert", "mnntool quant", "mnntool verify", "mnntool llm export"):
        assert f"<code>{command}</code>" in cli, f"the CLI reference has no section for {command}"
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert 'id="mnntool.convert"' in api and 'id="mnntool.quantize"' in api
