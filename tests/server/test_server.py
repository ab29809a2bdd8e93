"""moelite-server, tested as a client sees it: a live server on a free port with the shipped model,
driven with Python's http.client (a stock HTTP client) and, where Chromium is installed, the chat
page in headless Chromium. Checked: the OpenAI wire format (responses, server-sent-event chunks,
usage), streamed answers equal to unstreamed ones and to `moelite run` with the same seed,
concurrent requests equal to the same requests one at a time, a client that disconnects
mid-stream (the server stops that generation and serves the next request), bad requests answered
with 4xx and a JSON error, and nothing of that ends the server."""
import http.client
import json
import math
import os
import re
import shutil
import socket
import subprocess
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SERVER = os.environ.get("MOELITE_SERVER_BIN", os.path.join(ROOT, "build", "bin", "moelite-server"))
CLI = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "server")
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")


@pytest.fixture(scope="module")
def server():
    os.makedirs(TMP, exist_ok=True)
    proc = subprocess.Popen([SERVER, "-m", MODEL, "--port", "0", "-t", "2", "--parallel", "3", "-c", "512",
                             "--budget", "50%"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on http://"), (line, proc.stderr.read() if proc.poll() is not None else "")
    host, port = line.split("http://")[1].split()[0].rsplit(":", 1)
    yield host, int(port), proc
    proc.terminate()
    assert proc.wait(timeout=30) == 0, "the server did not stop cleanly on SIGTERM"


def request(server, method, path, body=None, raw=None, timeout=120):
    host, port, _ = server
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    payload = r.read()
    c.close()
    return r.status, r.getheader("Content-Type", ""), payload


def post_json(server, path, body):
    status, ctype, payload = request(server, "POST", path, body)
    assert ctype.startswith("application/json"), ctype
    return status, json.loads(payload)


def events(resp):
    """The data payloads of a server-sent-event stream, as they arrive."""
    buf = b""
    while True:
        line = resp.readline()
        if not line:
            return
        if line in (b"\n", b"\r\n"):
            if buf.startswith(b"data: "):
                yield buf[6:].decode()
            buf = b""
        else:
            buf += line.rstrip(b"\r\n")


def stream(server, path, body):
    host, port, _ = server
    c = http.client.HTTPConnection(host, port, timeout=120)
    c.request("POST", path, body=json.dumps(dict(body, stream=True)), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    chunks, done = [], False
    for data in events(r):
        if data == "[DONE]":
            done = True
            break
        chunks.append(json.loads(data))
    c.close()
    assert done, "the stream did not end with [DONE]"
    return chunks


CHAT = {"messages": [{"role": "system", "content": "You answer briefly."},
                     {"role": "user", "content": "What does a dictionary do?"}],
        "max_tokens": 32, "temperature": 0.7, "seed": 5}


def test_info_endpoints(server):
    status, ctype, payload = request(server, "GET", "/v1/models")
    models = json.loads(payload)
    assert status == 200 and models["object"] == "list"
    model_id = models["data"][0]["id"]
    assert model_id == "moelite-tiny-qwen3moe-Q8_0"
    status, _, payload = request(server, "GET", "/v1/models/" + model_id)
    assert status == 200 and json.loads(payload)["arch"] == "qwen3moe"
    assert request(server, "GET", "/health")[0] == 200
    status, _, payload = request(server, "GET", "/v1/moelite/stats")
    stats = json.loads(payload)
    assert status == 200 and stats["expert_budget_bytes"] > 0 and stats["sequences"] == 3
    status, ctype, page = request(server, "GET", "/")
    assert status == 200 and ctype.startswith("text/html") and b"/v1/chat/completions" in page


def test_chat_streamed_equals_unstreamed(server):
    status, full = post_json(server, "/v1/chat/completions", CHAT)
    assert status == 200, full
    assert full["object"] == "chat.completion"
    choice = full["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    usage = full["usage"]
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    chunks = stream(server, "/v1/chat/completions", dict(CHAT, stream_options={"include_usage": True}))
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == choice["message"]["content"]
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == usage["completion_tokens"]
    # A stop string ends the answer before it.
    words = choice["message"]["content"].split()
    if len(words) > 3:
        status, stopped = post_json(server, "/v1/chat/completions", dict(CHAT, stop=[words[2]]))
        assert stopped["choices"][0]["finish_reason"] == "stop"
        assert words[2] not in stopped["choices"][0]["message"]["content"]


def test_completion_equals_the_cli(server):
    prompt, n, seed = "def fibonacci(n):", 24, 11
    status, full = post_json(server, "/v1/completions",
                             {"prompt": prompt, "max_tokens": n, "temperature": 0.8, "seed": seed})
    assert status == 200 and full["object"] == "text_completion"
    chunks = stream(server, "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0.8, "seed": seed})
    assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]
    # The same generation through the CLI (another program on the same library): same text.
    r = subprocess.run([CLI, "run", "-m", MODEL, "-t", "2", "-p", prompt, "-n", str(n), "--temp", "0.8",
                        "--seed", str(seed)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == full["choices"][0]["text"].rstrip("\n")


def test_concurrent_requests_equal_sequential(server):
    bodies = [dict(CHAT, seed=s, messages=[{"role": "user", "content": q}])
              for s, q in enumerate(["Name a sorting algorithm.", "What is a tuple?", "Explain recursion.",
                                     "What is PEP 8?", "Define a closure."])]
    sequential = [post_json(server, "/v1/chat/completions", b)[1]["choices"][0]["message"]["content"] for b in bodies]
    results = [None] * len(bodies)

    def run(i):
        results[i] = "".join(c["choices"][0]["delta"].get("content", "")
                             for c in stream(server, "/v1/chat/completions", bodies[i]) if c["choices"])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == sequential


def expect_generation_stopped(server, before):
    """After a client left: the server counts the disconnect, stopped generating within a few
    hundred tokens, and still runs."""
    deadline = time.time() + 60
    while time.time() < deadline:
        stats = json.loads(request(server, "GET", "/v1/moelite/stats")[2])
        if stats["disconnects"] > before["disconnects"] and stats["active_requests"] == 0:
            break
        time.sleep(0.05)
    assert stats["disconnects"] > before["disconnects"], "the generation went on after the client left"
    assert stats["generated_tokens"] - before["generated_tokens"] < 400
    assert server[2].poll() is None


def test_client_disconnecting_mid_stream(server):
    host, port, _ = server
    _, _, before = request(server, "GET", "/v1/moelite/stats")
    before = json.loads(before)
    s = socket.create_connection((host, port))
    body = json.dumps(dict(CHAT, stream=True, max_tokens=400, seed=1)).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        part = s.recv(4096)
        assert part, "the server closed the stream early"
        got += part
    s.close()  # mid-stream
    expect_generation_stopped(server, before)
    assert post_json(server, "/v1/chat/completions", CHAT)[0] == 200


def server_ctx(server):
    """The positions the server's context holds (its -c, at most the model's training context)."""
    return json.loads(request(server, "GET", "/v1/models")[2])["data"][0]["n_ctx"]


def test_twenty_chats_without_max_tokens_all_answer(server):
    """Without max_tokens a generation runs until it ends or the context is full: every answer is a
    200 with finish_reason "stop" or "length" and what it made (the end of the context once answered
    500 and threw the answer away)."""
    reasons, n_ctx = set(), server_ctx(server)
    for seed in range(1, 21):
        body = {"messages": [{"role": "user", "content": "Tell me about Python modules and packages."}], "seed": seed}
        status, r = post_json(server, "/v1/chat/completions", body)
        assert status == 200, r
        reason = r["choices"][0]["finish_reason"]
        assert reason in ("stop", "length"), r
        reasons.add(reason)
        usage = r["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= n_ctx
        if reason == "length":
            assert usage["prompt_tokens"] + usage["completion_tokens"] == n_ctx and r["choices"][0]["message"]["content"]
    assert "length" in reasons, "no request reached the end of the context: the case is not exercised"


def test_a_stream_reaching_the_end_of_the_context_finishes_with_length(server):
    body = {"messages": [{"role": "user", "content": "Tell me about Python modules and packages."}], "seed": 3,
            "temperature": 1.0, "stream_options": {"include_usage": True}}
    chunks = list(stream(server, "/v1/chat/completions", body))
    assert not any("error" in c for c in chunks), chunks[-3:]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert finish[-1] in ("stop", "length") and all(f is None for f in finish[:-1])
    usage = chunks[-1]["usage"]
    assert finish[-1] == "stop" or usage["prompt_tokens"] + usage["completion_tokens"] == server_ctx(server)


def test_max_tokens_is_bounded_by_the_room_left(server):
    n_ctx = server_ctx(server)
    # A prompt of more than half the positions (however many tokens a word takes), and a max_tokens
    # far beyond what is left: the answer stops at the end of the context.
    reps = n_ctx
    while True:
        status, r = post_json(server, "/v1/completions", {"prompt": "word " * reps, "max_tokens": 10000, "seed": 1,
                                                           "temperature": 1.0})
        if status == 200 or reps < 8:
            break
        assert status == 400 and err_mentions(r, n_ctx), r
        reps = reps * 3 // 4
    assert status == 200, r
    u = r["usage"]
    assert u["prompt_tokens"] > n_ctx // 3 and u["prompt_tokens"] + u["completion_tokens"] <= n_ctx, u


def err_mentions(r, n_ctx):
    """A prompt too long for the context is refused naming both sizes and the way out."""
    msg = r["error"]["message"]
    return (r["error"]["param"] == "prompt" and r["error"]["code"] == "context_length_exceeded" and str(n_ctx) in msg
            and "tokens" in msg and "-c" in msg)


def test_count_tokens_agrees_with_the_completions_usage(server):
    """/v1/moelite/count_tokens (how the chat page keeps a conversation within the context) counts a
    conversation or prompt as the completion endpoints do."""
    for path, body in [("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "def main():\n    print('hello')", "seed": 1})]:
        status, counted = post_json(server, "/v1/moelite/count_tokens",
                                    {k: body[k] for k in ("messages", "prompt") if k in body})
        assert status == 200 and counted["n_ctx"] == server_ctx(server), counted
        status, r = post_json(server, path, dict(body, max_tokens=1))
        assert status == 200 and r["usage"]["prompt_tokens"] == counted["prompt_tokens"] > 3, (counted, r["usage"])
    for bad in [{}, {"messages": []}, {"prompt": 3}, [1]]:
        status, r = post_json(server, "/v1/moelite/count_tokens", bad)
        assert status == 400 and r["error"]["message"], (bad, r)


def test_client_disconnecting_before_a_whole_answer(server):
    """A non-streaming request whose client goes away stops, as a stream does when its write fails."""
    host, port, _ = server
    before = json.loads(request(server, "GET", "/v1/moelite/stats")[2])
    s = socket.create_connection((host, port))
    body = json.dumps(dict(CHAT, max_tokens=400, seed=1, temperature=1.0)).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    s.close()  # before the answer
    expect_generation_stopped(server, before)


def test_a_second_server_on_the_same_port_fails_at_start(server):
    host, port, _ = server
    r = subprocess.run([SERVER, "-m", MODEL, "--host", host, "--port", str(port), "-t", "1"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "cannot listen on %s:%d" % (host, port) in r.stderr and "in use" in r.stderr, r.stderr


def test_a_context_above_the_models_is_said_at_start():
    proc = subprocess.Popen([SERVER, "-m", MODEL, "--port", "0", "-t", "1", "-c", "100000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on"), line
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    err = proc.stderr.read()
    assert "-c 100000 is more than the model was trained for" in err, err


def test_one_log_line_per_request():
    proc = subprocess.Popen([SERVER, "-m", MODEL, "--port", "0", "-t", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        host, port = line.split("http://")[1].split()[0].rsplit(":", 1)
        srv = (host, int(port), proc)
        assert post_json(srv, "/v1/chat/completions", dict(CHAT, max_tokens=5, seed=1))[0] == 200
        assert request(srv, "GET", "/v1/nothing")[0] == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # A request is logged after its response is sent, so a slow build (ASan) can log the second
    # request first: one line each, in either order.
    lines = sorted(l for l in proc.stderr.read().splitlines() if l.startswith("moelite-server: "))
    assert len(lines) == 2, lines
    assert re.match(r"moelite-server: GET /v1/nothing 404 \d+ ms$", lines[0]), lines
    assert re.match(r"moelite-server: POST /v1/chat/completions 200 tokens \d+ in, [1-5] out, \d+ ms$", lines[1]), lines


@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [{"role": "user", "content": "word " * 2000}]}, "messages"),
    ({"max_tokens": 3}, "messages"),
    # Every known field is type-checked (before: stream_options 5 was ignored and include_usage "yes"
    # answered 500), a NUL in a stop string is refused (before: the stop string was cut at it).
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": 5}, "stream_options"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": ["a\u0000b"]}, "stop"),
    # A content part whose "type" is not a string (found by fuzz_openai_request): 500 before.
    ({"messages": [{"role": "user", "content": [{"type": [], "text": "x"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "seed": "7"}, "seed"),
    ({"messages": [{"role": "user", "content": "x"}], "user": 5}, "user"),
    ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 0.5}, "presence_penalty"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": [1, 2]}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 101}}, "logit_bias"),
])
def test_bad_chat_requests(server, body, param):
    status, err = post_json(server, "/v1/chat/completions", body)
    assert status == 400, err
    assert err["error"]["param"] == param and err["error"]["message"]


def test_text_that_is_not_utf8_does_not_end_the_server():
    """A random-weight model emits byte tokens that form no UTF-8 character (the library passes
    them on whole): the answers carry U+FFFD in their place, streamed and not, and the server goes
    on. Before, the JSON writer threw and the process aborted."""
    os.makedirs(TMP, exist_ok=True)
    model = os.path.join(TMP, "random-qwen3moe.gguf")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_tiny_model.py"), "--arch", "qwen3moe",
                    "--type", "Q8_0", "--seed", "1", "--out", model, "--quiet"], check=True, timeout=300)
    proc = subprocess.Popen([SERVER, "-m", model, "--port", "0", "-t", "2", "--parallel", "2", "-c", "256"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        host, port = line.split("http://")[1].split()[0].rsplit(":", 1)
        srv = (host, int(port), proc)
        replaced = False
        for seed in range(1, 5):
            body = {"prompt": "def f(x):", "max_tokens": 48, "temperature": 1.0, "seed": seed}
            status, full = post_json(srv, "/v1/completions", body)
            assert status == 200, full
            text = full["choices"][0]["text"]
            streamed = "".join(c["choices"][0]["text"] for c in stream(srv, "/v1/completions", body) if c["choices"])
            assert streamed == text
            replaced |= "\ufffd" in text
        assert replaced, "no answer held bytes that are not UTF-8: the case is not exercised"
        assert proc.poll() is None
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_bad_http(server):
    for method, path, raw, code in [("POST", "/v1/chat/completions", b"{not json", 400),
                                    ("POST", "/v1/completions", b"[1, 2]", 400),
                                    ("POST", "/v1/completions", b'{"prompt": 7}', 400),
                                    ("GET", "/v1/chat/completions", None, 405),
                                    ("GET", "/v1/nothing", None, 404),
                                    ("GET", "/v1/models/other", None, 404),
                                    ("POST", "/v1/completions", b"x" * (5 << 20), 413)]:
        status, ctype, payload = request(server, method, path, raw=raw)
        assert status == code, (method, path, status)
        assert ctype.startswith("application/json") and json.loads(payload)["error"]["message"]
    assert server[2].poll() is None


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON
    messages separated by NUL bytes on file descriptors 3 and 4), so the test sees the page as it
    streams and waits for the answer in real time, not in a browser's virtual time."""

    def __init__(self, chromium, profile, size=(900, 640)):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds():
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen([chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                                      "--disable-dev-shm-usage", "--remote-debugging-pipe",
                                      "--user-data-dir=" + profile, "--window-size=%d,%d" % size, "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=child_fds,
                                     pass_fds=(3, 4))  # kept open past preexec_fn's dup2 (fds 3 and 4)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.session = None

    def call(self, method, params=None, session=True, timeout=60):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    assert "error" not in reply, reply
                    return reply["result"]
            chunk = os.read(self._from_chrome, 1 << 16)
            assert chunk, "Chromium closed the pipe"
            self._buf += chunk
        raise TimeoutError(method)

    def open(self, url):
        target = self.call("Target.createTarget", {"url": url}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]

    def js(self, expression):
        return self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})["result"].get("value")

    def close(self):
        try:
            self.call("Browser.close", session=False, timeout=10)
        except Exception:
            pass
        self.proc.wait(timeout=30)
        os.close(self._to_chrome)
        os.close(self._from_chrome)


def test_chat_page_in_chromium(server):
    """The chat page as a user drives it: five turns, each answered and the first seen streaming;
    a turn too long for the context with the others leaves out the oldest turns and says so; a
    failed turn shows Retry, and neither it nor its retry poisons the turns after it; "New chat"
    starts over. The screenshot (the conversation with the left-out turns greyed) is kept at
    $MOELITE_TEST_TMP/server/server-chat.png."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not chromium:
        pytest.skip("no Chromium installed (tools/install_deps.sh --test installs Debian's)")
    import base64
    host, port, _ = server
    browser = Browser(chromium, os.path.join(TMP, "chromium-profile"))

    def state():
        return browser.js("[document.body.dataset.state, Number(document.body.dataset.answers), "
                          "Number(document.body.dataset.failures)]")

    last_answer = ("(() => { const a = document.querySelectorAll('.msg.assistant'); "
                   "return a.length ? a[a.length - 1].textContent : ''; })()")

    def ask(text, click="document.getElementById('send').click()"):
        """Types `text` and sends it; returns the answer's lengths seen while it streamed."""
        _, answers, failures = state()
        browser.js("document.getElementById('input').value = %s; %s" % (json.dumps(text), click))
        seen, deadline = set(), time.time() + 180
        while time.time() < deadline:
            st, a, f = state()
            if st == "idle" and a + f > answers + failures:
                return seen
            seen.add(len(browser.js(last_answer) or ""))
            time.sleep(0.02)
        raise AssertionError("the page did not finish its answer to %r" % text)

    def check_answered(n):
        st, answers, failures = state()
        assert (st, answers) == ("idle", n), (st, answers, failures, browser.js(last_answer))
        assert browser.js(last_answer).strip(), "an empty answer"
        assert not browser.js("document.querySelector('.msg.assistant:last-of-type.error') !== null")

    try:
        browser.open("http://%s:%d/" % (host, port))
        deadline = time.time() + 30
        while browser.js("location.pathname + ' ' + document.readyState") != "/ complete" and time.time() < deadline:
            time.sleep(0.05)
        questions = ["What is a generator?", "How do I read a file line by line?", "And how do I write one?",
                     "What does a dictionary do?", "Explain list comprehensions."]
        for i, q in enumerate(questions, 1):
            seen = ask(q)
            check_answered(i)
            if i == 1:  # streamed: the page showed the answer part way through, not only whole
                text = browser.js(last_answer)
                assert len({n for n in seen if 0 < n < len(text)}) >= 1, sorted(seen)
        assert browser.js("document.querySelectorAll('.msg.assistant').length") == 5
        assert browser.js("document.querySelectorAll('.error').length") == 0

        # A long turn: the oldest turns are left out so it fits, greyed, with a notice.
        # (about half the context: it fits alone, not after five turns)
        long_text = "Please summarise all of this: " + " ".join(["the module imports the package"] * (server_ctx(server) // 12))
        ask(long_text)
        check_answered(6)
        notice = browser.js("(document.querySelector('.notice') || {}).textContent || ''")
        n_ctx = server_ctx(server)
        assert "left out" in notice and "%d-token context" % n_ctx in notice, notice
        assert browser.js("document.querySelectorAll('.msg.user.dropped').length") >= 1
        used, shown = map(int, re.search(r"context: (\d+) of (\d+)", browser.js(
            "document.getElementById('context').textContent")).groups())
        assert shown == n_ctx and used < n_ctx, (used, n_ctx)
        time.sleep(1.2)  # the header's next statistics poll: hit rate and the server's tok/s
        assert "expert hit rate: 0." in browser.js("document.getElementById('hit').textContent")
        shot = browser.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        png = os.path.join(TMP, "server-chat.png")
        with open(png, "wb") as f:
            f.write(base64.b64decode(shot))
        assert os.path.getsize(png) > 10000

        # A failed turn (the network fails once): shown with Retry, not part of the conversation.
        browser.js("(() => { const real = window.fetch; window.fetch = (url, options) => {"
                   " if (String(url).includes('/chat/completions')) { window.fetch = real;"
                   " return Promise.reject(new TypeError('network down (test)')); }"
                   " return real(url, options); }; })()")
        ask("What is a tuple?")
        st, answers, failures = state()
        assert (st, answers, failures) == ("idle", 6, 1)
        assert "network down (test)" in browser.js(last_answer)
        assert browser.js("turns.some((t) => t.user === 'What is a tuple?')") is False
        ask("", click="document.querySelector('.retry').click()")
        check_answered(7)
        assert browser.js("document.querySelectorAll('.error').length") == 0, "the failed turn stayed"
        assert browser.js("turns.filter((t) => t.user === 'What is a tuple?').length") == 1
        ask("Thanks. What is a set?")
        check_answered(8)

        # New chat: an empty page, and the next turn is sent alone.
        browser.js("document.getElementById('new-chat').click()")
        assert browser.js("document.querySelectorAll('.msg').length") == 0
        ask("Hello again.")
        check_answered(9)
        used = int(re.search(r"context: (\d+) of", browser.js("document.getElementById('context').textContent"))
                   .group(1))
        assert used < 40, used
    finally:
        browser.close()


def tokens_of(text):
    r = subprocess.run([CLI, "tokenize", "-m", MODEL, "-p", text], capture_output=True, text=True, check=True)
    return [int(t) for t in re.findall(r"\d+", r.stdout)]


def test_logit_bias_selects_and_bans(server):
    """OpenAI's logit_bias: +100 makes a token the greedy choice, -100 bans one (before: ignored, the
    answer was the unbiased one). The expected text is the token's own, from the tokenizer."""
    (word,) = tokens_of(" dictionary")
    base = {"prompt": "def main():", "max_tokens": 3, "temperature": 0}
    status, plain = post_json(server, "/v1/completions", base)
    assert status == 200 and plain["choices"][0]["text"] != " dictionary" * 3
    status, chosen = post_json(server, "/v1/completions", dict(base, logit_bias={str(word): 100}))
    assert status == 200 and chosen["choices"][0]["text"] == " dictionary" * 3, chosen
    n_vocab = json.loads(request(server, "GET", "/v1/models/moelite-tiny-qwen3moe-Q8_0")[2])["n_vocab"]
    only = {str(i): -100 for i in range(n_vocab) if i != word}
    status, banned = post_json(server, "/v1/completions", dict(base, logit_bias=only))
    assert status == 200 and banned["choices"][0]["text"] == " dictionary" * 3, banned


def test_cached_tokens_do_not_tell_one_client_another_clients_prompt(server):
    """The prompt cache is shared by every client: reporting its hits would let a client probe what
    others sent (before: 9 of the secret prompt's tokens were reported cached to another client)."""
    secret = {"prompt": "The password of the vault is swordfish and nobody knows it", "max_tokens": 2,
              "temperature": 0}
    assert post_json(server, "/v1/completions", secret)[0] == 200
    status, probe = post_json(server, "/v1/completions", dict(secret, prompt="The password of the vault is sword"))
    assert status == 200 and probe["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def raw_request(server, method, path, body=b"", headers=None):
    host, port, _ = server
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request(method, path, body=body or None, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data


def test_web_pages_of_other_sites_cannot_drive_the_server(server):
    """CSRF and DNS rebinding: before, a foreign Origin's text/plain POST and a Host naming another
    site were both answered 200."""
    host, port, _ = server
    chat = json.dumps(dict(CHAT, max_tokens=2)).encode()
    json_type = {"Content-Type": "application/json"}
    status, _, body = raw_request(server, "POST", "/v1/chat/completions", chat,
                                  {"Origin": "http://evil.example", "Content-Type": "text/plain"})
    assert status == 403 and b"evil.example" in body
    status, _, _ = raw_request(server, "POST", "/v1/chat/completions", chat, dict(json_type, Origin="http://evil.example"))
    assert status == 403
    assert raw_request(server, "GET", "/v1/models", headers={"Origin": "null"})[0] == 403
    status, _, body = raw_request(server, "GET", "/v1/models", headers={"Host": "rebound.example:%d" % port})
    assert status == 403 and b"--allow-host" in body
    # Without an Origin (curl, SDKs) JSON is still required: a form or text/plain body is never parsed.
    status, _, body = raw_request(server, "POST", "/v1/chat/completions", chat, {"Content-Type": "text/plain"})
    assert status == 415 and b"application/json" in body
    # Pages on this machine and the chat page itself may call it, with CORS headers and preflights.
    for origin in ("http://localhost:3000", "http://127.0.0.1:%d" % port):
        status, headers, _ = raw_request(server, "POST", "/v1/chat/completions", chat, dict(json_type, Origin=origin))
        assert status == 200 and headers.get("access-control-allow-origin") == origin
        status, headers, _ = raw_request(server, "OPTIONS", "/v1/chat/completions",
                                         headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        assert status == 204 and "Content-Type" in headers.get("access-control-allow-headers", "")
    assert raw_request(server, "GET", "/v1/models", headers={"Host": "localhost:%d" % port})[0] == 200


def start_server(*extra):
    proc = subprocess.Popen([SERVER, "-m", MODEL, "--port", "0", "-t", "1", "-c", "256", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on http://"), (line, proc.stderr.read() if proc.poll() is not None else "")
    host, port = line.split("http://")[1].split()[0].rsplit(":", 1)
    return host, int(port), proc


def stop_server(srv):
    srv[2].terminate()
    assert srv[2].wait(timeout=30) == 0


def test_api_key():
    os.makedirs(TMP, exist_ok=True)
    key_file = os.path.join(TMP, "api-key")
    with open(key_file, "w") as f:
        f.write("s3cret-key\n")
    srv = start_server("--api-key-file", key_file)
    try:
        status, headers, body = raw_request(srv, "GET", "/v1/models")
        assert status == 401 and headers.get("www-authenticate") == "Bearer" and b"Authorization" in body
        assert raw_request(srv, "GET", "/v1/models", headers={"Authorization": "Bearer s3cret-kez"})[0] == 401
        assert raw_request(srv, "GET", "/v1/models", headers={"Authorization": "Bearer s3cret-key"})[0] == 200
        chat = json.dumps(dict(CHAT, max_tokens=2)).encode()
        assert raw_request(srv, "POST", "/v1/chat/completions", chat, {"Content-Type": "application/json"})[0] == 401
        assert raw_request(srv, "POST", "/v1/chat/completions", chat, {"Content-Type": "application/json",
                                                                      "Authorization": "Bearer s3cret-key"})[0] == 200
        assert raw_request(srv, "GET", "/health")[0] == 200 and raw_request(srv, "GET", "/")[0] == 200
    finally:
        stop_server(srv)
    r = subprocess.run([SERVER, "-m", MODEL, "--api-key-file", os.path.join(TMP, "no-such-file")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--api-key-file: cannot open" in r.stderr, r.stderr


def test_slow_clients_cannot_stall_the_server():
    """Before: 16 connections that sent half a request line held /health for 17.8 s, a byte a second
    on 40 connections for 25 s, and an oversized Content-Length held its connection 5 s."""
    srv = start_server("--max-connections", "6", "--request-timeout", "1.5")
    host, port, _ = srv
    slow = []
    try:
        for _ in range(16):
            s = socket.create_connection((host, port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            slow.append(s)
        time.sleep(0.3)
        t = time.monotonic()
        assert raw_request(srv, "GET", "/health")[0] == 200
        assert time.monotonic() - t < 1.0
        # 16 + 1 connections against a cap of 6: the slowest readers were evicted to admit the rest.
        stats = json.loads(raw_request(srv, "GET", "/v1/moelite/stats")[2])["connections"]
        assert stats["evicted"] >= 10 and stats["open"] <= 6, stats
        # A connection that does not finish its request in time is closed by the server.
        s = socket.create_connection((host, port))
        s.sendall(b"GET /health HTTP/1.1\r\n")
        s.settimeout(10)
        t = time.monotonic()
        assert s.recv(100) == b""
        assert 1.0 < time.monotonic() - t < 4.0
        s.close()
        # A body larger than the server reads is refused before it is sent.
        s = socket.create_connection((host, port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000000000\r\n\r\n{")
        s.settimeout(10)
        t = time.monotonic()
        assert s.recv(100).startswith(b"HTTP/1.1 413")
        assert time.monotonic() - t < 1.0
        s.close()
        assert json.loads(raw_request(srv, "GET", "/v1/moelite/stats")[2])["connections"]["timed_out"] >= 1
    finally:
        for s in slow:
            s.close()
        stop_server(srv)


def test_quality_governor_and_meter_in_the_stats(server):
    # The shared server gates exactly: its quality section is all zeros.
    quality = json.loads(request(server, "GET", "/v1/moelite/stats")[2])["quality"]
    assert quality["gated_tokens"] == 0 and quality["metered_tokens"] == 0 and quality["target_kl"] == 0, quality
    # Sensitivity gating without a profile: the governor learns the sensitivities' scale from the meter.
    srv = start_server("--gating", "sensitivity", "--quality-target", "1%", "--quality-sample", "1")
    try:
        for seed in (1, 2):
            status, r = post_json(srv, "/v1/completions",
                                  {"prompt": "def fibonacci(n):", "max_tokens": 16, "temperature": 0.8, "seed": seed})
            assert status == 200 and r["usage"]["completion_tokens"] > 1, r
        status, _, payload = raw_request(srv, "GET", "/v1/moelite/stats")
        quality = json.loads(payload)["quality"]
    finally:
        stop_server(srv)
    assert status == 200
    assert abs(quality["target_kl"] - math.log(1.01)) < 1e-12, quality
    # Every decode step of one sequence is metered at rate 1; prefill is not.
    assert 0 < quality["metered_tokens"] < quality["gated_tokens"], quality
    assert quality["threshold"] > 0 and quality["kl_mean"] >= 0 and 0 <= quality["top1_agreement"] <= 1, quality
    assert quality["predicted_loss"] > 0 and quality["kl_stderr"] >= 0, quality


@pytest.mark.parametrize("args,named", [
    (["--quality-target", "5"], "--quality-target"),  # a rise needs its %
    (["--quality-target", "0%"], "--quality-target"),
    (["--quality-sample", "2"], "--quality-sample"),
    (["--threshold", "-1"], "--threshold"),
    (["--gating", "sometimes"], "--gating"),
])
def test_bad_gating_and_quality_options_are_usage_errors(args, named):
    r = subprocess.run([SERVER, "-m", MODEL, "--port", "0", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and ("moelite-server: " + named) in r.stderr and "usage:" in r.stderr, r.stderr


def test_gating_options_reach_the_model_and_context():
    # --profile is passed to the model: a missing one fails the load.
    r = subprocess.run([SERVER, "-m", MODEL, "--port", "0", "--profile", os.path.join(TMP, "no-such-profile")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "MOELITE_ERR_FILE_NOT_FOUND" in r.stderr, r.stderr
    # Sensitivity gating needs a profile unless a quality target governs the context.
    r = subprocess.run([SERVER, "-m", MODEL, "--port", "0", "--gating", "sensitivity"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "MOELITE_ERR_BAD_PROFILE" in r.stderr, r.stderr
