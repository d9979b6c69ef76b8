"""The official Python client over TLS (`tls_enable=True`) to a broker started with --tls-cert/--tls-key:
RocketMQ 5's protocol is served on the same TLS port. The client trusts the system store only, so the
script runs in a process of its own with gRPC's root store pointed at the test CA."""

from __future__ import annotations

import os
import subprocess
import sys

from brokerproc import BrokerProcess

from tidemark.client import Admin, TlsSettings

SCRIPT = """
import sys
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
config = ClientConfiguration(sys.argv[1], Credentials())
producer = Producer(config, ("Tls",), tls_enable=True)
producer.startup()
m = Message()
m.topic, m.body = "Tls", b"over tls"
print(producer.send(m).message_id)
producer.shutdown()
consumer = SimpleConsumer(config, "tls-group", {"Tls": FilterExpression()}, await_duration=5, tls_enable=True)
consumer.startup()
got = []
while not got:
    got = consumer.receive(16, 15)
consumer.ack(got[0])
print(got[0].message_id, got[0].body.decode())
consumer.shutdown()
"""


def test_the_official_client_sends_and_receives_over_tls(tmp_path, pki):
    broker = BrokerProcess(tmp_path / "data", args=("--tls-cert", str(pki.server_cert),
                                                     "--tls-key", str(pki.server_key))).start()
    try:
        with Admin(brokers=broker.address, tls=TlsSettings(ca_file=str(pki.ca))) as admin:
            admin.create_topic("Tls", 2)
        env = {**os.environ, "HOME": str(tmp_path), "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(pki.ca)}
        out = subprocess.run([sys.executable, "-c", SCRIPT, broker.address], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        sent, received = out.stdout.splitlines()[:2]
        assert received == f"{sent} over tls"
    finally:
        broker.kill()
