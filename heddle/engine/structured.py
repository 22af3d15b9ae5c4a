"""Structured generation: asking a model for typed outputs and reading them back.

An LlmNode or an Agent whose outputs are anything but one string asks the model for them, as the
Agent Spec reference says, and exposes each separately. The answer is a JSON value:

* several outputs: an object with one key per output;
* a single `object` output: the object itself;
* a single output of another type: `{"name": value}` (the bare value is accepted too).

Endpoints that take OpenAI's `response_format` get the JSON Schema there; the others get it in an
instruction. An answer that does not parse or does not fit the declared types is sent back once
with what is wrong; a second miss fails the node, naming the output and its type.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from heddle.errors import RunError
from heddle.safeparse import loads_strict_json

Property = dict[str, Any]

# The llm config types whose endpoints take `response_format: {type: json_schema}`: OpenAI,
# OpenAI-compatible servers, vLLM (guided decoding) and Ollama (since 0.5). A type not listed
# here is given the schema in an instruction instead. Gemini's OpenAI-compatible endpoint takes it too.
RESPONSE_FORMAT_CONFIGS = frozenset({"OpenAiConfig", "OpenAiCompatibleConfig", "VllmConfig", "OllamaConfig",
                                     "GeminiConfig"})

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*)\n```$", re.DOTALL)
_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]+")


class AnswerMismatch(ValueError):
    """The model's answer does not give the declared outputs; `str()` says what is wrong."""


def _is_plain_text(prop: Property) -> bool:
    composite = ("anyOf", "oneOf", "allOf", "enum", "const", "$ref")
    return prop.get("type", "string") == "string" and not any(key in prop for key in composite)


def is_structured(outputs: list[Property]) -> bool:
    """Several outputs, or one that is not a plain string: the model is asked for JSON."""
    return len(outputs) > 1 or (len(outputs) == 1 and not _is_plain_text(outputs[0]))


def _schema(prop: Property) -> Property:
    return {key: value for key, value in prop.items() if key != "title"}


def type_name(prop: Property) -> str:
    kind = prop.get("type")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if isinstance(kind, str):
        if kind == "array" and isinstance(prop.get("items"), dict) and "type" in prop["items"]:
            return f"array of {type_name(prop['items'])}"
        return kind
    for key in ("anyOf", "oneOf"):
        if isinstance(prop.get(key), list):
            return " or ".join(type_name(p) if isinstance(p, dict) else "?" for p in prop[key])
    return "any JSON value"


@dataclass(frozen=True)
class Shape:
    """The declared outputs as one JSON answer."""

    outputs: tuple[Property, ...]
    optional: frozenset[str]  # outputs the answer may leave out (a default, or the agent's `result`)

    @property
    def whole_object(self) -> str | None:
        """The title of the one `object` output whose value is the whole answer, if that is the shape."""
        if len(self.outputs) == 1 and self.outputs[0].get("type") == "object":
            return str(self.outputs[0]["title"])
        return None

    def schema(self) -> Property:
        """The JSON Schema of the whole answer."""
        whole = self.whole_object
        if whole is not None:
            return _schema(self.outputs[0])
        required = [p["title"] for p in self.outputs if p["title"] not in self.optional and "default" not in p]
        schema: Property = {"type": "object", "properties": {p["title"]: _schema(p) for p in self.outputs}}
        if required:
            schema["required"] = required
        return schema

    def response_format(self, name: str) -> dict[str, Any]:
        safe = _SCHEMA_NAME.sub("_", name).strip("_")[:64] or "outputs"
        return {"type": "json_schema", "json_schema": {"name": safe, "schema": self.schema()}}

    def instruction(self) -> str:
        schema = json.dumps(self.schema(), ensure_ascii=False, separators=(",", ":"))
        return ("Answer with a single JSON value and nothing else (no prose, no code fence). "
                f"It must match this JSON Schema: {schema}")

    def read(self, text: str) -> dict[str, Any]:
        """The outputs the answer gives, each checked against its declared type (defaults filled in)."""
        try:
            value = loads_strict_json(unfenced(text))
        except (TypeError, ValueError) as exc:
            raise AnswerMismatch(f"the answer is not JSON ({exc})") from None
        whole = self.whole_object
        if whole is not None:
            given = {whole: value}
        elif isinstance(value, dict):
            given = value
        elif len(self.outputs) == 1:
            given = {self.outputs[0]["title"]: value}
        else:
            raise AnswerMismatch(f"the answer must be a JSON object with the keys "
                                 f"{', '.join(p['title'] for p in self.outputs)}, not {_json_type(value)}")
        values = dict(given)
        for prop in self.outputs:
            title = prop["title"]
            if title not in given:
                if "default" in prop:
                    values[title] = copy.deepcopy(prop["default"])
                    continue
                if title in self.optional:
                    continue
                raise AnswerMismatch(f"the answer has no value for output {title!r} ({type_name(prop)})")
            values[title] = _checked(prop, given[title])
        return values


def shape(outputs: list[Property], *, optional: frozenset[str] = frozenset()) -> Shape:
    return Shape(tuple(outputs), optional)


def unfenced(text: str) -> str:
    """The answer without a Markdown code fence around it, if it has one."""
    stripped = text.strip()
    match = _FENCE.match(stripped)
    return match.group(1) if match else stripped


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "an object"


def _checked(prop: Property, value: Any) -> Any:
    import jsonschema

    schema = _schema(prop)
    if isinstance(value, float) and value.is_integer() and _wants_integer(schema):
        value = int(value)  # `5.0` is an integer to JSON Schema; the output holds it as one
    try:
        validator = jsonschema.Draft202012Validator(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.UnknownType) as exc:
        first = str(exc).splitlines()[0]
        raise RunError(f"output {prop['title']!r} declares a schema that cannot be checked ({first}); "
                       "fix the document") from None
    if error is not None:
        where = "".join(f"[{p!r}]" for p in error.absolute_path)
        raise AnswerMismatch(f"output {prop['title']!r}{where} must be {type_name(prop)}: {error.message}")
    return value


def _wants_integer(schema: Property) -> bool:
    kind = schema.get("type")
    return kind == "integer" or (isinstance(kind, list) and "integer" in kind and "number" not in kind)


def retry_message(problem: AnswerMismatch) -> str:
    return (f"Your answer does not fit the required format: {problem}. "
            "Answer again with only the JSON value.")


def failure(label: str, answer_shape: Shape, problem: AnswerMismatch) -> RunError:
    declared = ", ".join(f"{p['title']} ({type_name(p)})" for p in answer_shape.outputs)
    return RunError(f"{label}: the model's answer does not fit its declared outputs ({declared}), even when "
                    f"asked again: {problem}")
