"""Write one CRD's ``openAPIV3Schema`` as a JSON fixture of this folder (see README.md).

    python tests/deploy/schemas/extract.py CRD.yaml VERSION OUT.json "SOURCE"

The schema of the CRD's version ``VERSION`` is kept as it is, except for two changes that do
not alter what it accepts: ``description`` keywords are dropped, and a subschema of 500 bytes
or more that occurs more than once (KServe repeats Kubernetes' container and pod types many
times) is stored once under ``$defs`` and referenced with ``$ref``. ``SOURCE`` becomes the
file's ``$comment``. Only schema positions are rewritten: a property *named* ``description``,
or a ``default`` value, stays as it is.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

Schema = dict[str, Any]
SCHEMA_MAPS = ("properties", "patternProperties", "$defs")  # name -> schema
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")  # [schema]
SCHEMA_ONE = ("additionalProperties", "items", "not")  # schema (or a boolean)
MIN_SHARED = 500


def map_subschemas(schema: Schema, visit: Callable[[Schema, str], Any]) -> Schema:
    """A copy of ``schema`` with ``visit(subschema, name)`` in place of each direct subschema
    (``name``: the property's name, or the keyword's)."""
    out: Schema = {}
    for key, value in schema.items():
        if key in SCHEMA_MAPS:
            out[key] = {name: visit(sub, name) for name, sub in value.items()}
        elif key in SCHEMA_LISTS:
            out[key] = [visit(sub, key) for sub in value]
        elif key in SCHEMA_ONE and isinstance(value, dict):
            out[key] = visit(value, key)
        else:
            out[key] = value
    return out


def without_descriptions(schema: Schema) -> Schema:
    kept = {k: v for k, v in schema.items() if k != "description"}
    return map_subschemas(kept, lambda sub, _: without_descriptions(sub))


def _text(schema: Schema) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def share_repeats(root: Schema) -> Schema:
    """Store each repeated large subschema once under ``$defs``, named after the first
    property (or keyword) it is found under."""
    counts: Counter[str] = Counter()

    def count(schema: Schema, _: str = "") -> Schema:
        text = _text(schema)
        counts[text] += 1
        if counts[text] == 1:  # what a repeat holds is counted once, in its first copy
            map_subschemas(schema, count)
        return schema

    count(root)
    defs: dict[str, Schema] = {}
    names: dict[str, str] = {}  # text -> name in $defs

    def share(schema: Schema, name: str) -> Schema:
        text = _text(schema)
        if counts[text] < 2 or len(text) < MIN_SHARED:
            return map_subschemas(schema, share)
        if text not in names:
            base = re.sub(r"[^A-Za-z0-9_-]", "_", name) or "schema"
            unique, n = base, 1
            while unique in defs:
                n += 1
                unique = f"{base}-{n}"
            names[text] = unique
            defs[unique] = {}  # reserve the name before the children take theirs
            defs[unique] = map_subschemas(schema, share)
        return {"$ref": f"#/$defs/{names[text]}"}

    out = map_subschemas(root, share)
    if defs:
        out["$defs"] = defs
    return out


def extract(crd_file: Path, version: str, source: str) -> Schema:
    with crd_file.open() as file:
        (crd,) = [doc for doc in yaml.safe_load_all(file) if doc is not None]
    assert crd["kind"] == "CustomResourceDefinition", crd["kind"]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert served["served"], f"{version} is not served"
    schema = share_repeats(without_descriptions(served["schema"]["openAPIV3Schema"]))
    return {"$comment": source, **schema}


def main() -> None:
    crd_file, version, out, source = sys.argv[1:]
    schema = extract(Path(crd_file), version, source)
    Path(out).write_text(json.dumps(schema, indent=1) + "\n")


if __name__ == "__main__":
    main()
