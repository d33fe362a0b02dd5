"""Options declared once, as dataclass fields: `knob(default, help, ...)` holds what a command line needs, and
`add_flags` / `options_from` / `build` make the flags, read them back, and build the (nested) dataclass from flat
keywords. The engine's configuration (protocol/engine_config.py) and the HTTP server's options
(frontend/api/server_options.py) are declared this way."""
import argparse
import dataclasses
import json
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """'1073741824', '512M', '512MiB', '2G', '1.5GB' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 512M, 2GiB, 1073741824)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_gib(text: str) -> int:
    """--swap-space: a bare number is GiB, as vLLM's flag ('4', '0.5'); with a unit, as parse_bytes ('512M')."""
    return parse_bytes(text + "G" if re.fullmatch(r"\s*[0-9]*\.?[0-9]+\s*", text) else text)


def parse_json_object(text: str | dict, flag: str, known: Iterable[str]) -> dict:
    """A flag's JSON object (vLLM's --speculative-config, --kv-events-config), or the dict itself, as a new dict:
    ValueError if it is not JSON, not an object, or names a field not in `known`."""
    try:
        fields = dict(text) if isinstance(text, dict) else json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} is not JSON: {e}") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{flag} must be a JSON object")
    if unknown := set(fields) - set(known):
        raise ValueError(f"{flag}: unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    return fields


def knob(default, help: str, *, flag: str | None = None, aliases: tuple[str, ...] = (), parse=None, flag_type=None,
         choices=None, metavar: str | None = None, action: str | None = None, group: str | None = None,
         exclusive: str | None = None, cli_default=dataclasses.MISSING, secret: bool = False,
         keywords: tuple[str, ...] = (), nargs: str | None = None, default_factory=None):
    """A field that is an option. flag: its command-line name (default: --the-field-name; "" for none); aliases:
    more names on the command line; parse: turns text (a flag's, or a keyword given as text) into the field's value;
    flag_type: the flag's argparse type where it differs (None keeps the text for parse); action: "store_true",
    "store_false" (flag is then the negation, e.g. --no-prefix-caching) or "optional" (--x / --no-x); group: the
    help's section; exclusive: flags in one mutually exclusive group; cli_default: where the command line's default
    differs from the library's (a callable is called when the parser is built); secret: never shown nor sent to
    another process; keywords: other names a keyword argument may use; nargs: argparse's ("+" for a list)."""
    meta = dict(help=help, flag=flag, aliases=aliases, parse=parse, flag_type=flag_type, choices=choices,
                metavar=metavar, action=action, group=group, exclusive=exclusive, cli_default=cli_default,
                secret=secret, keywords=keywords, nargs=nargs)
    if default_factory is not None:
        return field(default_factory=default_factory, repr=not secret, metadata={"knob": meta})
    return field(default=default, repr=not secret, metadata={"knob": meta})


@dataclass(frozen=True, slots=True)
class Knob:
    """One declared option: where it lives in its tree and how the command line spells it."""
    part: str  # the field of the root dataclass holding it ("" for a field of the root itself)
    name: str
    default: object
    annotation: object
    meta: dict

    @property
    def flag(self) -> str:
        return self.meta["flag"] if self.meta["flag"] is not None else "--" + self.name.replace("_", "-")

    @property
    def secret(self) -> bool:
        return self.meta["secret"]

    def get(self, root):
        return getattr(getattr(root, self.part) if self.part else root, self.name)

    def coerce(self, value):
        """A keyword's value as the field holds it: text (or a JSON object's dict) goes through the parser."""
        parse = self.meta["parse"]
        return parse(value) if parse is not None and isinstance(value, (str, dict)) else value


def knobs_of(root) -> dict[str, "Knob"]:
    """{name: Knob} of a dataclass's knobs and those of its parts (fields whose type is a dataclass of knobs), in
    the order they are declared."""
    hints, found = typing.get_type_hints(root), []
    for f in dataclasses.fields(root):
        if "knob" in f.metadata:
            found.append(_knob(f, "", hints[f.name]))
        elif dataclasses.is_dataclass(part := hints[f.name]):
            part_hints = typing.get_type_hints(part)
            found += [_knob(g, f.name, part_hints[g.name]) for g in dataclasses.fields(part) if "knob" in g.metadata]
    return {k.name: k for k in found}


def _knob(f: dataclasses.Field, part: str, annotation) -> "Knob":
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return Knob(part, f.name, default, annotation, f.metadata["knob"])


def build(root, knobs: dict[str, Knob], keywords: dict):
    """root(...) from flat keywords (any knob by name, or one of its keyword aliases); TypeError for an unknown
    one."""
    aliases = {alias: k.name for k in knobs.values() for alias in k.meta["keywords"]}
    parts: dict[str, dict] = {}
    for name, value in keywords.items():
        knob_ = knobs.get(name) or knobs.get(aliases.get(name, ""))
        if knob_ is None:
            raise TypeError(f"unknown option {name!r}; known: {', '.join(knobs)}")
        try:
            parts.setdefault(knob_.part, {})[knob_.name] = knob_.coerce(value)
        except ValueError as e:  # named by its flag, unless the message does (a parse shared by several flags)
            raise ValueError(str(e) if knob_.flag and knob_.flag in str(e) else f"{knob_.flag or name}: {e}") from None
    top = parts.pop("", {})
    hints = typing.get_type_hints(root)
    return root(**{part: hints[part](**values) for part, values in parts.items()}, **top)


def options_from(root, knobs: dict[str, Knob], args: argparse.Namespace):
    """root(...) from parsed flags; knobs the command has no flag for keep their defaults, and so do secrets left
    unset (None: for the environment to fill in)."""
    return build(root, knobs, {k.name: getattr(args, k.name) for k in knobs.values()
                               if hasattr(args, k.name) and not (k.secret and getattr(args, k.name) is None)})


def add_flags(parser: argparse.ArgumentParser, knobs: dict[str, Knob], only: Iterable[str] | None = None,
              exclude: Iterable[str] = (), helps: dict[str, str] | None = None) -> None:
    """The knobs' flags on `parser` (all of them, or those named in `only`, less those in `exclude`), with the
    declared help unless `helps` gives a command's own."""
    groups: dict[str, argparse._ActionsContainer] = {}
    only, exclude = (None if only is None else set(only)), set(exclude)
    for k in knobs.values():
        if not k.flag or (only is not None and k.name not in only) or k.name in exclude:
            continue
        m = k.meta
        container = parser
        if m["group"]:
            if m["group"] not in groups:
                groups[m["group"]] = parser.add_argument_group(m["group"])
            container = groups[m["group"]]
        if m["exclusive"]:
            if m["exclusive"] not in groups:
                groups[m["exclusive"]] = container.add_mutually_exclusive_group()
            container = groups[m["exclusive"]]
        default = k.default if m["cli_default"] is dataclasses.MISSING else m["cli_default"]
        kwargs = dict(dest=k.name, default=default() if callable(default) else default,
                      help=(helps or {}).get(k.name, m["help"]))
        if m["action"] == "optional":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif m["action"]:
            kwargs["action"] = m["action"]
        else:
            kwargs.update(type=m["flag_type"] or m["parse"] or _scalar_type(k.annotation), choices=m["choices"],
                          metavar=m["metavar"], nargs=m["nargs"])
        container.add_argument(k.flag, *m["aliases"], **kwargs)


def _scalar_type(annotation):
    inner = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return inner[0] if len(inner) == 1 and inner[0] in (int, float) else None
