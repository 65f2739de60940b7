"""The simulated host's state lock tells a busy lock from a stuck one (a shared engine test on a loaded machine
once failed a prompt because a waiter lost every round for 10 s while other processes took their turns)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from loopd_es.host import sim_script
from loopd_es.host.errors import HostStateError


class _Held:
    """``fcntl`` and ``time`` as the lock sees them: the lock is taken by others for ``rounds`` tries; each
    wait moves the clock by 1 s and, when ``others_take_turns``, counts one more holder in the lock file."""

    LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

    def __init__(self, lock: Path, rounds: int, *, others_take_turns: bool) -> None:
        self.lock, self.rounds, self.others = lock, rounds, others_take_turns
        self.now = 0.0

    def flock(self, fd: int, op: int) -> None:
        if self.rounds > 0:
            self.rounds -= 1
            raise BlockingIOError

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += 1.0
        if self.others:
            fd = os.open(self.lock, os.O_RDWR)
            try:
                turns = int.from_bytes(os.pread(fd, 8, 0).ljust(8, b"\0"), "little")
                os.pwrite(fd, (turns + 1).to_bytes(8, "little"), 0)
            finally:
                os.close(fd)


def _fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rounds: int, *, others: bool) -> Path:
    state = tmp_path / "host.state.json"
    fake = _Held(state.with_name(state.name + ".lock"), rounds, others_take_turns=others)
    monkeypatch.setattr(sim_script, "fcntl", fake)
    monkeypatch.setattr(sim_script, "time", fake)
    return state


def test_a_lock_others_keep_taking_in_turns_is_waited_for_past_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _fake(monkeypatch, tmp_path, rounds=3 * int(sim_script.LOCK_TIMEOUT_S), others=True)
    with sim_script.locked(state):
        pass
    lock = state.with_name(state.name + ".lock").read_bytes()
    assert int.from_bytes(lock, "little") == 3 * int(sim_script.LOCK_TIMEOUT_S) + 1  # theirs, and this turn


def test_a_lock_one_process_holds_past_the_timeout_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _fake(monkeypatch, tmp_path, rounds=3 * int(sim_script.LOCK_TIMEOUT_S), others=False)
    with pytest.raises(HostStateError, match="held by one process for more than 10 s"):
        with sim_script.locked(state):
            pass


def test_the_lock_counts_each_turn_and_reads_a_lock_file_an_earlier_version_left_empty(
    tmp_path: Path,
) -> None:
    state = tmp_path / "host.state.json"
    state.with_name(state.name + ".lock").write_bytes(b"")
    for _ in range(3):
        with sim_script.locked(state):
            pass
    assert int.from_bytes(state.with_name(state.name + ".lock").read_bytes(), "little") == 3
