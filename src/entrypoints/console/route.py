"""`GET /console` (the page) and `GET /console/{file}` (its script and style sheet)."""

from __future__ import annotations

from importlib import resources

from litestar import Response, get
from litestar.exceptions import NotFoundException
from litestar.params import FromPath

_STATIC = resources.files(__package__) / "static"
# Litestar adds "; charset=utf-8" to every text/ media type itself (given here, it went twice).
_MEDIA_TYPES = {
    "console.js": "text/javascript",
    "console.css": "text/css",
    "icon.svg": "image/svg+xml",  # (else the browser asks for /favicon.ico: a 404 logged)
}
# Only this origin: the page's own script and style, and fetches to the API beside it. Object
# bodies are downloaded by the script (with the token) and handed to the browser as a blob.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _file(name: str) -> bytes:
    return (_STATIC / name).read_bytes()


@get("/console", include_in_schema=False, sync_to_thread=False)
def console_page() -> Response[bytes]:
    return Response(_file("index.html"), media_type="text/html", headers=HEADERS)


@get("/console/{name:str}", include_in_schema=False, sync_to_thread=False)
def console_file(name: FromPath[str]) -> Response[bytes]:
    media_type = _MEDIA_TYPES.get(name)
    if media_type is None:
        raise NotFoundException(f"the console has no file {name!r}")
    return Response(_file(name), media_type=media_type, headers=HEADERS)


ROUTES = [console_page, console_file]
