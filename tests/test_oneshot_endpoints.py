"""tokenize, detokenize, embed and complete (protocol 1.3) against the real sidecar with the
default model: over the ZeroMQ protocol (the Python client) and over the HTTP face, with the
official ``openai`` package for /v1/embeddings and /v1/completions, and raw HTTP in the shapes
LLMUnity's remote mode and CHIM's ``llamacpp`` connector send for the native routes."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import httpx
import openai
import pytest

from igi_sdk.client import BridgeError, Client
from igi_sdk.wire import protocol as P
from tests.sidecars import http_sidecar, openai_api

SIMILAR = ("The blacksmith forges a sword from iron.", "A smith hammers iron into a blade.")
UNRELATED = "The tax office opens on Monday mornings."
SESSION_CTX = 512  # serve --session-ctx: the most one session (a completion's too) may hold


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture(scope="module")
def face(tmp_path_factory, default_model) -> Iterator[tuple[str, str]]:
    with http_sidecar(tmp_path_factory, default_model, "--max-sessions", "4",
                      "--session-ctx", str(SESSION_CTX)) as f:
        yield f


@pytest.fixture
def client(face) -> Iterator[Client]:
    c = Client(face[1], timeout=60)
    yield c
    c.close()


@pytest.fixture
def api(face) -> openai.OpenAI:
    return openai_api(face[0])


# --- the protocol ------------------------------------------------------------------------------


def test_hello_offers_the_features(client) -> None:
    assert {"tokenize", "embed", "complete"} <= set(client.hello()["features"])


def test_tokenize_and_detokenize_round_trip(client) -> None:
    text = "Brom's forge: 12 swords, <|im_end|> and ünïcödé."
    out = client.tokenize(text, with_pieces=True)
    assert len(out["tokens"]) == len(out["pieces"]) > 5
    assert client.detokenize(out["tokens"]) == text
    # a piece that is part of a UTF-8 character shows as U+FFFD; ASCII pieces join up
    ascii_text = "Brom's forge: 12 swords."
    assert "".join(client.tokenize(ascii_text, with_pieces=True)["pieces"]) == ascii_text
    # special-token text is one token when parsed, several when read as text
    assert len(client.tokenize("<|im_end|>")["tokens"]) == 1
    assert len(client.tokenize("<|im_end|>", parse_special=False)["tokens"]) > 1


def test_a_bad_token_id_is_refused_typed(client) -> None:
    with pytest.raises(BridgeError) as e:
        client.detokenize([10**9])
    assert e.value.code == "invalid_input"


def test_embeddings_put_similar_texts_closer(client) -> None:
    out = client.embed([*SIMILAR, UNRELATED])
    a, b, c = out["data"]
    assert len(a) == len(b) == len(c) > 100 and out["tokens"] > 10
    assert out["pooling"] == "mean"  # a generative model: mean-pooled
    assert abs(sum(x * x for x in a) - 1.0) < 1e-4  # normalised
    assert _cos(a, b) > _cos(a, c) and _cos(a, b) > _cos(b, c)


def test_a_batch_of_64_inputs_is_read_in_several_engine_commands(client) -> None:
    texts = [f"wolf {i}" for i in range(64)]  # short: the cap is on inputs, not tokens
    out = client.embed(texts)
    assert len(out["data"]) == 64
    # the same text gives the same vector wherever it sits in the batch
    again = client.embed([texts[40]])["data"][0]
    assert _cos(out["data"][40], again) > 0.9999
    with pytest.raises(BridgeError) as e:
        client.embed([*texts, "one too many"])
    assert e.value.code == "invalid_body"


def test_an_input_longer_than_the_embedding_context_is_refused(client) -> None:
    with pytest.raises(BridgeError) as e:
        client.embed(["word " * 900])
    assert e.value.code == "prompt_too_long"


def test_complete_streams_a_raw_prompt_and_frees_its_session(client) -> None:
    before = client.list_sessions()["free_slots"]
    stream = client.complete("Once upon a time", max_tokens=8, sampling={"temperature": 0})
    pieces = list(stream)
    assert pieces and stream.done is not None
    assert stream.done["usage"]["completion_tokens"] <= 8
    assert "".join(pieces) == stream.done["text"]
    assert client.list_sessions()["free_slots"] == before


def test_complete_reads_special_token_text_as_text_unless_asked(client) -> None:
    prompt = "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"
    as_text = client.complete(prompt, max_tokens=4, sampling={"temperature": 0}).result()
    as_markup = client.complete(prompt, max_tokens=4, sampling={"temperature": 0},
                                parse_special=True).result()
    assert as_text["usage"]["prompt_tokens"] > as_markup["usage"]["prompt_tokens"]


def test_complete_refuses_bad_options_typed(client) -> None:
    with pytest.raises(BridgeError) as e:
        client.complete("x", max_tokens=0).result()
    assert e.value.code == "invalid_body"
    with pytest.raises(BridgeError) as e:
        client.complete("x", grammar="root ::= (", max_tokens=4).result()
    assert e.value.code == "invalid_grammar"


# --- the HTTP face -------------------------------------------------------------------------------


def test_openai_embeddings_float_and_base64(api) -> None:
    r = api.embeddings.create(model="smol", input=[*SIMILAR, UNRELATED])  # base64 by default
    a, b, c = (d.embedding for d in r.data)
    assert [d.index for d in r.data] == [0, 1, 2] and r.usage.prompt_tokens > 10
    assert _cos(a, b) > _cos(a, c)
    f = api.embeddings.create(model="smol", input=SIMILAR[0], encoding_format="float")
    assert len(f.data) == 1 and _cos(f.data[0].embedding, a) > 0.9999
    tokens = api.embeddings.create(model="smol", input=[[504, 3458, 314]],
                                   encoding_format="float")
    assert len(tokens.data[0].embedding) == len(a)


def test_openai_completions_plain_and_streamed(api) -> None:
    r = api.completions.create(model="smol", prompt="The village of Ashford is", max_tokens=8,
                               temperature=0, seed=1)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 8
    chunks = list(api.completions.create(model="smol", prompt="The village of Ashford is",
                                         max_tokens=8, temperature=0, seed=1, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text  # same seed
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_openai_bad_input_is_a_typed_4xx(api) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        api.embeddings.create(model="smol", input=[])
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError):
        api.embeddings.create(model="smol", input=[[10**9]])
    with pytest.raises(openai.BadRequestError):
        api.completions.create(model="smol", prompt="x", max_tokens=4, n=2)


def test_native_tokenize_detokenize_in_llmunitys_shapes(face) -> None:
    base = face[0]
    tok = httpx.post(f"{base}/tokenize", json={"content": "Hello there, traveller!"}).json()
    assert tok["tokens"] and all(isinstance(t, int) for t in tok["tokens"])
    back = httpx.post(f"{base}/detokenize", json={"tokens": tok["tokens"]}).json()
    assert back == {"content": "Hello there, traveller!"}
    pieces = httpx.post(f"{base}/tokenize", json={"content": "Hi there",
                                                  "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hi there"
    emb = httpx.post(f"{base}/embeddings", json={"content": SIMILAR[0]}).json()
    assert len(emb["embedding"]) > 100
    bad = httpx.post(f"{base}/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_body"


def _llmunity_request(prompt: str, stream: bool, n_predict: int = 12) -> dict:
    """Every field LLMUnity's ChatRequest serialises, at its defaults."""
    return {"prompt": prompt, "id_slot": -1, "temperature": 0.2, "top_k": 40, "top_p": 0.9,
            "min_p": 0.05, "n_predict": n_predict, "n_keep": -1, "stream": stream,
            "stop": ["<|im_end|>"], "tfs_z": 1.0, "typical_p": 1.0, "repeat_penalty": 1.1,
            "repeat_last_n": 64, "penalize_nl": True, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "penalty_prompt": "", "mirostat": 0, "mirostat_tau": 5.0,
            "mirostat_eta": 0.1, "grammar": "", "seed": 0, "ignore_eos": False,
            "n_probs": 0, "cache_prompt": True}


CHATML = ("<|im_start|>system\nYou are Brom, a blacksmith.<|im_end|>\n<|im_start|>user\n"
          "What do you sell?<|im_end|>\n<|im_start|>assistant\n")


def test_native_completion_as_llmunity_sends_it(face) -> None:
    base = face[0]
    r = httpx.post(f"{base}/completion", json=_llmunity_request(CHATML, False), timeout=120)
    body = r.json()
    assert r.status_code == 200 and body["stop"] is True and body["content"]
    assert 1 <= body["tokens_predicted"] <= 12 and body["tokens_evaluated"] > 10
    assert body["stop_type"] in ("eos", "word", "limit")
    with httpx.stream("POST", f"{base}/completion", json=_llmunity_request(CHATML, True),
                      timeout=120) as s:
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    parts = [json.loads(ln[6:]) for ln in lines]
    assert parts[-1]["stop"] is True and all(p["stop"] is False for p in parts[:-1])
    assert "".join(p["content"] for p in parts) == body["content"]  # seed 0 both times
    warm = httpx.post(f"{base}/completion", json=_llmunity_request(CHATML, False, 0)).json()
    assert warm["content"] == "" and warm["tokens_predicted"] == 0
    assert warm["tokens_evaluated"] == body["tokens_evaluated"]


def test_native_completion_as_chims_llamacpp_connector_sends_it(face) -> None:
    base = face[0]
    grammar = ('root ::= fullanswer\nfullanswer ::= "Brom: " answer\n'
               'answer ::= sentence | sentence "\\n"\nsentence ::= [a-zA-Z0-9.,?!\' ]*\n')
    req = {"prompt": CHATML, "temperature": 0.9, "top_p": 0.9, "n_predict": 24,
           "repeat_penalty": 1.12, "stop": ["Player:", "\nPlayer ", "Author's notes", "###",
                                            "```", "<|im_start|>", None],
           "stream": True, "cache_prompt": True, "grammar": grammar}
    with httpx.stream("POST", f"{base}/completion", json=req, timeout=120) as s:
        assert s.status_code == 200
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: {")]
    text = "".join(json.loads(ln[6:])["content"] for ln in lines)
    assert text.startswith("Brom: ")  # the grammar held


def test_native_bad_requests_are_typed_4xx(face) -> None:
    base = face[0]
    cases = [({"prompt": "x", "mirostat": 2}, 400), ({"prompt": "x", "stop": ["a"] * 9}, 400),
             ({"prompt": "x" * (P.MAX_TEXT_CHARS + 1)}, 400), ({"n_predict": 3}, 400)]
    for body, status in cases:
        r = httpx.post(f"{base}/completion", json=body)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["code"] in ("invalid_argument", "invalid_body")
    r = httpx.post(f"{base}/tokenize", content=b'{"content": ' + b'"a",' * 70_000 + b'}',
                   headers={"content-type": "application/json"})
    assert r.status_code in (400, 413)
    r = httpx.post(f"{base}/tokenize", content=b"content=x",
                   headers={"content-type": "text/plain"})
    assert r.status_code == 415  # the guard: no body a web page could send


def _completion(base: str, **body: object) -> httpx.Response:
    return httpx.post(f"{base}/completion", json={"temperature": 0, "n_predict": 6, **body},
                      timeout=120)


def test_native_completion_takes_llama_servers_prompt_forms(face) -> None:
    base = face[0]
    text = "I believe the meaning of life is"
    tokens = httpx.post(f"{base}/tokenize", json={"content": text, "add_special": True}
                        ).json()["tokens"]
    one = _completion(base, prompt=tokens)
    assert one.status_code == 200 and isinstance(one.json()["content"], str)
    assert one.json()["content"] == _completion(base, prompt=text).json()["content"]
    both = _completion(base, prompt=[tokens, text])  # a list of prompts: a list of results
    assert both.status_code == 200 and isinstance(both.json(), list)
    assert [r["content"] for r in both.json()] == [one.json()["content"]] * 2
    mixed = _completion(base, prompt=[1, 2, 3, 4, 5, 6, text, 7, 8, 9, 10, text])
    assert mixed.status_code == 200 and isinstance(mixed.json()["content"], str)
    warm = _completion(base, prompt=tokens, n_predict=0).json()
    assert warm["tokens_evaluated"] == len(tokens) and warm["tokens_predicted"] == 0
    bad = _completion(base, prompt=[*tokens, 10**8])  # not in the vocabulary: typed, no reply
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"
    bad = _completion(base, prompt=[text, [*tokens, 10**8]])  # checked before any is read
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"
    bad = _completion(base, prompt=[tokens, text], stream=True)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_argument"
    many = _completion(base, prompt=[text] * 9)  # a list of prompts is capped
    assert many.status_code == 400


def test_native_completion_honours_llama_servers_logit_bias_forms(face) -> None:
    base = face[0]
    prompt = "The capital of France is"
    first = _completion(base, prompt=prompt, n_predict=1).json()["content"]
    top = httpx.post(f"{base}/tokenize", json={"content": first}).json()["tokens"]
    assert len(top) == 1  # one greedy token
    for bias in ([[top[0], False]], {str(top[0]): -100}, [[first, -100]], {first: False}):
        r = _completion(base, prompt=prompt, n_predict=1, logit_bias=bias)
        assert r.status_code == 200, (bias, r.text)
        assert r.json()["content"] != first, bias  # banned: another token comes first
    favoured = _completion(base, prompt=prompt, n_predict=1, logit_bias=[[" banana", 100]])
    assert favoured.json()["content"] == httpx.post(
        f"{base}/detokenize", json={"tokens": httpx.post(
            f"{base}/tokenize", json={"content": " banana"}).json()["tokens"][:1]}
    ).json()["content"]
    for bad in ([[10**8, 1]], [[top[0], True]], [[top[0], 200]]):
        r = _completion(base, prompt=prompt, n_predict=1, logit_bias=bad)
        assert r.status_code == 400, bad


def test_a_prompt_over_the_session_cap_is_refused_typed(face, client) -> None:
    base = face[0]
    long_prompt = "word " * (SESSION_CTX + 50)  # a token a word at least: over the cap
    r = _completion(base, prompt=long_prompt)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert "exceeds the available context size" in r.json()["error"]["message"]
    with pytest.raises(BridgeError) as e:
        client.complete(long_prompt, max_tokens=4).result()
    assert e.value.code == "prompt_too_long"
    # what the context's floors would leave a session (4096 - 3 x 512) is far more: the cap
    assert client.stats()["limits"]["n_ctx_per_session"] == SESSION_CTX
    short = _completion(base, prompt="word " * (SESSION_CTX // 4))
    assert short.status_code == 200
