"""A schema-checking client's view of an event stream: does this event conform to what /openapi.json declares?

The document types each event of a `text/event-stream` answer with an OpenAPI 3.2 `itemSchema`; each kind's
`data` is JSON whose schema is the `contentSchema` of its branch. JSON Schema validators treat `contentSchema`
as an annotation, so the data is checked against it here explicitly.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from shared import sse


def _validator(schema: dict[str, Any], doc: dict[str, Any]) -> jsonschema.Draft202012Validator:
    # the schema's "#/components/..." references resolve against a root that carries the document's components
    return jsonschema.Draft202012Validator({**schema, "components": doc["components"]})


def assert_conforms(doc: dict[str, Any], path: str, ev: sse.Event) -> None:
    """`ev`, read from GET `path`, is an event the document allows, and its data has its kind's schema."""
    media = doc["paths"][path]["get"]["responses"]["200"]["content"][sse.MEDIA_TYPE]
    item = {"event": ev.event, "data": ev.data, **({"id": ev.id} if ev.id is not None else {})}
    _validator(media["itemSchema"], doc).validate(item)
    branch = next(b for b in media["itemSchema"]["oneOf"] if b["properties"]["event"]["const"] == ev.event)
    _validator(branch["properties"]["data"]["contentSchema"], doc).validate(json.loads(ev.data))
