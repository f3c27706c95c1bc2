"""The API server: HTTP in front of the workers (FastAPI, under uvicorn).

Each request gets a uid and a queue. The listener task routes every UserReply to its request's
queue; the watch task fails every waiting request at once if a worker dies. A request is
answered only after the tokenizer has counted its prompt, so that a request the engine cannot
serve gets a 400 before any answer has started. A client that goes away (streaming or not)
aborts its request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Callable, Dict, List

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortMsg,
    BaseFrontendMsg,
    BaseTokenizerMsg,
    BatchFrontendMsg,
    TokenizeMsg,
    UserReply,
)
from minisgl.utils import ZmqAsyncPullQueue, ZmqAsyncPushQueue, init_logger

from . import metrics
from .protocol import (
    ChatCompletionRequest,
    CompletionParams,
    CompletionRequest,
    GenerateRequest,
    ModelCard,
    RequestError,
    chat_answer,
    chat_chunk,
    text_answer,
    usage,
    usage_chunk,
)

if TYPE_CHECKING:
    from .args import ServerArgs
    from .launch import Backend

logger = init_logger(__name__, "api_server")
WATCH_EVERY_S = 0.5
TEXT_COMPLETION_MAX_TOKENS = 16


@dataclass
class RequestState:
    uid: int
    params: SamplingParams
    replies: asyncio.Queue = field(default_factory=asyncio.Queue)
    early: List[UserReply] = field(default_factory=list)  # tokens that overtook the count
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "length"
    arrived: float = field(default_factory=time.perf_counter)
    last_token: float = 0.0

    def count_token(self) -> None:
        now = time.perf_counter()
        if self.completion_tokens == 0:
            metrics.TIME_TO_FIRST_TOKEN.observe(now - self.arrived)
        else:
            metrics.TIME_BETWEEN_TOKENS.observe(now - self.last_token)
        self.completion_tokens += 1
        self.last_token = now
        metrics.TOKENS_OUT.inc()


class FrontendManager:
    def __init__(self, config: ServerArgs, backend: Backend) -> None:
        self.config, self.backend = config, backend
        self.recv_tokenizer = ZmqAsyncPullQueue(
            config.zmq_frontend_addr, create=True, decoder=BaseFrontendMsg.decoder
        )
        # one queue per tokenizer: a request's messages all go to the tokenizer its uid picks,
        # so that its abort can never overtake its prompt
        self.send_tokenizer = [
            ZmqAsyncPushQueue(config.zmq_tokenizer_addr_of(i), False, BaseTokenizerMsg.encoder)
            for i in range(max(1, config.num_tokenizer))
        ]
        self.send_detokenizer = None
        if not config.share_tokenizer:  # it keeps decoding state that an abort must clear
            self.send_detokenizer = ZmqAsyncPushQueue(
                config.zmq_detokenizer_addr, False, BaseTokenizerMsg.encoder
            )
        self.requests: Dict[int, RequestState] = {}
        self.uid_counter = 0
        self.failure: str | None = None  # set when a worker has died
        self.tasks: List[asyncio.Task] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self.listen()), asyncio.create_task(self.watch())]

    async def listen(self) -> None:
        while True:
            msg = await self.recv_tokenizer.get()
            for reply in msg.data if isinstance(msg, BatchFrontendMsg) else [msg]:
                if isinstance(reply, UserReply) and reply.uid in self.requests:
                    self.requests[reply.uid].replies.put_nowait(reply)

    async def watch(self) -> None:
        """A worker that dies fails every request at once (and every later one)."""
        while self.failure is None:
            await asyncio.sleep(WATCH_EVERY_S)
            if dead := self.backend.dead():
                self.failure = f"the server cannot serve: {', '.join(dead)} exited"
                logger.error(self.failure)
                for state in self.requests.values():
                    state.replies.put_nowait(UserReply(state.uid, "", True, error=self.failure))

    async def submit(
        self, text: str | List[Dict[str, str]], params: SamplingParams
    ) -> RequestState:
        if self.failure is not None:
            raise RequestError(self.failure, status=503)
        uid, self.uid_counter = self.uid_counter, self.uid_counter + 1
        state = self.requests[uid] = RequestState(uid, params)
        metrics.REQUESTS.inc()
        await self._tokenizer_of(uid).put(TokenizeMsg(uid, text, params))
        return state

    def _tokenizer_of(self, uid: int) -> ZmqAsyncPushQueue:
        return self.send_tokenizer[uid % len(self.send_tokenizer)]

    async def abort(self, state: RequestState) -> None:
        if self.requests.pop(state.uid, None) is None:
            return  # finished already
        logger.info(f"request {state.uid} aborted")
        await self._tokenizer_of(state.uid).put(AbortMsg(state.uid))
        if self.send_detokenizer is not None:
            await self.send_detokenizer.put(AbortMsg(state.uid))

    def done(self, state: RequestState) -> None:
        self.requests.pop(state.uid, None)

    async def started(self, state: RequestState, explicit_max_tokens: bool) -> None:
        """Wait for the tokenizer's count of the prompt; refuse (400) what cannot be served."""
        while True:
            reply = await state.replies.get()
            if reply.error is not None:
                self.done(state)
                raise RequestError(reply.error, status=self._status(reply, before_answer=True))
            if reply.prompt_tokens is not None:
                break
            # with several tokenizers the count and the tokens come from two processes, and
            # a token may overtake the count: keep it for pieces()
            state.early.append(reply)
        state.prompt_tokens = reply.prompt_tokens
        limit = self.backend.max_seq_len
        prompt = _tokens(state.prompt_tokens)
        if state.prompt_tokens == 0 or state.prompt_tokens >= limit:
            await self.abort(state)
            raise RequestError(
                f"the prompt has {prompt}; this server takes at least 1 and at most {limit} "
                "tokens per request, prompt and output together"
            )
        if explicit_max_tokens and state.prompt_tokens + state.params.max_tokens > limit:
            await self.abort(state)
            raise RequestError(
                f"the prompt has {prompt} and max_tokens asks for {state.params.max_tokens} "
                f"more; this server takes at most {limit} tokens per request",
                param="max_tokens",
            )

    async def pieces(self, state: RequestState, stops: List[str]) -> AsyncIterator[str]:
        """The request's text, piece by piece, cut before the first stop string (the request
        is then aborted): a stream never shows text that a stop string later takes back."""
        text, shown = "", 0
        keep = max((len(s) for s in stops), default=1) - 1  # could be the start of a stop
        while True:
            reply = state.early.pop(0) if state.early else await state.replies.get()
            if reply.error is not None:
                self.done(state)
                first = state.completion_tokens == 0
                raise RequestError(reply.error, status=self._status(reply, before_answer=first))
            if reply.carries_token:
                state.count_token()
            text += reply.incremental_output
            cut = min((text.find(s) for s in stops if s in text), default=-1)
            if cut >= 0:
                state.finish_reason = "stop"
                if cut > shown:
                    yield text[shown:cut]
                await self.abort(state)
                return
            if reply.finished:
                # the tokenizer says "stop" when the last token is the EOS; for a request that
                # ignores the EOS that is chance, and its budget ended it
                eos_ends = not state.params.ignore_eos
                state.finish_reason = (reply.finish_reason if eos_ends else None) or "length"
                metrics.END_TO_END.observe(time.perf_counter() - state.arrived)
                self.done(state)
                if len(text) > shown:
                    yield text[shown:]
                return
            safe = len(text) - keep if stops else len(text)
            if safe > shown:
                yield text[shown:safe]
                shown = safe

    def _status(self, reply: UserReply, before_answer: bool) -> int:
        """503 when a worker died; 400 for a refusal (it comes before any token); else 500."""
        if reply.error == self.failure:
            return 503
        return 400 if before_answer else 500

    async def shutdown(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for q in [self.recv_tokenizer, *self.send_tokenizer, self.send_detokenizer]:
            if q is not None:
                q.stop()


def _tokens(count: int) -> str:
    return f"{count} token{'' if count == 1 else 's'}"


# ---------------------------------------------------------------------------- the app
def create_app(config: ServerArgs, backend: Backend) -> FastAPI:
    state: Dict[str, FrontendManager] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        manager = state["manager"] = FrontendManager(config, backend)
        manager.start()
        logger.info(
            f"serving {config.model_path} at http://{config.server_host}:{config.server_port}"
        )
        try:
            yield
        finally:
            await manager.shutdown()

    app = FastAPI(title="mini-sglang", lifespan=lifespan)
    model_name = config.model_path

    @app.exception_handler(RequestError)
    async def refused(_: Request, error: RequestError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def malformed(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        if first.get("type") == "json_invalid":
            reason = first.get("ctx", {}).get("error", "")
            body = RequestError(f"the body is not valid JSON: {reason}").body()
            return JSONResponse(body, status_code=400)
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        return JSONResponse(RequestError(message, param=where or None).body(), status_code=400)

    async def serve(
        request: Request, body: CompletionParams, text: str | List[Dict[str, str]], chat: bool
    ) -> Response:
        manager = state["manager"]
        body.check_fields()
        stops = body.stop_strings()
        explicit = body.max_tokens is not None or body.max_completion_tokens is not None
        # OpenAI's defaults: a chat answer may fill the context, a text completion is 16 tokens
        default_max_tokens = backend.max_seq_len if chat else TEXT_COMPLETION_MAX_TOKENS
        params = body.sampling_params(default_max_tokens)
        req = await manager.submit(text, params)
        try:
            await manager.started(req, explicit)
        except BaseException:
            await manager.abort(req)
            raise
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{req.uid}"
        metrics.TOKENS_IN.inc(req.prompt_tokens)
        if body.stream:
            stream = _chat_stream if chat else _text_stream
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = stream(manager, req, stops, rid, model_name, include_usage)
            return StreamingResponse(
                _abort_when_gone(manager, req, events, request), media_type="text/event-stream"
            )
        collected = await _collect(manager, req, stops, request)
        counts = usage(req.prompt_tokens, req.completion_tokens)
        answer = (chat_answer if chat else text_answer)(
            rid, model_name, collected, req.finish_reason, counts
        )
        return JSONResponse(answer)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        if not body.messages:
            raise RequestError("messages may not be empty", param="messages")
        return await serve(request, body, [m.model_dump() for m in body.messages], chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await serve(request, body, body.prompt, chat=False)

    @app.post("/generate")
    async def generate(body: GenerateRequest, request: Request) -> Response:
        manager = state["manager"]
        params = CompletionParams(
            max_tokens=body.max_tokens, ignore_eos=body.ignore_eos, temperature=0.0
        ).sampling_params(backend.max_seq_len)
        req = await manager.submit(body.prompt, params)
        await manager.started(req, explicit_max_tokens=True)

        async def events() -> AsyncIterator[bytes]:
            async for piece in manager.pieces(req, []):
                yield _sse_text(piece)
            yield _sse_text("[DONE]")

        return StreamingResponse(
            _abort_when_gone(manager, req, events(), request), media_type="text/event-stream"
        )

    @app.get("/v1/models")
    async def models() -> Dict:
        return {"object": "list", "data": [ModelCard(id=model_name, root=model_name).model_dump()]}

    @app.get("/health")
    async def health() -> JSONResponse:
        dead = backend.dead()
        if dead:
            return JSONResponse({"status": "unhealthy", "exited": dead}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return app


async def _collect(
    manager: FrontendManager, req: RequestState, stops: List[str], request: Request
) -> str:
    """The whole text; if the client goes away before it is done, the request is aborted."""

    async def gather() -> str:
        return "".join([piece async for piece in manager.pieces(req, stops)])

    task = asyncio.create_task(gather())
    while not task.done():
        await asyncio.wait({task}, timeout=WATCH_EVERY_S)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            await manager.abort(req)
            raise RequestError("the client went away", status=499)
    return task.result()


async def _abort_when_gone(
    manager: FrontendManager, req: RequestState, events: AsyncIterator[bytes], request: Request
) -> AsyncIterator[bytes]:
    """Stream `events`; a client that goes away (or an error) aborts the request."""
    try:
        async for event in events:
            if await request.is_disconnected():
                break
            yield event
    except RequestError as error:  # the answer has started: report it in the stream
        yield f"data: {json.dumps(error.body())}\n\n".encode()
        yield b"data: [DONE]\n\n"
    finally:
        await manager.abort(req)


def _sse_text(text: str) -> bytes:
    """One server-sent event of plain text: a line of its own for each line of the text (a
    client joins them with newlines), then a blank line."""
    return "".join(f"data: {line}\n" for line in text.split("\n")).encode() + b"\n"


def _sse(obj: Dict) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _chat_stream(
    manager: FrontendManager,
    req: RequestState,
    stops: List[str],
    rid: str,
    model: str,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    yield _sse(chat_chunk(rid, model, {"role": "assistant", "content": ""}, None))
    async for piece in manager.pieces(req, stops):
        yield _sse(chat_chunk(rid, model, {"content": piece}, None))
    yield _sse(chat_chunk(rid, model, {}, req.finish_reason))
    if include_usage:
        counts = usage(req.prompt_tokens, req.completion_tokens)
        yield _sse(usage_chunk(rid, model, "chat.completion.chunk", counts))
    yield b"data: [DONE]\n\n"


async def _text_stream(
    manager: FrontendManager,
    req: RequestState,
    stops: List[str],
    rid: str,
    model: str,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    async for piece in manager.pieces(req, stops):
        yield _sse(text_answer(rid, model, piece, None, None))
    yield _sse(text_answer(rid, model, "", req.finish_reason, None))
    if include_usage:
        counts = usage(req.prompt_tokens, req.completion_tokens)
        yield _sse(usage_chunk(rid, model, "text_completion", counts))
    yield b"data: [DONE]\n\n"


# ---------------------------------------------------------------------------- the shell
SHELL_COMMANDS = {"/reset": "forget the conversation", "/exit": "leave (or Ctrl-D)"}


def shell(config: ServerArgs, backend: Backend) -> None:
    """Chat in the terminal: each line is the user's turn; the answer streams in as it is
    made. The conversation so far goes with every turn. Ctrl-C stops an answer (the request
    is aborted) and, at the prompt, leaves."""
    try:
        import readline  # noqa: F401  (input() then edits lines and keeps their history)
    except ImportError:  # not on every platform
        pass
    if config.silent_output:
        logging.disable(logging.INFO)  # the answers are the output, not "request 3 aborted"
    loop = asyncio.new_event_loop()
    manager = FrontendManager(config, backend)
    loop.run_until_complete(_in_loop(manager.start))
    history: List[Dict[str, str]] = []
    print(
        f"chatting with {config.model_path}; "
        + "; ".join(f"{name}: {what}" for name, what in SHELL_COMMANDS.items()),
        flush=True,
    )
    try:
        while True:
            try:
                line = input("$ ").strip()
            except (EOFError, KeyboardInterrupt):
                print()
                break
            if not line:
                continue
            if line.startswith("/"):
                if line == "/exit":
                    break
                if line == "/reset":
                    history = []
                    print("(the conversation is forgotten)", flush=True)
                else:
                    print(f"unknown command {line}; the commands: {', '.join(SHELL_COMMANDS)}")
                continue
            turn = history + [{"role": "user", "content": line}]
            answer = loop.run_until_complete(_shell_turn(manager, turn))
            if answer is not None:
                history = turn + [{"role": "assistant", "content": answer}]
    finally:
        loop.run_until_complete(manager.shutdown())
        loop.close()


async def _in_loop(start: Callable[[], None]) -> None:
    start()  # the manager's tasks belong to the running loop


async def _shell_turn(manager: FrontendManager, messages: List[Dict[str, str]]) -> str | None:
    """Stream one answer to the terminal; None if it was refused or stopped."""
    from minisgl.env import ENV

    params = SamplingParams(
        temperature=ENV.SHELL_TEMPERATURE.value,
        top_k=ENV.SHELL_TOP_K.value,
        top_p=ENV.SHELL_TOP_P.value,
        max_tokens=min(ENV.SHELL_MAX_TOKENS.value, manager.backend.max_seq_len),
    )
    req = await manager.submit(messages, params)
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGINT, task.cancel)
    text = ""
    try:
        await manager.started(req, explicit_max_tokens=False)
        async for piece in manager.pieces(req, []):
            text += piece
            print(piece, end="", flush=True)
        print(flush=True)
        return text
    except RequestError as error:
        print(f"{chr(10) if text else ''}(refused: {error.message}; /reset starts afresh)")
        return None
    except asyncio.CancelledError:
        print("\n(stopped)", flush=True)
        return None
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await manager.abort(req)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def run_api_server(
    config: ServerArgs, start_backend: Callable[[], Backend], run_shell: bool
) -> None:
    """Start the workers (start_backend), then serve HTTP, or chat in the terminal; the
    workers are stopped when this returns, however it returns."""
    if run_shell and config.use_dummy_weight:
        raise ValueError("the shell needs real weights: leave out --dummy-weight")
    # SIGTERM is how a service manager (or a test) asks a server to stop. uvicorn, once it has
    # shut down, sends the signal again to the handler it found: let that one be ours, so the
    # workers are stopped below and the exit code is 0
    signal.signal(signal.SIGTERM, _exit_cleanly)
    backend = start_backend()
    try:
        if run_shell:
            shell(config, backend)
        else:
            app = create_app(config, backend)
            uvicorn.run(
                app,
                host=config.server_host,
                port=config.server_port,
                log_level="warning",
                timeout_graceful_shutdown=5,  # an open stream does not hold the exit up
            )
    finally:
        backend.stop()
