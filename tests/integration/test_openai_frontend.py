"""The OpenAI-compatible frontend (``--openai-port``) with the official ``openai`` client, on the example
repository's toy text models: ``tiny_lm`` (decoupled, one response per word: the last user line's words in
reverse order) and ``tiny_embedding`` (hashed bag of words, FP32 [16])."""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.support.server import ServerProcess, free_port, start_server


@pytest.fixture(scope="module")
def server(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    port = free_port()
    proc = start_server(example_repository, f"--openai-port={port}", log_dir=tmp_path_factory.mktemp("logs"))
    yield proc, port
    proc.terminate()


@pytest.fixture(scope="module")
def client(server: tuple[ServerProcess, int]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server[1]}/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def base(server: tuple[ServerProcess, int]) -> str:
    return f"http://127.0.0.1:{server[1]}"


def expected_embedding(text: str) -> list[float]:
    vector = np.zeros(16, dtype=np.float32)
    for word in text.lower().split():
        vector[zlib.crc32(word.encode()) % 16] += 1.0
    return (vector / np.linalg.norm(vector)).astype(np.float32).tolist()


def test_models_list(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list()}
    assert {"tiny_lm", "tiny_embedding", "add_sub"} <= models.keys()
    m = models["tiny_lm"]
    assert (m.object, m.owned_by) == ("model", "kubeinfer") and m.created > 0
    assert client.models.retrieve("tiny_lm").id == "tiny_lm"


def test_chat_completion(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="tiny_lm",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "the quick brown fox"}],
        temperature=0.5,
        seed=1,
    )
    assert out.object == "chat.completion" and out.model == "tiny_lm"
    choice = out.choices[0]
    assert (choice.message.role, choice.message.content, choice.finish_reason) == (
        "assistant",
        "fox brown quick the",
        "stop",
    )
    assert out.usage is not None and out.usage.completion_tokens == 4


def test_chat_completion_streamed(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny_lm",
        messages=[{"role": "user", "content": "alpha beta gamma"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert contents == ["gamma", " beta", " alpha"]  # one chunk per response of the decoupled model
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_completion(client: openai.OpenAI) -> None:
    out = client.completions.create(model="tiny_lm", prompt="one two three")
    assert out.object == "text_completion"
    assert (out.choices[0].text, out.choices[0].finish_reason) == ("three two one", "stop")
    short = client.completions.create(model="tiny_lm", prompt="one two three", max_tokens=2)
    assert (short.choices[0].text, short.choices[0].finish_reason) == ("three two", "length")
    stopped = client.completions.create(model="tiny_lm", prompt="one two three", stop=["two"])
    assert stopped.choices[0].text == "three"


def test_completion_streamed(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="tiny_lm", prompt="a b c d", stream=True))
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == "d c b a"
    assert [c.choices[0].text for c in chunks[:4]] == ["d", " c", " b", " a"]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_streams_end_with_done(base: str) -> None:
    body = {"model": "tiny_lm", "prompt": "x y", "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"


def test_embeddings(client: openai.OpenAI) -> None:
    out = client.embeddings.create(
        model="tiny_embedding", input=["hello world", "Hello there"], encoding_format="float"
    )
    assert out.object == "list" and out.model == "tiny_embedding"
    assert [d.index for d in out.data] == [0, 1]
    np.testing.assert_allclose(out.data[0].embedding, expected_embedding("hello world"), rtol=1e-6)
    np.testing.assert_allclose(out.data[1].embedding, expected_embedding("Hello there"), rtol=1e-6)
    assert out.usage.prompt_tokens == 4


def test_embeddings_base64(base: str) -> None:
    r = httpx.post(
        f"{base}/v1/embeddings",
        json={"model": "tiny_embedding", "input": "hello world", "encoding_format": "base64"},
        timeout=30,
    )
    vector = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, expected_embedding("hello world"), rtol=1e-6)


def test_unknown_model_is_404(client: openai.OpenAI, base: str) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 404
    r = httpx.post(f"{base}/v1/completions", json={"model": "nope", "prompt": "hi"}, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 404 and error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
    assert "nope" in error["message"]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="hi")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_bad_body_is_400(client: openai.OpenAI, base: str) -> None:
    for body in (b"{not json", b"[1]", b'{"prompt": "x"}', b'{"model": "tiny_lm", "prompt": 3}'):
        r = httpx.post(f"{base}/v1/completions", content=body, timeout=30)
        assert r.status_code == 400, body
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.BadRequestError, match="only single choice"):
        client.completions.create(model="tiny_lm", prompt="x", n=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny_lm", messages=[{"role": "user", "content": "x"}], temperature=5)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny_lm", messages=[])


def test_model_without_the_conventions_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="text_input.*text_output"):
        client.completions.create(model="add_sub", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="not an embedding model"):
        client.embeddings.create(model="add_sub", input="hi")


def test_off_by_default() -> None:
    from kubeinfer.server.cli import build_parser

    assert build_parser().parse_args([]).openai_port == -1


def test_bearer_token(example_repository: Path, tmp_path: Path) -> None:
    """--auth-token-file guards /v1/... here too: OpenAI clients send the api_key as a bearer token."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    port = free_port()
    proc = start_server(
        example_repository,
        f"--openai-port={port}",
        f"--auth-token-file={token}",
        "--load-model=tiny_lm",
        "--model-control-mode=explicit",
        log_dir=tmp_path,
    )
    try:
        url = f"http://127.0.0.1:{port}/v1"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=url, api_key="s3cret", max_retries=0)
        assert [m.id for m in good.models.list()] == ["tiny_lm"]
        out = good.completions.create(model="tiny_lm", prompt="a b")
        assert out.choices[0].text == "b a"
    finally:
        proc.terminate()
