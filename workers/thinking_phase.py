"""Where a reasoning model's reply is, thinking or answering, followed on the sampling worker token by token
(protocol/sampling.py's ThinkingParams say which tokens open and close the thinking), for two things:

- a grammar (structured output, a forced tool call) constrains the answer only: while the reply may still open its
  thinking, the opening tag is allowed beside the grammar's tokens; while it thinks, nothing is masked; the grammar's
  matcher consumes the tokens from the answer's first on (workers/sampling_masks.py);
- a thinking budget: once the thinking holds `budget` tokens, the reply may take only the closing tag.

A reply that never opens its thinking (Qwen3 with enable_thinking false: the prompt holds an empty, closed block) is
all answer from its first token.
"""
from dataclasses import dataclass

from tinyvllm.protocol.sampling import ThinkingParams


@dataclass(slots=True)
class ThinkingPhase:
    params: ThinkingParams
    phase: str  # "start" (the reply may open its thinking), "thinking", "answer"
    num_seen: int = 0  # output tokens looked at
    num_thinking: int = 0  # tokens after the opening tag
    answer_start: int = 0  # the answer's first output token, once the phase is "answer"

    @classmethod
    def of(cls, params: ThinkingParams) -> "ThinkingPhase":
        return cls(params, "thinking" if params.opened else "start")

    def advance(self, output: list[int]) -> None:
        """Looks at the output tokens it has not seen (the reply's tokens so far, in order)."""
        for token in output[self.num_seen:]:
            self.num_seen += 1
            if self.phase == "start":
                self.phase = "thinking" if token == self.params.start_id else "answer"
            elif self.phase == "thinking":
                if token == self.params.end_id:
                    self.phase, self.answer_start = "answer", self.num_seen
                else:
                    self.num_thinking += 1

    def forced(self) -> int | None:
        """The only token the reply may take next: the closing tag once the budget is spent."""
        budget = self.params.budget
        if self.phase != "thinking" or budget is None or self.num_thinking < budget:
            return None
        return self.params.end_id
