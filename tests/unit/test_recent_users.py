"""``RecentUsers``: a store commits inline only while no other task is using it (see ``log/group_commit.py``).

Time is the test's own (a hand-moved monotonic source): the window is 10 ms, so on a busy machine the real clock
could move past it between two lines of a test.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from loopd_es.log.group_commit import RecentUsers, current_task_id
from tests.waits import await_until

pytestmark = pytest.mark.anyio


class _Seconds:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_lone_task_sees_no_others_and_a_second_task_is_seen() -> None:
    users = RecentUsers(_Seconds())
    users.note()
    assert not users.others()  # a sequential appender keeps the inline commit
    seen: list[bool] = []

    async def other() -> None:
        users.note()
        seen.append(users.others())  # the first task used the store a moment ago

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
    assert seen == [True]
    assert users.others()  # and the other task is seen from the first


async def test_others_given_the_noted_id_answers_as_for_the_current_task() -> None:
    """A store passes the id ``note`` returned (the task that submitted a lone group) instead of a look-up."""
    seconds = _Seconds()
    users = RecentUsers(seconds)
    me = users.note()
    assert me == current_task_id()
    assert not users.others(me)  # alone
    await _used_by_other_tasks(users)
    assert users.others(me)
    seconds.now += RecentUsers.WINDOW_S * 2
    assert not users.others(me)  # the other task is forgotten, and so is the stale note of ``me``
    assert len(users) == 0
    users.note()
    assert users.others(me + 1)  # whoever asks, a task other than the asker used it


async def test_current_task_id_tells_tasks_apart_and_is_stable_within_one() -> None:
    ids: dict[str, list[int]] = {"a": [], "b": []}

    async def record(name: str) -> None:
        ids[name].append(current_task_id())
        await anyio.lowlevel.checkpoint()  # the other task runs meanwhile
        ids[name].append(current_task_id())

    async with anyio.create_task_group() as tg:
        tg.start_soon(record, "a")
        tg.start_soon(record, "b")
    (a, a_again), (b, b_again) = ids["a"], ids["b"]
    assert a == a_again and b == b_again
    assert len({a, b, current_task_id()}) == 3


async def test_others_are_forgotten_after_the_window_and_not_before() -> None:
    seconds = _Seconds()
    users = RecentUsers(seconds)

    await _used_by_other_tasks(users)
    seconds.now += RecentUsers.WINDOW_S  # the window's last instant: still seen
    assert users.others()
    seconds.now += RecentUsers.WINDOW_S / 10
    assert not users.others()


async def test_the_real_clock_forgets_too() -> None:
    users = RecentUsers()

    await _used_by_other_tasks(users)
    assert await await_until("the real clock to move past the 10 ms window", lambda: not users.others())


async def test_a_crowd_that_never_commits_keeps_the_record_to_the_window() -> None:
    seconds = _Seconds()
    users = RecentUsers(seconds)

    await _used_by_other_tasks(users, 300)
    assert len(users) > 256  # none has fallen out yet
    seconds.now += RecentUsers.WINDOW_S * 2
    await _used_by_other_tasks(users)  # the 301st note prunes what the window no longer holds
    assert len(users) == 1


async def _used_by_other_tasks(users: RecentUsers, count: int = 1) -> None:
    """``count`` other tasks each use the store once (and end)."""

    async def use() -> None:
        users.note()

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(use)
