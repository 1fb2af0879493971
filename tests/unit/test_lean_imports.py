"""The server process loads only what it uses: each optional integration a library would pull
in when installed (the test tools install them) costs megabytes in every server process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

_PROBE = """
import json, sys
from entrypoints.container import memory_container
from entrypoints.http.app import create_app
create_app(memory_container())
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})))
"""


def test_building_the_app_loads_no_optional_integration() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC), "PATH": ""},
        timeout=60,
    ).stdout
    loaded = set(json.loads(out.splitlines()[-1]))
    # pydantic/attrs: Litestar's and dependency-injector's plugins; polyfactory and faker:
    # OpenAPI example generation; werkzeug: brought by a test tool.
    assert loaded.isdisjoint({"pydantic", "attrs", "attr", "polyfactory", "faker", "werkzeug"}), (
        loaded & {"pydantic", "attrs", "attr", "polyfactory", "faker", "werkzeug"}
    )
