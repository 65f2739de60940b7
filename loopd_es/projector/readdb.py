"""The read database: projections' tables plus the projector's own bookkeeping, in one SQLite file.

Every method here runs on the projector's database thread, one call per batch of events (the runner hops
once per batch, never per event or per statement). Bookkeeping tables:

``projector_checkpoints``  per projection: its version and the last log position it accounts for
``projector_parked``       events a projection could not apply, with the error, until ``retry`` succeeds
``projector_meta``         the id of the log's first event, so a read db is never mixed with another log

The database runs in WAL mode, so queries never block the projector nor the projector them, with
``synchronous=NORMAL``: a power cut may lose the last few commits, but never tears one, and since the
checkpoint commits with its rows the projector simply re-applies what was lost.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Final

import msgspec

from ..clock import now_rfc3339
from ..events.envelope import ENVELOPE_DECODER, ENVELOPE_ENCODER, Envelope
from ..private_files import create_private, make_private_dir
from .base import Projection, ProjectionError

BUSY_TIMEOUT_S: Final = 60.0
_BOOKKEEPING: Final = (
    """CREATE TABLE IF NOT EXISTS projector_checkpoints (
        name TEXT PRIMARY KEY, version INTEGER NOT NULL, position INTEGER NOT NULL, updated_at TEXT NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS projector_parked (
        name TEXT NOT NULL, position INTEGER NOT NULL, stream TEXT NOT NULL, type TEXT NOT NULL,
        event_id TEXT NOT NULL, error TEXT NOT NULL, attempts INTEGER NOT NULL, parked_at TEXT NOT NULL,
        envelope BLOB NOT NULL, PRIMARY KEY (name, position)
    ) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS projector_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
)
# SQLite failures of the environment, not of a projection's logic: never park an event for these.
_ENVIRONMENTAL: Final = (
    "locked",
    "busy",
    "disk",
    "full",
    "readonly",
    "read-only",
    "i/o",
    "interrupted",
    "memory",
)


class BatchResult(msgspec.Struct, frozen=True):
    """What one batch transaction did (a Struct, not a dataclass: building a dataclass costs start-up)."""

    applied: int  # (projection, event) pairs applied
    parked: int  # (projection, event) pairs parked
    low: int  # the lowest checkpoint after the commit: where the next read starts


class ProjectionStatus(msgspec.Struct, frozen=True):
    """One row of ``projections status``."""

    name: str
    version: int
    position: int
    parked: int
    last_error: str | None


class ReadDb:
    """The read database and the transactions the projector runs on it."""

    def __init__(self, path: Path, projections: Sequence[Projection]) -> None:
        self.path = path
        self.projections = list(projections)
        self.by_name = {p.name: p for p in self.projections}
        try:
            make_private_dir(path.parent)
            create_private(path)
            # check_same_thread=False: the runner serialises every call through one capacity-1 limiter,
            # but anyio may run consecutive calls on different worker threads.
            self.conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
            )
        except (OSError, sqlite3.Error) as e:
            raise ProjectionError(f"cannot open the read database {path}: {e}; check --read-db") from e

    def close(self) -> None:
        self.conn.close()

    # -- setup ----------------------------------------------------------------------------------------

    def setup(self) -> list[str]:
        """Create the bookkeeping; register new projections; reset those whose version changed.

        Returns the names of the projections reset because their version changed (the next catch-up
        rebuilds them from the start of the log).
        """
        conn = self.conn
        with self._translated("set up"):
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ProjectionError(
                    f"cannot switch the read database {self.path} to WAL (it stays {mode!r})"
                )
            conn.execute("PRAGMA synchronous = NORMAL")
        reset: list[str] = []
        with self._transaction("set up"):
            for ddl in _BOOKKEEPING:
                conn.execute(ddl)
            known = dict(conn.execute("SELECT name, version FROM projector_checkpoints").fetchall())
            for projection in self.projections:
                if projection.name not in known:
                    projection.schema(conn)
                    self._set_checkpoint(projection, 0, insert=True)
                elif known[projection.name] != projection.version:
                    self._reset(projection)
                    reset.append(projection.name)
        return reset

    def log_id(self) -> str | None:
        row = self.conn.execute("SELECT value FROM projector_meta WHERE key = 'log_id'").fetchone()
        return None if row is None else str(row[0])

    def set_log_id(self, event_id: str | None) -> None:
        with self._transaction("record the log id"):
            if event_id is None:
                self.conn.execute("DELETE FROM projector_meta WHERE key = 'log_id'")
            else:
                self.conn.execute(
                    "INSERT OR REPLACE INTO projector_meta (key, value) VALUES ('log_id', ?)", (event_id,)
                )

    # -- applying -------------------------------------------------------------------------------------

    def checkpoints(self) -> dict[str, int]:
        """Each registered projection's checkpoint."""
        rows = self.conn.execute("SELECT name, position FROM projector_checkpoints").fetchall()
        return {name: position for name, position in rows if name in self.by_name}

    def apply_batch(self, batch: Sequence[Envelope], names: Collection[str] | None = None) -> BatchResult:
        """Apply consecutive events to every projection that needs them, checkpoints included, in one commit.

        With ``names``, only those projections (the others are being rebuilt elsewhere: see
        :mod:`.parallel`); ``low`` is then the lowest of their checkpoints.

        Checkpoints are read inside the transaction (``BEGIN IMMEDIATE`` serialises projectors sharing this
        database), so an event a concurrent projector already applied is skipped, and a projection whose
        checkpoint is *before* this batch (someone reset it meanwhile) is left for the next read rather than
        given a gap.
        """
        first, last = batch[0].position, batch[-1].position
        if last - first + 1 != len(batch):
            raise ProjectionError(
                f"the log returned a batch with a gap ({first}..{last}, {len(batch)} events)"
            )
        applied = parked = 0
        with self._transaction("apply events"):
            checkpoints = self.checkpoints()
            if names is not None:
                checkpoints = {name: checkpoints[name] for name in names}
            for projection in self.projections:
                done = checkpoints.get(projection.name)
                if done is None:
                    continue
                if done >= last or done < first - 1:
                    continue
                todo = batch[done - first + 1 :]
                n_parked = self._apply(projection, todo)
                applied += len(todo) - n_parked
                parked += n_parked
                self._set_checkpoint(projection, last)
                checkpoints[projection.name] = last
        return BatchResult(applied, parked, min(checkpoints.values(), default=last))

    def _apply(self, projection: Projection, events: Sequence[Envelope]) -> int:
        """Fast path first (one savepoint for all); on an error redo event by event and park the failures."""
        conn = self.conn
        batch_fn = getattr(projection, "apply_batch", None)
        conn.execute("SAVEPOINT projection")
        try:
            if batch_fn is not None:
                batch_fn(conn, events)
            else:
                for envelope in events:
                    projection.apply(conn, envelope)
        except Exception as e:
            _raise_if_environmental(e, self.path)
            conn.execute("ROLLBACK TO projection")
        else:
            conn.execute("RELEASE projection")
            return 0
        conn.execute("RELEASE projection")
        parked = 0
        for envelope in events:
            conn.execute("SAVEPOINT event")
            try:
                projection.apply(conn, envelope)
            except Exception as e:
                _raise_if_environmental(e, self.path)
                conn.execute("ROLLBACK TO event")
                self._park(projection, envelope, e)
                parked += 1
            conn.execute("RELEASE event")
        return parked

    def _park(self, projection: Projection, envelope: Envelope, error: Exception) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO projector_parked "
            "(name, position, stream, type, event_id, error, attempts, parked_at, envelope) "
            "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?)",
            (
                projection.name,
                envelope.position,
                envelope.stream,
                envelope.type,
                envelope.event_id,
                _describe(error),
                now_rfc3339(),
                ENVELOPE_ENCODER.encode(envelope),
            ),
        )

    def retry(self, names: Sequence[str]) -> tuple[int, int]:
        """Re-apply the parked events of ``names`` in position order; returns (applied now, still parked)."""
        conn = self.conn
        done = failed = 0
        with self._transaction("retry parked events"):
            marks = ",".join("?" * len(names))
            rows = conn.execute(
                f"SELECT name, position, envelope FROM projector_parked WHERE name IN ({marks}) "
                "ORDER BY position, name",
                list(names),
            ).fetchall()
            for name, position, raw in rows:
                projection = self.by_name[name]
                envelope = decode_parked(raw)
                conn.execute("SAVEPOINT retry")
                try:
                    projection.apply(conn, envelope)
                except Exception as e:
                    _raise_if_environmental(e, self.path)
                    conn.execute("ROLLBACK TO retry")
                    conn.execute(
                        "UPDATE projector_parked SET error = ?, attempts = attempts + 1, parked_at = ? "
                        "WHERE name = ? AND position = ?",
                        (_describe(e), now_rfc3339(), name, position),
                    )
                    failed += 1
                else:
                    conn.execute(
                        "DELETE FROM projector_parked WHERE name = ? AND position = ?", (name, position)
                    )
                    done += 1
                conn.execute("RELEASE retry")
        return done, failed

    def adopt(self, part: Path, checkpoints: dict[str, int]) -> None:
        """Take over the tables of the projections ``checkpoints`` names from the read db ``part``.

        ``part`` was built by :func:`.runner.rebuild_part` from the same log, holding only those
        projections; here they were reset (their tables are empty). One transaction copies every table of
        ``part`` (bulk inserts in key order, columns by name), their parked events and their checkpoints.
        """
        conn = self.conn
        with self._translated("adopt the tables rebuilt in parallel"):
            conn.execute("ATTACH DATABASE ? AS part", (str(part),))
        try:
            with self._transaction("adopt the tables rebuilt in parallel"):
                tables = [
                    row[0]
                    for row in conn.execute(
                        "SELECT name FROM part.sqlite_master WHERE type = 'table' "
                        "AND name NOT LIKE 'projector\\_%' ESCAPE '\\' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
                    )
                ]
                for table in tables:
                    columns = ", ".join(
                        f'"{row[1]}"' for row in conn.execute(f'PRAGMA part.table_info("{table}")')
                    )
                    conn.execute(f'DELETE FROM main."{table}"')
                    conn.execute(
                        f'INSERT INTO main."{table}" ({columns}) SELECT {columns} FROM part."{table}"'
                    )
                for name, position in checkpoints.items():
                    conn.execute("DELETE FROM main.projector_parked WHERE name = ?", (name,))
                    conn.execute(
                        "INSERT INTO main.projector_parked SELECT * FROM part.projector_parked WHERE name = ?",
                        (name,),
                    )
                    self._set_checkpoint(self.by_name[name], position)
        finally:
            with self._translated("adopt the tables rebuilt in parallel"):
                conn.execute("DETACH DATABASE part")

    # -- resetting and reporting ----------------------------------------------------------------------

    def reset(self, names: Sequence[str]) -> None:
        """Drop the named projections' rows and parked events and set their checkpoints back to 0."""
        with self._transaction("reset projections"):
            for name in names:
                self._reset(self.by_name[name])

    def _reset(self, projection: Projection) -> None:
        projection.reset(self.conn)
        projection.schema(self.conn)
        self.conn.execute("DELETE FROM projector_parked WHERE name = ?", (projection.name,))
        self._set_checkpoint(projection, 0)

    def _set_checkpoint(self, projection: Projection, position: int, *, insert: bool = False) -> None:
        verb = "INSERT" if insert else "REPLACE"
        self.conn.execute(
            f"{verb} INTO projector_checkpoints (name, version, position, updated_at) VALUES (?, ?, ?, ?)",
            (projection.name, projection.version, position, now_rfc3339()),
        )

    def status(self) -> list[ProjectionStatus]:
        """Checkpoint and parked events of every registered projection, in registry order."""
        with self._translated("read the status"):
            return _status(self.conn, self.projections)

    # -- transactions ---------------------------------------------------------------------------------

    def _transaction(self, what: str) -> _Transaction:
        return _Transaction(self, what)

    def _translated(self, what: str) -> _Translated:
        return _Translated(self.path, what)


class _Translated:
    """Turn sqlite3 errors into ProjectionError naming the read database and the operation."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        if isinstance(error, sqlite3.Error):
            raise ProjectionError(
                f"cannot {self.what} in the read database {self.path}: {error}; "
                "it is disposable: delete it (or run `loopd-es projections rebuild`) to rebuild it from the log"
            ) from error


class _Transaction(_Translated):
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any exception (a crash mid-batch leaves nothing)."""

    def __init__(self, db: ReadDb, what: str) -> None:
        super().__init__(db.path, what)
        self.conn = db.conn

    def __enter__(self) -> None:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            self.__exit__(type(e), e, None)
            raise

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        if error is None:
            try:
                self.conn.execute("COMMIT")
                return
            except sqlite3.Error as e:
                error = e
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        super().__exit__(type(error), error, tb)


def _status(conn: sqlite3.Connection, projections: Sequence[Projection]) -> list[ProjectionStatus]:
    checkpoints = dict(conn.execute("SELECT name, position FROM projector_checkpoints").fetchall())
    parked = {
        name: (count, error)
        for name, count, error in conn.execute(
            "SELECT name, count(*), (SELECT error FROM projector_parked q WHERE q.name = p.name "
            "ORDER BY position DESC LIMIT 1) FROM projector_parked p GROUP BY name"
        )
    }
    return [
        ProjectionStatus(
            p.name,
            p.version,
            checkpoints.get(p.name, 0),
            parked.get(p.name, (0, None))[0],
            parked.get(p.name, (0, None))[1],
        )
        for p in projections
    ]


def settled_status(
    path: Path, projections: Sequence[Projection]
) -> tuple[str | None, list[ProjectionStatus]] | None:
    """The log id the read database follows and its projections' status, read without writing anything.

    None when opening it for the projector would change it first (no database yet, a projection that is new
    or of another version) or SQLite will not open it read-only: only the projector can answer then.
    """
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error:
        return None
    try:
        versions = dict(conn.execute("SELECT name, version FROM projector_checkpoints").fetchall())
        if any(versions.get(p.name) != p.version for p in projections):
            return None
        row = conn.execute("SELECT value FROM projector_meta WHERE key = 'log_id'").fetchone()
        return (None if row is None else str(row[0])), _status(conn, projections)
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _raise_if_environmental(error: Exception, path: Path) -> None:
    """Propagate (and so roll back the whole batch) failures that parking an event would only hide."""
    if isinstance(error, MemoryError) or (
        isinstance(error, sqlite3.OperationalError) and any(w in str(error).lower() for w in _ENVIRONMENTAL)
    ):
        raise ProjectionError(
            f"the read database {path} failed: {error}; nothing of this batch was applied"
        ) from error


def _describe(error: Exception) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 2000 else text[:1997] + "..."


def decode_parked(raw: bytes) -> Envelope:
    """The envelope stored with a parked event (for tools that show parked events)."""
    try:
        return ENVELOPE_DECODER.decode(raw)
    except msgspec.DecodeError as e:
        raise ProjectionError(f"a parked event in the read database does not decode: {e}") from e
