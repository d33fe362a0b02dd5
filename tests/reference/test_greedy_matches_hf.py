"""Greedy output of the default model, served by our processes, equals Hugging Face transformers (float32,
its own GGUF dequantisation) token for token: 6 prompts, 32 tokens each, plain and chat-templated, short and
~300 tokens; under each kernel set (the C kernels, tinygrad's own that GPUs run, and the C kernels with int8
activations, compared up to a near-tie: greedy_tokens_equal_up_to_a_near_tie). Where the reference's top two logits are within 1e-3 the argmax is rounding noise, so the
comparison stops there (and says so)."""
import pytest

from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.tokenizer import Tokenizer
from tinyvllm.protocol.sampling import SamplingParams
from tests.reference.hf_reference import reference_greedy

N_TOKENS = 32
TIE_GAP = 1e-3
INT8_TIE_GAP = 0.25  # int8 activations (the "c-int8" set) move logits by ~0.1: a gap this small is a near-tie for them
LONG_TEXT = ("The history of the bicycle begins in the early nineteenth century, when inventors across Europe "
             "experimented with two-wheeled machines pushed along by the rider's feet. ") * 9


def prompts(tok: Tokenizer) -> list[list[int]]:
    chat = lambda text: tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]), add_special_tokens=False)
    return [
        tok.encode("The capital of France is"),
        tok.encode("def fibonacci(n):"),
        chat("What is the capital of France?"),
        chat("Write a haiku about the sea."),
        tok.encode(LONG_TEXT + "In summary,"),
        chat(LONG_TEXT + "\nSummarise the text above in one sentence."),
    ]


@pytest.fixture(scope="module")
def prompts_and_reference(default_tokenizer):
    ids = prompts(default_tokenizer)
    assert any(len(p) < 16 for p in ids) and sum(250 <= len(p) <= 400 for p in ids) == 2
    return ids, reference_greedy(ids, n_tokens=N_TOKENS)


@pytest.fixture(scope="module", params=["c", "tinygrad", "c-int8"])
def ours_and_reference(prompts_and_reference, request):
    ids, reference = prompts_and_reference
    # (A budget that prefills all six prompts in one step captures two steps instead of four, 156 s instead of 182
    # alone; but beside another suite that one step's capture under the tinygrad set outlasted the 120 s step timeout.)
    with LLM(max_num_seqs=8, max_model_len=1024, num_kv_blocks=256, kernels=request.param) as llm:
        ours = llm.generate(ids, SamplingParams(temperature=0, max_tokens=N_TOKENS, ignore_eos=True))
    return ids, ours, reference


def test_greedy_tokens_equal_transformers(ours_and_reference, request):
    ids, ours, reference = ours_and_reference
    if request.node.callspec.params["ours_and_reference"] == "c-int8":
        return greedy_tokens_equal_up_to_a_near_tie(ids, ours, reference)
    compared = 0
    for i, (prompt, got, ref) in enumerate(zip(ids, ours, reference)):
        assert got.finish_reason == "length" and len(got.token_ids) == N_TOKENS
        ties = [t for t, gap in enumerate(ref["top2_gap"]) if gap < TIE_GAP]
        upto = ties[0] + 1 if ties else N_TOKENS  # the tied position itself may go either way
        if ties:
            print(f"prompt {i} ({len(prompt)} tokens): reference top-2 logits tie at step {ties[0]}, compared {ties[0]} tokens")
        assert got.token_ids[:upto - 1 if ties else upto] == ref["token_ids"][:upto - 1 if ties else upto], f"prompt {i}"
        compared += upto - 1 if ties else upto
    assert compared >= 5 * N_TOKENS  # the comparison must not be hollowed out by ties


def greedy_tokens_equal_up_to_a_near_tie(ids, ours, reference):
    """The "c-int8" set's tolerant comparison: equal tokens, or equal up to a first difference where the
    reference's top two logits are within INT8_TIE_GAP (its int8 activations are not exact, so a near-tie may go
    the other way; after it the texts diverge and are not compared)."""
    compared = 0
    for i, (prompt, got, ref) in enumerate(zip(ids, ours, reference)):
        assert got.finish_reason == "length" and len(got.token_ids) == N_TOKENS
        differ = next((t for t, (a, b) in enumerate(zip(got.token_ids, ref["token_ids"])) if a != b), N_TOKENS)
        if differ < N_TOKENS:
            gap = ref["top2_gap"][differ]
            print(f"prompt {i} ({len(prompt)} tokens): first difference at step {differ}, reference top-2 gap {gap:.4f}")
            assert gap < INT8_TIE_GAP, f"prompt {i}: differs at step {differ} where the reference is sure ({gap:.3f})"
        compared += differ
    # measured: the long prompts equal throughout, the short ones part at gaps of 0.07-0.22 (steps 5, 25, 0, 17)
    assert compared >= 3 * N_TOKENS
