"""Chapter 15: `python -m minisgl` and `python -m minisgl.shell`, tried as a client would: over
HTTP with the official openai package (and the standard library where it cannot send the
request), and through a terminal."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
import torch

from examples.helpers.server_process import ServerProcess, child_env, sse_data, sse_events
from minisgl.server.args import build_parser, parse_args
from tools.parity import build_prompts, hf_references, load_tokenizer
from tools.warm_launch import popen, run

# a dev dependency (README's set-up installs it); a GPU machine without a package index may lack it
openai = pytest.importorskip("openai", reason="the official openai client is not installed")

MODEL = "tiny-qwen3"  # SmolLM2's tokenizer and chat template, a small random model
FLAGS = ("--num-pages", "1024", "--page-size", "4", "--dtype", "float32")  # bf16 on a GPU
# the module's server: two tokenizer workers, so that every test also shows they keep order
# (the main and the shell tests run the default, one worker for both directions)
SERVER_FLAGS = (*FLAGS, "--num-tokenizer", "2")
N = 16  # new tokens per request
QUESTION = "Name three primary colours"
TEXTS = ["The capital of France is", "def fibonacci(n):", QUESTION]
ROOT = Path(__file__).resolve().parents[1]
RECEIVED = "minisgl_requests_total"
FINISHED = "minisgl_e2e_request_latency_seconds_count"
ENV = child_env()


@pytest.fixture(scope="module")
def server(model_path) -> Iterator[ServerProcess]:
    with ServerProcess(model_path(MODEL), *SERVER_FLAGS) as s:
        yield s


@pytest.fixture(autouse=True)
def server_errors(request) -> Iterator[None]:
    """A traceback that the module's server logged during a test is printed with it (pytest
    shows it when the test fails): the error is in the server's process, not in the test's."""
    if "server" not in request.fixturenames:
        yield
        return
    server: ServerProcess = request.getfixturevalue("server")
    before = len(server.output())
    yield
    logged = server.output()[before:]
    if "Traceback" in logged:
        print(f"the server logged during this test:\n{logged[-6000:]}")


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def expected(model_path) -> List[Tuple[int, str, int]]:
    """Per text: its prompt's token count, transformers' greedy text and token count (the last
    text as a chat, as build_prompts makes it)."""
    model_path(MODEL)
    tok = load_tokenizer(MODEL)
    prompts = build_prompts(MODEL, TEXTS)
    refs = hf_references(MODEL, prompts, N)
    return [
        (len(p), tok.decode(r.tokens, skip_special_tokens=True), len(r.tokens))
        for p, r in zip(prompts, refs)
    ]


def chat(text: str) -> List[Dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_answers_are_transformers_greedy_output_with_exact_usage(client, expected) -> None:
    for text, (prompt_len, ref_text, ref_len) in zip(TEXTS[:2], expected):
        answer = client.completions.create(model=MODEL, prompt=text, max_tokens=N, temperature=0)
        assert answer.choices[0].text == ref_text
        assert answer.choices[0].finish_reason == "length"
        assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt_len, ref_len)
        assert answer.usage.total_tokens == prompt_len + ref_len
    prompt_len, ref_text, ref_len = expected[2]
    answer = client.chat.completions.create(
        model=MODEL, messages=chat(QUESTION), max_tokens=N, temperature=0
    )
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == ref_text
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt_len, ref_len)


def test_a_stream_carries_the_same_text_and_usage(client, expected) -> None:
    _, ref_text, ref_len = expected[2]
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=chat(QUESTION), max_tokens=N, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref_text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == ref_len
    assert len({c.id for c in chunks}) == 1
    _, ref_text, ref_len = expected[0]
    chunks = list(client.completions.create(
        model=MODEL, prompt=TEXTS[0], max_tokens=N, temperature=0, stream=True
    ))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == ref_text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)  # not asked for


def test_a_stop_string_cuts_the_answer_before_it(client, expected) -> None:
    _, ref_text, _ = expected[0]
    stop = ref_text[len(ref_text) // 2 : len(ref_text) // 2 + 3]
    cut = ref_text[: ref_text.find(stop)]
    answer = client.completions.create(
        model=MODEL, prompt=TEXTS[0], max_tokens=N, temperature=0, stop=[stop, "never there"]
    )
    assert (answer.choices[0].text, answer.choices[0].finish_reason) == (cut, "stop")
    chunks = list(client.completions.create(
        model=MODEL, prompt=TEXTS[0], max_tokens=N, temperature=0, stop=stop, stream=True
    ))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == cut  # nothing shown is taken back
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_tokens_zero_and_the_default_of_text_completions(client) -> None:
    answer = client.completions.create(model=MODEL, prompt="hi", max_tokens=0)
    assert (answer.choices[0].text, answer.usage.completion_tokens) == ("", 0)
    assert answer.choices[0].finish_reason == "length"
    answer = client.completions.create(model=MODEL, prompt="hi", extra_body={"ignore_eos": True})
    assert answer.usage.completion_tokens == 16  # OpenAI's default for text completions


def test_an_eos_at_the_end_is_a_stop_only_for_a_request_that_does_not_ignore_it() -> None:
    """The tokenizer reports "stop" when a request's last token is the EOS. With ignore_eos
    that token is chance: the request ran out of max_tokens, and says "length"."""
    import asyncio

    from minisgl.core import SamplingParams
    from minisgl.message import UserReply
    from minisgl.server.api_server import FrontendManager, RequestState

    def reason(ignore_eos: bool) -> str:
        manager = FrontendManager.__new__(FrontendManager)  # no sockets: pieces reads a queue
        manager.requests = {}
        state = RequestState(0, SamplingParams(max_tokens=1, ignore_eos=ignore_eos))
        state.replies.put_nowait(UserReply(0, "", finished=True, finish_reason="stop"))

        async def read() -> None:
            assert [p async for p in manager.pieces(state, [])] == []

        asyncio.run(read())
        return state.finish_reason

    assert (reason(ignore_eos=False), reason(ignore_eos=True)) == ("stop", "length")


BAD: List[Tuple[str, object, str, str | None]] = [
    ("/v1/completions", "{prompt: hi", "not valid JSON", None),
    ("/v1/completions", {"max_tokens": 4}, "prompt: Field required", "prompt"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt: Input should be a valid string", "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, "'user'",
     "messages.0.role"),
    ("/v1/chat/completions", {"messages": []}, "may not be empty", "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, "valid list", "messages"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens must be", "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, "at most 4096 tokens", "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, "temperature must be", "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p must be", "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_k": 0}, "top_k must be", "top_k"),
    ("/v1/completions", {"prompt": "hi", "n": 3}, "'n' is not supported", "n"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 2}, "'logprobs' is not supported", "logprobs"),
    ("/v1/completions", {"prompt": "hi", "colour": "red"}, "unknown field 'colour'", "colour"),
    ("/v1/completions", {"prompt": "hi", "stop": [""]}, "may not be empty", "stop"),
    # SmolLM2's tokenizer makes one token of each "hello" here
    ("/v1/completions", {"prompt": "hello" * 4096}, "the prompt has 4096 tokens", None),
    ("/v1/completions", {"prompt": ""}, "the prompt has 0 tokens", None),
    ("/v1/completions", {"prompt": "", "stream": True}, "the prompt has 0 tokens", None),
]  # fmt: skip


def test_bad_requests_get_a_400_that_names_the_field_and_the_server_keeps_serving(
    server, client, expected
) -> None:
    for path, body, message, param in BAD:
        status, text = server.post(path, body)  # type: ignore[arg-type]
        error = json.loads(text)["error"]
        assert status == 400, (body, text)
        assert message in error["message"], (body, error)
        assert error["param"] == param and error["type"] == "invalid_request_error", error
    with pytest.raises(openai.BadRequestError, match="temperature must be"):
        client.completions.create(model=MODEL, prompt="hi", temperature=-1)
    assert server.get("/v1/nowhere")[0] == 404
    test_answers_are_transformers_greedy_output_with_exact_usage(client, expected)
    assert server.metrics_when_idle()["minisgl_kv_pages_used"] == 0


def test_clients_that_go_away_free_everything_their_requests_held(server, expected) -> None:
    """64 requests at once: a third read one chunk of their stream and close it, a third give
    up after 0.3 s, a third run to the end. The last get transformers' text; then the
    scheduler's integrity check passes: nothing runs or waits, every page is free or cached,
    every request slot is free."""

    LONG = {"extra_body": {"ignore_eos": True}}  # 400 tokens: they would run for seconds

    async def run() -> List[str]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        impatient = client.with_options(timeout=0.3)

        async def leaves_the_stream(i: int) -> str:
            stream = await client.completions.create(
                model=MODEL, prompt=f"{i} " + TEXTS[1], max_tokens=400, stream=True, **LONG
            )
            async for _ in stream:
                break
            await stream.close()
            return "left"

        async def gives_up(i: int) -> str:
            try:
                await impatient.completions.create(
                    model=MODEL, prompt=f"{i} " + TEXTS[1], max_tokens=400, **LONG
                )
            except openai.APITimeoutError:
                return "gave up"
            return "finished too early"

        async def stays(_: int) -> str:
            answer = await client.completions.create(
                model=MODEL, prompt=TEXTS[0], max_tokens=N, temperature=0
            )
            return answer.choices[0].text

        kinds = [leaves_the_stream, gives_up, stays]
        results = await asyncio.gather(*(kinds[i % 3](i) for i in range(64)))
        await client.close()
        return results

    def counts() -> Tuple[float, float, int]:
        values = server.metrics_when_idle()
        aborted = len(re.findall(r"request \d+ aborted", server.output()))
        return values[RECEIVED], values[FINISHED], aborted

    received, finished, aborted = counts()
    results = asyncio.run(run())
    assert results[0::3] == ["left"] * 22 and results[1::3] == ["gave up"] * 21
    assert results[2::3] == [expected[0][1]] * 21
    values = server.metrics_when_idle()
    assert values["minisgl_kv_pages_cached"] < values["minisgl_kv_pages"]
    assert values["minisgl_request_slots_free"] == 256  # --max-running-requests' default
    # every request the server received either finished or was aborted; the 22 that read a
    # chunk surely arrived, but on a loaded machine a client can give up before its request
    # reaches the server, which then has nothing to abort
    received, finished, aborted = (a - b for a, b in zip(counts(), (received, finished, aborted)))
    assert finished == 21 and aborted == received - finished and aborted >= 22, (
        received, finished, aborted,
    )  # fmt: skip


def test_generate_streams_plain_text_events(server, expected) -> None:
    status, text = server.post("/generate", {"prompt": TEXTS[0], "max_tokens": N})
    assert status == 200
    events = sse_events(text)
    assert events[-1] == "[DONE]" and "".join(events[:-1]) == expected[0][1]
    assert len(events) - 1 == expected[0][2]  # one event per token: this text has no bad UTF-8


def test_models_health_and_metrics(server, client) -> None:
    assert [m.id for m in client.models.list().data] == [str(server.command[4])]
    assert server.get("/health") == (200, json.dumps({"status": "ok"}, separators=(",", ":")))
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)  # alone, it needs one
    values = server.metrics_when_idle()
    for name in ("minisgl_time_to_first_token_seconds_count", "minisgl_prompt_tokens_total",
                 "minisgl_e2e_request_latency_seconds_count", "minisgl_kv_pages"):  # fmt: skip
        assert values[name] > 0, name


def test_sampling_through_the_server(client) -> None:
    answer = client.completions.create(
        model=MODEL, prompt=TEXTS[0], max_tokens=N, temperature=0.8, top_p=0.9,
        extra_body={"top_k": 20, "ignore_eos": True},
    )  # fmt: skip
    assert answer.usage.completion_tokens == N and answer.choices[0].finish_reason == "length"


def _pid_of(server: ServerProcess, name: str) -> int:
    match = re.search(rf"{name} is ready \(pid (\d+)\)", server.output())
    assert match, server.output()[-2000:]
    return int(match.group(1))


def _wait_for_tokens(server: ServerProcess, count: int, timeout: float = 60.0) -> None:
    """Until the API server has streamed `count` generated tokens (its /metrics counter)."""
    deadline = time.monotonic() + timeout
    while server.metrics().get("minisgl_generation_tokens_total", 0) < count:
        assert time.monotonic() < deadline, f"fewer than {count} tokens after {timeout} s"
        time.sleep(0.05)


def test_a_dead_scheduler_fails_every_request_at_once(model_path) -> None:
    with ServerProcess(model_path(MODEL), *FLAGS) as server:
        answers: List[Tuple[int, str]] = []
        body = {"prompt": "hi", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        waiting = threading.Thread(
            target=lambda: answers.append(server.post("/v1/completions", body, timeout=60))
        )
        waiting.start()
        _wait_for_tokens(server, 2)  # it is decoding, and the stream has begun
        os.kill(_pid_of(server, "scheduler"), signal.SIGKILL)
        began = time.monotonic()
        waiting.join(30)
        assert answers and time.monotonic() - began < 5
        status, text = answers[0]
        assert status == 200  # the stream had started: the error is its last event
        error = sse_data(text)[-1]["error"]
        assert "exited" in error["message"] and error["type"] == "server_error", error
        status, text = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert status == 503 and "minisgl-TP0-scheduler (exit code -9)" in text, text
        status, text = server.get("/health")
        assert status == 503 and json.loads(text)["status"] == "unhealthy"
        suffix = re.search(r"_unique_suffix='([^']+)'", server.output())
        assert suffix, server.output()[-2000:]
        assert server.stop() == 0  # and the launcher still stops the other workers
    # the killed scheduler never closed its socket: the launcher deletes what it left (its
    # files only: the suffix has random digits, a file of a dead server with the same pid stays)
    assert not list(Path(tempfile.gettempdir()).glob(f"minisgl-{suffix.group(1)}-*"))


def test_two_tokenizer_workers_serve_in_order(server, expected) -> None:
    assert _pid_of(server, "tokenizer 0") != _pid_of(server, "tokenizer 1")

    async def run() -> List[Tuple[str, int]]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        jobs = [client.completions.create(model=MODEL, prompt=TEXTS[i % 2], max_tokens=N,
                                          temperature=0) for i in range(12)]  # fmt: skip
        answers = await asyncio.gather(*jobs)
        await client.close()
        return [(a.choices[0].text, a.usage.prompt_tokens) for a in answers]

    answers = asyncio.run(run())
    assert answers == [(expected[i % 2][1], expected[i % 2][0]) for i in range(12)]
    server.metrics_when_idle()


def readme_block(language: str, containing: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"README.md has {len(found)} {language} blocks with {containing!r}"
    return found[0]


def test_the_readmes_curl_and_openai_calls(server, model_path) -> None:
    """The two calls of README.md's "Serve it", run as written there (with this server's
    address): each prints transformers' greedy answer to the question."""
    readme_url = "http://127.0.0.1:1919"
    question = "What is the capital of France?"
    tok = load_tokenizer(MODEL)
    text = tok.apply_chat_template(chat(question), add_generation_prompt=True, tokenize=False)
    ref = hf_references(MODEL, [tok(text).input_ids], 24)[0]
    want = tok.decode(ref.tokens, skip_special_tokens=True)

    curl = readme_block("bash", f"curl -s {readme_url}").replace(readme_url, server.url)
    assert shutil.which("curl"), "the README's example needs curl"
    done = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["choices"][0]["message"]["content"] == want

    code = readme_block("python", "openai.OpenAI(").replace(readme_url, server.url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == want + "\n"


# ------------------------------------------------------------------------------ the shell
class Terminal:
    """A pseudo-terminal with the shell in it: Ctrl-C is a real SIGINT from the terminal."""

    def __init__(self, command: List[str], env: Dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST  # output as written (no \n -> \r\n)
        attrs[3] &= ~termios.ECHO  # and without our own keystrokes in it
        termios.tcsetattr(slave, termios.TCSANOW, attrs)

        # the terminal is its controlling terminal, in a session of its own
        self.process = popen(command, stdin=slave, stdout=slave, stderr=slave, env=env,
                             terminal=True)  # fmt: skip
        os.close(slave)
        self.seen, self.read_to = "", 0

    def until(self, text: str, timeout: float = 120.0) -> str:
        """What the shell printed, up to and with `text`."""
        deadline = time.monotonic() + timeout
        while (at := self.seen.find(text, self.read_to)) < 0:
            self._read(deadline, f"no {text!r} in: {self.seen[self.read_to :]!r}")
        got, self.read_to = self.seen[self.read_to : at + len(text)], at + len(text)
        return got

    def some_output(self, timeout: float = 60.0) -> str:
        """Wait until the shell prints something new (a piece of an answer), and return it."""
        deadline = time.monotonic() + timeout
        while len(self.seen) == self.read_to:
            self._read(deadline, f"no output after {self.seen[-200:]!r}")
        got, self.read_to = self.seen[self.read_to :], len(self.seen)
        return got

    def _read(self, deadline: float, failure: str) -> None:
        """Add what the shell printed within 0.2 s to `seen`; fail past the deadline."""
        if time.monotonic() > deadline or self.process.poll() is not None:
            raise AssertionError(failure)
        if select.select([self.master], [], [], 0.2)[0]:
            try:
                chunk = os.read(self.master, 4096).decode(errors="replace")
            except OSError:
                return
            self.seen += re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", chunk)  # readline's codes

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        os.close(self.master)


def test_the_shell_chats_keeps_the_conversation_and_knows_its_commands(model_path) -> None:
    tok = load_tokenizer(MODEL)
    env = child_env(MINISGL_SHELL_TEMPERATURE="0", MINISGL_SHELL_MAX_TOKENS=str(N))
    term = Terminal([sys.executable, "-m", "minisgl.shell", "--model", str(model_path(MODEL)),
                     *FLAGS], env)  # fmt: skip
    try:
        term.until("$ ")
        conversation: List[Dict[str, str]] = []
        for line in ["Hello!", "And then?"]:
            conversation.append({"role": "user", "content": line})
            text = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
            ref = hf_references(MODEL, [tok(text).input_ids], N)[0]
            want = tok.decode(ref.tokens, skip_special_tokens=True)
            term.type(line + "\n")
            assert term.until("\n$ ") == want + "\n$ "  # the second turn saw the first
            conversation.append({"role": "assistant", "content": want})
        term.type("/reset\n")
        assert "forgotten" in term.until("$ ")
        term.type("/frobnicate\n")
        assert "unknown command /frobnicate" in term.until("$ ")
        term.type("/exit\n")
        assert term.process.wait(30) == 0
    finally:
        term.close()


def test_ctrl_c_in_the_shell_stops_the_answer_not_the_workers(model_path) -> None:
    env = child_env(MINISGL_SHELL_TEMPERATURE="0", MINISGL_SHELL_MAX_TOKENS="100000")
    term = Terminal([sys.executable, "-m", "minisgl.shell", "--model", str(model_path(MODEL)),
                     "--num-pages", "4096", "--page-size", "4"], env)  # fmt: skip
    try:
        term.until("$ ")
        term.type("Tell me a long story.\n")
        term.some_output()  # the answer streams (a random model never says EOS)
        term.type("\x03")
        assert term.until("(stopped)\n$ ")
        term.type("Hello!\n")  # the workers are alive: a new answer comes, and is stopped
        term.some_output()
        term.type("\x03")
        term.until("(stopped)\n$ ")
        term.type("\x04")  # Ctrl-D leaves
        assert term.process.wait(30) == 0
    finally:
        term.close()


# ----------------------------------------------------------------------- the command line
UPSTREAM_FLAGS = ["--model-path", "--dtype", "--tp-size", "--max-running-requests",
                  "--max-seq-len-override", "--memory-ratio", "--dummy-weight", "--host",
                  "--port", "--cuda-graph-max-bs", "--num-tokenizer", "--max-prefill-length",
                  "--num-pages", "--page-size", "--attention-backend", "--cache-type",
                  "--shell-mode"]  # fmt: skip


def test_the_command_line(capsys, monkeypatch) -> None:
    monkeypatch.setenv("MINISGL_DEVICE", "cpu")  # "auto" on a GPU reads the model's config
    args, shell = parse_args(["--model", "some/model", "--port", "8000", "--num-tokenizer", "2"])
    assert (args.server_port, args.num_tokenizer, shell) == (8000, 2, False)
    assert args.dtype == torch.float32  # on a CPU, whatever the checkpoint says
    assert args.zmq_tokenizer_addr_of(0) != args.zmq_tokenizer_addr_of(1)
    args, shell = parse_args(["--model", "m", "--shell-mode"])
    assert shell and args.max_running_req == 1 and args.silent_output
    for flags, message in [
        (["--tp-size", "0"], "at least 1"),
        (["--port", "0"], "port number"),
        (["--memory-ratio", "1.5"], "must be in"),
        (["--num-tokenizer", "-1"], "0 or more"),
        (["--attention-backend", "nonsense"], "nonsense"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            parse_args(["--model", "m", *flags])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    # and once as a reader types it: argparse's usage and the reason, exit code 2
    command = [sys.executable, "-m", "minisgl", "--model", "m", "--tp-size", "0"]
    err = run(command, env=ENV, timeout=60)  # subprocess.run's, or a fork of a warm copy
    assert err.returncode == 2 and "usage:" in err.stderr and "at least 1" in err.stderr
    explained = {flag: action.help for action in build_parser()._actions
                 for flag in action.option_strings}  # fmt: skip
    for flag in UPSTREAM_FLAGS:
        assert explained.get(flag), f"--help does not explain {flag}"


def test_a_child_keeps_the_path_it_inherits_behind_the_repository(monkeypatch) -> None:
    """`python -m minisgl` as a child finds this repository's package first and keeps what
    PYTHONPATH held: under `tools/steps.py check` that is the guard that records what the
    child runs, without which a test of the server would rerun in no later chapter."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/guard", "/elsewhere"]))
    env = child_env(LOG_LEVEL="INFO")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/guard", "/elsewhere"]
    assert env["LOG_LEVEL"] == "INFO"
    monkeypatch.delenv("PYTHONPATH")
    assert child_env()["PYTHONPATH"] == str(ROOT)
