"""A writer process for the multi-process log tests: ``python log_writer.py MODE URL WRITER COUNT GO_FILE``.

It opens the store, prints ``{"ready": WRITER}``, waits until ``GO_FILE`` exists (so that writers start
together), then appends and prints one JSON line per *acknowledged* event, flushed before the next append:

``mix``   COUNT appends alternating between two shared streams (expected ``any``) and the writer's private
          stream (exact expected versions); every fifth append is a batch of three events.
``race``  read the version of stream ``race``, append one event expecting exactly it; print each win and
          loss; stop when the stream has COUNT events.
"""

from __future__ import annotations

import json
import sys
import uuid

import anyio

from loopd_es.errors import WrongExpectedVersionError
from loopd_es.events.envelope import ANY, Envelope, NewEvent
from loopd_es.log import open_store
from tests.waits import await_until


def ack(env: Envelope) -> None:
    line = {"ack": env.event_id, "position": env.position, "stream": env.stream, "version": env.version}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


async def run(mode: str, url: str, writer: int, count: int, go_file: str) -> int:
    async with await open_store(url) as store:
        print(json.dumps({"ready": writer}), flush=True)
        await await_until("the go file", anyio.Path(go_file).exists, max_interval=0.001)  # start together
        if mode == "mix":
            private, version = f"private-{writer}", 0
            for i in range(count):
                size = 3 if i % 5 == 4 else 1
                events = [
                    NewEvent(type="test.mixed", data={"w": writer, "i": i, "k": k}) for k in range(size)
                ]
                if i % 2:
                    recorded = await store.append(private, events, version)
                    version += size
                else:
                    recorded = await store.append(f"shared-{i % 4 // 2}", events, ANY)
                for env in recorded:
                    ack(env)
        elif mode == "race":
            for _ in range(100_000):
                v = await store.stream_version("race")
                if v >= count:
                    break
                event = NewEvent(type="test.raced", data={"w": writer, "v": v}, event_id=str(uuid.uuid4()))
                try:
                    (env,) = await store.append("race", [event], v)
                except WrongExpectedVersionError as e:
                    print(json.dumps({"lost": v, "actual": e.actual}), flush=True)
                else:
                    print(
                        json.dumps({"won": env.version, "ack": env.event_id, "position": env.position}),
                        flush=True,
                    )
            else:
                return 5
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    return 0


def main() -> int:
    mode, url, writer, count, go_file = sys.argv[1:6]
    return anyio.run(run, mode, url, int(writer), int(count), go_file)


if __name__ == "__main__":
    raise SystemExit(main())
