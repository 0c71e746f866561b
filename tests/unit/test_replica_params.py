"""What the replica asks of vLLM for each request's log-probabilities: labels, the full
vocabulary, and how much of the prefix cache a scored span may read."""

import os
import subprocess
import sys

import pytest

from serve_app.config import ModelConfig
from serve_app.engine.replica import check_queue_time
from serve_app.engine.vllm_adapter import engine_args, logprob_params
from serve_app.engine.vllm_fence.replica_start import ask_for_the_v1_runner, check_runner
from serve_app.engine.vllm_fence.touch_points import (
    FULL_VOCAB,
    PREFIX_CACHE_LIMIT,
    PROMPT_LABELS,
    RUNNER_SWITCH,
)
from serve_app.engine.wire import EngineRequest, QueueTimeout


def request(**fields) -> EngineRequest:
    return EngineRequest(prompt_token_ids=[1, 2, 3, 4], max_tokens=1, temperature=0.0, top_p=1.0,
                         **{"tenant": "t", "priority": 0, **fields})


def test_a_span_reads_the_cache_up_to_the_position_that_scores_its_first_token():
    params = logprob_params(request(prompt_logprobs=2, prompt_rows_from=3))
    assert params == {"logprobs": None, "prompt_logprobs": 2, "skip_reading_prefix_cache": False,
                      "extra_args": {PREFIX_CACHE_LIMIT: 2}}


def test_labels_and_the_cache_limit_travel_together():
    params = logprob_params(request(logprobs=0, prompt_logprobs=0, logprob_token_ids=[7, 9],
                                    prompt_rows_from=2))
    assert params["extra_args"] == {PROMPT_LABELS: [7, 9], PREFIX_CACHE_LIMIT: 1}
    assert params["prompt_logprobs"] == 2 and params["logprob_token_ids"] == [7, 9]


@pytest.mark.parametrize("fields", [{"prompt_logprobs": 1, "prompt_rows_from": 1},
                                    {"prompt_logprobs": 1}, {"prompt_rows_from": 3},
                                    {"prompt_logprobs": 1, "prompt_rows_from": 3,
                                     "read_prefix_cache": False}])
def test_vllm_decides_when_every_row_is_shown_or_none_is_asked(fields):
    assert "skip_reading_prefix_cache" not in logprob_params(request(**fields))
    assert PREFIX_CACHE_LIMIT not in (logprob_params(request(**fields))["extra_args"] or {})


def test_the_full_vocabulary_is_marked_with_its_first_row():
    assert logprob_params(request(prompt_logprobs=-1))["extra_args"] == {FULL_VOCAB: 0}
    # a window after the first: its rows from position 3 (row 2) on, the two tokens before
    # read from the cache
    window = logprob_params(request(prompt_logprobs=-1, prompt_rows_from=3))
    assert window["extra_args"] == {FULL_VOCAB: 2, PREFIX_CACHE_LIMIT: 2}
    assert window["skip_reading_prefix_cache"] is False
    # computed again without the cache: still from its first row
    again = logprob_params(request(prompt_logprobs=-1, prompt_rows_from=3, read_prefix_cache=False))
    assert again["extra_args"] == {FULL_VOCAB: 2} and "skip_reading_prefix_cache" not in again


def test_the_kv_block_is_vllms_platform_default_unless_configured():
    def block_size(**fields) -> int | None:
        return engine_args(ModelConfig.model_validate({"name": "tiny-llama", **fields})).block_size

    assert block_size() is None and block_size(kv_block_size=32) == 32
    with pytest.raises(ValueError):
        ModelConfig.model_validate({"name": "tiny-llama", "kv_block_size": 0})


def test_engines_step_one_step_after_another_as_the_patches_were_proven():
    args = engine_args(ModelConfig.model_validate({"name": "tiny-llama"}))
    assert args.async_scheduling is False and args.enforce_eager  # nor CUDA graphs, by default


def test_a_cpu_hosts_kv_cache_is_sized_in_bytes_from_a_fraction_of_a_gib():
    from vllm.platforms import current_platform

    model = ModelConfig.model_validate({"name": "tiny-llama", "cpu_kv_cache_gib": 0.25})
    assert engine_args(model).kv_cache_memory_bytes == (2**28 if current_platform.is_cpu() else None)
    with pytest.raises(ValueError):
        ModelConfig.model_validate({"name": "tiny-llama", "cpu_kv_cache_gib": 0})


def test_a_request_that_waited_past_max_queue_wait_s_for_a_place_is_refused_on_arrival():
    check_queue_time(sent_at=100.0, ready_at=50.0, now=101.5, bound_s=2)  # waited 1.5 s
    with pytest.raises(QueueTimeout, match=r"waited 2.5 s .* max_queue_wait_s \(2 s\)"):
        check_queue_time(sent_at=100.0, ready_at=50.0, now=102.5, bound_s=2)
    # Sent before the replica was ready: it waited for the replica to start, not for room.
    check_queue_time(sent_at=100.0, ready_at=160.0, now=161.0, bound_s=2)


def test_importing_vllm_in_a_replica_leaves_ray_serves_log_open():
    """Ray Serve's replica log is a MemoryHandler, which a restarted controller reads to
    recover the replica; vLLM's own logging setup would close it."""
    script = "\n".join([
        "import logging, logging.handlers",
        "serve_log = logging.handlers.MemoryHandler(100, target=logging.StreamHandler())",
        "logging.getLogger('ray.serve').addHandler(serve_log)",
        "from serve_app.engine.vllm_adapter import log_vllm_beside_serve",
        "log_vllm_beside_serve()",
        # What vLLM's engine does as it starts, with the configuration the environment gives.
        "from vllm.config.logging import LoggingConfig",
        "from vllm.logger import configure_logging_if_needed",
        "configure_logging_if_needed(LoggingConfig())",
        "assert serve_log.target is not None, 'vLLM closed the handler'",
        "assert logging.getLogger('vllm').handlers"])
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)


@pytest.fixture(scope="module")
def engine_config():
    """The tiny model's engine config as the replica builds it (on this CPU host)."""
    return engine_args(ModelConfig.model_validate({"name": "tiny-llama"})).create_engine_config()


def test_where_vllm_would_run_its_model_runner_v2_the_replica_asks_for_v1(engine_config, monkeypatch):
    import vllm.config.vllm

    name, v1 = RUNNER_SWITCH
    monkeypatch.setenv(name, "unset below")
    monkeypatch.delenv(name)
    monkeypatch.setattr(vllm.config.vllm, "HAS_TRITON", True)  # as on CUDA, where Triton imports
    assert engine_config.use_v2_model_runner  # vLLM's own choice there
    refusal = r"vLLM chose its Model Runner V2 .* set VLLM_USE_V2_MODEL_RUNNER=0 \(it is None here\)"
    with pytest.raises(RuntimeError, match=refusal):
        check_runner(engine_config)
    ask_for_the_v1_runner()
    assert os.environ[name] == v1 and not engine_config.use_v2_model_runner
    check_runner(engine_config)


def test_a_runner_the_user_set_to_v2_is_refused_naming_it(engine_config, monkeypatch):
    monkeypatch.setenv(RUNNER_SWITCH[0], "1")
    ask_for_the_v1_runner()  # leaves the user's value, for the check to judge
    with pytest.raises(RuntimeError, match=r"Model Runner V2 .* \(it is '1' here\)"):
        check_runner(engine_config)
