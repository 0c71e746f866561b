"""Each tenant's prefix caches are its own on every path that reaches a model replica: plain,
streamed, chat, the full vocabulary (JSON and npy), a batch line and dataset scoring, on the
tenancy application (tests/e2e/tenancy_app.py). The replica receives the caller's tenant, and
tenant B's first prompt after tenant A's reads no cached token of A's (the inspected replica
records each engine request's tenant and the prefix-cache tokens its engine read)."""

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
from ray import serve

from serve_app.batch.dataset import ScoreOptions
from serve_app.batch.scoring import score_dataset
from serve_app.ops.app import model_deployment_name
from serve_app.store.model_store import TINY
from tests.e2e.inspected_replica import PROMPT_KEPT
from tests.e2e.tenancy_app import APP, as_

pytestmark = pytest.mark.e2e

TENANTS = ("beta", "flood")  # never revoked, no rate (flood's one in flight: these go one by one)
PROMPT_TOKENS = 200  # a whole KV block (vLLM's CPU default: 128) to reuse, two full-vocabulary windows
WAIT_S = 120


@pytest.fixture(scope="module")
def replica(tenancy_url):
    return serve.get_deployment_handle(model_deployment_name(TINY), APP)


def unique_prompt(path: str) -> list[int]:
    """Token ids no other request of the session begins with."""
    return random.Random(path).sample(range(10, 3000), PROMPT_TOKENS)


@dataclass(frozen=True)
class Sender:
    """A tenant sending to the service: its name, its key's header, a folder of its own."""

    url: str
    tenant: str
    headers: dict[str, str]
    folder: Path

    def post(self, endpoint: str, body: dict, accept: str = "application/json") -> bytes:
        response = httpx.post(f"{self.url}{endpoint}", headers={**self.headers, "accept": accept},
                              json={"model": TINY, **body}, timeout=WAIT_S)
        assert response.status_code == 200, response.text
        return response.content

    def batch_line(self, prompt: list[int]) -> None:
        """The prompt as the one line of a batch, run to its end."""
        line = {"custom_id": "0", "method": "POST", "url": "/v1/completions",
                "body": {"model": TINY, "prompt": prompt, "max_tokens": 1}}
        uploaded = httpx.post(f"{self.url}/v1/files", headers=self.headers, data={"purpose": "batch"},
                              files={"file": ("in.jsonl", orjson.dumps(line) + b"\n")}).json()
        created = {"input_file_id": uploaded["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
        batch = httpx.post(f"{self.url}/v1/batches", headers=self.headers, json=created).json()
        deadline = time.monotonic() + WAIT_S
        while (batch := httpx.get(f"{self.url}/v1/batches/{batch['id']}", headers=self.headers).json())[
                "status"] in ("validating", "in_progress", "finalizing"):
            assert time.monotonic() < deadline, batch
            time.sleep(0.2)
        assert (batch["status"], batch["request_counts"]["completed"]) == ("completed", 1), batch

    def dataset(self, prompt: list[int]) -> None:
        """The prompt as the one document of a dataset scored for the tenant (a run's tenant
        is named, not keyed: its operator runs it)."""
        source = self.folder / f"{self.tenant}-{time.monotonic_ns()}.jsonl"
        source.write_bytes(orjson.dumps({"text": prompt}) + b"\n")
        options = ScoreOptions(model=TINY, top_k=1, tenant=self.tenant)
        run = score_dataset(str(source), str(source.with_suffix("")), options, app_name=APP, in_flight=1,
                            progress=False)
        assert (run.documents, run.refused) == (1, 0)


def chat_messages(prompt: list[int]) -> list[dict]:
    """Words of the prompt's first ids: well over a KV block, within the context, rendered."""
    return [{"role": "user", "content": " ".join(f"w{token}" for token in prompt[:100])}]


# Each path: how a tenant sends the prompt, and whether a second time reads its caches.
PATHS: dict[str, tuple[Callable[[Sender, list[int]], object], bool]] = {
    "completions": (lambda s, p: s.post("/v1/completions", {"prompt": p, "max_tokens": 1}), True),
    "completions streamed": (lambda s, p: s.post("/v1/completions", {
        "prompt": p, "max_tokens": 2, "stream": True}, "text/event-stream"), True),
    "chat": (lambda s, p: s.post("/v1/chat/completions", {
        "messages": chat_messages(p), "max_tokens": 1, "logprobs": True}), True),
    "chat streamed": (lambda s, p: s.post("/v1/chat/completions", {
        "messages": chat_messages(p), "max_tokens": 2, "stream": True}, "text/event-stream"), True),
    # Every row of the full vocabulary is computed: its windows read only their own prompt's
    # earlier windows, whoever sent it before.
    "full vocabulary JSON": (lambda s, p: s.post("/v1/completions", {
        "prompt": p, "max_tokens": 1, "prompt_logprobs": -1}), False),
    "full vocabulary npy": (lambda s, p: s.post("/v1/completions", {
        "prompt": p, "max_tokens": 1, "prompt_logprobs": -1}, "application/x-npy"), False),
    "batch line": (Sender.batch_line, True),
    # Echoed rows: a second time they come from the scored-prefix cache, read from the KV cache.
    "dataset scoring": (Sender.dataset, True),
}


@pytest.mark.parametrize("path", PATHS)
def test_each_tenant_reads_only_its_own_prefix_caches(tenancy_url, keys, replica, path, tmp_path):
    send, reused = PATHS[path]
    senders = {name: Sender(tenancy_url, name, as_(keys, name), tmp_path) for name in TENANTS}
    prompt = unique_prompt(path)
    if "chat" in path:  # the engine's prompt: the messages as the model's template renders them
        rendered = senders["beta"].post("/tokenize", {"messages": chat_messages(prompt)})
        start = orjson.loads(rendered)["tokens"][:PROMPT_KEPT]
    else:
        start = prompt[:PROMPT_KEPT]

    def sent_by(tenant: str) -> list[tuple[str, int]]:
        """The engine requests of the tenant's request: (tenant received, cached tokens read)."""
        before = len(replica.cache_reads.remote(start).result())
        send(senders[tenant], prompt)
        return replica.cache_reads.remote(start).result()[before:]

    first, again, other = sent_by("beta"), sent_by("beta"), sent_by("flood")
    assert first and again and other
    assert {tenant for tenant, _ in first + again} == {"beta"}
    assert {tenant for tenant, _ in other} == {"flood"}
    if reused:  # the path reads its tenant's caches at all: so the other's could leak
        assert sum(cached for _, cached in again) > sum(cached for _, cached in first)
    assert [cached for _, cached in other] == [cached for _, cached in first]
