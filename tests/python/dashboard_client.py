"""A client of the dashboard's JSON API (urllib, with a cookie jar for its login)."""

from __future__ import annotations

import http.cookiejar
import json
import urllib.error
import urllib.request

from helpers import HOST


class DashboardApi:
    def __init__(self, server):
        self.base = f"http://{HOST}:{server.http_port}"
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def call(self, path: str, body: dict | None = None, *, header: bool = True,
             timeout: float = 10.0) -> tuple[int, dict]:
        """GET `path`, or POST `body` as JSON (with the header changing requests need unless
        `header` is false). Returns the status and the JSON answer."""
        data = None
        headers = {}
        if body is not None:
            data = json.dumps(body).encode()
            headers["content-type"] = "application/json"
            if header:
                headers["x-mqkv-dashboard"] = "1"
        req = urllib.request.Request(self.base + path, data=data, headers=headers)
        try:
            with self.opener.open(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def login(self, user: str, password: str) -> int:
        return self.call("/api/login", {"username": user, "password": password})[0]

    def keys(self, pattern: str = "*", **params) -> dict:
        query = urllib.parse.urlencode({"pattern": pattern, **params})
        status, body = self.call(f"/api/keys?{query}")
        assert status == 200, body
        return body
