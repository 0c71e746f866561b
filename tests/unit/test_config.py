import pathlib

import pytest
import yaml
from pydantic import ValidationError

from serve_app.config import AppConfig, Capabilities
from serve_app.ops.app import build_app


def test_max_scored_tokens_defaults_to_the_context():
    assert Capabilities(max_model_len=512).max_scored_tokens == 512
    assert Capabilities(max_model_len=512, max_scored_tokens=100).max_scored_tokens == 100


def test_a_model_needs_a_path_unless_embedded():
    with pytest.raises(ValidationError, match="needs a path"):
        AppConfig(models=[{"name": "mine"}])
    assert AppConfig(models=[{"name": "mine", "path": "/models/mine"}]).models[0].path


def test_unknown_config_keys_are_refused():
    with pytest.raises(ValidationError):
        AppConfig(models=[{"name": "tiny-llama", "max_logprob": 5}])


def test_names_are_unique():
    with pytest.raises(ValidationError, match="unique"):
        AppConfig(models=[{"name": "tiny-llama"}, {"name": "tiny-llama"}])


@pytest.mark.parametrize("path", sorted(pathlib.Path("deployments").glob("*.yaml")))
def test_deployment_files_build(path):
    (application,) = yaml.safe_load(path.read_text())["applications"]
    assert application["import_path"] == "serve_app.ops.app:build_app"
    assert build_app(application["args"]) is not None


@pytest.mark.parametrize("autoscaling", [{"bogus": 1}, {"min_replicas": -1}])
def test_autoscaling_config_is_checked(autoscaling):
    with pytest.raises(ValidationError, match="autoscaling_config"):
        AppConfig(models=[{"name": "tiny-llama", "autoscaling_config": autoscaling}])


def test_the_ingress_must_hold_what_its_models_take_and_queue():
    models = [{"name": "tiny-llama", "max_ongoing_requests": 100, "max_queued_requests": 100,
               "autoscaling_config": {"min_replicas": 1, "max_replicas": 2}}]
    with pytest.raises(ValueError, match="at least 318"):
        AppConfig(models=models, ingress={"max_ongoing_requests": 317})
    AppConfig(models=models, ingress={"max_ongoing_requests": 318})


def test_the_ingress_default_holds_what_three_models_on_their_defaults_take_and_queue():
    """A service of a few models needs no ingress bound of its own (AppConfig checks it)."""
    AppConfig(models=[{"name": name} for name in ("tiny-llama", "tiny-llama3", "tiny-sentencepiece")])
