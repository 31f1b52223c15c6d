"""Key material for TLS tests, made with the `openssl` command as the quick start in
docs/security.md does: a CA, a broker key whose certificate names localhost and 127.0.0.1 (clients
check host names), and client keys signed by the CA (or by a second, untrusted CA)."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise RuntimeError("the openssl command is needed to make test certificates")
    subprocess.run([exe, *args], cwd=cwd, check=True, capture_output=True)


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca: Path                    # CA certificate (PEM): clients' trust, brokers' truststore

    def broker_pem(self) -> Path:
        """Key and certificate chain in one file (ssl.keystore.location)."""
        return self.directory / "broker.pem"

    def client(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) of a client certificate made by `make_client`."""
        return self.directory / f"{name}.crt", self.directory / f"{name}.key"


def make_ca(directory: Path, name: str = "ca") -> Path:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=oncelog-test-{name}",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=directory)
    return directory / f"{name}.pem"


def _sign(directory: Path, name: str, subject: str, ca: str, extensions: str | None) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=directory)
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-days", "2", "-out", f"{name}.crt"]
    if extensions:
        (directory / f"{name}.ext").write_text(extensions)
        args += ["-extfile", f"{name}.ext"]
    _openssl(*args, cwd=directory)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory)
    _sign(directory, "broker", "/CN=localhost", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1")
    pem = (directory / "broker.key").read_text() + (directory / "broker.crt").read_text()
    (directory / "broker.pem").write_text(pem)
    return Pki(directory, ca)


def make_client(pki: Pki, name: str, subject: str | None = None, ca: str = "ca") -> tuple[Path, Path]:
    """A client certificate with subject `/CN=<name>` unless given, signed by `ca` (another CA
    made with `make_ca(pki.directory, ca)` makes one the broker does not trust)."""
    _sign(pki.directory, name, subject or f"/CN={name}", ca, None)
    return pki.client(name)


def client_formats(pki: Pki, name: str, password: str) -> dict[str, Path]:
    """A client key made by `make_client` in every encoding a client may load it from, as
    librdkafka's test harness (trivup) provides them: key and certificate as PEM and DER, and a
    PKCS#12 file holding key, certificate and CA, protected by `password`."""
    cert, key = pki.client(name)
    d = pki.directory
    out = {"pub_pem": cert, "priv_pem": key, "pub_der": d / f"{name}-pub.der",
           "priv_der": d / f"{name}-priv.der", "pkcs": d / f"{name}.p12", "ca_der": d / "ca.der"}
    _openssl("x509", "-in", cert.name, "-outform", "der", "-out", out["pub_der"].name, cwd=d)
    _openssl("pkey", "-in", key.name, "-outform", "der", "-out", out["priv_der"].name, cwd=d)
    _openssl("x509", "-in", pki.ca.name, "-outform", "der", "-out", out["ca_der"].name, cwd=d)
    _openssl("pkcs12", "-export", "-inkey", key.name, "-in", cert.name, "-certfile", pki.ca.name,
             "-passout", f"pass:{password}", "-out", out["pkcs"].name, cwd=d)
    return out
