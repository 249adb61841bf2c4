"""GET /ui: the trajectory page. Server-rendered HTML (see ui_report and ui_timeline) over the
embedded trajectory store, read through the `TrajectoryReader` the composition root hands in;
a stylesheet and a small script of its own, and a Content-Security-Policy that allows nothing else.

Routes: /ui (the report, with each key's usage of its limits: see ui_limits; ?by=model, upstream,
key or tool adds the comparison: see ui_compare), /ui/trajectories
(the list, with filters), /ui/trajectories/{id} (one timeline, a page of its requests: ?page=N,
?limit=N), /ui/replay (the recorded calls parsed again against the tools served now: see
ui_replay), /ui/approvals (the pending approvals of tool calls, and their decisions: see
ui_approvals), /ui/login and /ui/logout (the session cookie, see ui_auth), /ui/assets/{name}."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

from aiohttp import web

from gateway.http.bodies import EXPECT
from gateway.http.keys import EXECUTOR, REGISTRY, SETTINGS
from gateway.settings.model import Settings
from gateway.ui.answers import html, read_form, redirect, sign_in_page
from gateway.ui.approvals import mount as mount_approvals
from gateway.ui.auth import (
    HOME,
    end_session,
    key_name,
    page_after_sign_in,
    same_origin,
    set_session,
    shown_key,
    signed_in,
)
from gateway.ui.layout import notice, page
from gateway.ui.limits import limits_view
from gateway.ui.markup import Html, join
from gateway.ui.replay import REPLAY_CALLS, Replays, replay_page, served_target
from gateway.ui.report import ListFilters, list_page, report_page
from gateway.ui.timeline import MOST_PAGE_REQUESTS, PAGE_REQUESTS, Paging, pages, timeline_page
from telemetry.store.compare import GROUPINGS

# Scripts, styles and forms of this origin only; no inline script or style, no frames, no plugins.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
# On every response under /ui as it is sent (_page_headers): the pages, the redirects, the assets,
# and the gateway's own answers there (a 404, a refused request), so none can be framed, read as
# another type than it says, or run anyone else's script.
PAGE_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
                "X-Frame-Options": "DENY",  # frame-ancestors 'none', for browsers that predate it
                "Referrer-Policy": "same-origin"}  # trace links leak no page address; own forms keep their Origin
RECENT = 10
LIST_LIMIT = 200
FINE_BUCKET_SECONDS, COARSE_BUCKET_SECONDS = 60.0, 3600.0
_WHOLE = re.compile(r"[0-9]{1,9}")  # ASCII digits only: int() would take "²" or "1_0" too
_ASSET_TYPES = {"ui.css": "text/css", "ui.js": "text/javascript"}
_BELOW_HOME = HOME + "/"


class TrajectoryReader(Protocol):
    """The trajectory store's questions (`telemetry.store.report`), in its shapes, over one gateway key's
    trajectories (`key`) or every one (None). Blocking calls: the page runs them on a thread.
    `sqlite3.Error` means there is nothing to read (yet)."""

    def report(self, key: str | None) -> dict[str, Any]: ...

    def compared(self, by: str, key: str | None) -> dict[str, Any]: ...

    def rejections_over_time(self, bucket_seconds: float, key: str | None) -> list[dict[str, Any]]: ...

    def list_trajectories(self, *, tool: str | None, outcome: str | None, since: float | None,
                          model: str | None, limit: int, key: str | None) -> list[dict[str, Any]]: ...

    def trajectory(self, trajectory_id: str, key: str | None, *, offset: int = 0,
                   limit: int | None = None) -> dict[str, Any] | None: ...

    def recorded_calls(self, *, key: str | None, gateway_only: bool, limit: int) -> list[dict[str, Any]]: ...


class UiAssets:
    """The stylesheet and the script, read once when the routes are mounted."""

    def __init__(self) -> None:
        folder = resources.files("gateway.ui") / "assets"
        self.files = {name: (folder / name).read_bytes() for name in _ASSET_TYPES}


TRAJECTORIES = web.AppKey("trajectories", TrajectoryReader)
ASSETS = web.AppKey("ui_assets", UiAssets)
# The thread the timeline pages are read and rendered on, one at a time: each holds the GIL for as
# long as its requests take, and several threads at them keep the event loop from it for much longer
# than one does (the p99 of /healthz while four clients ask for pages; bench/trajectory_growth.py).
# A request that gives up (its client gone) leaves its page to finish there, and the next waits for it.
TIMELINES = web.AppKey("ui_timelines", ThreadPoolExecutor)
# Replays run their parse steps on the event loop (a tool's parser may be bound to it), giving it back
# every few milliseconds; one view's replay at a time, so that many views asked at once do not add up
# there, each within a time limit, and each viewer's answer kept a while (gateway.ui.replay.Replays).
REPLAYS = web.AppKey("ui_replays", Replays)


async def _page_headers(request: web.Request, response: web.StreamResponse) -> None:
    path = request.path
    if path == HOME or path.startswith(_BELOW_HOME):
        response.headers.update(PAGE_HEADERS)


@dataclass(frozen=True)
class _Viewer:
    """Whose trajectories a request for the page may see: one gateway key's, or (None) every one."""

    key: str | None


_EVERY_KEY = _Viewer(None)


def _viewer(request: web.Request) -> web.Response | _Viewer:
    """Without gateway keys the page is as open as the gateway, and shows everything; with them, a
    request must carry one (else: the sign-in page), and sees that key's trajectories (every key's
    for an operator's key)."""
    keys = request.app[SETTINGS].keys
    if not keys:
        return _EVERY_KEY
    name = signed_in(request, keys)
    if name is None:
        return sign_in_page(request.path_qs)
    return _Viewer(shown_key(name, keys))


async def _ask(request: web.Request, question: str, *args: Any, **kwargs: Any) -> Any:
    """A question to the store, off the event loop; None when there is no store to ask, or it
    cannot be read."""
    reader = request.app.get(TRAJECTORIES)
    if reader is None:
        return None
    try:
        return await asyncio.to_thread(getattr(reader, question), *args, **kwargs)
    except sqlite3.Error:
        return None


_NO_STORE = "The trajectory store is off or has recorded nothing yet: nothing to show."


async def report_view(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    if not isinstance(viewer := _viewer(request), _Viewer):
        return viewer
    by = request.query.get("by") or None
    if by is not None and by not in GROUPINGS:
        body = notice(f"?by compares by one of {', '.join(GROUPINGS)}, not {by[:40]!r}.")
        return html(page("Trajectory report", body, HOME, bool(settings.keys)), status=400)
    limits = await limits_view(request, viewer.key)
    report = await _ask(request, "report", viewer.key)
    if report is None:
        return html(page("Trajectory report", join([limits, notice(_NO_STORE)]), HOME, bool(settings.keys)))
    hourly = await _ask(request, "rejections_over_time", COARSE_BUCKET_SECONDS, viewer.key) or []
    starts = [row["bucket_start"] for row in hourly]
    # Less than a day of calls: minutes are the finer steps for the chart.
    if starts and max(starts) - min(starts) < 86400:
        hourly = await _ask(request, "rejections_over_time", FINE_BUCKET_SECONDS, viewer.key) or []
    recent = await _ask(request, "list_trajectories", tool=None, outcome=None, since=None, model=None,
                        limit=RECENT, key=viewer.key) or []
    compared = await _ask(request, "compared", by, viewer.key) if by is not None else None
    body = join([limits, report_page(report, hourly, recent, settings.trace_ui_url, compared)])
    return html(page("Trajectory report", body, HOME, bool(settings.keys)))


def _filters(request: web.Request) -> ListFilters:
    query = request.query
    since = query.get("since", "")
    # Seconds, as the form offers them; anything else (a sign, a superscript digit, a number too
    # long to be an age) is ignored.
    return ListFilters(tool=query.get("tool") or None, outcome=query.get("outcome") or None,
                       model=query.get("model") or None,
                       within_seconds=int(since) if _WHOLE.fullmatch(since) else None)


async def list_view(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    if not isinstance(viewer := _viewer(request), _Viewer):
        return viewer
    filters = _filters(request)
    since = time.time() - filters.within_seconds if filters.within_seconds else None
    rows = await _ask(request, "list_trajectories", tool=filters.tool, outcome=filters.outcome, since=since,
                      model=filters.model, limit=LIST_LIMIT, key=viewer.key)
    body = notice(_NO_STORE) if rows is None else list_page(rows, filters, settings.trace_ui_url)
    return html(page("Trajectories", body, "/ui/trajectories", bool(settings.keys)))


async def replay_view(request: web.Request) -> web.Response:
    """The viewer's recorded gateway calls, replayed against the registry as it is now."""
    settings = request.app[SETTINGS]
    if not isinstance(viewer := _viewer(request), _Viewer):
        return viewer
    title, keyed = "Replay against the tools served now", bool(settings.keys)
    rows = await _ask(request, "recorded_calls", key=viewer.key, gateway_only=True, limit=REPLAY_CALLS)
    if rows is None:
        return html(page(title, notice(_NO_STORE), None, keyed))
    target = served_target(request.app[REGISTRY], settings.keys, viewer.key, request.app[EXECUTOR].repair)
    answer = await request.app[REPLAYS].answer(viewer.key, rows, target)
    whose = "every trajectory" if viewer.key is None else "this key's trajectories"
    return html(page(title, replay_page(answer, len(rows), whose), None, keyed))


def _page_asked(query: Mapping[str, str]) -> tuple[int, int] | str:
    """(page, requests a page) as ?page= and ?limit= ask for them, each optional; or what is wrong
    with them."""
    found = []
    for name, default, most in (("page", 1, None), ("limit", PAGE_REQUESTS, MOST_PAGE_REQUESTS)):
        text = query.get(name, "")
        value = int(text) if _WHOLE.fullmatch(text) else None if text else default
        if value is None or value < 1 or (most is not None and value > most):
            allowed = f"from 1 to {most:,}" if most is not None else "from 1 up"
            return f"?{name} must be a whole number {allowed}, not {text[:40]!r}."
        found.append(value)
    return found[0], found[1]


def _timeline(reader: TrajectoryReader | None, trajectory_id: str, viewer: _Viewer, number: int, limit: int,
              settings: Settings) -> tuple[Html, int]:
    """The timeline page `number` of the trajectory, `limit` requests a page: its markup and status,
    read and rendered on the pages' thread."""
    found = None
    try:
        if reader is not None:
            found = reader.trajectory(trajectory_id, viewer.key, offset=(number - 1) * limit, limit=limit)
    except sqlite3.Error:
        pass  # nothing to read (yet): as no such trajectory
    keyed = bool(settings.keys)
    if found is None:  # another key's trajectory is one this key's page has not got
        body = notice("The store has no trajectory with this id (it may have aged out).")
        return page(f"Trajectory {trajectory_id}", body, None, keyed), 404
    total = found["totals"]["requests"]
    if number > (last := pages(total, limit)):
        body = notice(f"?page={number:,} is past the last page of this trajectory: {last:,} ({total:,} requests, "
                      f"{limit:,} a page).")
        return page(f"Trajectory {found['local_id']}", body, None, keyed), 400
    body = timeline_page(found, Paging(found["id"], number, limit), settings.trace_ui_url)
    return page(f"Trajectory {found['local_id']}", body, None, keyed), 200


async def trajectory_view(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    if not isinstance(viewer := _viewer(request), _Viewer):
        return viewer
    trajectory_id = request.match_info["id"]
    asked = _page_asked(request.query)
    if isinstance(asked, str):
        return html(page(f"Trajectory {trajectory_id}", notice(asked), None, bool(settings.keys)), status=400)
    markup, status = await asyncio.get_running_loop().run_in_executor(
        request.app[TIMELINES], _timeline, request.app.get(TRAJECTORIES), trajectory_id, viewer, *asked, settings)
    return html(markup, status)


async def login(request: web.Request) -> web.Response:
    """The sign-in form's post: a gateway key, once; a session cookie and the page asked for."""
    if not same_origin(request):
        return html(page("Sign in", notice("Sign-in is only taken from this gateway's own page.")), status=403)
    form = await read_form(request)
    keys = request.app[SETTINGS].keys
    target = page_after_sign_in(form.get("next"))
    response = redirect(target)
    if not keys:
        return response
    sent = form.get("key", "").strip()
    if key_name(sent, keys) is None:
        return sign_in_page(target, "That is not one of this gateway's keys.")
    set_session(response, sent, secure=request.secure)
    return response


async def logout(request: web.Request) -> web.Response:
    if not same_origin(request):
        return html(page("Sign out", notice("Sign-out is only taken from this gateway's own page.")), status=403)
    response = redirect(HOME)
    end_session(response)
    return response


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _ASSET_TYPES:
        raise web.HTTPNotFound()
    body = request.app[ASSETS].files[name]
    return web.Response(body=body, content_type=_ASSET_TYPES[name], charset="utf-8")


async def _stop_timelines(app: web.Application) -> None:
    app[TIMELINES].shutdown(wait=False, cancel_futures=True)


def mount(app: web.Application, reader: TrajectoryReader | None) -> None:
    """The page's routes; without a reader (the store is off) the page says so."""
    app[ASSETS] = UiAssets()
    app[TIMELINES] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolspan-ui-timeline")
    app[REPLAYS] = Replays()
    app.on_cleanup.append(_stop_timelines)
    app.on_response_prepare.append(_page_headers)
    if reader is not None:
        app[TRAJECTORIES] = reader
    app.router.add_get("/ui", report_view, **EXPECT)
    app.router.add_get("/ui/trajectories", list_view, **EXPECT)
    app.router.add_get("/ui/trajectories/{id}", trajectory_view, **EXPECT)
    app.router.add_get("/ui/replay", replay_view, **EXPECT)
    mount_approvals(app)
    app.router.add_post("/ui/login", login, **EXPECT)
    app.router.add_post("/ui/logout", logout, **EXPECT)
    app.router.add_get("/ui/assets/{name}", asset, **EXPECT)
