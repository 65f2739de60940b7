"""Small pure pieces of the OpenCode host: message ids, model refs, status kinds, where a fork cuts.

They hold no connection and do no I/O, so :mod:`.opencode` (the HTTP host) keeps only the requests.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Final, Literal

from .errors import HostRejectedError

if TYPE_CHECKING:
    from . import opencode_json as j
    from .base import SessionStatus
    from .events import TranscriptMessage


def fork_point(
    transcript: list[TranscriptMessage], through: str | None, session_id: str
) -> tuple[list[TranscriptMessage], str | None]:
    """The messages a fork keeps (through ``through``; none without it) and the id of the first one it drops.

    ``POST /session/{id}/fork`` copies the messages *before* the ``messageID`` it is given, so a fork names the
    message after the last one kept (``None``: keep the whole session).

    :raises HostRejectedError: when ``through`` is not in the transcript.
    """
    if through is None:
        return [], None
    wanted = {through, _message_id(through)}
    at = next((i for i, m in enumerate(transcript) if m.message_id in wanted), None)
    if at is None:
        raise HostRejectedError(
            "fork", session_id=session_id, detail=f"message {through} is not in the session"
        )
    after = transcript[at + 1].message_id if at + 1 < len(transcript) else None
    return transcript[: at + 1], after


def _message_id(prompt_id: str) -> str:
    """OpenCode wants message ids that start with ``msg``; any other prompt id is mapped to one, stably."""
    if prompt_id.startswith("msg"):
        return prompt_id
    return "msg_" + hashlib.sha256(prompt_id.encode()).hexdigest()[:26]


_AGENT_MODES: Final[dict[str, Literal["primary", "subagent", "all"]]] = {
    "primary": "primary",
    "subagent": "subagent",
    "all": "all",
}


def _status_kind(kind: object) -> SessionStatus:
    return kind if kind in ("busy", "retry", "idle") else "unknown"


def _split_model(model: str) -> tuple[str, str]:
    provider, sep, model_id = model.partition("/")
    if not sep or not provider or not model_id:
        raise HostRejectedError("model", detail=f"{model!r} is not provider/model")
    return provider, model_id


def _model_of(info: j.SessionInfo) -> str | None:
    return info.model.ref() if info.model is not None else None
