"""One broker's connection to an etcd cluster of one or more members (`--controller etcd://A,B,C`).

aetcd talks to one member. This keeps a client of one member at a time and moves to the next member
once a call through it fails: the member died (the call fails at once), froze or lost its quorum (the
call outlives `call_timeout_s`), or forgot this broker's auth token (etcd restarted). Closing the old
client ends every watch it carries, so a watcher starts again on the next member. Nothing here retries:
the callers (lease keeper, watch loop, start-up) already retry on their own schedule, and each retry
now reaches a member that may answer. With one member, "the next" is the same one, reconnected.

etcd's own authentication (`controller_user`, NAME:PASSWORD; etcd with `auth enable`) is done per
client: each new connection authenticates before its first call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aetcd

from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.etcd")

# What a failed etcd call raises (callers catch these): aetcd's errors, timeouts, the OS's.
MEMBER_FAILURES = (aetcd.exceptions.ClientError, OSError, TimeoutError)
# Those that say the member itself failed, and move the next call to the next member. etcd's answers (a
# lease not found, a permission refused, a failed precondition) are not among them: another member would
# answer the same, and leaving this one would end every watch for nothing.
_MEMBER_DOWN = (aetcd.exceptions.ConnectionFailedError, aetcd.exceptions.ConnectionTimeoutError,
                aetcd.exceptions.UnauthenticatedError, aetcd.exceptions.InternalError, OSError, TimeoutError)
CONNECT_TIMEOUT_S = 5.0
PROBE_KEY = b"/tidemark/"  # inside the prefix a broker's etcd role may read
WATCH_END_S = 1.0  # end_watch's bound on a watch's cancellation


class EtcdMembers:
    """An aetcd-shaped client (the calls the controller makes) over every member. Event loop only."""

    def __init__(self, endpoints: list[tuple[str, int]], *, user: str = "", password: str = "",
                 call_timeout_s: float = 1.0) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self._endpoints = list(endpoints)
        self._user, self._password = user or None, password or None
        self._timeout = call_timeout_s
        self._next = 0  # the member the next new client dials
        self._client: aetcd.Client | None = None
        self._endpoint = ""  # host:port of the member _client talks to
        self._dialing: asyncio.Lock | None = None
        self.transactions = aetcd.client.Transactions()  # builds compare/request objects; no connection

    @property
    def endpoint(self) -> str:
        """host:port of the member calls go to now ("" between members)."""
        return self._endpoint if self._client is not None else ""

    async def connect(self) -> None:
        """A member that answers, from the next one on; ConnectionError naming each failure when none does."""
        await self._current()

    async def _current(self) -> aetcd.Client:
        if self._client is not None:
            return self._client
        if self._dialing is None:
            self._dialing = asyncio.Lock()
        async with self._dialing:
            if self._client is not None:
                return self._client
            errors = []
            for _ in self._endpoints:
                host, port = self._endpoints[self._next % len(self._endpoints)]
                self._next += 1
                client = aetcd.Client(host, port, username=self._user, password=self._password)
                try:  # a member that just started may take a while to answer its first call (not wait_for: _call)
                    async with asyncio.timeout(max(self._timeout, CONNECT_TIMEOUT_S)):
                        await self._greet(client)
                except MEMBER_FAILURES as e:
                    errors.append(f"{host}:{port}: {e or type(e).__name__}")
                    await _close_quietly(client)
                    continue
                except BaseException:  # cancelled (a stop): the half-made client goes too
                    await _close_quietly(client)
                    raise
                self._client = client
                self._endpoint = f"{host}:{port}"
                return client
            raise ConnectionError("no etcd member answers (" + "; ".join(errors) + ")")

    @staticmethod
    async def _greet(client: aetcd.Client) -> None:
        await client.connect()  # authenticates, when a user is set
        await client.get(PROBE_KEY)  # linearizable: a member cut off from its quorum does not pass (status would)

    async def _failed(self, client: aetcd.Client, endpoint: str, error: BaseException) -> None:
        """A call through `client` failed: the next call goes to the next member (once per failed client)."""
        if self._client is not client:
            return  # another call already moved on
        self._client = None
        log.warning("etcd member %s failed (%r): moving to the next member", endpoint, error,
                    event="etcd_member_failed")
        await _close_quietly(client)  # ends its watches: their loops watch again through the next member

    async def _call(self, name: str, *args: Any, **kw: Any) -> Any:
        client = await self._current()
        endpoint = self._endpoint
        try:
            async with asyncio.timeout(self._timeout):  # (not wait_for: see below)
                answer = await getattr(client, name)(*args, **kw)
        except MEMBER_FAILURES as e:
            if isinstance(e, _MEMBER_DOWN) or "leader" in str(e):  # (no leader, leader changed: its quorum)
                await self._failed(client, endpoint, e)
            raise
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or self._client is client:
                raise  # this caller is being cancelled
            # Another call left this member behind and closed its channel, which cancels the calls still
            # on it: to this caller that is a failed call, not its own cancellation.
            raise aetcd.exceptions.ConnectionFailedError(f"etcd member {endpoint} was left "
                                                         f"behind during the call") from None
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Python 3.11's asyncio.wait_for, which aetcd waits with (a watch's creation, a connection),
            # returns a call that finished as its caller was cancelled and loses the cancellation: it is
            # delivered here. A stopping master's switchover task, cancelled as etcd answered, went on
            # watching a member left behind, and the stop's cancel_and_wait waited for it until the fault
            # checker killed the broker 30 s later (controller scenario, seed 19700).
            raise asyncio.CancelledError
        return answer

    async def status(self) -> Any:
        return await self._call("status")

    async def get(self, key: bytes) -> Any:
        return await self._call("get", key)

    async def get_prefix(self, prefix: bytes) -> Any:
        return await self._call("get_prefix", prefix)

    async def put(self, key: bytes, value: bytes, **kw: Any) -> Any:
        return await self._call("put", key, value, **kw)

    async def transaction(self, *, compare: list, success: list, failure: list) -> Any:
        return await self._call("transaction", compare=compare, success=success, failure=failure)

    async def lease(self, ttl: int) -> Any:
        return await self._call("lease", ttl)

    async def refresh_lease(self, lease_id: int) -> Any:
        """etcd's answer to one keepalive (TTL 0: the lease is gone). A keepalive stream that ended without
        an answer is a failed call, never taken for an expired lease (which would fence a live master)."""
        client = await self._current()
        endpoint = self._endpoint
        reply = await self._call("refresh_lease", lease_id)
        if reply is None:
            error = aetcd.exceptions.ConnectionFailedError("the keepalive stream ended without an answer")
            await self._failed(client, endpoint, error)
            raise error
        return reply

    async def revoke_lease(self, lease_id: int) -> Any:
        return await self._call("revoke_lease", lease_id)

    async def watch(self, key: bytes) -> Any:
        """A watch of `key` on the current member; it ends (or raises) when that member is left behind."""
        return await self._call("watch", key)

    async def probe(self) -> None:
        """One linearizable read through the current member: one that froze or lost its quorum is left
        behind (and its watches end) within a call timeout, though a watcher asks nothing else of it."""
        await self._call("get", PROBE_KEY)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()


async def _close_quietly(client: aetcd.Client) -> None:
    try:
        await client.close()
    except Exception as e:  # a channel already broken: nothing left to release
        log.debug("closing an etcd client failed: %r", e)


async def end_watch(watch: Any, timeout_s: float = WATCH_END_S) -> None:
    """Cancel an etcd watch, waiting at most `timeout_s`: a caller ends its watch in a `finally`, often while
    its task is being cancelled, and nothing cancels it a second time.

    aetcd's Watch.cancel() takes its watcher's lock and puts a request on a queue of ten that only the
    watch stream drains; after a member was left behind (its client closed under the watch) the lock or
    the queue can wait for ever. A master stopping on SIGTERM, just back from a pause longer than its
    lease, waited there until it was killed: its switchover watch's task never ended, so neither did
    `cancel_and_wait` in its stop, and for 30 s nobody took over (the fault checker's controller
    scenario, 3 of 14 runs of seeds 19700-19705). A watch left uncancelled costs nothing more: its client
    is closed with the member it watched, or with the broker."""
    try:
        async with asyncio.timeout(timeout_s):
            await watch.cancel()
    except Exception as e:  # (a timeout, or aetcd's AttributeError for a client already closed)
        log.debug("cancelling an etcd watch failed: %r", e)
