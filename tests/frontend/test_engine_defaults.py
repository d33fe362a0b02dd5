"""Engine defaults sized for many users: 64 sequences in a batch, a 512-token step (prompt chunks of several
requests and the decodes together), the same for `tinyvllm serve` and the offline LLM."""
from tinyvllm.frontend.cli import build_parser, engine_args_from
from tinyvllm.frontend.launcher import EngineArgs


def test_the_cli_and_the_engine_share_the_defaults():
    args = engine_args_from(build_parser().parse_args(["serve"]))
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (64, 512)
    assert (EngineArgs().max_num_seqs, EngineArgs().max_num_batched_tokens) == (64, 512)


def test_swap_space_is_off_by_default_and_a_bare_number_is_gib_as_in_vllm():
    def swap_space(*flags):
        return engine_args_from(build_parser().parse_args(["serve", *flags])).swap_space
    assert swap_space() == EngineArgs().swap_space == 0
    assert swap_space("--swap-space", "4") == 4 << 30 and swap_space("--swap-space", "0.5") == 1 << 29
    assert swap_space("--swap-space", "512M") == 512 << 20
