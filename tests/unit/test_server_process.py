"""What a server process carries: only the modules it uses (each optional integration a library
would pull in when installed, as the test tools install them, costs megabytes in every server
process), and a garbage collector tuned not to pause the event loop for long."""

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


_COLLECTOR = """
import gc, json
from entrypoints.http.app import app_from_env
app_from_env()
print(json.dumps([gc.get_threshold(), gc.get_freeze_count()]))
"""


def test_the_server_factory_freezes_start_up_and_collects_young_objects_less_often(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _COLLECTOR],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC), "PATH": "", "DUCTOR_STREAMS_DATA_DIR": str(tmp_path)},
        timeout=60,
    ).stdout
    threshold, frozen = json.loads(out.splitlines()[-1])
    assert threshold == [50_000, 50, 100]
    assert frozen > 10_000  # modules, classes and the app, out of every collection
