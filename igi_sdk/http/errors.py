"""The sidecar's typed errors as OpenAI-shaped HTTP errors: ``{"error": {"message", "type",
"code"}}`` with the status a Chat Completions client expects, and ``Retry-After`` where waiting
helps."""

from __future__ import annotations

# protocol error code -> HTTP status (anything else: 500)
_STATUS = {
    "malformed": 400, "invalid_body": 400, "invalid_argument": 400, "invalid_grammar": 400,
    "invalid_image": 400, "invalid_sampling": 400, "vision_unavailable": 400,
    "unknown_session": 400, "invalid_state": 400,
    # OpenAI's own answer to a prompt over the context (a 400 its clients and LiteLLM map to
    # their context-window error): see from_code
    "prompt_too_long": 400,
    "too_many_sessions": 429, "busy": 429, "session_busy": 429, "context_full": 429,
    "session_owned": 429,
    "loading": 503, "no_model": 503, "engine_unavailable": 503, "engine_closed": 503,
    "cancelled": 499,
    # the upstream cluster (serve --upstream): gone or busy after the retries, or refusing
    "upstream_unavailable": 503, "upstream_refused": 502, "timeout": 504,
}
_TYPE = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         413: "invalid_request_error", 415: "invalid_request_error",
         429: "rate_limit_error", 503: "server_error", 499: "cancelled", 500: "server_error",
         502: "server_error", 504: "server_error"}
RETRY_AFTER_S = 1


class HttpError(Exception):
    """Not frozen: the ASGI stack clears ``__traceback__`` on the exceptions it has answered."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(status, code, message)
        self.status, self.code, self.message, self.param = status, code, message, param

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": _TYPE.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503, 504) else {}


def from_code(code: str, message: str) -> HttpError:
    """The HTTP error for a sidecar error ``code``."""
    if code == "prompt_too_long":  # OpenAI's shape, and the words its clients look for
        return HttpError(400, "context_length_exceeded", "This model's maximum context length "
                         f"is exceeded: {message}", param="messages")
    return HttpError(_STATUS.get(code, 500), code, message)
