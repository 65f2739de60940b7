"""Host errors: what went wrong talking to a worker host, split into a safe part and a raw part.

A host's own error text can hold secrets (API keys echoed back, request bodies, provider diagnostics), and the
reference never persists it (docs/reference/loopd.md#s1-5, #s3-10). So every :class:`HostError` has a short,
fixed ``reason`` code and
a message built only from safe parts (operation, session id, reason); the raw text lives in ``detail`` and is
never part of ``str(error)``. Whatever the engine stores or prints comes from ``reason`` and ``str(error)``.

Host call failures exit with code 4 (an I/O problem, like storage), a bad host URL or script with 2.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from ..errors import EXIT_STORAGE, EXIT_USAGE, LoopdError

__all__ = (
    "HostConfigError",
    "HostError",
    "HostRejectedError",
    "HostReplyError",
    "HostStateError",
    "HostTimeoutError",
    "HostUnavailableError",
    "ProviderError",
    "ProviderErrorInfo",
    "NotASessionError",
    "SessionNotFoundError",
    "WorkerBusyError",
)


class HostError(LoopdError):
    """Raised when a worker host operation fails; ``reason`` is safe to store, ``detail`` never is."""

    exit_code: ClassVar[int] = EXIT_STORAGE
    reason: ClassVar[str] = "host-error"
    _what: ClassVar[str] = "the host reported an error"

    def __init__(self, operation: str, *, session_id: str | None = None, detail: str = "") -> None:
        self.operation = operation
        self.session_id = session_id
        self.detail = detail
        where = f" for session {session_id!r}" if session_id else ""
        super().__init__(f"host {operation}{where} failed: {self._what} (reason {self.reason})")


class HostUnavailableError(HostError):
    """Raised when the host cannot be reached or did not answer; retrying later may succeed."""

    reason: ClassVar[str] = "unavailable"
    _what: ClassVar[str] = "the host is unreachable"


class HostReplyError(HostUnavailableError):
    """Raised when the host answered in a shape this engine does not read (a field of another type).

    The message names the field (msgspec's path, no value from the reply), so it is safe to show.
    """

    reason: ClassVar[str] = "bad-reply"

    def __init__(self, operation: str, problem: str, *, session_id: str | None = None) -> None:
        self._what = f"the host answered in an unexpected shape: {problem}"  # type: ignore[misc]
        super().__init__(operation, session_id=session_id, detail=problem)


class HostTimeoutError(HostUnavailableError):
    """Raised when the host did not answer in time; the call may or may not have taken effect."""

    reason: ClassVar[str] = "timeout"
    _what: ClassVar[str] = "the host did not answer in time; read the live session before retrying"


class HostRejectedError(HostError):
    """Raised when the host refused the request (unknown model or agent, invalid argument, policy)."""

    reason: ClassVar[str] = "rejected"
    _what: ClassVar[str] = "the host rejected the request"


class WorkerBusyError(HostError):
    """Raised when the worker session is busy and the operation needs it idle."""

    reason: ClassVar[str] = "busy"
    _what: ClassVar[str] = "the worker session is busy"


class SessionNotFoundError(HostError):
    """Raised when the worker session does not exist on the host."""

    reason: ClassVar[str] = "session-not-found"
    _what: ClassVar[str] = "the worker session does not exist on this host"


class NotASessionError(SessionNotFoundError):
    """Raised when a session id cannot name a session of this host at all (a goal created from the CLI has the
    owner ``cli``, which no OpenCode session is): asking again can never succeed."""

    reason: ClassVar[str] = "not-a-session"
    _what: ClassVar[str] = "no session of this host has that id"


class ProviderErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a model provider reported when it refused a prompt: the inputs of the docs/reference/loopd.md#s6
    classification.

    ``message`` and ``headers`` are raw and may hold secrets: hand :meth:`as_reported` to the classifier,
    which keeps only kind, status code and retry time, and never store this value itself.
    """

    status_code: int | None = None
    code: str | None = None
    name: str | None = None
    error_type: str | None = None
    message: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    retry_after: str | float | None = None

    def as_reported(self) -> dict[str, Any]:
        """The error in the host's JSON shape (``statusCode``, ``code``, ``responseHeaders``, ...) for ``classify``."""
        fields: dict[str, Any] = {
            "name": self.name,
            "type": self.error_type,
            "statusCode": self.status_code,
            "code": self.code,
            "message": self.message,
            "retryAfter": self.retry_after,
        }
        report = {key: value for key, value in fields.items() if value is not None}
        if self.headers:
            report["responseHeaders"] = {k.lower(): v for k, v in self.headers.items()}
        return report

    def summary(self) -> str:
        """A safe one-line description (status and code only, never the message or headers)."""
        parts = [f"status {self.status_code}" if self.status_code is not None else "no status"]
        if self.code:
            parts.append(f"code {self.code}")
        return "provider error (" + ", ".join(parts) + ")"


class ProviderError(HostError):
    """Raised when a prompt was refused by the model provider (rate limit, quota, auth, context, ...)."""

    reason: ClassVar[str] = "provider-error"
    _what: ClassVar[str] = "the model provider refused the prompt"

    def __init__(self, operation: str, info: ProviderErrorInfo, *, session_id: str | None = None) -> None:
        self.info = info
        super().__init__(operation, session_id=session_id, detail=info.message or "")
        self.args = (f"{self.args[0]}: {info.summary()}",)


class HostConfigError(HostError):
    """Raised when a host URL or a simulated host's script is invalid; nothing was called."""

    exit_code: ClassVar[int] = EXIT_USAGE
    reason: ClassVar[str] = "config"

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        LoopdError.__init__(self, f"invalid host configuration in {where}: {problem}")
        self.operation, self.session_id, self.detail = "configure", None, problem


class HostStateError(HostError):
    """Raised when the simulated host's state file cannot be read or written."""

    reason: ClassVar[str] = "state"

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        LoopdError.__init__(
            self, f"simulated host state {where}: {problem}; delete the file to start the host afresh"
        )
        self.operation, self.session_id, self.detail = "state", None, problem
