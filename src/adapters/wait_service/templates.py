"""Templates over an event's `tenant`, `run_id` and `stream_id`: where a workflow engine's
adapter sends it (DBOS's workflow id and topic, Restate's key)."""

from __future__ import annotations

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
    """`template` if it names only the event's tenant, run_id and stream_id; else ValueError."""
    try:
        template.format(**dict.fromkeys(TEMPLATE_FIELDS, "x"))
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(
            f"{name}={template!r} is not a template over {{tenant}}, {{run_id}} and "
            f"{{stream_id}} ({type(error).__name__}: {error})"
        ) from None
    return template
