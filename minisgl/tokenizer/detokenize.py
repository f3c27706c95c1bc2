"""Token ids back to text, one token at a time, for streaming.

Decoding a single token alone is wrong in two ways. A character may span tokens: an emoji is
four bytes in UTF-8, and a byte-level tokenizer may split them over two tokens, each of
which decodes to the replacement character U+FFFD. And some tokenizers decide spacing from the
neighbours of a token. So each request keeps its ids and two offsets into them: the text is
decoded over a window that starts a little before the new tokens (`surr_offset`, the
surrounding context), and the new text is what the window decodes to beyond its first part.
A piece that ends in U+FFFD is an unfinished character: it is held back until the next token
completes it (or, at the very end, sent as it is).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

from transformers import PreTrainedTokenizerBase

from minisgl.message import DetokenizeMsg

REPLACEMENT_CHAR = "\ufffd"


@dataclass
class DecodeStatus:
    decoded_ids: List[int] = field(default_factory=list)
    decoded_str: str = ""  # the text of decoded_ids[:read_offset], settled
    read_offset: int = 0  # ids up to here are settled into decoded_str
    surr_offset: int = 0  # where the decoding window starts: context for the next ids
    sent_offset: int = 0  # characters of text already sent out


class DetokenizeManager:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.decode_map: Dict[int, DecodeStatus] = {}
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id

    def detokenize(self, msgs: List[DetokenizeMsg]) -> List[str]:
        """The new text of each message's request (maybe empty), in order. Two tokens of one
        request in the same call (the worker took two of the scheduler's steps at once) are
        handled one after the other, in rounds where each request appears once."""
        pieces = [""] * len(msgs)
        waiting = list(range(len(msgs)))
        while waiting:
            in_round: List[int] = []
            later: List[int] = []
            uids = set()
            for i in waiting:
                (later if msgs[i].uid in uids else in_round).append(i)
                uids.add(msgs[i].uid)
            for i, piece in zip(in_round, self._detokenize_round([msgs[i] for i in in_round])):
                pieces[i] = piece
            waiting = later
        return pieces

    def _detokenize_round(self, msgs: List[DetokenizeMsg]) -> List[str]:
        windows: List[List[int]] = []
        contexts: List[List[int]] = []
        for msg in msgs:
            s = self.decode_map.setdefault(msg.uid, DecodeStatus())
            keep = msg.next_token >= 0 and not (
                msg.finished and msg.next_token == self.eos_token_id
            )
            if keep:  # a refused request has no token; a final EOS is not text
                s.decoded_ids.append(msg.next_token)
            windows.append(s.decoded_ids[s.surr_offset :])
            contexts.append(s.decoded_ids[s.surr_offset : s.read_offset])
        # one call for the whole batch: the Rust tokenizer decodes the lists in a loop of its own
        window_texts = self.tokenizer.batch_decode(windows)
        context_texts = self.tokenizer.batch_decode(contexts)

        pieces: List[str] = []
        for msg, window_text, context_text in zip(msgs, window_texts, context_texts):
            s = self.decode_map[msg.uid]
            new_text = window_text[len(context_text) :]
            if new_text and not new_text.endswith(REPLACEMENT_CHAR):
                s.decoded_str += new_text  # settled: the window moves on
                s.surr_offset, s.read_offset = s.read_offset, len(s.decoded_ids)
                text = s.decoded_str
            elif msg.finished:
                text = s.decoded_str + new_text  # the end: send even a broken character
            else:
                text = s.decoded_str + new_text.rstrip(REPLACEMENT_CHAR)
            pieces.append(text[s.sent_offset :])
            s.sent_offset = len(text)
            if msg.finished:
                del self.decode_map[msg.uid]
        return pieces

    def abort(self, uid: int) -> None:
        """Forget an aborted request: the scheduler sends nothing more for it."""
        self.decode_map.pop(uid, None)
