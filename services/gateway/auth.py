"""Bearer tokens → tenant and role, for the gateway.

RACKSCALE_TOKENS_FILE names a YAML file (a Kubernetes Secret or a compose mount):

    tokens:
      - {token: "s3cret-alice", tenant: alice, role: user}
      - {sha256: "9f86d08…", tenant: ops, role: admin}     # the token's SHA-256 (hex) instead of the token

A user sees, lists and cancels only its tenant's jobs (another tenant's job is a 404, as if it did not
exist, so ids don't leak) and submits only as its tenant; an admin sees everything and drains nodes.
No file: the gateway runs open (every caller is an admin), for local use only — `rackscale up` says so.

`/healthz`, `/readyz`, `/openapi.json` and the dashboard's static files stay open: probes carry no token, and
the dashboard's files carry no data (its script calls the API with the token it was opened with). A browser's
EventSource can't send headers, so GET /v1/events alone also takes the token as `?token=`; the access log
(`AccessLog`) writes that parameter as `***`. `/metrics` on the API port names
every tenant, so it takes an admin token; Prometheus scrapes the unauthenticated ops port
(RACKSCALE_METRICS_PORT), which is reachable only inside the cluster network.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import msgspec
import yaml
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from yarl import URL

from services.gateway import dashboard
from services.gateway.jobfiles import SCHEMA_PATH
from shared.api import ErrorBody

log = logging.getLogger("rackscale.gateway.auth")

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", SCHEMA_PATH, *dashboard.PATHS})
QUERY_TOKEN_PATHS = frozenset({"/v1/events"})  # GETs that take ?token= (EventSource sends no Authorization header)
QUERY_TOKEN = "token"
SCHEME = "bearer"  # the OpenAPI security scheme's name
PRINCIPAL = web.RequestKey("principal", object)  # Principal, or OPEN in open mode

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokensError(ValueError):
    """The tokens file can't be used; the message names the file and the entry."""


class Role(StrEnum):
    USER = "user"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    role: Role

    @property
    def admin(self) -> bool:
        return self.role is Role.ADMIN

    def may_see(self, tenant: str) -> bool:
        return self.admin or tenant == self.tenant


OPEN = Principal(tenant="", role=Role.ADMIN)  # open mode: no tokens configured, everyone may do everything


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Tokens:
    """SHA-256 of each token → its principal; only digests are kept in memory."""

    def __init__(self, by_digest: dict[str, Principal]) -> None:
        self._by_digest = by_digest

    def __len__(self) -> int:
        return len(self._by_digest)

    @classmethod
    def load(cls, path: str | Path) -> Tokens:
        try:
            doc = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise TokensError(f"{path}: {e}") from None
        entries = doc.get("tokens") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not entries:
            raise TokensError(f"{path}: expected a non-empty list under 'tokens'")
        by_digest: dict[str, Principal] = {}
        for i, e in enumerate(entries):
            where = f"{path}: tokens[{i}]"
            if not isinstance(e, dict):
                raise TokensError(f"{where}: expected a mapping")
            unknown = set(e) - {"token", "sha256", "tenant", "role"}
            if unknown:
                raise TokensError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
            tenant, role = e.get("tenant"), e.get("role", "user")
            if not isinstance(tenant, str) or not tenant:
                raise TokensError(f"{where}: 'tenant' must be a non-empty string")
            if role not in set(Role):
                raise TokensError(f"{where}: 'role' must be user or admin, got {role!r}")
            if ("token" in e) == ("sha256" in e):
                raise TokensError(f"{where}: give exactly one of 'token' and 'sha256'")
            if "token" in e:
                token = e["token"]
                if not isinstance(token, str) or len(token) < 16:
                    raise TokensError(f"{where}: 'token' must be a string of at least 16 characters")
                digest = _digest(token)
            else:
                digest = str(e["sha256"]).lower()
                if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                    raise TokensError(f"{where}: 'sha256' must be 64 hex digits")
            if digest in by_digest:
                raise TokensError(f"{where}: the same token appears twice")
            by_digest[digest] = Principal(tenant=tenant, role=Role(role))
        return cls(by_digest)

    def lookup(self, token: str) -> Principal | None:
        digest = _digest(token)
        for known, principal in self._by_digest.items():
            # compare digests in constant time (the dict's own lookup would too, but this says so)
            if hmac.compare_digest(known, digest):
                return principal
        return None


def _unauthorized(error: str) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(ErrorBody(error=error)),
        status=401,
        content_type="application/json",
        headers={"WWW-Authenticate": 'Bearer realm="rackscale"'},
    )


def middleware(tokens: Tokens | None) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """Puts the caller's Principal on the request (OPEN without tokens); 401 for a missing or unknown token."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if tokens is None or request.path in PUBLIC_PATHS:
            request[PRINCIPAL] = OPEN if tokens is None else None
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if not header and request.method == "GET" and request.path in QUERY_TOKEN_PATHS:
            scheme, token = "bearer", request.query.get(QUERY_TOKEN, "")
            if not token.strip():
                return _unauthorized(f"missing bearer token (Authorization: Bearer <token>, or ?{QUERY_TOKEN}=)")
        elif not header:
            return _unauthorized("missing bearer token (Authorization: Bearer <token>)")
        if scheme.lower() != "bearer" or not token.strip():
            return _unauthorized("the Authorization header must be 'Bearer <token>'")
        principal = tokens.lookup(token.strip())
        if principal is None:
            return _unauthorized("unknown or revoked token")
        request[PRINCIPAL] = principal
        return await handler(request)

    return authenticate


def principal(request: web.Request) -> Principal:
    p = request.get(PRINCIPAL)
    assert isinstance(p, Principal), "route not behind the auth middleware"
    return p


def redacted(url: URL) -> str:
    """The path and query of a request as logged: a token parameter shows as `***`."""
    if QUERY_TOKEN not in url.query:
        return str(url)
    return str(url.with_query([(k, "***" if k == QUERY_TOKEN else v) for k, v in url.query.items()]))


class AccessLog(AbstractAccessLogger):
    """aiohttp's access log line (client, request, status, size, seconds) with no credential in it."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info(
            '%s "%s %s" %s %s %.3fs',
            request.remote,
            request.method,
            redacted(request.rel_url),
            response.status,
            response.body_length,
            time,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
