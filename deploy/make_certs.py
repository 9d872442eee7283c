"""Self-signed TLS material for a fedsmix deployment, and SuperNode authentication keys.

    python deploy/make_certs.py deploy/certs --supernodes 2

writes into the folder:
  ca.crt, ca.key            a private certificate authority (ca.key signs, keep it out of containers)
  server.pem, server.key    one server certificate for the SuperLink (Fleet, Control and Runtime
                            APIs share its port) and the SuperNodes' Runtime APIs; its names cover
                            the compose services and 127.0.0.1/localhost for native runs
  supernode-<i>, .pub       an ECDSA P-384 key pair per SuperNode in OpenSSH format, as
                            `flower-supernode --auth-supernode-private-key` and
                            `flwr supernode register` read them

Uses `cryptography` (a Flower dependency), so it runs wherever fedsmix runs; no openssl needed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DAYS = 365


def server_names(supernodes: int) -> list[str]:
    """DNS names the server certificate must carry: compose service names and loopback."""
    return ["localhost", "superlink", *(f"supernode-{i}" for i in range(supernodes))]


def _write(path: Path, data: bytes, private: bool) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o600 if private else 0o644)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _certificate(subject: str, issuer: x509.Name | None, public_key, signing_key, days: int, ca: bool, names: list[str]):
    now = dt.datetime.now(dt.timezone.utc)
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, subject), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedsmix")]
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
    )
    if ca:
        usage = x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
        )
        builder = builder.add_extension(usage, critical=True)
    else:
        alt = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "::1")]
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    return builder.sign(signing_key, hashes.SHA384())


def make_certificates(out: Path, names: list[str], days: int = DEFAULT_DAYS) -> dict[str, Path]:
    """A CA and one server certificate for `names` (plus 127.0.0.1 and ::1)."""
    out.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = _certificate("fedsmix CA", None, ca_key.public_key(), ca_key, days, ca=True, names=[])
    key = ec.generate_private_key(ec.SECP384R1())
    cert = _certificate(names[0], ca_cert.subject, key.public_key(), ca_key, days, ca=False, names=names)
    paths = {"ca": out / "ca.crt", "ca-key": out / "ca.key", "cert": out / "server.pem", "key": out / "server.key"}
    _write(paths["ca"], ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(paths["ca-key"], _pem_key(ca_key), private=True)
    _write(paths["cert"], cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(paths["key"], _pem_key(key), private=True)
    return paths


def make_supernode_keys(out: Path, supernodes: int) -> list[tuple[Path, Path]]:
    """One ECDSA P-384 key pair per SuperNode, OpenSSH format (private, public)."""
    out.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(supernodes):
        key = ec.generate_private_key(ec.SECP384R1())
        private, public = out / f"supernode-{i}", out / f"supernode-{i}.pub"
        openssh = serialization.PrivateFormat.OpenSSH
        _write(private, key.private_bytes(serialization.Encoding.PEM, openssh, serialization.NoEncryption()), private=True)
        ssh = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        _write(public, ssh + f" supernode-{i}\n".encode(), private=False)
        pairs.append((private, public))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write into (created; existing files are replaced)")
    parser.add_argument("--supernodes", type=int, default=2, help="SuperNodes to name in the certificate and make keys for")
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS)
    args = parser.parse_args(argv)
    if args.supernodes < 1:
        parser.error("--supernodes: need at least 1")
    make_certificates(args.out, server_names(args.supernodes), args.days)
    make_supernode_keys(args.out, args.supernodes)
    print(f"wrote CA, server certificate and {args.supernodes} SuperNode key pairs to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
