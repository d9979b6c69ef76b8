"""Console: the HTTP server behind `tidemark console`, its sessions and its sampler.

The API (client/console/handler.py routes it; views.py, browse.py and manage.py build the answers):

    GET  /                         the single-page app (static/)
    GET  /api/session              who is signed in, whether actions are allowed, whether the brokers
                                   ask visitors to sign in (they refused the console's own client)
    POST /api/login {access_key, secret_key}   sign in: later calls use these credentials
    POST /api/logout
    GET  /api/overview             brokers: role, version, flush mode, uptime, replica lag
    GET  /api/topics               topics with queues and message rate
    GET  /api/topics/T             per queue min/max offsets, groups reading T
    GET  /api/topics/T/messages?latest=N | ?from=MS[&to=MS][&limit=N]   browse: newest, or from a time
    POST /api/topics {topic, queues, brokers?, execute}        create a topic (plan unless execute)
    POST /api/topics/T/delete {execute, force?}                 delete a topic (plan unless execute)
    GET  /api/groups               groups with members and total lag
    GET  /api/groups/G?since=MS    state, members, per-queue committed offset and lag, lag history
    POST /api/groups/G/reset {topic, target, value, queue?, execute}   preview (execute false) or apply
    GET  /api/messages?msg_id=I | ?topic=T&key=K | ?topic=T&queue=Q&offset=O[&broker=B]
    GET  /api/dlq/G                dead letters of group G, each marked requeued or waiting
    POST /api/dlq/G/requeue {msg_id | all: true, execute}       requeue (plan unless execute)
    GET  /api/users, GET /api/acls[?user=U]
    POST /api/users {name, secret_key, super_user?, execute}    POST /api/users/U/delete {execute}
    POST /api/acls {user, resource, actions, decision, execute} POST /api/acls/delete {user, resource?, execute}

Every change follows the CLI's rule: a plan unless execute is true (the same plan functions,
tidemark.client.change_plans), so a page shows what would change and an Apply button makes it so.

Every call is made with the signed-in user's credentials, so the brokers' ACLs decide what each user
may read and do. Without a session, pages are read with the console's own credentials (its command
line's, if any); actions then need a sign-in whenever the console has credentials of its own (they are
there for reading and sampling, not to lend to visitors), and a cookie the console does not know is
refused, never quietly replaced by those credentials. When the brokers refuse the console's own client
for want of credentials, pages answer 401 and the app shows its sign-in prompt instead. `--read-only`
refuses every action whoever asks.

Threads: one per HTTP request (ThreadingHTTPServer), one sampler recording every group's lag and every
topic's message count each `sample_interval_s`, so a group's chart has a past when its page is opened.
The Admin clients are thread-safe (each runs its calls on its own event loop).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, replace
from http.server import ThreadingHTTPServer

from tidemark.client.admin import Admin
from tidemark.client.console import views
from tidemark.client.console.handler import Handler
from tidemark.client.console.history import History
from tidemark.client.errors import (
    InvalidArgumentError,
    PermissionDeniedError,
    TidemarkError,
    UnauthenticatedError,
    UnavailableError,
)
from tidemark.client.runtime import ClientState, Lifecycle
from tidemark.client.settings import ClientSettings
from tidemark.common.auth import Credentials
from tidemark.common.logs import get_logger

log = get_logger("tidemark.console")

# Sessions: at most this many (the least recently used goes first), each forgotten after this idle time.
MAX_SESSIONS = 64
SESSION_IDLE_S = 8 * 3600
# After the brokers refused the console's own client, pages answer from that refusal for this long
# instead of connecting again on every request.
REFUSAL_MEMORY_S = 5.0
SIGN_IN_PLEASE = "sign in: the brokers ask for credentials"


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
        self._refused: tuple[float, UnauthenticatedError] | None = None  # the brokers' last refusal of it
        self._sessions: dict[str, _Session] = {}
        self._sessions_lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: _Server | None = None
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> tuple[str, int]:
        if self._httpd is None:
            raise TidemarkError("the console is not running")
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def sign_in_required(self) -> bool:
        """The brokers refused the console's own client for want of credentials: visitors must sign in."""
        return self._refused is not None and self.client.credentials is None

    def start(self) -> Console:
        self._lifecycle.to(ClientState.STARTING)
        try:
            self._httpd = _Server((self.settings.host, self.settings.port), Handler, self)
        except OSError as e:
            self._lifecycle.to(ClientState.SHUTDOWN)
            raise UnavailableError(f"console cannot listen on {self.settings.host}:{self.settings.port}: "
                                   f"{e.strerror or e}") from None
        self._first_contact()
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

    def _first_contact(self) -> None:
        """Reach the brokers once and say how that went: a refusal for want of credentials is the normal
        state of a console of an --auth cluster started without any (visitors sign in), not an outage."""
        try:
            self.default_admin()
        except UnauthenticatedError as e:
            if self.client.credentials is None:
                log.info("the brokers ask for credentials: visitors sign in to the console",
                         event="console_sign_in_required")
            else:
                log.warning("the brokers refused the console's credentials: visitors sign in to the console",
                            event="console_credentials_refused", error=str(e))
        except PermissionDeniedError as e:
            log.warning("the console's credentials may not read the cluster", event="console_not_allowed",
                        error=str(e))
        except TidemarkError as e:  # brokers down: pages say so until they answer
            log.warning("console started without reaching the brokers", event="console_brokers_unreachable",
                        error=str(e))

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
        """Supervised by itself: a failed round is logged once per kind of failure and retried next tick.
        Brokers that want credentials the console lacks are not a failure: charts then fill while pages
        are open (every group page records a point)."""
        last_error = ""
        while not self._stop.is_set():
            try:
                views.sample(self.default_admin(), self.history)
                last_error = ""
            except UnauthenticatedError as e:
                if str(e) != last_error and not self.sign_in_required:
                    log.warning("console sampling refused, retrying", event="console_sample_failed", error=str(e))
                last_error = str(e)
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
        again after a failed start: the brokers may come up, or be reachable, after the console. A refusal
        for want of credentials is remembered for REFUSAL_MEMORY_S, so pages do not reconnect each time."""
        with self._admin_lock:
            if self._admin is None:
                if self._refused is not None and time.monotonic() - self._refused[0] < REFUSAL_MEMORY_S:
                    raise self._refused[1]
                admin = Admin(self.client)
                try:
                    admin.start()
                except UnauthenticatedError as e:
                    self._refused = (time.monotonic(), e)
                    raise
                self._admin, self._refused = admin, None
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
        try:
            return self.default_admin()
        except UnauthenticatedError:
            if self.client.credentials is None:
                raise UnauthenticatedError(SIGN_IN_PLEASE) from None
            raise

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

    def __init__(self, address: tuple[str, int], handler: type[Handler], console: Console) -> None:
        self.console = console
        super().__init__(address, handler)
