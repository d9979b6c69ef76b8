"""The test harness's port picker: ports the kernel never hands to an outgoing connection."""

import socket

from bench import procs


def test_ports_are_below_the_ephemeral_range_distinct_and_free():
    low = procs._ephemeral_low()
    ports = [procs.free_port() for _ in range(50)]
    assert all(procs._PORTS_LOW <= p < low for p in ports), ports
    assert len(set(ports)) == len(ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_something_listens_on_is_skipped():
    offered_next = procs.free_port() + 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", offered_next))
        s.listen()
        assert procs.free_port() == offered_next + 1
