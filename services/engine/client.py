"""An async client for SGLang's native HTTP API, the only way RelayRL talks to an engine.

Request and response shapes follow SGLang's own source (``python/sglang/srt/entrypoints/
http_server.py`` and the request classes in ``python/sglang/srt/managers/io_struct.py``), so
the same client drives a real SGLang server on GPUs and the built-in CPU engine
(``relayrl engine serve``):

- ``POST /generate`` takes ``GenerateReqInput`` (``input_ids``, ``sampling_params``,
  ``return_logprob``, ``rid``). It answers one object, or a list of ``n`` objects when
  ``sampling_params.n > 1``; each has ``text``, ``output_ids`` and ``meta_info`` with ``id``,
  ``finish_reason`` (``{"type": "stop"|"length"|"abort", ...}``), ``prompt_tokens``,
  ``completion_tokens``, ``output_token_logprobs`` (``[[logprob, token_id, text|null], ...]``)
  and ``weight_version`` (a string; RelayRL writes its integer policy version there).
- Weight updates (``/update_weights_from_disk``, ``/update_weights_from_tensor``,
  ``/init_weights_update_group``, ``/update_weights_from_distributed``,
  ``/destroy_weights_update_group``) answer ``{"success", "message"}`` with status 200, or 400
  when ``success`` is false.
- LoRA: ``/load_lora_adapter`` (``{"lora_name", "lora_path"}``: a peft adapter directory) and
  ``/unload_lora_adapter`` (``{"lora_name"}``) answer ``{"success", "error_message",
  "loaded_adapters"}`` with 200, or 400 when ``success`` is false; ``lora_path`` on
  ``/generate`` names the loaded adapter a request uses (none: the base model), and
  ``/update_weight_version`` (``{"new_version", "abort_all_requests"}``) sets the
  ``weight_version`` the engine reports, which a LoRA switch changes without a weight update.
- ``/pause_generation`` takes ``{"mode": "abort"|"retract"|"in_place"}``;
  ``/continue_generation``, ``/flush_cache``, ``/abort_request`` (``{"rid", "abort_all"}``),
  ``/health``, ``/health_generate`` and ``GET /get_model_info``.

Only failures that leave a request undone are retried (the engine could not be reached, dropped
the connection unanswered, or answered 502, 503 or 504: :func:`engine_unavailable`), with
exponential backoff through :mod:`relayrl.retry`; a 4xx is the caller's mistake and is raised
at once. A call that may be sent twice (such as ``continue_generation``) can also retry a link
that failed mid-answer (:class:`EngineLinkError`), with :func:`engine_link_failed`. Every
failure reaches the caller as an :class:`EngineError`, never as the HTTP library's own.

The client is aiohttp's: its connection pool finds an idle connection in constant time, so
connections stay open between requests however many episodes are in flight. Under httpx
(httpcore 1.0 walks every pooled connection at each request's start and end) a pool that large
took most of the rollout's event loop, and keeping only a few open made the engine accept and
tear down a connection per request; a loopback ``/generate`` of 2 tokens, 64 in flight, cost
1.6-2.1 ms of the rollout's CPU and 1.8-2.3 ms of the engine's under httpx, 0.4 and 1.5 ms here.

Probes (``/health``, ``/health_generate``) have their own session, one fresh connection each, so
a probe never waits for a pooled connection behind generations (a replica with as many requests
in flight as the pool holds would see its busy engine as down), and what it reports is what
that one connection saw: a probe cut off without an answer is a failed probe, even where aiohttp
would reach the engine by sending it again (see :func:`_count_connection`).
"""

from __future__ import annotations

import json as jsonlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

import aiohttp

from relayrl.retry import HTTP_TRANSIENT_STATUS, RetryPolicy, retrying

PauseMode = Literal["abort", "retract", "in_place"]
PAUSE_MODES: tuple[str, ...] = ("abort", "retract", "in_place")
# Idle connections are closed before SGLang's server closes them (uvicorn's timeout_keep_alive,
# 5 s there), so a request never goes out on a connection the server is closing.
_KEEP_ALIVE_S = 4.0


async def _count_connection(_: aiohttp.ClientSession, context: SimpleNamespace, __: Any) -> None:
    """Counts the connections one probe opened. aiohttp sends a GET again, unasked, on a new
    connection when the first was cut without an answer (``ClientSession._request``; no switch
    turns that off: aio-libs/aiohttp#10790). A probe in flight when a partition heals is cut and
    then answered, so the replica would never see the partition; its first connection decides."""
    context.trace_request_ctx["connections"] += 1


class EngineError(RuntimeError):
    """The engine refused a request or answered something that is not SGLang's shape."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class EngineUnavailableError(EngineError):
    """The engine could not be reached or said it is overloaded (502/503/504); worth retrying."""


class EngineLinkError(EngineError):
    """The link failed after the request left (reset mid-answer, or no answer in time): the engine
    may have acted on it, so only a call that may be sent twice is worth sending again."""


def engine_unavailable(exc: BaseException) -> bool:
    """The engine did not take the request (:class:`EngineUnavailableError`): any call may be sent again."""
    return isinstance(exc, EngineUnavailableError)


def engine_link_failed(exc: BaseException) -> bool:
    """:func:`engine_unavailable`, or the link failed after the request left (the engine may have
    acted on it): only calls that may be sent twice are retried on this."""
    return isinstance(exc, (EngineUnavailableError, EngineLinkError))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """SGLang's ``sampling_params``; ``None`` fields are left out so the engine's defaults apply."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    stop_token_ids: Sequence[int] | None = None
    ignore_eos: bool = False

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "n": self.n,
            "ignore_eos": self.ignore_eos,
        }
        if self.stop_token_ids is not None:
            body["stop_token_ids"] = list(self.stop_token_ids)
        return body


@dataclass(slots=True)
class GenerateOutput:
    """One generated sample, parsed from one element of SGLang's ``/generate`` answer."""

    rid: str
    output_ids: list[int]
    # Log-prob of each output token under the engine's sampling distribution, nats.
    logprobs: list[float]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    weight_version: str
    text: str = ""
    meta_info: dict[str, Any] = field(default_factory=dict)

    def token_versions(self) -> list[str]:
        """The weight version that produced each output token.

        From SGLang's ``meta_info.weight_versions`` spans (``{"version", "start", "end"}`` over
        output-token indices) when the engine reports them; otherwise every token gets
        ``weight_version``, which is exact whenever weights did not change mid-request.
        """
        versions = [self.weight_version] * len(self.output_ids)
        for span in self.meta_info.get("weight_versions") or []:
            start, end = int(span["start"]), min(int(span["end"]), len(versions))
            versions[start:end] = [str(span["version"])] * max(0, end - start)
        return versions

    @classmethod
    def from_sglang(cls, body: dict[str, Any]) -> GenerateOutput:
        try:
            meta = body["meta_info"]
            output_ids = [int(t) for t in body["output_ids"]]
            logprob_rows = meta.get("output_token_logprobs") or []
            finish = meta.get("finish_reason") or {}
            return cls(
                rid=str(meta.get("id", "")),
                output_ids=output_ids,
                logprobs=[float(row[0]) for row in logprob_rows],
                finish_reason=str(finish.get("type", "")) if isinstance(finish, dict) else str(finish),
                prompt_tokens=int(meta.get("prompt_tokens", 0)),
                completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
                weight_version=str(meta.get("weight_version", "")),
                text=str(body.get("text", "")),
                meta_info=meta,
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise EngineError(f"/generate answer is not in SGLang's shape: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """SGLang's answer to the weight-update endpoints."""

    success: bool
    message: str
    num_paused_requests: int = 0


@dataclass(frozen=True, slots=True)
class _Answer:
    """An engine's HTTP answer, read whole."""

    method: str
    path: str
    status_code: int
    body: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.body)


class EngineClient:
    """Async, pooled client for one engine at ``base_url`` (e.g. ``http://127.0.0.1:30000``).

    ``timeout`` bounds every call in seconds (generation included, so set it above the
    longest generation); ``retries`` is how many extra attempts a transient failure gets.
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = 600.0,
        retries: int = 3,
        max_connections: int = 512,
        backoff_s: float = 0.2,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        # The loaded LoRA adapter every generate uses unless given another: the rollout's weight
        # sync sets it when it switches to an adapter version. None: the base model.
        self.lora_adapter: str | None = None
        self._backoff_s = backoff_s
        self._timeout = aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 10.0))
        self._max_connections = max_connections
        # Made at the first call: an aiohttp session belongs to the event loop it is made on.
        self._session: aiohttp.ClientSession | None = None
        self._probe_session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=_KEEP_ALIVE_S)
            # No base_url on the session: aiohttp would replace a path in it (an engine behind a
            # gateway's prefix) with the request's, where every call must go under it.
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    def _probes(self) -> aiohttp.ClientSession:
        if self._probe_session is None:
            trace = aiohttp.TraceConfig()
            trace.on_connection_create_start.append(_count_connection)
            connector = aiohttp.TCPConnector(force_close=True)
            self._probe_session = aiohttp.ClientSession(connector=connector, trace_configs=[trace])
        return self._probe_session

    async def aclose(self) -> None:
        for session in (self._session, self._probe_session):
            if session is not None:
                await session.close()
        self._session = self._probe_session = None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, json: Any = None, retry: bool = True) -> _Answer:
        policy = RetryPolicy(attempts=self.retries + 1 if retry else 1, first_wait_s=self._backoff_s, max_wait_s=5.0)
        async for attempt in retrying(f"{method} {self._url(path)}", engine_unavailable, policy):
            with attempt:
                return await self._send_once(method, path, json)
        raise AssertionError("unreachable: tenacity returns or re-raises")

    def _url(self, path: str) -> str:
        """Every call goes under the engine URL's path (a gateway's prefix included)."""
        return f"{self.base_url}{path}"

    async def _send_once(self, method: str, path: str, json: Any) -> _Answer:
        url = self._url(path)
        where = f"{method} {url}"
        try:
            async with self._http().request(method, url, json=json) as response:
                answer = _Answer(method, path, response.status, await response.read())
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise EngineUnavailableError(f"{where}: cannot connect ({exc!r})") from exc
        except aiohttp.ServerDisconnectedError as exc:
            # The engine closed the connection without answering (e.g. it was killed mid-request).
            raise EngineUnavailableError(f"{where}: connection dropped ({exc!r})") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineLinkError(f"{where}: link failed after the request was sent ({exc!r})") from exc
        if answer.status_code in HTTP_TRANSIENT_STATUS:
            raise EngineUnavailableError(f"{where}: {answer.status_code} {answer.text[:200]}", answer.status_code)
        return answer

    @staticmethod
    def _raise_for_status(response: _Answer) -> None:
        if response.is_success:
            return
        detail = response.text[:500]
        status = response.status_code
        raise EngineError(f"{response.method} {response.path} -> {status}: {detail}", status)

    # --- generation -------------------------------------------------------------------

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams,
        return_logprob: bool = True,
        rid: str | None = None,
        lora_path: str | None = None,
    ) -> list[GenerateOutput]:
        """Generates ``sampling_params.n`` samples for one prompt; always returns a list of ``n``.

        ``lora_path`` is the name of a loaded LoRA adapter (SGLang's field name); None uses
        :attr:`lora_adapter` (None there too: the base model).
        """
        lora_path = lora_path if lora_path is not None else self.lora_adapter
        body: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": sampling_params.to_json(),
            "return_logprob": return_logprob,
        }
        if rid is not None:
            body["rid"] = rid
        if lora_path is not None:
            body["lora_path"] = lora_path
        payload = await self._post_generate(body)
        items = payload if isinstance(payload, list) else [payload]
        return [GenerateOutput.from_sglang(item) for item in items]

    async def generate_batch(
        self,
        inputs: Sequence[Sequence[int]],
        sampling_params: Sequence[SamplingParams],
        rids: Sequence[str],
        return_logprob: bool = True,
    ) -> list[GenerateOutput]:
        """One sample for each of ``inputs`` in one request (SGLang's batch form of ``/generate``:
        lists of ``input_ids``, ``sampling_params`` and ``rid``); the outputs in input order."""
        if not len(inputs) == len(sampling_params) == len(rids):
            raise ValueError(f"{len(inputs)} inputs, {len(sampling_params)} sampling params and {len(rids)} rids")
        if any(p.n != 1 for p in sampling_params):
            raise ValueError("a batched generate asks for one sample per input (n = 1)")
        body: dict[str, Any] = {
            "input_ids": [list(ids) for ids in inputs],
            "sampling_params": [p.to_json() for p in sampling_params],
            "rid": list(rids),
            "return_logprob": return_logprob,
        }
        if self.lora_adapter is not None:
            body["lora_path"] = [self.lora_adapter] * len(inputs)
        payload = await self._post_generate(body)
        if not isinstance(payload, list) or len(payload) != len(inputs):
            raise EngineError(f"a batch of {len(inputs)} inputs was answered with {_count(payload)} outputs")
        return [GenerateOutput.from_sglang(item) for item in payload]

    async def _post_generate(self, body: dict[str, Any]) -> Any:
        """One ``/generate`` round trip (single or batch form); the decoded JSON answer."""
        response = await self._request("POST", "/generate", body)
        self._raise_for_status(response)
        return response.json()

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        response = await self._request("POST", "/abort_request", {"rid": rid, "abort_all": abort_all})
        self._raise_for_status(response)

    async def pause_generation(self, mode: PauseMode = "abort") -> dict[str, Any]:
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        response = await self._request("POST", "/pause_generation", {"mode": mode})
        self._raise_for_status(response)
        return response.json()

    async def continue_generation(self) -> dict[str, Any]:
        response = await self._request("POST", "/continue_generation", {})
        self._raise_for_status(response)
        return response.json()

    async def flush_cache(self) -> bool:
        """True when the engine flushed its cache (SGLang refuses with 400 while requests run)."""
        response = await self._request("POST", "/flush_cache")
        return response.status_code == 200

    # --- weights --------------------------------------------------------------------

    async def _update(self, path: str, body: dict[str, Any], retry: bool = True) -> UpdateResult:
        response = await self._request("POST", path, body, retry=retry)
        try:
            payload = response.json()
            return UpdateResult(
                success=bool(payload["success"]),
                message=str(payload.get("message", "")),
                num_paused_requests=int(payload.get("num_paused_requests", 0)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            self._raise_for_status(response)
            raise EngineError(f"{path} answer is not in SGLang's shape: {response.text[:200]}") from exc

    async def update_weights_from_disk(
        self,
        model_path: str,
        weight_version: str | int | None = None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> UpdateResult:
        body = _update_body(weight_version, abort_all_requests, flush_cache, load_format, model_path=model_path)
        return await self._update("/update_weights_from_disk", body)

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: Sequence[str],
        load_format: str | None = None,
        weight_version: str | int | None = None,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
    ) -> UpdateResult:
        """Tensors shared by handle on the engine's host (CUDA IPC, or shared memory on a CPU): one
        base64 ``MultiprocessingSerializer`` payload per tensor-parallel rank, in ``load_format``."""
        body = _update_body(
            weight_version,
            abort_all_requests,
            flush_cache,
            load_format,
            serialized_named_tensors=list(serialized_named_tensors),
        )
        return await self._update("/update_weights_from_tensor", body)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> UpdateResult:
        # No retry: the engine joins a collective rendezvous, which must not be entered twice.
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return await self._update("/init_weights_update_group", body, retry=False)

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        group_name: str = "weight_update_group",
        weight_version: str | int | None = None,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
    ) -> UpdateResult:
        body: dict[str, Any] = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "flush_cache": flush_cache,
            "abort_all_requests": abort_all_requests,
        }
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        # No retry: the broadcast on the sender side has already been matched to this call.
        return await self._update("/update_weights_from_distributed", body, retry=False)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> UpdateResult:
        return await self._update("/destroy_weights_update_group", {"group_name": group_name})

    # --- LoRA adapters -------------------------------------------------------------

    async def _lora(self, path: str, body: dict[str, Any]) -> UpdateResult:
        response = await self._request("POST", path, body)
        try:
            payload = response.json()
            return UpdateResult(success=bool(payload["success"]), message=str(payload.get("error_message") or ""))
        except (ValueError, KeyError, TypeError) as exc:
            self._raise_for_status(response)
            raise EngineError(f"{path} answer is not in SGLang's shape: {response.text[:200]}") from exc

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> UpdateResult:
        """Loads the peft adapter directory ``lora_path`` under ``lora_name`` (SGLang's ``/load_lora_adapter``)."""
        return await self._lora("/load_lora_adapter", {"lora_name": lora_name, "lora_path": lora_path})

    async def unload_lora_adapter(self, lora_name: str) -> UpdateResult:
        """Unloads ``lora_name``; requests already using it finish with it."""
        return await self._lora("/unload_lora_adapter", {"lora_name": lora_name})

    async def update_weight_version(self, new_version: str | int, abort_all_requests: bool = False) -> UpdateResult:
        """Sets the ``weight_version`` the engine reports (SGLang's ``/update_weight_version``)."""
        body = {"new_version": str(new_version), "abort_all_requests": abort_all_requests}
        return await self._update("/update_weight_version", body)

    # --- health and info --------------------------------------------------------------

    async def health(self) -> bool:
        """True when the engine process answers ``/health`` with 200 (no retries: a probe)."""
        return await self._probe("/health", timeout_s=5.0)

    async def health_generate(self) -> bool:
        """True when the engine can run a one-token generation (``/health_generate``)."""
        return await self._probe("/health_generate", timeout_s=30.0)

    async def _probe(self, path: str, timeout_s: float) -> bool:
        # ceil_threshold: aiohttp rounds a timeout of 5 s or more up to the loop clock's next whole
        # second, which let the 5 s health probe wait up to 6.
        timeout = aiohttp.ClientTimeout(total=timeout_s, ceil_threshold=math.inf)
        attempts = {"connections": 0}
        try:
            async with self._probes().get(self._url(path), timeout=timeout, trace_request_ctx=attempts) as response:
                return response.status == 200 and attempts["connections"] == 1
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def model_info(self) -> dict[str, Any]:
        """``/get_model_info`` (newer SGLang also serves ``/model_info``, tried when the first is absent)."""
        response = await self._request("GET", "/get_model_info")
        if response.status_code == 404:
            response = await self._request("GET", "/model_info")
        self._raise_for_status(response)
        return response.json()

    async def weight_version(self) -> str:
        """The engine's current ``weight_version`` string, from ``/get_model_info``."""
        return str((await self.model_info()).get("weight_version", ""))


def _count(payload: Any) -> str:
    return str(len(payload)) if isinstance(payload, list) else "a single object instead of a list of"


def _update_body(
    weight_version: str | int | None,
    abort_all_requests: bool,
    flush_cache: bool,
    load_format: str | None,
    **fields: Any,
) -> dict[str, Any]:
    """A weight update's request in SGLang's shape: ``fields`` and the options every update takes."""
    body: dict[str, Any] = {**fields, "abort_all_requests": abort_all_requests, "flush_cache": flush_cache}
    if weight_version is not None:
        body["weight_version"] = str(weight_version)
    if load_format is not None:
        body["load_format"] = load_format
    return body
