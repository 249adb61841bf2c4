"""The floor plan of gateway/ and telemetry/: its rooms, and the imports between them.

A room is a package folder directly under gateway/ or telemetry/ (`gateway/http/`,
`telemetry/store/`) or a module loose at that level (`gateway/app.py`, `telemetry/names.py`). Every
import in a room's modules (at the top, under TYPE_CHECKING or inside a function alike) that names
a module of another room is an arrow from the one room to the other.

    python -m tests.floor_plan

prints the rooms in an order where every arrow points down the list, then each room's arrows, and
any arrow that closes a cycle (there should be none)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "telemetry")

Arrows = dict[str, dict[str, list[str]]]  # room -> room it imports from -> the imports that make the arrow


def rooms(root: Path = ROOT) -> list[str]:
    """Every room, as a path from the repository root: `gateway/http/`, `gateway/app.py`."""
    found: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).iterdir()):
            if path.is_dir() and (path / "__init__.py").is_file():
                found.append(f"{package}/{path.name}/")
            elif path.suffix == ".py" and path.name != "__init__.py":
                found.append(f"{package}/{path.name}")
    return found


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names a module imports, relative imports resolved; `from a import b` gives `a.b`
    (which is `a` itself when b is no module of its own: the room is the same either way)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield from (f"{base}.{alias.name}" for alias in node.names)


def room_of(dotted: str, known: Iterable[str]) -> str | None:
    """The room a dotted module name lives in, if it is one of ours."""
    parts = dotted.split(".")
    if parts[0] not in PACKAGES or len(parts) < 2:
        return None
    for room in (f"{parts[0]}/{parts[1]}/", f"{parts[0]}/{parts[1]}.py"):
        if room in known:
            return room
    return None  # the package itself (`from gateway import x` where x is no module)


def import_graph(root: Path = ROOT) -> Arrows:
    """Each room's arrows: the rooms it imports from (itself left out), each with the imports that
    make the arrow (`gateway/state/redis_values.py: gateway.caller.is_trajectory_id`)."""
    known = set(rooms(root))
    graph: Arrows = {room: {} for room in known}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = _module_name(path, root)
            source = room_of(module, known)
            if source is None:
                continue  # the package's own __init__.py
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for dotted in _imported(tree, module, path.name == "__init__.py"):
                target = room_of(dotted, known)
                if target is not None and target != source:
                    graph[source].setdefault(target, []).append(f"{path.relative_to(root)}: {dotted}")
    return graph


def _reachable(graph: Arrows, start: str, goal: str, skipped: set[tuple[str, str]]) -> bool:
    seen, stack = {start}, [start]
    while stack:
        room = stack.pop()
        for target in graph[room]:
            if (room, target) in skipped:
                continue
            if target == goal:
                return True
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return False


def back_arrows(graph: Arrows) -> list[tuple[str, str]]:
    """The arrows that close a cycle. Of the arrows on a cycle, the one made by the fewest imports
    is taken to be the one running back up (the rest of the cycle is the usual way down), and of
    those, the one from the room most imported to the room least imported; it is set aside and the
    search goes on until no cycle is left."""
    importers = {room: sum(room in targets for targets in graph.values()) for room in graph}
    skipped: set[tuple[str, str]] = set()
    while True:
        on_cycle = [(len(imports), importers[target] - importers[room], room, target)
                    for room, targets in graph.items() for target, imports in targets.items()
                    if (room, target) not in skipped and _reachable(graph, target, room, skipped)]
        if not on_cycle:
            return sorted(skipped)
        *_, room, target = min(on_cycle)
        skipped.add((room, target))


def downward_order(graph: Arrows, skipped: Iterable[tuple[str, str]] = ()) -> list[str]:
    """Rooms such that every arrow but the `skipped` points further down the list (the importers
    first); of the rooms free to come next, the first by name."""
    left_out = set(skipped)
    importers = {room: 0 for room in graph}
    for room, targets in graph.items():
        for target in targets:
            importers[target] += (room, target) not in left_out
    order: list[str] = []
    ready = sorted(room for room, count in importers.items() if count == 0)
    while ready:
        room = ready.pop(0)
        order.append(room)
        for target in graph[room]:
            if (room, target) not in left_out:
                importers[target] -= 1
                if importers[target] == 0:
                    ready.append(target)
        ready.sort()
    return order


def report(graph: Arrows) -> str:
    back = back_arrows(graph)
    order = downward_order(graph, back)
    width = max(map(len, order))
    arrows = sum(map(len, graph.values()))
    lines = [f"{len(graph)} rooms, {arrows} arrows; each room and the rooms it imports from, every arrow "
             "pointing down the list but those that close a cycle:", ""]
    for room in order:
        targets = sorted(graph[room], key=order.index)
        lines.append(f"  {room:<{width}} -> {', '.join(targets) if targets else '(no room)'}")
    lines += ["", f"arrows that close a cycle: {len(back) or 'none'}"]
    for room, target in back:
        lines.append(f"  {room} -> {target}, by " + "; ".join(graph[room][target]))
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(import_graph()))
