"""Typed errors of the sapgrid client, carrying the server's message and the field/index at fault.

Every gRPC failure and every rejected frame of a stream becomes one of these (no engine needed:
``sapgrid.tools.remote_world.RemoteWorld`` turns them into sapcore's errors for code written against
a local ``sapcore.World``).
"""
from __future__ import annotations

import re

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

_FIELD_RE = re.compile(r"^(?P<field>[A-Za-z_][A-Za-z0-9_.]*)(\[(?P<index>\d+)\])?$")


class SapgridError(Exception):
    """A call failed. code: grpc.StatusCode; message: the server's message; field/index: where ("" / -1)."""

    code = grpc.StatusCode.UNKNOWN
    stream_ended = False          # True when the error ended a whole frame stream (not one frame's refusal)

    def __init__(self, message: str, field: str = "", index: int = -1, code: grpc.StatusCode | None = None):
        Exception.__init__(self, message)
        self.message = message
        self.field = field
        self.index = int(index)
        self.reason = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(SapgridError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class FailedPrecondition(SapgridError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class NotFound(SapgridError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(SapgridError):
    code = grpc.StatusCode.ALREADY_EXISTS


class ResourceExhausted(SapgridError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(SapgridError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(SapgridError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(SapgridError):
    code = grpc.StatusCode.CANCELLED


class DataLoss(SapgridError):
    """The client's view and the server's disagree: a mirror's pair digest differs from the server's, or a
    writer's frames the server had answered are gone (a server without a data directory restarted)."""

    code = grpc.StatusCode.DATA_LOSS


_BY_CODE = {c.code: c for c in (InvalidArgument, FailedPrecondition, NotFound, AlreadyExists, ResourceExhausted,
                                 Unavailable, DeadlineExceeded, Cancelled, DataLoss)}
_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


class Unauthenticated(SapgridError):
    """No credentials, or a token / client certificate the server does not know."""
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(SapgridError):
    """The caller's role does not cover this call on this world."""
    code = grpc.StatusCode.PERMISSION_DENIED


_BY_CODE.update({c.code: c for c in (Unauthenticated, PermissionDenied)})


def make_error(code: grpc.StatusCode, message: str, field: str = "", index: int = -1) -> SapgridError:
    cls = _BY_CODE.get(code, SapgridError)
    return cls(message, field, index, code=code)


def split_field(path: str) -> tuple[str, int]:
    """ "add_boxes[3]" -> ("add_boxes", 3); "world" -> ("world", -1)."""
    m = _FIELD_RE.match(path or "")
    if not m:
        return path or "", -1
    return m["field"], int(m["index"]) if m["index"] is not None else -1


def unavailable(message: str) -> SapgridError:
    return make_error(grpc.StatusCode.UNAVAILABLE, message)


def from_rpc_error(err: grpc.RpcError) -> SapgridError:
    """Typed error of a failed call, with the field of its google.rpc.BadRequest detail when present."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    field, index = "", -1
    try:
        status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
    except Exception:  # a malformed detail must not hide the error itself
        status = None
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                br = error_details_pb2.BadRequest()
                detail.Unpack(br)
                if br.field_violations:
                    field, index = split_field(br.field_violations[0].field)
                    break
    return make_error(code, message or "", field, index)


def from_frame_error(msg) -> SapgridError:
    """Typed error of a FrameError message (a rejected frame of a stream)."""
    code = _BY_NUMBER.get(msg.code, grpc.StatusCode.UNKNOWN)
    return make_error(code, msg.message, msg.field, msg.index)
