"""One choice's text as its tokens arrive: incremental detokenizer, then stop strings, then how it ended.

With n > 1 every choice (RequestOutput.index) has its own, so a stop string ends only the choice it hit.
"""
from tinyvllm.frontend.api.stop_strings import StopStringMatcher
from tinyvllm.protocol.messages import FinishReason, RequestOutput


class ChoiceText:
    def __init__(self, index: int, detokenizer, stops: list[str], stop_token_ids: list[int],
                 include_stop_str_in_output: bool = False, min_tokens: int = 0):
        self.index = index
        self.detokenizer = detokenizer
        self.stops = StopStringMatcher(stops)
        self.stop_token_ids = stop_token_ids
        self.include_stop_str_in_output = include_stop_str_in_output
        self.min_tokens = min_tokens  # as vLLM: stop strings count only once more tokens than this were generated
        self.num_tokens = 0  # consumed; tokens after a stop string are never fed
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None  # the stop string or stop token id that ended it; None for EOS

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def feed(self, out: RequestOutput) -> str:
        """Takes one engine delta for this choice; returns the text safe to emit now (possibly "").

        Sets finish_reason (and stop_reason) when the engine finished the choice or a stop string matched."""
        self.num_tokens += len(out.new_token_ids)
        final = out.finish_reason is not None
        # A "stop" finish means the last token is EOS or a stop token id: it ends the text, never shows in it.
        shown = out.new_token_ids[:-1] if out.finish_reason == FinishReason.STOP else out.new_token_ids
        text = self.detokenizer.add(shown)
        if final:
            text += self.detokenizer.flush()
        text, matched = self.stops.feed(text, final, may_stop=self.num_tokens > self.min_tokens)
        if matched is not None:
            self.finish_reason, self.stop_reason = FinishReason.STOP, matched
            if self.include_stop_str_in_output:
                text += matched
        elif final:
            self.finish_reason = out.finish_reason
            if out.finish_reason == FinishReason.STOP and out.new_token_ids and \
                    out.new_token_ids[-1] in self.stop_token_ids:
                self.stop_reason = out.new_token_ids[-1]
        return text
