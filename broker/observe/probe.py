"""The containers' health probe: one cheap look at a broker or a name server, for orchestrators.

    python -m tidemark.broker.observe.probe http://127.0.0.1:9090/healthz   # a broker: 200 from /healthz
    python -m tidemark.broker.observe.probe tcp://127.0.0.1:9876            # a name server: its port accepts

`tidemark health` asks the gRPC health service and says why, which is what a person wants; it also
imports grpc and the client, about 0.4 CPU-seconds, and an orchestrator runs its probe every few seconds
in every container. This imports only the standard library (a few tens of milliseconds) and answers
with its exit status: 0 healthy, 1 not, 2 a bad argument. A broker's /healthz is 200 while it serves,
every part can write and its event loop answers (what the gRPC health check tells, and a stuck loop);
a name server keeps no files, so taking connections is what it can tell. No proxy from the
environment is used: the probe looks at the container's own loopback.
"""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit

TIMEOUT_S = 4.0
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never $HTTP_PROXY


def probe(target: str, timeout: float = TIMEOUT_S) -> tuple[bool, str]:
    """(healthy, what was seen)."""
    url = urlsplit(target)
    if url.scheme == "tcp" and url.hostname and url.port:
        try:
            socket.create_connection((url.hostname, url.port), timeout).close()
        except OSError as e:
            return False, f"{url.hostname}:{url.port} does not accept connections: {e}"
        return True, f"{url.hostname}:{url.port} accepts connections"
    if url.scheme == "http" and url.hostname:
        try:
            with _DIRECT.open(target, timeout=timeout) as answer:
                return answer.status == 200, f"{answer.status} {answer.read(200).decode(errors='replace').strip()}"
        except urllib.error.HTTPError as e:
            return False, f"{e.code} {e.read(200).decode(errors='replace').strip()}"
        except (OSError, ValueError) as e:
            return False, f"{target} does not answer: {e}"
    raise ValueError(f"expected http://HOST:PORT/PATH or tcp://HOST:PORT, got {target!r}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tidemark.broker.observe.probe http://HOST:PORT/healthz | tcp://HOST:PORT", file=sys.stderr)
        return 2
    try:
        healthy, seen = probe(args[0])
    except ValueError as e:
        print(f"probe: {e}", file=sys.stderr)
        return 2
    print(seen)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
