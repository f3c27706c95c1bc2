"""Chapter 11: overlap scheduling, LLM.generate, and the four fixes.

Each fix has a check that holds for our scheduler and a second test that puts upstream's
logic back (the class UpstreamLogic below: upstream's result processing and abort handling,
paraphrased) and asserts that the same check catches it. So each check is shown to fail on
the behaviour it guards against.
"""

from __future__ import annotations

from typing import Dict, List, Set, Tuple

import pytest
import torch

from examples.helpers import scripted
from minisgl.core import Req, SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.message import AbortBackendMsg, DetokenizeMsg
from minisgl.scheduler.prefill import ChunkedReq
from tests.support import load_example, requires_model
from tools.models import ensure_model
from tools.parity import build_prompts, hf_references


# ----------------------------------------------------------------------------- upstream's logic
class UpstreamLogic:
    """Upstream's processing of results and of aborts (python/minisgl/scheduler/scheduler.py
    at the pinned commit, lines 138-166 and 190-195), mixed into a scheduler to show what the
    checks below catch."""

    def _process_last_data(self, last_data) -> None:
        if last_data is None:
            return
        batch, (_, next_tokens_cpu, copy_done) = last_data[0].batch, last_data[1]
        copy_done.synchronize()
        reply: List[DetokenizeMsg] = []
        new_finished: Set[Req] = set()
        with self.cache_manager.lazy_free_region():
            for i, req in enumerate(batch.reqs):
                if isinstance(req, ChunkedReq):
                    continue
                token = next_tokens_cpu[i]
                req.append_host(token.unsqueeze(0))
                token = int(token.item())
                finished = not req.can_decode  # the device-side length, maybe one step ahead
                if not req.sampling_params.ignore_eos:
                    finished |= token == self.eos_token_id
                reply.append(DetokenizeMsg(uid=req.uid, next_token=token, finished=finished))
                if finished and req not in self.finished_reqs:  # freed now, even if in flight
                    self.decode_manager.remove_req(req)
                    self._free_req_resources(req)
                    new_finished.add(req)
                elif batch.is_prefill:
                    self.cache_manager.cache_req(req, finished=False)
        self.finished_reqs = new_finished
        self.send_result(reply)

    def _process_one_msg(self, msg) -> None:
        if isinstance(msg, AbortBackendMsg):  # freed at once, even if its batch is in flight
            req = self.prefill_manager.abort_req(msg.uid) or self.decode_manager.abort_req(msg.uid)
            if req is not None:
                self._free_req_resources(req)
            return
        super()._process_one_msg(msg)  # type: ignore[misc]


# ------------------------------------------------------------------------------------ helpers
class InFlightChecks:
    """Checks that no request slot or KV page is handed out while a launched, unprocessed
    batch still uses it (mixed into an LLM or a scripted scheduler)."""

    check_reuse = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.launched: List[Req] = []  # the requests of the batch in flight
        if not self.check_reuse:
            return
        allocate_slot = self.table_manager.allocate
        allocate_pages = self.cache_manager._allocate

        def checked_slot() -> int:
            slot = allocate_slot()
            users = [r.uid for r in self.launched if r.table_idx == slot]
            assert not users, f"slot {slot} handed out while requests {users} use it in flight"
            return slot

        def checked_pages(n: int) -> torch.Tensor:
            pages = allocate_pages(n)
            in_use = set()
            # every page the in-flight batch reads or writes: its requests' positions up to
            # cached_len (already advanced past the batch; the row beyond it may be stale)
            for r in self.launched:
                in_use |= set(self.engine.page_table[r.table_idx, : r.cached_len].tolist())
            clash = in_use & set(pages.tolist())
            assert not clash, f"KV slots {sorted(clash)[:4]} handed out while in flight"
            return pages

        self.table_manager.allocate = checked_slot  # type: ignore[method-assign]
        self.cache_manager._allocate = checked_pages  # type: ignore[method-assign]

    def _forward(self, forward_input):
        output = super()._forward(forward_input)
        self.launched = list(forward_input.batch.reqs)
        self.launched_batch = forward_input.batch
        return output

    def _process_last_data(self, last_data) -> None:
        super()._process_last_data(last_data)
        if last_data is not None and last_data[0].batch is getattr(self, "launched_batch", None):
            self.launched = []  # the batch just processed was the last launched: none in flight


class RecordingLLM(InFlightChecks, LLM):
    """Records every message sent out, and checks that nothing is reused while in flight."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.messages: List[DetokenizeMsg] = []

    def offline_send_result(self, reply: List[DetokenizeMsg]) -> None:
        self.messages.extend(reply)
        for msg in reply:  # upstream's LLM keeps tokens after "finished"; so does this check
            status = self.status_map[msg.uid]
            if not (msg.finished and msg.next_token == self.eos_token_id):
                status.output_ids.append(msg.next_token)
            status.finished = status.finished or msg.finished


class UpstreamLLM(UpstreamLogic, RecordingLLM):
    pass


class UpstreamLLMStreamsOnly(UpstreamLLM):
    check_reuse = False  # fixes 1 and 2 are about the messages; fix 3 would stop the run first


def make(cls, name: str = "tiny-qwen3", **kwargs) -> LLM:
    settings = dict(
        dtype=torch.float32,
        max_running_req=4,
        page_size=4,
        num_page_override=256,
        max_extend_tokens=64,
    )
    settings.update(kwargs)
    return cls(str(ensure_model(name)), **settings)


def streams(messages: List[DetokenizeMsg]) -> Dict[int, List[DetokenizeMsg]]:
    by_uid: Dict[int, List[DetokenizeMsg]] = {}
    for m in messages:
        by_uid.setdefault(m.uid, []).append(m)
    return by_uid


def check_streams(messages: List[DetokenizeMsg], max_tokens: Dict[int, int], eos: int) -> None:
    """What a streaming client needs: every token arrives, "finished" comes with the last one
    (the max_tokens-th, or the EOS), and nothing comes after it."""
    for uid, stream in streams(messages).items():
        flags = [m.finished for m in stream]
        assert flags.count(True) == 1 and flags[-1], f"request {uid}: finished flags {flags}"
        tokens = [m.next_token for m in stream]
        assert eos not in tokens[:-1], f"request {uid}: tokens after the EOS: {tokens}"
        if tokens[-1] != eos:
            assert len(tokens) == max_tokens[uid], f"request {uid}: {len(tokens)} tokens"


PROMPTS = [
    [9, 120, 3001],
    [77, 15, 16, 17, 18, 19, 20, 21, 22, 23],
    [5],
    [400, 401, 402, 403],
    [7, 8],
    [300, 301, 302, 303, 304, 305],
]


def fake_eos(name: str) -> int:
    """A token the tiny model really produces after a few steps, to act as its EOS: requests
    then end on it while their next decode step is already in flight."""
    model = load_example("examples/ch00_step0.py").Step0Model(ensure_model(name))
    return model.generate(PROMPTS[1], 6)[3]


# ------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama3"])
def test_overlap_on_and_off_give_the_same_tokens(name: str, model_path) -> None:
    params = [SamplingParams(max_tokens=n) for n in (12, 1, 30, 7, 2, 20)]
    outputs = []
    for disabled in (False, True):
        ENV.DISABLE_OVERLAP_SCHEDULING.value = disabled
        llm = make(LLM, name, max_extend_tokens=6)
        try:
            outputs.append([r["token_ids"] for r in llm.generate(PROMPTS, params)])
            llm.cache_manager.check_integrity()
        finally:
            llm.shutdown()
            ENV.DISABLE_OVERLAP_SCHEDULING.value = False
    assert outputs[0] == outputs[1]
    refs = [hf_references(name, [p], sp.max_tokens)[0].tokens for p, sp in zip(PROMPTS, params)]
    assert outputs[0] == refs


def run_streams(cls, name: str = "tiny-qwen3", eos: int | None = None, **kwargs):
    llm = make(cls, name, **kwargs)
    if eos is not None:
        llm.eos_token_id = eos
    params = [SamplingParams(max_tokens=n) for n in (12, 3, 9, 5, 1, 7)]
    try:
        llm.generate(PROMPTS, params)
        return llm.messages, {i: sp.max_tokens for i, sp in enumerate(params)}, llm
    finally:
        llm.shutdown()


def test_fix1_finished_comes_with_the_last_token() -> None:
    messages, budgets, llm = run_streams(RecordingLLM)
    check_streams(messages, budgets, llm.eos_token_id)


def test_fix1_upstream_flags_the_second_to_last_token() -> None:
    messages, budgets, llm = run_streams(UpstreamLLMStreamsOnly)
    with pytest.raises(AssertionError, match="finished flags"):
        check_streams(messages, budgets, llm.eos_token_id)


def test_fix2_nothing_after_the_eos() -> None:
    eos = fake_eos("tiny-qwen3")
    messages, budgets, llm = run_streams(RecordingLLM, eos=eos)
    assert any(m.next_token == eos for m in messages)  # some request did stop at the "EOS"
    check_streams(messages, budgets, eos)


def test_fix2_upstream_sends_a_token_past_the_eos() -> None:
    eos = fake_eos("tiny-qwen3")
    messages, budgets, _ = run_streams(UpstreamLLMStreamsOnly, eos=eos)
    with pytest.raises(AssertionError, match="finished flags|after the EOS"):
        check_streams(messages, budgets, eos)


@requires_model("smollm2-135m")
def test_fix2_llm_generate_stops_at_eos_with_smollm2() -> None:
    llm = make(LLM, "smollm2-135m", max_running_req=8)
    try:
        prompts = build_prompts("smollm2-135m", ["Hi"])  # a chat, answered in 10 tokens
        results = llm.generate(prompts, SamplingParams(max_tokens=40))
    finally:
        llm.shutdown()
    first = results[0]["token_ids"]  # the answer ends with <|im_end|> (the EOS)
    reference = hf_references("smollm2-135m", prompts[:1], 40)[0].tokens
    assert reference[-1] == llm.eos_token_id and first == reference[:-1]


def test_fix3_no_slot_or_page_is_reused_while_in_flight() -> None:
    eos = fake_eos("tiny-qwen3")
    # two request slots: new requests wait for a slot, which frees when a request stops
    messages, budgets, _ = run_streams(RecordingLLM, eos=eos, max_running_req=2)
    check_streams(messages, budgets, eos)


def test_fix3_upstream_hands_out_a_slot_in_flight() -> None:
    eos = fake_eos("tiny-qwen3")
    with pytest.raises(AssertionError, match="handed out while"):
        run_streams(UpstreamLLM, eos=eos, max_running_req=2)


def abort_during_prefill(cls) -> "scripted.ScriptedScheduler":
    """r0's only prefill chunk is launched at step 0; the abort arrives at step 1, while that
    batch is still in flight (processed after step 1's launch)."""

    bases = (cls, scripted.ScriptedScheduler) if cls is not None else (scripted.ScriptedScheduler,)
    Driver = type("Driver", bases, {})

    config = scripted.make_config(
        "tiny-qwen2", page_size=4, num_page_override=64, cache_type="radix"
    )
    arrivals = [
        (0, scripted.user_msg(0, list(range(100, 130)), 8)),
        (0, scripted.user_msg(1, [5, 6, 7], 8)),
        (1, AbortBackendMsg(uid=0)),
    ]
    sched = Driver(config, arrivals)
    try:
        sched.run()
        sched.cache_manager.check_integrity()
    finally:
        sched.shutdown()
    return sched


def test_fix4_abort_during_the_last_prefill_chunk_frees_once() -> None:
    sched = abort_during_prefill(None)
    assert 0 not in sched.outputs and len(sched.outputs[1]) == 8
    assert sched.table_manager.available_size == 16


def test_fix4_upstream_frees_twice() -> None:
    with pytest.raises((AssertionError, RuntimeError), match="unlocked more often|integrity"):
        abort_during_prefill(UpstreamLogic)


@requires_model("smollm2-135m")
def test_sampling_is_reproducible_and_per_request() -> None:
    params = [
        SamplingParams(temperature=1.5, top_k=3, max_tokens=8),
        SamplingParams(temperature=1.0, top_k=1, max_tokens=8),  # top-k 1: greedy
        SamplingParams(temperature=1.0, top_p=0.6, max_tokens=8),
        SamplingParams(max_tokens=8),
    ]
    runs = []
    for _ in range(2):
        llm = make(LLM, "smollm2-135m")
        try:
            runs.append([r["token_ids"] for r in llm.generate(PROMPTS[:4], params)])
        finally:
            llm.shutdown()
    assert runs[0] == runs[1]  # a fresh engine seeds its sampler the same way
    expected = [r.tokens for r in hf_references("smollm2-135m", PROMPTS[:4], 8)]
    assert runs[0][1] == expected[1] and runs[0][3] == expected[3]  # the greedy ones
    assert runs[0][0] != expected[0] and runs[0][2] != expected[2]  # the sampled ones do sample

    # Each sampled token must lie inside its own request's filter, judged by transformers'
    # distribution over the same prefix: within the top 3 for request 0, and inside the 0.6
    # nucleus of softmax(logits) for request 2.
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ensure_model("smollm2-135m"), dtype=torch.float32)
    for i, check in ((0, "top-k"), (2, "top-p")):
        prompt, out = PROMPTS[i], runs[0][i]
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
        for pos, (row, token) in enumerate(zip(logits, out)):
            order = row.argsort(descending=True).tolist()
            rank = order.index(token)
            if check == "top-k":
                assert rank < 3, f"request 0, token {pos}: rank {rank} is outside the top 3"
            else:
                probs = torch.softmax(row, dim=-1)[order]
                mass_before = float(probs[:rank].sum())
                assert mass_before < 0.6 + 1e-4, f"request 2, token {pos}: outside the nucleus"


def test_llm_generate_refuses_a_prompt_that_cannot_fit() -> None:
    llm = make(LLM, "tiny-mistral", page_size=4, num_page_override=8)  # 32 tokens
    try:
        with pytest.raises(
            ValueError, match="prompt 1: the prompt has 40 tokens; this engine takes 1 to 31"
        ):
            llm.generate([[1, 2, 3], list(range(3, 43))], SamplingParams(max_tokens=4))
        results = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=100))  # capped, not refused
        assert len(results[0]["token_ids"]) == 32 - 3
        llm.cache_manager.check_integrity()
    finally:
        llm.shutdown()


# ------------------------------------------------------- bad input, failures, lifetime (issue 9)
def invalid_request(kind: str):
    """(prompt, params) that LLM.generate must refuse; the params raise when made."""
    return {
        "token id = vocab size": lambda: ([5, 49152, 7], SamplingParams(max_tokens=4)),
        "negative token id": lambda: ([5, -3, 7], SamplingParams(max_tokens=4)),
        "empty prompt": lambda: ([], SamplingParams(max_tokens=4)),
        "over-long prompt": lambda: (list(range(3, 300)), SamplingParams(max_tokens=4)),
        "max_tokens=-1": lambda: ([5, 6], SamplingParams(max_tokens=-1)),
        "temperature=nan": lambda: ([5, 6], SamplingParams(temperature=float("nan"))),
        "temperature=-1": lambda: ([5, 6], SamplingParams(temperature=-1.0)),
        "top_p=0": lambda: ([5, 6], SamplingParams(temperature=1.0, top_p=0.0)),
        "top_p=-0.5": lambda: ([5, 6], SamplingParams(temperature=1.0, top_p=-0.5)),
        "top_k=0": lambda: ([5, 6], SamplingParams(temperature=1.0, top_k=0)),
        "top_k=-5": lambda: ([5, 6], SamplingParams(temperature=1.0, top_k=-5)),
    }[kind]()


@pytest.mark.parametrize(
    "kind, message",
    [
        (
            "token id = vocab size",
            "prompt 0: token id 49152 at position 1 is outside the vocabulary",
        ),
        ("negative token id", "prompt 0: token id -3 at position 1 is outside the vocabulary"),
        ("empty prompt", "prompt 0: the prompt has 0 tokens"),
        ("over-long prompt", "prompt 0: the prompt has 297 tokens; this engine takes 1 to 255"),
        ("max_tokens=-1", "max_tokens must be an integer >= 0"),
        ("temperature=nan", "temperature must be a finite number >= 0"),
        ("temperature=-1", "temperature must be a finite number >= 0"),
        ("top_p=0", r"top_p must be in \(0, 1\]"),
        ("top_p=-0.5", r"top_p must be in \(0, 1\]"),
        ("top_k=0", "top_k must be -1"),
        ("top_k=-5", "top_k must be -1"),
    ],
)
def test_bad_input_is_refused_with_its_reason_and_the_engine_keeps_serving(
    kind: str, message: str
) -> None:
    """Each row of the table in chapter 11's page: a clear error, nothing held, and the next
    valid request gets exactly the tokens it got before (five times over: nothing leaks)."""
    with make(LLM, "tiny-qwen3", page_size=4, num_page_override=64, max_running_req=4) as llm:
        before = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6))
        for _ in range(5):
            with pytest.raises(ValueError, match=message):
                prompt, params = invalid_request(kind)
                llm.generate([prompt], params)
            llm.cache_manager.check_integrity()
            assert llm.table_manager.available_size == 4
        assert llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6)) == before


def test_max_tokens_0_returns_no_token() -> None:
    with make(LLM, "tiny-qwen3") as llm:
        (result,) = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=0))
        assert result == {"text": "", "token_ids": [], "error": None}
        llm.cache_manager.check_integrity()


@pytest.mark.parametrize("failing_call", [1, 3])
def test_a_failing_forward_pass_ends_its_batch_with_an_error_and_frees_everything(
    failing_call: int,
) -> None:
    """The engine raises on its first call (a prefill) or its third (a decode step, while the
    previous one is in flight): the requests of that batch end with the error and keep what
    they had; every page and slot comes back; the next requests are served exactly."""
    with make(InFlightLLM, "tiny-qwen3", page_size=4, num_page_override=64) as llm:
        reference = llm.generate(PROMPTS[:3], SamplingParams(max_tokens=6))
        calls = {"n": 0}
        forward_batch = llm.engine.forward_batch

        def flaky(batch, args):
            calls["n"] += 1
            if calls["n"] == failing_call:
                raise RuntimeError("injected failure")
            return forward_batch(batch, args)

        llm.engine.forward_batch = flaky
        failed = llm.generate(PROMPTS[:3], SamplingParams(max_tokens=6))
        llm.engine.forward_batch = forward_batch
        errors = [r["error"] for r in failed]
        assert all("RuntimeError: injected failure" in e for e in errors), errors
        for ours, ref in zip(failed, reference):  # what came before the failure is right
            assert ref["token_ids"][: len(ours["token_ids"])] == ours["token_ids"]
        llm.cache_manager.check_integrity()
        assert llm.table_manager.available_size == 4
        assert llm.generate(PROMPTS[:3], SamplingParams(max_tokens=6)) == reference


class InFlightLLM(InFlightChecks, LLM):
    pass


def test_a_request_that_can_never_start_is_refused_instead_of_waiting_for_ever(
    monkeypatch,
) -> None:
    """If admission could never succeed (here it is made to fail), nothing runs and nothing
    will free room: the scheduler refuses the request rather than spin."""
    from minisgl.scheduler.prefill import PrefillAdder

    with make(LLM, "tiny-qwen3") as llm:
        monkeypatch.setattr(PrefillAdder, "_try_allocate_one", lambda self, req: None)
        (result,) = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4))
        assert "cannot be admitted" in result["error"] and result["token_ids"] == []
        monkeypatch.undo()
        llm.cache_manager.check_integrity()
        assert len(llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4))[0]["token_ids"]) == 4


def test_a_second_llm_needs_the_first_one_shut_down_and_says_so() -> None:
    first = make(LLM, "tiny-qwen3")
    try:
        with pytest.raises(RuntimeError, match=r"call its shutdown\(\) first"):
            make(LLM, "tiny-qwen3")
    finally:
        first.shutdown()
    for _ in range(2):  # with a `with` block, one after the other
        with make(LLM, "tiny-qwen3") as llm:
            assert len(llm.generate([[5, 6]], SamplingParams(max_tokens=2))[0]["token_ids"]) == 2


def abort_during_decode(*mixins: type) -> "scripted.ScriptedScheduler":
    """r0 and r1 decode; at step 3 r0's abort arrives while the decode batch launched at step
    2 (which holds r0) is still in flight, and r2 arrives wanting a slot (there are two)."""

    class Driver(*mixins, InFlightChecks, scripted.ScriptedScheduler):  # type: ignore[misc]
        tokens_at_abort = -1

        def offline_receive_msg(self, blocking: bool = False):
            messages = super().offline_receive_msg(blocking)
            if any(isinstance(m, AbortBackendMsg) for m in messages):
                self.tokens_at_abort = len(self.outputs.get(0, []))
            return messages

    config = scripted.make_config(
        "tiny-qwen3", max_running_req=2, page_size=4, num_page_override=64, cache_type="naive"
    )
    arrivals = [
        (0, scripted.user_msg(0, PROMPTS[0], 10)),
        (0, scripted.user_msg(1, PROMPTS[1], 10)),
        (3, AbortBackendMsg(uid=0)),
        (3, scripted.user_msg(2, PROMPTS[2], 4)),
    ]
    sched = Driver(config, arrivals)
    try:
        sched.run()
        sched.cache_manager.check_integrity()
    finally:
        sched.shutdown()
    return sched


def test_an_abort_while_its_decode_batch_is_in_flight_sends_nothing_more_and_frees_once() -> None:
    sched = abort_during_decode()
    assert sched.tokens_at_abort >= 1 and len(sched.outputs[0]) == sched.tokens_at_abort
    assert len(sched.outputs[1]) == 10 and len(sched.outputs[2]) == 4
    assert sched.table_manager.available_size == 2


def test_an_abort_in_flight_with_upstreams_logic_hands_the_slot_out_too_early() -> None:
    with pytest.raises(AssertionError, match="handed out while"):
        abort_during_decode(UpstreamLogic)


def test_an_abort_in_flight_with_upstreams_logic_sends_a_token_after_the_abort() -> None:
    class WithoutTheReuseCheck:
        check_reuse = False  # let upstream's run go on, to see what it sends

    sched = abort_during_decode(UpstreamLogic, WithoutTheReuseCheck)
    assert len(sched.outputs[0]) > sched.tokens_at_abort


# ------------------------------------------------------------------------ random mixes, checked
VOCAB = 49152


def request_strategy():
    """(prompt, max_tokens, kind): kind "ok" can be served; the others must be refused."""
    from hypothesis import strategies as st

    ok = st.tuples(
        st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=24),
        st.integers(0, 10),
        st.just("ok"),
    )
    bad_id = st.tuples(
        st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=8).flatmap(
            lambda ids: st.sampled_from([-1, VOCAB, VOCAB + 7]).map(lambda bad: ids + [bad])
        ),
        st.integers(1, 4),
        st.just("bad id"),
    )
    empty = st.tuples(st.just([]), st.integers(1, 4), st.just("empty"))
    return st.one_of(ok, ok, ok, bad_id, empty)


# float32 logits closer than this may swap places when the same sums run in another order
# (step 0 computes one request at a time, the engine a batch): random prompts find such ties
NEAR_TIE = 1e-4


def greedy_reference(
    model, prompt: List[int], n: int, eos: int, max_seq_len: int
) -> Tuple[List[int], int]:
    """What LLM.generate must return: step 0's greedy tokens, capped to what fits the engine,
    ending before the EOS; and how many of them are sure: all (len + 1, the end included)
    unless a token was chosen by a margin below NEAR_TIE, where the engine may take the
    runner-up and go its own way from there."""
    n = min(n, max_seq_len - len(prompt))
    margins: List[float] = []
    forward = model.forward

    def recorded(ids: torch.Tensor, start: int) -> torch.Tensor:
        logits = forward(ids, start)
        top2 = logits.topk(2).values
        margins.append(float(top2[0] - top2[1]))
        return logits

    model.forward = recorded  # for this call only: the instance's attribute hides the method
    try:
        tokens = model.generate(prompt, n) if n > 0 else []
    finally:
        del model.forward
    ties = [i for i, margin in enumerate(margins) if margin < NEAR_TIE]
    expected = tokens[: tokens.index(eos)] if eos in tokens else tokens
    return expected, ties[0] if ties else len(expected) + 1


def agrees(ours: List[int], expected: List[int], sure: int, finished: bool = True) -> bool:
    """The engine's tokens are the reference's (a prefix of them if not `finished`), up to
    the first near tie (`sure` tokens) where there is one."""
    if sure > len(expected) and finished:
        return ours == expected
    upto = sure if finished else min(sure, len(ours))
    return ours[:upto] == expected[:upto]


@pytest.fixture(scope="module")
def step0_qwen3():
    return load_example("examples/ch00_step0.py").Step0Model(ensure_model("tiny-qwen3"))


def test_random_mixes_of_valid_and_invalid_requests_on_tiny_pools(step0_qwen3) -> None:
    """Hypothesis throws mixes of servable and unservable requests at LLM.generate on pools of
    8 to 64 pages: a call with any unservable prompt is refused whole, naming each one and
    holding nothing; the servable ones then get exactly their greedy tokens (up to a near tie,
    see greedy_reference); after every call, every page is free or cached and every slot is
    free."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    @settings(
        max_examples=6,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a failure is shown unshrunk:
    )  # shrinking it would build hundreds of engines
    @given(
        requests=st.lists(request_strategy(), min_size=1, max_size=6),
        pages=st.sampled_from([8, 16, 64]),
        slots=st.integers(1, 4),
    )
    def check(requests, pages: int, slots: int) -> None:
        with make(
            LLM, "tiny-qwen3", page_size=4, num_page_override=pages, max_running_req=slots
        ) as llm:
            prompts = [p for p, _, _ in requests]
            params = [SamplingParams(max_tokens=n) for _, n, _ in requests]
            bad = [i for i, (_, _, kind) in enumerate(requests) if kind != "ok"]
            too_long = [i for i, p in enumerate(prompts) if len(p) >= llm.engine.max_seq_len]
            if bad or too_long:
                with pytest.raises(ValueError) as refused:
                    llm.generate(prompts, params)
                for i in sorted(set(bad + too_long)):
                    assert f"prompt {i}:" in str(refused.value)
                llm.cache_manager.check_integrity()
            good = [i for i in range(len(requests)) if i not in bad and i not in too_long]
            if good:
                results = llm.generate([prompts[i] for i in good], [params[i] for i in good])
                for i, result in zip(good, results):
                    expected, sure = greedy_reference(
                        step0_qwen3, prompts[i], params[i].max_tokens, llm.eos_token_id,
                        llm.engine.max_seq_len,
                    )  # fmt: skip
                    assert result["error"] is None, i
                    assert agrees(result["token_ids"], expected, sure), i
            llm.cache_manager.check_integrity()
            assert llm.table_manager.available_size == slots

    check()


def test_random_arrivals_and_aborts_on_tiny_pools(step0_qwen3) -> None:
    """Requests arrive at random steps and some are aborted at random steps, on a pool of 8 to
    64 pages with 1 to 3 slots, overlap on: a finished request has its greedy tokens, an
    aborted one a prefix of them (up to a near tie, see greedy_reference), nothing is reused
    while in flight (InFlightChecks), and at the end every page is free or cached and every
    slot is free."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    @settings(
        max_examples=6,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )
    @given(
        requests=st.lists(
            st.tuples(
                st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=20),
                st.integers(1, 8),  # max_tokens
                st.integers(0, 6),  # arrives at this step
                st.one_of(st.none(), st.integers(0, 10)),  # aborted at this step, or not
            ),
            min_size=1,
            max_size=5,
        ),
        pages=st.sampled_from([8, 16, 64]),
        slots=st.integers(1, 3),
    )
    def check(requests, pages: int, slots: int) -> None:
        class Driver(InFlightChecks, scripted.ScriptedScheduler):
            pass

        arrivals = []
        for uid, (prompt, n, at, abort_at) in enumerate(requests):
            arrivals.append((at, scripted.user_msg(uid, prompt, n)))
            if abort_at is not None:
                arrivals.append((at + abort_at, AbortBackendMsg(uid=uid)))
        config = scripted.make_config(
            "tiny-qwen3", max_running_req=slots, page_size=4, num_page_override=pages
        )
        sched = Driver(config, arrivals)
        try:
            sched.run()
            sched.cache_manager.check_integrity()
            assert sched.table_manager.available_size == slots
            max_seq_len, eos = sched.engine.max_seq_len, sched.eos_token_id
        finally:
            sched.shutdown()
        for uid, (prompt, n, _, abort_at) in enumerate(requests):
            ours = sched.outputs.get(uid, [])
            expected, sure = greedy_reference(step0_qwen3, prompt, n, eos, max_seq_len)
            if len(expected) < min(n, max_seq_len - len(prompt)):  # the scheduler sends the EOS
                sure += sure > len(expected)
                expected += [eos]
            assert agrees(ours, expected, sure, finished=abort_at is None), uid

    check()
