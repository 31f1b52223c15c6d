"""A Kafka client properties file (what kafka-*.sh take with `--command-config`, and what Java
clients are configured with) as settings of oncelog's client, so that one file serves both.

oncelog's client takes librdkafka's names (`client.security`); the Java names are translated:
    sasl.jaas.config (PlainLoginModule / ScramLoginModule username, password)
                                 -> sasl.username, sasl.password
    ssl.truststore.location      -> ssl.ca.location        (a PEM file: ssl.truststore.type=PEM)
    ssl.keystore.location        -> ssl.certificate.location and ssl.key.location (one PEM file
                                    with the key and the certificate chain: ssl.keystore.type=PEM)
    ssl.keystore.password / ssl.key.password -> ssl.key.password
Names both clients share (security.protocol, sasl.mechanism, client.id, request.timeout.ms,
ssl.endpoint.identification.algorithm, ...) and librdkafka's own pass through unchanged. JKS and
PKCS12 stores are refused with what to do instead: Python's TLS reads PEM."""
from __future__ import annotations

from pathlib import Path

from oncelog.client.errors import ConfigError
from oncelog.core.properties import parse_properties
from oncelog.core.security.jaas import JaasConfigError, client_credentials, parse_sasl_jaas_config


def read_client_properties(path: str | Path) -> dict[str, str]:
    """The file's settings under the names oncelog's client takes; ConfigError says what is wrong
    (with the file's name)."""
    path = Path(path)
    try:
        raw = parse_properties(path.read_text(), str(path))
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return client_settings(raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def client_settings(raw: dict[str, str]) -> dict[str, str]:
    out = dict(raw)
    jaas = out.pop("sasl.jaas.config", None)
    if jaas is not None:
        try:
            user, password = client_credentials(parse_sasl_jaas_config(jaas))
        except JaasConfigError as e:
            raise ConfigError(f"sasl.jaas.config: {e}") from None
        out.setdefault("sasl.username", user)
        out.setdefault("sasl.password", password)
    trust = out.pop("ssl.truststore.location", None)
    if trust is not None:
        _require_pem(out.pop("ssl.truststore.type", None), trust, "ssl.truststore")
        out.setdefault("ssl.ca.location", trust)
    out.pop("ssl.truststore.password", None)   # a PEM trust store has none
    keystore = out.pop("ssl.keystore.location", None)
    if keystore is not None:
        _require_pem(out.pop("ssl.keystore.type", None), keystore, "ssl.keystore")
        out.setdefault("ssl.certificate.location", keystore)
        out.setdefault("ssl.key.location", keystore)
    store_password = out.pop("ssl.keystore.password", None)
    if store_password and "ssl.key.password" not in out:
        out["ssl.key.password"] = store_password
    if out.get("ssl.endpoint.identification.algorithm") == "":
        out["ssl.endpoint.identification.algorithm"] = "none"   # Java's empty value turns the check off
    return out


def _require_pem(kind: str | None, location: str, name: str) -> None:
    if kind is not None and kind.upper() == "PEM":
        return
    try:
        looks_pem = b"-----BEGIN" in Path(location).read_bytes()[:4096]
    except OSError as e:
        raise ConfigError(f"{name}.location={location}: {e.strerror or e}") from None
    if not looks_pem:
        raise ConfigError(f"{name}.location={location} is a {kind or 'JKS'} store; oncelog's client reads PEM "
                          f"files: convert it (keytool -exportcert -rfc, openssl pkcs12) and set {name}.type=PEM")
