"""The large-body check (producers/gateway/body_checks.py): in the pool it refuses exactly what the event loop
would, with the same error; a body that passes is left to the loop; past the queue's bound a body is refused at
once with 503 overloaded, in the caller's protocol."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from producers.gateway.body import parse_json_object
from producers.gateway.body_checks import BodyChecks, check_body
from producers.gateway.errors import GatewayError
from producers.gateway.prompt_bound import StructureLimit, min_prompt_tokens_raw, structure_error


def _loop_refusal(raw: bytes, limit: StructureLimit) -> dict | None:
    try:
        body = parse_json_object(raw)
        error = structure_error(min_prompt_tokens_raw(body, limit.max_token_bytes), limit.context)
        if error is not None:
            raise error
    except GatewayError as exc:
        return {"status": exc.status, "message": exc.message, "kind": exc.kind, "param": exc.param, "code": exc.code}
    return None


@pytest.mark.parametrize("raw", [b'{"model": "\xff"}', b'{"model": ', b"[1, 2]", b"   ",
                                 orjson.dumps({"messages": [{"role": "user", "content": "x"}] * 40}),
                                 orjson.dumps({"input": "word " * 2000}),
                                 orjson.dumps({"messages": [{"role": "user", "content": "hi"}]})])
def test_the_pool_refuses_what_the_loop_refuses_with_the_same_error(raw: bytes) -> None:
    limit = StructureLimit(context=32, max_token_bytes=8)
    assert check_body(raw, limit) == _loop_refusal(raw, limit)


def test_past_the_queue_a_large_body_is_refused_at_once_as_overloaded() -> None:
    raw = orjson.dumps({"messages": [{"role": "user", "content": "x"}] * 50_000})
    checks = BodyChecks(min_bytes=1024, processes=1, queue=1)

    async def two_at_once() -> GatewayError:
        first = asyncio.create_task(checks.check(raw, StructureLimit(context=100)))
        await asyncio.sleep(0)  # the first is in the pool's queue now
        with pytest.raises(GatewayError) as second:
            await checks.check(raw, StructureLimit(context=100))
        with pytest.raises(GatewayError) as refused:  # the first is refused for its length, in the pool
            await first
        assert refused.value.code == "context_length_exceeded" and checks.refused == 1
        await checks.check(b"{}" * 100, None)  # under min_bytes: left to the loop, whatever it holds
        return second.value

    try:
        overloaded = asyncio.run(two_at_once())
    finally:
        checks.close()
    assert overloaded.status == 503 and overloaded.code == "overloaded"
    assert overloaded.body("anthropic")["error"]["type"] == "overloaded_error"
    assert checks.checked == 1


def test_a_check_process_exits_when_its_gateway_is_killed(tmp_path) -> None:
    """A gateway process killed with -9 cannot shut its pool down; its check process must not outlive it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    owner = subprocess.Popen([sys.executable, "-c", (
        "import os, time, pathlib\n"
        "from producers.gateway.body_checks import BodyChecks\n"
        "checks = BodyChecks(min_bytes=1)\n"
        "checks._executor().submit(os.getpid).result(timeout=120)\n"  # spawned and answering
        f"pathlib.Path({str(pid_file)!r}).write_text(str(checks._executor().submit(os.getpid).result()))\n"
        "time.sleep(600)\n")])
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert owner.poll() is None and time.monotonic() < deadline, "the pool never answered"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        os.kill(child, 0)  # alive while its owner is
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
        deadline = time.monotonic() + 30
        while True:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break  # gone (reaped by init once it exited)
            assert time.monotonic() < deadline, f"check process {child} outlived its killed gateway"
            time.sleep(0.2)
    finally:
        owner.kill()
