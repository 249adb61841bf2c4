"""SIGHUP: the limits of gateway keys read again, without a restart.

`toolspan serve` reads its settings again from where it read them at start (its flags, the
TOOLSPAN_* variables it started with, its --config file) and puts the new limits in place of the
old ones: `default_limits`, each key's own, `prices` and `limits_when_state_down`. What the keys
have used stays counted (gateway.limits.Limiter.replace). Everything else, the keys themselves
included, is read at start only. Settings that cannot be read (a file with a mistake, a file
gone) leave the limits as they were, and the log says why; what changed is logged too.

With `--workers N`, the supervisor passes the signal on to every worker (gateway.runtime.workers),
and each reads the settings itself."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from aiohttp import web

from gateway.http.keys import LOOP, SETTINGS
from gateway.limits import Limiter
from gateway.settings.model import Settings
from gateway.settings.parts import Limits, Price
from gateway.wire.escaping import without_credentials

log = logging.getLogger("toolspan")

# What reading the settings again may raise (gateway.settings.load): the operator's mistakes.
UNREADABLE = (ValueError, OSError)


def _shown(value: object) -> str:
    return "unset" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def limit_changes(before: Mapping[str | None, Limits], after: Mapping[str | None, Limits]) -> list[str]:
    """What differs, one line per key whose limits changed (None: default_limits)."""
    lines = []
    for name, old in before.items():
        new = after[name]
        said = [f"{field} {_shown(getattr(old, field))} -> {_shown(getattr(new, field))}"
                for field in Limits.model_fields if getattr(old, field) != getattr(new, field)]
        if said:
            lines.append(f"{'default_limits' if name is None else f'key {name}'}: {', '.join(said)}")
    return lines


def price_changes(before: Mapping[str, Price], after: Mapping[str, Price]) -> list[str]:
    added = [model for model in after if model not in before]
    removed = [model for model in before if model not in after]
    changed = [model for model in after if model in before and after[model] != before[model]]
    said = [f"{what} {', '.join(models)}" for what, models in (("added", added), ("removed", removed),
                                                                ("changed", changed)) if models]
    return [f"prices: {'; '.join(said)}"] if said else []


def reload_limits(app: web.Application, load: Callable[[], Settings]) -> None:
    """The settings read again through `load`, and their limits put in place of the app's."""
    try:
        fresh = load()
    except UNREADABLE as exc:
        problems = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        log.error("SIGHUP: the settings could not be read again, so the limits stay as they were: %s",
                  without_credentials(problems))
        return
    started = app[SETTINGS]
    unkept = sorted({*fresh.keys} ^ {*started.keys})
    if unkept:
        log.warning("SIGHUP: gateway keys added or removed (%s) take effect at a restart only; the keys that "
                    "were there at start keep working", ", ".join(unkept))
    limiter = app[LOOP].limiter
    if limiter is None:
        if Limiter.configured(fresh.default_limits, fresh.keys):
            log.warning("SIGHUP: the settings set limits now, but none was set at start: a gateway started "
                        "without limits enforces none until it is restarted")
        else:
            log.info("SIGHUP: no limits are set, before or now")
        return
    keys = {name: fresh.keys.get(name, key) for name, key in started.keys.items()}
    before, prices, when_down = limiter.resolved(), limiter.prices, limiter.when_down
    limiter.replace(fresh.default_limits, keys, fresh.prices, fresh.limits_when_state_down)
    changes = [*limit_changes(before, limiter.resolved()), *price_changes(prices, limiter.prices)]
    if when_down != limiter.when_down:
        changes.append(f"limits_when_state_down: {when_down} -> {limiter.when_down}")
    log.info("SIGHUP: limits read again: %s", "; ".join(changes) if changes else "unchanged")


class LimitsReload:
    """The SIGHUP handler of `toolspan serve`: it reloads the limits of the app it was given once
    the app serves (a SIGHUP before that is only logged: the settings just read are the current)."""

    def __init__(self, load: Callable[[], Settings]) -> None:
        self._load = load
        self._app: web.Application | None = None

    def serving(self, app: web.Application) -> None:
        self._app = app

    def __call__(self) -> None:
        if self._app is None:
            log.warning("SIGHUP while starting: the settings being used are the ones just read; nothing reloaded")
            return
        reload_limits(self._app, self._load)
