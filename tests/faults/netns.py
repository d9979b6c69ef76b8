"""Hosts in network namespaces, so that a partition is a dropped packet and not a closed socket.

`Network()` makes a Linux bridge in the test's own namespace (the "root"
host: the test process and its clients) and a /24 of 10.x.y.0 for it; each
`network.host(name)` is a namespace with a veth cable to the bridge and its
own address. A broker started with `host.command(argv)` (`ip netns exec`)
and `--host host.ip` is reachable from the test and from the other hosts,
each connection crossing the bridge.

`partition(a, b)` drops every packet between two hosts (iptables DROP in
both directions, in a's namespace and b's when b is not the root), as a
failed switch port or a firewall would: no RST, no FIN, the peers' TCP stacks
retransmit until their own timeouts fire. `heal(a, b)` removes the rules;
the retransmissions then get through. Rules live in a chain of their own
(`TIDEMARK_FAULTS`), so healing never touches anything else.

Needs root, iproute2 and iptables; `available()` says whether this machine
has them (tests skip with its reason elsewhere). `close()` removes every
namespace, cable and the bridge; it runs at exit too, so a crashed test
leaves nothing behind.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import subprocess
from dataclasses import dataclass

__all__ = ["Host", "Network", "available"]

CHAIN = "TIDEMARK_FAULTS"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=30)


def available() -> tuple[bool, str]:
    """(True, "") when namespaces, veth cables and iptables can be used here; else (False, why)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return False, f"{tool} is not installed"
    probe = f"tmprobe{os.getpid() % 100000}"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "netns", "exec", probe, "iptables", "-L", "-n")
    except (subprocess.CalledProcessError, OSError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        return False, f"cannot use a network namespace with iptables here: {detail.strip()[:200]}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return True, ""


@dataclass(frozen=True)
class Host:
    """A namespace on the network (or, with `netns` empty, the test's own namespace)."""

    name: str
    ip: str
    netns: str = ""

    def command(self, argv: list[str]) -> list[str]:
        """argv run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)


class Network:
    def __init__(self) -> None:
        tag = f"{random.randrange(16**4):04x}"
        self.tag = tag
        self.bridge = f"tmbr{tag}"
        self.prefix = self._free_prefix()
        self.hosts: dict[str, Host] = {}
        self._cables: list[str] = []
        self._partitions: set[frozenset[str]] = set()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.prefix}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        # Where bridged packets pass the root namespace's FORWARD chain (br_netfilter, as a Docker engine
        # sets it up with a DROP policy), host-to-host traffic on this bridge must still pass.
        self._forward = ("FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")
        _run("iptables", "-I", *self._forward, check=False)
        self.root = Host("root", f"{self.prefix}.1")
        atexit.register(self.close)

    @staticmethod
    def _free_prefix() -> str:
        used = _run("ip", "-o", "-4", "addr", "show").stdout
        for _ in range(100):
            prefix = f"10.{random.randrange(200, 250)}.{random.randrange(256)}"
            if f" {prefix}." not in used:
                return prefix
        raise RuntimeError("no free 10.x.y.0/24 for a test network")

    def host(self, name: str) -> Host:
        """A new namespace cabled to the bridge."""
        index = len(self.hosts) + 2
        netns = f"tm{self.tag}{name}"[:30]
        outside, inside = f"tm{self.tag}{index}o", f"tm{self.tag}{index}i"
        _run("ip", "netns", "add", netns)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        self._cables.append(outside)
        _run("ip", "link", "set", outside, "master", self.bridge)
        _run("ip", "link", "set", outside, "up")
        _run("ip", "link", "set", inside, "netns", netns)
        ip = f"{self.prefix}.{index}"
        inns = ("ip", "netns", "exec", netns)
        _run(*inns, "ip", "addr", "add", f"{ip}/24", "dev", inside)
        _run(*inns, "ip", "link", "set", inside, "up")
        _run(*inns, "ip", "link", "set", "lo", "up")
        _run(*inns, "ip", "route", "add", "default", "via", self.root.ip)
        _run(*inns, "iptables", "-N", CHAIN)
        _run(*inns, "iptables", "-I", "INPUT", "-j", CHAIN)
        _run(*inns, "iptables", "-I", "OUTPUT", "-j", CHAIN)
        host = self.hosts[name] = Host(name, ip, netns)
        return host

    # -- faults -----------------------------------------------------------------------------------

    def partition(self, a: Host, b: Host) -> None:
        """Drop every packet between a and b (both directions)."""
        pair = frozenset((a.name, b.name))
        if pair in self._partitions:
            return
        for here, there in ((a, b), (b, a)):
            if here.netns:
                self._rules(here, there, "-A")
        self._partitions.add(pair)

    def heal(self, a: Host, b: Host) -> None:
        pair = frozenset((a.name, b.name))
        if pair not in self._partitions:
            return
        for here, there in ((a, b), (b, a)):
            if here.netns:
                self._rules(here, there, "-D")
        self._partitions.discard(pair)

    def isolate(self, a: Host) -> None:
        """Partition a from every other host, the root included."""
        for other in (self.root, *self.hosts.values()):
            if other.name != a.name:
                self.partition(a, other)

    def heal_all(self) -> None:
        for host in self.hosts.values():
            _run("ip", "netns", "exec", host.netns, "iptables", "-F", CHAIN, check=False)
        self._partitions.clear()

    def partitioned(self) -> list[tuple[str, str]]:
        return sorted(tuple(sorted(p)) for p in self._partitions)  # type: ignore[misc]

    def _rules(self, here: Host, there: Host, action: str) -> None:
        ns = ("ip", "netns", "exec", here.netns, "iptables")
        _run(*ns, action, CHAIN, "-s", there.ip, "-j", "DROP")
        _run(*ns, action, CHAIN, "-d", there.ip, "-j", "DROP")

    def close(self) -> None:
        for host in self.hosts.values():
            _run("ip", "netns", "del", host.netns, check=False)
        for cable in self._cables:
            _run("ip", "link", "del", cable, check=False)
        if self.bridge:
            _run("iptables", "-D", *self._forward, check=False)
            _run("ip", "link", "del", self.bridge, check=False)
        self.hosts.clear()
        self._cables.clear()
        self.bridge = ""

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
