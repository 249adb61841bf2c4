"""What every /ui page answers with: a page of HTML or a redirect, never stored; the sign-in form
a page answers a request without a key with; a posted form, read."""

from __future__ import annotations

from urllib.parse import parse_qs

from aiohttp import web

from gateway.http.bodies import read_body
from gateway.ui.layout import page
from gateway.ui.markup import Html, render, when


def secured(response: web.Response) -> web.Response:
    """A page or a redirect: never stored (ui.PAGE_HEADERS come with every /ui response)."""
    response.headers["Cache-Control"] = "no-store"
    return response


def html(markup: Html, status: int = 200) -> web.Response:
    return secured(web.Response(text=markup, status=status, content_type="text/html", charset="utf-8"))


def redirect(location: str) -> web.Response:
    """303 See Other: after a form's post, the page it goes back to."""
    return secured(web.Response(status=303, headers={"Location": location}))


def sign_in_page(next_path: str, message: str | None = None) -> web.Response:
    """The 401 answer: a form that takes a gateway key once and comes back to the page asked for."""
    form = render(
        '<section class="card login"><p>This gateway has keys: sign in with one of them to see its '
        'trajectories. (Scripts can send it as <code>Authorization: Bearer</code> instead.)</p>{message}'
        '<form method="post" action="/ui/login"><input type="hidden" name="next" value="{next}">'
        '<label>Gateway key<input name="key" type="password" autocomplete="current-password" required></label>'
        '<button type="submit">Sign in</button></form></section>',
        next=next_path, message=when(message, render('<p class="notice">{m}</p>', m=message)))
    response = html(page("Sign in", form), status=401)
    response.headers["WWW-Authenticate"] = 'Bearer realm="toolspan"'
    return response


async def read_form(request: web.Request) -> dict[str, str]:
    """A posted form's fields (the first value of each; empty ones left out)."""
    raw = await read_body(request)
    return {name: values[0] for name, values in parse_qs(raw.decode("utf-8", "replace")).items()}
