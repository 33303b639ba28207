"""Tool responses as token ids, cut from the chat template once (token in, token out).

In a multi-turn rollout the next turn's input is the exact ids the model produced followed
by the tool responses' ids; the model's own text is never decoded and encoded again (that
is where other trainers drift: the re-encoded text is not what the model sampled). What
follows an assistant turn is whatever the chat template writes after the assistant's
content: the end of the assistant message, the tool messages and the next assistant
header. `ToolResponseFormat` renders the template once per number of tool messages with
placeholder contents, cuts the text at the placeholders, and encodes each fixed piece once;
a response is then ``piece_0 + content_1 + piece_1 + ... + content_k + piece_k`` with each
content encoded on its own (and cut to a token budget). For a ChatML template (Qwen)::

    <assistant's tokens, ending with <|im_end|>>  "\\n<|im_start|>tool\\n" content "<|im_end|>\\n<|im_start|>assistant\\n"

When the model's turn ended with the EOS token (``<|im_end|>``, the stop token of chat
models), the template's own copy of it is left out of ``piece_0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_USER = "USERPLACEHOLDER"
_ASSISTANT = "ASSISTANTPLACEHOLDER"
_TOOL = "TOOLPLACEHOLDER{}X"


@dataclass
class ToolResponseFormat:
    tokenizer: Any
    role: str = "tool"
    """The role of tool messages in the template (``rollout.multi_turn.tool_role``)."""
    _pieces: dict[tuple[int, bool], list[list[int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.eos_token_id = self.tokenizer.eos_token_id
        self.pieces(1, after_eos=True)  # fail at start-up on a template that cannot take tool messages

    def encode(self, contents: list[list[int]], after_eos: bool) -> list[int]:
        """The ids that follow an assistant turn and answer it with ``contents`` (each the
        ids of one tool response's content), ending with the next assistant header.
        ``after_eos``: the turn's last token was the EOS token."""
        pieces = self.pieces(len(contents), after_eos)
        out = list(pieces[0])
        for content, piece in zip(contents, pieces[1:], strict=True):
            out += content
            out += piece
        return out

    def content_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def pieces(self, num_responses: int, after_eos: bool) -> list[list[int]]:
        """``num_responses + 1`` id lists around the contents (cached)."""
        key = (num_responses, after_eos)
        if key not in self._pieces:
            texts = self._text_pieces(num_responses)
            if after_eos:
                texts[0] = self._drop_eos(texts[0])
            self._pieces[key] = [self.content_ids(t) for t in texts]
        return self._pieces[key]

    def _text_pieces(self, num_responses: int) -> list[str]:
        tools = [{"role": self.role, "content": _TOOL.format(i)} for i in range(num_responses)]
        messages = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}, *tools]
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as err:  # noqa: BLE001  (jinja errors of any kind)
            raise ValueError(f"the tokenizer's chat template cannot render tool messages of role {self.role!r} "
                             f"({type(err).__name__}: {err}); set rollout.multi_turn.tool_role to the role it "
                             "uses for tool responses") from None
        after = text.split(_ASSISTANT, 1)
        if len(after) != 2:
            raise ValueError("the tokenizer's chat template does not write the assistant's content verbatim; "
                             "multi-turn rollouts cannot cut tool responses out of it")
        rest, pieces = after[1], []
        for i in range(num_responses):
            head, sep, rest = rest.partition(_TOOL.format(i))
            if not sep:
                raise ValueError(f"the tokenizer's chat template drops or rewrites tool messages of role "
                                 f"{self.role!r}; set rollout.multi_turn.tool_role to the role it uses")
            pieces.append(head)
        return [*pieces, rest]

    def _drop_eos(self, text: str) -> str:
        eos = self.tokenizer.eos_token or ""
        if not eos or not text.startswith(eos):
            raise ValueError(f"the chat template does not end an assistant message with the EOS token {eos!r} "
                             f"(it writes {text[:40]!r}): a turn that stopped at EOS cannot be continued token "
                             "for token; use a tokenizer whose eos_token ends assistant messages (e.g. <|im_end|>)")
        return text[len(eos):]
