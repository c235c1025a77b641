"""The rollout's OpenAI-compatible API: agent code written for the ``openai`` client generates
episodes against the current policy, and each conversation is recorded for training.

- ``POST /v1/chat/completions``: OpenAI's chat completion (``tools``, ``tool_choice`` none / auto /
  required / a named function, ``n``, ``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``,
  ``logprobs``, ``stop``; no streaming). A request with a conversation id, in the header
  ``X-RelayRL-Conversation-Id`` or in ``metadata.conversation_id``, is recorded in that conversation
  (``metadata.group_id`` / ``metadata.group_size`` group conversations into one trajectory group);
  one without is answered and not recorded. A recorded request asks for one choice (``n`` 1): each
  sample of a group is its own conversation.
- ``GET /v1/models``: the served policy, with the weight version the engine holds.
- ``POST /v1/conversations/{id}/finish``: ends a conversation with ``{"reward": r}`` or
  ``{"score": true, "data_source", "ground_truth", "extra_info"}`` (the rollout's reward function on
  the last model turn); its group is pushed to the queue once complete.

A replica has one engine, so every turn of a conversation reaches the same engine (its prefix
cache) as long as the conversation's requests reach the same replica: with several replicas,
route on the ``X-RelayRL-Conversation-Id`` header. Errors answer in OpenAI's error shape
(``{"error": {"message", "type", "param"}}``): 400 bad input, 404 unknown conversation, 409 a
history that does not continue the record, 503 with ``Retry-After`` when the engine is not ready
or the replica is paused or stopping (at once for a new request; after ``pause_wait_s`` for one
in flight when the pause began, see ``pause_bound.py``). The ``openai`` client retries a 503
after ``Retry-After`` (``max_retries``, default 2) by itself.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Body, Header
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from services.engine.client import EngineClient, EngineError, SamplingParams
from services.rollout.config import RolloutSettings
from services.rollout.conversations import (
    Conversation,
    ConversationConflict,
    ConversationNotFound,
    Conversations,
    GroupNotPushed,
)
from services.rollout.generation import GenerationError, SampleResult, continue_sample, generate_group
from services.rollout.metrics import RolloutMetrics
from services.rollout.openai_chat import ChatRenderer, ModelTurn, assistant_message
from services.rollout.openai_models import (
    ChatCompletion,
    ChatRequest,
    Choice,
    FinishRequest,
    Message,
    ModelCard,
    ModelList,
    Usage,
)
from services.rollout.pause_bound import PauseBound, ReplicaPaused
from services.rollout.rewards import RewardRunner
from services.rollout.state import ReplicaState

CONVERSATION_HEADER = "X-RelayRL-Conversation-Id"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        retry_after_s: int | None = None,
    ):
        super().__init__(message)
        self.status, self.kind, self.param, self.retry_after_s = status, kind, param, retry_after_s

    @classmethod
    def paused(cls, exc: ReplicaPaused) -> ApiError:
        return cls(503, str(exc), "server_error", retry_after_s=exc.retry_after_s)

    def response(self) -> JSONResponse:
        body = {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}}
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None
        return JSONResponse(body, status_code=self.status, headers=headers)


class OpenAIEndpoint:
    def __init__(
        self,
        settings: RolloutSettings,
        state: ReplicaState,
        engine: EngineClient,
        rewards: RewardRunner,
        metrics: RolloutMetrics,
        conversations: Conversations,
    ) -> None:
        self.settings = settings
        self.state = state
        self.engine = engine
        self.rewards = rewards
        self.metrics = metrics
        self.conversations = conversations
        self._renderer: ChatRenderer | None = None
        self._model_name = settings.openai_served_model_name
        self._lock = asyncio.Lock()
        self.pause = PauseBound(state, settings.pause_wait_s, settings.retry_after_s)

    async def renderer(self) -> ChatRenderer:
        """The tokenizer loads at the first request, from ``tokenizer_path`` or the engine's model."""
        async with self._lock:
            if self._renderer is None:
                info = await self.engine.model_info()
                path = self.settings.tokenizer_path or info.get("tokenizer_path") or info.get("model_path") or ""
                if not path:
                    raise ApiError(503, "no tokenizer: set tokenizer_path; the engine reports none", "server_error")
                self._model_name = self._model_name or Path(str(info.get("model_path") or path)).name
                self._renderer = ChatRenderer(await asyncio.to_thread(_load_tokenizer, path))
            return self._renderer

    async def models(self) -> ModelList:
        await self.renderer()
        card = ModelCard(id=self._model_name, created=0, weight_version=self.state.held_version)
        return ModelList(data=[card])

    async def chat(self, request: ChatRequest, conversation_id: str | None) -> ChatCompletion:
        if (refusal := self.pause.refusal()) is not None:
            raise ApiError.paused(refusal)
        if not self.state.ready():
            raise ApiError(503, "the engine is not ready", "server_error", retry_after_s=self.settings.retry_after_s)
        renderer = await self.renderer()
        if conversation_id is None:
            prompt = renderer.prompt_ids(request.messages, _tools(request)) + renderer.prefill_ids(request)
            turns = await self._generate(request, prompt, request.n)
            choices, completion = [], 0
            for index, turn in enumerate(turns):
                choice, _, cut = self._choice(renderer, request, turn, index)
                choices.append(choice)
                completion += len(cut.ids)
            return self._completion(choices, len(prompt), completion, None)
        if request.n != 1:
            raise ApiError(
                400,
                "n must be 1 in a recorded conversation: give each sample its own conversation id"
                " and a shared metadata.group_id",
                param="n",
            )
        conversation = self.conversations.get_or_open(conversation_id, request.metadata or {})
        try:
            async with conversation.lock:
                return await self._turn(renderer, request, conversation)
        finally:
            self.conversations.drop_if_unstarted(conversation)

    async def _turn(self, renderer: ChatRenderer, request: ChatRequest, conversation: Conversation) -> ChatCompletion:
        tools = _tools(request)
        if conversation.started:
            added = conversation.new_messages(request.messages, tools)
            observation = renderer.observation_ids(added, conversation.last_turn_ids) + renderer.prefill_ids(request)
        else:
            added, observation = list(request.messages), []
            conversation.tools = tools
            conversation.prompt_ids = renderer.prompt_ids(added, tools) + renderer.prefill_ids(request)
        input_ids = conversation.prompt_ids + conversation.output_ids + observation
        started = time.perf_counter()
        (turn,) = await self._generate(request, input_ids, 1)
        conversation.engine_s += time.perf_counter() - started
        choice, answer, turn = self._choice(renderer, request, turn, 0)
        decode = renderer.observations.decode
        conversation.record(added, observation, turn, answer, decode(observation) + decode(turn.ids))
        return self._completion([choice], len(input_ids), len(turn.ids), conversation.conversation_id)

    async def _generate(self, request: ChatRequest, input_ids: list[int], n: int) -> list[ModelTurn]:
        renderer = await self.renderer()
        params = self._sampling(request, renderer)
        rid = f"{self.settings.replica_id}-openai-{uuid.uuid4().hex[:12]}"
        mode, version = self.settings.partial_rollout_mode, self.state.held_version
        self.state.change_in_flight(n)
        try:
            if n == 1:
                gate = self.pause.gate
                work = continue_sample(self.engine, input_ids, params, mode, version, rid, SampleResult(), gate)
                results = [await self.pause.run(work)]
            else:
                work = generate_group(self.engine, input_ids, params, n, mode, version, rid, self.pause.gate)
                results = await self.pause.run(work)
        except ReplicaPaused as exc:
            raise ApiError.paused(exc) from exc
        except (EngineError, GenerationError) as exc:
            raise ApiError(503, f"generation failed: {exc}", "server_error") from exc
        finally:
            self.state.change_in_flight(-n)
        turns = []
        for result in results:
            self.metrics.generated_tokens.inc(len(result.output_ids))
            self.metrics.token_rate.add(len(result.output_ids))
            self.metrics.engine_latency.observe(result.engine_s)
            finish = "length" if result.finish_reason == "length" else "stop"
            turns.append(ModelTurn(result.output_ids, result.logprobs, result.versions, finish))
        return turns

    def _sampling(self, request: ChatRequest, renderer: ChatRenderer) -> SamplingParams:
        s = self.settings
        # A stop string of one token stops the engine itself; longer ones are cut after generation.
        single = [ids[0] for ids in map(renderer.encode, request.stops()) if len(ids) == 1]
        params = SamplingParams(
            max_new_tokens=request.budget(s.max_new_tokens),
            temperature=s.temperature if request.temperature is None else request.temperature,
            top_p=request.top_p or s.top_p,
            top_k=s.top_k,
        )
        return replace(params, stop_token_ids=single) if single else params

    def _choice(
        self, renderer: ChatRenderer, request: ChatRequest, turn: ModelTurn, index: int
    ) -> tuple[Choice, Message, ModelTurn]:
        """The OpenAI choice for ``turn``, its message as recorded, and the turn cut at a stop string."""
        turn, text = renderer.cut_at_stop(turn, request.stops())
        message, finish = assistant_message(request, text, turn.finish_reason)
        logprobs = renderer.logprobs(turn) if request.logprobs else None
        choice = Choice(index=index, message=message, finish_reason=finish, logprobs=logprobs)  # type: ignore[arg-type]
        return choice, Message.model_validate(message.model_dump()), turn

    def _completion(
        self, choices: list[Choice], prompt: int, completion: int, conversation_id: str | None
    ) -> ChatCompletion:
        return ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self._model_name,
            choices=choices,
            usage=Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion),
            conversation_id=conversation_id,
        )

    async def finish(self, conversation_id: str, body: FinishRequest) -> dict[str, Any]:
        conversation = self.conversations.open_conversation(conversation_id)
        extra: dict[str, float] = {}
        error = False
        reward = body.reward
        if reward is None:
            renderer = await self.renderer()
            solution = renderer.decode(conversation.last_turn_ids)
            outcome = await self.rewards.score(body.data_source, solution, body.ground_truth, body.extra_info)
            reward, extra, error = outcome.reward, dict(outcome.extra), bool(outcome.error)
            if error:
                self.metrics.reward_errors.inc()
        self.metrics.reward.observe(reward)
        info = {"data_source": body.data_source, "ground_truth": body.ground_truth, "extra_info": body.extra_info}
        waiting, record = await self.conversations.finish(conversation_id, reward, extra, error, info)
        answer: dict[str, Any] = {
            "conversation_id": conversation_id,
            "reward": reward,
            "group_id": conversation.group_id,
            "group_waiting_for": waiting,
        }
        if record is not None:
            # The group closed with this finish: its trajectory id and queue position, or why it was dropped.
            answer.update(
                status=record.status,
                trajectory_id=record.trajectory_id,
                queue_entry_id=record.queue_entry_id,
                queue_position=record.queue_position,
                reason=record.reason,
            )
        else:
            answer["status"] = "waiting"
        return answer


def _tools(request: ChatRequest) -> list[dict[str, Any]] | None:
    return [t.model_dump() for t in request.tools] if request.tools else None


def _load_tokenizer(path: str) -> Any:
    from relayrl.models.loading import load_tokenizer

    return load_tokenizer(path)


def _bad_request(exc: ValidationError) -> ApiError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    message = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()
    )
    return ApiError(400, message, param=param)


def _json(model: BaseModel) -> Response:
    """The model serialised by pydantic in one pass: a dict returned to FastAPI is walked again by
    its ``jsonable_encoder`` and dumped by ``json``, a cost paid on every turn of every episode."""
    return Response(model.model_dump_json(), media_type="application/json")


def openai_router(endpoint: OpenAIEndpoint) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def models() -> Any:
        try:
            return _json(await endpoint.models())
        except ApiError as exc:
            return exc.response()

    @router.post("/chat/completions")
    async def chat_completions(
        body: Any = Body(...), conversation_header: str | None = Header(None, alias=CONVERSATION_HEADER)
    ) -> Any:
        try:
            if not isinstance(body, dict):
                raise ApiError(400, "the body must be a JSON object")
            try:
                request = ChatRequest.model_validate(body)
            except ValidationError as exc:
                raise _bad_request(exc) from None
            in_body = (request.metadata or {}).get("conversation_id")
            if conversation_header and in_body and str(in_body) != conversation_header:
                raise ApiError(
                    400,
                    f"{CONVERSATION_HEADER} {conversation_header!r} differs from metadata.conversation_id {in_body!r}",
                    param="metadata.conversation_id",
                )
            conversation_id = conversation_header or (str(in_body) if in_body else None)
            return _json(await endpoint.chat(request, conversation_id))
        except ApiError as exc:
            return exc.response()
        except ConversationConflict as exc:
            return ApiError(409, str(exc), "conflict").response()
        except ValueError as exc:
            return ApiError(400, str(exc)).response()

    @router.post("/conversations/{conversation_id}/finish")
    async def finish(conversation_id: str, body: Any = Body(...)) -> Any:
        try:
            try:
                request = FinishRequest.model_validate(body)
            except ValidationError as exc:
                raise _bad_request(exc) from None
            return await endpoint.finish(conversation_id, request)
        except ApiError as exc:
            return exc.response()
        except ConversationNotFound as exc:
            return ApiError(404, str(exc), "not_found").response()
        except ConversationConflict as exc:
            return ApiError(409, str(exc), "conflict").response()
        except GroupNotPushed as exc:
            return ApiError(
                503, f"the conversation was finished but its group was not pushed: {exc}", "server_error"
            ).response()

    @router.get("/groups/{group_id}")
    async def group(group_id: str) -> Any:
        try:
            return endpoint.conversations.group_status(group_id)
        except ConversationNotFound as exc:
            return ApiError(404, str(exc), "not_found").response()

    return router
