"""Redaction for shareable bundles: secrets out of every string, and prompt, transcript and output text
replaced by its length and hash (unless kept).

Every string value of every payload is scrubbed (names, reasons and errors included, so the story still
reads): env-like ``NAME=value`` secrets, bearer tokens, API keys of the common providers, private keys, emails
and home paths. Field names are never rewritten: a rules file's patterns skip a key shaped like one
(``token_delta``: lower-case letters, digits, ``_``; no default secret shape fits one); any other key (an email or
a path keying a map) is data and is scrubbed as a value is.
A value under a secret-looking key (``password``, ``api_key``, ``token``...) is replaced whole. A secret becomes
``[kind:TAG]`` where TAG is a keyed hash of it, keyed per bundle: the same secret reads the same everywhere in
one bundle (ids stay consistent) and cannot be looked up across bundles. Event ids, stream names and
timestamps are kept, so causes and links still resolve.

Rules (``--redact RULES.toml``) add patterns (RE2: linear time) and may change what counts as text::

    keep_text = false                  # true: like --keep-text
    text_keys = ["objective", "text"]  # replaces the default list of text fields
    extra_text_keys = ["title"]        # added to it
    [[pattern]]
    name = "ticket"
    regex = "TICKET-[0-9]+"
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
import tomllib
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..errors import UsageError

if TYPE_CHECKING:
    from ..patterns import UserPattern

TEXT_KEYS: Final = frozenset(
    {
        "objective",
        "text",
        "summary",
        "evidence",
        "next",
        "details",
        "failure_summary",
        "stdout",
        "stderr",
        "output",
        "tail",
        "prompt",
        "transcript",
        "last_rejection_details",
        "message",
        "detail",
        "needed",
    }
)
"""Fields holding prompt, transcript, worker or output text: replaced by length and hash by default."""

_SECRET_KEY: Final = re.compile(
    r"(?i)(^|[_-])(api[_-]?key|apikey|secret|password|passwd|passphrase|token|auth|authorization|"
    r"credentials?|cookie|private[_-]?key)s?($|[_-])"
)
_NOT_SECRET_KEY: Final = re.compile(r"(?i)(_ids?|_at|_count|_used|_delta|_budget|_keys)$")
"""Keys that look secret but name bookkeeping (``tokens_used``, ``token_budget``, ``env_keys``)."""

_ENV_NAME: Final = (
    r"(?:[A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|PWD|CREDENTIALS?|AUTH)[A-Z0-9_]*"
    r"|(?i:api[_-]?key|password|passwd|secret|access[_-]?token|auth[_-]?token|client[_-]?secret))"
)
"""An environment-style secret's name: upper case as variables are (``monkey: 3`` is not one), or one of the
usual lower-case words."""
_DEFAULT_PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    (
        "private-key",
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"),
    ),
    ("bearer", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}")),
    ("basic-auth", re.compile(r"(?i)\bbasic\s+[A-Za-z0-9+/=]{8,}")),
    ("url-credentials", re.compile(r"(?i)(?<=://)[^\s/:@]+:[^\s/@]+(?=@)")),
    ("env-secret", re.compile(rf"\b{_ENV_NAME}\s*[=:]\s*(?!\d{{1,12}}\b)(?:\"[^\"]*\"|'[^']*'|[^\s\"',;]+)")),
    (
        "api-key",
        re.compile(
            r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
            r"|glpat-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30,}"
            r"|hf_[A-Za-z0-9]{20,}|npm_[A-Za-z0-9]{30,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+)"
        ),
    ),
    ("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")),
)
_FIELD_NAME: Final = re.compile(r"[a-z_][a-z0-9_]*")
"""A key shaped like a payload field name: no rules-file pattern rewrites it (``token`` must not turn
``token_delta`` into another field)."""
_HOME: Final = re.compile(r"(?:/home/|/Users/|[A-Za-z]:\\\\?Users\\\\?)[^/\\\s\"']+|/root(?=/|\b)")


class RedactionReport(msgspec.Struct, kw_only=True):
    """What was redacted, by kind, so a reader knows what the bundle does not say (never the values)."""

    mode: str
    keep_text: bool
    text_fields: int = 0
    """Text values replaced by their length and hash."""
    secrets: dict[str, int] = msgspec.field(default_factory=dict)
    """Secrets removed, by kind (``email``, ``api-key``, ``home-path``, ``secret-field``...)."""
    text_keys: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    note: str = (
        "secrets read [kind:TAG] (TAG: a hash keyed for this bundle only; the same value reads the same), "
        "text reads [text: N chars, sha256 H] (H: of the text after its secrets were removed)"
    )


class Redactor:
    """Scrubs payloads for one bundle (one key, one report)."""

    def __init__(
        self,
        *,
        mode: str = "default",
        keep_text: bool = False,
        text_keys: frozenset[str] = TEXT_KEYS,
        extra: tuple[tuple[str, UserPattern], ...] = (),
    ) -> None:
        self.off = mode == "none"
        self.keep_text = keep_text
        self.text_keys = text_keys
        self.extra = extra
        self._key = secrets.token_bytes(32)
        self._counts: Counter[str] = Counter()
        self._text_fields = 0
        self._mode = mode

    def report(self) -> RedactionReport:
        return RedactionReport(
            mode=self._mode,
            keep_text=self.keep_text or self.off,
            text_fields=self._text_fields,
            secrets=dict(sorted(self._counts.items())),
            text_keys=() if self.off or self.keep_text else tuple(sorted(self.text_keys)),
            patterns=()
            if self.off
            else tuple(name for name, _ in _DEFAULT_PATTERNS)
            + ("home-path",)
            + tuple(name for name, _ in self.extra),
        )

    def payload(self, data: dict[str, Any]) -> dict[str, Any]:
        """A payload with every string scrubbed (a new dict; ``data`` is not changed)."""
        if self.off:
            return data
        out: dict[str, Any] = self._walk(data, None)
        return out

    def _walk(self, value: Any, key: str | None) -> Any:
        if isinstance(value, str):
            return self._string(value, key)
        if isinstance(value, dict):
            return {  # a field name is kept; a map keyed by an email or a path must not keep it
                self._key_of(k): self._walk(v, k if isinstance(k, str) else key) for k, v in value.items()
            }
        if isinstance(value, list):
            return [self._walk(v, key) for v in value]
        return value

    def _key_of(self, key: Any) -> Any:
        if not isinstance(key, str):
            return key
        return self.scrub(key, user=_FIELD_NAME.fullmatch(key) is None)

    def _string(self, value: str, key: str | None) -> str:
        if key is not None and _SECRET_KEY.search(key) and not _NOT_SECRET_KEY.search(key) and value:
            return self._secret("secret-field", value)
        scrubbed = self.scrub(value)
        if key in self.text_keys and not self.keep_text and scrubbed:
            self._text_fields += 1
            digest = hashlib.sha256(scrubbed.encode()).hexdigest()[:16]
            return f"[text: {len(value)} chars, sha256 {digest}]"
        return scrubbed

    def scrub(self, text: str, *, user: bool = True) -> str:
        """``text`` with every secret, email and home path replaced (and, with ``user``, what the rules file's
        patterns match)."""
        for kind, pattern in _DEFAULT_PATTERNS:
            text = pattern.sub(functools.partial(self._match, kind), text)
        text = _HOME.sub(self._home, text)
        for name, rule in self.extra if user else ():
            text = self._user(name, rule, text)
        return text

    def _match(self, kind: str, match: re.Match[str]) -> str:
        found = match.group(0)
        if kind == "env-secret":  # the name stays: the story may say which variable was set
            name = re.split(r"\s*[=:]", found, maxsplit=1)[0]
            return f"{name}={self._secret(kind, found)}"
        return self._secret(kind, found)

    def _home(self, match: re.Match[str]) -> str:
        self._counts["home-path"] += 1
        return "~"

    def _secret(self, kind: str, value: str) -> str:
        self._counts[kind] += 1
        tag = hmac.new(self._key, value.encode(), hashlib.sha256).hexdigest()[:10]
        return f"[{kind}:{tag}]"

    def _user(self, name: str, pattern: UserPattern, text: str) -> str:
        out, rest = [], text
        while rest:
            m = pattern.search(rest)
            if m is None or m.end() == m.start():
                break
            out.append(rest[: m.start()] + self._secret(name, m.group(0)))
            rest = rest[m.end() :]
        return "".join(out) + rest


def redactor_for(spec: str, *, keep_text: bool = False) -> Redactor:
    """``--redact default|none|RULES.toml`` (and ``--keep-text``) as a :class:`Redactor`.

    :raises UsageError: for a rules file that cannot be read or holds an invalid rule.
    """
    if spec in ("default", "none"):
        return Redactor(mode=spec, keep_text=keep_text)
    from ..patterns import PatternError, compile_user_pattern

    path = Path(spec)
    try:
        rules = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"cannot read the redaction rules {spec}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{spec} is not valid TOML: {e}") from None
    unknown = sorted(set(rules) - {"keep_text", "text_keys", "extra_text_keys", "pattern"})
    if unknown:
        raise UsageError(
            f"{spec}: unknown key(s) {', '.join(unknown)} (keep_text, text_keys, extra_text_keys, pattern)"
        )
    try:
        keys = frozenset(_strings(rules.get("text_keys", sorted(TEXT_KEYS)), spec, "text_keys"))
        keys |= frozenset(_strings(rules.get("extra_text_keys", []), spec, "extra_text_keys"))
        extra = []
        patterns = rules.get("pattern", [])
        if not isinstance(patterns, list):
            raise UsageError(f'{spec}: write each pattern as a [[pattern]] table with regex = "..."')
        for i, rule in enumerate(patterns, 1):
            if not isinstance(rule, dict) or not isinstance(rule.get("regex"), str):
                raise UsageError(f'{spec}: [[pattern]] number {i} needs regex = "..."')
            odd = sorted(set(rule) - {"name", "regex"})
            if odd:
                raise UsageError(
                    f"{spec}: [[pattern]] number {i}: unknown key(s) {', '.join(odd)} (name, regex)"
                )
            name = rule.get("name", f"pattern-{i}")
            if not isinstance(name, str) or not name.strip():
                raise UsageError(
                    f'{spec}: [[pattern]] number {i}: name must be a non-empty string, e.g. name = "ticket"'
                )
            extra.append((name, compile_user_pattern(rule["regex"])))
    except PatternError as e:
        raise UsageError(f"{spec}: {e}") from None
    keep_rule = rules.get("keep_text", False)
    if not isinstance(keep_rule, bool):  # bool("false") is True: a quoted false kept every text
        raise UsageError(f"{spec}: keep_text must be true or false (unquoted), got {keep_rule!r}")
    keep = keep_rule or keep_text
    return Redactor(mode=str(path), keep_text=keep, text_keys=keys, extra=tuple(extra))


def _strings(value: Any, spec: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{spec}: {key} must be a list of strings")
    return value
