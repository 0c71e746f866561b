"""The model replica the end-to-end service runs: probserve's own, with what only tests ask of
it (how many engine requests reached it, what its engine holds, its engine's processes), so
none of that lives on the production replica."""

import sys
from collections import Counter, deque

from ray import cloudpickle, serve

from serve_app.engine.replica import ModelReplica

# The engine requests whose tenant and cache reads the replica keeps, and how many of each
# prompt's first ids tell it apart.
SERVED_KEPT, PROMPT_KEPT = 4096, 16


class TenantsInEngine(ModelReplica.func_or_class):
    """Each tenant's engine requests under way, and the most at once since the last reading."""

    async def __init__(self, *args, **kwargs):
        self.tenants_now, self.tenants_peak = Counter(), Counter()
        await super().__init__(*args, **kwargs)

    async def outputs(self, request, stream: bool):
        tenant = request.tenant
        self.tenants_now[tenant] += 1
        self.tenants_peak[tenant] = max(self.tenants_peak[tenant], self.tenants_now[tenant])
        try:
            async for output in super().outputs(request, stream):
                yield output
        finally:
            self.tenants_now[tenant] -= 1

    def peak_in_engine(self, tenant: str) -> int:
        """The most engine requests of `tenant` in the engine at once since the last call (from
        those under way then): a tenant's in-flight bound, seen where it matters."""
        peak, self.tenants_peak[tenant] = self.tenants_peak[tenant], self.tenants_now[tenant]
        return peak


class InspectedReplica(TenantsInEngine):
    async def __init__(self, *args, **kwargs):
        self.requests_received = 0
        self.priorities, self.priorities_now = Counter(), Counter()
        self.served = deque(maxlen=SERVED_KEPT)
        await super().__init__(*args, **kwargs)
        self.totals = Counter()
        served, scored = self.metrics.served, self.metrics.scored

        def counted_served(stats, adapter: str) -> None:
            served(stats, adapter)
            self.totals["cache_read"] += stats.cached_tokens

        def counted_scored(from_cache: int, from_engine: int, cache_bytes: int) -> None:
            scored(from_cache, from_engine, cache_bytes)
            self.totals["scored_from_cache"] += from_cache

        self.metrics.served, self.metrics.scored = counted_served, counted_scored

    async def outputs(self, request, stream: bool):
        self.requests_received += 1
        self.priorities[request.priority] += 1
        self.priorities_now[request.priority] += 1
        first = True
        try:
            async for output in super().outputs(request, stream):
                if first:  # the engine reports its cache reads with the prefill's output
                    self.served.append((request.tenant, request.prompt_token_ids[:PROMPT_KEPT],
                                        output.num_cached_tokens or 0))
                    first = False
                yield output
        finally:
            self.priorities_now[request.priority] -= 1

    def cache_reads(self, prompt_start: list[int]) -> list[tuple[str, int]]:
        """The tenant and the prefix-cache tokens read of each engine request, in order, whose
        prompt begins with these ids (at most PROMPT_KEPT)."""
        return [(tenant, cached) for tenant, start, cached in self.served
                if start[:len(prompt_start)] == prompt_start]

    def counted(self) -> dict[str, int]:
        """Since the replica started serving, the tokens its engine read from the prefix cache
        and the positions it served from the scored-prefix cache: what it adds to the exported
        counters (probserve_prefix_cache_read_tokens_total, probserve_scored_positions_total
        {source="cache"}), counted before an answer leaves, where Ray's export lags by up to a
        report interval (test_metrics.py checks the export)."""
        return dict(self.totals)

    def request_count(self) -> int:
        """Engine requests this replica has received (warm-up and self-checks included): the
        signal that refused requests never get here."""
        return self.requests_received

    def requests_by_priority(self) -> dict[int, int]:
        """Engine requests received at each scheduling priority."""
        return dict(self.priorities)

    def under_way_at(self, priority: int) -> int:
        """Engine requests of this scheduling priority under way now."""
        return self.priorities_now[priority]

    def unfinished_requests(self) -> int:
        """Requests the engine holds (running or waiting): a client that leaves must not
        stay among them."""
        return self.engine.output_processor.get_num_unfinished_requests()

    def background_waiting(self) -> int:
        """Background requests the replica holds back from the engine for now."""
        return self.background.waiting

    def background_quiet(self) -> bool:
        """Whether online requests have paused long enough for background prompts to go whole."""
        return self.background.quiet()

    def bound_answers(self, seconds: float | None) -> float | None:
        """Sets the replica's `max_answer_s` until set again; returns the one it had."""
        previous, self.admission.bound_s = self.admission.bound_s, seconds
        return previous

    def engine_seconds(self, tokens: int) -> float:
        """What the admission expects the engine to spend on a request of `tokens`."""
        return self.admission.rate.seconds(1, tokens)

    def engine_core_pids(self) -> list[int]:
        """The engine's EngineCore processes, as vLLM's own launcher holds them (a process's
        title is no sure sign: one fresh-clone run found none titled EngineCore)."""
        return [process.pid for process in self.engine.engine_core.resources.engine_manager.processes]

    def placement_group(self) -> dict | None:
        """The bundles and strategy of the placement group this replica sits in, if any."""
        from ray.util import get_current_placement_group, placement_group_table

        group = get_current_placement_group()
        if group is None:
            return None
        table = placement_group_table(group)
        return {"bundles": [table["bundles"][index] for index in sorted(table["bundles"])],
                "strategy": table["strategy"]}


# Ray's workers cannot import the tests package: the class travels by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
INSPECTED_REPLICA = serve.deployment(InspectedReplica)
