"""The two error rows a healthy service cannot show over HTTP: the handlers themselves."""

import asyncio
from types import SimpleNamespace

import orjson
import pytest
from starlette.requests import Request

from serve_app.errors import APIError
from serve_app.ingress import Ingress, internal_error


class Failing:
    class check_health:
        @staticmethod
        async def remote():
            raise RuntimeError("engine died")


def test_not_ready_when_a_replica_fails_its_health_check():
    ingress = SimpleNamespace(replicas={"m": Failing()})
    with pytest.raises(APIError) as caught:
        asyncio.run(Ingress.func_or_class.health(ingress))
    assert (caught.value.status, caught.value.code) == (503, "not_ready")


def test_internal_error_is_an_envelope():
    request = Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []})
    response = asyncio.run(internal_error(request, ValueError("boom")))
    assert response.status_code == 500
    assert orjson.loads(response.body)["error"]["code"] == "internal_error"
