"""LoRA adapters through the engine's processes (LLM, the exact "c" kernel set): greedy tokens and their logprobs
with each adapter equal transformers + peft's; one generate mixing the base model and two adapters gives each prompt
what it gets alone; an adapter's prompt never hits blocks cached by the base or another adapter; with one adapter
slot, requests of two adapters are served one adapter at a time; adapters that cannot be served are refused, and one
whose folder disappears after its check fails its own request, not the engine."""
import shutil

import numpy as np
import pytest

from tests.helpers.tiny_lora import greedy_reference, make_llama_with_adapters
from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.lora_adapter import LoRAError
from tinyvllm.protocol.sampling import LoRARequest, SamplingParams

ENGINE = dict(max_num_seqs=4, num_kv_blocks=64, max_num_batched_tokens=64, max_model_len=256, kernels="c",
              enable_lora=True, max_lora_rank=16, jit_warmup=False)
PROMPT = list(range(100, 140))  # 40 tokens: two full blocks of 16, and the prefix cache's unit
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_llama_with_adapters(tmp_path_factory.mktemp("lora"))


def test_adapters_equal_peft_mixed_or_alone_and_never_share_cached_blocks(models):
    base_folder, adapters, base = models
    requests = [None, *(LoRARequest(name, i + 1, str(folder))
                        for i, (name, (folder, _)) in enumerate(adapters.items()))]
    references = [greedy_reference(model, PROMPT, 6) for model in (base, *(tuned for _, tuned in adapters.values()))]
    with LLM(str(base_folder), max_loras=2, **ENGINE) as llm:
        alone = []
        for request in requests:  # the same prompt each time: a shared cache would hit from the second on
            hits = llm.stats.prefix_cache_hits
            alone.append(llm.generate([PROMPT], GREEDY, lora_request=request)[0])
            assert llm.stats.prefix_cache_hits == hits, f"{request} hit blocks another adapter cached"
        hits = llm.stats.prefix_cache_hits
        mixed = llm.generate([PROMPT] * 3, GREEDY, lora_request=requests)
        assert llm.stats.prefix_cache_hits - hits == 3 * 32  # each its own two full blocks, cached above
        for result, single, (tokens, logprobs) in zip(mixed, alone, references):
            assert result.token_ids == single.token_ids == tokens
            np.testing.assert_allclose([e.logprob for e in result.outputs[0].logprobs], logprobs, rtol=1e-4, atol=1e-4)
        assert len({tuple(r.token_ids) for r in mixed}) == 3  # the adapters change the answer


def test_one_slot_serves_two_adapters_in_turn_and_bad_adapters_are_refused(models, tmp_path):
    base_folder, adapters, _ = models
    requests = [LoRARequest(name, i + 1, str(folder)) for i, (name, (folder, _)) in enumerate(adapters.items())]
    with LLM(str(base_folder), max_loras=1, **ENGINE) as llm:
        both = llm.generate([PROMPT, PROMPT, PROMPT], GREEDY, lora_request=[*requests, requests[0]])
        alone = [llm.generate([PROMPT], GREEDY, lora_request=r)[0].token_ids for r in requests]
        assert [r.token_ids for r in both] == [*alone, alone[0]]
        with pytest.raises(LoRAError, match="no PEFT LoRA adapter"):
            llm.generate([PROMPT], GREEDY, lora_request=LoRARequest("missing", 9, str(tmp_path)))
        # an adapter whose folder goes away after its check fails its own request only, in the worker
        moved = shutil.copytree(adapters["small"][0], tmp_path / "moved")
        doomed = LoRARequest("doomed", 10, str(moved))
        llm.adapters.check(doomed)
        shutil.rmtree(moved)
        failed, = llm.generate([PROMPT], GREEDY, lora_request=doomed)
        assert failed.finish_reason == "error" and "no PEFT LoRA adapter" in failed.error
        assert llm.generate([PROMPT], GREEDY, lora_request=requests[1])[0].token_ids == alone[1]
    with LLM(str(base_folder), **{**ENGINE, "enable_lora": False}) as llm:
        with pytest.raises(LoRAError, match="--enable-lora"):
            llm.generate([PROMPT], GREEDY, lora_request=requests[0])
