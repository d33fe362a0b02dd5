"""Engine defaults sized for many users: 64 sequences in a batch, a 512-token step (prompt chunks of several
requests and the decodes together), the same for `tinyvllm serve` and the offline LLM."""
from tinyvllm.frontend.cli.main import build_parser
from tinyvllm.protocol.engine_config import EngineConfig


def test_the_cli_and_the_engine_share_the_defaults():
    batch = EngineConfig.from_namespace(build_parser().parse_args(["serve"])).batch
    assert (batch.max_num_seqs, batch.max_num_batched_tokens) == (64, 512)
    assert (EngineConfig().batch.max_num_seqs, EngineConfig().batch.max_num_batched_tokens) == (64, 512)
    assert (EngineConfig.of().batch.max_num_seqs, EngineConfig.of().batch.max_num_batched_tokens) == (64, 512)


def test_swap_space_is_off_by_default_and_a_bare_number_is_gib_as_in_vllm():
    def swap_space(*flags):
        return EngineConfig.from_namespace(build_parser().parse_args(["serve", *flags])).cache.swap_space
    assert swap_space() == EngineConfig().cache.swap_space == 0
    assert swap_space("--swap-space", "4") == 4 << 30 and swap_space("--swap-space", "0.5") == 1 << 29
    assert swap_space("--swap-space", "512M") == 512 << 20
