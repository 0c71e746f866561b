import pytest
import yaml
from pydantic import ValidationError

from serve_app.app import build_app
from serve_app.config import AppConfig, Capabilities


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


def test_local_deployment_file_builds():
    with open("deployments/local.yaml") as file:
        document = yaml.safe_load(file)
    (application,) = document["applications"]
    assert application["import_path"] == "serve_app.app:build_app"
    app = build_app(application["args"])
    assert app is not None
