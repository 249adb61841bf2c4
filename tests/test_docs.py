"""The README is a front door that keeps its promises: at most 300 lines, its test command the one CI
runs, and every link into docs/ pointing at a file that is there (mkdocs checks docs/ itself, with
`mkdocs build --strict` in .ci/run, but not the README)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from telemetry import names
from tests.conftest import page_text

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = ["index.md", "getting-started.md", "tools.md", "http-and-apis.md", "mcp.md", "settings.md",
         "upstreams.md", "translation.md", "telemetry-and-trajectories.md", "improving.md", "datasets.md",
         "phoenix.md", "langfuse.md", "tempo.md", "jaeger.md",  # the section "Trace backends"
         "deployment-and-scale.md", "limits-and-tenancy.md", "guardrails.md", "benchmarks.md"]


def nav_pages(nav: list[dict[str, Any]]) -> list[str]:
    """The pages of mkdocs.yml's nav in reading order, those of its sections in their place."""
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values()))
        pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def shell_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_the_readme_is_at_most_300_lines() -> None:
    assert len(README.splitlines()) <= 300


def test_the_readme_opens_with_run_then_test_and_ci_runs_the_test_command_word_for_word() -> None:
    run, test = shell_blocks(README)[:2]
    assert run == ("python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/toolspan demo "
                   "&& .venv/bin/toolspan serve")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert test == ci
    assert "mkdocs build --strict" in ci
    # mkdocs's -q hides the warnings that --strict counts, so the build would pass with broken links.
    assert not re.search(r"mkdocs build[^&]*\s-q\b", ci)


def test_every_relative_link_of_the_readme_is_a_file_in_the_tree() -> None:
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    assert "docs/getting-started.md" in targets
    assert "docs/ui.png" in targets
    missing = [target for target in targets if not (ROOT / target).is_file()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_site_reads_the_pages_in_order() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["theme"]["name"] == "material"
    assert config["strict"] is True
    assert nav_pages(config["nav"]) == PAGES
    assert sorted(PAGES) == sorted(path.name for path in (ROOT / "docs").glob("*.md"))


def test_the_docs_list_every_outcome_the_option_takes() -> None:
    said = re.search(r"`toolspan trajectories list --outcome` takes one of `([^`]+)`", page_text())
    assert said is not None
    assert [outcome.strip() for outcome in said.group(1).split(",")] == list(names.OUTCOMES)


def test_the_test_command_runs_the_slow_tests_too() -> None:
    """`slow` is for the quick loop to leave out (`pytest -m "not slow"`); CI's command runs them."""
    test = shell_blocks(README)[1]
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]
    assert re.findall(r"\.venv/bin/pytest([^&]*)&&", test) == [" -n 2 "]  # no -m, no path: every test
    assert pytest_options["ini_options"]["addopts"].split() == ["--strict-markers"]
    assert [marker.split(":")[0] for marker in pytest_options["ini_options"]["markers"]] == ["slow"]
