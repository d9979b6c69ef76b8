"""`python -m bench.worker ROLE`: one workload client in its own process.

Reads a JSON spec line on stdin, runs `<system module>.<ROLE>(spec, ctl)` and
prints JSON lines: {"ready": ...} once the client is set up, then
{"result": ...}. Later stdin lines are commands: "go" (start the timed part),
"stop" (finish and report), "progress" (print {"progress": n}); any other line goes to `ctl.commands` for the role.
"""

from __future__ import annotations

import importlib
import json
import queue
import sys
import threading
import time
import traceback

from bench.workloads import dumps

SYSTEMS = {
    "tidemark": "bench.tidemark_system",
    "tidemark_auth": "bench.tidemark_system",  # bench/auth_cost.py: the same clients, signing every call
    "tidemark_tls_auth": "bench.tidemark_system",
    "redis": "bench.peers.redis_streams",
    "nats": "bench.peers.nats_jetstream",
    "echo": "bench.grpc_echo",
    "rebalance": "bench.rebalance",
}


class Control:
    def __init__(self) -> None:
        self.go = threading.Event()
        self.stopped = threading.Event()
        self.go_at = 0.0
        self.progress = lambda: 0
        self.commands: queue.Queue[str] = queue.Queue()
        self._out = threading.Lock()
        threading.Thread(target=self._read, name="bench-stdin", daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            command = line.strip()
            if command == "go":
                self.go_at = time.monotonic()
                self.go.set()
            elif command == "stop":
                self.stopped.set()
            elif command == "progress":
                self.emit({"progress": self.progress()})
            elif command:
                self.commands.put(command)
        self.stopped.set()  # the harness went away
        self.go.set()

    def emit(self, obj: dict) -> None:
        with self._out:
            sys.stdout.write(dumps(obj) + "\n")
            sys.stdout.flush()

    def ready(self, info: dict | None = None) -> None:
        self.emit({"ready": info or {}})

    def wait_go(self) -> float:
        self.go.wait()
        return self.go_at


def main() -> int:
    role = sys.argv[1]
    spec = json.loads(sys.stdin.readline())
    ctl = Control()
    module = importlib.import_module(SYSTEMS[spec["system"]])
    try:
        result = getattr(module, role)(spec, ctl)
    except Exception as e:  # reported to the harness, which shows the log
        traceback.print_exc()
        ctl.emit({"result": {"error": f"{type(e).__name__}: {e}"}})
        return 1
    ctl.emit({"result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
