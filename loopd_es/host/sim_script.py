"""The simulated host's two files: the script (what the host offers, what to break) and the live state.

The **script** (``host.json`` or ``host.toml``) is read-only configuration::

    model_switching = "session"            # session | next-prompt | unsupported
    agent_capability = "supported"         # supported | unavailable | unsupported
    prompt_busy_polls = 2                  # after a prompt, 2 status polls say busy, then idle (default:
                                           # busy until the worker answers, as OpenCode; 0: stays as it was)
    auto_reply = true                      # answer every prompt at once (usage below), then go idle
    reply_usage = { input = 100, output = 50, cost = 0.001 }
    [[models]]
    provider = "p"
    id = "new"
    usable = true                          # true | false | "unknown"
    [[agents]]
    name = "build"
    [[sessions]]
    id = "ses_1"
    model = "p/old"
    status = "busy"
    then = ["busy", "idle"]                # the answers of the following status polls; the last one sticks
    [[failures]]
    op = "switch_agent"                    # any WorkerHost operation, or "*"
    session = "ses_1"                      # optional: count and match this session's calls only
    on_call = 2                            # optional: only the 2nd call (default: every call)
    error = "rejected"                     # unavailable | timeout | rejected | busy | session-not-found
    [[provider_errors]]                    # raised by prompt; same session / on_call matching
    status_code = 429
    headers = { "retry-after" = "60" }

Left-out ``providers``, ``models`` and ``agents`` mean the default catalog (:data:`DEFAULT_SCRIPT`).

The **state** (``<script stem>.state.json`` beside it) holds what changes: sessions and their identity, status
scripts, call counters, the call journal, prompts, transcripts, owner notices, failures injected at run
time, and holds (calls stopped at their start until released, and the calls waiting there). The host's events
(:mod:`loopd_es.host.events`) go to ``<script stem>.events.ndjson``, which subscribers in any process follow.
It is rewritten atomically (temp file, fsync, rename, fsync of the directory) under an exclusive lock after every call, so
it survives ``kill -9`` of any process using the host and every process sees the same live identity.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from ..private_files import PRIVATE_FILE, make_private_dir
from .base import AgentMode, SessionStatus, Usable
from .errors import HostConfigError, HostStateError, ProviderErrorInfo
from .events import TranscriptMessage

Operation = Literal[
    "create_worker",
    "prompt",
    "session_status",
    "abort",
    "session_identity",
    "list_models",
    "list_agents",
    "switch_model",
    "switch_agent",
    "compact",
]
ErrorKind = Literal["unavailable", "timeout", "rejected", "busy", "session-not-found", "provider"]
JOURNAL_CAP: Final = 1000
PROMPTS_CAP: Final = 200
TRANSCRIPT_CAP: Final = 400
NOTIFICATIONS_CAP: Final = 1000
LOCK_TIMEOUT_S: Final = 10.0


class _Script(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ScriptProvider(_Script, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: str
    name: str | None = None
    connected: Usable = True


class ScriptModel(_Script, frozen=True, kw_only=True, forbid_unknown_fields=True):
    provider: str
    id: str
    name: str | None = None
    usable: Usable = True
    context_limit: int | None = None
    output_limit: int | None = None

    @property
    def ref(self) -> str:
        return f"{self.provider}/{self.id}"


class ScriptAgent(_Script, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    mode: AgentMode = "primary"
    description: str | None = None


class ScriptSession(_Script, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: str
    title: str = ""
    model: str | None = None
    agent: str | None = None
    status: SessionStatus = "idle"
    then: tuple[SessionStatus, ...] = ()


class FailureRule(_Script, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One injected failure: an ``error`` to raise, or a forced ``result`` for a switch."""

    op: Operation | Literal["*"]
    session: str | None = None
    on_call: int | None = None
    error: ErrorKind | None = None
    result: Literal["next-prompt", "unsupported"] | None = None
    detail: str = "injected failure"
    provider: ProviderErrorInfo | None = None


class ScriptProviderError(_Script, frozen=True, kw_only=True, forbid_unknown_fields=True):
    session: str | None = None
    on_call: int | None = None
    status_code: int | None = None
    code: str | None = None
    name: str | None = None
    error_type: str | None = None
    message: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    retry_after: str | float | None = None

    def rule(self) -> FailureRule:
        info = ProviderErrorInfo(
            status_code=self.status_code,
            code=self.code,
            name=self.name,
            error_type=self.error_type,
            message=self.message,
            headers=self.headers,
            retry_after=self.retry_after,
        )
        return FailureRule(
            op="prompt", session=self.session, on_call=self.on_call, error="provider", provider=info
        )


class ScriptUsage(_Script, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The usage an automatic reply reports (tokens and dollars)."""

    input: int = 100
    output: int = 50
    cost: float = 0.001
    duration_ms: float = 1000.0


class HostScript(_Script, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A simulated host's configuration; ``None`` lists mean "the default catalog"."""

    model_capability: Literal["supported", "unavailable", "unsupported"] = "supported"
    model_switching: Literal["session", "next-prompt", "unsupported"] = "session"
    agent_capability: Literal["supported", "unavailable", "unsupported"] = "supported"
    agent_switching: Literal["session", "next-prompt", "unsupported"] = "session"
    providers: tuple[ScriptProvider, ...] | None = None
    models: tuple[ScriptModel, ...] | None = None
    agents: tuple[ScriptAgent, ...] | None = None
    default_model: str | None = None
    default_agent: str | None = None
    prompt_busy_polls: int | None = None
    """``None`` (the default): a prompt leaves the session busy until the worker's answer is done (a reply, an
    idle, a failure or an abort), as OpenCode does. ``N``: the next N status polls say busy, then idle.
    ``0``: the prompt leaves the status as it was (OpenCode's rare "no entry yet right after the 204" race)."""
    sessions: tuple[ScriptSession, ...] = ()
    failures: tuple[FailureRule, ...] = ()
    provider_errors: tuple[ScriptProviderError, ...] = ()
    can_fork: bool = True
    """Whether the host forks a session itself (else a forked goal's worker is primed with the transcript)."""
    auto_reply: bool = False
    """Answer every prompt at once: a completed assistant message with ``reply_usage``, then idle."""
    reply_usage: ScriptUsage = ScriptUsage()

    def resolved(self, where: str) -> HostScript:
        """The script with defaults filled in and cross-references checked.

        :raises HostConfigError: for a rule that cannot fire or a reference to nothing.
        """
        models = self.models if self.models is not None else (DEFAULT_SCRIPT.models or ())
        if self.providers is not None:
            providers = self.providers
        elif self.models is not None:
            providers = tuple(ScriptProvider(id=p) for p in dict.fromkeys(m.provider for m in models))
        else:
            providers = DEFAULT_SCRIPT.providers or ()
        agents = self.agents if self.agents is not None else (DEFAULT_SCRIPT.agents or ())
        known = {p.id for p in providers}
        for m in models:
            if m.provider not in known:
                raise HostConfigError(
                    where, f"model {m.ref!r} names provider {m.provider!r}, which is not listed"
                )
        if self.prompt_busy_polls is not None and self.prompt_busy_polls < 0:
            raise HostConfigError(where, "prompt_busy_polls must be >= 0")
        for rule in self.failures:
            check_rule(rule, where)
        for s in self.sessions:
            if not s.id:
                raise HostConfigError(where, "a session has an empty id")
        return msgspec.structs.replace(self, providers=providers, models=models, agents=agents)

    def rules(self) -> tuple[FailureRule, ...]:
        return self.failures + tuple(p.rule() for p in self.provider_errors)


def check_rule(rule: FailureRule, where: str) -> None:
    """:raises HostConfigError: when ``rule`` could never fire as written."""
    if (rule.error is None) == (rule.result is None):
        raise HostConfigError(where, f"failure rule for {rule.op!r} needs exactly one of error or result")
    if rule.result is not None and rule.op not in ("switch_model", "switch_agent"):
        raise HostConfigError(where, f"result={rule.result!r} only applies to switch_model or switch_agent")
    if rule.error == "provider" and (rule.provider is None or rule.op != "prompt"):
        raise HostConfigError(where, "error='provider' needs op='prompt' (use [[provider_errors]])")
    if rule.on_call is not None and rule.on_call < 1:
        raise HostConfigError(where, f"on_call must be >= 1, got {rule.on_call}")


DEFAULT_SCRIPT: Final = HostScript(
    providers=(
        ScriptProvider(id="openai", name="OpenAI"),
        ScriptProvider(id="anthropic", name="Anthropic"),
    ),
    models=(
        ScriptModel(provider="openai", id="gpt-5", name="GPT-5", context_limit=400_000, output_limit=128_000),
        ScriptModel(provider="openai", id="gpt-5-mini", name="GPT-5 mini", context_limit=400_000),
        ScriptModel(
            provider="anthropic", id="claude-sonnet-4-5", name="Claude Sonnet 4.5", context_limit=200_000
        ),
        ScriptModel(
            provider="anthropic", id="claude-haiku-4-5", name="Claude Haiku 4.5", context_limit=200_000
        ),
    ),
    agents=(
        ScriptAgent(name="build", description="default agent: edits files and runs tools"),
        ScriptAgent(name="plan", description="plans without editing"),
    ),
)


def parse_script(text: str | bytes, where: str, *, toml: bool) -> HostScript:
    """Decode and resolve a script; TOML when ``toml``, JSON otherwise.

    :raises HostConfigError: with msgspec's path-precise message when a field is wrong.
    """
    try:
        raw: Any = (
            tomllib.loads(text.decode() if isinstance(text, bytes) else text) if toml else json.loads(text)
        )
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HostConfigError(where, f"not valid {'TOML' if toml else 'JSON'}: {e}") from e
    try:
        script = msgspec.convert(raw, HostScript)
    except msgspec.ValidationError as e:
        raise HostConfigError(where, str(e)) from e
    return script.resolved(where)


def read_script(path: Path) -> HostScript:
    """The script at ``path``, or the default catalog when there is no file (blocking I/O)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return DEFAULT_SCRIPT.resolved(str(path))
    except OSError as e:
        raise HostConfigError(str(path), f"cannot read: {e.strerror}") from e
    return parse_script(data, str(path), toml=path.suffix == ".toml")


def state_path_for(script: Path) -> Path:
    """``host.json`` / ``host.toml`` -> ``host.state.json`` in the same directory."""
    return script.with_name(f"{script.stem}.state.json")


def events_path_for(state: Path) -> Path:
    """``host.state.json`` -> ``host.events.ndjson``: the event stream other processes tail."""
    return state.with_name(state.name.removesuffix(".state.json") + ".events.ndjson")


# -- live state ----------------------------------------------------------------------------------------


class SimSession(msgspec.Struct, kw_only=True):
    id: str
    title: str = ""
    model: str | None = None
    agent: str | None = None
    status: SessionStatus = "idle"
    then: list[SessionStatus] = msgspec.field(default_factory=list)


class CallRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One call as the host saw it: ``outcome`` is ``ok``, a result or status, or ``error:<reason>``."""

    n: int
    op: str
    session_id: str | None = None
    arg: str | None = None
    outcome: str = "ok"


class PromptRecord(msgspec.Struct, frozen=True, kw_only=True):
    prompt_id: str
    session_id: str
    model: str | None
    agent: str | None
    text: str


class NotificationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A notice shown to an owner session; ``notification_id`` makes showing it idempotent."""

    notification_id: str
    session_id: str
    text: str


class HeldCall(msgspec.Struct, frozen=True, kw_only=True):
    """A call waiting at a hold: ``ticket`` numbers it, ``pid`` is the process that made it."""

    ticket: int
    op: str
    session_id: str | None = None
    pid: int = 0


class SimState(msgspec.Struct, kw_only=True):
    """Everything the simulated host remembers between calls and processes."""

    version: int = 1
    next_session: int = 1
    next_prompt: int = 1
    calls_total: int = 0
    sessions: dict[str, SimSession] = msgspec.field(default_factory=dict)
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    calls: list[CallRecord] = msgspec.field(default_factory=list)
    prompts: list[PromptRecord] = msgspec.field(default_factory=list)
    failures: list[FailureRule] = msgspec.field(default_factory=list)
    usable_overrides: dict[str, Usable] = msgspec.field(default_factory=dict)
    transcripts: dict[str, list[TranscriptMessage]] = msgspec.field(default_factory=dict)
    notifications: list[NotificationRecord] = msgspec.field(default_factory=list)
    next_event: int = 1
    next_message: int = 1
    holds: list[str] = msgspec.field(default_factory=list)
    """The calls held at their start until released (``loopd-es host hold``; :mod:`loopd_es.host.holds`)."""
    held: list[HeldCall] = msgspec.field(default_factory=list)
    next_ticket: int = 1

    @classmethod
    def initial(cls, script: HostScript) -> SimState:
        return cls(
            sessions={
                s.id: SimSession(
                    id=s.id, title=s.title, model=s.model, agent=s.agent, status=s.status, then=list(s.then)
                )
                for s in script.sessions
            }
        )


_STATE_ENCODER: Final = msgspec.json.Encoder()
_STATE_DECODER: Final = msgspec.json.Decoder(SimState)


def load_state(path: Path) -> SimState | None:
    """The state in ``path``, or ``None`` when there is none yet (blocking I/O).

    :raises HostStateError: when the file exists but cannot be read or decoded.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise HostStateError(str(path), f"cannot read: {e.strerror}") from e
    try:
        return _STATE_DECODER.decode(data)
    except msgspec.DecodeError as e:
        raise HostStateError(str(path), f"cannot decode: {e}") from e


def save_state(path: Path, state: SimState) -> None:
    """Replace ``path`` with ``state`` atomically and durably: a reader sees the old or the new file, whole.

    Call it only while holding :func:`locked`.
    """
    # one fixed name is enough (writers hold the lock), and a temp left by a killed writer is simply overwritten
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        try:
            os.write(fd, _STATE_ENCODER.encode(state))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise HostStateError(str(path), f"cannot write: {e.strerror}") from e


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` so read-modify-write cycles of the state never interleave.

    Every holder counts its turn in the lock file, so a waiter tells a busy lock (held by one process after
    another: it waits on) from a stuck one (held by the same process for :data:`LOCK_TIMEOUT_S`: an error). A
    process that calls the host back to back can take the lock again before a waiter's next try, so a waiter
    may lose many rounds on a loaded machine without anything being wrong.
    """
    lock_path = path.with_name(path.name + ".lock")
    try:
        make_private_dir(path.parent)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    except OSError as e:
        raise HostStateError(str(lock_path), f"cannot open the lock: {e.strerror}") from e
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        seen = _turns(fd)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    turns = _turns(fd)
                    if turns == seen:
                        raise HostStateError(
                            str(lock_path),
                            f"lock held by one process for more than {LOCK_TIMEOUT_S:g} s",
                        ) from None
                    seen, deadline = turns, time.monotonic() + LOCK_TIMEOUT_S  # others took turns: busy
                time.sleep(0.002)
        os.pwrite(fd, (_turns(fd) + 1).to_bytes(8, "little"), 0)
        yield
    finally:
        os.close(fd)


def _turns(fd: int) -> int:
    """How many times the lock was taken (0 for a lock file an earlier version left empty)."""
    return int.from_bytes(os.pread(fd, 8, 0).ljust(8, b"\0"), "little")
