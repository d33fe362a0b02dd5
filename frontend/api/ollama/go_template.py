"""A small subset of Go's text/template, enough for Ollama prompt templates (TEMPLATE in a Modelfile).

Supported: {{ .Field }} / {{ $.Field }} / {{ $var.Field }}, {{ if }} / {{ else if }} / {{ else }} / {{ end }},
{{ range .Messages }} and {{ range $i, $m := .Messages }}, {{ $x := ... }}, the functions eq, ne, not, and,
or, len and slice, parentheses, string/number/bool literals, {{/* comments */}} and {{- -}} trimming.
Anything else raises TemplateError, so an unsupported template is refused instead of rendered wrongly.
"""
from __future__ import annotations

import json
import re
from typing import Any

_ACTION = re.compile(r"\{\{(-?)(.*?)(-?)\}\}", re.S)
_TOKEN = re.compile(r'\s*(\(|\)|:=|,|"(?:\\.|[^"\\])*"|`[^`]*`|[^\s(),]+)')


class TemplateError(ValueError):
    pass


def _lex(source: str) -> list[tuple[str, str]]:
    items, pos = [], 0
    for m in _ACTION.finditer(source):
        items.append(("text", source[pos:m.start()]))
        if m.group(1) and items[-1][1]:
            items[-1] = ("text", items[-1][1].rstrip())
        items.append(("action", m.group(2).strip()))
        pos = m.end()
        if m.group(3):
            rest = source[pos:]
            pos += len(rest) - len(rest.lstrip())
    items.append(("text", source[pos:]))
    return [i for i in items if i != ("text", "")]


def _parse(items: list, pos: int, stop: tuple[str, ...]) -> tuple[list, int, str]:
    """Nodes until an action starting with one of `stop`; returns (nodes, next position, the stopping action)."""
    nodes = []
    while pos < len(items):
        kind, value = items[pos]
        pos += 1
        if kind == "text" or value.startswith("/*"):
            nodes.append(("text", value if kind == "text" else ""))
            continue
        word = value.split(None, 1)[0] if value else ""
        if word in ("end", "else") and word in stop:
            return nodes, pos, value
        if word in ("end", "else"):
            raise TemplateError(f"unexpected {{{{ {value} }}}}")
        if word == "if":
            branches, else_body = [], []
            cond = value[2:].strip()
            while True:
                body, pos, ended = _parse(items, pos, ("end", "else"))
                branches.append((cond, body))
                if ended == "end":
                    break
                if ended.startswith("else if"):
                    cond = ended[len("else if"):].strip()
                    continue
                else_body, pos, _ = _parse(items, pos, ("end",))
                break
            nodes.append(("if", branches, else_body))
        elif word == "range":
            header = value[len("range"):].strip()
            variables, expr = [], header
            if ":=" in header:
                left, expr = header.split(":=", 1)
                variables = [v.strip() for v in left.split(",")]
            body, pos, ended = _parse(items, pos, ("end", "else"))
            else_body = []
            if ended != "end":
                else_body, pos, _ = _parse(items, pos, ("end",))
            nodes.append(("range", variables, expr.strip(), body, else_body))
        elif re.match(r"\$\w*\s*:?=", value):
            name, expr = value.split("=", 1)
            nodes.append(("set", name.rstrip(":").strip(), expr.strip()))
        else:
            nodes.append(("print", value))
    if stop:
        raise TemplateError(f"missing {{{{ end }}}} (template ended inside a block)")
    return nodes, pos, ""


def _truthy(v: Any) -> bool:
    return v not in (None, False, 0, "") and not (isinstance(v, (list, dict)) and not v)


class _Renderer:
    def __init__(self, data: dict):
        self.root = data

    def _field(self, base: Any, path: list[str]) -> Any:
        for name in path:
            base = base.get(name) if isinstance(base, dict) else None
        return base

    def _operand(self, tok: str, dot: Any, env: dict) -> Any:
        if tok.startswith('"'):
            return json.loads(tok)
        if tok.startswith("`"):
            return tok[1:-1]
        if tok in ("true", "false"):
            return tok == "true"
        if re.fullmatch(r"-?\d+", tok):
            return int(tok)
        if tok == ".":
            return dot
        if tok.startswith("."):
            return self._field(dot, tok[1:].split("."))
        if tok.startswith("$"):
            head, *path = tok.split(".")
            if head == "$":
                return self._field(self.root, path)
            if head not in env:
                raise TemplateError(f"undefined variable {head}")
            return self._field(env[head], path)
        raise TemplateError(f"unsupported template expression {tok!r}")

    def eval(self, expr: str, dot: Any, env: dict) -> Any:
        tokens = _TOKEN.findall(expr)
        value, rest = self._command(tokens, 0, dot, env)
        if rest != len(tokens):
            raise TemplateError(f"unsupported template expression {expr!r}")
        return value

    def _command(self, tokens: list[str], i: int, dot: Any, env: dict) -> tuple[Any, int]:
        args = []
        while i < len(tokens) and tokens[i] != ")":
            if tokens[i] == "(":
                value, i = self._command(tokens, i + 1, dot, env)
                if i >= len(tokens) or tokens[i] != ")":
                    raise TemplateError("unbalanced parentheses in template")
                args.append(("value", value))
            else:
                args.append(("token", tokens[i]))
            i += 1
        if not args:
            raise TemplateError("empty template expression")
        kind, head = args[0]
        if kind == "token" and head in _FUNCTIONS:
            values = [v if k == "value" else self._operand(v, dot, env) for k, v in args[1:]]
            return _FUNCTIONS[head](*values), i
        if len(args) != 1:
            raise TemplateError(f"unsupported template function {head!r}")
        return (head if kind == "value" else self._operand(head, dot, env)), i

    def render(self, nodes: list, dot: Any, env: dict, out: list[str]) -> None:
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "print":
                value = self.eval(node[1], dot, env)
                out.append("" if value is None else str(value).lower() if isinstance(value, bool) else str(value))
            elif kind == "set":
                env[node[1]] = self.eval(node[2], dot, env)
            elif kind == "if":
                for cond, body in node[1]:
                    if _truthy(self.eval(cond, dot, env)):
                        self.render(body, dot, env, out)
                        break
                else:
                    self.render(node[2], dot, env, out)
            elif kind == "range":
                _, variables, expr, body, else_body = node
                items = self.eval(expr, dot, env) or []
                if not isinstance(items, list):
                    raise TemplateError(f"cannot range over {expr}")
                for index, item in enumerate(items):
                    scope = dict(env)
                    if len(variables) == 2:
                        scope[variables[0]], scope[variables[1]] = index, item
                    elif variables:
                        scope[variables[0]] = item
                    self.render(body, item, scope, out)
                if not items:
                    self.render(else_body, dot, env, out)


def _slice(seq: Any, start: int = 0, end: int | None = None) -> Any:
    return seq[start:end] if isinstance(seq, (list, str)) else seq


_FUNCTIONS = {
    "eq": lambda a, *bs: any(a == b for b in bs), "ne": lambda a, b: a != b, "not": lambda a: not _truthy(a),
    "and": lambda *xs: next((x for x in xs if not _truthy(x)), xs[-1] if xs else None),
    "or": lambda *xs: next((x for x in xs if _truthy(x)), xs[-1] if xs else None),
    "len": lambda x: len(x) if x is not None else 0, "slice": _slice,
}


def compile_template(source: str) -> list:
    nodes, _, _ = _parse(_lex(source), 0, ())
    return nodes


def render(source: str, data: dict) -> str:
    """Renders `source` with `data` (the template's dot: System, Prompt, Response, Messages...)."""
    out: list[str] = []
    _Renderer(data).render(compile_template(source), data, {}, out)
    return "".join(out)


def validate(source: str) -> None:
    """TemplateError now, rather than at generation, for a template this subset cannot render."""
    render(source, {"System": "s", "Prompt": "p", "Response": "r", "Suffix": "",
                    "Messages": [{"Role": "system", "Content": "s"}, {"Role": "user", "Content": "u"}]})
