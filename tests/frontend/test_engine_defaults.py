"""Engine defaults sized for many users: 64 sequences in a batch, a 512-token step (prompt chunks of several
requests and the decodes together), the same for `tinyvllm serve` and the offline LLM."""
from tinyvllm.frontend.cli import build_parser, engine_args_from
from tinyvllm.frontend.launcher import EngineArgs


def test_the_cli_and_the_engine_share_the_defaults():
    args = engine_args_from(build_parser().parse_args(["serve"]))
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (64, 512)
    assert (EngineArgs().max_num_seqs, EngineArgs().max_num_batched_tokens) == (64, 512)
