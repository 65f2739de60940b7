"""``/loop ARGS`` against opencode-plugin-loop 0.8.1, input by input: the message, the stored task, its first due time.

Every expected value below was produced by running the reference's own parser and scheduler (``scheduler.ts``,
``cron-parser.ts``, ``jitter.ts`` of 0.8.1, unmodified, under Node with its clock pinned to ``T0``, its random
source pinned to ``U`` and its id generator returning the id loopd-es derives from the message id) on the same
inputs. A row marked ``departure`` is where loopd-es fixes a reference bug on purpose; the README's /loop
section lists each one. Each row runs through :func:`loopd_es.sched.service.handle` on a real SQLite log.
:data:`MODEL_PROMPTS` and :data:`FIRE_TEXTS` are what the model gets, from the same run.

Row: ``(input, message, task)``; ``{id}`` in the message is the task id. ``task`` is ``None`` (nothing stored),
``F(prompt, interval_ms, jitter, once, due)``, ``A(prompt, due)`` (adaptive, bounds 60 s-1 h) or
``MAINTENANCE``; ``due`` is the first due time minus ``T0`` (a due time past year 9999 is held at its last
millisecond, :func:`loopd_es.clock.from_ms_held`).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from loopd_es.clock import from_ms, from_ms_held
from loopd_es.domain.loop import texts
from loopd_es.domain.loop.decide import Config, task_id_for
from loopd_es.log import open_store
from loopd_es.sched import service

pytestmark = pytest.mark.anyio

T0 = 1_800_000_000_000
U = 0.25
SESSION = "ses_table0123"
HELP = texts.HELP


class F(NamedTuple):
    prompt: str
    interval_ms: int
    jitter: bool
    once: bool
    due: int


class A(NamedTuple):
    prompt: str
    due: int


class _Maintenance(NamedTuple):
    due: int = 3_600_000


MAINTENANCE = _Maintenance()

# fmt: off
TABLE: list[tuple[str, str, F | A | _Maintenance | None]] = [
    ('1s do it', '🔁 Loop started: every 1s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 1000, True, False, 587)),
    ('1m do it', '🔁 Loop started: every 1m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 60000, True, False, 58655)),
    ('1h do it', '🔁 Loop started: every 1h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 3600000, True, False, 3426854)),
    ('1d do it', '🔁 Loop started: every 1d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 86400000, True, False, 88174123)),
    ('1S do it', '🔁 Loop started: every 1s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 1000, True, False, 1258)),
    ('1M do it', '🔁 Loop started: every 1m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 60000, True, False, 62009)),
    ('1H do it', '🔁 Loop started: every 1h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 3600000, True, False, 3838208)),
    ('1D do it', '🔁 Loop started: every 1d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 86400000, True, False, 85378568)),
    ('30s do it', '🔁 Loop started: every 30s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 30000, True, False, 24172)),
    ('30m do it', '🔁 Loop started: every 30m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 1800000, True, False, 1770778)),
    ('30h do it', '🔁 Loop started: every 1d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 108000000, True, False, 107140810)),
    ('30d do it', '🔁 Loop started: every 30d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 2592000000, True, False, 2593181696)),
    ('30S do it', '🔁 Loop started: every 30s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 30000, True, False, 32935)),
    ('30M do it', '🔁 Loop started: every 30m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 1800000, True, False, 1740010)),
    ('30H do it', '🔁 Loop started: every 1d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 108000000, True, False, 108088931)),
    ('30D do it', '🔁 Loop started: every 30d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 2592000000, True, False, 2591987616)),
    ('90s do it', '🔁 Loop started: every 2m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 90000, True, False, 103792)),
    ('90m do it', '🔁 Loop started: every 2h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 5400000, True, False, 5623560)),
    ('90h do it', '🔁 Loop started: every 4d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 324000000, True, False, 322463808)),
    ('90d do it', '🔁 Loop started: every 90d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 7776000000, True, False, 7774840444)),
    ('90S do it', '🔁 Loop started: every 2m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 90000, True, False, 96211)),
    ('90M do it', '🔁 Loop started: every 2h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 5400000, True, False, 5306796)),
    ('90H do it', '🔁 Loop started: every 4d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 324000000, True, False, 322901935)),
    ('90D do it', '🔁 Loop started: every 90d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 7776000000, True, False, 7776523170)),
    ('0.5s do it', '❌ Invalid interval "0.5s". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('0.5m do it', '🔁 Loop started: every 30s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 30000, True, False, 21580)),
    ('0.5h do it', '🔁 Loop started: every 30m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 1800000, True, False, 1789968)),
    ('0.5d do it', '🔁 Loop started: every 12h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 43200000, True, False, 44019382)),
    ('0.5S do it', '❌ Invalid interval "0.5S". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('0.5M do it', '🔁 Loop started: every 30s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 30000, True, False, 22306)),
    ('0.5H do it', '🔁 Loop started: every 30m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 1800000, True, False, 1839122)),
    ('0.5D do it', '🔁 Loop started: every 12h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 43200000, True, False, 41914282)),
    ('1.5s do it', '🔁 Loop started: every 2s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 1500, True, False, 1638)),
    ('1.5m do it', '🔁 Loop started: every 2m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 90000, True, False, 90653)),
    ('1.5h do it', '🔁 Loop started: every 2h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 5400000, True, False, 5375052)),
    ('1.5d do it', '🔁 Loop started: every 2d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 129600000, True, False, 129217640)),
    ('1.5S do it', '🔁 Loop started: every 2s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 1500, True, False, 1285)),
    ('1.5M do it', '🔁 Loop started: every 2m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 90000, True, False, 92211)),
    ('1.5H do it', '🔁 Loop started: every 2h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 5400000, True, False, 5319212)),
    ('1.5D do it', '🔁 Loop started: every 2d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 129600000, True, False, 128516807)),
    ('2s do it', '🔁 Loop started: every 2s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 2000, True, False, 2244)),
    ('2m do it', '🔁 Loop started: every 2m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 120000, True, False, 121976)),
    ('2h do it', '🔁 Loop started: every 2h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 7200000, True, False, 7384018)),
    ('2d do it', '🔁 Loop started: every 2d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 172800000, True, False, 171986767)),
    ('2S do it', '🔁 Loop started: every 2s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 2000, True, False, 2155)),
    ('2M do it', '🔁 Loop started: every 2m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 120000, True, False, 119579)),
    ('2H do it', '🔁 Loop started: every 2h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 7200000, True, False, 6326395)),
    ('2D do it', '🔁 Loop started: every 2d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 172800000, True, False, 173516357)),
    ('10s do it', '🔁 Loop started: every 10s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 10000, True, False, 12845)),
    ('10m do it', '🔁 Loop started: every 10m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 600000, True, False, 618494)),
    ('10h do it', '🔁 Loop started: every 10h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 36000000, True, False, 36168138)),
    ('10d do it', '🔁 Loop started: every 10d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 864000000, True, False, 864084064)),
    ('10S do it', '🔁 Loop started: every 10s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 10000, True, False, 6443)),
    ('10M do it', '🔁 Loop started: every 10m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 600000, True, False, 581179)),
    ('10H do it', '🔁 Loop started: every 10h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 36000000, True, False, 34632194)),
    ('10D do it', '🔁 Loop started: every 10d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 864000000, True, False, 864144328)),
    ('100s do it', '🔁 Loop started: every 2m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 100000, True, False, 88141)),
    ('100m do it', '🔁 Loop started: every 2h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 6000000, True, False, 6943484)),
    ('100h do it', '🔁 Loop started: every 4d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 360000000, True, False, 360518098)),
    ('100d do it', '🔁 Loop started: every 100d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 8640000000, True, False, 8640919505)),
    ('100S do it', '🔁 Loop started: every 2m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 100000, True, False, 93227)),
    ('100M do it', '🔁 Loop started: every 2h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 6000000, True, False, 6944021)),
    ('100H do it', '🔁 Loop started: every 4d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 360000000, True, False, 359037648)),
    ('100D do it', '🔁 Loop started: every 100d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 8640000000, True, False, 8640785833)),
    ('007s do it', '🔁 Loop started: every 7s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 7000, True, False, 8971)),
    ('007m do it', '🔁 Loop started: every 7m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 420000, True, False, 418481)),
    ('007h do it', '🔁 Loop started: every 7h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 25200000, True, False, 26293738)),
    ('007d do it', '🔁 Loop started: every 7d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 604800000, True, False, 604948766)),
    ('007S do it', '🔁 Loop started: every 7s (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 7000, True, False, 9524)),
    ('007M do it', '🔁 Loop started: every 7m (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 420000, True, False, 437912)),
    ('007H do it', '🔁 Loop started: every 7h (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 25200000, True, False, 26297186)),
    ('007D do it', '🔁 Loop started: every 7d (running now), prompt "do it" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('do it', 604800000, True, False, 603097790)),
    ('5m check the deploy', '🔁 Loop started: every 5m (running now), prompt "check the deploy" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check the deploy', 300000, True, False, 297595)),
    ('1s x', '🔁 Loop started: every 1s (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 1000, True, False, 1422)),
    ('0.5s x', '❌ Invalid interval "0.5s". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('0s x', '❌ Invalid interval "0s". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('0.001s x', '❌ Invalid interval "0.001s". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('1.0005s x', '🔁 Loop started: every 1s (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 1001, True, False, 1240)),  # departure: whole milliseconds: the reference stores 1000.5 ms
    ('0.3m x', '🔁 Loop started: every 18s (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 18000, True, False, 26308)),
    ('0.1h x', '🔁 Loop started: every 6m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 360000, True, False, 355659)),
    ('365d x', '🔁 Loop started: every 365d (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 31536000000, True, False, 31536589392)),
    ('100000000d x', '🔁 Loop started: every 100000000d (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 8640000000000000, True, False, 8639999998500596)),  # departure: due past year 9999, stored as 9999-12-31T23:59:59.999Z
    ('59.5s x', '🔁 Loop started: every 60s (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 59500, True, False, 68197)),
    ('59.4s x', '🔁 Loop started: every 59s (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 59400, True, False, 66373)),
    ('89s x', '🔁 Loop started: every 1m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 89000, True, False, 85407)),
    ('90s x', '🔁 Loop started: every 2m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 90000, True, False, 100046)),
    ('29.5m x', '🔁 Loop started: every 30m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 1770000, True, False, 1714292)),
    ('1.5d x', '🔁 Loop started: every 2d (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 129600000, True, False, 127868857)),
    ('36h x', '🔁 Loop started: every 2d (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 129600000, True, False, 130162630)),
    ('1000s x', '🔁 Loop started: every 17m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 1000000, True, False, 978020)),
    ('5m', '❌ Missing prompt after interval "5m". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('5m   ', '❌ Missing prompt after interval "5m". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('5m --once', '❌ Missing prompt after interval "5m". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('5m --', '❌ Missing prompt after interval "5m". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('5m -- ', '❌ Missing prompt after interval "5m". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('5m --jitter=false', '❌ Missing prompt after interval "5m". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('5m --once --jitter=true', '❌ Missing prompt after interval "5m". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('5m --once x', '🔁 Loop started: every 5m, prompt "x" [id={id}] [s=ses_tabl] (runs once). Cancel: `/loop cancel {id}`', F('x', 300000, True, True, 0)),
    ('5m --jitter=false x', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, False, False, 300000)),
    ('5m --jitter=true x', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 290394)),
    ('5m --jitter=true --once x', '🔁 Loop started: every 5m, prompt "x" [id={id}] [s=ses_tabl] (runs once). Cancel: `/loop cancel {id}`', F('x', 300000, True, True, 0)),
    ('5m -- --once x', '🔁 Loop started: every 5m (running now), prompt "--once x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('--once x', 300000, True, False, 309920)),
    ('5m --once -- x', '🔁 Loop started: every 5m, prompt "x" [id={id}] [s=ses_tabl] (runs once). Cancel: `/loop cancel {id}`', F('x', 300000, True, True, 0)),
    ('5m x --once', '🔁 Loop started: every 5m (running now), prompt "x --once" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x --once', 300000, True, False, 299531)),
    ('5m --jitter=maybe x', '🔁 Loop started: every 5m (running now), prompt "--jitter=maybe x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('--jitter=maybe x', 300000, True, False, 309173)),
    ('5m --JITTER=false x', '🔁 Loop started: every 5m (running now), prompt "--JITTER=false x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('--JITTER=false x', 300000, True, False, 297870)),
    ('5m --Once x', '🔁 Loop started: every 5m (running now), prompt "--Once x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('--Once x', 300000, True, False, 285135)),
    ('5m --once --once --jitter=true --jitter=false go', '🔁 Loop started: every 5m, prompt "go" [id={id}] [s=ses_tabl] (runs once). Cancel: `/loop cancel {id}`', F('go', 300000, False, True, 0)),
    ('5m --all check', '🔁 Loop started: every 5m (running now), prompt "--all check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('--all check', 300000, True, False, 305302)),
    ('5m check the deploy every 2m', '🔁 Loop started: every 5m (running now), prompt "check the deploy every 2m" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check the deploy every 2m', 300000, True, False, 312940)),
    ('30s --once remind me to stretch', '🔁 Loop started: every 30s, prompt "remind me to stretch" [id={id}] [s=ses_tabl] (runs once). Cancel: `/loop cancel {id}`', F('remind me to stretch', 30000, True, True, 0)),
    ('1m line one\nline  two   spaced', '🔁 Loop started: every 1m (running now), prompt "line one\nline  two   spaced" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('line one\nline  two   spaced', 60000, True, False, 62760)),
    ('5m "quoted" text', '🔁 Loop started: every 5m (running now), prompt ""quoted" text" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('"quoted" text', 300000, True, False, 309454)),
    ("5m 'x'", '🔁 Loop started: every 5m (running now), prompt "\'x\'" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F("'x'", 300000, True, False, 313431)),
    ('5m\tcheck', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 307528)),
    ('5m\ncheck', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 305057)),
    ('5m\x0bcheck', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 286132)),
    ('5m\x0ccheck', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 302932)),
    ('5m\rcheck', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 301226)),
    ('5m check', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 295647)),
    ('5m\xa0check', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 311005)),
    ('5m\u1680check', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 291164)),
    ('5m\u2000check', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 291468)),
    ('5m\u2005check', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 289436)),
    ('5m\u200acheck', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 313987)),
    ('5m\u2028check', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 301990)),
    ('5m\u2029check', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 285133)),
    ('5m\u202fcheck', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 297415)),
    ('5m\u205fcheck', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 311603)),
    ('5m\u3000check', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 287961)),
    ('5m\ufeffcheck', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 305704)),
    ('5m\x1ccheck', '❌ Invalid interval "5m\x1ccheck". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\x1dcheck', '❌ Invalid interval "5m\x1dcheck". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\x1echeck', '❌ Invalid interval "5m\x1echeck". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\x1fcheck', '❌ Invalid interval "5m\x1fcheck". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\x85check', '❌ Invalid interval "5m\x85check". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\u200bcheck', '❌ Invalid interval "5m\u200bcheck". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\u180echeck', '❌ Invalid interval "5m\u180echeck". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\u2060check', '❌ Invalid interval "5m\u2060check". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\x00check', '❌ Invalid interval "5m\x00check". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\x1bcheck', '❌ Invalid interval "5m\x1bcheck". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\x07check', '❌ Invalid interval "5m\x07check". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('\t5m check\t', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 312430)),
    ('\n5m check\n', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 293306)),
    ('\x0b5m check\x0b', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 296987)),
    ('\x0c5m check\x0c', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 301512)),
    ('\r5m check\r', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 294893)),
    (' 5m check ', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 297417)),
    ('\xa05m check\xa0', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 290139)),
    ('\u16805m check\u1680', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 303258)),
    ('\u20005m check\u2000', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 290892)),
    ('\u20055m check\u2005', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 294878)),
    ('\u200a5m check\u200a', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 285812)),
    ('\u20285m check\u2028', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 309564)),
    ('\u20295m check\u2029', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 307483)),
    ('\u202f5m check\u202f', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 293912)),
    ('\u205f5m check\u205f', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 293753)),
    ('\u30005m check\u3000', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 297659)),
    ('\ufeff5m check\ufeff', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 298293)),
    ('\x1c5m check\x1c', '🔁 Loop started (adaptive 60s–3600s): "\x1c5m check\x1c" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\x1c5m check\x1c', 945000)),
    ('\x1d5m check\x1d', '🔁 Loop started (adaptive 60s–3600s): "\x1d5m check\x1d" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\x1d5m check\x1d', 945000)),
    ('\x1e5m check\x1e', '🔁 Loop started (adaptive 60s–3600s): "\x1e5m check\x1e" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\x1e5m check\x1e', 945000)),
    ('\x1f5m check\x1f', '🔁 Loop started (adaptive 60s–3600s): "\x1f5m check\x1f" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\x1f5m check\x1f', 945000)),
    ('\x855m check\x85', '🔁 Loop started (adaptive 60s–3600s): "\x855m check\x85" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\x855m check\x85', 945000)),
    ('\u200b5m check\u200b', '🔁 Loop started (adaptive 60s–3600s): "\u200b5m check\u200b" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\u200b5m check\u200b', 945000)),
    ('\ufeff5m check', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 290793)),
    ('5m check\ufeff', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 311668)),
    ('\ufeff\ufeff', '🔁 Loop started (maintenance mode): task {id} (session ses_tabl). Running now; then re-arms every 3600s. Use `/loop cancel {id}` to stop.', MAINTENANCE),  # departure: built-in maintenance prompt: the reference's asks for a reschedule maintenance tasks refuse
    ('\ufeff', '🔁 Loop started (maintenance mode): task {id} (session ses_tabl). Running now; then re-arms every 3600s. Use `/loop cancel {id}` to stop.', MAINTENANCE),  # departure: built-in maintenance prompt: the reference's asks for a reschedule maintenance tasks refuse
    ('\x85', '🔁 Loop started (adaptive 60s–3600s): "\x85" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\x85', 945000)),
    ('\x1f', '🔁 Loop started (adaptive 60s–3600s): "\x1f" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\x1f', 945000)),
    ('\xa0', '🔁 Loop started (maintenance mode): task {id} (session ses_tabl). Running now; then re-arms every 3600s. Use `/loop cancel {id}` to stop.', MAINTENANCE),  # departure: built-in maintenance prompt: the reference's asks for a reschedule maintenance tasks refuse
    ('"5m check deploy"', '🔁 Loop started: every 5m (running now), prompt "check deploy" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check deploy', 300000, True, False, 307672)),
    ("'5m check deploy'", '🔁 Loop started: every 5m (running now), prompt "check deploy" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check deploy', 300000, True, False, 300980)),
    ('"5m check\'', '🔁 Loop started (adaptive 60s–3600s): ""5m check\'" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('"5m check\'', 945000)),
    ('""', '🔁 Loop started (maintenance mode): task {id} (session ses_tabl). Running now; then re-arms every 3600s. Use `/loop cancel {id}` to stop.', MAINTENANCE),  # departure: built-in maintenance prompt: the reference's asks for a reschedule maintenance tasks refuse
    ("''", '🔁 Loop started (maintenance mode): task {id} (session ses_tabl). Running now; then re-arms every 3600s. Use `/loop cancel {id}` to stop.', MAINTENANCE),  # departure: built-in maintenance prompt: the reference's asks for a reschedule maintenance tasks refuse
    ('"  "', '🔁 Loop started (maintenance mode): task {id} (session ses_tabl). Running now; then re-arms every 3600s. Use `/loop cancel {id}` to stop.', MAINTENANCE),  # departure: built-in maintenance prompt: the reference's asks for a reschedule maintenance tasks refuse
    ('" list "', '📭 No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one.', None),
    ('"\xa05m x\xa0"', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 299850)),
    ('\ufeff"5m x"\ufeff', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 299179)),
    ('"\x855m x"', '🔁 Loop started (adaptive 60s–3600s): "\x855m x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\x855m x', 945000)),
    ('"', '🔁 Loop started (adaptive 60s–3600s): """ [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('"', 945000)),
    ("'a'b'", '🔁 Loop started (adaptive 60s–3600s): "a\'b" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A("a'b", 945000)),
    ('"help"', HELP, None),
    ('５m check', '🔁 Loop started (adaptive 60s–3600s): "５m check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('５m check', 945000)),
    ('٥m check', '🔁 Loop started (adaptive 60s–3600s): "٥m check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('٥m check', 945000)),
    ('５ m check', '🔁 Loop started (adaptive 60s–3600s): "５ m check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('５ m check', 945000)),
    ('check every ５m', '🔁 Loop started (adaptive 60s–3600s): "check every ５m" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check every ５m', 945000)),
    ('check every ٥ minutes', '🔁 Loop started (adaptive 60s–3600s): "check every ٥ minutes" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check every ٥ minutes', 945000)),
    ('1５m x', '❌ Invalid interval "1５m". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('５', '🔁 Loop started (adaptive 60s–3600s): "５" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('５', 945000)),
    ('٣ ٤ ٥ ٦ ٧ x', '🔁 Loop started (adaptive 60s–3600s): "٣ ٤ ٥ ٦ ٧ x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('٣ ٤ ٥ ٦ ٧ x', 945000)),
    ('check the deploy every 20m', '🔁 Loop started: every 20m (running now), prompt "check the deploy" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check the deploy', 1200000, True, False, 1236235)),
    ('check CI every 5 minutes', '🔁 Loop started: every 5m (running now), prompt "check CI" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check CI', 300000, True, False, 288367)),
    ('ping every 1.5h', '🔁 Loop started: every 2h (running now), prompt "ping" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('ping', 5400000, True, False, 6197274)),
    ('CHECK EVERY 10M', '🔁 Loop started: every 10m (running now), prompt "CHECK" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('CHECK', 600000, True, False, 591068)),
    ('daily report every 1 day', '🔁 Loop started: every 1d (running now), prompt "daily report" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('daily report', 86400000, True, False, 86576267)),
    ('check every PR', '🔁 Loop started (adaptive 60s–3600s): "check every PR" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check every PR', 945000)),
    ('review every merge request', '🔁 Loop started (adaptive 60s–3600s): "review every merge request" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('review every merge request', 945000)),
    ('every 20m ago check', '🔁 Loop started (adaptive 60s–3600s): "every 20m ago check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('every 20m ago check', 945000)),
    ('check every 2m worth of logs', '🔁 Loop started (adaptive 60s–3600s): "check every 2m worth of logs" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check every 2m worth of logs', 945000)),
    ('check CI every 5 mins', '🔁 Loop started (adaptive 60s–3600s): "check CI every 5 mins" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check CI every 5 mins', 945000)),
    ('check every 2 hrs', '🔁 Loop started (adaptive 60s–3600s): "check every 2 hrs" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check every 2 hrs', 945000)),
    ('check every 3 secs', '🔁 Loop started (adaptive 60s–3600s): "check every 3 secs" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check every 3 secs', 945000)),
    ('every 5m', '❌ Missing prompt after interval "every". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('EVERY 5M', '❌ Missing prompt after interval "EVERY". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('  every 5m  ', '❌ Missing prompt after interval "every". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('x every 0.5s', '🔁 Loop started (adaptive 60s–3600s): "x every 0.5s" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every 0.5s', 945000)),
    ('x every 0s', '🔁 Loop started (adaptive 60s–3600s): "x every 0s" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every 0s', 945000)),
    ('x every 1.5 hours', '🔁 Loop started: every 2h (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 5400000, True, False, 6999782)),
    ('x every 2 days', '🔁 Loop started: every 2d (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 172800000, True, False, 173531203)),
    ('x every 1 second', '🔁 Loop started: every 1s (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 1000, True, False, 1322)),
    ('x every 30 seconds', '🔁 Loop started: every 30s (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 30000, True, False, 20239)),
    ('x every 1 minute', '🔁 Loop started: every 1m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 60000, True, False, 69129)),
    ('x every 1 hour', '🔁 Loop started: every 1h (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 3600000, True, False, 3081409)),
    ('x every 5m5', '🔁 Loop started (adaptive 60s–3600s): "x every 5m5" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every 5m5', 945000)),
    ('xevery 5m', '🔁 Loop started (adaptive 60s–3600s): "xevery 5m" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('xevery 5m', 945000)),
    ('x_every 5m', '🔁 Loop started (adaptive 60s–3600s): "x_every 5m" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x_every 5m', 945000)),
    ('x-every 5m', '🔁 Loop started: every 5m (running now), prompt "x-" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x-', 300000, True, False, 289916)),
    ('x.every 5m', '🔁 Loop started: every 5m (running now), prompt "x." [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x.', 300000, True, False, 287033)),
    ('every every 5m', '🔁 Loop started: every 5m (running now), prompt "every" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('every', 300000, True, False, 308785)),
    ('x every5m', '🔁 Loop started (adaptive 60s–3600s): "x every5m" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every5m', 945000)),
    ('x every 5m ', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 309156)),
    ('x every 5 m', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 301562)),
    ('x every 5\xa0minutes', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 296778)),
    ('x every\xa05m', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 312267)),
    ('x every\x855m', '🔁 Loop started (adaptive 60s–3600s): "x every\x855m" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every\x855m', 945000)),
    ('x every 5m\x85', '🔁 Loop started (adaptive 60s–3600s): "x every 5m\x85" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every 5m\x85', 945000)),
    ('x every 5m\ufeff', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 306871)),
    ('x every\u30005m', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 292918)),
    ('x every 5 ſeconds', '🔁 Loop started (adaptive 60s–3600s): "x every 5 ſeconds" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every 5 ſeconds', 945000)),
    ('x every 5 Keconds', '🔁 Loop started (adaptive 60s–3600s): "x every 5 Keconds" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every 5 Keconds', 945000)),
    ('x Every 5 Minutes', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 312103)),
    ('x every 1.m', '🔁 Loop started (adaptive 60s–3600s): "x every 1.m" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every 1.m', 945000)),
    ('x every .5m', '🔁 Loop started (adaptive 60s–3600s): "x every .5m" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every .5m', 945000)),
    ('x every 10 MINUTES', '🔁 Loop started: every 10m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 600000, True, False, 621339)),
    ('--once check every 30s', '🔁 Loop started: every 30s, prompt "check" [id={id}] [s=ses_tabl] (runs once). Cancel: `/loop cancel {id}`', F('check', 30000, True, True, 0)),
    ('--jitter=false check every 1m', '🔁 Loop started: every 1m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 60000, False, False, 60000)),
    ('-- check every 5m', '🔁 Loop started: every 5m (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 300000, True, False, 285235)),
    ('check every 5m --once', '🔁 Loop started (adaptive 60s–3600s): "check every 5m --once" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check every 5m --once', 945000)),
    ('--once every 5m', '❌ Missing prompt after interval "--once". Usage: /loop <interval> <prompt> — see `/loop help`.', None),
    ('检查every 5m', '🔁 Loop started: every 5m (running now), prompt "检查" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('检查', 300000, True, False, 308168)),
    ('检查 every 5m', '🔁 Loop started: every 5m (running now), prompt "检查" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('检查', 300000, True, False, 306459)),
    ('éevery 5m', '🔁 Loop started: every 5m (running now), prompt "é" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('é', 300000, True, False, 303712)),
    ('café every 5m', '🔁 Loop started: every 5m (running now), prompt "café" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('café', 300000, True, False, 287465)),
    ('caféevery 5m', '🔁 Loop started: every 5m (running now), prompt "café" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('café', 300000, True, False, 290523)),
    ('x2every 5m', '🔁 Loop started (adaptive 60s–3600s): "x2every 5m" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x2every 5m', 945000)),
    ('x\xa0every 5m', '🔁 Loop started: every 5m (running now), prompt "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x', 300000, True, False, 297532)),
    ('x\x85every 5m', '🔁 Loop started: every 5m (running now), prompt "x\x85" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('x\x85', 300000, True, False, 304412)),
    ('x every 5m\nmore', '🔁 Loop started (adaptive 60s–3600s): "x every 5m\nmore" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x every 5m\nmore', 945000)),
    ('line one\nline two every 10m', '🔁 Loop started: every 10m (running now), prompt "line one\nline two" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('line one\nline two', 600000, True, False, 571669)),
    ('check every 1 days', '🔁 Loop started: every 1d (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 86400000, True, False, 86701050)),
    ('check every 2 day', '🔁 Loop started: every 2d (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 172800000, True, False, 171967450)),
    ('check every 0.5 minutes', '🔁 Loop started: every 30s (running now), prompt "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('check', 30000, True, False, 31536)),
    ('*/5 * * * * check build', '❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m check build`.', None),
    ('0 9 * * 1-5', '❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m check the build`.', None),
    ('1 2 3 4 5 numbers', '❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m numbers`.', None),
    ('1 2 3 4 x', '❌ Invalid interval "1". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('* * * * *', '❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m check the build`.', None),
    ('*/5 * * * * a  b', '❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m a b`.', None),
    ('1,2 3 4 5 6', '❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m check the build`.', None),
    ('1 2 3 4 ５', '❌ Invalid interval "1". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('*/5\xa0* * * * x', '❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m x`.', None),
    ('*/5\x85* * * * x', '🔁 Loop started (adaptive 60s–3600s): "*/5\x85* * * * x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('*/5\x85* * * * x', 945000)),
    ('*/5 * * * *\x85x y', '🔁 Loop started (adaptive 60s–3600s): "*/5 * * * *\x85x y" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('*/5 * * * *\x85x y', 945000)),
    ('- - - - - dash', '❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m dash`.', None),
    ('5m * * * * x', '🔁 Loop started: every 5m (running now), prompt "* * * * x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('* * * * x', 300000, True, False, 291191)),
    ('*/5 * * *', '🔁 Loop started (adaptive 60s–3600s): "*/5 * * *" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('*/5 * * *', 945000)),
    ('1 2 3 4 5', '❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m check the build`.', None),
    ('0 0 1 1 0 new year', '❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m new year`.', None),
    ('999x test', '❌ Invalid interval "999x". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5 test', '❌ Invalid interval "5". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5min test', '❌ Invalid interval "5min". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('1e3s test', '❌ Invalid interval "1e3s". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('10 minutes check', '❌ Invalid interval "10". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m5 x', '❌ Invalid interval "5m5". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('1.5.5m x', '❌ Invalid interval "1.5.5m". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5mm x', '❌ Invalid interval "5mm". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m,x', '❌ Invalid interval "5m,x". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('1.m x', '❌ Invalid interval "1.m". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5 m check', '❌ Invalid interval "5". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('0x10s x', '❌ Invalid interval "0x10s". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5ms x', '❌ Invalid interval "5ms". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('2w x', '❌ Invalid interval "2w". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('1y x', '❌ Invalid interval "1y". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5m\u200bx', '❌ Invalid interval "5m\u200bx". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5\xa0m x', '❌ Invalid interval "5". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('5\x85m x', '❌ Invalid interval "5\x85m". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.', None),
    ('--bogus do something', '❌ Unknown flag "--bogus". Run `/loop help` to see usage.', None),
    ('--all check the weather', '❌ Unknown flag "--all". Run `/loop help` to see usage.', None),
    ('--ONCE x', '🔁 Loop started (adaptive 60s–3600s): "--ONCE x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('--ONCE x', 945000)),
    ('--Once x', '🔁 Loop started (adaptive 60s–3600s): "--Once x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('--Once x', 945000)),
    ('--jitter=TRUE x', '🔁 Loop started (adaptive 60s–3600s): "--jitter=TRUE x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('--jitter=TRUE x', 945000)),
    ('--jitter=true x', '🔁 Loop started (adaptive 60s–3600s): "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x', 945000)),
    ('--jitter=false x', '🔁 Loop started (adaptive 60s–3600s): "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x', 945000)),
    ('--once x', '❌ --once is only supported for fixed-interval tasks, e.g. `/loop 30s --once <prompt>`.', None),
    ('--once', '❌ Empty loop command — see `/loop help`.', None),
    ('--', '❌ Empty loop command — see `/loop help`.', None),
    ('-- x', '🔁 Loop started (adaptive 60s–3600s): "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x', 945000)),
    ('-- --once x', '🔁 Loop started (adaptive 60s–3600s): "--once x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('--once x', 945000)),
    ('---', '❌ Unknown flag "---". Run `/loop help` to see usage.', None),
    ('--help', HELP, None),
    ('-h', HELP, None),
    ('HELP', HELP, None),
    ('help', HELP, None),
    ('Help me please', HELP, None),
    ('--HELP', HELP, None),
    ('-H', HELP, None),
    ('-x check', '🔁 Loop started (adaptive 60s–3600s): "-x check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('-x check', 945000)),
    ('-5m check', '🔁 Loop started (adaptive 60s–3600s): "-5m check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('-5m check', 945000)),
    ('.5m check', '🔁 Loop started (adaptive 60s–3600s): ".5m check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('.5m check', 945000)),
    ('--\xa0x', '🔁 Loop started (adaptive 60s–3600s): "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x', 945000)),
    ('--\x85x', '❌ Unknown flag "--\x85x". Run `/loop help` to see usage.', None),
    ('--jitter=maybe x', '❌ Unknown flag "--jitter=maybe". Run `/loop help` to see usage.', None),
    ('--\x1b[31mred', '❌ Unknown flag "--\x1b[31mred". Run `/loop help` to see usage.', None),
    ('help\x85me', '🔁 Loop started (adaptive 60s–3600s): "help\x85me" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('help\x85me', 945000)),
    ('list', '📭 No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one.', None),
    ('LIST', '📭 No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one.', None),
    ('status', '📭 No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one.', None),
    ('Status', '📭 No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one.', None),
    ('--list', '📭 No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one.', None),
    ('--status', '📭 No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one.', None),
    ('--LIST', '📭 No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one.', None),
    ('list extra words', '📭 No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one.', None),
    ('cancel', '❌ Usage: /loop cancel <taskId>', None),
    ('cancel abc', '❌ No task abc in this session', None),
    ('CANCEL abc', '❌ No task abc in this session', None),
    ('stop', '🛑 Cancelled 0 task(s) in current session', None),
    ('stop abc', '❌ No task abc in this session', None),
    ('--stop', '🛑 Cancelled 0 task(s) in current session', None),
    ('--stop abc', '❌ No task abc in this session', None),
    ('stop-all', '🛑 Cancelled 0 task(s) in current session', None),
    ('--stop-all', '🛑 Cancelled 0 task(s) in current session', None),
    ('STOP-ALL x', '🛑 Cancelled 0 task(s) in current session', None),
    ('pause', '❌ Usage: /loop pause <taskId>', None),
    ('pause abc', '❌ No task abc in this session', None),
    ('resume', '❌ Usage: /loop resume <taskId>', None),
    ('resume abc', '❌ No task abc in this session', None),
    ('cancel abc --all', '❌ No task abc in this session', None),
    ('stop --all', '❌ No task --all in this session', None),
    ('cancel\xa0abc', '❌ No task abc in this session', None),
    ('cancel\x85abc', '🔁 Loop started (adaptive 60s–3600s): "cancel\x85abc" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('cancel\x85abc', 945000)),
    ('cancel x\x1b[2Jy', '❌ No task x\x1b[2Jy in this session', None),
    ('pause\u3000ABC', '❌ No task ABC in this session', None),
    ('resume\u2028q', '❌ No task q in this session', None),
    ('list\x1fx', '🔁 Loop started (adaptive 60s–3600s): "list\x1fx" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('list\x1fx', 945000)),
    ('--cancel', '❌ Usage: /loop cancel <taskId>', None),
    ('--pause', '❌ Usage: /loop pause <taskId>', None),
    ('--resume x', '❌ No task x in this session', None),
    ('--cancel abc', '❌ No task abc in this session', None),
    ('cancel\ufeffabc', '❌ No task abc in this session', None),
    ('check the deploy', '🔁 Loop started (adaptive 60s–3600s): "check the deploy" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check the deploy', 945000)),
    ('  check  ', '🔁 Loop started (adaptive 60s–3600s): "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check', 945000)),
    ('line one\nline two', '🔁 Loop started (adaptive 60s–3600s): "line one\nline two" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('line one\nline two', 945000)),
    ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', '🔁 Loop started (adaptive 60s–3600s): "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 945000)),
    ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', '🔁 Loop started (adaptive 60s–3600s): "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa..." [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 945000)),
    ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaéé', '🔁 Loop started (adaptive 60s–3600s): "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaé..." [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaéé', 945000)),
    ('watch the release\tand report', '🔁 Loop started (adaptive 60s–3600s): "watch the release\tand report" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('watch the release\tand report', 945000)),
    ('\xa0check\xa0', '🔁 Loop started (adaptive 60s–3600s): "check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check', 945000)),
    ('check\x85', '🔁 Loop started (adaptive 60s–3600s): "check\x85" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check\x85', 945000)),
    ('\x85check', '🔁 Loop started (adaptive 60s–3600s): "\x85check" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\x85check', 945000)),
    ('check\x1f', '🔁 Loop started (adaptive 60s–3600s): "check\x1f" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('check\x1f', 945000)),
    ('\x1fcheck', '🔁 Loop started (adaptive 60s–3600s): "\x1fcheck" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('\x1fcheck', 945000)),
    ('prompt \x1b]0;title\x07 here', '🔁 Loop started (adaptive 60s–3600s): "prompt \x1b]0;title\x07 here" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('prompt \x1b]0;title\x07 here', 945000)),
    ('null\x00byte', '🔁 Loop started (adaptive 60s–3600s): "null\x00byte" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('null\x00byte', 945000)),
    ('日本語のプロンプト', '🔁 Loop started (adaptive 60s–3600s): "日本語のプロンプト" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('日本語のプロンプト', 945000)),
    ('émoji 🎉 party', '🔁 Loop started (adaptive 60s–3600s): "émoji 🎉 party" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('émoji 🎉 party', 945000)),
    ('x', '🔁 Loop started (adaptive 60s–3600s): "x" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('x', 945000)),
    ('every', '🔁 Loop started (adaptive 60s–3600s): "every" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('every', 945000)),
    ('every day', '🔁 Loop started (adaptive 60s–3600s): "every day" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('every day', 945000)),
    ('every 5', '🔁 Loop started (adaptive 60s–3600s): "every 5" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('every 5', 945000)),
    ('sometimes every 5', '🔁 Loop started (adaptive 60s–3600s): "sometimes every 5" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('sometimes every 5', 945000)),
    ('now every -5m', '🔁 Loop started (adaptive 60s–3600s): "now every -5m" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('now every -5m', 945000)),
    ('done every 5 minutes please', '🔁 Loop started (adaptive 60s–3600s): "done every 5 minutes please" [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('done every 5 minutes please', 945000)),
    ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa🎉b', '🔁 Loop started (adaptive 60s–3600s): "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa..." [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa🎉b', 945000)),  # departure: the reference cuts the emoji in half
    ('aaaaaaaaaaaaaaaaaaaaaaaaa🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉', '🔁 Loop started (adaptive 60s–3600s): "aaaaaaaaaaaaaaaaaaaaaaaaa🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉..." [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('aaaaaaaaaaaaaaaaaaaaaaaaa🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉', 945000)),  # departure: the reference cuts the emoji in half
    ('5m bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb🎉🎉', '🔁 Loop started: every 5m (running now), prompt "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb🎉..." [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', F('bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb🎉🎉', 300000, True, False, 308073)),
    ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa🎉', '🔁 Loop started (adaptive 60s–3600s): "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa..." [id={id}] [s=ses_tabl]. Cancel: `/loop cancel {id}`', A('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa🎉', 945000)),
]
# fmt: on


def test_the_table_is_large_and_has_no_duplicate_input() -> None:
    inputs = [row[0] for row in TABLE]
    assert len(inputs) >= 200 and len(set(inputs)) == len(inputs)


@pytest.mark.parametrize(("args", "message", "task"), TABLE, ids=[ascii(row[0])[:48] for row in TABLE])
async def test_reference_row(
    tmp_path: Path, args: str, message: str, task: F | A | _Maintenance | None
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    tid = task_id_for(f"row:{args}")
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as store:
        out = await service.handle(
            store, args, session_id=SESSION, now=from_ms(T0), cfg=Config(), origin_id=f"row:{args}", u=U,
            directory=tmp_path, home=home,
        )  # fmt: skip
        assert out.message == message.replace("{id}", tid)
        live = (await service.read_session(store, SESSION)).live()
    if task is None:
        assert live == [] and out.task_id is None
        return
    [t] = live
    assert (t.task_id, out.task_id, t.paused, t.session_id) == (tid, tid, False, SESSION)
    assert t.due_at() == from_ms_held(T0 + task.due)  # the same instant, held within years 1-9999
    if isinstance(task, F):
        assert (t.mode, t.prompt, t.interval_ms, t.jitter, t.once) == ("fixed", *task[:4])
    elif isinstance(task, A):
        assert (t.mode, t.prompt, t.adaptive_min_ms, t.adaptive_max_ms) == (
            "adaptive",
            task.prompt,
            60_000,
            3_600_000,
        )
    else:  # departure: the built-in prompt, not the reference's (which asks for a refused reschedule)
        assert (t.mode, t.prompt, t.adaptive_max_ms) == ("maintenance", texts.DEFAULT_MAINTENANCE, 3_600_000)


# What the model gets instead of the command (the reference's index.ts: the task's own prompt, else the failure
# or the result prompt), from the same run of the reference.
# fmt: off
MODEL_PROMPTS: list[tuple[str, str]] = [
    ('5m check the deploy', (
        'The /loop task {id} has just been scheduled to run every 5m. This is its first execution — it runs now, then repeats on schedule (cancel anytime with: /loop cancel {id}).\n'
        "Briefly confirm the schedule in the user's language, then perform the task described below now and report the result concisely.\n"
        '\n'
        'check the deploy'
    )),
    ('5m', (
        'The user\'s /loop command failed: Missing prompt after interval "5m". Usage: /loop <interval> <prompt> — see `/loop help`.\n'
        'Briefly inform the user that the /loop command failed and why, written in the same language the user used in their request. Do not call tools in this reply and do not attempt to perform the command arguments as a separate task.'
    )),
    ('30s --once remind me to stretch', (
        "The opencode-plugin-loop plugin has successfully created a scheduled loop task from the user's /loop command:\n"
        '- Task: "remind me to stretch"\n'
        '- Schedule: every 30s (runs once)\n'
        '- Job ID: {id}\n'
        '- Cancel anytime with: /loop cancel {id}\n'
        'Reply to the user with a short confirmation that the scheduled loop task was created, written in the same language the user used in their request. Include the task, schedule, and job ID from above. This reply is only the creation confirmation — the plugin executes the task automatically at each scheduled time, so do not execute the task and do not call tools in this reply.'
    )),
    ('--bogus do something', (
        'The user\'s /loop command failed: Unknown flag "--bogus". Run `/loop help` to see usage.\n'
        'Briefly inform the user that the /loop command failed and why, written in the same language the user used in their request. Do not call tools in this reply and do not attempt to perform the command arguments as a separate task.'
    )),
    ('list', (
        "The opencode-plugin-loop plugin has fully handled the user's /loop command. The command result is:\n"
        '\n'
        'No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one.\n'
        '\n'
        'Present this result to the user, written in the same language the user used in their request:\n'
        '- If it is a task list, render it as a markdown table with columns: Job ID, frequency, content, and type (every task is a session-scoped loop that auto-expires after 7 days idle). Keep the management commands (`/loop cancel|pause|resume <id>`, `/loop stop-all`) mentioned below the table.\n'
        '- If it confirms an action (cancel, pause, resume, stop-all), confirm concisely which task was affected and whether it will trigger again.\n'
        '- If it is help text or an empty state, present it naturally.\n'
        'Do not call tools in this reply, and do not execute any task prompt in this reply — scheduled tasks run automatically when they are due.'
    )),
    ('cancel abc', (
        "The user's /loop command failed: No task abc in this session\n"
        'Briefly inform the user that the /loop command failed and why, written in the same language the user used in their request. Do not call tools in this reply and do not attempt to perform the command arguments as a separate task.'
    )),
    ('check the deploy', (
        'check the deploy\n'
        '\n'
        '<adaptive_loop_schedule>\n'
        "This is Adaptive loop task {id}. Complete the user request above first. After observing the current session state and this execution's result, decide whether the next run needs a different time.\n"
        '\n'
        'A fallback run is already scheduled at 1800000945000 (2027-01-15T08:15:45.000Z), using the allowed delay range 60000ms to 3600000ms. Keep that fallback by making no scheduling tool call when it is appropriate.\n'
        '\n'
        'If the user\'s request contains a clear, stable recurring cadence (for example, "every two minutes"), convert this Adaptive task to a permanent Fixed task after completing the request. Call loop_schedule exactly once with action="set_fixed", taskId="{id}", and intervalMs set to that relative period in milliseconds. Fixed conversion defaults to jitter disabled, so repeated runs use the exact requested interval.\n'
        '\n'
        'If the next time should instead depend on this execution\'s result, call loop_schedule exactly once with action="reschedule", taskId="{id}", and delayMs set to a relative delay from now within 60000ms to 3600000ms. An accepted in-range delay is stored without jitter; only an out-of-range delay is clamped to the nearest bound. Prefer a shorter delay for pending, rapidly changing, or retryable conditions and a longer delay for stable or slow-moving conditions. Do not calculate an epoch timestamp when delayMs can express the decision.\n'
        '\n'
        'If the task is fully complete and no future check is useful, call loop_schedule with action="cancel" and taskId="{id}". Do not claim that the schedule changed unless the tool call succeeds.\n'
        '</adaptive_loop_schedule>'
    )),
]
FIRE_TEXTS = {  # task "abcd1234", prompt "check the deploy\nthen report"; loop.md now "maintenance v2"
    'fire': (
        'This is the scheduled execution of /loop task abcd1234. Perform the task described below now, then report the result concisely.\n'
        '\n'
        'check the deploy\n'
        'then report'
    ),
    'unchanged': (
        'This is the scheduled execution of /loop maintenance task abcd1234. The maintenance instructions from loop.md are unchanged since the previous run earlier in this conversation — refer to them above.\n'
        'If there is pending maintenance work, perform it now and report concisely. If nothing is pending, reply with one line saying so and call loop_schedule(action="cancel", taskId="abcd1234") to end the loop.'
    ),
    'changed': (
        'This is the scheduled execution of /loop maintenance task abcd1234. The maintenance instructions from loop.md (re-read at fire time; they may have been edited since the last run) follow below — perform them now, then report concisely.\n'
        'When the work is complete and no further checks are needed, call loop_schedule(action="cancel", taskId="abcd1234") to end the loop.\n'
        '\n'
        'maintenance v2'
    ),
}
# fmt: on


@pytest.mark.parametrize(("args", "expected"), MODEL_PROMPTS, ids=[row[0] for row in MODEL_PROMPTS])
async def test_reference_model_prompt(tmp_path: Path, args: str, expected: str) -> None:
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as store:
        out = await service.handle(
            store, args, session_id=SESSION, now=from_ms(T0), cfg=Config(), origin_id=f"row:{args}", u=U,
            directory=tmp_path, home=tmp_path,
        )  # fmt: skip
    assert out.model_prompt == expected.replace("{id}", task_id_for(f"row:{args}"))


def test_reference_fire_texts() -> None:
    prompt = "check the deploy\nthen report"
    assert texts.fire_text("abcd1234", prompt) == FIRE_TEXTS["fire"]
    assert texts.maintenance_unchanged("abcd1234") == FIRE_TEXTS["unchanged"]
    assert texts.maintenance_changed("abcd1234", "maintenance v2") == FIRE_TEXTS["changed"]
