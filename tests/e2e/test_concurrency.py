"""Many clients at once: mixed requests in flight together get the answers they get alone."""

from concurrent.futures import ThreadPoolExecutor

import orjson

from tests.e2e.conftest import MODEL
from tests.e2e.same_answer import assert_same_choices

PROMPTS = ["The capital of France is", "def parse(self, text):", "x = 1", "import json"]
KINDS = [  # greedy, so that every answer is determined
    {"max_tokens": 6, "temperature": 0, "logprobs": 3},
    {"max_tokens": 1, "temperature": 0, "prompt_logprobs": 4, "echo": True, "logprobs": 1},
    {"max_tokens": 1, "temperature": 0, "prompt_logprobs": -1},
    {"max_tokens": 5, "temperature": 0, "stream": True},
    {"max_tokens": 0},  # refused
]


def post(base_url: str, body: dict) -> tuple[int, bytes]:
    import httpx

    with httpx.Client(base_url=base_url, timeout=300) as client:
        response = client.post("/v1/completions", json=body, headers={"accept-encoding": "identity"})
        return response.status_code, response.content


def comparable(status: int, content: bytes):
    """What must not depend on concurrency: the status, the texts, and every logprob."""
    if status != 200:
        return status, orjson.loads(content)["error"]["code"]
    if content.startswith(b"data: "):
        events = [orjson.loads(line[6:]) for line in content.split(b"\n\n") if line.startswith(b"data: {")]
        return status, "".join(c["text"] for e in events for c in e["choices"])
    return status, [summary(choice) for choice in orjson.loads(content)["choices"]]


def summary(choice: dict) -> dict:
    """The text, the token logprobs, and {position: {token id: logprob}} of prompt_logprobs
    (ranks can swap between near-ties when batching changes float rounding)."""
    positions = choice.get("prompt_logprobs") or []
    return {
        "text": choice["text"],
        "token_logprobs": (choice["logprobs"] or {}).get("token_logprobs"),
        "prompt": [{t: e["logprob"] for t, e in p.items()} if p else None for p in positions],
    }


def close(expected, got, tolerance: float = 1e-4) -> bool:
    if isinstance(expected, float) and isinstance(got, float):
        return abs(expected - got) <= tolerance
    if isinstance(expected, dict) and isinstance(got, dict):
        return expected.keys() == got.keys() and all(close(expected[k], got[k]) for k in expected)
    if isinstance(expected, list) and isinstance(got, list):
        return len(expected) == len(got) and all(map(close, expected, got))
    return expected == got


def test_concurrent_mixed_requests(base_url):
    bodies = [{"model": MODEL, "prompt": prompt, **kind} for prompt in PROMPTS for kind in KINDS]
    alone = [comparable(*post(base_url, body)) for body in bodies]
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        together = list(pool.map(lambda body: comparable(*post(base_url, body)), bodies * 2))
    for index, (expected, got) in enumerate(zip(alone * 2, together, strict=True)):
        assert close(expected, got), bodies[index % len(bodies)]


def test_a_request_among_fifty_others_gets_its_numbers_alone(base_url):
    probe = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0,
             "echo": True, "logprobs": 5}
    others = [{"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)] * (1 + i % 5), "max_tokens": 4 + i % 7,
               "temperature": 0, "logprobs": 2} for i in range(50)]
    status, alone = post(base_url, probe)
    assert status == 200
    with ThreadPoolExecutor(max_workers=51) as pool:
        crowd = [pool.submit(post, base_url, body) for body in others[:25]]
        probed = pool.submit(post, base_url, probe)
        crowd += [pool.submit(post, base_url, body) for body in others[25:]]
        assert all(future.result()[0] == 200 for future in crowd)
        status, together = probed.result()
    assert status == 200
    # Its text, and every token's logprob and top 5, each value bound to its token.
    assert_same_choices(orjson.loads(together), orjson.loads(alone))


def test_labels_among_echoed_prompts_get_their_numbers_alone(base_url):
    """Label scoring at a generated position, its engine steps shared with requests that echo
    their prompts with a top-k: each gets its own, the labels their values and the others
    their top k (vLLM's sampler alone would hand the top-k requests the labels' gather)."""
    labels = {"model": MODEL, "prompt": "A label follows:", "max_tokens": 1, "temperature": 0,
              "logprob_token_ids": [5, 17]}
    echoed = {"model": MODEL, "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 2}
    bodies = [labels if i % 4 == 0 else {**echoed, "prompt": f"Line {i} of the batch says {i * 3} things."}
              for i in range(32)]
    distinct = {orjson.dumps(body): body for body in bodies}
    alone = {key: post(base_url, body) for key, body in distinct.items()}
    assert all(status == 200 for status, _ in alone.values())
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda body: post(base_url, body), bodies))
    for body, (status, content) in zip(bodies, answers, strict=True):
        assert status == 200
        assert_same_choices(orjson.loads(content), orjson.loads(alone[orjson.dumps(body)][1]))
