"""ModelReplica: one Ray Serve deployment per model, wrapping vLLM's AsyncLLM.

It owns what one engine serves: the engine's start, warm-up and self-check, each request's
way through it (online first, background work by turns; a scored span read from the prefix
caches, read again whole if the cache fell short; full-vocabulary prompts in windows) and the
queue-wait bound. Turning requests and outputs into vLLM's types and back is the adapter's
(serve_app.engine.vllm_adapter); the caches, windows and turns are modules of their own.
"""

import dataclasses
import logging
import time
import uuid
from contextlib import asynccontextmanager

from ray import serve

from serve_app.config import ModelConfig
from serve_app.engine.background import BackgroundShare
from serve_app.engine.engine_adapters import EngineAdapters
from serve_app.engine.scored_cache import ScoredPrefixCache
from serve_app.engine.shared_prefix import InFlightPrefixes
from serve_app.engine.time_admission import GradientLimit, ServiceRate, TimeAdmission, Work
from serve_app.engine.vllm_adapter import (
    engine_config,
    engine_result,
    engine_stats,
    prepare_process,
    sampling_params,
)
from serve_app.engine.vllm_fence import register
from serve_app.engine.vllm_fence.front_end import held_gauges_stat_logger, keep_prompt_logprobs_as_arrays
from serve_app.engine.vllm_fence.replica_start import check_runner, self_check
from serve_app.engine.windows import joined_windows, next_window, prompt_windows
from serve_app.engine.wire import (
    REPLICA_ITSELF,
    EngineRequest,
    EngineResult,
    EngineUnavailable,
    QueueTimeout,
)
from serve_app.observe.metrics import ReplicaMetrics

logger = logging.getLogger("probserve.replica")
# The long prompt that times the engine's seconds a token at start (serve_app.engine.time_admission).
RATE_PROBE_TOKENS = 256


def warm_up(rows: int) -> tuple[EngineRequest, EngineRequest]:
    """What the first requests would pay otherwise: vLLM's logprobs op compiled (a top-k), and
    the buffers of the longest full-vocabulary prompt (`rows` positions), which vLLM's worker
    and this process make on its first windows and keep for the next
    (docs/benchmarks.md#shipped-settings-measured)."""
    greedy = {"max_tokens": 2, "temperature": 0.0, "top_p": 1.0, "logprobs": 1, **REPLICA_ITSELF}
    return (EngineRequest(prompt_token_ids=[1, 2, 3], prompt_logprobs=1, **greedy),
            EngineRequest(prompt_token_ids=list(range(1, rows + 2)), prompt_logprobs=-1, **greedy))


def rate_probes(tokens: int) -> tuple[EngineRequest, EngineRequest]:
    """A short request and one of `tokens` prompt tokens more, neither found in the prefix
    cache (the warm-up's prompts count up; these count down)."""
    greedy = {"max_tokens": 1, "temperature": 0.0, "top_p": 1.0, **REPLICA_ITSELF}
    return (EngineRequest(prompt_token_ids=[3, 2, 1], **greedy),
            EngineRequest(prompt_token_ids=list(range(tokens + 3, 0, -1)), **greedy))


def check_queue_time(sent_at: float, ready_at: float, now: float, bound_s: float) -> None:
    """QueueTimeout for a request that waited more than `bound_s` for a place on the model's
    replicas (Ray Serve holds it in the sender's router while every replica is full). Raised
    on arrival, so that its place is free again at once for the next in the queue: once the
    bound has passed, a backlog drains in refusals. A request sent before this replica was
    ready waited for it to start (a model scaled to zero, a replica added): it is served."""
    waited = now - sent_at
    if sent_at >= ready_at and waited > bound_s:
        raise QueueTimeout(f"waited {waited:.1f} s for a place on the model's replicas, more than "
                           f"max_queue_wait_s ({bound_s:g} s): retry later")


def work_of(request: EngineRequest) -> Work:
    return Work(len(request.prompt_token_ids), request.max_tokens * request.n)


def admission(model: ModelConfig, rate: ServiceRate) -> TimeAdmission:
    """Requests in the engine start at 16 and adapt between 4 and max_ongoing_requests."""
    most = model.max_ongoing_requests
    return TimeAdmission(model.max_answer_s, rate, GradientLimit(min(16, most), min(4, most), most))


@serve.deployment
class ModelReplica:
    async def __init__(self, model: ModelConfig, chunk_positions: int):
        """chunk_positions: full-vocabulary rows per object handed to the serializer pool."""
        prepare_process(model)
        from vllm.v1.engine.async_llm import AsyncLLM

        register()
        keep_prompt_logprobs_as_arrays(chunk_positions)
        self.model = model
        self.metrics = ReplicaMetrics(model.name)
        # vLLM's engine metrics (vllm:*), exported by Ray's metrics agent with this replica's.
        model.parallelism().check_model_folder(model.name, model.resolved_path())
        config = engine_config(model)
        check_runner(config)
        self.engine = AsyncLLM.from_vllm_config(config, stat_loggers=[held_gauges_stat_logger()])
        self.block = block = self.engine.vllm_config.cache_config.block_size
        # Whole KV blocks a window, so that each reads every block before it.
        self.window = max(model.full_vocab_window // block, 1) * block
        self.background_window = max(model.background_window // block, 1) * block
        self.prefixes = InFlightPrefixes(block)
        self.adapters = EngineAdapters(self.engine, model.name, model.lora.held() if model.lora else 1)
        self.background = BackgroundShare(model.max_background_in_engine,
                                          model.max_background_in_engine_quiet or model.max_ongoing_requests,
                                          model.background_quiet_s)
        scoring = model.scored_cache
        self.scored = ScoredPrefixCache(block, scoring.top_k, scoring.max_bytes) if scoring.enabled else None
        longest = self.engine.vllm_config.model_config.max_model_len - 3  # the prompt and its 2 tokens
        top_k, full_vocab = warm_up(min(max(model.capabilities.full_vocab_max_prompt_tokens, 2), longest))
        await self.generate(top_k)
        async for _ in self.generate_full_vocab(full_vocab):
            pass
        self.admission = admission(model, await self.first_rate(min(RATE_PROBE_TOKENS, longest)))
        # Refuse to serve rather than answer wrongly if the patches do not fit this engine.
        await self_check(self.generate)
        self.ready_at = time.time()

    async def first_rate(self, tokens: int) -> ServiceRate:
        """The admission's first guess of the engine's seconds a request and a token: a short
        request and a long prompt timed, once the engine is warm."""
        timings = []
        for probe in rate_probes(tokens):
            started = time.monotonic()
            await self.generate(probe)
            timings.append(time.monotonic() - started)
        short_s, long_s = timings
        return ServiceRate(short_s, max(long_s - short_s, 0.0) / tokens)

    @asynccontextmanager
    async def admitted(self, request: EngineRequest):
        """An online request's place in the engine, or Late (serve_app.engine.time_admission);
        the replica's own requests (sent_at None) go in at once, and background ones are
        counted once in the engine (`outputs`)."""
        if request.sent_at is None or request.background():
            yield
        else:
            async with self.admission.online(work_of(request)):
                yield

    def check_queue_time(self, request: EngineRequest) -> None:
        if request.sent_at is not None:  # None: the replica's own warm-up and checks
            check_queue_time(request.sent_at, self.ready_at, time.time(), self.model.max_queue_wait_s)

    async def outputs(self, request: EngineRequest, stream: bool):
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        prompt = TokensPrompt(prompt_token_ids=request.prompt_token_ids,
                              cache_salt=self.cache_namespace(request))
        final, generated = None, 0
        adapter = await self.adapters.request(request.adapter)
        try:
            async with self.background.turn(request), self.background_counted(request):
                async for output in self.engine.generate(prompt, sampling_params(request, stream),
                                                         f"{self.model.name}-{uuid.uuid4().hex}",
                                                         lora_request=adapter, priority=request.priority):
                    final = output
                    generated += sum(len(c.token_ids) for c in output.outputs)
                    yield output
        except EngineDeadError as error:
            raise EngineUnavailable(f"model {self.model.name!r}: its engine stopped ({error}); "
                                    "a new replica is being started") from None
        adapter = request.adapter.name if request.adapter else ""
        self.metrics.served(engine_stats(final, generated), adapter)

    @asynccontextmanager
    async def background_counted(self, request: EngineRequest):
        """A background request's time in the engine, which online requests' admission counts."""
        if request.background():
            async with self.admission.background(work_of(request)):
                yield
        else:
            yield

    def cache_namespace(self, request: EngineRequest) -> str:
        return request.cache_namespace(self.model.shared_prefix_caches)

    def uses_scored_cache(self, request: EngineRequest) -> bool:
        return self.scored is not None and self.scored.eligible(request)

    def readable_tokens(self, request: EngineRequest) -> int:
        """What the request may read from the KV cache once a request with its prefix ends."""
        if self.uses_scored_cache(request):
            return len(request.prompt_token_ids) - 1
        return request.cache_readable_tokens()

    async def generate(self, request: EngineRequest) -> EngineResult:
        self.check_queue_time(request)
        async with self.admitted(request):
            return await self.generated(request)

    async def generated(self, request: EngineRequest) -> EngineResult:
        tokens, namespace = request.prompt_token_ids, self.cache_namespace(request)
        async with self.prefixes.turn(tokens, self.readable_tokens(request), request.scores(), namespace,
                                      request.background()):
            if not self.uses_scored_cache(request):
                return await self.computed(request)
            plan = self.scored.plan(request, namespace)
            result = self.scored.complete(plan, await self.computed(plan.engine_request))
            from_cache = plan.known.count if plan.known is not None else 0
            self.metrics.scored(from_cache, len(request.prompt_token_ids) - 1 - from_cache, self.scored.bytes)
            return result

    async def computed(self, request: EngineRequest) -> EngineResult:
        """A background request's prompt rows a window at a time, the rest whole once online
        requests have paused (serve_app.engine.background)."""
        if not request.background() or request.prompt_logprobs is None:
            return await self.final_result(request)
        left, sent, results = prompt_windows(request, self.background_window, self.block), [], []
        while left:
            window, left = next_window(left, whole=self.background.quiet())
            sent.append(window)
            results.append(await self.final_result(window))
        return joined_windows(sent, results)

    async def final_result(self, request: EngineRequest) -> EngineResult:
        final = await self.final_output(request)
        if (final.num_cached_tokens or 0) > request.cache_readable_tokens():
            # Rows past the limit were never computed: compute the prompt whole instead.
            logger.error("model %s: the engine read %d cached tokens, more than the %d allowed; "
                         "computing the prompt again without its cache", self.model.name,
                         final.num_cached_tokens, request.cache_readable_tokens())
            final = await self.final_output(dataclasses.replace(request, read_prefix_cache=False))
        return engine_result(final, request.sent_at)

    async def final_output(self, request: EngineRequest):
        final = None
        async for output in self.outputs(request, stream=False):
            final = output
        return final

    async def generate_full_vocab(self, request: EngineRequest):
        """prompt_logprobs -1, window by window (serve_app.engine.windows), as soon as each
        ends: its result without its rows (the last one's also carries what was generated),
        then each chunk of its rows as an item of its own. Each item goes to Ray's object
        store owned by the caller, which hands the chunks to the serializer pool unread
        (rows nested in an item could be freed early: ray-project/ray#58082)."""
        self.check_queue_time(request)
        async with self.admitted(request):
            for window in prompt_windows(request, self.window, self.block):
                result = await self.final_result(window)
                yield dataclasses.replace(result, full_vocab=result.full_vocab.with_chunks([]))
                for chunk in result.full_vocab.chunks:
                    yield chunk

    async def generate_stream(self, request: EngineRequest):
        """Yields what each engine step adds, as EngineResults of the new tokens only."""
        self.check_queue_time(request)
        namespace = self.cache_namespace(request)
        async with self.admitted(request), self.prefixes.turn(
                request.prompt_token_ids, request.cache_readable_tokens(), False, namespace):
            async for output in self.outputs(request, stream=True):
                yield engine_result(output, request.sent_at)

    async def check_health(self) -> None:
        await self.engine.check_health()

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
