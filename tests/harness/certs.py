"""Real X.509 certificates for TLS tests, made in the test (``cryptography``): a CA, server and
client certificates signed by it, with any validity window (expired ones too)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM, and where they were written."""

    cert_pem: bytes
    key_pem: bytes
    cert: Path
    key: Path


@dataclass(frozen=True)
class CertificateAuthority:
    name: str
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate
    #: The CA certificate as a PEM file (what a peer trusts).
    pem_path: Path

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @classmethod
    def create(cls, directory: Path, name: str) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(days=1))
            .not_valid_after(_now() + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}-ca.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(name, key, cert, path)

    def issue(
        self,
        directory: Path,
        common_name: str,
        *,
        client: bool = False,
        dns_names: tuple[str, ...] = ("localhost",),
        ips: tuple[str, ...] = ("127.0.0.1",),
        valid_from: dt.datetime | None = None,
        valid_until: dt.datetime | None = None,
        file_stem: str | None = None,
    ) -> Pair:
        """A leaf certificate for a server (SANs: ``dns_names``, ``ips``) or a client, written as
        ``<stem>.pem`` and ``<stem>.key`` in ``directory``."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid_from or _now() - dt.timedelta(hours=1))
            .not_valid_after(valid_until or _now() + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        stem = file_stem or f"{self.name}-{common_name}"
        directory.mkdir(parents=True, exist_ok=True)
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = _key_pem(key)
        cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
        cert_path.write_bytes(cert_pem)
        key_path.write_bytes(key_pem)
        return Pair(cert_pem, key_pem, cert_path, key_path)


def expired_window() -> tuple[dt.datetime, dt.datetime]:
    """A validity window that ended yesterday."""
    return _now() - dt.timedelta(days=10), _now() - dt.timedelta(days=1)
