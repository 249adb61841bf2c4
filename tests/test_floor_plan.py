"""The floor plan (tests/floor_plan.py) against the tree: docs/index.md's "How the code is laid out"
names every room of gateway/ and telemetry/ and nothing that is not there, and the imports between
rooms form no cycle but the ones issue 54 has yet to take apart."""

from __future__ import annotations

import re
from pathlib import Path

from tests.floor_plan import ROOT, back_arrows, downward_order, import_graph, rooms

INDEX = ROOT / "docs" / "index.md"
ENTRY = re.compile(r"^(?P<indent> {0,2})(?P<name>[\w.]+(?:/|\.py))(?: {2,}|$)")

# Arrows that run back up today, each with the part of issue 54 that takes it apart. The test fails
# when one of them is gone, so that this list only ever shrinks.
KNOWN_BACK_ARROWS: set[tuple[str, str]] = set()  # none: a new one is a cycle to take out


def layout_block() -> list[str]:
    section = INDEX.read_text(encoding="utf-8").split("## How the code is laid out", 1)[1]
    return section.split("```", 2)[1].strip("\n").splitlines()


def named_rooms(block: list[str]) -> tuple[list[str], list[str]]:
    """The rooms the block names (two spaces in, under gateway/ or telemetry/), and the top-level
    folders it names (at the left margin)."""
    named: list[str] = []
    top: list[str] = []
    parent = ""
    for line in block:
        entry = ENTRY.match(line)
        if entry is None:
            continue  # a description carried over to the next line
        if entry["indent"] == "":
            parent = entry["name"]
            top.append(parent)
        elif parent in ("gateway/", "telemetry/"):
            named.append(parent + entry["name"])
    return named, top


def test_the_layout_block_names_every_room_and_only_rooms_that_are_there() -> None:
    named, _ = named_rooms(layout_block())
    assert len(named) == len(set(named)), "a room named twice"
    there = rooms()
    assert sorted(set(there) - set(named)) == [], "rooms the layout block of docs/index.md leaves out"
    assert sorted(set(named) - set(there)) == [], "rooms the layout block names that are not in the tree"


def test_the_layout_block_names_top_level_folders_that_are_there() -> None:
    _, top = named_rooms(layout_block())
    assert {"gateway/", "telemetry/", "tests/"} <= set(top)
    assert [name for name in top if not (ROOT / name).is_dir()] == []


def test_a_room_is_a_package_folder_or_a_loose_module(tmp_path: Path) -> None:
    for path in ("gateway/__init__.py", "gateway/app.py", "gateway/http/__init__.py", "gateway/http/server.py",
                 "gateway/assets/page.css", "telemetry/__init__.py", "telemetry/names.py",
                 "telemetry/store/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert rooms(tmp_path) == ["gateway/app.py", "gateway/http/", "telemetry/names.py", "telemetry/store/"]


def test_imports_between_rooms_form_no_cycle_but_the_known_ones() -> None:
    back = set(back_arrows(import_graph()))
    assert sorted(back - KNOWN_BACK_ARROWS) == [], "new imports running back up (python -m tests.floor_plan)"
    assert sorted(KNOWN_BACK_ARROWS - back) == [], "gone: take them out of KNOWN_BACK_ARROWS"


def test_the_cycle_check_finds_an_arrow_back_up(tmp_path: Path) -> None:
    """Each room imports the rooms below it, and errors.py, at the bottom, once imports the routes."""
    files = {"gateway/__init__.py": "", "telemetry/__init__.py": "",
             "gateway/app.py": "from gateway.routes import loop\nfrom gateway.engine import run\n"
                               "import gateway.errors\n",
             "gateway/routes/__init__.py": "", "gateway/routes/loop.py": "from ..engine.run import run\n",
             "gateway/routes/common.py": "from gateway.errors import GatewayError\n",
             "gateway/engine/__init__.py": "", "gateway/engine/run.py": "from gateway import errors\n",
             "gateway/errors.py": "def f() -> None:\n    from gateway.routes.loop import x\n"}
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    graph = import_graph(tmp_path)
    assert {room: set(targets) for room, targets in graph.items()} == {
        "gateway/app.py": {"gateway/routes/", "gateway/engine/", "gateway/errors.py"},
        "gateway/routes/": {"gateway/engine/", "gateway/errors.py"}, "gateway/engine/": {"gateway/errors.py"},
        "gateway/errors.py": {"gateway/routes/"}}
    assert back_arrows(graph) == [("gateway/errors.py", "gateway/routes/")]
    assert downward_order(graph, back_arrows(graph)) == [
        "gateway/app.py", "gateway/routes/", "gateway/engine/", "gateway/errors.py"]
