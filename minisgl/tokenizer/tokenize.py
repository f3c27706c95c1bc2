"""Text to token ids, for the scheduler."""

from __future__ import annotations

from typing import List

import torch
from transformers import PreTrainedTokenizerBase

from minisgl.message import TokenizeMsg


class TokenizeManager:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def tokenize_one(self, msg: TokenizeMsg) -> torch.Tensor:
        """A prompt's ids as a 1-D int32 CPU tensor. Chat messages go through the model's chat
        template first; its text already holds the special tokens, so none are added again."""
        if isinstance(msg.text, list):
            text = self.tokenizer.apply_chat_template(
                msg.text, tokenize=False, add_generation_prompt=True
            )
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(msg.text)
        return torch.tensor(ids, dtype=torch.int32)

    def tokenize(self, msgs: List[TokenizeMsg]) -> List[torch.Tensor]:
        return [self.tokenize_one(msg) for msg in msgs]
