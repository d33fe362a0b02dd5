"""The Ollama layer's parsers: model names, Modelfiles, options, and the Go-template subset."""
import pytest

from tinyvllm.frontend.api.ollama import go_template, modelfile, names
from tinyvllm.frontend.api.ollama.options import OptionError, check_options, generation_settings


def test_names():
    assert names.full_name("llama3") == "llama3:latest" and names.full_name("ns/m:7b") == "ns/m:7b"
    assert names.full_name("host:5000/ns/m") == "host:5000/ns/m:latest"
    assert names.key("Llama3") == names.key("llama3:latest") and names.short_name("x:latest") == "x"
    assert names.is_valid("ns/model:tag-1.0") and not names.is_valid("bad name") and not names.is_valid(":tag")


def test_modelfile_commands_quotes_and_comments():
    mf = modelfile.parse('# a comment\nFROM ./model.gguf\nparameter temperature 0.5\nPARAMETER stop "<|end|>"\n'
                         'PARAMETER stop "\\"q\\""\nPARAMETER num_predict 12\nTEMPLATE """{{ .Prompt }}\n"""\n'
                         'SYSTEM plain words here\nLICENSE """MIT"""\n')
    assert mf.from_ == "./model.gguf" and mf.system == "plain words here" and mf.license == "MIT"
    assert mf.template == "{{ .Prompt }}\n"
    assert mf.parameters == {"temperature": 0.5, "stop": ["<|end|>", '"q"'], "num_predict": 12}


@pytest.mark.parametrize("text,fragment", [
    ("FROM x\nBOGUS 1", "unknown Modelfile command"), ('SYSTEM """never closed', "unterminated"),
    ("PARAMETER top_k many", "integer"), ("PARAMETER", "needs a name"), ("MESSAGE user hi", "MESSAGE"),
    ('SYSTEM "a" trailing', "unexpected text"),
])
def test_modelfile_errors(text, fragment):
    with pytest.raises(modelfile.ModelfileError, match=fragment):
        modelfile.parse(text)


def test_modelfile_render_round_trips():
    text = modelfile.render("m:latest", "/w.gguf", "{{ .Prompt }}", "sys", {"top_k": 5, "stop": ["a", "b"]}, None)
    mf = modelfile.parse(text)
    assert (mf.from_, mf.template, mf.system, mf.parameters) == ("/w.gguf", "{{ .Prompt }}", "sys",
                                                                  {"top_k": 5, "stop": ["a", "b"]})


def test_options_types_and_ignored_keys():
    assert check_options({"num_ctx": 8.0, "stop": "x", "whatever": 1, "seed": None}) == {"num_ctx": 8, "stop": ["x"]}
    for bad in ({"top_k": 1.5}, {"temperature": True}, {"stop": [1]}, {"use_mmap": 1}):
        with pytest.raises(OptionError):
            check_options(bad)
    s = generation_settings({"temperature": 0.1, "stop": ["a"]}, {"stop": ["b"], "num_predict": 5})
    assert (s.sampling.temperature, s.stop, s.max_tokens, s.sampling.max_tokens) == (0.1, ["b"], 5, 5)


GO_CHATML = ("{{- range $i, $m := .Messages }}{{- $last := eq (len (slice $.Messages $i)) 1 -}}\n"
             "<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
             "{{ if and $last (ne .Role \"assistant\") }}<|im_start|>assistant\n{{ end }}{{- end }}")


def test_go_template_subset():
    data = {"Messages": [{"Role": "user", "Content": "hi"}]}
    assert go_template.render(GO_CHATML, data) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    t = "{{ if .System }}[{{ .System }}]{{ else if .Prompt }}no system{{ else }}nothing{{ end }}{{/* note */}}"
    assert [go_template.render(t, d) for d in ({"System": "s"}, {"Prompt": "p"}, {})] == ["[s]", "no system", "nothing"]
    assert go_template.render("a  {{- .X -}}  b", {"X": 1}) == "a1b"
    assert go_template.render("{{ range .L }}{{ . }},{{ else }}empty{{ end }}", {"L": []}) == "empty"
    for bad in ("{{ if .X }}open", "{{ end }}", "{{ printf \"%s\" .X }}", "{{ $nope }}"):
        with pytest.raises(go_template.TemplateError):
            go_template.validate(bad)
