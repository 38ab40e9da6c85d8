"""MkDocs hooks (mkdocs.yml `hooks:`): what the docs site generates at build time instead of keeping by hand.

- `docs/reference/cli.md`: the marker `<!-- cli-reference -->` becomes one section per command and
  subcommand of the Typer app (`mnntool.cli.app`, `mnntool llm ...` included), each the plain-text
  `--help` that command prints, so the reference cannot drift from the code.
- `docs/contributing/op-map.md`: the marker `<!-- op-map -->` becomes the op map (`mnntool.opmap`: every IR
  op's definition, converters, kernel and tests), generated from the registries.
- `<!-- results: NAME.json -->` on any page becomes the table of measured results in docs/results/NAME.json
  (tools/results_tables.py: the benchmark's own JSON, with the CPU, date and command under the table).
- The nav gets "Verify in CI" (docs/ci.md and the pages under docs/ci/) under Guides when those exist
  and mkdocs.yml does not list them already.
"""
from __future__ import annotations

import html
from pathlib import Path

MARKER = "<!-- cli-reference -->"
OP_MAP = "<!-- op-map -->"
RESULTS = "<!-- results: "       # <!-- results: NAME.json -->: a table from docs/results/NAME.json
WIDTH = 100


def _walk(cmd, ctx, path):
    """(path, command) for `cmd` and every subcommand below it, depth first, in the app's order."""
    yield path, cmd
    commands = getattr(cmd, "commands", None)
    if commands:
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                yield from _walk(sub, ctx, path + [name])


def cli_reference() -> str:
    import typer
    import typer.core
    from typer.testing import CliRunner

    from mnntool.cli import app

    root = typer.main.get_command(app)
    ctx = typer.Context(root, info_name="mnntool")
    runner = CliRunner()
    parts = []
    had_rich = typer.core.HAS_RICH
    typer.core.HAS_RICH = False            # click's plain layout: no box drawing in the page
    try:
        for path, cmd in _walk(root, ctx, []):
            res = runner.invoke(app, path + ["--help"], prog_name="mnntool", env={"COLUMNS": str(WIDTH)},
                                terminal_width=WIDTH)
            if res.exit_code != 0:
                raise RuntimeError(f"mnntool {' '.join(path)} --help exited {res.exit_code}: {res.output}")
            title = " ".join(["mnntool"] + path)
            short = cmd.get_short_help_str(limit=200) if path else ""
            parts.append(f"{'#' * min(2 + max(len(path) - 1, 0), 4)} `{title}`\n")
            if short:
                parts.append(html.escape(short, quote=False) + "\n")
            parts.append("```text\n" + res.output.rstrip() + "\n```\n")
    finally:
        typer.core.HAS_RICH = had_rich
    return "\n".join(parts)


def _results_tables():
    """tools/results_tables.py, loaded by path (MkDocs loads this hooks file by path too)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("results_tables", Path(__file__).with_name("results_tables.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_page_markdown(markdown, page, config, files, **kwargs):
    if RESULTS in markdown:
        markdown = _results_tables().fill(markdown, Path(config["docs_dir"]) / "results")
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    if OP_MAP in markdown:
        from mnntool.opmap import markdown as op_map
        return markdown.replace(OP_MAP, op_map())
    return markdown


def _listed(nav, target: str) -> bool:
    for item in nav or []:
        if isinstance(item, str) and item == target:
            return True
        if isinstance(item, dict):
            for v in item.values():
                if v == target or (isinstance(v, list) and _listed(v, target)):
                    return True
    return False


def on_config(config, **kwargs):
    docs = Path(config["docs_dir"])
    nav = config["nav"]
    if not nav or not (docs / "ci.md").is_file() or _listed(nav, "ci.md"):
        return config
    entry = "ci.md"
    extra = sorted(p.relative_to(docs).as_posix() for p in (docs / "ci").rglob("*.md")) if (docs / "ci").is_dir() else []
    extra = [p for p in extra if not _listed(nav, p)]
    item = {"Verify in CI": [entry] + extra} if extra else {"Verify in CI": entry}
    for section in nav:
        if isinstance(section, dict) and isinstance(section.get("Guides"), list):
            guides = section["Guides"]
            at = next((i + 1 for i, g in enumerate(guides) if isinstance(g, dict) and "guides/quantize.md" in g.values()),
                      len(guides))
            guides.insert(at, item)
            break
    else:
        nav.append(item)
    return config
