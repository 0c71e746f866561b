"""OpenAI's error envelope: {"error": {"message", "type", "param", "code"}}."""

from http import HTTPStatus

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    409: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """A request the service refuses, with what a client program needs to act on it."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers

    def envelope(self) -> dict:
        return error_envelope(self.status, self.code, self.message, self.param)


def error_envelope(status: int, code: str, message: str, param: str | None = None) -> dict:
    error_type = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def invalid(param: str | None, message: str, code: str = "invalid_request") -> APIError:
    return APIError(HTTPStatus.BAD_REQUEST, code, message, param)


def overloaded(message: str, retry_after_s: int) -> APIError:
    """A request refused because a bound is full: the client may retry after a while."""
    return APIError(HTTPStatus.SERVICE_UNAVAILABLE, "overloaded", message,
                    headers={"Retry-After": str(retry_after_s)})


def not_ready(message: str, retry_after_s: int) -> APIError:
    return APIError(HTTPStatus.SERVICE_UNAVAILABLE, "not_ready", message,
                    headers={"Retry-After": str(retry_after_s)})
