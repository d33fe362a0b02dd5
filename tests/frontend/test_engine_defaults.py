"""Engine defaults sized for many users: a step's token budget follows the device (tinygrad's DEV)."""
import pytest

from tinyvllm.frontend.launcher import EngineArgs, default_token_budget


@pytest.mark.parametrize("dev,budget", [("CPU", 512), ("", 512), ("CPU:LLVM", 512), ("CUDA", 2048), ("CUDA:1", 2048),
                                        ("AMD", 2048), ("METAL", 2048)])
def test_token_budget_follows_the_device(dev, budget):
    assert default_token_budget(dev) == budget


def test_validate_fills_in_the_default_budget_and_keeps_a_given_one(monkeypatch):
    monkeypatch.setenv("DEV", "CUDA")
    args = EngineArgs()
    args.validate()
    assert args.max_num_batched_tokens == 2048 and args.max_num_seqs == 64
    given = EngineArgs(max_num_batched_tokens=96)
    given.validate()
    assert given.max_num_batched_tokens == 96
