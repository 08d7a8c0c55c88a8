"""TLS of the gRPC port (and of the metrics port): certificates re-read when their files change.

``server_credentials(cert, key, client_ca)`` gives gRPC's dynamic SSL credentials: gRPC asks
``CertificateFiles.fetch`` for the configuration at each new TLS handshake, which re-reads the files
only when one of their modification times changed (cert-manager, or any tool, rotating them). Open
connections and their streams keep the session they have; new connections get the new certificate.
A file caught half-written (the new pair does not load) keeps the previous configuration, and is
tried again at the next handshake. With ``client_ca`` the server requires a client certificate
signed by it (mutual TLS).
"""
from __future__ import annotations

import logging
import os
import ssl
import threading

import grpc

log = logging.getLogger("sapgrid.server")


class TLSFileError(ValueError):
    """A certificate, key or CA file cannot be used; the message names the flag and the file."""


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise TLSFileError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    if b"-----BEGIN" not in data:
        raise TLSFileError(f"{flag} {path}: not a PEM file")
    return data


def check_pair(cert: str, key: str, ca: str = "", flags=("--tls-cert", "--tls-key", "--tls-client-ca")) -> None:
    """Refuse a certificate and key that do not load, or do not match (ssl, the standard library)."""
    _read(cert, flags[0])
    _read(key, flags[1])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise TLSFileError(f"{flags[0]} {cert} / {flags[1]} {key}: the certificate and key do not load together "
                           f"({exc.reason or exc})") from None
    if ca:
        _read(ca, flags[2])
        try:
            context.load_verify_locations(ca)
        except ssl.SSLError as exc:
            raise TLSFileError(f"{flags[2]} {ca}: not a CA certificate ({exc.reason or exc})") from None


class CertificateFiles:
    """The server's certificate, key and (mutual TLS) client CA files, re-read when they change."""

    def __init__(self, cert: str, key: str, client_ca: str = ""):
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self._lock = threading.Lock()
        self._stamp = None
        self.loads = 0                                  # configurations made (1 at start, +1 per rotation)

    def _paths(self) -> tuple[str, ...]:
        return (self.cert, self.key, self.client_ca) if self.client_ca else (self.cert, self.key)

    def _stat(self):
        return tuple((os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in self._paths())

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        check_pair(self.cert, self.key, self.client_ca)
        pair = (_read(self.key, "--tls-key"), _read(self.cert, "--tls-cert"))
        ca = _read(self.client_ca, "--tls-client-ca") if self.client_ca else None
        self.loads += 1
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=ca)

    def initial(self) -> grpc.ServerCertificateConfiguration:
        with self._lock:
            self._stamp = self._stat()
            return self.configuration()

    def fetch(self):
        """gRPC's fetcher: a new configuration when a file changed, else None (keep the current one)."""
        try:
            with self._lock:
                stamp = self._stat()
                if stamp == self._stamp:
                    return None
                config = self.configuration()
                self._stamp = stamp
        except (OSError, TLSFileError) as exc:
            log.warning("TLS files changed but do not load yet (the previous certificate stays in use): %s", exc)
            return None
        log.info("TLS certificate reloaded from %s", self.cert)
        return config


def server_credentials(files: CertificateFiles) -> grpc.ServerCredentials:
    return grpc.dynamic_ssl_server_credentials(files.initial(), files.fetch,
                                               require_client_authentication=bool(files.client_ca))
