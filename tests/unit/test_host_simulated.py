"""The simulated host: scripting, injected failures, busy/idle, identity switching, provider errors, state file."""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from loopd_es.cli import host_cmds
from loopd_es.clock import FakeClock, parse_rfc3339
from loopd_es.domain.provider_limit import classify
from loopd_es.errors import EXIT_STORAGE, EXIT_USAGE
from loopd_es.host import SimulatedHost, WorkerHost, host_url, open_host
from loopd_es.host.base import QUOTA_LIMITATION
from loopd_es.host.errors import (
    HostConfigError,
    HostError,
    HostRejectedError,
    HostStateError,
    HostUnavailableError,
    ProviderError,
    ProviderErrorInfo,
    SessionNotFoundError,
    WorkerBusyError,
)
from loopd_es.host.sim_script import FailureRule, HostScript, parse_script, state_path_for

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)

SCRIPT = """
model_switching = "session"
agent_switching = "session"

[[providers]]
id = "p"
name = "P"

[[models]]
provider = "p"
id = "old"

[[models]]
provider = "p"
id = "new"

[[models]]
provider = "p"
id = "maybe"
usable = "unknown"

[[models]]
provider = "p"
id = "off"
usable = false

[[agents]]
name = "old"

[[agents]]
name = "new"

[[agents]]
name = "helper"
mode = "subagent"

[[sessions]]
id = "ses_1"
model = "p/old"
agent = "old"
"""


def sim(text: str = SCRIPT, *, toml: bool = True) -> SimulatedHost:
    return SimulatedHost(parse_script(text, "test", toml=toml), clock=FakeClock(NOW))


def with_rules(extra: str) -> SimulatedHost:
    return sim(SCRIPT + extra)


# -- scripting and catalogs -------------------------------------------------------------------------------


async def test_missing_script_gives_the_default_catalog(tmp_path: Path) -> None:
    host = await open_host(f"sim:{tmp_path / 'host.json'}")
    assert isinstance(host, WorkerHost)
    models = await host.list_models()
    agents = await host.list_agents()
    assert (models.capability, models.switching) == ("supported", "session")
    assert [p.provider_id for p in models.providers] == ["openai", "anthropic"]
    assert len(models.models) >= 2 and all(m.usable is True for m in models.models)
    assert agents.names() == ("build", "plan")
    assert models.quota.status == "unknown" and models.quota.limitation == QUOTA_LIMITATION
    worker = await host.create_worker(title="w")
    assert (worker.model, worker.agent) == ("openai/gpt-5", "build")
    assert await host.session_status(worker.session_id) == "idle"


async def test_toml_script_sets_catalog_usability_and_capabilities() -> None:
    models = await sim().list_models()
    usable = {m.ref: m.usable for m in models.models}
    assert usable == {"p/old": True, "p/new": True, "p/maybe": "unknown", "p/off": False}
    assert models.usable("p/new") and not models.usable("p/maybe") and not models.usable("p/missing")
    assert models.observed_at == "2026-12-02T12:00:00.000Z"


async def test_json_script_and_providers_derived_from_models() -> None:
    host = sim(
        json.dumps({"models": [{"provider": "x", "id": "m1"}], "agent_capability": "unsupported"}), toml=False
    )
    models, agents = await host.list_models(), await host.list_agents()
    assert [p.provider_id for p in models.providers] == ["x"]
    assert (agents.capability, agents.agents) == ("unsupported", ())


@pytest.mark.parametrize("capability", ["unavailable", "unsupported"])
async def test_a_catalog_that_is_not_supported_is_empty_and_quota_stays_unknown(capability: str) -> None:
    models = await sim(f'model_capability = "{capability}"\n' + SCRIPT).list_models()
    assert (models.capability, models.models, models.providers) == (capability, (), ())
    assert models.quota.status == "unknown"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[[models]]\nprovider = "p"\nid = "m"\nusable = "maybe"\n', "$.models[0].usable"),
        ('colour = "blue"\n', "colour"),
        ('[[providers]]\nid = "a"\n[[models]]\nprovider = "b"\nid = "m"\n', "provider 'b'"),
        ('[[failures]]\nop = "prompt"\n', "exactly one of error or result"),
        ('[[failures]]\nop = "prompt"\nresult = "unsupported"\n', "only applies to switch"),
        ('[[failures]]\nop = "abort"\nerror = "busy"\non_call = 0\n', "on_call must be >= 1"),
        ('[[failures]]\nop = "fly"\nerror = "busy"\n', "$.failures[0].op"),
        ("models = [", "not valid TOML"),
    ],
)
def test_invalid_scripts_are_usage_errors_that_say_where(text: str, expected: str) -> None:
    with pytest.raises(HostConfigError) as info:
        parse_script(text, "host.toml", toml=True)
    assert expected in str(info.value) and "host.toml" in str(info.value)
    assert info.value.exit_code == EXIT_USAGE


@pytest.mark.parametrize("url", ["opencode:x", "http://127.0.0.1:4096", "sim:"])
async def test_unknown_or_empty_host_urls_are_refused(url: str) -> None:
    with pytest.raises(HostConfigError):
        await open_host(url)


def test_host_url_prefers_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPD_ES_HOST", "sim:env.json")
    assert host_url("sim:flag.json") == "sim:flag.json"
    assert host_url(None) == "sim:env.json"
    monkeypatch.delenv("LOOPD_ES_HOST")
    assert host_url(None) == "sim:.loopd/host.json"


# -- sessions, prompts, busy/idle ---------------------------------------------------------------------------


async def test_workers_get_counted_ids_and_prompts_set_the_live_identity() -> None:
    host = sim()
    a = await host.create_worker(title="a", model="p/old", agent="old")
    b = await host.create_worker(title="b")
    assert (a.session_id, b.session_id) == ("ses_sim_0001", "ses_sim_0002")
    receipt = await host.prompt(a.session_id, "go", model="p/new", agent="new")
    assert (receipt.prompt_id, receipt.model, receipt.agent) == ("prm_sim_0001", "p/new", "new")
    identity = await host.session_identity(a.session_id)
    assert (identity.model, identity.agent) == ("p/new", "new")
    assert [p.text for p in (await host.snapshot()).prompts] == ["go"]


async def test_unknown_models_agents_and_sessions_are_refused() -> None:
    host = sim()
    with pytest.raises(HostRejectedError):
        await host.create_worker(title="w", model="p/off")
    with pytest.raises(HostRejectedError):
        await host.prompt("ses_1", "x", agent="ghost")
    with pytest.raises(SessionNotFoundError):
        await host.session_identity("ses_nope")
    assert await host.session_status("ses_nope") == "unknown"


async def test_scripted_status_flips_then_sticks() -> None:
    host = sim(SCRIPT + '\n[[sessions]]\nid = "ses_2"\nstatus = "busy"\nthen = ["retry", "idle"]\n')
    assert [await host.session_status("ses_2") for _ in range(4)] == ["busy", "retry", "idle", "idle"]


async def test_prompt_makes_the_session_busy_for_the_scripted_polls_and_abort_idles_it() -> None:
    host = sim("prompt_busy_polls = 2\n" + SCRIPT)
    await host.prompt("ses_1", "work")
    assert [await host.session_status("ses_1") for _ in range(3)] == ["busy", "busy", "idle"]
    await host.prompt("ses_1", "more")
    await host.abort("ses_1")
    assert await host.session_status("ses_1") == "idle"


# -- identity switching --------------------------------------------------------------------------------------


async def test_session_switching_applies_model_then_agent() -> None:
    host = sim()
    assert await host.switch_model("ses_1", "p/new") == "applied"
    assert await host.switch_agent("ses_1", "new") == "applied"
    identity = await host.session_identity("ses_1")
    assert (identity.model, identity.agent) == ("p/new", "new")
    calls = await host.journal("switch_model", "switch_agent")
    assert [(c.op, c.arg, c.outcome) for c in calls] == [
        ("switch_model", "p/new", "applied"),
        ("switch_agent", "new", "applied"),
    ]


async def test_next_prompt_switching_changes_nothing_until_a_prompt_names_it() -> None:
    host = sim(SCRIPT.replace('"session"', '"next-prompt"'))
    assert await host.switch_model("ses_1", "p/new") == "next-prompt"
    assert await host.switch_agent("ses_1", "new") == "next-prompt"
    assert (await host.session_identity("ses_1")).model == "p/old"
    await host.prompt("ses_1", "go", model="p/new", agent="new")
    identity = await host.session_identity("ses_1")
    assert (identity.model, identity.agent) == ("p/new", "new")


async def test_unsupported_switching_changes_nothing() -> None:
    host = sim(SCRIPT.replace('agent_switching = "session"', 'agent_switching = "unsupported"'))
    assert await host.switch_agent("ses_1", "new") == "unsupported"
    assert (await host.session_identity("ses_1")).agent == "old"


async def test_a_busy_session_refuses_a_switch_and_keeps_its_identity() -> None:
    host = sim()
    await host.set_status("ses_1", "busy", then=["idle"])
    with pytest.raises(WorkerBusyError) as info:
        await host.switch_model("ses_1", "p/new")
    assert info.value.reason == "busy"
    assert (await host.session_identity("ses_1")).model == "p/old"
    assert await host.session_status("ses_1") == "busy"
    assert await host.switch_model("ses_1", "p/new") == "applied"


async def test_switch_targets_must_exist_and_not_be_known_unusable() -> None:
    host = sim()
    for model in ("p/off", "p/missing"):
        with pytest.raises(HostRejectedError):
            await host.switch_model("ses_1", model)
    assert await host.switch_model("ses_1", "p/maybe") == "applied"
    await host.set_model_usable("p/new", False)
    with pytest.raises(HostRejectedError):
        await host.switch_model("ses_1", "p/new")
    assert (await host.list_models()).find("p/new") is not None
    assert not (await host.list_models()).usable("p/new")
    with pytest.raises(HostRejectedError):
        await host.switch_agent("ses_1", "ghost")


# -- injected failures ------------------------------------------------------------------------------------------


async def test_a_failure_on_the_nth_call_fires_only_on_that_call() -> None:
    host = with_rules('\n[[failures]]\nop = "switch_agent"\non_call = 2\nerror = "rejected"\n')
    assert await host.switch_agent("ses_1", "new") == "applied"
    with pytest.raises(HostRejectedError):
        await host.switch_agent("ses_1", "old")
    assert (await host.session_identity("ses_1")).agent == "new"
    assert await host.switch_agent("ses_1", "old") == "applied"
    outcomes = [c.outcome for c in await host.journal("switch_agent")]
    assert outcomes == ["applied", "error:rejected", "applied"]


async def test_a_session_scoped_failure_counts_that_sessions_calls_only() -> None:
    host = with_rules(
        '\n[[failures]]\nop = "switch_model"\nsession = "ses_1"\non_call = 2\nerror = "unavailable"\n'
    )
    other = await host.create_worker(title="other")
    assert await host.switch_model(other.session_id, "p/new") == "applied"
    assert await host.switch_model("ses_1", "p/new") == "applied"
    assert await host.switch_model(other.session_id, "p/old") == "applied"
    with pytest.raises(HostUnavailableError):
        await host.switch_model("ses_1", "p/old")


async def test_failures_can_target_every_operation_and_force_switch_results() -> None:
    host = with_rules(
        '\n[[failures]]\nop = "*"\non_call = 1\nerror = "timeout"\n'
        '\n[[failures]]\nop = "switch_model"\non_call = 2\nresult = "unsupported"\n'
    )
    assert (await host.list_models()).capability == "unavailable"
    assert (await host.list_agents()).capability == "unavailable"
    assert await host.session_status("ses_1") == "unknown"
    for call in (
        lambda: host.compact("ses_1"),
        lambda: host.abort("ses_1"),
        lambda: host.switch_model("ses_1", "p/new"),
    ):
        with pytest.raises(HostUnavailableError) as info:
            await call()
        assert info.value.reason == "timeout"
    assert await host.switch_model("ses_1", "p/new") == "unsupported"
    with pytest.raises(HostUnavailableError):
        await host.session_identity("ses_1")
    assert (await host.session_identity("ses_1")).model == "p/old"
    assert (await host.list_models()).capability == "supported"
    assert [c.outcome for c in await host.journal("list_models")] == ["error:timeout", "supported"]


async def test_runtime_injection_and_clearing() -> None:
    host = sim()
    await host.inject(FailureRule(op="compact", error="session-not-found"))
    with pytest.raises(SessionNotFoundError):
        await host.compact("ses_1", model="p/new")
    await host.clear_failures()
    await host.compact("ses_1", model="p/new")
    assert [(c.arg, c.outcome) for c in await host.journal("compact")] == [
        ("p/new", "error:session-not-found"),
        ("p/new", "ok"),
    ]
    with pytest.raises(HostConfigError):
        await host.inject(FailureRule(op="compact"))


async def test_host_errors_keep_the_raw_detail_out_of_their_message() -> None:
    host = with_rules(
        '\n[[failures]]\nop = "switch_agent"\nerror = "rejected"\ndetail = "sk-SECRET leaked"\n'
    )
    with pytest.raises(HostError) as info:
        await host.switch_agent("ses_1", "new")
    error = info.value
    assert "SECRET" not in str(error) and "SECRET" not in repr(error)
    assert error.detail == "sk-SECRET leaked" and error.reason == "rejected"
    assert error.exit_code == EXIT_STORAGE and "switch_agent" in str(error) and "ses_1" in str(error)


# -- provider errors ---------------------------------------------------------------------------------------------

RATE_LIMIT = """
[[provider_errors]]
on_call = 1
status_code = 429
name = "APIError"
message = "secret diagnostic"
headers = { "Retry-After" = "60", authorization = "Bearer SECRET" }
"""


async def test_a_429_with_retry_after_is_raised_on_the_scripted_prompt_only() -> None:
    host = with_rules(RATE_LIMIT)
    with pytest.raises(ProviderError) as info:
        await host.prompt("ses_1", "go", model="p/new")
    error = info.value
    assert error.reason == "provider-error" and error.info.status_code == 429
    assert "SECRET" not in str(error) and "diagnostic" not in str(error)
    observation = classify(error.info.as_reported(), "prompt-delivery", NOW, "p/old")
    assert observation is not None and observation.kind == "rate-limit" and observation.status_code == 429
    assert observation.retry_at == parse_rfc3339("2026-12-02T12:01:00.000Z")
    assert (await host.session_identity("ses_1")).model == "p/old"
    assert (await host.snapshot()).prompts == []
    await host.prompt("ses_1", "go again")


async def test_quota_errors_classify_as_quota_and_http_dates_parse() -> None:
    host = with_rules(
        '\n[[provider_errors]]\ncode = "insufficient_quota"\nmessage = "You exceeded your current quota"\n'
        'retry_after = "Wed, 07 Oct 2026 12:00:00 GMT"\n'
    )
    for _ in range(2):
        with pytest.raises(ProviderError) as info:
            await host.prompt("ses_1", "go")
        observation = classify(info.value.info.as_reported(), "prompt-delivery", NOW)
        assert observation is not None and observation.kind == "quota"
        assert observation.retry_at == parse_rfc3339("2026-10-07T12:00:00.000Z")


def test_provider_error_info_reports_only_what_was_given() -> None:
    info = ProviderErrorInfo(status_code=503, message="overloaded", headers={"X-Trace": "t"})
    assert info.as_reported() == {
        "statusCode": 503,
        "message": "overloaded",
        "responseHeaders": {"x-trace": "t"},
    }
    assert info.summary() == "provider error (status 503)"
    overloaded = classify(
        info.as_reported(), "prompt-delivery", NOW
    )  # an overloaded provider is a limit (#22)
    assert overloaded is not None and overloaded.kind == "rate-limit"
    assert classify(ProviderErrorInfo(status_code=503).as_reported(), "prompt-delivery", NOW) is None


# -- the state file ----------------------------------------------------------------------------------------------


async def test_two_hosts_on_one_file_share_identity_and_call_counters(tmp_path: Path) -> None:
    script = tmp_path / "host.toml"
    script.write_text(SCRIPT + '\n[[failures]]\nop = "switch_model"\non_call = 2\nerror = "rejected"\n')
    first, second = await open_host(f"sim:{script}"), await open_host(f"sim:{script}")
    assert await first.switch_model("ses_1", "p/new") == "applied"
    assert (await second.session_identity("ses_1")).model == "p/new"
    with pytest.raises(HostRejectedError):
        await second.switch_model("ses_1", "p/old")
    assert await first.switch_model("ses_1", "p/old") == "applied"
    assert state_path_for(script) == tmp_path / "host.state.json"
    assert sorted(os.listdir(tmp_path)) == [
        "host.state.json",
        "host.state.json.lock",
        "host.toml",
    ]


async def test_a_corrupt_state_file_is_reported_not_ignored(tmp_path: Path) -> None:
    (tmp_path / "host.state.json").write_text('{"sessions": 7')
    host = await open_host(f"sim:{tmp_path / 'host.json'}")
    with pytest.raises(HostStateError) as info:
        await host.list_models()
    assert "host.state.json" in str(info.value) and info.value.exit_code == EXIT_STORAGE


async def test_reset_starts_again_from_the_script(tmp_path: Path) -> None:
    script = tmp_path / "host.toml"
    script.write_text(SCRIPT)
    host = SimulatedHost.from_file(script)
    await host.switch_model("ses_1", "p/new")
    await host.reset()
    state = await host.snapshot()
    assert state.sessions["ses_1"].model == "p/old" and state.calls == [] and state.counters == {}


async def test_memory_hosts_write_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    host = SimulatedHost(HostScript())
    await host.create_worker(title="w")
    await host.list_models()
    assert os.listdir(tmp_path) == []


# -- the CLI -----------------------------------------------------------------------------------------------------


def _models_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    host_cmds.register(parser.add_subparsers())
    return parser.parse_args(["models", *argv])


async def test_models_prints_catalog_agents_and_unknown_quota(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "host.toml"
    script.write_text(SCRIPT)
    args = _models_args("--host", f"sim:{script}")
    assert await args.handler(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("Models: 4 across 1 provider(s) [supported/session]. Quota: unknown — Host catalog")
    assert "p/maybe" in out and "unknown" in out
    assert "Agents [supported/session]: old (primary), new (primary), helper (subagent)" in out


async def test_models_json_is_one_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "host.json"
    script.write_text(json.dumps({"model_capability": "unavailable", "agents": []}))
    args = _models_args("--host", f"sim:{script}", "--json")
    assert await args.handler(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["capability"] == "unavailable" and doc["models"] == []
    assert doc["quota"]["status"] == "unknown" and doc["agents"] == [] and doc["assigned_goals"] == []
    assert doc["agent_catalog"]["capability"] == "supported"


def test_retry_after_cap_is_applied_by_the_classifier() -> None:
    info = ProviderErrorInfo(status_code=429, retry_after=10**9)
    observation = classify(info.as_reported(), "session-error", NOW)
    assert observation is not None and observation.retry_at is not None
    capped = observation.retry_at
    assert capped - NOW == timedelta(seconds=31_536_000)
