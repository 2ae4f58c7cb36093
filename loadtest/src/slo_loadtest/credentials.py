"""Credentials in URLs, and keeping every credential out of what slo-loadtest writes.

A target or Pushgateway URL may carry ``user:password@`` (a server behind a proxy with HTTP Basic
authentication). Such a URL is split here: the requests send the credentials as an
``Authorization: Basic ...`` header (what curl and httpx make of the same URL), and everything
else — the scenario handed to guidellm, guidellm's own report and log, ``summary.json``,
``results.csv``, ``report.md``, the log lines and error messages — only ever sees the URL without
them. The API key (``--api-key``) never leaves the process environment either (see
``guidellm_adapter.step_env``).
"""

from __future__ import annotations

import base64
import re
from urllib.parse import unquote, urlsplit, urlunsplit

# scheme://userinfo@ inside any text: an error message, a guidellm error string
_USERINFO_IN_TEXT = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@'\"<>]*@")
REDACTED = "***"


def has_userinfo(text: str) -> bool:
    """Whether ``text`` (a URL, or an argument such as ``--pushgateway=URL``) holds a URL with
    ``user:password@``."""
    if _USERINFO_IN_TEXT.search(text or ""):
        return True
    try:
        return "@" in urlsplit(text or "").netloc
    except ValueError:
        return False


def split_userinfo(url: str) -> tuple[str, str]:
    """(the URL without ``user:password@``, the ``Authorization`` header value its credentials
    make: ``Basic base64(user:password)``, percent-decoded as httpx and curl decode them; ``""``
    where the URL has none)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, ""
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return urlunsplit(parts._replace(netloc=hostport)), f"Basic {token}"


def redact_url(url: str) -> str:
    """The URL as outputs show it: no ``user:password@``, no query (it may carry a token)."""
    if not url:
        return url
    bare = "://" not in url  # a Pushgateway given as host:port (push() adds http://)
    try:
        parts = urlsplit("http://" + url if bare else url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        # unparsable (a bad port): drop what may be secret, keep the rest for the message
        return scrub(url).replace(f"{REDACTED}@", "").split("?", 1)[0]
    if ":" in host:  # IPv6
        host = f"[{host}]"
    netloc = host + (f":{port}" if port is not None else "")
    out = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return out.removeprefix("http://") if bare else out


def scrub(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``
    (``http://user:pw@host`` -> ``http://***@host``): for messages that quote a URL."""
    return _USERINFO_IN_TEXT.sub(lambda m: m.group(1) + REDACTED + "@", text)
