"""Ollama's keep_alive as Ollama reads it: numbers are seconds, strings Go durations or numbers, negative forever."""
import math

import pytest

from tinyvllm.frontend.api.ollama.keep_alive import FOREVER, KeepAliveInvalid, is_unload, keep_alive_seconds
from tinyvllm.frontend.api.server_options import ServerArgs


@pytest.mark.parametrize("value, seconds", [
    (0, 0.0), ("0", 0.0), ("0s", 0.0), (300, 300.0), ("300", 300.0), (2.5, 2.5), ("5m", 300.0), ("1h30m", 5400.0),
    ("10s", 10.0), ("250ms", 0.25), ("1.5h", 5400.0), (" 2m ", 120.0), (-1, FOREVER), ("-1", FOREVER),
    ("-1m", FOREVER), (10 ** 400, FOREVER), (-(10 ** 400), FOREVER), ("99999999999h", FOREVER)])
def test_values_as_ollama_reads_them(value, seconds):
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["5x", "", "m", "5m3", "1d", "nan", float("nan"), True, "five minutes"])
def test_anything_else_is_refused(value):
    with pytest.raises(KeepAliveInvalid):
        keep_alive_seconds(value)


def test_only_zero_unloads():
    assert is_unload(0) and is_unload("0s") and is_unload("0m") and is_unload(0.0)
    assert not is_unload(None) and not is_unload("5m") and not is_unload(-1) and not is_unload("bad")


def test_the_server_default_comes_from_the_flag_then_the_environment_then_five_minutes():
    assert ServerArgs(keep_alive="1h").keep_alive_s({"OLLAMA_KEEP_ALIVE": "10s"}) == 3600
    assert ServerArgs().keep_alive_s({"OLLAMA_KEEP_ALIVE": "10s"}) == 10
    assert ServerArgs().keep_alive_s({}) == 300
    assert math.isinf(ServerArgs(keep_alive="-1").keep_alive_s({}))
    with pytest.raises(ValueError, match="--keep-alive"):
        ServerArgs(keep_alive="soon").validate()
    with pytest.raises(ValueError, match="OLLAMA_KEEP_ALIVE"):
        ServerArgs().keep_alive_s({"OLLAMA_KEEP_ALIVE": "soon"})
    with pytest.raises(ValueError, match="--max-loaded-models"):
        ServerArgs(max_loaded_models=-1).validate()
