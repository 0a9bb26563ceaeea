"""A ``llama-server`` stand-in: llama.cpp's server tests start it with llama-server's command
line; it starts ``igi-sdk serve --http`` in its place (exec, so the tests' SIGTERM reaches the
sidecar itself).

The sidecar always serves its default model (SmolLM2-135M-Instruct): the tests name models on
the Hugging Face hub, which the sidecar never fetches. Options that only tune llama-server's own
machinery are accepted and dropped; options asking for what the sidecar does not have (LoRA,
draft models, slot files, a model router, MCP, server-side tools) make it exit with status 2,
so a test that needs them fails at once with a clear reason instead of passing on something else.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# option -> number of values it takes; the value is read and dropped
IGNORED: dict[str, int] = {
    # the model: always the sidecar's default one
    "--model": 1, "-m": 1, "--hf-repo": 1, "-hfr": 1, "--hf-file": 1, "-hff": 1,
    "--model-url": 1, "--alias": 1, "--tags": 1, "--offline": 0,
    # the chat template: always the model's own
    "--jinja": 0, "--no-jinja": 0, "--chat-template": 1, "--chat-template-file": 1,
    "--reasoning-format": 1, "--reasoning": 1,
    # llama-server's own defaults and machinery with no sidecar equivalent
    "--temp": 1, "--seed": 1, "--n-predict": 1, "--batch-size": 1, "--ubatch-size": 1,
    "--n-gpu-layers": 1, "-ctk": 1, "-ctv": 1, "-fa": 1, "--cont-batching": 0,
    "--kv-unified": 0, "--swa-full": 0, "--no-slots": 0, "--slots": 0, "--metrics": 0,
    "--embedding": 0, "--pooling": 1, "--verbose": 0, "--no-ui": 0,
    "--cache-ram": 1, "--no-cache-idle-slots": 0, "--backend_sampling": 0,
    "--grp-attn-n": 1, "--grp-attn-w": 1, "--no-mmproj": 0,
}

# what the sidecar has no equivalent of: refused (exit 2)
REFUSED = frozenset({
    "--lora", "--model-draft", "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min",
    "--spec-synth-len", "--spec-synth-rates", "--slot-save-path", "--models-dir",
    "--models-max", "--models-preset", "--no-models-autoload", "--reranking", "--mmproj-url",
    "--media-path", "--sleep-idle-seconds", "--ui-mcp-proxy", "--tools", "--tools-runtime",
    "--mcp-servers-config", "--mcp-servers-json", "--cors-origins",
})


class Refused(Exception):
    pass


def translate(argv: list[str], workdir: Path) -> list[str]:
    """llama-server's arguments -> ``igi-sdk serve`` arguments (without the program name)."""
    host, port = "127.0.0.1", "8080"
    ctx, slots, threads, api_key = None, None, None, None
    # llama-server refuses a prompt over a slot's context unless --context-shift drops its
    # oldest tokens: the face's memory "off" and "fold" (which keeps a summary of them)
    memory = "off"
    i = 0
    while i < len(argv):
        opt = argv[i]
        val = argv[i + 1] if i + 1 < len(argv) else None
        if opt in REFUSED:
            raise Refused(f"{opt} has no equivalent in igi-sdk serve")
        if opt in IGNORED:
            i += 1 + IGNORED[opt]
            continue
        if opt == "--context-shift":
            memory = "fold"
            i += 1
            continue
        if val is None:
            raise Refused(f"{opt}: unknown option or missing value")
        if opt == "--host":
            host = val
        elif opt == "--port":
            port = val
        elif opt in ("--ctx-size", "-c"):
            ctx = val
        elif opt in ("--parallel", "-np"):
            slots = val
        elif opt in ("--threads", "-t"):
            threads = val
        elif opt == "--api-key":
            api_key = val
        else:
            raise Refused(f"{opt}: unknown option")
        i += 2
    if "," in host:  # llama-server listens on several addresses; the face on one
        raise Refused(f"--host {host}: one address only")
    # the face's address; the ZeroMQ endpoint on a free port (never a fixed one another
    # sidecar on the machine may hold)
    out = ["serve", "--http", f"{host}:{port}", "--endpoint", "tcp://127.0.0.1:0",
           "--log-file", str(workdir / "sidecar.log"), "--save-dir", str(workdir / "saves"),
           "--http-memory", memory]
    if ctx is not None:
        out += ["--ctx", ctx]
    if slots is not None:
        out += ["--max-sessions", slots]
    if ctx is not None and slots is not None:
        # llama-server splits its context among its slots: a request holds n_ctx / --parallel
        # tokens at most, prompt and reply; the sidecar's per-session cap is that rule
        out += ["--session-ctx", str(int(ctx) // max(1, int(slots)))]
    # a fixed count skips the half-second look at the CPUs' load at every start
    out += ["--threads", threads or str(min(4, os.cpu_count() or 1))]
    if api_key is not None:
        # the face reads its key from a file (a key on a command line is readable by all)
        key_file = workdir / "api-key"
        key_file.touch(mode=0o600)
        key_file.write_text(api_key)
        out += ["--api-key-file", str(key_file)]
    return out


def main() -> int:
    # the runner's folder when it gives one (it removes it); the sidecar's log stays there
    workdir = Path(tempfile.mkdtemp(prefix="llama-server-", dir=os.environ.get("IGI_STANDIN_DIR")))
    try:
        args = translate(sys.argv[1:], workdir)
    except Refused as e:
        print(f"llama-server stand-in: {e}", file=sys.stderr, flush=True)
        return 2
    cmd = [sys.executable, "-m", "igi_sdk.cli", *args]
    print("llama-server stand-in: " + " ".join(cmd), file=sys.stderr, flush=True)
    os.execv(sys.executable, cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
