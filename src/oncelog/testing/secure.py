"""A broker with every kind of listener, for security tests and benchmarks: its key material made
with openssl (`testing.tls`), PLAIN users from a JAAS value, SCRAM users bootstrapped with
`--add-scram`.

Listeners (each on its own free port, `SecureBroker.port(name)`):
    PLAINTEXT        no security
    SASL_PLAINTEXT   PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    SASL_SSL         the same over TLS
    SSL              mutual TLS (`ssl.client.auth=required`), principal User:CN=<name>
    REAUTH           SASL_PLAINTEXT whose sessions expire (`connections.max.reauth.ms`)
"""
from __future__ import annotations

from pathlib import Path

from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.tls import Pki, make_client, make_pki

PLAIN_USERS = {"alice": "alice-secret", "bob": "bob-secret"}
SCRAM_USERS = {"admin": "admin-secret", "alice": "alice-secret"}
MECHANISMS = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
REAUTH_MS = 2000


def jaas(users: dict[str, str]) -> str:
    entries = " ".join(f'user_{u}="{p}"' for u, p in users.items())
    return f"org.apache.kafka.common.security.plain.PlainLoginModule required {entries};"


def secure_overrides(pki: Pki, extra: dict[str, str] | None = None) -> dict[str, str]:
    add = ",".join(f"SCRAM-SHA-{bits}=[name={u},password={p}]" for u, p in SCRAM_USERS.items()
                   for bits in (256, 512))
    o = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0,"
                     "SSL://127.0.0.1:0,REAUTH://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,"
                                          "SSL:SSL,REAUTH:SASL_PLAINTEXT",
        "ssl.keystore.location": str(pki.broker_pem()),
        "listener.name.ssl.ssl.client.auth": "required",
        "listener.name.ssl.ssl.truststore.location": str(pki.ca),
        "sasl.enabled.mechanisms": MECHANISMS,
        "listener.name.reauth.connections.max.reauth.ms": str(REAUTH_MS),
        "oncelog.add.scram": add,
    }
    for listener in ("sasl_plaintext", "sasl_ssl", "reauth"):
        o[f"listener.name.{listener}.plain.sasl.jaas.config"] = jaas(PLAIN_USERS)
    o.update(extra or {})
    return o


class SecureBroker:
    def __init__(self, directory: Path, extra: dict[str, str] | None = None) -> None:
        self.directory = directory
        self.pki = make_pki(directory / "pki")
        self.client_cert, self.client_key = make_client(self.pki, "alice")
        self.process = BrokerProcess(directory / "data", secure_overrides(self.pki, extra))

    def start(self) -> SecureBroker:
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.stop()

    def port(self, listener: str) -> int:
        return self.process.listener_ports[listener]

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.port(listener)}"

    @property
    def log_file(self) -> Path:
        assert self.process.log_file is not None
        return self.process.log_file

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace")
