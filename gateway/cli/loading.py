"""Loading the tools a gateway serves: `--tools module:attr` specs imported from the app's folder,
or the example tools with the built-in model (`toolspan serve`, and `toolspan trajectories replay`,
which replays against the same tools). A spec that cannot be loaded is a StartupError naming it."""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway.demo.tools import demo_registry
from gateway.settings.model import Settings
from gateway.tools import Tool, ToolRegistry


class StartupError(Exception):
    """The operator's mistake: reported at start-up, before anything listens."""


def _many(value: Any) -> bool:
    """A registry, list, tuple, set, dict view ...: what the contract calls "an iterable of tools".
    Not a string or a mapping, whose items are characters or keys."""
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping)


def import_path(app_dir: Path | None) -> str:
    """Puts the folder `--tools` modules come from first on the import path, as `uvicorn app:module`
    does: `app_dir`, else the current directory (which `toolspan`, a console script, does not put
    there itself). Its absolute path, so a later chdir changes nothing."""
    folder = str((app_dir or Path.cwd()).resolve())
    if app_dir is not None and not Path(folder).is_dir():
        raise StartupError(f"--app-dir {app_dir}: no such folder")
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    return folder


def _import(spec: str, module_name: str, folder: str) -> Any:
    """The module of a `--tools` spec; an import that fails says where, with the last frames of
    its traceback when the failure is inside the user's code (not just a name not found)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        named = exc.name is not None and (module_name == exc.name or module_name.startswith(f"{exc.name}."))
        if named:  # the module named itself, not one that it imports
            raise StartupError(f"--tools {spec!r}: cannot import {module_name!r}: no module {exc.name!r} "
                               f"in {folder} (the import path starts there; --app-dir names another "
                               f"folder) or in the installed packages") from exc
        raise StartupError(_import_failure(spec, module_name, exc)) from exc
    except Exception as exc:
        raise StartupError(_import_failure(spec, module_name, exc)) from exc


IMPORT_FRAMES = 3  # the frames of an import failure shown: the user's own code is at the end


def _import_failure(spec: str, module_name: str, exc: BaseException) -> str:
    machinery = (importlib.__file__, __file__)  # importlib's frames and this module's: none of them helps
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if not frame.filename.startswith("<frozen importlib") and frame.filename not in machinery]
    frames = frames[-IMPORT_FRAMES:]
    lines = [f"--tools {spec!r}: importing {module_name!r} failed: "
             f"{''.join(traceback.format_exception_only(exc)).strip()}"]
    lines += [f"  File \"{f.filename}\", line {f.lineno}, in {f.name}" + (f"\n    {f.line}" if f.line else "")
              for f in frames]
    return "\n".join(lines)


def load_tools(specs: Iterable[str], app_dir: Path | None = None) -> ToolRegistry:
    """A registry from `module:attr` specs naming a ToolRegistry, a Tool, an iterable of tools, or a
    function taking no arguments that returns one of those (a factory keeps the module stateless).
    Modules are looked for in `app_dir` (default: the current directory) first."""
    registry = ToolRegistry()
    specs = list(specs)
    folder = import_path(app_dir) if specs else ""
    for spec in specs:
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise StartupError(f"--tools {spec!r}: expected module:attribute, e.g. myapp.tools:registry")
        module = _import(spec, module_name, folder)
        for item in _tools_of(spec, module, module_name, attr):
            try:
                registry.register(item)
            except ValueError as exc:
                raise StartupError(f"--tools {spec!r}: {exc}") from exc
    return registry


def _tools_of(spec: str, module: Any, module_name: str, attr: str) -> list[Tool]:
    try:
        value: Any = getattr(module, attr)
    except AttributeError as exc:
        raise StartupError(f"--tools {spec!r}: module {module_name!r} has no attribute {attr!r}") from exc
    if callable(value) and not isinstance(value, Tool | ToolRegistry | type):
        try:
            value = value()
        except Exception as exc:
            raise StartupError(f"--tools {spec!r}: calling {attr} failed ({exc})") from exc
    found = [value] if isinstance(value, Tool) else list(value) if _many(value) else None
    if found is None or not all(isinstance(t, Tool) for t in found):
        raise StartupError(f"--tools {spec!r}: expected a ToolRegistry, a Tool or an iterable of tools, "
                           f"got {type(value).__name__}")
    if isinstance(value, ToolRegistry) and value.guardrails:  # a registry's guardrails go with its tools
        found = [replace(t, guardrails=(*value.guardrails, *t.guardrails)) for t in found]
    return found


def served_registry(settings: Settings) -> ToolRegistry:
    """The tools `toolspan serve` offers, MCP servers' aside (they join once it runs): those the
    settings name, else the example tools with the built-in model, and none with a real provider
    unless asked (`toolspan trajectories replay` replays against these too)."""
    if settings.tools:
        return load_tools(settings.tools, settings.app_dir)
    return demo_registry() if not settings.has_upstream else ToolRegistry()
