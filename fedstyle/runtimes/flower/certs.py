"""Certificates and keys for a Flower deployment (``fedstyle deploy certs``), made with ``cryptography``.

Writes into one folder::

    ca.crt, ca.key          a self-signed certificate authority (10 years)
    server.crt, server.key  the SuperLink's certificate, signed by the CA, for the given host names
                            and IP addresses (always localhost and 127.0.0.1)
    site-K.key, site-K.pub  one EC (NIST P-384) key pair per site for Flower's SuperNode
                            authentication (OpenSSH format, as ``flwr supernode register`` expects)

These are for tests and trials; a production federation uses certificates from its own CA.
Private keys are written with mode 0600. Existing files are never overwritten.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from fedstyle.errors import ConfigError
from fedstyle.io import atomic_write

CA_CERT, SERVER_CERT, SERVER_KEY = "ca.crt", "server.crt", "server.key"


def site_key_paths(folder: Path, site: int) -> tuple[Path, Path]:
    return folder / f"site-{site}.key", folder / f"site-{site}.pub"


def _write(path: Path, data: bytes, private: bool) -> None:
    # a private key is 0600 from its creation on, before a byte of it is written
    atomic_write(path, lambda tmp: tmp.write_bytes(data), mode=0o600 if private else None)


def make_certificates(folder: str | Path, hosts: list[str] | None = None, sites: int = 0) -> list[Path]:
    """Create the CA, the server certificate for ``hosts`` and ``sites`` SuperNode key pairs in ``folder``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    names = ["ca.crt", "ca.key", SERVER_CERT, SERVER_KEY] + [p.name for s in range(sites) for p in site_key_paths(folder, s)]
    existing = [n for n in names if (folder / n).exists()]
    if existing:
        raise ConfigError(f"{folder} already holds {', '.join(existing)}; choose another --out or delete them")
    hosts = list(dict.fromkeys(["localhost", "127.0.0.1", *(hosts or [])]))
    now = dt.datetime.now(dt.timezone.utc)

    def key():
        return ec.generate_private_key(ec.SECP384R1())

    def pem_key(k) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedstyle test CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    alt_names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    server_key = key()
    server_cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=825))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / "ca.key", pem_key(ca_key), private=True)
    _write(folder / CA_CERT, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(folder / SERVER_KEY, pem_key(server_key), private=True)
    _write(folder / SERVER_CERT, server_cert.public_bytes(serialization.Encoding.PEM), private=False)
    for site in range(sites):
        site_key = key()
        private, public = site_key_paths(folder, site)
        _write(private, site_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                               serialization.NoEncryption()), private=True)
        _write(public, site_key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                          serialization.PublicFormat.OpenSSH) + b"\n", private=False)
    return [folder / n for n in names]



def check_certificates(folder: str | Path, resume: str | Path | None = None) -> None:
    """Refuse (one line) a ``--certs`` folder whose CA or SuperLink certificate or key does not load, whose
    key is not the certificate's, whose SuperLink certificate the CA did not sign (a damaged byte), or
    whose CA or SuperLink certificate has expired (or is not valid yet): the SuperLink would fail to
    start, or the sites to connect, with a traceback in a log. ``resume``: the run directory of a
    deployment being resumed, named in the command that continues it on new certificates."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    folder = Path(folder)
    fix = "make new ones with `fedstyle deploy certs --out DIR` (or copy them again)"
    certificates = {}
    for name in (CA_CERT, SERVER_CERT):
        try:
            certificates[name] = x509.load_pem_x509_certificate((folder / name).read_bytes())
        except ValueError as err:
            raise ConfigError(f"--certs {folder}: {name} is not a PEM certificate ({err}); {fix}") from None
    try:
        key = serialization.load_pem_private_key((folder / SERVER_KEY).read_bytes(), password=None)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"--certs {folder}: {SERVER_KEY} is not an unencrypted PEM private key ({err}); {fix}") from None

    def spki(public_key) -> bytes:
        return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    check_validity(folder, certificates, resume)
    if spki(key.public_key()) != spki(certificates[SERVER_CERT].public_key()):
        raise ConfigError(f"--certs {folder}: {SERVER_KEY} is not the private key of {SERVER_CERT}; {fix}")
    try:  # a damaged byte inside a certificate still parses: its CA signature no longer verifies
        certificates[SERVER_CERT].verify_directly_issued_by(certificates[CA_CERT])
    except (ValueError, TypeError, InvalidSignature) as err:
        raise ConfigError(f"--certs {folder}: {SERVER_CERT} is not signed by {CA_CERT} "
                          f"({str(err) or 'the signature does not verify'}); {fix}") from None


def check_validity(folder: Path, certificates: dict, resume: str | Path | None = None) -> None:
    """Refuse (one line) a certificate outside its validity period, naming the file, the date and the
    commands that replace it. The TLS handshake refuses such a certificate, but only as the sites
    connect: the deployment then waits out --wait-timeout and reports a log, never the certificate."""
    now = dt.datetime.now(dt.timezone.utc)
    new = f"{folder.parent / (folder.name + '-new')}"
    then = f"`fedstyle deploy --resume {resume} --certs {new}`" if resume else f"give --certs {new}"
    for name, certificate in certificates.items():
        after, before = certificate.not_valid_after_utc, certificate.not_valid_before_utc
        if after < now:
            problem = f"expired on {after:%Y-%m-%d %H:%M} UTC"
        elif before > now:
            problem = f"is not valid before {before:%Y-%m-%d %H:%M} UTC (is this machine's clock right?)"
        else:
            continue
        raise ConfigError(f"--certs {folder}: {folder / name} {problem}; make new certificates with "
                          f"`fedstyle deploy certs --out {new}` (with --sites N and --host as before), then {then}")
