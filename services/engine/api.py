"""SGLang's native HTTP endpoints, served by the built-in engine with SGLang's request and response shapes."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request, status
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from services.engine.lora import read_adapter
from services.engine.profiler import ProfileError, ProfileRequest
from services.engine.sampling import SamplingConfig
from services.engine.scheduler import Sequence
from services.engine.state import EngineState
from services.engine.streaming import DONE, SampleStream, event, sse_events


class _SGLangBody(BaseModel):
    # SGLang accepts many more fields than the CPU engine uses; unknown ones are ignored.
    model_config = ConfigDict(extra="ignore")


class GenerateReqInput(_SGLangBody):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | list[bool] | None = None
    rid: str | list[str] | None = None
    stream: bool = False
    # The name of a loaded LoRA adapter per prompt (SGLang's lora_path); None: the base model.
    lora_path: str | list[str | None] | None = None


class LoadLoRAAdapterReqInput(_SGLangBody):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    pinned: bool = False


class UnloadLoRAAdapterReqInput(_SGLangBody):
    lora_name: str = Field(min_length=1)


class UpdateWeightVersionReqInput(_SGLangBody):
    new_version: str
    abort_all_requests: bool = True


class UpdateWeightFromDiskReqInput(_SGLangBody):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class UpdateWeightsFromTensorReqInput(_SGLangBody):
    # One base64 string per tensor-parallel rank (SGLang's MultiprocessingSerializer with output_str=True).
    serialized_named_tensors: list[str]
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class InitWeightsUpdateGroupReqInput(_SGLangBody):
    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1)
    world_size: int = Field(ge=2)
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class UpdateWeightsFromDistributedReqInput(_SGLangBody):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class DestroyWeightsUpdateGroupReqInput(_SGLangBody):
    group_name: str = "weight_update_group"


class PauseGenerationReqInput(_SGLangBody):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ProfileReqInput(_SGLangBody):
    # SGLang's other fields (with_stack, record_shapes, profile_by_stage, ...) are accepted and ignored.
    output_dir: str | None = None
    start_step: int | None = Field(None, ge=0)
    num_steps: int | None = Field(None, ge=1)
    activities: list[str] | None = None


class AbortReq(_SGLangBody):
    rid: str = ""
    abort_all: bool = False


# Bounds the memory one request can claim; GRPO groups are far smaller.
MAX_PARALLEL_SAMPLES = 1024

_SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "ignore_eos"}


def _sampling(params: dict[str, Any]) -> tuple[SamplingConfig, int]:
    try:
        n = int(params.get("n", 1))
        kwargs = {k: v for k, v in params.items() if k in _SAMPLING_KEYS and v is not None}
        if "stop_token_ids" in kwargs:
            kwargs["stop_token_ids"] = tuple(int(t) for t in kwargs["stop_token_ids"])
        config = SamplingConfig(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad sampling_params: {exc}") from exc
    if not 1 <= n <= MAX_PARALLEL_SAMPLES:
        raise ValueError(f"sampling_params.n must be in [1, {MAX_PARALLEL_SAMPLES}], got {n}")
    return config, n


def _pick(value: Any, index: int, batch: int) -> Any:
    if isinstance(value, list):
        if len(value) != batch:
            raise ValueError(f"per-request list has {len(value)} entries for {batch} prompts")
        return value[index]
    return value


def _ok(message: str, success: bool = True, **extra: Any) -> JSONResponse:
    return JSONResponse(
        {"success": success, "message": message, **extra},
        status_code=status.HTTP_200_OK if success else status.HTTP_400_BAD_REQUEST,
    )


def sglang_router(state: EngineState) -> APIRouter:
    router = APIRouter()
    scheduler = state.scheduler

    def prompts_of(obj: GenerateReqInput) -> tuple[list[list[int]], bool]:
        if (obj.text is None) == (obj.input_ids is None):
            raise ValueError("give exactly one of text or input_ids")
        if obj.input_ids is not None:
            ids = obj.input_ids
            if ids and isinstance(ids[0], list):
                return [list(p) for p in ids], False  # type: ignore[arg-type]
            return [list(ids)], True  # type: ignore[arg-type]
        texts = [obj.text] if isinstance(obj.text, str) else list(obj.text or [])
        return [state.encode(t) for t in texts], isinstance(obj.text, str)

    def sequences_of(obj: GenerateReqInput, loop: asyncio.AbstractEventLoop) -> tuple[list[Sequence], bool]:
        prompts, single = prompts_of(obj)
        sequences: list[Sequence] = []
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError("input_ids is empty")
            if any(t < 0 or t >= state.vocab_size for t in prompt):
                raise ValueError(f"input_ids must be in [0, {state.vocab_size})")
            if len(prompt) >= state.context_length:
                raise ValueError(
                    f"The input ({len(prompt)} tokens) is longer than the model's context length "
                    f"({state.context_length} tokens)."
                )
            config, n = _sampling(_pick(obj.sampling_params, i, len(prompts)) or {})
            rid = _pick(obj.rid, i, len(prompts)) or uuid.uuid4().hex
            return_logprob = bool(_pick(obj.return_logprob, i, len(prompts)))
            lora_name = _pick(obj.lora_path, i, len(prompts))
            for j in range(n):
                sequences.append(
                    Sequence(
                        rid=rid if n == 1 else f"{rid}-{j}",
                        parent_rid=rid,
                        prompt_ids=prompt,
                        config=config,
                        return_logprob=return_logprob,
                        loop=loop,
                        future=loop.create_future(),
                        lora_name=lora_name,
                    )
                )
        return sequences, single

    def acquire_adapters(sequences: list[Sequence]) -> None:
        """Pins each request's adapter (on the scheduler thread); ValueError, pinning none, if one is not loaded."""
        taken = []
        try:
            for seq in sequences:
                seq.adapter = state.lora.acquire(seq.lora_name)
                taken.append(seq)
        except ValueError:
            for seq in taken:
                state.lora.release(seq.adapter)
                seq.adapter = None
            raise
        state.metrics.lora_requests.inc(sum(1 for seq in sequences if seq.adapter is not None))

    @router.api_route("/generate", methods=["POST", "PUT"])
    async def generate(obj: GenerateReqInput) -> Any:
        try:
            sequences, single = sequences_of(obj, asyncio.get_running_loop())
            if obj.lora_path is not None:
                await scheduler.call(lambda: acquire_adapters(sequences))
        except ValueError as exc:
            # SGLang's /generate answers a bad request (such as a prompt longer than the context) this way;
            # a streamed one as an event of the stream, which SGLang has already begun.
            error = {"error": {"message": str(exc)}}
            if obj.stream:
                return StreamingResponse(iter([event(error), DONE]), media_type="text/event-stream")
            return JSONResponse(error, status_code=status.HTTP_400_BAD_REQUEST)
        if obj.stream:
            batched = not (single and len(sequences) == 1)
            settings = state.settings
            streams = [
                SampleStream(
                    seq,
                    state.text,
                    i if batched else None,
                    settings.incremental_streaming_output,
                    settings.stream_interval,
                )
                for i, seq in enumerate(sequences)
            ]
            scheduler.submit(sequences)
            events = sse_events(streams, lambda chunk: state.record_finished([chunk]))
            return StreamingResponse(events, media_type="text/event-stream")
        scheduler.submit(sequences)
        try:
            results = await asyncio.gather(*(s.future for s in sequences))
        except asyncio.CancelledError:
            for seq in sequences:
                seq.future.cancel()
            raise
        state.record_finished(results)
        if single and len(results) == 1:
            return results[0]
        return results

    @router.post("/update_weights_from_disk")
    async def update_weights_from_disk(obj: UpdateWeightFromDiskReqInput) -> JSONResponse:
        try:
            tensors = await asyncio.to_thread(state.read_checkpoint, obj.model_path)
            in_place = state.serves_in_place(obj.model_path)
            await scheduler.call(lambda: state.apply(tensors, obj.weight_version, obj.abort_all_requests, in_place))
        except (ValueError, OSError) as exc:
            state.metrics.weight_update_failures.inc()
            return _ok(f"Failed to update weights: {exc}", success=False, num_paused_requests=0)
        message = "Succeeded to update model weights."
        if obj.weight_version is not None:
            message += f" Weight version updated to {obj.weight_version}."
        return _ok(message, num_paused_requests=0)

    @router.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(obj: UpdateWeightsFromTensorReqInput) -> JSONResponse:
        # Handles are opened beside generation; the scheduler's pause covers the copy into the parameters only.
        try:
            tensors = await asyncio.to_thread(state.open_shared_tensors, obj.serialized_named_tensors, obj.load_format)
            await scheduler.call(lambda: state.apply(tensors, obj.weight_version, obj.abort_all_requests))
        except ValueError as exc:
            state.metrics.weight_update_failures.inc()
            return _ok(f"Failed to update weights: {exc}", success=False)
        message = "Succeeded to update model weights."
        if obj.weight_version is not None:
            message += f" Weight version updated to {obj.weight_version}."
        return _ok(message)

    @router.post("/load_lora_adapter")
    async def load_lora_adapter(obj: LoadLoRAAdapterReqInput) -> JSONResponse:
        try:
            adapter = await asyncio.to_thread(read_adapter, obj.lora_name, obj.lora_path, state.model)
            await scheduler.call(lambda: state.lora.load(adapter))
        except ValueError as exc:
            state.metrics.weight_update_failures.inc()
            return _lora_result(False, str(exc))
        state.metrics.weight_updates.inc()
        return _lora_result(True, "")

    @router.post("/unload_lora_adapter")
    async def unload_lora_adapter(obj: UnloadLoRAAdapterReqInput) -> JSONResponse:
        try:
            await scheduler.call(lambda: state.lora.unload(obj.lora_name))
        except ValueError as exc:
            return _lora_result(False, str(exc))
        return _lora_result(True, "")

    def _lora_result(success: bool, error: str) -> JSONResponse:
        # SGLang's LoRAUpdateOutput: 200 on success, 400 with error_message otherwise.
        loaded = state.lora.loaded()
        return JSONResponse(
            {"success": success, "error_message": error or None, "loaded_adapters": loaded},
            status_code=status.HTTP_200_OK if success else status.HTTP_400_BAD_REQUEST,
        )

    @router.post("/update_weight_version")
    async def update_weight_version(obj: UpdateWeightVersionReqInput) -> JSONResponse:
        await scheduler.call(lambda: state.set_weight_version(obj.new_version, obj.abort_all_requests))
        return JSONResponse(
            {"success": True, "message": f"Weight version updated to {obj.new_version}", "new_version": obj.new_version}
        )

    @router.post("/init_weights_update_group")
    async def init_weights_update_group(obj: InitWeightsUpdateGroupReqInput) -> JSONResponse:
        try:
            await asyncio.to_thread(
                state.receiver.init_group,
                obj.master_address,
                obj.master_port,
                obj.rank_offset,
                obj.world_size,
                obj.group_name,
                obj.backend,
            )
        except (ValueError, RuntimeError) as exc:
            return _ok(f"Failed to init weights update group: {exc}", success=False)
        return _ok("Succeeded to initialize custom process group.")

    @router.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(obj: UpdateWeightsFromDistributedReqInput) -> JSONResponse:
        def receive_and_apply() -> None:
            state.receive_and_apply(
                obj.group_name, obj.names, obj.dtypes, obj.shapes, obj.weight_version, obj.abort_all_requests
            )

        try:
            await scheduler.call(receive_and_apply)
        except (ValueError, RuntimeError) as exc:
            state.metrics.weight_update_failures.inc()
            return _ok(f"Failed to update weights: {exc}", success=False)
        message = "Succeeded to update parameter online."
        if obj.weight_version is not None:
            message += f" Weight version updated to {obj.weight_version}."
        return _ok(message)

    @router.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(obj: DestroyWeightsUpdateGroupReqInput) -> JSONResponse:
        try:
            await asyncio.to_thread(state.receiver.destroy, obj.group_name)
        except (ValueError, RuntimeError) as exc:
            return _ok(f"Failed to destroy weights update group: {exc}", success=False)
        return _ok("Succeeded to destroy custom process group.")

    @router.post("/pause_generation")
    async def pause_generation(request: Request) -> JSONResponse:
        # SGLang versions before the `mode` field send no body; that means abort.
        raw = await request.body()
        obj = PauseGenerationReqInput.model_validate_json(raw) if raw.strip() else PauseGenerationReqInput()
        await scheduler.call(lambda: state.pause(obj.mode))
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @router.post("/continue_generation")
    async def continue_generation() -> JSONResponse:
        await scheduler.call(state.resume)
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @router.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        # Like SGLang, it flushes only while no request is queued or running.
        def flush() -> bool:
            idle = not (scheduler.running or scheduler.waiting)
            if idle:
                scheduler.runner.prefixes.clear()
            return idle

        idle = await scheduler.call(flush)
        return Response(
            "Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n",
            status_code=status.HTTP_200_OK if idle else status.HTTP_400_BAD_REQUEST,
        )

    @router.api_route("/start_profile", methods=["GET", "POST"])
    async def start_profile(obj: ProfileReqInput | None = None) -> Response:
        obj = obj or ProfileReqInput()
        request = ProfileRequest(
            obj.output_dir, obj.start_step, obj.num_steps, tuple(obj.activities) if obj.activities else None
        )
        try:
            await scheduler.call(lambda: state.profiler.start(request, scheduler.runner.counts.total))
        except ProfileError as exc:
            return Response(f"{exc}\n", status_code=status.HTTP_400_BAD_REQUEST)
        return Response("Start profiling.\n", status_code=status.HTTP_200_OK)

    @router.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile() -> Response:
        try:
            await scheduler.call(state.profiler.stop)
        except ProfileError as exc:
            return Response(f"{exc}\n", status_code=status.HTTP_400_BAD_REQUEST)
        return Response("Stop profiling. This will take some time.\n", status_code=status.HTTP_200_OK)

    @router.post("/abort_request")
    async def abort_request(obj: AbortReq) -> Response:
        await scheduler.call(lambda: scheduler.abort(obj.rid, obj.abort_all))
        return Response(status_code=status.HTTP_200_OK)

    @router.get("/health")
    async def health() -> Response:
        return Response(status_code=status.HTTP_200_OK)

    @router.get("/health_generate")
    async def health_generate() -> Response:
        if scheduler.paused is not None:
            return Response(status_code=status.HTTP_200_OK)
        loop = asyncio.get_running_loop()
        probe = Sequence(
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            parent_rid="",
            prompt_ids=[0],
            config=SamplingConfig(max_new_tokens=1, temperature=0.0),
            return_logprob=False,
            loop=loop,
            future=loop.create_future(),
        )
        scheduler.submit([probe])
        try:
            await asyncio.wait_for(probe.future, state.settings.health_generate_timeout_s)
        except TimeoutError:
            return Response(status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
        return Response(status_code=status.HTTP_200_OK)

    @router.get("/get_model_info")
    @router.get("/model_info")
    async def get_model_info() -> dict[str, Any]:
        return state.model_info()

    @router.get("/get_weight_version")
    async def get_weight_version() -> dict[str, Any]:
        return {"weight_version": scheduler.weight_version}

    return router
