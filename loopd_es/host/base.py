"""The host port: what loopd-es needs from whatever runs worker sessions (OpenCode, or the simulated host).

Sagas and the engine talk only to :class:`WorkerHost`; deciders never do (they get what a host said as
facts). Results are frozen msgspec Structs so they can be logged, compared and turned into facts without
copies. Model references are ``"providerID/modelID"`` strings, as in goal configs and events.

What the port promises, taken from the reference (docs/reference/loopd.md#s1-6, #s3-10, #s3-21):

- Catalog reads never raise for host failures: a catalog the host could not produce comes back with
  ``capability="unavailable"`` and no entries; a host without the API says ``"unsupported"``.
- Quota is never claimed: :class:`QuotaReport` is always ``status="unknown"``.
- A switch returns ``"applied"`` (the live session has the new identity now), ``"next-prompt"`` (it rides on
  the next prompt that names it) or ``"unsupported"`` (nothing changed), or raises a
  :class:`~loopd_es.host.errors.HostError`. After an error or a crash, :meth:`WorkerHost.session_identity`
  is the truth: recovery reads it rather than guessing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal, Protocol, runtime_checkable

import msgspec

if TYPE_CHECKING:
    from .events import TranscriptMessage

Capability = Literal["supported", "unavailable", "unsupported"]
Switching = Literal["session", "next-prompt", "unsupported"]
SessionStatus = Literal["idle", "busy", "retry", "unknown"]
SwitchResult = Literal["applied", "next-prompt", "unsupported"]
Usable = bool | Literal["unknown"]
AgentMode = Literal["primary", "subagent", "all"]

QUOTA_LIMITATION: Final = (
    "Host catalog does not report remaining quota or reset time. Connected/enabled does not prove remaining "
    "balance; local rate-limit observations are not balance data."
)


class _Value(msgspec.Struct, frozen=True, kw_only=True):
    pass


class ProviderInfo(_Value, frozen=True, kw_only=True):
    """One model provider; ``connected`` is ``"unknown"`` when the host cannot tell (v2 catalogs)."""

    provider_id: str
    name: str
    connected: Usable = "unknown"


class ModelInfo(_Value, frozen=True, kw_only=True):
    """One model; only ``usable is True`` makes it a positively usable switch target
    (docs/reference/loopd.md#s1-6)."""

    provider_id: str
    model_id: str
    name: str
    usable: Usable = "unknown"
    context_limit: int | None = None
    output_limit: int | None = None

    @property
    def ref(self) -> str:
        """``providerID/modelID``."""
        return f"{self.provider_id}/{self.model_id}"


class QuotaReport(_Value, frozen=True, kw_only=True):
    """The honest answer to "how much quota is left?": unknown, always, with the reason why."""

    status: Literal["unknown"] = "unknown"
    capability: Literal["unsupported"] = "unsupported"
    source: str = ""
    observed_at: str = ""
    limitation: str = QUOTA_LIMITATION


class ModelCatalog(_Value, frozen=True, kw_only=True):
    """The host's models and whether it can switch a live session's model (docs/reference/loopd.md#s1-6)."""

    capability: Capability
    source: str
    observed_at: str
    switching: Switching
    providers: tuple[ProviderInfo, ...] = ()
    models: tuple[ModelInfo, ...] = ()
    quota: QuotaReport = QuotaReport()

    def find(self, ref: str) -> ModelInfo | None:
        """The model ``providerID/modelID``, or ``None`` when the catalog does not list it."""
        return next((m for m in self.models if m.ref == ref), None)

    def usable(self, ref: str) -> bool:
        """Whether ``ref`` is *positively* usable (``"unknown"`` is not), the rule for switch targets."""
        found = self.find(ref)
        return found is not None and found.usable is True


class AgentInfo(_Value, frozen=True, kw_only=True):
    """One agent the worker can run as."""

    name: str
    mode: AgentMode = "primary"
    description: str | None = None


class AgentCatalog(_Value, frozen=True, kw_only=True):
    """The host's agents and whether it can switch a live session's agent (docs/reference/loopd.md#s1-6)."""

    capability: Capability
    source: str
    observed_at: str
    switching: Switching
    agents: tuple[AgentInfo, ...] = ()

    def names(self) -> tuple[str, ...]:
        """The agent names, in catalog order."""
        return tuple(a.name for a in self.agents)


class SessionIdentity(_Value, frozen=True, kw_only=True):
    """The live model and agent of a worker session; ``None`` where the host does not know yet."""

    session_id: str
    model: str | None = None
    agent: str | None = None


class PromptReceipt(_Value, frozen=True, kw_only=True):
    """A prompt the host accepted for delivery, with the identity it was sent with."""

    session_id: str
    prompt_id: str
    model: str | None = None
    agent: str | None = None


ForkMethod = Literal["fork", "primed", "new"]


class ForkedWorker(_Value, frozen=True, kw_only=True):
    """A worker session made for a forked goal, and how: the host's own fork of the source session at the
    matching message (``fork``), a new session primed with the transcript up to it (``primed``), or a new
    session with nothing to carry over (``new``)."""

    session_id: str
    source_session_id: str
    method: ForkMethod
    kept_messages: int = 0


def transcript_text(messages: list[TranscriptMessage]) -> str:
    """The priming prompt of a forked worker whose host cannot fork: the earlier conversation, in order."""
    lines = ["This session continues an earlier one. Its conversation so far:", ""]
    lines.extend(f"[{m.role}] {m.text}".rstrip() for m in messages)
    return "\n".join(lines)


@runtime_checkable
class WorkerHost(Protocol):
    """The operations a worker host offers loopd-es; every method may be awaited from any task.

    Failures are :class:`~loopd_es.host.errors.HostError` subclasses whose ``str()`` and ``reason`` are
    safe to store; their raw ``detail`` is not.
    """

    @property
    def url(self) -> str:
        """The URL this host was opened with (``sim:PATH``, ``http://...``), for messages and events."""
        ...

    async def create_worker(
        self, *, title: str, model: str | None = None, agent: str | None = None
    ) -> SessionIdentity:
        """Create a new worker session and return its id and starting identity.

        :raises HostUnavailableError: when the host cannot be reached.
        :raises HostRejectedError: when the host refuses the model or agent.
        """
        ...

    async def prompt(
        self,
        session_id: str,
        text: str,
        *,
        model: str | None = None,
        agent: str | None = None,
        prompt_id: str | None = None,
        fresh: bool = False,
    ) -> PromptReceipt:
        """Send ``text`` to the session, as ``model``/``agent`` when given; returns once delivery is accepted.

        A model or agent given here becomes the session's live identity (that is how ``next-prompt``
        switches land). A ``prompt_id`` is delivered once: one the session already has is not sent again,
        unless ``fresh`` says the caller made it up for this call and is fenced against anyone else sending it
        meanwhile (the engine's lease, checked just before), so the host may skip looking for it.

        :raises ProviderError: when the model provider refuses it (429, quota, ...); classify its ``info``.
        :raises SessionNotFoundError: when the session does not exist.
        :raises HostUnavailableError: when the host cannot be reached.
        """
        ...

    async def session_status(self, session_id: str) -> SessionStatus:
        """Whether the session is ``idle``, ``busy``, waiting to ``retry``, or ``unknown``.

        Never raises for host failures or a missing session: those are ``"unknown"``, which callers treat
        as "not idle" (docs/reference/loopd.md#s3-10 step 6).
        """
        ...

    async def abort(self, session_id: str) -> None:
        """Stop whatever the session is doing; it is idle afterwards.

        :raises SessionNotFoundError: when the session does not exist.
        :raises HostUnavailableError: when the host cannot be reached.
        """
        ...

    async def session_identity(self, session_id: str) -> SessionIdentity:
        """The session's live model and agent: the ground truth for crash recovery.

        :raises SessionNotFoundError: when the session does not exist.
        :raises HostUnavailableError: when the host cannot be reached.
        """
        ...

    async def list_models(self) -> ModelCatalog:
        """The model catalog; ``capability="unavailable"`` (never an exception) when the host failed."""
        ...

    async def list_agents(self) -> AgentCatalog:
        """The agent catalog; ``capability="unavailable"`` (never an exception) when the host failed."""
        ...

    async def switch_model(self, session_id: str, model: str) -> SwitchResult:
        """Switch the live session to ``model`` (``providerID/modelID``).

        :raises WorkerBusyError: when the session is busy.
        :raises HostRejectedError: when the host refuses the model.
        :raises SessionNotFoundError: when the session does not exist.
        :raises HostUnavailableError: when the host cannot be reached (the switch may have landed: read
            :meth:`session_identity`).
        """
        ...

    async def switch_agent(self, session_id: str, agent: str) -> SwitchResult:
        """Switch the live session to ``agent``; raises exactly as :meth:`switch_model`."""
        ...

    async def compact(self, session_id: str, *, model: str | None = None) -> None:
        """Summarise the session's history (with ``model`` when given) to free context.

        :raises SessionNotFoundError: when the session does not exist.
        :raises HostUnavailableError: when the host cannot be reached.
        """
        ...

    async def fork_worker(self, session_id: str, *, through: str | None, title: str) -> ForkedWorker:
        """A new worker session that starts with ``session_id``'s messages up to and including ``through``
        (a message or prompt id; ``None``: no messages, a new session). The host's own fork when it has one,
        else a new session primed with that transcript.

        :raises SessionNotFoundError: when the session does not exist.
        :raises HostRejectedError: when ``through`` is not a message of the session.
        :raises HostUnavailableError: when the host cannot be reached.
        """
        ...

    async def aclose(self) -> None:
        """Release connections; the host object is not used afterwards."""
        ...
