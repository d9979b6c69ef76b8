"""The console's HTTP handler: plumbing (JSON in and out, cookies, the CSRF and host guards, static files)
and the routes, each one call of views, browse or manage. No rule of the domain lives here: a route picks
the client and hands the request's fields to the function that knows what they mean.

Answers are JSON; an error is {"error": message} with the status the client library's error class maps to
(400 bad input, 401/403 credentials and rules, 404 unknown names, 409 exists or in use, 503 brokers down).

Browser hardening: actions take JSON with the X-Tidemark-Console header (a cross-site form can send
neither without a CORS preflight, which the console never grants), a request whose body is refused
closes its connection (no keep-alive smuggling), a console on a loopback address answers only to
loopback host names (no DNS rebinding), and only the files of static/ are served.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from tidemark.client.admin import Admin
from tidemark.client.console import browse, manage, views
from tidemark.client.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RequestTimeoutError,
    TidemarkError,
    UnauthenticatedError,
    UnavailableError,
)
from tidemark.common.logs import get_logger

if TYPE_CHECKING:
    from tidemark.client.console.server import Console

log = get_logger("tidemark.console")

COOKIE = "tidemark_console"
ACTION_HEADER = "X-Tidemark-Console"
_MAX_BODY = 64 * 1024
_STATIC_FILES = frozenset({"index.html", "app.js", "ui.js", "messages.js", "manage.js", "chart.js", "style.css"})
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
_STATUS: list[tuple[type[TidemarkError], HTTPStatus]] = [
    (InvalidArgumentError, HTTPStatus.BAD_REQUEST),
    (UnauthenticatedError, HTTPStatus.UNAUTHORIZED),
    (PermissionDeniedError, HTTPStatus.FORBIDDEN),
    (NotFoundError, HTTPStatus.NOT_FOUND),
    (AlreadyExistsError, HTTPStatus.CONFLICT),
    (FailedPreconditionError, HTTPStatus.CONFLICT),
    (UnavailableError, HTTPStatus.SERVICE_UNAVAILABLE),
    (RequestTimeoutError, HTTPStatus.GATEWAY_TIMEOUT),
]
_STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def status_of(error: TidemarkError) -> HTTPStatus:
    return next((s for cls, s in _STATUS if isinstance(error, cls)), HTTPStatus.INTERNAL_SERVER_ERROR)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def console(self) -> Console:
        return self.server.console  # type: ignore[attr-defined]

    # -- plumbing ----------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        log.debug("console request", event="console_request", line=format % args)

    def _token(self) -> str | None:
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
        return None

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: HTTPStatus, doc: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(doc, default=str).encode(), "application/json", headers)

    def _body(self) -> dict[str, Any]:
        if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/json" \
                or self.headers.get(ACTION_HEADER) != "1":
            # Forms from other sites can send neither without a CORS preflight: this is the CSRF guard.
            raise InvalidArgumentError(f"send the request as application/json with {ACTION_HEADER}: 1")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise InvalidArgumentError("bad Content-Length") from None
        if not 0 <= length <= _MAX_BODY:
            raise InvalidArgumentError(f"request body over {_MAX_BODY} bytes")
        try:
            doc = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise InvalidArgumentError("the request body is not JSON") from None
        if not isinstance(doc, dict):
            raise InvalidArgumentError("the request body must be a JSON object")
        return doc

    def _dispatch(self, route) -> None:
        try:
            self._check_host()
            route()
        except TidemarkError as e:
            self.close_connection = True  # a refused request's body may be unread: never parse it as a request
            self._json(status_of(e), {"error": str(e)})
        except Exception:
            self.close_connection = True
            log.exception("console request failed", event="console_request_failed", path=self.path)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error: see the console's log"})

    def _check_host(self) -> None:
        """A console on a loopback address answers only to loopback names: a page of another site whose
        name was re-pointed at 127.0.0.1 (DNS rebinding) is refused."""
        if self.console.settings.host not in _LOOPBACK_NAMES:
            return
        host = self.headers.get("Host", "")
        name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
        if name not in _LOOPBACK_NAMES:
            raise PermissionDeniedError(f"this console answers only to 127.0.0.1 or localhost, not {name!r}")

    # -- routes ------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self._dispatch(self._get)

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch(self._post)

    def _get(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        console = self.console
        if not parts or parts[0] != "api":
            return self._static(parts)
        if parts[1:] == ["session"]:  # answered without the brokers: the sign-in form needs it first
            token = self._token()
            s = console.session(token)
            forget = {"Set-Cookie": f"{COOKIE}=; Path=/; Max-Age=0; SameSite=Strict"} if token and not s else None
            return self._json(HTTPStatus.OK, {"user": s.user if s else None, "read_only": console.settings.read_only,
                                              "sign_in_required": console.sign_in_required}, forget)
        self._json(HTTPStatus.OK, self._read(console.admin_for(self._token()), parts[1:], query, url.path))

    def _read(self, admin: Admin, parts: list[str], query: dict[str, str], path: str) -> Any:
        history = self.console.history
        match parts:
            case ["overview"]:
                return views.overview(admin)
            case ["topics"]:
                return views.topics(admin, history, include_system=query.get("system") == "1")
            case ["topics", name]:
                return views.topic(admin, history, name)
            case ["topics", name, "messages"]:
                return browse.topic_messages(admin, name, query)
            case ["groups"]:
                return views.groups(admin, history)
            case ["groups", name]:
                return views.group(admin, history, name, since_ms=_int(query.get("since", "0")))
            case ["messages"]:
                return browse.lookup(admin, query)
            case ["messages", "trace"]:
                return browse.trace(admin, query)
            case ["dlq", name]:
                return browse.dead_letters(admin, name)
            case ["users"]:
                return manage.users(admin)
            case ["acls"]:
                return manage.acls(admin, query.get("user") or None)
        raise NotFoundError(f"no such page: {path}")

    def _post(self) -> None:
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        console = self.console
        body = self._body()
        match parts:
            case ["api", "login"]:
                token, session = console.login(str(body.get("access_key", "")), str(body.get("secret_key", "")))
                cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
                return self._json(HTTPStatus.OK, {"user": session.user}, {"Set-Cookie": cookie})
            case ["api", "logout"]:
                console.logout(self._token())
                return self._json(HTTPStatus.OK, {"user": None},
                                  {"Set-Cookie": f"{COOKIE}=; Path=/; Max-Age=0; SameSite=Strict"})
        if console.settings.read_only:
            raise PermissionDeniedError("the console was started with --read-only: no actions")
        doc = self._act(console.admin_for(self._token(), acting=True), parts[1:], body)
        if doc.get("executed"):
            log.info("console action", event="console_action", action="/".join(parts[1:]), by=self._user(),
                     **{k: v for k, v in body.items() if k in ("topic", "target", "value", "queue", "user", "name",
                                                                "resource", "msg_id", "all", "force")})
        self._json(HTTPStatus.OK, doc)

    def _act(self, admin: Admin, parts: list[str], body: dict[str, Any]) -> dict[str, Any]:
        match parts:
            case ["groups", name, "reset"]:
                return views.reset(admin, name, views.ResetRequest.parse(body))
            case ["dlq", name, "requeue"]:
                return browse.requeue(admin, name, body)
            case ["topics"]:
                return manage.create_topic(admin, body)
            case ["topics", name, "delete"]:
                return manage.delete_topic(admin, name, body)
            case ["users"]:
                return manage.create_user(admin, body)
            case ["users", name, "delete"]:
                return manage.delete_user(admin, name, body)
            case ["acls"]:
                return manage.create_acl(admin, body)
            case ["acls", "delete"]:
                return manage.delete_acl(admin, body)
        raise NotFoundError(f"no such action: {self.path}")

    def _user(self) -> str:
        s = self.console.session(self._token())
        return s.user if s else "-"

    def _static(self, parts: list[str]) -> None:
        name = "/".join(parts) or "index.html"
        if name not in _STATIC_FILES:
            raise NotFoundError(f"no such file: /{name}")
        target = resources.files("tidemark.client.console") / "static" / name
        self._send(HTTPStatus.OK, target.read_bytes(), _STATIC_TYPES["." + name.rsplit(".", 1)[-1]])


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"not an integer: {text!r}") from None
