"""benchmarks/greedy_tokens.py --compare: two devices' greedy tokens are equal up to the first near-tie of either."""
import importlib.util
import json
import pathlib

_spec = importlib.util.spec_from_file_location("greedy_tokens", pathlib.Path(__file__).parents[2] / "benchmarks" / "greedy_tokens.py")
greedy_tokens = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(greedy_tokens)
N = greedy_tokens.N_TOKENS


def write(path, device, prompts):
    path.write_text(json.dumps({"device": device, "prompts": prompts}))
    return str(path)


def test_equal_tokens_and_a_difference_after_a_near_tie_pass(tmp_path, capsys):
    wide = [1.0] * N
    tied = wide[:5] + [1e-4] + wide[6:]
    a = write(tmp_path / "a.json", "CPU", [{"token_ids": list(range(N)), "top2_gap": wide},
                                           {"token_ids": list(range(N)), "top2_gap": wide}])
    b = write(tmp_path / "b.json", "CUDA", [{"token_ids": list(range(N)), "top2_gap": wide},
                                            {"token_ids": list(range(5)) + [99] * (N - 5), "top2_gap": tied}])
    assert greedy_tokens.compare(a, b)
    assert "near-tie at 5" in capsys.readouterr().out


def test_a_difference_before_any_tie_fails(tmp_path):
    wide = [1.0] * N
    a = write(tmp_path / "a.json", "CPU", [{"token_ids": list(range(N)), "top2_gap": wide}])
    b = write(tmp_path / "b.json", "CUDA", [{"token_ids": [0, 1, 7] + list(range(3, N)), "top2_gap": wide}])
    assert not greedy_tokens.compare(a, b)
