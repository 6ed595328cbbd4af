"""Environment SDK for white-box loops: one rollout attempt as a context manager.

    with Rollout("http://127.0.0.1:8400", task_input={"question": q}, group_key={"task": "t1"}) as r:
        client = openai.OpenAI(base_url=r.openai_base_url, api_key=r.api_key)
        reply = client.chat.completions.create(model=..., messages=...)
        r.event("TOOL_RESULT", {"output": "..."}, call_index=0)
    # finished: SUCCESS on a clean exit, FAILURE when the block raised (unless finished explicitly)

``AsyncRollout`` is the same over ``httpx.AsyncClient``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx


class RolloutError(RuntimeError):
    """The gateway refused a request; ``status`` and ``body`` are its answer."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        super().__init__(f"HTTP {status}: {message or body}")
        self.status, self.body = status, body


def _checked(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if response.status_code >= 400:
        raise RolloutError(response.status_code, body)
    return body


class _RolloutBase:
    def __init__(self, gateway_url: str, *, task_input: Any = None, group_id: str | None = None,
                 group_key: dict[str, str] | None = None, expected_group_size: int | None = None,
                 metadata: dict[str, Any] | None = None, rollout_id: str | None = None,
                 admin_key: str | None = None, script: list[str | list[int]] | None = None) -> None:
        self.gateway_url = gateway_url.rstrip("/")
        self._start_body: dict[str, Any] = {"task_input": task_input, "group_key": dict(group_key or {}),
                                            "metadata": dict(metadata or {})}
        if script is not None:  # tests: the engine emits these completions in order (see env_api)
            self._start_body["script"] = list(script)
        if group_id is not None:
            self._start_body["group_id"] = group_id
        if expected_group_size is not None:
            self._start_body["expected_group_size"] = expected_group_size
        if rollout_id is not None:
            self._start_body["rollout_id"] = rollout_id
        self._admin_headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self.started: dict[str, Any] | None = None
        self.finished: dict[str, Any] | None = None

    def _info(self, key: str) -> Any:
        if self.started is None:
            raise RuntimeError("the rollout is not started; use it as a context manager or call start()")
        return self.started[key]

    @property
    def rollout_id(self) -> str:
        return self._info("rollout_id")

    @property
    def attempt_id(self) -> str:
        return self._info("attempt_id")

    @property
    def api_key(self) -> str:
        """A per-attempt key: with the plain gateway URL it identifies the attempt on its own."""
        return self._info("api_key")

    @property
    def openai_base_url(self) -> str:
        return self._info("openai_base_url")

    @property
    def anthropic_base_url(self) -> str:
        return self._info("anthropic_base_url")

    @property
    def headers(self) -> dict[str, str]:
        return dict(self._info("headers"))

    def _attempt_path(self) -> str:
        return f"{self.gateway_url}/v1/rollouts/{self.rollout_id}/attempts/{self.attempt_id}"

    def _attempt_headers(self) -> dict[str, str]:
        return self._admin_headers or {"Authorization": f"Bearer {self.api_key}"}

    @staticmethod
    def _event_body(kind: str, payload: Any, name: str | None, call_id: str | None,
                    call_index: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": kind, "payload": payload}
        for key, value in (("name", name), ("call_id", call_id), ("call_index", call_index)):
            if value is not None:
                body[key] = value
        return body

    def openai_client(self, **kwargs: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.openai_base_url, api_key=self.api_key, **kwargs)

    def anthropic_client(self, **kwargs: Any) -> Any:
        import anthropic

        return anthropic.Anthropic(base_url=self.anthropic_base_url, api_key=self.api_key, **kwargs)


class Rollout(_RolloutBase):
    def __init__(self, gateway_url: str, *, client: httpx.Client | None = None, timeout_s: float = 60.0,
                 **kwargs: Any) -> None:
        super().__init__(gateway_url, **kwargs)
        self._own_client = client is None
        self._http = client or httpx.Client(timeout=timeout_s)

    def start(self) -> dict[str, Any]:
        self.started = _checked(self._http.post(f"{self.gateway_url}/v1/rollouts", json=self._start_body,
                                                headers=self._admin_headers))
        return self.started

    def event(self, kind: str, payload: Any = None, *, name: str | None = None, call_id: str | None = None,
              call_index: int | None = None) -> dict[str, Any]:
        """Post one environment event (STEP, TOOL_RESULT, OBSERVATION, STATE, ARTIFACT)."""
        body = self._event_body(kind, payload, name, call_id, call_index)
        return _checked(self._http.post(f"{self._attempt_path()}/events", json=body,
                                        headers=self._attempt_headers()))["events"][0]

    def finish(self, status: str = "SUCCESS", final_artifacts: Any = None) -> dict[str, Any]:
        body = {"status": status, "final_artifacts": {} if final_artifacts is None else final_artifacts}
        self.finished = _checked(self._http.post(f"{self._attempt_path()}/finish", json=body,
                                                 headers=self._attempt_headers()))
        return self.finished

    def close(self) -> None:
        if self._own_client:
            self._http.close()

    def __enter__(self) -> Rollout:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self.started is not None and self.finished is None:
                self.finish("FAILURE" if exc_type is not None else "SUCCESS",
                            {"error": repr(exc)} if exc is not None else None)
        finally:
            self.close()


class AsyncRollout(_RolloutBase):
    def __init__(self, gateway_url: str, *, client: httpx.AsyncClient | None = None, timeout_s: float = 60.0,
                 **kwargs: Any) -> None:
        super().__init__(gateway_url, **kwargs)
        self._own_client = client is None
        self._http = client or httpx.AsyncClient(timeout=timeout_s)

    async def start(self) -> dict[str, Any]:
        self.started = _checked(await self._http.post(f"{self.gateway_url}/v1/rollouts",
                                                      json=self._start_body, headers=self._admin_headers))
        return self.started

    async def event(self, kind: str, payload: Any = None, *, name: str | None = None,
                    call_id: str | None = None, call_index: int | None = None) -> dict[str, Any]:
        body = self._event_body(kind, payload, name, call_id, call_index)
        return _checked(await self._http.post(f"{self._attempt_path()}/events", json=body,
                                              headers=self._attempt_headers()))["events"][0]

    async def finish(self, status: str = "SUCCESS", final_artifacts: Any = None) -> dict[str, Any]:
        body = {"status": status, "final_artifacts": {} if final_artifacts is None else final_artifacts}
        self.finished = _checked(await self._http.post(f"{self._attempt_path()}/finish", json=body,
                                                       headers=self._attempt_headers()))
        return self.finished

    async def aclose(self) -> None:
        if self._own_client:
            await self._http.aclose()

    def openai_client(self, **kwargs: Any) -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=self.openai_base_url, api_key=self.api_key, **kwargs)

    def anthropic_client(self, **kwargs: Any) -> Any:
        import anthropic

        return anthropic.AsyncAnthropic(base_url=self.anthropic_base_url, api_key=self.api_key, **kwargs)

    async def __aenter__(self) -> AsyncRollout:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            if self.started is not None and self.finished is None:
                await self.finish("FAILURE" if exc_type is not None else "SUCCESS",
                                  {"error": repr(exc)} if exc is not None else None)
        finally:
            await self.aclose()


def send_feedback(gateway_url: str, target: dict[str, str], kind: str, *, admin_key: str | None = None,
                  client: httpx.Client | None = None, timeout_s: float = 30.0, **fields: Any) -> dict[str, Any]:
    """``POST /v1/feedback`` (producers/gateway/feedback_api.py): ``target`` names one of ``response_id``,
    ``call_id``, ``session_id``, ``rollout_id``; ``fields`` carry the kind's value (``binary``, ``rating`` with
    ``rating_scale``, ``outcome`` with ``edit_distance``, ``task_success`` with ``details``, ``text``) and
    ``source``, ``id``, ``supersedes``, ``event_time``. Returns the stored event's id; a refusal raises
    RolloutError with the gateway's answer."""
    url = f"{gateway_url.rstrip('/')}/v1/feedback"
    body = {"target": dict(target), "kind": kind, **fields}
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    if client is not None:
        return _checked(client.post(url, json=body, headers=headers))
    with httpx.Client(timeout=timeout_s) as http:
        return _checked(http.post(url, json=body, headers=headers))
