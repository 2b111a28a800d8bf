"""Request bodies checked against the published OpenAPI document, so that it says exactly what is accepted.

Each service's hand-written checks (``jobs/spec.py``, ``sweeps/spec.py``, the registry's) come first:
they name a mistake the way a user thinks of it ("give exactly one of 'command' or 'script'"). This
check then refuses whatever those let through but the document does not allow (a string where a
number belongs, a null, an unknown field, a value past its bound), so the document and the server
cannot drift apart. The fuzzer in ``tests/contract`` checks both directions: what the document
allows is accepted, what it does not is refused.
"""

from __future__ import annotations

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import best_match

from trainhub.exceptions import InvalidRequest
from trainhub.fmt import clip


class BodySchemas:
    """Validators for the request-body schemas of one OpenAPI 3.1 document (``components/schemas``)."""

    def __init__(self, doc: dict):
        self.components = doc.get("components", {})
        self._validators: dict[str, Draft202012Validator] = {}

    def validator(self, name: str) -> Draft202012Validator:
        if name not in self._validators:
            if name not in self.components.get("schemas", {}):
                raise KeyError(f"the OpenAPI document has no schema {name!r}")
            schema = {"$ref": f"#/components/schemas/{name}", "components": self.components}
            self._validators[name] = Draft202012Validator(schema, format_checker=FormatChecker())
        return self._validators[name]

    def check(self, body, name: str) -> None:
        """400 naming the first field the document refuses (and where to read the rule)."""
        error = best_match(self.validator(name).iter_errors(body))
        if error is None:
            return
        where = "/".join(str(p) for p in error.absolute_path)
        field = f"'{where}'" if where else "the request body"
        raise InvalidRequest(f"{field}: {clip(error.message, 300)} (schema {name} in GET openapi.json)")
