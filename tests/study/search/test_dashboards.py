"""The printed way into Ray's dashboard: one link that sets the dashboard's token cookie and forwards to it.

Without Ray or a browser: the link's server is checked over HTTP, the printed line through ``start_ray``'s printer
with a stand-in Ray context. tests/browser/test_dashboards_check.py opens the link of a real Ray in Chromium.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from study.search import dashboards
from study.search.dashboards import TOKEN_COOKIE, RaySignIn, ray_dashboard_line

TOKEN = "0123abcd" * 8


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _get(url: str) -> tuple[int, dict[str, str]]:
    """Status and headers of a GET that follows no redirect."""
    try:
        with urllib.request.build_opener(_NoRedirect).open(url, timeout=10) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers)


@pytest.fixture
def no_link_left() -> Iterator[None]:
    """Stop the process's link after the test, as the end of a command does."""
    yield
    if dashboards._sign_in is not None:
        dashboards._sign_in.stop()
        dashboards._sign_in = None


def test_the_link_sets_the_dashboards_cookie_and_forwards_to_it() -> None:
    sign_in = RaySignIn("127.0.0.1:8265", TOKEN).start()
    try:
        assert sign_in.url is not None and sign_in.url.startswith("http://127.0.0.1:")
        status, headers = _get(sign_in.url)
        assert status == 303 and headers["Location"] == "http://127.0.0.1:8265/"
        # the name the dashboard reads, for every path of the host (cookies are per host, not per port), with the
        # attributes of the dashboard's own sign-in
        assert headers["Set-Cookie"] == (f"{TOKEN_COOKIE}={TOKEN}; Max-Age=2592000; Path=/; HttpOnly; "
                                         "SameSite=Strict")
        base = sign_in.url.rsplit("/", 1)[0]
        for other in (f"{base}/", f"{sign_in.url}x", f"{base}/{TOKEN}"):  # only the random key signs in
            status, headers = _get(other)
            assert status == 404 and "Set-Cookie" not in headers
    finally:
        sign_in.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(base, timeout=5)  # gone with the command


def test_no_link_for_a_dashboard_on_another_host() -> None:
    # a cookie set on this machine's loopback could not reach it
    assert RaySignIn("http://10.0.0.5:8265", TOKEN).start().url is None


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "no-token"])
def test_start_rays_dashboard_line_is_the_link_when_a_token_is_found(token: str | None, no_link_left: None,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from study.cluster import _print_dashboard

    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setattr(dashboards, "ray_auth_token", lambda: token)
    _print_dashboard(SimpleNamespace(dashboard_url="127.0.0.1:8265"), "local")
    line = capsys.readouterr().out.strip()
    if token is None:  # nothing to sign in with: the dialog and the token's command, as before
        assert line == ray_dashboard_line("127.0.0.1:8265", True) and "ray get-auth-token" in line
        return
    link = dashboards._sign_in.url
    assert line == f"Ray dashboard: {link} (opens http://127.0.0.1:8265, signed in with its token)"
    assert len(line) <= 120  # the console's width
    assert _get(link)[0] == 303


def test_a_new_link_replaces_the_last(no_link_left: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboards, "ray_auth_token", lambda: TOKEN)
    first = dashboards.ray_sign_in("127.0.0.1:8265")
    second = dashboards.ray_sign_in("127.0.0.1:8266")
    assert first and second and first != second
    assert _get(second)[1]["Location"] == "http://127.0.0.1:8266/"
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(first, timeout=5)


def test_without_token_authentication_the_line_is_the_url() -> None:
    assert ray_dashboard_line("127.0.0.1:8265", False, "http://127.0.0.1:1/key") == \
        "Ray dashboard: http://127.0.0.1:8265"


@pytest.mark.parametrize("token", [TOKEN, "with space", "semi;colon", 'quote"d', "", None],
                         ids=["hex", "space", "semicolon", "quote", "empty", "none"])
def test_the_token_is_rays_own_and_one_a_cookie_can_carry(token: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's token loader (what ``ray get-auth-token`` uses) gives the token; a hand-made ``RAY_AUTH_TOKEN`` that a
    cookie would cut short, or none at all, gives no link (the line falls back to the dialog's way)."""
    import ray._raylet

    class Loader:
        @staticmethod
        def instance() -> Loader:
            return Loader()

        def has_token(self, ignore_auth_mode: bool) -> bool:
            return token is not None

        def get_raw_token(self, ignore_auth_mode: bool) -> str | None:
            return token

    monkeypatch.setattr(ray._raylet, "AuthenticationTokenLoader", Loader)
    assert dashboards.ray_auth_token() == (TOKEN if token == TOKEN else None)
