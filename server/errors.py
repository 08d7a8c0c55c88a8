"""Service errors and THE mapping of every domain error to a gRPC status (STYLE 13: one place).

sapcore raises FrameError / CapacityError / ConfigError; the server adds its own errors below
(unknown world, name taken, dims mismatch, queue full, malformed bytes). ``to_status`` turns any of
them into (code, message, field, index); ``abort`` ends a unary call with that status plus a
``google.rpc.BadRequest`` detail; ``frame_error`` builds the in-stream FrameError message.
Anything else is a bug: INTERNAL with a generic message (the traceback goes to the log).
"""
from __future__ import annotations

import logging

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status


from sapgrid.v1 import frame_pb2

log = logging.getLogger("sapgrid.server")


class ServiceError(Exception):
    """An error of the service layer with its status code and, optionally, the field at fault."""

    code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, field: str = "", index: int = -1):
        super().__init__(message)
        self.field = field
        self.index = int(index)


class WorldNotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND

    def __init__(self, name: str, field: str = "world"):
        super().__init__(f"world {short(name)} not found", field=field)


class WorldGone(WorldNotFound):
    """A stream's world was deleted (and maybe created again under its name) since the stream wrote to it."""

    def __init__(self, name: str):
        ServiceError.__init__(self, f"world {short(name)} was deleted since this stream wrote to it (a world "
                                    f"created again under its name is another world)", field="world")


def short(value: str, limit: int = 64) -> str:
    """A client's string for a message: quoted, cut to ``limit`` characters (a 10k-character name must
    not make the status exceed gRPC's metadata limit)."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} characters)"


class WorldExists(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


class InvalidInput(ServiceError):
    """Malformed request: wrong byte length, bad name, bad region..."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DimsMismatch(ServiceError):
    """The request's arrays fit another dims than the world's."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Exhausted(ServiceError):
    """A bounded resource is full (world queue, worlds, subscriber buffer)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class ShuttingDown(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class SeqConflict(ServiceError):
    """A writer's frame out of its sequence: a gap, or a seq older than the answers the world keeps."""

    code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, message: str):
        super().__init__(message, field="seq")


class Unavailable(ServiceError):
    """The world cannot take the frame now and nothing changed: its log cannot be written (disk full,
    I/O error), it is frozen (moving to another replica), or the server is still recovering its worlds."""

    code = grpc.StatusCode.UNAVAILABLE


class Cancelled(ServiceError):
    """The caller went away (cancelled, or its deadline passed) before its job started."""

    code = grpc.StatusCode.CANCELLED


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str, str, int]:
    """(code, message, field, index) of any exception. The only place errors are mapped."""
    if isinstance(exc, ServiceError):
        return exc.code, str(exc), exc.field, exc.index
    from sapcore.errors import CapacityError, ConfigError, FrameError   # here: the cluster ring's users need no engine

    if isinstance(exc, CapacityError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), exc.field, -1
    if isinstance(exc, FrameError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc), exc.field, exc.index
    if isinstance(exc, ConfigError):
        return grpc.StatusCode.INVALID_ARGUMENT, f"config: {exc}", "config", -1
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded", "", -1
    log.error("internal error", exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error", "", -1


def outcome(exc: BaseException | None) -> str:
    """Metric label of a frame's outcome: "ok" or the lower-case status code name."""
    return "ok" if exc is None else to_status(exc)[0].name.lower()


def field_path(field: str, index: int) -> str:
    return f"{field}[{index}]" if field and index >= 0 else field


def rich_status(exc: BaseException) -> grpc.Status:
    """grpc.Status of an exception with a google.rpc.BadRequest detail naming the field."""
    code, message, field, index = to_status(exc)
    status = status_pb2.Status(code=code.value[0], message=message)
    if field:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field_path(field, index), description=message)]))
        status.details.append(detail)
    return rpc_status.to_status(status)


def abort(context: grpc.ServicerContext, exc: BaseException):
    """End the call with the status of ``exc`` (never returns: raises the exception gRPC expects)."""
    context.abort_with_status(rich_status(exc))


def frame_error(exc: BaseException) -> frame_pb2.FrameError:
    """The in-stream FrameError of an exception (same mapping as ``abort``)."""
    code, message, field, index = to_status(exc)
    return frame_pb2.FrameError(code=code.value[0], message=message, field=field, index=index)


assert code_pb2.INVALID_ARGUMENT == grpc.StatusCode.INVALID_ARGUMENT.value[0]
