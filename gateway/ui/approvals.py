"""/ui/approvals: the tool calls waiting for a reviewer (gateway.tools.approval_gate) that the signed-in
viewer may see, each with its tool, what it asks, its arguments (and their digest) and data, its
trajectory and when it expires; and Approve / Deny, for a viewer who may decide. The form posts the
digest it showed: a decision is taken only for the arguments the reviewer saw.

Behind the page's authorisation (ui_auth): with gateway keys, a signed-in key sees its own
requests' approvals (every key's, for an operator's key) and decides them if it is an approver or
the operator's; without keys the page is as open as the gateway. A decision is a form posted to
/ui/approvals/{id}, which answers with a redirect back to the page and a notice (303).

A post is taken only from the page itself: its Origin is this gateway's (ui_auth.same_origin), and
it carries the form's token, an HMAC of the approval's id under the viewer's session token (the
cookie's value, the same on every replica) or, without keys, under a random value the page set in
a cookie of its own (HttpOnly, SameSite=Strict: any replica reads it back). Another site can make a
browser post, but can neither read the page or the cookie to learn the token nor compute it."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from aiohttp import web

from gateway.errors import Conflict, Forbidden, NotFound
from gateway.http.bodies import EXPECT
from gateway.http.keys import APPROVALS, SETTINGS
from gateway.routes.approvals import DIGEST_PATTERN, REASON_MAX, viewer
from gateway.tools.approval_gate import APPROVAL_PREFIX, Viewer
from gateway.ui.answers import html, read_form, redirect, sign_in_page
from gateway.ui.auth import same_origin, session_token, signed_in
from gateway.ui.layout import notice, page, tag, trajectory_link, when_at
from gateway.ui.markup import EMPTY, Html, join, render, when
from telemetry.store.records import stored_id

PATH = "/ui/approvals"
_TOKEN_TEXT = b"toolspan /ui approval "
_APPROVAL_ID = re.compile(re.escape(APPROVAL_PREFIX) + "[0-9a-f]{1,64}")
_KINDS = {"before_run": "asked before the call runs", "interrupt": "the tool paused and asks"}
# What the page says after a decision (?done=) or a decision that came too late (?missed=): fixed
# texts, so that a link cannot make the page say anything else.
_DONE = {"approved": "Approved: the call goes on, and its request with it.",
         "denied": "Denied: the model is told so, with the reason given."}
_MISSED = {"approval_decided": "That approval was decided already, by another reviewer or by its time running out.",
           "arguments_changed": "That approval asks about other arguments than the ones you decided on: nothing was "
                                "decided. Read it again below.",
           "approval_not_found": "That approval is no longer pending: it was decided, timed out, or its request "
                                 "ended."}
FORM_COOKIE = "toolspan_ui_form"  # without gateway keys: the tokens' key, a random value of the browser's
_FORM_SECRET = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(DIGEST_PATTERN)


class _Refused(Exception):
    """A post the page will not take: the answer says why."""

    def __init__(self, response: web.Response) -> None:
        super().__init__("refused")
        self.response = response


def _signed_in(request: web.Request) -> str | None:
    """The name of the viewer's gateway key; None without keys. With keys and none signed in, the
    sign-in page is the answer."""
    keys = request.app[SETTINGS].keys
    if not keys:
        return None
    name = signed_in(request, keys)
    if name is None:
        raise _Refused(sign_in_page(PATH))
    return name


def token_for(secret: bytes, approval_id: str) -> str:
    """The token of a decision of `approval_id` under `secret`: a session token's, or this app's own."""
    return hmac.new(secret, _TOKEN_TEXT + approval_id.encode(), hashlib.sha256).hexdigest()


def form_secret(request: web.Request, name: str | None) -> bytes | None:
    """The key of the viewer's tokens: its session token (signed in as `name`), or without keys the
    page's cookie (None when the browser has none yet)."""
    if name is not None:
        return session_token(request.app[SETTINGS].keys[name].key.get_secret_value()).encode()
    cookie = request.cookies.get(FORM_COOKIE, "")
    return cookie.encode() if _FORM_SECRET.fullmatch(cookie) else None


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _block(label: str, text: str, cls: str) -> Html:
    return render('<div class="label">{label}</div><pre class="{cls}">{text}</pre>', label=label, text=text, cls=cls)


def _trajectory(shown: Mapping[str, Any]) -> Html:
    """A link to the approval's trajectory on the page: the operator's page names another key's by
    the store's id for it."""
    trajectory_id = shown.get("trajectory_id")
    if not isinstance(trajectory_id, str) or not trajectory_id:
        return render('<span class="muted">-</span>')
    key = shown.get("key")
    return trajectory_link(stored_id(key if isinstance(key, str) and key else None, trajectory_id), trajectory_id)


def _decide_form(approval_id: str, kind: str, digest: Any, token: str) -> Html:
    output = when(kind == "interrupt", render(
        '<label>Output (optional: JSON, or text; the call\'s result the model gets)'
        '<textarea name="output" rows="3" cols="50"></textarea></label>'))
    return render(
        '<form class="filters decide" method="post" action="{action}">'
        '<input type="hidden" name="token" value="{token}">{digest}'
        '<label>Reason (optional; a denial\'s goes to the model)<input name="reason" maxlength="{most}" size="50">'
        '</label>{output}<button type="submit" name="decision" value="approve">Approve</button> '
        '<button type="submit" name="decision" value="deny">Deny</button></form>',
        action=f"{PATH}/{quote(approval_id, safe='')}", token=token, most=REASON_MAX, output=output,
        digest=when(isinstance(digest, str) and _DIGEST.fullmatch(digest),
                    render('<input type="hidden" name="arguments_sha256" value="{d}">', d=digest)))


def _moment(seconds: Any) -> Html:
    """A time of the approval's record (a number, unless Redis holds garbage)."""
    usable = isinstance(seconds, int | float) and not isinstance(seconds, bool) and 0 <= seconds < 1e11
    return when_at(seconds if usable else None)


def _approval(shown: Mapping[str, Any], form: Html) -> Html:
    kind = str(shown.get("kind") or "")
    arguments, data, message = shown.get("arguments"), shown.get("data"), shown.get("message")
    return render(
        '<section class="card approval" id="{id}" data-id="{id}"><h2>Tool <code class="tool">{tool}</code> {kind} '
        '<span class="muted">{kind_said}</span></h2>'
        '<p class="muted">asked {asked} · expires {expires}{key} · trajectory {trajectory} · call <code>{call}</code>'
        ' · <code>{id}</code></p>{message}{arguments}{digest}{data}{form}</section>',
        id=shown.get("id"), tool=shown.get("tool"), kind=tag(kind, "interrupted"), kind_said=_KINDS.get(kind, ""),
        asked=_moment(shown.get("created_at")), expires=_moment(shown.get("expires_at")),
        key=when(shown.get("key"), render(" · gateway key {k}", k=shown.get("key"))),
        trajectory=_trajectory(shown), call=shown.get("call_id") or "-",
        message=when(message, _block("message", str(message), "message")),
        arguments=_block("arguments", _pretty(arguments), "arguments"),
        digest=when(shown.get("arguments_sha256"), render('<p class="muted">arguments_sha256 <code class="digest">'
                                                          '{d}</code></p>', d=shown.get("arguments_sha256"))),
        data=when(data is not None, _block("data", _pretty(data), "data")), form=form)


def _said(query: Mapping[str, str]) -> Html:
    """The notice a redirect back asked for, if it is one of the page's."""
    approval_id = query.get("id", "")
    named = render(" (<code>{id}</code>)", id=approval_id) if _APPROVAL_ID.fullmatch(approval_id) else EMPTY
    if (done := _DONE.get(query.get("done", ""))) is not None:
        return render('<p class="hint" role="status">{text}{named}</p>', text=done, named=named)
    if (missed := _MISSED.get(query.get("missed", ""))) is not None:
        return render('<p class="notice" role="status">{text}{named}</p>', text=missed, named=named)
    return EMPTY


def _refusal(name: str | None) -> Html:
    return render('<p class="notice refusal">This gateway key (<code>{name}</code>) may not decide approvals: it '
                  'needs <code>approver</code> (or <code>operator</code>). It sees its own requests\' approvals '
                  'only.</p>', name=name or "-")


async def approvals_view(request: web.Request) -> web.Response:
    """GET /ui/approvals."""
    try:
        name = _signed_in(request)
    except _Refused as refused:
        return refused.response
    who = viewer(name, request.app[SETTINGS].keys)
    listed = await request.app[APPROVALS].pending(who)
    secret = form_secret(request, name)
    fresh = secrets.token_hex(32) if secret is None else None  # a browser's first visit, without keys
    key = secret if secret is not None else str(fresh).encode()
    cards = [_approval(shown, _decide_form(str(shown["id"]), str(shown.get("kind")), shown.get("arguments_sha256"),
                                           token_for(key, str(shown["id"]))) if who.may_decide else EMPTY)
             for shown in listed]
    body = render('{said}{refusal}{intro}{cards}', said=_said(request.query),
                  refusal=when(not who.may_decide, _refusal(name)),
                  intro=notice("No approval is pending." if not listed else
                               f"{len(listed):,} pending, oldest first. Each request waits until its call is "
                               "decided, or its time runs out. Reload for new ones."),
                  cards=join(cards))
    keyed = bool(request.app[SETTINGS].keys)
    answer = html(page("Approvals", body, PATH, keyed))
    if fresh is not None:
        answer.set_cookie(FORM_COOKIE, fresh, path=PATH, httponly=True, samesite="Strict", secure=request.secure)
    return answer


def _refused(status: int, text: str) -> _Refused:
    return _Refused(html(page("Approvals", render('{text}<p><a href="{path}">Back to the approvals</a></p>',
                                                  text=render('<p class="notice">{t}</p>', t=text), path=PATH)),
                         status=status))


def _output(form: Mapping[str, str]) -> tuple[Any, bool]:
    """The reviewer's output for an Interrupt's call, and whether there is one: JSON if it reads as
    JSON, else the text as it is."""
    text = form.get("output", "").strip()
    if not text:
        return None, False
    try:
        return json.loads(text), True
    except ValueError:
        return text, True


async def _checked(request: web.Request, approval_id: str) -> tuple[Viewer, dict[str, str]]:
    """The viewer and the form of a post the page takes: from the page itself, signed in (with keys),
    with the form's token."""
    if not same_origin(request):
        raise _refused(403, "Decisions are only taken from this gateway's own page.")
    name = _signed_in(request)
    form = await read_form(request)
    secret = form_secret(request, name)
    if secret is None or not hmac.compare_digest(form.get("token", "").encode(),
                                                 token_for(secret, approval_id).encode()):
        raise _refused(403, "This decision did not come from this gateway's page for you (or the page is from before "
                            "a restart): reload the page and decide again.")
    return viewer(name, request.app[SETTINGS].keys), form


async def decide_view(request: web.Request) -> web.Response:
    """POST /ui/approvals/{id}: approve or deny; back to the page."""
    approval_id = request.match_info["id"]
    try:
        who, form = await _checked(request, approval_id)
        decision = form.get("decision")
        reason = form.get("reason", "").strip() or None
        if decision not in ("approve", "deny"):
            raise _refused(400, "A decision is Approve or Deny.")
        if reason is not None and len(reason) > REASON_MAX:
            raise _refused(400, f"The reason is longer than {REASON_MAX:,} characters.")
        digest = form.get("arguments_sha256") or None
        if digest is not None and not _DIGEST.fullmatch(digest):
            raise _refused(400, "The arguments' digest is not a SHA-256 in hex: reload the page and decide again.")
        output, has_output = _output(form) if decision == "approve" else (None, False)
        await request.app[APPROVALS].decide(approval_id, who, decision, reason=reason, output=output,
                                            has_output=has_output, arguments_sha256=digest)
    except _Refused as refused:
        return refused.response
    except Forbidden as exc:
        return _refused(403, exc.message).response
    except (NotFound, Conflict) as exc:
        return redirect(_back(f"missed={exc.code}", approval_id))
    return redirect(_back(f"done={'approved' if decision == 'approve' else 'denied'}", approval_id))


def _back(said: str, approval_id: str) -> str:
    """The page, with the notice `said` about the approval (named when its id is one the gateway makes)."""
    return f"{PATH}?{said}" + (f"&id={approval_id}" if _APPROVAL_ID.fullmatch(approval_id) else "")


def mount(app: web.Application) -> None:
    app.router.add_get(PATH, approvals_view, **EXPECT)
    app.router.add_post(PATH + "/{id}", decide_view, **EXPECT)
