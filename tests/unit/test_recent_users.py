"""``RecentUsers``: a store commits inline only while no other task is using it (see ``log/group_commit.py``)."""

from __future__ import annotations

import anyio
import pytest

from loopd_es.log.group_commit import RecentUsers
from tests.waits import alet_time_pass

pytestmark = pytest.mark.anyio


async def test_a_lone_task_sees_no_others_and_a_second_task_is_seen() -> None:
    users = RecentUsers()
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


async def test_others_are_forgotten_after_the_window() -> None:
    users = RecentUsers()

    async def other() -> None:
        users.note()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
    assert users.others()
    await alet_time_pass(RecentUsers.WINDOW_S * 3, "the other task's use falls out of the window")
    assert not users.others()


async def test_a_crowd_that_never_commits_keeps_the_record_to_the_window() -> None:
    users = RecentUsers()

    async def reader() -> None:
        users.note()

    async with anyio.create_task_group() as tg:
        for _ in range(300):
            tg.start_soon(reader)
    await alet_time_pass(RecentUsers.WINDOW_S * 3, "the readers' uses fall out of the window")
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)  # the 301st note prunes what the window no longer holds
    assert len(users) == 1
