"""Who may change a name server's table: the brokers, proven by a signature.

A registration decides routes and fences masters (a newer epoch replaces the master of its broker
name), so a name server started with a broker user (`--broker-user NAME:SECRET`, the brokers'
init_user) takes RegisterBroker and UnregisterBroker only when they carry that user's RocketMQ 5
signature (common/auth.py): an anonymous or forged call is refused before it touches the table.
Routes and the cluster view stay readable by anyone, as in RocketMQ, since clients need a route
before they can reach a broker that checks their own credentials.

Without a broker user the table trusts every caller; that is only for clusters without --auth (the
name server's start-up line says `registrations=open`).

The signature is RocketMQ's: an HMAC of the request's time, not of its body, valid for the clock skew
allowed (300 s). Whoever sees a signed call can replay its header with another body within that
window, so run name servers with TLS (--tls-cert) wherever the network is not trusted, and give the
brokers a user of their own rather than one clients also hold.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Mapping

from tidemark.broker.errors import UnauthenticatedError
from tidemark.common import auth as signatures
from tidemark.common.auth import Credentials

REFUSED = "registrations must be signed by the brokers' user (the name server runs with --broker-user)"


class RegistrationGuard:
    def __init__(self, broker: Credentials | None, *, max_skew_s: float = signatures.DEFAULT_MAX_SKEW_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._broker = broker
        self._max_skew_s = max_skew_s
        self._clock = clock

    @property
    def open(self) -> bool:
        return self._broker is None

    def check(self, metadata: Mapping[str, str]) -> None:
        """Nothing when the call may change the table, else UnauthenticatedError: what is wrong with a
        missing, malformed or stale header, and one answer for a wrong user or a wrong signature (it
        does not tell which user the brokers use)."""
        if self._broker is None:
            return
        try:
            claim = signatures.parse(dict(metadata))
            signatures.check_time(claim, now=self._clock(), max_skew_s=self._max_skew_s)
        except signatures.SignatureError as e:
            raise UnauthenticatedError(f"{e}; {REFUSED}") from None
        # Both checks always run: a wrong access key costs what a wrong signature does.
        key_ok = hmac.compare_digest(claim.access_key.encode(), self._broker.access_key.encode())
        if not (signatures.matches(claim, self._broker.secret_key) and key_ok):
            raise UnauthenticatedError(f"invalid access key or signature; {REFUSED}")
