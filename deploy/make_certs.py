"""Self-signed TLS material for a fedsmix deployment, and SuperNode authentication keys.

    python deploy/make_certs.py deploy/certs --supernodes 2

writes into the folder (and replaces what was there):
  ca.crt                        the private CA; its key signs the certificates below and is then
                                discarded, so nothing can sign more (rerun the script to add a party)
  superlink.pem, superlink.key  the SuperLink's certificate (Fleet, Control and Runtime APIs share
                                its port); names: superlink, localhost, 127.0.0.1, ::1
  supernode-<i>.pem, .key       SuperNode i's Runtime API certificate (its SuperExec connects to it);
                                names: supernode-<i>, localhost, 127.0.0.1, ::1
  supernode-<i>.auth-key        SuperNode i's ECDSA P-384 authentication key, OpenSSH format
                                (`flower-supernode --auth-supernode-private-key`)
  supernodes.pub                their public keys, one per line: what `register-supernodes` registers

Each container mounts only its own files (docker-compose.tls.yml), so no party holds the
SuperLink's key or another party's. Uses `cryptography` (a Flower dependency): no openssl needed.
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
LOOPBACK = ("localhost",)


def _write(path: Path, data: bytes, private: bool) -> Path:
    path.write_bytes(data)
    os.chmod(path, 0o600 if private else 0o644)
    return path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, common_name), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedsmix")]
    )


def _builder(subject: x509.Name, issuer: x509.Name, public_key, days: int) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )


def _certificate_authority(days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP384R1())
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        _builder(_name("fedsmix CA"), _name("fedsmix CA"), key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA384())
    )
    return key, cert


def _server_certificate(
    name: str, ca_key, ca_cert: x509.Certificate, days: int
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A TLS server certificate for the compose service `name`, also valid on loopback (native runs)."""
    key = ec.generate_private_key(ec.SECP384R1())
    alt = [x509.DNSName(n) for n in (name, *LOOPBACK)] + [
        x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "::1")
    ]
    cert = (
        _builder(_name(name), ca_cert.subject, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    return key, cert


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_deployment_certs(out: Path, supernodes: int, days: int = DEFAULT_DAYS) -> Path:
    """Everything docker-compose.tls.yml mounts, for `supernodes` SuperNodes; returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _certificate_authority(days)
    _write(out / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    for name in ("superlink", *(f"supernode-{i}" for i in range(supernodes))):
        key, cert = _server_certificate(name, ca_key, ca_cert, days)
        _write(out / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM), private=False)
        _write(out / f"{name}.key", _pem(key), private=True)
    public = [authentication_key(out / f"supernode-{i}.auth-key", comment=f"supernode-{i}") for i in range(supernodes)]
    _write(out / "supernodes.pub", b"".join(public), private=False)
    return out


def authentication_key(path: Path, comment: str) -> bytes:
    """Write an ECDSA P-384 private key (OpenSSH format) to `path`; return its public line."""
    key = ec.generate_private_key(ec.SECP384R1())
    openssh = serialization.PrivateFormat.OpenSSH
    _write(path, key.private_bytes(serialization.Encoding.PEM, openssh, serialization.NoEncryption()), private=True)
    return (
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        + f" {comment}\n".encode()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write into (created; existing files are replaced)")
    parser.add_argument("--supernodes", type=int, default=2, help="SuperNodes to make certificates and keys for")
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS)
    args = parser.parse_args(argv)
    if args.supernodes < 1:
        parser.error("--supernodes: need at least 1")
    make_deployment_certs(args.out, args.supernodes, args.days)
    print(f"wrote a CA, certificates for the SuperLink and {args.supernodes} SuperNodes, and their keys to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
