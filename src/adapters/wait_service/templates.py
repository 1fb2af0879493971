"""Templates over an event's `tenant`, `run_id` and `stream_id`: where a workflow engine's
adapter sends it (DBOS's workflow id and topic, Restate's key)."""

from __future__ import annotations

import string

import msgspec

TEMPLATE_FIELDS = ("tenant", "run_id", "stream_id")


class Names(msgspec.Struct):
    """What a template may name, read from the event."""

    tenant: str
    run_id: str
    stream_id: str

    def fill(self, template: str) -> str:
        return template.format(tenant=self.tenant, run_id=self.run_id, stream_id=self.stream_id)


names_of = msgspec.json.Decoder(Names).decode


def check_template(name: str, template: str) -> str:
    """`template` if it names only the event's tenant, run_id and stream_id, each as it is
    (no attribute, index, conversion or format: `{tenant.__class__}` is refused); else
    ValueError."""
    try:
        parts = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template)]
    except ValueError as error:  # (an unmatched brace)
        parts = [(str(error), "", None)]
    for field, spec, conversion in parts:
        if field is not None and (field not in TEMPLATE_FIELDS or spec or conversion):
            raise ValueError(
                f"{name}={template!r}: a template names only {{tenant}}, {{run_id}} and "
                f"{{stream_id}}, as they are (not {field!r})"
            )
    return template
