"""The web dashboard: one static page (services/gateway/static/), served by the gateway.

The page holds no data: its script reads /v1/cluster and /v1/jobs with the caller's token and redraws on
every server-sent event of /v1/events, so the files are public like /openapi.json. The only value the
server puts in the page is the Jaeger UI's base URL (RACKSCALE_JAEGER_UI_URL), escaped into a <meta>.
"""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PAGE = "/dashboard"
ASSETS = {"/dashboard/dashboard.js": "application/javascript", "/dashboard/dashboard.css": "text/css"}
PATHS = frozenset({"/", PAGE, *ASSETS})  # public: none of them carries data
_JAEGER_SLOT = "__RACKSCALE_JAEGER_UI__"

# Strict: scripts and styles only from these files (no inline code, so an escaped-wrong string can't run);
# the page talks to its own origin only; no Referer, so a ?token= in the address never travels on.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _static(name: str) -> bytes:
    return resources.files("services.gateway").joinpath("static", name).read_bytes()


def page(jaeger_ui: str) -> bytes:
    """The HTML with the Jaeger UI's base URL in place."""
    text = _static("dashboard.html").decode()
    return text.replace(_JAEGER_SLOT, html.escape(jaeger_ui.rstrip("/"), quote=True)).encode()


def routes(jaeger_ui: str) -> list[tuple[str, str, Handler]]:
    """GET / (redirects, keeping the query), the page and its two files; read once, at startup."""
    body = page(jaeger_ui)
    assets = {path: (_static(path.rsplit("/", 1)[1]), kind) for path, kind in ASSETS.items()}

    async def index(request: web.Request) -> web.StreamResponse:
        query = request.query_string
        raise web.HTTPFound(PAGE + (f"?{query}" if query else ""))

    async def dashboard(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/html", charset="utf-8", headers=HEADERS)

    async def asset(request: web.Request) -> web.Response:
        data, kind = assets[request.path]
        return web.Response(body=data, content_type=kind, charset="utf-8", headers=HEADERS)

    return [("GET", "/", index), ("GET", PAGE, dashboard)] + [("GET", path, asset) for path in ASSETS]
