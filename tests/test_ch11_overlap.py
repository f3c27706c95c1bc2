"""Chapter 11: overlap scheduling, LLM.generate, and the four fixes.

Each fix has a check that holds for our scheduler and a second test that puts upstream's
logic back (the class UpstreamLogic below: upstream's result processing and abort handling,
paraphrased) and asserts that the same check catches it. So each check is shown to fail on
the behaviour it guards against.
"""

from __future__ import annotations

from typing import Dict, List, Set

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
from tools.parity import build_prompts


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
class RecordingLLM(LLM):
    """Records every message sent out, and checks that no request slot or KV page is handed
    out while a launched, unprocessed batch still uses it."""

    check_reuse = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.messages: List[DetokenizeMsg] = []
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
            for r in self.launched:  # every page the in-flight batch reads or writes
                in_use |= set(self.engine.page_table[r.table_idx, : r.device_len].tolist())
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
    model = load_example("examples/ch00_step0.py").Step0Model(model_path(name))
    assert outputs[0] == [model.generate(p, sp.max_tokens) for p, sp in zip(PROMPTS, params)]


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
        prompts = build_prompts("smollm2-135m")
        results = llm.generate(prompts, SamplingParams(max_tokens=40))
    finally:
        llm.shutdown()
    first = results[0]["token_ids"]  # "The capital of France is" ends with <|im_end|> (EOS)
    reference = (
        load_example("examples/ch00_step0.py")
        .Step0Model(ensure_model("smollm2-135m"))
        .generate(prompts[0], 40)
    )
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
        SamplingParams(temperature=1.5, top_k=3, max_tokens=12),
        SamplingParams(temperature=1.0, top_k=1, max_tokens=12),  # top-k 1: greedy
        SamplingParams(temperature=1.0, top_p=0.6, max_tokens=12),
        SamplingParams(max_tokens=12),
    ]
    runs = []
    for _ in range(2):
        llm = make(LLM, "smollm2-135m")
        try:
            runs.append([r["token_ids"] for r in llm.generate(PROMPTS[:4], params)])
        finally:
            llm.shutdown()
    assert runs[0] == runs[1]  # a fresh engine seeds its sampler the same way
    greedy = load_example("examples/ch00_step0.py").Step0Model(ensure_model("smollm2-135m"))
    expected = [greedy.generate(p, 12) for p in PROMPTS[:4]]
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
        with pytest.raises(ValueError, match="prompt 1 has 40 tokens; this engine takes 1 to 31"):
            llm.generate([[1, 2, 3], list(range(3, 43))], SamplingParams(max_tokens=4))
        results = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=100))  # capped, not refused
        assert len(results[0]["token_ids"]) == 32 - 3
        llm.cache_manager.check_integrity()
    finally:
        llm.shutdown()
