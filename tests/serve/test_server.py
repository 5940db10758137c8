"""`cake serve` live on 127.0.0.1 with the official openai client (and httpx for raw status codes): chat and
text completions streamed and not, documents by reference and by upload, the errors (400, 401, 404, 413, 429)
as OpenAI's JSON, a client that goes away, and a bounded load test whose answers all equal the pipeline's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from cake_cli.engine.config import ConfigError  # noqa: E402 - after the skips
from cake_cli.errors import CakeError  # noqa: E402
from cake_cli.serve.errors import from_cake  # noqa: E402
from cake_cli.tasks import pipeline  # noqa: E402
from cake_cli.tasks.planning import plan  # noqa: E402
from cake_cli.tasks.request import TaskRequest  # noqa: E402
from tests.helpers.cli import invoke  # noqa: E402
from tests.serve.conftest import MODEL, free_port  # noqa: E402
from tests.tasks.test_documents import write_pdf  # noqa: E402

QUESTION = "Who may use the software?"
SHORT = 12  # tokens per answer: enough to compare, fast on two cores


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def chat(url: str, question: str = QUESTION, document: str = "notes.txt", **kw):
    cake = {"document": document, **kw.pop("cake", {})}
    return client(url).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        max_tokens=kw.pop("max_tokens", SHORT),
        extra_body={"cake": cake},
        **kw,
    )


def error_of(response: httpx.Response, status: int) -> dict:
    """The OpenAI-shaped error body of a refused request."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "code"}, body
    assert "Traceback" not in response.text
    return body["error"]


def post(url: str, body: dict, path: str = "/v1/chat/completions", **kw) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60, **kw)


def chat_body(**cake) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": SHORT,
        "cake": {"document": "notes.txt", **cake},
    }


def test_health_and_models(served):
    url, _ = served
    assert httpx.get(url + "/health").json() == {"status": "ok", "model": MODEL}
    assert [m.id for m in client(url).models.list().data] == [MODEL]


def test_chat_by_reference_equals_the_cli_on_the_cached_file(served, env):
    url, _ = served
    reply = chat(url)
    cake = reply.model_extra["cake"]
    answer = reply.choices[0].message.content
    assert answer and reply.choices[0].finish_reason in ("stop", "length")
    assert cake["document"] == "notes.txt" and cake["task"] == "qa" and cake["budget"] == 1024
    assert cake["cache"].startswith(".cake-cache/") and cake["cache"].endswith(".cake")
    assert cake["timings"]["first_token_seconds"] > 0 and cake["kv_bytes_full"] > 0
    assert 0 < reply.usage.completion_tokens <= SHORT
    # the CLI on the .cake file the server wrote gives the same answer
    cli = invoke("qa", env[0] / cake["cache"], QUESTION, "-m", MODEL, "--max-new-tokens", SHORT, "--json")
    assert cli.exit_code == 0, cli.stderr
    data = json.loads(cli.stdout)
    assert (data["reply"] if data["reply"] is not None else data["answer"]) == answer
    # a second request reads the same file: not compressed again
    again = chat(url)
    assert again.model_extra["cake"]["compressed_now"] is False
    assert again.choices[0].message.content == answer


def test_stream_equals_the_whole_reply(served):
    url, _ = served
    whole = chat(url, cake={"budget": 128}).choices[0].message.content
    chunks = list(chat(url, cake={"budget": 128}, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].model_extra["cake"]["budget"] == 128


def test_raw_stream_ends_with_done(served):
    url, _ = served
    with httpx.stream("POST", url + "/v1/completions", json={**completion_body(), "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")


def completion_body() -> dict:
    return {"model": MODEL, "prompt": QUESTION, "max_tokens": SHORT, "cake": {"document": "notes.txt"}}


def test_text_completion_equals_chat(served):
    url, _ = served
    text = client(url).completions.create(
        model=MODEL, prompt=QUESTION, max_tokens=SHORT, extra_body={"cake": {"document": "notes.txt"}}
    )
    assert text.choices[0].text == chat(url).choices[0].message.content
    assert text.model_extra["cake"]["task"] == "qa"


def test_summarize_task(served):
    url, _ = served
    reply = chat(url, question="", cake={"task": "summarize"}, max_tokens=8)
    assert reply.model_extra["cake"]["task"] == "summarize" and reply.choices[0].message.content


def test_question_agnostic_scoring_is_its_own_file(served, env):
    """cake.scoring end evicts the document once at the request's budget: another .cake beside the default one,
    answered as the CLI answers on it; named directly, another budget contradicts the file (400)."""
    url, _ = served
    reply = chat(url, cake={"scoring": "end", "budget": 64})
    cake = reply.model_extra["cake"]
    assert cake["scoring"] == "end" and cake["budget"] == 64 and cake["compressed_now"] is True
    assert cake["cache"] != chat(url).model_extra["cake"]["cache"]
    cli = invoke("qa", env[0] / cake["cache"], QUESTION, "-m", MODEL, "--max-new-tokens", SHORT, "--json")
    assert cli.exit_code == 0, cli.stderr
    data = json.loads(cli.stdout)
    assert (data["reply"] if data["reply"] is not None else data["answer"]) == reply.choices[0].message.content
    again = chat(url, cake={"scoring": "end", "budget": 64})
    assert again.model_extra["cake"]["compressed_now"] is False
    assert again.choices[0].message.content == reply.choices[0].message.content
    shutil.copy(env[0] / cake["cache"], env[0] / "end64.cake")  # a .cake in the folder is served as it is
    try:
        assert chat(url, document="end64.cake").choices[0].message.content == reply.choices[0].message.content
        assert "contradicts" in error_of(post(url, chat_body(document="end64.cake", budget=128)), 400)["message"]
        assert "not a .cake" in error_of(post(url, chat_body(document="end64.cake", scoring="end")), 400)["message"]
    finally:
        (env[0] / "end64.cake").unlink()


def test_upload_compresses_once(served, env):
    url, _ = served
    text = ("The lighthouse keeper Ada Brenner logged every ship. " * 20).encode()
    first = httpx.post(url + "/v1/documents", params={"name": "log.txt"}, content=text, timeout=60)
    assert first.status_code == 201, first.text
    info = first.json()
    assert info["document"] == "log.txt" and info["compressed_now"] is True and info["bytes"] == len(text)
    assert (env[0] / info["cache"]).is_file() and (env[0] / "log.txt").read_bytes() == text
    second = httpx.post(url + "/v1/documents", params={"name": "log.txt"}, content=text, timeout=60)
    assert second.status_code == 200 and second.json()["compressed_now"] is False
    assert second.json()["cache"] == info["cache"]
    # another document under a taken name is kept beside it, not over it
    other = httpx.post(url + "/v1/documents", params={"name": "log.txt"}, content=text + b"More.", timeout=60)
    assert other.status_code == 201 and other.json()["document"] == f"log-{other.json()['sha256'][:8]}.txt"
    reply = chat(url, "Who logged the ships?", document="log.txt")
    assert reply.model_extra["cake"]["compressed_now"] is False and reply.model_extra["cake"]["cache"] == info["cache"]
    names = [d["id"] for d in httpx.get(url + "/v1/documents").json()["data"]]
    assert "log.txt" in names and not any(n.startswith(".") for n in names)


def test_pdf_upload_answers_with_its_page(served, tmp_path):
    pdf = write_pdf(tmp_path / "memo.pdf", ["A plain first page about the harbour.", "The keeper was Ada Brenner."])
    data = pdf.read_bytes()
    up = httpx.post(served[0] + "/v1/documents", params={"name": "memo.pdf"}, content=data, timeout=60)
    assert up.status_code == 201 and up.json()["document_tokens"] > 10, up.text
    reply = chat(served[0], "Who was the keeper?", document="memo.pdf")
    assert reply.model_extra["cake"]["document"] == "memo.pdf" and reply.choices[0].message.content
    scanned = httpx.post(served[0] + "/v1/documents", params={"name": "blank.pdf"}, content=b"%PDF-1.4 x", timeout=60)
    assert error_of(scanned, 400)["code"] == "cake_error"
    assert "blank.pdf" not in [d["id"] for d in httpx.get(served[0] + "/v1/documents").json()["data"]]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({**chat_body(), "cake": {"document": "missing.txt"}}, 404, "no document 'missing.txt'"),
        ({**chat_body(), "model": "gpt-4"}, 404, "not served here"),
        (chat_body(budget=4), 400, "cake.budget"),
        (chat_body(method="nope"), 400, "nope"),
        ({**chat_body(), "cake": {"document": "../notes.txt"}}, 400, "plain name"),
        ({**chat_body(), "cake": {"document": "/etc/passwd"}}, 400, "plain name"),
        ({**chat_body(), "cake": {"document": ".cake-cache"}}, 400, "plain name"),
        ({**chat_body(), "cake": {}}, 400, "no document"),
        ({**chat_body(), "cake": {"document": "notes.txt", "colour": 1}}, 400, "cake.colour"),
        ({**chat_body(), "max_tokens": 10**6}, 400, "max_tokens"),
        (chat_body(scoring="reconstruct"), 400, "cake.scoring"),
        ({**chat_body(), "temperature": -1}, 400, "temperature"),
        ({**chat_body(), "n": 2}, 400, "n"),
        ({**chat_body(), "messages": [{"role": "user", "content": "  "}]}, 400, "needs a question"),
    ],
)
def test_errors_are_json_with_their_status(served, body, status, words):
    error = error_of(post(served[0], body), status)
    assert words in error["message"]


def test_bad_json_and_too_large(served):
    url, _ = served
    r = httpx.post(url + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert error_of(r, 400)["code"] == "invalid_json"
    big = {**chat_body(), "messages": [{"role": "user", "content": "x" * 20_000}]}
    assert error_of(post(url, big), 413)["type"] == "request_too_large"
    r = httpx.post(url + "/v1/documents", params={"name": "big.txt"}, content=b"a" * 70_000, timeout=30)
    assert error_of(r, 413)["code"] == "too_large"
    r = httpx.post(url + "/v1/documents", params={"name": "../x.txt"}, content=b"abc", timeout=30)
    assert error_of(r, 400)["code"] == "document"
    assert error_of(httpx.get(url + "/v1/nothing"), 404)["type"] == "not_found_error"


def test_symlink_out_of_the_folder_is_refused(served, env, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("secret " * 50)
    (env[0] / "link.txt").symlink_to(outside)
    try:
        assert "outside" in error_of(post(served[0], chat_body(document="link.txt")), 400)["message"]
    finally:
        (env[0] / "link.txt").unlink()


def test_key_is_required(keyed):
    with pytest.raises(openai.AuthenticationError):
        client(keyed, "wrong").models.list()
    assert error_of(post(keyed, chat_body()), 401)["code"] == "invalid_api_key"
    assert httpx.get(keyed + "/health").status_code == 200  # health stays open
    assert [m.id for m in client(keyed, "sesame").models.list().data] == [MODEL]


def wait_for(condition, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_full_queue_answers_429(served, monkeypatch):
    url, app = served
    server, gate = app.state.server, threading.Event()
    real = server.folder.prepare

    def held(*args, **kw):  # the first request holds the model until the gate opens
        gate.wait(30)
        return real(*args, **kw)

    monkeypatch.setattr(server.folder, "prepare", held)
    monkeypatch.setattr(server.queue, "capacity", 1)
    status = lambda: httpx.get(url + "/v1/cake/status").json()  # noqa: E731
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(post, url, chat_body())
        wait_for(lambda: status()["running"] is not None)
        waiting = pool.submit(post, url, chat_body())
        wait_for(lambda: len(status()["waiting"]) == 1)
        assert status()["running"]["document"] == "notes.txt"
        refused = post(url, chat_body())
        assert error_of(refused, 429)["type"] == "rate_limit_error"
        gate.set()
        assert running.result().status_code == 200 and waiting.result().status_code == 200
    assert status()["running"] is None and status()["refused_busy"] >= 1


def test_client_that_leaves_stops_its_generation(served):
    url, app = served
    counts = app.state.server.queue.counts
    before = dict(counts)
    body = {**chat_body(), "stream": True, "max_tokens": 1500, "cake": {"document": "notes.txt"}}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    wait_for(lambda: counts["cancelled"] == before["cancelled"] + 1)
    wait_for(lambda: app.state.server.queue.running is None)
    assert counts["served"] == before["served"]


def test_load_answers_all_complete_and_equal_the_pipeline(served, env):
    """40 requests, 8 at a time, four questions: no 5xx, every answer the pipeline's for its question."""
    url, _ = served
    docs, ready = env
    questions = [QUESTION, "What is the licence called?", "Who holds the copyright?", "Is there a warranty?"]
    cake = docs / chat(url).model_extra["cake"]["cache"]
    base = plan(replace(invoke_request(), document=str(cake)))
    prefix = pipeline.open_prefix(ready, base)
    expected = {}
    for q in questions:
        result = pipeline.run(ready, replace(base, request=replace(base.request, fields={"question": q})), prefix)
        expected[q] = result.printed

    def ask(i: int):
        q = questions[i % len(questions)]
        stream = i % 2 == 1
        reply = chat(url, q, stream=stream)
        if stream:
            chunks = list(reply)
            return q, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
        return q, reply.choices[0].message.content

    counts = served[1].state.server.queue.counts
    before = dict(counts)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(40)))
    assert len(answers) == 40
    assert counts["served"] == before["served"] + 40 and counts["cancelled"] == before["cancelled"]
    for q, answer in answers:
        assert answer == expected[q]


def invoke_request() -> TaskRequest:
    """The server's request for QUESTION, as `Server.task_request` builds it."""
    return TaskRequest(task="qa", document="", fields={"question": QUESTION}, model=MODEL, max_new_tokens=SHORT)


def test_command_refuses_a_wide_address_without_a_key(cli_env):
    result = invoke("serve", "-m", MODEL, "--host", "0.0.0.0", "-d", cli_env / "docs")
    assert result.exit_code == 2 and "--api-key" in result.stderr and "Traceback" not in result.stderr
    assert not (cli_env / "docs").exists()  # refused before anything was made


@pytest.mark.slow  # a fresh process: torch's import and the model's load (about 5 s on a quiet host)
def test_command_serves_and_stops_cleanly_on_ctrl_c(cli_env):
    """The real `cake serve` process: it answers, and SIGINT stops it with exit code 0 and no traceback."""
    port = free_port()
    docs = cli_env / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The harbour opens at six. " * 30)
    cmd = [sys.executable, "-m", "cake_cli", "serve", "-m", MODEL, "-d", str(docs), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, 60)
        reply = chat(url, "When does the harbour open?", document="a.txt", max_tokens=4)
        assert reply.choices[0].message.content
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err and b"Shutting down" in err
    assert not list((docs / ".cake-cache").glob(".*tmp*"))  # no temporary file left behind


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_streams_and_gets_json_errors(served, keyed):
    url, _ = served
    body = json.dumps({**chat_body(), "stream": True})
    out = subprocess.run(
        ["curl", "-sN", url + "/v1/chat/completions", "-H", "Content-Type: application/json", "-d", body],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    events = [line[6:] for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text.strip() == chat(url).choices[0].message.content
    refused = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", keyed + "/v1/models", "-H", "Authorization: Bearer x"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.splitlines()
    assert refused[-1] == "401" and json.loads(refused[0])["error"]["type"] == "authentication_error"


def test_project_errors_map_to_their_status():
    assert from_cake(pipeline.Cancelled()).status == 503
    assert from_cake(CakeError("bad file", "make it again")).body()["error"]["message"] == "bad file — make it again"
    config = from_cake(ConfigError("budget", "{budget} too small", "raise {budget}"))
    assert config.status == 400 and config.message == "cake.budget too small — raise cake.budget"
