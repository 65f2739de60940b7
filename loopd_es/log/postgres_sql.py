"""The PostgreSQL log's schema and statements, kept apart from the code that runs them.

``loopd_append_v4`` is the fast path of a commit: one statement that takes the position lock, checks that every
stream is at its expected version, inserts every event and notifies followers — or, when a version is off,
writes nothing and returns NULL, and when an event id is already recorded (a retry) fails on the UNIQUE index
and so writes nothing either: the store then resolves the group on its careful path (retries, conflicts, a
stream twice in one group). One statement instead of seven saves most of psycopg's per-statement cost (~0.1 ms
each) on a single-event append. v3 looked every id up before inserting; the index checks them anyway, and the
look-up was a fifth of the time a 100-event batch holds the position lock (docs/performance.md).
"""

from __future__ import annotations

from typing import Final

from psycopg import sql

LOCK_KEY: Final = 0x6C6F6F7064  # "loopd": the advisory lock that orders position assignment
CHANNEL: Final = "loopd_es_events"
COLUMNS: Final = "position, stream, version, event_id, type, schema_version, recorded_at, causation_id, correlation_id, data"
ANY_VERSION: Final = -1
NO_STREAM_VERSION: Final = -2
EXISTS_VERSION: Final = -3

TABLE: Final = sql.SQL("""
CREATE TABLE IF NOT EXISTS {t} (
    position       BIGINT   PRIMARY KEY,
    stream         TEXT     NOT NULL,
    version        BIGINT   NOT NULL,
    event_id       TEXT     NOT NULL UNIQUE,
    type           TEXT     NOT NULL,
    schema_version INTEGER  NOT NULL,
    recorded_at    TEXT     NOT NULL,
    causation_id   TEXT,
    correlation_id TEXT,
    data           BYTEA    NOT NULL,
    UNIQUE (stream, version)
)
""")

APPEND_FUNCTION_NAME: Final = "loopd_append_v4"
APPEND_FUNCTION: Final = sql.SQL("""
CREATE OR REPLACE FUNCTION {f}(
    p_streams text[], p_expected bigint[], p_counts int[], p_ids text[], p_types text[], p_schema_versions int[],
    p_causation text[], p_correlation text[], p_data bytea[], p_recorded_at text, p_tag text
) RETURNS bigint[] LANGUAGE plpgsql
-- every lookup here is by a unique index; a plan cached while the table was small must not stay a scan
SET enable_seqscan = off
AS $$
DECLARE
    head bigint;
    found bigint;
    firsts bigint[] := ARRAY[]::bigint[];
    i int;
    lo int := 1;
    hi int;
BEGIN
    PERFORM pg_advisory_xact_lock({lock});
    SELECT coalesce(max(position), 0) INTO head FROM {t};
    firsts := firsts || head;
    FOR i IN 1 .. array_length(p_streams, 1) LOOP  -- every check before any insert: all parts or none
        SELECT coalesce(max(version), 0) INTO found FROM {t} WHERE stream = p_streams[i];
        IF (p_expected[i] = {no_stream} AND found <> 0) OR (p_expected[i] = {exists} AND found = 0)
           OR (p_expected[i] >= 0 AND found <> p_expected[i]) THEN
            RETURN NULL;
        END IF;
        firsts := firsts || found;
    END LOOP;
    FOR i IN 1 .. array_length(p_streams, 1) LOOP
        hi := lo + p_counts[i] - 1;
        INSERT INTO {t} ({columns})
        SELECT head + e.o, p_streams[i], firsts[i + 1] + e.o, e.id, e.ty, e.sv, p_recorded_at, e.ca, e.co, e.da
        FROM unnest(p_ids[lo:hi], p_types[lo:hi], p_schema_versions[lo:hi], p_causation[lo:hi],
                    p_correlation[lo:hi], p_data[lo:hi]) WITH ORDINALITY AS e(id, ty, sv, ca, co, da, o);
        head := head + p_counts[i];
        lo := hi + 1;
    END LOOP;
    PERFORM pg_notify({channel}, p_tag || head);
    RETURN firsts;
END $$
""")

LOCK: Final = "SELECT pg_advisory_xact_lock(%s)"
NOTIFY: Final = "SELECT pg_notify(%s, %s)"
STATEMENTS: Final = {
    "fast": sql.SQL("SELECT {f}(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"),
    "by_id": sql.SQL("SELECT " + COLUMNS + " FROM {t} WHERE event_id = ANY(%s::text[])"),
    "versions": sql.SQL(
        "SELECT s, (SELECT coalesce(max(version), 0) FROM {t} WHERE stream = s) FROM unnest(%s::text[]) s"
    ),
    "head": sql.SQL("SELECT coalesce(max(position), 0) FROM {t}"),
    "insert": sql.SQL(
        "INSERT INTO {t} (" + COLUMNS + ") SELECT * FROM unnest(%s::bigint[], %s::text[], %s::bigint[],"
        " %s::text[], %s::text[], %s::int[], %s::text[], %s::text[], %s::text[], %s::bytea[])"
    ),
}
