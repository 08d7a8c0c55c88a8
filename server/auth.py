"""Authentication and authorization: tokens and client certificates, roles on world-name patterns.

The auth file (``sapgrid serve --auth-file FILE``, TOML, read with ``tomllib``) lists who may call::

    [[tokens]]                       # a bearer token, stored as its SHA-256 hash (never in clear)
    name = "game-1"                  # the name audit lines and quotas use
    sha256 = "3f0c...64 hex"         # hashlib.sha256(token.encode()).hexdigest()
    role = "writer"                  # admin | writer | reader
    worlds = "match-*"               # a pattern (fnmatch) or a list of them

    [[subjects]]                     # with mutual TLS: a client certificate's subject instead of a token
    name = "observer"
    subject = "CN=observer,O=acme"   # the certificate's subject, or just "CN=<common name>"
    role = "reader"
    worlds = ["*"]

An entry may also hold ``grants = [{role = "reader", worlds = "*"}, ...]`` for several roles.
Roles nest: ``reader`` may list, get, query, list pairs and subscribe; ``writer`` also sends frames
and takes snapshots; ``admin`` may do everything (create, delete, restore, freeze worlds). Clients
send ``authorization: Bearer TOKEN`` metadata. No credentials or an unknown token: UNAUTHENTICATED;
a role that does not cover the world: PERMISSION_DENIED, and nothing changes. The health service
is always open. ``sapgrid auth token`` appends a token entry (``append_token``).

``AuthInterceptor`` authenticates every call, checks the role of every call that names one world in
its request, and leaves the identity on the call's context (``identity(context)``) for the checks
made inside the servicer: each frame of a stream (``require``), ListWorlds' filter (``may``).
"""
from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import sys
import time
import tomllib
from dataclasses import dataclass

import grpc

from .aio import HEALTH_PREFIX, handler_kind, streaming
from .errors import ServiceError, short

audit_log = logging.getLogger("sapgrid.audit")
log = logging.getLogger("sapgrid.server")

READER, WRITER, ADMIN = "reader", "writer", "admin"
RANK = {READER: 1, WRITER: 2, ADMIN: 3}
ROLES_HELP = {READER: "list, get, query, pairs, subscribe", WRITER: "frames, snapshots and every read",
              ADMIN: "everything: create, delete, restore, freeze worlds"}
_HEX64 = re.compile(r"[0-9a-f]{64}")
TOKEN_PREFIX = "sg_"


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED


class AuthFileError(ValueError):
    """The auth file cannot be used; the message names the file and the entry at fault."""


@dataclass(frozen=True)
class Grant:
    role: str
    pattern: str

    def covers(self, role: str, world: str | None) -> bool:
        """world None: the role on any world at all."""
        return RANK[self.role] >= RANK[role] and (world is None or fnmatch.fnmatchcase(world, self.pattern))


@dataclass(frozen=True)
class Identity:
    """Who a call is for: ``name`` (token or certificate name; ``peer:HOST`` without auth) and its grants
    (None: everything is allowed, the server runs without --auth-file)."""

    name: str
    grants: tuple[Grant, ...] | None = None

    def may(self, role: str, world: str | None = None) -> bool:
        return self.grants is None or any(g.covers(role, world) for g in self.grants)

    def require(self, role: str, world: str | None, what: str) -> None:
        if not self.may(role, world):
            on = f" on world {short(world)}" if world is not None else ""
            raise PermissionDenied(f"{what}: {short(self.name)} has no {role} role{on}", "world" if world else "")


@dataclass(frozen=True)
class Table:
    """The parsed auth file: token hashes and certificate subjects, each with its identity."""

    tokens: tuple[tuple[bytes, Identity], ...]
    subjects: tuple[tuple[str, Identity], ...]
    path: str = ""

    def by_token(self, token: str) -> Identity | None:
        """Compare the token's hash with every stored hash in constant time (no early exit)."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found = None
        for stored, ident in self.tokens:
            if hmac.compare_digest(stored, digest):
                found = ident
        return found

    def by_subject(self, subject: str, common_name: str) -> Identity | None:
        for want, ident in self.subjects:
            if want == subject or (common_name and want == f"CN={common_name}"):
                return ident
        return None


def _grants(entry: dict, where: str) -> tuple[Grant, ...]:
    raw = []
    if "role" in entry or "worlds" in entry:
        raw.append({"role": entry.get("role"), "worlds": entry.get("worlds")})
    extra = entry.get("grants", [])
    if not isinstance(extra, list) or not all(isinstance(g, dict) for g in extra):
        raise AuthFileError(f"{where}: grants must be a list of {{role, worlds}} tables")
    raw.extend(extra)
    if not raw:
        raise AuthFileError(f"{where}: no role (role = \"admin|writer|reader\", worlds = \"PATTERN\")")
    grants = []
    for g in raw:
        role, worlds = g.get("role"), g.get("worlds", "*")
        if role not in RANK:
            raise AuthFileError(f"{where}: role must be admin, writer or reader, got {str(role)[:40]!r}")
        patterns = [worlds] if isinstance(worlds, str) else worlds
        if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) and p for p in patterns):
            raise AuthFileError(f"{where}: worlds must be a pattern or a list of patterns (e.g. \"match-*\")")
        grants.extend(Grant(role, p) for p in patterns)
    return tuple(grants)


def parse(data: dict, path: str = "") -> Table:
    """A Table from the TOML document ``data``; AuthFileError naming the entry at fault."""
    unknown = set(data) - {"tokens", "subjects"}
    if unknown:
        raise AuthFileError(f"{path}: unknown table(s) {sorted(unknown)} (expected [[tokens]] and [[subjects]])")
    tokens, subjects, seen = [], [], set()
    for kind, key in (("tokens", "sha256"), ("subjects", "subject")):
        entries = data.get(kind, [])
        if not isinstance(entries, list):
            raise AuthFileError(f"{path}: {kind} must be an array of tables ([[{kind}]])")
        for i, entry in enumerate(entries):
            where = f"{path}: {kind}[{i}]"
            if not isinstance(entry, dict):
                raise AuthFileError(f"{where}: not a table")
            name = entry.get("name")
            if not isinstance(name, str) or not name.strip():
                raise AuthFileError(f"{where}: needs a name")
            where += f" ({name[:40]!r})"
            value = entry.get(key)
            if kind == "tokens":
                if not isinstance(value, str) or not _HEX64.fullmatch(value):
                    raise AuthFileError(f"{where}: sha256 must be 64 lower-case hex digits (the token's SHA-256; "
                                        f"tokens are never stored in clear)")
            elif not isinstance(value, str) or "=" not in value:
                raise AuthFileError(f"{where}: subject must be a certificate subject such as \"CN=name\"")
            if (kind, value) in seen:
                raise AuthFileError(f"{where}: the same {key} is listed twice")
            seen.add((kind, value))
            ident = Identity(name, _grants(entry, where))
            if kind == "tokens":
                tokens.append((bytes.fromhex(value), ident))
            else:
                subjects.append((value, ident))
    return Table(tuple(tokens), tuple(subjects), path)


def load(path: str) -> Table:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise AuthFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise AuthFileError(f"{path}: not valid TOML ({exc})") from None
    return parse(data, path)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def append_token(path: str, name: str, role: str, worlds: str) -> str:
    """Make a new token, append its entry (hash only) to the auth file ``path`` (created if missing) and
    return the token. The file is checked before and after; on any error it is left as it was."""
    import tomli_w

    if role not in RANK:
        raise AuthFileError(f"--role: must be admin, writer or reader, got {role!r}")
    if not name.strip():
        raise AuthFileError("--name: must not be empty")
    if not worlds:
        raise AuthFileError("--worlds: must be a pattern such as \"*\" or \"match-*\"")
    old = b""
    if os.path.exists(path):
        load(path)                                      # refuse to append to a file that is already bad
        with open(path, "rb") as f:
            old = f.read()
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    entry = tomli_w.dumps({"tokens": [{"name": name, "sha256": hash_token(token), "role": role, "worlds": worlds}]})
    text = old + (b"" if not old or old.endswith(b"\n") else b"\n") + b"\n" + entry.encode()
    parse(tomllib.loads(text.decode()), path)           # the result must load
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        if old:
            os.chmod(tmp, os.stat(path).st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return token


# ---- audit ---------------------------------------------------------------------------------
class _AuditHandler(logging.Handler):
    """Audit records as JSON objects, one a line, whatever the log format (``record.audit``)."""

    def __init__(self, stream=None):
        super().__init__()
        self.stream = stream

    def emit(self, record):
        try:
            stream = self.stream or sys.stderr
            stream.write(json.dumps(record.audit, default=str) + "\n")
            stream.flush()
        except Exception:                 # noqa: BLE001 - logging never raises into the caller
            self.handleError(record)


def configure_audit(stream=None) -> None:
    """Send audit lines (JSON) to ``stream`` (default stderr), never through the root handler."""
    for h in list(audit_log.handlers):
        audit_log.removeHandler(h)
    audit_log.addHandler(_AuditHandler(stream))
    audit_log.propagate = False
    audit_log.setLevel(logging.INFO)


def audit(event: str, identity: str, peer: str = "", **fields) -> None:
    """One audit line: ``{"audit": event, "time", "identity" (a token's name, never the token), "peer", ...}``."""
    record = {"audit": event, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "identity": identity,
              "peer": peer, **{k: v for k, v in fields.items() if v is not None}}
    audit_log.info("%s", event, extra={"audit": record})


# ---- calls ---------------------------------------------------------------------------------
ATTR = "sapgrid_identity"
REFUSED_ATTR = "sapgrid_refused"        # the interceptor's on_refused, for refusals by ``require``

#: role and request field (the world named) of each call checked when it starts; None: any world.
METHODS = {
    "ListWorlds": (READER, None),           # filtered per world in the servicer
    "GetWorld": (READER, "name"),
    "QueryRegion": (READER, "world"),
    "ListPairs": (READER, "world"),
    "StreamPairs": (READER, "world"),
    "Subscribe": (READER, "world"),
    "ApplyFrame": (WRITER, None),           # each frame's world is checked in the servicer
    "StreamFrames": (WRITER, None),
    "SnapshotWorld": (WRITER, "name"),
    "CreateWorld": (ADMIN, "name"),
    "DeleteWorld": (ADMIN, "name"),
    "FreezeWorld": (ADMIN, "name"),
    "RestoreWorld": (ADMIN, "name"),        # every message's name is checked
}


def identity(context) -> Identity | None:
    """The identity the auth interceptor left on a call's context (None without --auth-file)."""
    return getattr(context, ATTR, None)


def peer_host(peer: str) -> str:
    """``ipv4:10.0.0.1:5555`` -> ``10.0.0.1`` (a client without auth is its address, not one connection)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = rest.rsplit(":", 1)[0]
        return host.strip("[]")
    return peer


def client_name(context) -> str:
    """The client a call counts for in quotas and audit lines: its identity, or ``peer:HOST``."""
    ident = identity(context)
    return ident.name if ident is not None else "peer:" + peer_host(context.peer())


_frame_refusals = None


def require(context, role: str, world: str | None, what: str) -> None:
    """Raise PermissionDenied unless the call's identity has ``role`` on ``world`` (no-op without auth);
    a refusal writes an audit line (at most one a second per peer)."""
    global _frame_refusals
    ident = identity(context)
    if ident is not None and not ident.may(role, world):
        try:
            ident.require(role, world, what)
        except PermissionDenied as exc:
            counted = getattr(context, REFUSED_ATTR, None)     # the per-client refusal metric, as the interceptor's
            if counted is not None:
                counted(ident.name, "permission_denied")
            if _frame_refusals is None:
                from .logs import _Sampler

                _frame_refusals = _Sampler()
            peer = context.peer()
            skipped = _frame_refusals.take(f"{ident.name}@{peer}")
            if skipped is not None:
                audit("refused", ident.name, peer, call=what, status="PERMISSION_DENIED", reason=str(exc), world=world,
                      suppressed=skipped)
            raise


def may(context, role: str, world: str) -> bool:
    ident = identity(context)
    return ident is None or ident.may(role, world)


class Authenticator:
    """Holds the auth file's table; ``reload()`` swaps it (SIGHUP), keeping the old one on any error."""

    def __init__(self, path: str):
        self.path = path
        self.table = load(path)

    def reload(self) -> bool:
        try:
            table = load(self.path)
        except AuthFileError as exc:
            log.error("auth file not reloaded, the previous one stays in force: %s", exc)
            audit("auth_reload_failed", "", error=str(exc))
            return False
        self.table = table
        log.info("auth file %s reloaded: %d tokens, %d subjects", self.path, len(table.tokens), len(table.subjects))
        audit("auth_reloaded", "", tokens=len(table.tokens), subjects=len(table.subjects))
        return True

    def authenticate(self, metadata, context) -> Identity:
        """The identity of a call: its bearer token if it sends one, else its client certificate's subject."""
        table = self.table
        token = None
        for key, value in metadata or ():
            if key == "authorization":
                scheme, _, token = str(value).partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    raise Unauthenticated("authorization: expected \"Bearer TOKEN\"")
                token = token.strip()
                break
        if token is not None:
            ident = table.by_token(token)
            if ident is None:
                raise Unauthenticated("authorization: unknown token")
            return ident
        auth = context.auth_context()
        subject = b"".join(auth.get("x509_subject", ())).decode("utf-8", "replace")
        common = b"".join(auth.get("x509_common_name", ())).decode("utf-8", "replace")
        if subject or common:
            ident = table.by_subject(subject, common)
            if ident is None:
                raise Unauthenticated(f"client certificate {short(subject or common)} is not in the auth file")
            return ident
        raise Unauthenticated("no credentials: send \"authorization: Bearer TOKEN\" metadata (Client(token=...), "
                              "--token or SAPGRID_TOKEN) or a client certificate listed in the auth file")


class AuthInterceptor(grpc.ServerInterceptor):
    """Authenticates every call but the health service's, checks the role of calls that name a world in
    their request, and leaves the identity on the context. A refusal ends the call before its method
    runs (UNAUTHENTICATED or PERMISSION_DENIED) and writes an audit line (sampled per peer)."""

    def __init__(self, authenticator: Authenticator, request_classes: dict, on_refused=None):
        self.authenticator = authenticator
        self.request_classes = request_classes          # method short name -> request message class
        self.on_refused = on_refused or (lambda client, code: None)
        from .logs import _Sampler

        self._sampler = _Sampler()

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        method = details.method
        if handler is None or method.startswith(HEALTH_PREFIX):
            return handler
        short_name = method.rsplit("/", 1)[-1]
        role, field = METHODS.get(short_name, (READER, None)) if method.startswith("/sapgrid.v1.SapgridService/") \
            else (READER, None)                       # echo (bench) and reflection: any known caller
        request_class = self.request_classes.get(short_name) if field else None
        metadata = details.invocation_metadata
        kind = handler_kind(handler)
        behavior = getattr(handler, kind)
        check = self._check

        def checked(request, context):
            """The call's request (iterator) once the call is authenticated and its role checked."""
            if not handler.request_streaming:
                check(metadata, context, short_name, role, request_class, field, request)
                return request
            ident = check(metadata, context, short_name, role, None, None)
            if request_class is not None:           # every message names its world (RestoreWorld)
                return _checked_messages(request, request_class, field, ident, role, short_name)
            return request

        if handler.response_streaming:              # checked in the stream, at its first response
            authed = streaming(behavior, lambda request, context: (checked(request, context), None), _no_leave)
        else:
            def authed(request, context):
                return behavior(checked(request, context), context)
        return handler._replace(**{kind: authed})

    def _check(self, metadata, context, method, role, request_class, field, request=None) -> Identity:
        world = None
        try:
            ident = self.authenticator.authenticate(metadata, context)
            setattr(context, ATTR, ident)
            setattr(context, REFUSED_ATTR, self.on_refused)      # for the refusals of the servicer's own checks
            if request_class is not None and isinstance(request, bytes):
                try:
                    world = getattr(request_class.FromString(request), field)
                except Exception:       # noqa: BLE001 - a bad request is the method's INVALID_ARGUMENT
                    world = None
                if world is not None:
                    ident.require(role, world, method)
            elif request_class is None and role == ADMIN:
                ident.require(role, None, method)
            return ident
        except (Unauthenticated, PermissionDenied) as exc:
            self.refused(context, exc, method, identity(context), world)
            from .errors import abort

            abort(context, exc)

    def refused(self, context, exc, method: str, ident: Identity | None, world: str | None = None) -> None:
        """An audit line (at most one a second per identity and peer) and a metric for a refused credential or role."""
        peer = context.peer()
        code = exc.code.name
        self.on_refused(ident.name if ident else "peer:" + peer_host(peer), code.lower())
        skipped = self._sampler.take(f"{ident.name if ident else ''}@{peer}")   # per identity and peer
        if skipped is not None:
            audit("refused", ident.name if ident else "", peer, call=method, status=code, reason=str(exc),
                  world=world, suppressed=skipped)


def _no_leave(state, context, outcome) -> None:
    pass


def _checked_messages(iterator, request_class, field, ident: Identity, role: str, method: str):
    for raw in iterator:
        try:
            world = getattr(request_class.FromString(raw), field) if isinstance(raw, bytes) else getattr(raw, field)
        except Exception:               # noqa: BLE001 - left to the method (INVALID_ARGUMENT)
            world = None
        if world:
            ident.require(role, world, method)
        yield raw


#: Calls that change which worlds exist, audited when they succeed: method -> (event, request field).
AUDITED = {"CreateWorld": ("world_created", "name"), "DeleteWorld": ("world_deleted", "name"),
           "RestoreWorld": ("world_restored", "name"), "FreezeWorld": ("world_frozen", "name")}


class AuditCalls(grpc.ServerInterceptor):
    """An audit line for every world created, deleted, restored or frozen, with the caller's name."""

    def __init__(self, request_classes: dict):
        self.request_classes = request_classes

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        short_name = details.method.rsplit("/", 1)[-1]
        if handler is None or not details.method.startswith("/sapgrid.v1.SapgridService/") or short_name not in AUDITED:
            return handler
        event, field = AUDITED[short_name]
        request_class = self.request_classes[short_name]
        if handler.response_streaming:
            return handler
        kind = handler_kind(handler)
        behavior = getattr(handler, kind, None)
        if behavior is None:
            return handler

        def name_of(raw):
            try:
                return getattr(request_class.FromString(raw) if isinstance(raw, bytes) else raw, field)
            except Exception:           # noqa: BLE001
                return None

        def audited(request, context):
            seen = []
            if handler.request_streaming:
                def messages(it):
                    for raw in it:
                        if not seen:
                            seen.append(name_of(raw))
                        yield raw
                out = behavior(messages(request), context)
            else:
                seen.append(name_of(request))
                out = behavior(request, context)
            code = context.code() if hasattr(context, "code") else None
            if code in (None, grpc.StatusCode.OK):
                audit(event, client_name(context), context.peer(), world=seen[0] if seen else None)
            return out
        return handler._replace(**{kind: audited})
