"""OpenAI's OpenAPI document (tests/data/openai-openapi, pinned, MIT) as JSON Schema validators.

Read as JSON Schema 2020-12, with two allowances its README explains: OpenAPI 3.0's leftover
`nullable: true` becomes a union with null, and an optional property may be null (OpenAI's own API
sends explicit nulls for some). Extra properties are allowed, as the document allows them; missing
required ones and wrong types fail.
"""

import copy
import gzip
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

SPEC = Path(__file__).parent / "data" / "openai-openapi" / "openapi.yaml.gz"


def _nullable(schema: Any) -> Any:
    """The allowances above, applied to every schema in the document (in place)."""
    if isinstance(schema, list):
        for item in schema:
            _nullable(item)
        return schema
    if not isinstance(schema, dict):
        return schema
    for value in schema.values():
        _nullable(value)
    properties = schema.get("properties")
    if isinstance(properties, dict):
        required = set(schema.get("required", ()))
        for name, prop in properties.items():
            if name not in required or (isinstance(prop, dict) and prop.get("nullable")):
                properties[name] = {"anyOf": [prop, {"type": "null"}]}
    return schema


@cache
def _document() -> dict[str, Any]:
    with gzip.open(SPEC) as f:
        document = yaml.load(f, Loader=yaml.CSafeLoader)
    return _nullable(copy.deepcopy(document))


@cache
def validator(name: str) -> Draft202012Validator:
    """A validator of `#/components/schemas/<name>`, refs resolved within the document."""
    document = _document()
    assert name in document["components"]["schemas"], name
    return Draft202012Validator({**document, "$ref": f"#/components/schemas/{name}"})


def problems(name: str, instance: Any) -> list[str]:
    """What in `instance` breaks the schema `name` (empty: it conforms)."""
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator(name).iter_errors(instance)
    ]
