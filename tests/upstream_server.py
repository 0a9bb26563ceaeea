"""An independent OpenAI-compatible server for the scale-out tests: llama-cpp-python's own
``llama_cpp.server`` on a model file, with two test hooks beside its API (a middleware, not a
change of its code):

- ``GET /test/seen``: the chat requests it received (their affinity headers, prompt_cache_key,
  message count, Authorization), so a test sees what reached the cluster;
- ``POST /test/fail {"status": 503, "count": N}``: the next N chat requests are answered with
  that status (and ``Retry-After: 0``) before they reach the model — a busy replica.

Run: ``python tests/upstream_server.py MODEL PORT [API_KEY]``; it prints ``ready`` when serving.
"""

from __future__ import annotations

import json
import sys

import uvicorn
from llama_cpp.server.app import create_app
from llama_cpp.server.settings import ModelSettings, ServerSettings
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

STICKY = ("x-session-id", "x-dynamo-session-id")


def main() -> None:
    model, port = sys.argv[1], int(sys.argv[2])
    key = sys.argv[3] if len(sys.argv) > 3 else None
    app = create_app(
        server_settings=ServerSettings(host="127.0.0.1", port=port, api_key=key),
        model_settings=[ModelSettings(model=model, model_alias="upstream-model", n_ctx=2048,
                                      n_threads=1, n_threads_batch=1, verbose=False)])
    seen: list[dict[str, object]] = []
    failing = {"status": 0, "count": 0}

    @app.middleware("http")
    async def hooks(request: Request, call_next):  # type: ignore[no-untyped-def]
        if request.url.path == "/test/seen":
            return JSONResponse(seen)
        if request.url.path == "/test/fail":
            failing.update(json.loads(await request.body()))
            return JSONResponse(failing)
        if request.url.path.endswith("/chat/completions"):
            body = json.loads(await request.body())
            seen.append({
                "headers": {h: request.headers.get(h) for h in STICKY if h in request.headers},
                "authorization": request.headers.get("authorization"),
                "prompt_cache_key": body.get("prompt_cache_key"),
                "messages": len(body.get("messages", [])),
                "response_format": body.get("response_format"),
            })
            if failing["count"] > 0:
                failing["count"] -= 1
                return Response(json.dumps({"error": {"message": "replica busy"}}),
                                status_code=failing["status"], headers={"retry-after": "0"},
                                media_type="application/json")
        return await call_next(request)

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    print("ready", flush=True)
    server.run()


if __name__ == "__main__":
    main()
