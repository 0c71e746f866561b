"""The token-probability viewer (serve_app/ui), served by the ingress at /ui.

The page is three static files read once from the package. It calls the public API with the
caller's key, like any client, so it needs nothing of the ingress but these files. Every file
goes out with a strict Content-Security-Policy: scripts and styles from this origin only (no
inline ones), requests to this origin only, no frames.
"""

from importlib import resources

from fastapi.responses import Response

from serve_app.errors import APIError

MEDIA_TYPES = {"index.html": "text/html; charset=utf-8",
               "viewer.js": "text/javascript; charset=utf-8",
               "viewer.css": "text/css; charset=utf-8",
               "favicon.svg": "image/svg+xml"}
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                           "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY,
           "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer",
           # The files change with the package: a browser asks again, an ETag is not worth it.
           "Cache-Control": "no-cache"}


class ViewerFiles:
    """The page's files when the viewer is on (ingress.ui); 404 `not_found` otherwise."""

    def __init__(self, enabled: bool):
        folder = resources.files("serve_app.ui")
        self.files = {name: folder.joinpath(name).read_bytes() for name in MEDIA_TYPES} if enabled else {}

    def response(self, name: str) -> Response:
        if name not in self.files:
            raise APIError(404, "not_found", self.missing(name))
        return Response(self.files[name], media_type=MEDIA_TYPES[name], headers=HEADERS)

    def check_enabled(self) -> None:
        if not self.files:
            raise APIError(404, "not_found", self.missing(""))

    def missing(self, name: str) -> str:
        if not self.files:
            return "the viewer is switched off on this service (ingress.ui: false)"
        return f"/ui/{name} does not exist; the viewer is at /ui/"
