"""The channel of a client: plaintext or TLS (mutual TLS with a client certificate), and a bearer token.

``Client`` and ``AsyncClient`` both call ``open_channel``. TLS is on with ``tls=True`` (the system's
root certificates) or as soon as a CA, certificate or key file is given; ``token`` sends
``authorization: Bearer TOKEN`` metadata on every call (a client interceptor: once per call, so once
per frame stream). ``set_defaults`` gives the credentials of clients that are made without any (the
``sapgrid`` command's ``--tls-ca``/``--token`` options and ``SAPGRID_*`` variables).
"""
from __future__ import annotations

import collections

import grpc

AUTH_HEADER = "authorization"
_DEFAULTS: dict = {}
KEYS = ("tls", "ca_file", "cert_file", "key_file", "token")


def set_defaults(**credentials) -> None:
    """Credentials for clients made without any (keys: tls, ca_file, cert_file, key_file, token)."""
    unknown = set(credentials) - set(KEYS)
    if unknown:
        raise TypeError(f"unknown credential(s): {sorted(unknown)}")
    _DEFAULTS.clear()
    _DEFAULTS.update({k: v for k, v in credentials.items() if v})


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None


def credentials(tls: bool = False, ca_file: str | None = None, cert_file: str | None = None,
                key_file: str | None = None, token: str | None = None) -> dict:
    """The credentials a client uses: its own, or the defaults when it was given none."""
    given = dict(tls=tls, ca_file=ca_file, cert_file=cert_file, key_file=key_file, token=token)
    return given if any(given.values()) else {**given, **_DEFAULTS}


def open_channel(address: str, options: list, *, aio: bool = False, tls: bool = False, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None, token: str | None = None):
    """A grpc (or grpc.aio) channel to ``address`` with these credentials (see the module docstring)."""
    if bool(cert_file) != bool(key_file):
        raise ValueError("cert_file and key_file go together (a client certificate and its private key)")
    if token is not None and (not token or any(c in token for c in "\r\n\0")):
        raise ValueError("token: must be a non-empty string without line breaks")
    secure = tls or ca_file or cert_file
    creds = None
    if secure:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(ca_file, "ca_file") if ca_file else None,
            private_key=_read(key_file, "key_file") if key_file else None,
            certificate_chain=_read(cert_file, "cert_file") if cert_file else None)
    metadata = ((AUTH_HEADER, f"Bearer {token}"),) if token else None
    if aio:
        interceptors = _aio_interceptors(metadata) if metadata else None
        if creds is not None:
            return grpc.aio.secure_channel(address, creds, options=options, interceptors=interceptors)
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    channel = grpc.secure_channel(address, creds, options=options) if creds is not None \
        else grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(channel, _TokenInterceptor(metadata)) if metadata else channel


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                    "wait_for_ready", "compression")), grpc.ClientCallDetails):
    pass


def _with(details, metadata):
    return _Details(details.method, details.timeout, tuple(details.metadata or ()) + metadata, details.credentials,
                    getattr(details, "wait_for_ready", None), getattr(details, "compression", None))


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the ``authorization`` metadata to every call of a sync channel."""

    def __init__(self, metadata):
        self.metadata = metadata

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(_with(details, self.metadata), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(_with(details, self.metadata), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(_with(details, self.metadata), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(_with(details, self.metadata), request_iterator)


def _aio_interceptors(metadata):
    def add(details):
        return grpc.aio.ClientCallDetails(details.method, details.timeout,
                                          grpc.aio.Metadata(*(tuple(details.metadata or ()) + metadata)),
                                          details.credentials, details.wait_for_ready)

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, details, request):
            return await continuation(add(details), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, details, request):
            return await continuation(add(details), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation, details, request_iterator):
            return await continuation(add(details), request_iterator)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation, details, request_iterator):
            return await continuation(add(details), request_iterator)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]
