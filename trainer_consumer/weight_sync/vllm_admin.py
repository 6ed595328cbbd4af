"""One vLLM server's weight-update endpoints over HTTP (vLLM 0.32, ``VLLM_SERVER_DEV_MODE=1``).

Thin adapter: each method is one request; a non-200 answer or a transport error raises ``AdminError``
naming the server, the path and vLLM's answer. The endpoint names and bodies are vLLM's own
(``vllm/entrypoints/rl/online/api_router.py``, ``entrypoints/serve/dev/rpc/api_router.py``,
``entrypoints/serve/dev/cache``); docs/weight-sync.md records what this build answers to each.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx

PauseMode = Literal["wait", "abort", "keep"]


class AdminError(RuntimeError):
    def __init__(self, server: str, path: str, message: str, status: int | None = None) -> None:
        super().__init__(f"vLLM {server} {path}: {message}")
        self.server, self.path, self.status = server, path, status


class VLLMAdmin:
    def __init__(self, url: str, client: httpx.AsyncClient, timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self._client = client
        self._timeout_s = timeout_s

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        # vLLM answers a failed /collective_rpc (a reload or worker method that raised) with a 500 and then closes
        # the connection (uvicorn: "Exception in ASGI application"); a pooled connection would carry the sync's
        # next request into that close (ReadError on /reset_prefix_cache after a MoE model's refused scatter
        # prepare, 2026-12-05). Those calls are rare, one connection each.
        headers = {"Connection": "close"} if path == "/collective_rpc" else None
        try:
            response = await self._client.request(method, self.url + path, json=body, headers=headers,
                                                  timeout=self._timeout_s)
        except httpx.HTTPError as exc:
            raise AdminError(self.url, path, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise AdminError(self.url, path, f"HTTP {response.status_code}: {response.text[:500]}",
                             response.status_code)
        return response.json() if response.content else None

    async def healthy(self) -> bool:
        try:
            response = await self._client.get(self.url + "/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def weight_label(self) -> str:
        """``GET /weight_info``: the label the engine attaches to what it samples."""
        return str((await self._call("GET", "/weight_info"))["weight_version"])

    async def pause(self, mode: PauseMode = "wait") -> None:
        """Stop scheduling; ``wait`` lets running requests finish first, new ones are held until resume."""
        await self._call("POST", f"/pause?mode={mode}")

    async def resume(self) -> None:
        await self._call("POST", "/resume")

    async def is_paused(self) -> bool:
        return bool((await self._call("GET", "/is_paused"))["is_paused"])

    async def reload_weights(self, weights_dir: str) -> None:
        """Every worker reloads its weights in place from the safetensors in ``weights_dir``."""
        await self._call("POST", "/collective_rpc",
                         {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}})

    async def worker_call(self, method: str, **kwargs: str) -> list[Any]:
        """``method`` run in every worker (``/collective_rpc``; a worker extension's method, e.g. the element
        scatter of ``vllm_scatter``): each worker's answer. vLLM passes only string arguments."""
        answer = await self._call("POST", "/collective_rpc", {"method": method, "kwargs": kwargs})
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list):
            raise AdminError(self.url, "/collective_rpc", f"{method}: no per-worker results in {answer!r}"[:500])
        return results

    async def reset_prefix_cache(self, preempt_running: bool = False) -> bool:
        """KV blocks computed by the old weights must not serve prompts under the new ones. vLLM resets
        nothing while a request holds blocks (``success: false``); ``preempt_running`` (an update with
        requests frozen in flight, pause mode ``keep``) moves them back to the waiting queue first, so their
        prompt and tokens so far are recomputed under the new weights before they sample again."""
        path = "/reset_prefix_cache" + ("?reset_running_requests=true" if preempt_running else "")
        answer = await self._call("POST", path)
        return bool(answer.get("success", True)) if isinstance(answer, dict) else True

    async def set_weight_label(self, label: str) -> None:
        await self._call("POST", "/update_weight_version", {"new_version": label})

    async def weight_checksums(self) -> dict[str, str]:
        """Per-parameter checksums of the weights the workers hold (``POST /weight_checker``)."""
        return dict((await self._call("POST", "/weight_checker", {"action": "checksum"}))["checksums"])
