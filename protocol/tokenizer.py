"""Text <-> token ids and chat templates, for a GGUF file or a Hugging Face model folder.

A GGUF carries no tokenizer.json, so for GGUF files the `tokenizers` pipeline is rebuilt from
llama.cpp's metadata: vocabulary + merges (BPE), the pre-tokenizer named by tokenizer.ggml.pre,
a byte-level decoder, and control tokens (token_type 3) registered as special tokens.
"""
from __future__ import annotations

import datetime
import json
import pathlib
import warnings

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _HFTokenizer

# llama.cpp token types
_CONTROL, _USER_DEFINED = 3, 4

# Pre-tokenizer split regexes, keyed by tokenizer.ggml.pre. "smollm" isolates every digit, then applies
# GPT-2's regex (which ByteLevel(use_regex=True) has built in).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
_SPLITS = {"smollm": r"\p{N}", "llama3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
           "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
_GPT2_LIKE = {"gpt2", "default", None}
_IGNORE_MERGES = {"llama3", "llama-bpe", "llama-v3"}  # whole-word vocab hits win over merges (as in HF)


def _gguf_pre_tokenizer(pre: str | None):
    if pre in _GPT2_LIKE:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre not in _SPLITS:
        warnings.warn(f"unknown GGUF pre-tokenizer {pre!r}; using GPT-2's, tokenization may differ slightly")
        return _gguf_pre_tokenizer("gpt2")
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _tokenizer_from_gguf_metadata(md: dict) -> _HFTokenizer:
    kind = md.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer type {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens, types = md["tokenizer.ggml.tokens"], md.get("tokenizer.ggml.token_type") or []
    pre = md.get("tokenizer.ggml.pre")
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                     merges=[tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])],
                     ignore_merges=pre in _IGNORE_MERGES)
    tok = _HFTokenizer(bpe)
    tok.pre_tokenizer = _gguf_pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == _USER_DEFINED])
    return tok


def _token_content(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _ids(value) -> list[int]:
    return [] if value is None else [int(v) for v in (value if isinstance(value, list) else [value])]


class Tokenizer:
    def __init__(self, tokenizer: _HFTokenizer, *, bos_token_id: int | None, eos_token_ids: list[int],
                 add_bos: bool, chat_template: str | None, bos_token: str | None = None,
                 eos_token: str | None = None):
        self.hf = tokenizer  # the Hugging Face `tokenizers` object (llguidance builds its own from it)
        self.bos_token_id = bos_token_id
        self.eos_token_ids = list(dict.fromkeys(eos_token_ids))
        self.add_bos = add_bos
        self.chat_template = chat_template
        self._compiled_template = None
        # the strings chat templates see as bos_token / eos_token
        self.bos_token = bos_token if bos_token is not None else self._token_text(bos_token_id)
        self.eos_token = eos_token if eos_token is not None else self._token_text(
            self.eos_token_ids[0] if self.eos_token_ids else None)
        if add_bos and bos_token_id is not None:
            bos = self.hf.id_to_token(bos_token_id)
            self.hf.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_token_id)])

    # ---- construction

    @classmethod
    def from_model_path(cls, path: str | pathlib.Path | None) -> "Tokenizer":
        """A .gguf file, a HF folder with tokenizer.json, or a model name understood by resolve_model_path."""
        if path is None or not pathlib.Path(path).exists():
            from tinyvllm.protocol.model_path import resolve_model_path
            path = resolve_model_path(None if path is None else str(path))
        path = pathlib.Path(path)
        if path.suffix == ".gguf":
            from tinyvllm.protocol.gguf_file import GGUFFile
            return cls.from_gguf_metadata(GGUFFile(path).metadata)
        return cls.from_hf_folder(path)

    @classmethod
    def from_gguf_metadata(cls, md: dict) -> "Tokenizer":
        eos = _ids(md.get("tokenizer.ggml.eos_token_id")) + _ids(md.get("tokenizer.ggml.eot_token_id"))
        return cls(_tokenizer_from_gguf_metadata(md), bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
                   eos_token_ids=eos, add_bos=bool(md.get("tokenizer.ggml.add_bos_token", False)),
                   chat_template=md.get("tokenizer.chat_template"))

    @classmethod
    def from_hf_folder(cls, folder: str | pathlib.Path) -> "Tokenizer":
        folder = pathlib.Path(folder)

        def read_json(name: str) -> dict:
            f = folder / name
            return json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}

        tok = _HFTokenizer.from_file(str(folder / "tokenizer.json"))
        cfg, gen = read_json("tokenizer_config.json"), read_json("generation_config.json")
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = {t["name"]: t["template"] for t in template}.get("default")
        if (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        bos_tok, eos_tok = _token_content(cfg.get("bos_token")), _token_content(cfg.get("eos_token"))
        bos_id = gen.get("bos_token_id", tok.token_to_id(bos_tok) if bos_tok else None)
        eos = _ids(gen.get("eos_token_id")) + _ids(tok.token_to_id(eos_tok) if eos_tok else None)
        # BOS, if the model wants one, is already added by tokenizer.json's post-processor
        return cls(tok, bos_token_id=bos_id, eos_token_ids=eos, add_bos=False, chat_template=template,
                   bos_token=bos_tok, eos_token=eos_tok)

    # ---- text <-> ids

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def special_token_ids(self) -> set[int]:
        """Control tokens (dropped by decode(skip_special_tokens=True)), BOS and EOS."""
        ids = {i for i, t in self.hf.get_added_tokens_decoder().items() if t.special}
        return ids | set(self.eos_token_ids) | ({self.bos_token_id} if self.bos_token_id is not None else set())

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    # ---- chat

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.hf.id_to_token(token_id) or "")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """Render `messages` with the model's template; ValueError (-> HTTP 400) when that fails."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; use the completions endpoint instead")
        try:
            if self._compiled_template is None:
                self._compiled_template = _jinja_env().from_string(self.chat_template)
            return self._compiled_template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)
        except Exception as e:  # a template can fail in arbitrary ways on arbitrary client input
            raise ValueError(f"chat template error: {e}") from e


class _TemplateRaisedError(Exception):
    pass


def _raise_exception(message: str):
    raise _TemplateRaisedError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _jinja_env() -> ImmutableSandboxedEnvironment:
    # trim_blocks/lstrip_blocks and these helpers are what HF chat templates are written against
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env
