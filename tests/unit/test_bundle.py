"""``loopd-es bundle`` and ``--store bundle:FILE``: planted secrets of every kind survive in no byte of the
bundle, ids and links stay so the story reads, the bundle serves the read half of the log contract and
refuses writes (exit 2), and history, explain and dash work on it. Real SQLite logs: a planted one, the
demo's, and an imported loopd project.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from loopd_es.cli.main import main
from loopd_es.clock import parse_rfc3339
from loopd_es.events import command as cm
from loopd_es.events import goal as g
from loopd_es.events import notification as nt
from loopd_es.events.catalogue import new_event
from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store
from loopd_es.log.bundle import BundleLog
from loopd_es.log.memory import MemoryLog
from loopd_es.postmortem.redact import Redactor
from tests.waits import await_until

GOAL = "0b0e5c2a-1111-4222-8333-444455556666"
OTHER = "7a1e0b0e-9999-4222-8333-444455556666"
DAY = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects" / "busy_day"

SECRETS = {
    "email": "alice.liddell@wonderland.example.org",
    "openai": "sk-proj-AbCdEf0123456789GhIjKlMnOpQr",
    "anthropic": "sk-ant-api03-ZyXwVu9876543210TsRqPo",
    "github": "ghp_0123456789abcdefghijABCDEFGHIJ012345",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "google": "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    "slack": "xoxb-123456789012-abcdefghijkl",
    "bearer": "eyBearerTokenValue0123456789",
    "env": "hunter2-Pa55w0rd-value",
    "url_password": "s3cr3t-url-pass",
    "field": "field-secret-value-42",
    "home_user": "alice",
    "private_key": "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "ticket": "TICKET-48151623",
}
TEXT = "Rewrite the billing module so invoices round half to even"


def planted(url: str) -> None:
    """A goal whose events carry every kind of secret, a command and notifications of it, and another goal."""
    s = SECRETS
    own = [
        g.GoalCreated(
            goal_id=GOAL,
            name=f"billing for {s['email']}",
            objective=f"{TEXT}; use OPENAI_API_KEY={s['openai']} and mail {s['email']}",
            owner_session_id="ses_owner",
            config=g.GoalConfig(model="openai/gpt-5", check_cwd=f"/home/{s['home_user']}/src/billing"),
        ),
        g.GoalWorkerAssigned(goal_id=GOAL, worker_session_id="ses_worker"),
        g.GoalProgressReported(
            goal_id=GOAL,
            summary=f"called the API with Authorization: Bearer {s['bearer']} and key {s['anthropic']}",
            next=f"-----BEGIN PRIVATE KEY-----\n{s['private_key']}\n-----END PRIVATE KEY-----",
            evidence=f"token {s['jwt']} for {s['ticket']}",
        ),
        g.GoalBlocked(
            goal_id=GOAL,
            reason=f"push failed: https://bob:{s['url_password']}@git.example.com/x.git as {s['email']}",
            needed=f"set DB_PASSWORD={s['env']} in /home/{s['home_user']}/.env",
            last_error=f"push failed: https://bob:{s['url_password']}@git.example.com/x.git as {s['email']}",
        ),
    ]
    command = "c0ffee00-1111-4222-8333-444455556666"
    commands = [
        cm.CommandStarted(
            command_id=command,
            title=f"deploy ({s['google']})",
            command="curl",
            args=["-H", f"X-Api-Key: {s['slack']}", f"https://api.example.com?key={s['aws']}"],
            cwd=f"/home/{s['home_user']}/src/billing",
            env_keys=["GITHUB_TOKEN"],
            goal_id=GOAL,
            started_at=parse_rfc3339("2026-12-01T10:00:00Z"),
        ),
    ]
    notes = [
        nt.NotificationRequested(
            notification_id="n1",
            goal_id=GOAL,
            owner_session_id="ses_owner",
            kind="stopped",
            text=f"blocked; GITHUB_TOKEN={s['github']}",
            cause_event_id="x",
        ),
        nt.NotificationRequested(
            notification_id="n2",
            goal_id=OTHER,
            owner_session_id="ses_owner",
            kind="stopped",
            text="another goal's notice: not in this bundle",
            cause_event_id="y",
        ),
    ]

    async def write() -> None:
        async with await open_store(url) as store:
            first = await store.append(f"goal-{GOAL}", [new_event(own[0])])
            link = {"correlation_id": "flow-1", "causation_id": first[0].event_id}
            await store.append(f"goal-{GOAL}", [new_event(e, **link) for e in own[1:]])
            await store.append(f"command-{command}", [new_event(e, **link) for e in commands])
            extra = NewEvent(  # a payload with a secret-looking field beside its catalogued ones
                type="notification.requested",
                data={
                    **json.loads(json.dumps(_builtins(notes[0]))),
                    "api_key": s["field"],
                    "seen_by": {s["email"]: "yes", s["ticket"]: "yes"},  # secrets as keys
                },
                correlation_id="flow-1",
                causation_id=first[0].event_id,
            )
            await store.append("notifications", [extra, new_event(notes[1])])
            await store.append(
                f"goal-{OTHER}",
                [new_event(g.GoalCreated(goal_id=OTHER, name="other", objective="x", owner_session_id="o"))],
            )

    anyio.run(write)


def _builtins(event: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(event)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(*args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def log(tmp_path: Path) -> str:
    url = f"sqlite:{tmp_path / 'log.db'}"
    planted(url)
    return url


def leaks(raw: bytes, *, ignore: tuple[str, ...] = ()) -> list[str]:
    """Every planted secret found in ``raw``: as written, JSON-escaped, HTML-escaped or lower-cased."""
    found = []
    low = raw.lower()
    for name, secret in SECRETS.items():
        if name in ignore:
            continue
        forms = {secret, json.dumps(secret)[1:-1], secret.replace("/", "\\/")}
        if name == "home_user":
            forms = {f"/home/{secret}"}
        if any(f.encode() in raw or f.lower().encode() in low for f in forms):
            found.append(name)
    return found


def test_no_planted_secret_survives_in_any_byte_and_the_story_still_reads(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[pattern]]\nname = "ticket"\nregex = "TICKET-[0-9]+"\n')
    out_file = tmp_path / "goal.bundle"
    code, out, err = run(
        capsys, "--store", log, "bundle", GOAL[:8], "-o", str(out_file), "--redact", str(rules), "--json"
    )
    assert code == 0, err
    raw = out_file.read_bytes()
    assert leaks(raw) == []
    assert TEXT.encode() not in raw and b"another goal's notice" not in raw
    summary = json.loads(out)
    assert summary["events"] == 6 and set(summary["redaction"]["secrets"]) >= {
        "email",
        "api-key",
        "bearer",
        "env-secret",
        "home-path",
        "private-key",
        "url-credentials",
        "secret-field",
        "ticket",
    }

    # ids and links kept: the same email reads the same everywhere; event ids are the log's
    text = raw.decode()
    tags = set(re.findall(r"\[email:[0-9a-f]{10}\]", text))
    assert len(tags) == 1
    bundle = f"bundle:{out_file}"
    code, out, err = run(capsys, "--store", bundle, "history", GOAL[:8], "--json")
    assert code == 0, err
    history = json.loads(out)
    assert [e["type"] for e in history["events"]][:2] == ["goal.created", "goal.worker_assigned"]
    assert (
        history["status"] == "blocked"
        and history["events"][1]["causation_id"] == history["events"][0]["event_id"]
    )
    assert history["state"]["objective"].startswith(f"[text: {len(SECRETS['openai']) + 0}") is False
    assert re.fullmatch(r"\[text: \d+ chars, sha256 [0-9a-f]{16}\]", history["state"]["objective"])
    code, out, err = run(capsys, "--store", bundle, "explain", GOAL)
    assert code == 0 and "blocked" in out, err


def test_keep_text_keeps_the_words_but_not_the_secrets(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "goal.bundle"
    assert run(capsys, "--store", log, "bundle", GOAL, "-o", str(out_file), "--keep-text")[0] == 0
    raw = out_file.read_bytes()
    assert TEXT.encode() in raw
    assert leaks(raw, ignore=("ticket",)) == []  # the ticket is only a rule of the rules file


def test_redact_none_keeps_the_payloads_byte_for_byte(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "goal.bundle"
    assert run(capsys, "--store", log, "bundle", GOAL, "-o", str(out_file), "--redact", "none")[0] == 0

    async def payloads(url: str) -> list[bytes]:
        async with await open_store(url, create=False) as store:
            return [
                bytes(e.data)
                async for e in store.read_all()
                if e.stream != f"goal-{OTHER}" and b"another" not in bytes(e.data)
            ]

    assert anyio.run(payloads, f"bundle:{out_file}") == anyio.run(payloads, log)


def test_a_bundle_serves_the_read_half_of_the_log_contract_and_refuses_writes(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "goal.bundle"
    assert run(capsys, "--store", log, "bundle", GOAL, "-o", str(out_file))[0] == 0

    async def check() -> None:
        async with await open_store(f"bundle:{out_file}", create=False) as bundle:
            assert isinstance(bundle, BundleLog) and bundle.read_only
            everything = [e async for e in bundle.read_all()]
            assert [e.position for e in everything] == list(range(1, len(everything) + 1))
            MemoryLog.forget("bundle-twin")
            async with await MemoryLog.open("bundle-twin") as twin:

                async def source() -> Any:
                    yield everything

                await twin.import_envelopes(source())
                assert await bundle.head() == await twin.head() == 6
                assert await bundle.streams() == await twin.streams()
                for stream in await twin.streams():
                    assert await bundle.stream_version(stream) == await twin.stream_version(stream)
                    assert [e async for e in bundle.read_stream(stream, 2)] == [
                        e async for e in twin.read_stream(stream, 2)
                    ]
                assert [e async for e in bundle.read_all(3, 2)] == [e async for e in twin.read_all(3, 2)]
                assert [b async for b in bundle.read_backwards(limit=4)] == [
                    b async for b in twin.read_backwards(limit=4)
                ]
                kinds = ["goal.blocked"]
                assert [e async for e in bundle.read_all(types=kinds)] == [
                    e async for e in twin.read_all(types=kinds)
                ]
            MemoryLog.forget("bundle-twin")
            assert await bundle.wait_for(6, timeout=0) and not await bundle.wait_for(7, timeout=0)
            assert (await bundle.verify()).ok
            assert await bundle.coord_read() == []

    anyio.run(check)
    bundle = f"bundle:{out_file}"
    for args in (
        (
            "append",
            "--stream",
            f"goal-{GOAL}",
            "--type",
            "goal.cleared",
            "--data",
            json.dumps({"goal_id": GOAL}),
        ),
        ("import", "--from", f"sqlite:{tmp_path / 'log.db'}"),
        ("goal", "clear", GOAL, "--host", f"sim:{tmp_path / 'h.json'}"),
    ):
        code, out, err = run(capsys, "--store", bundle, *args)
        assert code == 2, (args, err)
        assert "read-only bundle" in err and len(err.strip().splitlines()) == 1
    assert out_file.read_bytes().count(b"\n") == 7  # header + six events: unchanged
    copy = f"sqlite:{tmp_path / 'copy.db'}"
    assert run(capsys, "--store", bundle, "export", "--to", copy)[0] == 0  # the way to a writable log


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("not = [toml", "not valid TOML"),
        ('[[pattern]]\nregex = "(a)\\\\1"\n', "backreference"),
        ("colour = 1\n", "unknown key"),
        ('keep_text = "false"\n', "keep_text must be true or false"),  # bool("false") kept every text
        ('[[pattern]]\nname = 3\nregex = "x"\n', "name must be a non-empty string"),
        ('[[pattern]]\nregexp = "x"\nregex = "y"\n', "unknown key(s) regexp"),
        ('[pattern]\nregex = "x"\n', "[[pattern]] table"),
    ],
)
def test_bad_rules_and_bad_bundles_get_one_line(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, words: str
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(content)
    code, _, err = run(
        capsys, "--store", log, "bundle", GOAL, "-o", str(tmp_path / "b"), "--redact", str(rules)
    )
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_a_file_that_is_not_a_bundle_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.bundle"
    junk.write_text("hello\n")
    code, _, err = run(capsys, "--store", f"bundle:{junk}", "streams")
    assert code == 4 and "not a loopd-es bundle" in err
    code, _, err = run(capsys, "--store", f"bundle:{tmp_path / 'missing'}", "streams")
    assert code == 2 and "no log at" in err


def test_bundles_of_the_demo_and_of_an_imported_project_tell_the_same_story(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = tmp_path / "demo"
    assert main("demo", "--dir", str(demo)) == 0
    day = f"sqlite:{tmp_path / 'day.db'}"
    assert main("--store", day, "import-loopd", str(DAY)) == 0
    for url, goal in ((f"sqlite:{demo / 'events.db'}", None), (day, "5e1f0a3c-7b2d-4c8e-9f10-0000000000a1")):
        if goal is None:
            code, out, _ = run(capsys, "--store", url, "goals", "--json")
            goal = json.loads(out)["goals"][0]["goal_id"]
        out_file = tmp_path / f"{goal}.bundle"
        assert run(capsys, "--store", url, "bundle", goal, "-o", str(out_file))[0] == 0
        original = json.loads(run(capsys, "--store", url, "history", goal, "--json")[1])
        bundled = json.loads(run(capsys, "--store", f"bundle:{out_file}", "history", goal, "--json")[1])
        own = [
            (e["type"], e["event_id"], e["occurred_at"])
            for e in original["events"]
            if e["stream"] == f"goal-{goal}"
        ]
        assert own == [
            (e["type"], e["event_id"], e["occurred_at"])
            for e in bundled["events"]
            if e["stream"] == f"goal-{goal}"
        ]
        assert bundled["status"] == original["status"]
        for key in ("tokens_used", "run_count", "budget_turn_count", "status", "phase"):
            assert bundled["state"][key] == original["state"][key], key
        header = json.loads(out_file.read_bytes().split(b"\n", 1)[0])
        assert header["goal_id"] == goal and "<!doctype html>" in header["timeline_html"]
        assert header["redaction"]["mode"] == "default"


@pytest.mark.anyio
async def test_the_dashboard_shows_a_bundled_goal(log: str, tmp_path: Path) -> None:
    from loopd_es.dash.app import Dashboard, main_config

    out_file = tmp_path / "goal.bundle"
    assert (
        await anyio.to_thread.run_sync(lambda: main("--store", log, "bundle", GOAL, "-o", str(out_file))) == 0
    )
    app = Dashboard(main_config(f"bundle:{out_file}", tmp_path / "scratch" / "read.db"))
    (tmp_path / "scratch").mkdir()
    async with app.run_test(size=(100, 30)):
        await await_until("the dashboard to load the bundled goal", lambda: app.snap.goals)
    assert app.snap.goals[0]["goal_id"] == GOAL and app.snap.goals[0]["status"] == "blocked"


_SECRET_KINDS = st.sampled_from(sorted(set(SECRETS) - {"home_user", "ticket", "field", "private_key"}))


@given(before=st.text(max_size=20), after=st.text(max_size=20), kind=_SECRET_KINDS)
@example(before="x", after="", kind="email")
@example(before="Authorization: ", after=".", kind="bearer")
def test_scrub_removes_a_secret_wherever_it_sits_in_a_string(before: str, after: str, kind: str) -> None:
    secret = SECRETS[kind]
    planted_text = {
        "bearer": f"Bearer {secret}",
        "env": f"PGPASSWORD={secret}",
        "url_password": f"https://u:{secret}@h.example",
    }.get(kind, secret)
    out = Redactor().scrub(f"{before} {planted_text} {after}")
    assert secret not in out


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens: 5",
        "monkey: banana",
        "tokens 4500 >= 4000",
        "Reached max turns (2)",
        "PORT=8080",
        "goal-42 at #7",
    ],
)
def test_scrub_leaves_ordinary_words_alone(text: str) -> None:
    assert Redactor().scrub(text) == text


def _usage(url: str) -> None:
    async def write() -> None:
        async with await open_store(url) as store:
            usage = g.GoalUsageAccounted(goal_id=GOAL, message_ids=("m1",), token_delta=4500, cost_delta=0.06)
            await store.append(f"goal-{GOAL}", [new_event(usage)])

    anyio.run(write)


@pytest.mark.parametrize("regex", ["token", "model", "_", "[a-z]+"])
def test_a_rules_pattern_rewrites_values_never_field_names(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], regex: str
) -> None:
    """``regex = "token"`` once turned ``token_delta`` into ``[tok:...]_delta``: the bundle said 0 tokens."""
    _usage(log)
    rules = tmp_path / "rules.toml"
    rules.write_text(f'[[pattern]]\nname = "tok"\nregex = "{regex}"\n')
    out_file = tmp_path / "goal.bundle"
    code, _, err = run(capsys, "--store", log, "bundle", GOAL, "-o", str(out_file), "--redact", str(rules))
    if regex == "[a-z]+":  # it rewrites statuses and kinds: refused, not a bundle that answers otherwise
        assert code == 2 and "unreadable" in err and len(err.strip().splitlines()) == 1, err
        assert not out_file.exists()
        return
    assert code == 0, err
    original = json.loads(run(capsys, "--store", log, "history", GOAL, "--json")[1])
    bundled = json.loads(run(capsys, "--store", f"bundle:{out_file}", "history", GOAL, "--json")[1])
    for key in ("tokens_used", "cost_used", "status", "phase", "run_count"):
        assert bundled["state"][key] == original["state"][key], key
    assert bundled["state"]["tokens_used"] == 4500
    assert set(bundled["state"]) == set(original["state"])
    raw = out_file.read_bytes()
    assert b'"token_delta":4500' in raw and b'"model":"openai/gpt-5"' in raw
    assert leaks(raw, ignore=("ticket",)) == [] and SECRETS["email"].encode() not in raw


def test_a_rules_pattern_still_scrubs_a_key_that_is_data(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[pattern]]\nname = "ticket"\nregex = "TICKET-[0-9]+"\n')
    out_file = tmp_path / "goal.bundle"
    assert run(capsys, "--store", log, "bundle", GOAL, "-o", str(out_file), "--redact", str(rules))[0] == 0
    raw = out_file.read_bytes()
    assert leaks(raw) == [] and re.search(rb'"\[ticket:[0-9a-f]{10}\]":"yes"', raw)


def test_an_error_reads_alike_in_every_field_that_holds_it(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``reason`` and ``last_error`` hold the same words: both kept (secrets out), neither hashed."""
    out_file = tmp_path / "goal.bundle"
    assert run(capsys, "--store", log, "bundle", GOAL, "-o", str(out_file))[0] == 0
    lines = [json.loads(line) for line in out_file.read_bytes().splitlines()[1:]]
    (blocked,) = [e["data"] for e in lines if e["type"] == "goal.blocked"]
    assert blocked["last_error"] == blocked["reason"]
    assert blocked["reason"].startswith("push failed: https://") and "[email:" in blocked["reason"]
