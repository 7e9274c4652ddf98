"""How much schema one request may ask the server to enforce, checked before anything expensive.

Validating a schema (jsonschema) and compiling it (xgrammar) cost far more than reading it: a
1.7 MB schema of 20,000 ``$defs`` took 13 s to validate, and xgrammar's time grows steeply with
optional properties (tiny-gqa's vocabulary: one object of 1,000 optional properties 5.6 s; 16
objects of 256 each 15.4 s, 8 of them 2.5 s). :class:`SchemaBudget` counts, without recursion,
what every schema of one constraint adds up to (``response_format`` plus each tool's
``parameters`` when calls are forced or strict), and refuses past the limits with a 400
``schema_too_complex`` naming the schema that went over. The limits stay far above real tool and
output schemas; within them the slowest shape measured (15 objects of 128 optional properties)
compiles in 1.0 s on tiny-gqa (SmolLM2 compiles faster: 8 objects of 256 in 1.4 s against 2.5 s);
``--compile-timeout`` bounds anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from leyline_server.api.errors import APIError

__all__ = ["SchemaBudget", "MAX_SCHEMA_VALUES", "MAX_SCHEMA_PROPERTIES", "MAX_OPTIONAL_PROPERTIES"]

MAX_SCHEMA_VALUES = 20_000  # JSON values (objects, arrays, scalars) in all of a request's schemas
MAX_SCHEMA_PROPERTIES = 2_000  # declared properties in all of them
MAX_OPTIONAL_PROPERTIES = 128  # properties of one object that are not required


@dataclass
class SchemaBudget:
    """What a request's schemas have used so far; :meth:`charge` each one before validating it."""

    values: int = 0
    properties: int = 0

    def charge(self, schema: object, param: str) -> None:
        """Count ``schema`` (400 ``schema_too_complex`` naming ``param`` past a limit)."""
        stack = [schema]
        while stack:
            item = stack.pop()
            self.values += 1
            if isinstance(item, Mapping):
                self._object(item, param)
                stack.extend(item.values())
            elif isinstance(item, list | tuple):
                stack.extend(item)
            if self.values > MAX_SCHEMA_VALUES:
                raise _too_complex(f"more than {MAX_SCHEMA_VALUES} JSON values in the request's schemas", param)

    def _object(self, item: Mapping[object, object], param: str) -> None:
        props = item.get("properties")
        if not isinstance(props, Mapping):
            return
        self.properties += len(props)
        if self.properties > MAX_SCHEMA_PROPERTIES:
            raise _too_complex(f"more than {MAX_SCHEMA_PROPERTIES} properties in the request's schemas", param)
        required = item.get("required")
        named = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        optional = sum(1 for name in props if name not in named)
        if optional > MAX_OPTIONAL_PROPERTIES:
            raise _too_complex(
                f"an object with {optional} optional properties (at most {MAX_OPTIONAL_PROPERTIES}; "
                "list the others in 'required' or split the object)",
                param,
            )


def _too_complex(message: str, param: str) -> APIError:
    return APIError(400, "schema_too_complex", message, param)
