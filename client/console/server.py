"""Console: the HTTP server behind `tidemark console`, its sessions and its sampler.

    GET  /                         the single-page app (static/)
    GET  /api/session              who is signed in, whether actions are allowed
    POST /api/login {access_key, secret_key}   sign in: later calls use these credentials
    POST /api/logout
    GET  /api/overview             brokers: role, version, flush mode, uptime, replica lag
    GET  /api/topics               topics with queues and message rate
    GET  /api/topics/T             per queue min/max offsets, groups reading T
    GET  /api/groups               groups with members and total lag
    GET  /api/groups/G?since=MS    state, members, per-queue committed offset and lag, lag history
    POST /api/groups/G/reset {topic, target, value, queue?, execute}   preview (execute false) or apply
    GET  /api/messages?topic=T&key=K | &queue=Q&offset=O[&broker=B]
    GET  /api/dlq/G                dead letters of group G
    POST /api/dlq/G/requeue {msg_id | all: true}

Every call is made with the signed-in user's credentials, so the brokers' ACLs decide what each user
may read and do. Without a session, pages are read with the console's own credentials (its command
line's, if any); actions then need a sign-in whenever the console has credentials of its own (they are
there for reading and sampling, not to lend to visitors), and a cookie the console does not know is
refused, never quietly replaced by those credentials. `--read-only` refuses every action whoever asks.

Browser hardening: actions take JSON with the X-Tidemark-Console header (a cross-site form can send
neither without a CORS preflight, which the console never grants), a request whose body is refused
closes its connection (no keep-alive smuggling), a console on a loopback address answers only to
loopback host names (no DNS rebinding), and only the four files of static/ are served. Answers are JSON; an error is {"error": message} with the status the client library's
error class maps to (400 bad input, 401/403 credentials and rules, 404 unknown names, 503 brokers down).

Threads: one per HTTP request (ThreadingHTTPServer), one sampler recording every group's lag and every
topic's message count each `sample_interval_s`, so a group's chart has a past when its page is opened.
The Admin clients are thread-safe (each runs its calls on its own event loop).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tidemark.client.admin import Admin
from tidemark.client.console import views
from tidemark.client.console.history import History
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
from tidemark.client.runtime import ClientState, Lifecycle
from tidemark.client.settings import ClientSettings
from tidemark.common.auth import Credentials
from tidemark.common.logs import get_logger

log = get_logger("tidemark.console")

COOKIE = "tidemark_console"
ACTION_HEADER = "X-Tidemark-Console"
_MAX_BODY = 64 * 1024
_STATIC_FILES = frozenset({"index.html", "app.js", "chart.js", "style.css"})
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
# Sessions: at most this many (the least recently used goes first), each forgotten after this idle time.
MAX_SESSIONS = 64
SESSION_IDLE_S = 8 * 3600
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


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    read_only: bool = False
    sample_interval_s: float = 5.0


@dataclass(slots=True)
class _Session:
    user: str
    admin: Admin
    used: float = 0.0


class Console:
    """The console's lifecycle (created -> running -> shut down), its HTTP server, sessions and sampler."""

    def __init__(self, client: ClientSettings, settings: ConsoleSettings = ConsoleSettings()) -> None:
        self.client = client
        self.settings = settings
        self.history = History()
        self._lifecycle = Lifecycle("console")
        self._admin: Admin | None = None  # the console's own client, started on first use
        self._admin_lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._sessions_lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> tuple[str, int]:
        if self._httpd is None:
            raise TidemarkError("the console is not running")
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> Console:
        self._lifecycle.to(ClientState.STARTING)
        try:
            self._httpd = _Server((self.settings.host, self.settings.port), _Handler, self)
        except OSError as e:
            self._lifecycle.to(ClientState.SHUTDOWN)
            raise UnavailableError(f"console cannot listen on {self.settings.host}:{self.settings.port}: "
                                   f"{e.strerror or e}") from None
        try:
            self.default_admin()
        except TidemarkError as e:  # brokers down, or they want credentials: pages say so until it works
            log.warning("console started without reaching the brokers", event="console_brokers_unreachable",
                        error=str(e))
        self._threads = [threading.Thread(target=self._httpd.serve_forever, name="tidemark-console-http",
                                          daemon=True),
                         threading.Thread(target=self._sample_forever, name="tidemark-console-sampler",
                                          daemon=True)]
        for t in self._threads:
            t.start()
        self._lifecycle.to(ClientState.RUNNING)
        log.info("console listening", event="console_listening", host=self.address[0], port=self.address[1],
                 read_only=self.settings.read_only)
        return self

    def shutdown(self) -> None:
        if self._lifecycle.state is not ClientState.RUNNING:
            return
        self._lifecycle.to(ClientState.STOPPING)
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for t in self._threads:
            t.join()
        with self._sessions_lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            s.admin.shutdown()
        if self._admin is not None:
            self._admin.shutdown()
        self._lifecycle.to(ClientState.SHUTDOWN)

    def __enter__(self) -> Console:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _sample_forever(self) -> None:
        """Supervised by itself: a failed round is logged once per kind of failure and retried next tick."""
        last_error = ""
        while not self._stop.is_set():
            try:
                views.sample(self.default_admin(), self.history)
                last_error = ""
            except TidemarkError as e:
                if str(e) != last_error:
                    log.warning("console sampling failed, retrying", event="console_sample_failed", error=str(e))
                last_error = str(e)
            except Exception:  # a defect: say so loudly, keep the console serving
                log.exception("console sampler defect", event="console_sampler_defect")
            self._stop.wait(self.settings.sample_interval_s)

    # -- sessions ----------------------------------------------------------------

    def session(self, token: str | None) -> _Session | None:
        """The live session of a cookie; an idle one is closed and forgotten."""
        now = time.monotonic()
        with self._sessions_lock:
            s = self._sessions.get(token or "")
            if s is not None and now - s.used > SESSION_IDLE_S:
                del self._sessions[token or ""]
            elif s is not None:
                s.used = now
                return s
        if s is not None:
            s.admin.shutdown()
        return None

    def default_admin(self) -> Admin:
        """The console's own client (its command line's credentials, if any), started on first use and
        again after a failed start: the brokers may come up, or be reachable, after the console."""
        with self._admin_lock:
            if self._admin is None:
                admin = Admin(self.client)
                admin.start()
                self._admin = admin
            return self._admin

    def admin_for(self, token: str | None, *, acting: bool = False) -> Admin:
        """The client a request uses: its session's; without a cookie, the console's own, except for an
        action while the console has credentials of its own (sign in to act). An unknown or expired
        cookie is UnauthenticatedError: the visitor believes they are signed in."""
        if token:
            s = self.session(token)
            if s is None:
                raise UnauthenticatedError("the console session expired or is unknown: sign in again")
            return s.admin
        if acting and self.client.credentials is not None:
            raise UnauthenticatedError("sign in to the console to act: its own credentials are only for reading")
        return self.default_admin()

    def login(self, access_key: str, secret_key: str) -> tuple[str, _Session]:
        """Check the credentials against the brokers (one read), then remember them for the cookie."""
        if not access_key or not secret_key:
            raise InvalidArgumentError("sign in with an access key and its secret key")
        admin = Admin(replace(self.client, credentials=Credentials(access_key, secret_key)))
        try:
            admin.start()
            admin.list_topics()
        except BaseException:
            admin.shutdown()
            raise
        token = secrets.token_urlsafe(32)
        session = _Session(access_key, admin, time.monotonic())
        with self._sessions_lock:
            self._sessions[token] = session
            evicted = []
            while len(self._sessions) > MAX_SESSIONS:
                oldest = min(self._sessions, key=lambda k: self._sessions[k].used)
                evicted.append(self._sessions.pop(oldest))
        for old in evicted:
            old.admin.shutdown()
        log.info("console sign-in", event="console_login", user=access_key)
        return token, session

    def logout(self, token: str | None) -> None:
        with self._sessions_lock:
            session = self._sessions.pop(token or "", None)
        if session is not None:
            session.admin.shutdown()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], console: Console) -> None:
        self.console = console
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

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
        if self.server.console.settings.host not in _LOOPBACK_NAMES:
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
        console = self.server.console
        if not parts or parts[0] != "api":
            return self._static(parts)
        if parts[1:] == ["session"]:  # answered without the brokers: the sign-in form needs it first
            token = self._token()
            s = console.session(token)
            forget = {"Set-Cookie": f"{COOKIE}=; Path=/; Max-Age=0; SameSite=Strict"} if token and not s else None
            return self._json(HTTPStatus.OK, {"user": s.user if s else None,
                                              "read_only": console.settings.read_only}, forget)
        admin = console.admin_for(self._token())
        match parts[1:]:
            case ["overview"]:
                doc = views.overview(admin)
            case ["topics"]:
                doc = views.topics(admin, console.history, include_system=query.get("system") == "1")
            case ["topics", name]:
                doc = views.topic(admin, console.history, name)
            case ["groups"]:
                doc = views.groups(admin, console.history)
            case ["groups", name]:
                doc = views.group(admin, console.history, name, since_ms=_int(query.get("since", "0")))
            case ["messages"]:
                doc = views.messages(admin, query)
            case ["dlq", name]:
                doc = views.dead_letters(admin, name)
            case _:
                raise NotFoundError(f"no such page: {url.path}")
        self._json(HTTPStatus.OK, doc)

    def _post(self) -> None:
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        console = self.server.console
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
        admin = console.admin_for(self._token(), acting=True)
        match parts:
            case ["api", "groups", name, "reset"]:
                req = views.ResetRequest.parse(body)
                doc = views.reset(admin, name, req)
                if req.execute:
                    log.info("offsets reset from the console", event="console_offset_reset", group=name, topic=req.topic, target=req.target.value,
                             value=req.value, user=self._user())
            case ["api", "dlq", name, "requeue"]:
                doc = views.requeue(admin, name, body)
                log.info("dead letters requeued from the console", event="console_dlq_requeue", group=name, count=len(doc["requeued"]), user=self._user())
            case _:
                raise NotFoundError(f"no such action: {self.path}")
        self._json(HTTPStatus.OK, doc)

    def _user(self) -> str:
        s = self.server.console.session(self._token())
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
