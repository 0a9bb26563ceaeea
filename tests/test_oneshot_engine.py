"""The engine's side of tokenize/detokenize/embed/complete with the default model: an embedding
batch read a decode at a time between an NPC's decode steps, the embeddings context going with
its placement, a raw completion's session given back. (Request mapping and bounds: the pure tests
at the end.)"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from igi_sdk.errors import InvalidInputError, PromptTooLongError
from igi_sdk.events import ReplyEvent, ReplyText
from igi_sdk.http import extra_schema as S
from igi_sdk.http.errors import HttpError
from igi_sdk.runtime import commands as C
from igi_sdk.runtime import oneshot, oneshot_calls
from igi_sdk.runtime.engine import Engine, EngineConfig
from igi_sdk.runtime.sampling import SamplingParams
from igi_sdk.wire import protocol as P


@pytest.fixture(scope="module")
def engine(default_model):
    with Engine(default_model, config=EngineConfig(n_ctx=2048, max_sessions=3)) as eng:
        yield eng


def test_a_big_embed_batch_is_read_between_an_npcs_decode_steps(engine) -> None:
    sid = engine.open_session("You are a bard.")
    order: list[str] = []  # appended on the outbox thread, in the order things happened
    lock = threading.Lock()
    first_token = threading.Event()

    def listener(ev: ReplyEvent) -> None:
        if isinstance(ev, ReplyText):
            with lock:
                order.append("token")
            first_token.set()

    reply = engine.chat(sid, "Tell a long tale.", max_tokens=200, ignore_eos=True,
                        listener=listener)
    assert first_token.wait(60)
    sent: list[C.Command] = []

    def submit(cmd: C.Command) -> Future:
        sent.append(cmd)
        fut = engine._submit(cmd)

        def noted(_f: Future) -> None:
            with lock:
                order.append("embed")
        fut.add_done_callback(noted)
        return fut

    texts = [f"Memory {i}: the guard saw a grey wolf near the north gate at dusk."
             for i in range(24)]
    out = oneshot_calls.embed(submit, texts, True).result(600)
    reply.result(600)
    engine.close_session(sid)
    assert len(out.vectors) == 24 and out.pooling == "mean"
    assert len(sent) >= 24 // oneshot.EMBED_SEQS  # at most EMBED_SEQS inputs per decode
    embeds = [i for i, what in enumerate(order) if what == "embed"]
    # the NPC's reply went on between the batch's decodes: it was not held for the batch
    assert "token" in order[embeds[0]:embeds[-1]]


def test_the_embeddings_context_goes_with_its_placement(engine) -> None:
    engine.embed_async(["a first memory"]).result(300)
    assert engine._call(lambda: engine._core._embedder.open)
    opens = engine._core._embedder.opens
    engine.reshard(engine.plan)
    assert not engine._call(lambda: engine._core._embedder.open)  # freed with the placement
    again = engine.embed_async(["a first memory"]).result(300)
    assert engine._core._embedder.opens == opens + 1 and len(again.vectors) == 1


def test_bad_embed_inputs_are_refused_typed(engine) -> None:
    with pytest.raises(PromptTooLongError):
        engine.embed_async(["word " * (oneshot.EMBED_CTX + 10)]).result(300)
    with pytest.raises(InvalidInputError):
        engine.embed_async([[10**8]]).result(300)


def test_an_empty_text_is_embedded_as_the_bos_token_alone(engine) -> None:
    # a model that adds no BOS (SmolLM2) has no tokens for "": read as its BOS, not refused
    bos = engine._call(lambda: oneshot.empty_text_token(engine._core._need_vocab()))
    out = engine.embed_async(["", "a memory", [bos]]).result(300)
    assert len(out.vectors) == 3 and len(out.vectors[0]) > 1
    assert out.vectors[0] == pytest.approx(out.vectors[2], abs=1e-5)
    assert out.vectors[0] != pytest.approx(out.vectors[1], abs=1e-3)


def test_a_raw_completion_gives_its_session_back(engine) -> None:
    before = len(engine.sessions())
    g = engine.complete_async("1, 2, 3, 4,", max_tokens=6,
                              sampling=SamplingParams(temperature=0.0)).result(300)
    r = g.result(300)
    assert 1 <= r.completion_tokens <= 6
    for _ in range(100):  # the close is queued when the reply ends
        if len(engine.sessions()) == before:
            break
        threading.Event().wait(0.02)
    assert len(engine.sessions()) == before


def test_a_prompt_of_token_ids_reads_as_its_text(engine) -> None:
    text = "1, 2, 3, 4,"
    ids = engine.tokenize_async(text, add_special=True).result(10).tokens
    greedy = SamplingParams(temperature=0.0)

    def said(prompt: str | list[str | int]) -> str:
        return engine.complete_async(prompt, max_tokens=6, sampling=greedy).result(300) \
            .result(300).text

    head = engine.detokenize_async(ids[:2]).result(10)
    rest = text[len(head):]
    assert engine.tokenize_async(rest).result(10).tokens == ids[2:]  # the test's own premise
    assert said(ids) == said(text) == said([*ids[:2], rest])  # ids, text, both: one prompt
    with pytest.raises(InvalidInputError):  # an id outside the vocabulary: refused, typed
        engine.complete_async([*ids, 10**8], max_tokens=2).result(300)
    # the special ids are explicit: they are read as the tokens they are
    im_start = engine.tokenize_async("<|im_start|>").result(10).tokens
    assert oneshot.mixed_pieces([*im_start, "user", 5]) == (tuple(im_start), "user", (5,))


def test_tokenize_parses_special_text_only_when_asked(engine) -> None:
    parsed = engine.tokenize_async("<|im_end|>").result(10)
    text = engine.tokenize_async("<|im_end|>", parse_special=False).result(10)
    assert len(parsed.tokens) == 1 < len(text.tokens)
    assert engine.detokenize_async(parsed.tokens).result(10) == "<|im_end|>"


# --- pure: the HTTP bodies mapped onto the protocol ---------------------------------------------


def test_llamaserver_defaults_map_to_a_complete() -> None:
    req = S.NativeCompletionRequest.model_validate(
        {"prompt": "hi", "n_predict": -1, "tfs_z": 1.0, "typical_p": 1.0, "mirostat": 0,
         "grammar": "", "seed": -1, "top_k": 0, "repeat_penalty": 0.0,
         "stop": ["a", None, ""]})
    opts = req.complete_options()
    assert opts["max_tokens"] == 4096 and opts["stop"] == ["a"] and "grammar" not in opts
    assert opts["parse_special"] is True
    s = opts["sampling"]
    assert s["top_k"] == 0 and s["repeat_penalty"] == 1.0 and 0 <= s["seed"] < 2**32
    seeds = {S.NativeCompletionRequest(prompt="x").complete_options()["sampling"]["seed"]
             for _ in range(8)}
    assert len(seeds) > 1  # no seed: a random one each time


def test_llamaserver_prompt_forms_and_their_bounds() -> None:
    def prompts(p: object) -> list:
        return S.NativeCompletionRequest.model_validate({"prompt": p}).prompts()

    assert prompts("a") == ["a"]
    assert prompts([1, 2, 3]) == [[1, 2, 3]]  # token ids: one prompt
    assert prompts([1, "a", 2]) == [[1, "a", 2]]  # texts and ids: one prompt
    assert prompts([[1, 2], "a"]) == [[1, 2], "a"]  # a list holding a list: several
    assert prompts(["a", "b"]) == ["a", "b"]  # only texts: several, as llama-server reads it
    assert prompts({"prompt_string": "a"}) == ["a"]  # llama-server's prompt object
    assert prompts([[1], {"prompt_string": "a"}]) == [[1], "a"]
    with pytest.raises(HttpError):  # no images in a raw prompt
        prompts({"prompt_string": "a", "multimodal_data": ["iVBORw0KGgo="]})
    for bad in ([], [-1], [True], [1.5], [[]], [[1]] * (S.MAX_PROMPTS + 1),
                [1] * (P.MAX_TOKEN_IDS + 1), {"text": "a"}):
        with pytest.raises(ValueError):
            prompts(bad)
    with pytest.raises(HttpError):
        prompts(["a"] * (S.MAX_PROMPTS + 1))


def test_llamaserver_logit_bias_forms() -> None:
    def entries(b: object) -> list:
        return S.NativeCompletionRequest.model_validate(
            {"prompt": "x", "logit_bias": b}).bias_entries()

    assert entries([[15, -100], [" the", 2.5]]) == [(15, -100.0), (" the", 2.5)]
    assert entries({"15": False, " cat": 1}) == [(15, -100.0), (" cat", 1.0)]  # false: banned
    assert entries([]) == entries(None) == []
    for bad in ([[15, 101]], [[-1, 1]], [[15]], {"a": "1"}, [[15, 1]] * 257):
        with pytest.raises(ValueError):
            entries(bad)
    for bad in ([[15, True]], {f"w{i}": 1 for i in range(S.MAX_BIAS_TEXTS + 1)}):
        with pytest.raises(HttpError):
            entries(bad)


@pytest.mark.parametrize("body", [{"mirostat": 1}, {"tfs_z": 0.9}, {"typical_p": 0.5},
                                  {"n_probs": 3}, {"ignore_eos": True},
                                  {"stop": [str(i) for i in range(9)]}])
def test_samplers_the_engine_lacks_are_refused_not_dropped(body) -> None:
    with pytest.raises(HttpError) as e:
        S.NativeCompletionRequest.model_validate({"prompt": "x", **body}).complete_options()
    assert e.value.status == 400


def test_openai_inputs_and_their_bounds() -> None:
    one = S.EmbeddingsRequest.model_validate({"input": "a"})
    assert one.inputs() == ["a"]
    assert S.EmbeddingsRequest.model_validate({"input": [1, 2]}).inputs() == [[1, 2]]
    assert S.EmbeddingsRequest.model_validate({"input": [[1], [2]]}).inputs() == [[1], [2]]
    for bad in ({"input": []}, {"input": ["a"] * 65}, {"input": [-1]},
                {"input": "x" * (P.MAX_TEXT_CHARS + 1)}):
        with pytest.raises(ValueError):
            S.EmbeddingsRequest.model_validate(bad)
    with pytest.raises(HttpError):
        S.EmbeddingsRequest.model_validate({"input": "a", "encoding_format": "hex"}).inputs()
    c = S.CompletionsRequest.model_validate({"prompt": ["only one"]})
    assert c.the_prompt() == "only one" and c.complete_options()["max_tokens"] == 16
    with pytest.raises(ValueError):
        S.CompletionsRequest.model_validate({"prompt": ["a", "b"]})


def test_the_new_routes_need_the_api_key_and_bound_the_body(tmp_path) -> None:
    from fastapi.testclient import TestClient

    from igi_sdk.http.app import HttpConfig, build_app

    app = build_app(HttpConfig(endpoint=f"ipc://{tmp_path / 'none.sock'}", owner="o" * 32,
                               api_key="k" * 16, timeout_s=2.0))
    with TestClient(app, raise_server_exceptions=False) as http:
        for route, body in (("/v1/embeddings", {"input": "a"}),
                            ("/v1/completions", {"prompt": "a"}),
                            ("/completion", {"prompt": "a"}), ("/tokenize", {"content": "a"}),
                            ("/detokenize", {"tokens": [1]}), ("/embeddings", {"content": "a"})):
            r = http.post(route, json=body)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        auth = {"authorization": "Bearer " + "k" * 16}
        big = http.post("/tokenize", headers={**auth, "content-type": "application/json"},
                        content=b" " * (S.MAX_BODY_BYTES + 1))
        assert big.status_code == 413
        many = http.post("/v1/embeddings", headers={**auth, "content-type": "application/json"},
                         content=b'{"input": [' + b'"a",' * 40_000 + b'"a"]}')
        assert many.status_code == 413  # the JSON values are counted before the parse
