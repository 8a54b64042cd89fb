"""Storage URLs, as search and analysis both read them: `env:NAME`, passwords that hold URL
delimiters, masking, and the PostgreSQL driver. Imports neither JAX nor anything of paxsearch."""
from __future__ import annotations

import os
import re
from urllib.parse import quote, unquote


class StorageUrlError(ValueError):
    """A storage URL that cannot be used (one line for the user; never holds a password)."""


ENV_PREFIX = "env:"  # --storage env:NAME: the URL (password included) is the value of $NAME


def resolve_url(spec: str) -> str:
    """The storage URL of a --storage value: `env:NAME` reads it from the environment variable
    NAME (so the password is not on the command line, nor in `ps`); anything else is the URL."""
    spec = str(spec)
    if not spec.startswith(ENV_PREFIX):
        return spec
    name = spec[len(ENV_PREFIX):]
    value = os.environ.get(name, "").strip()
    if not name or not value:
        raise StorageUrlError(f"--storage {spec}: the environment variable {name or '(none)'} is not set; "
                           f"export {name or 'NAME'}=postgresql://user:password@host/db")
    if value.startswith(ENV_PREFIX):
        raise StorageUrlError(f"--storage {spec}: ${name} names another variable; it must hold the URL itself")
    return value


URL_FIX = ("URL-encode the password (@ as %40, : as %3A, / as %2F), or leave it out of the URL and set "
           "PGPASSWORD (with the URL in a variable, pass --storage env:NAME)")
# What may follow the '@' that ends the user info: host (or [ipv6]), digits of a port, a database
# name without '@', '?' or '#', then the query string (which may hold anything).
_HOST_PART = re.compile(r"(?:\[[^\]/?#@]*\]|[^@:/?#\[\]]*)(?::\d*)?(?:/[^@?#]*)?(?:\?.*)?", re.S)


def parse_url(url: str):
    """SQLAlchemy's URL object of `url`. A password may hold URL delimiters (/ # ? @ :) unquoted:
    when SQLAlchemy's own parse splits it wrongly, the user info ends at the one '@' after which
    a host[:port][/database][?query] follows. A URL that cannot be read, or read only one of
    several ways, is a StorageUrlError whose text holds no part of the URL."""
    from sqlalchemy.engine import make_url

    m = re.match(r"^([A-Za-z][\w+.-]*)://(.*)$", url, re.S)
    parsed = _sqlalchemy_parse(make_url, url, sqlite=m is not None and m.group(1).startswith("sqlite"))
    if parsed is not None:
        return parsed
    if m is None or "@" not in m.group(2) or m.group(1).startswith("sqlite"):
        raise StorageUrlError(f"the storage URL{_scheme_of(url)} cannot be read; expected "
                              "sqlite:///PATH or postgresql://USER[:PASSWORD]@HOST[:PORT]/DB")
    scheme, rest = m.groups()
    splits = [i for i, c in enumerate(rest) if c == "@" and _HOST_PART.fullmatch(rest, i + 1)]
    if len(splits) != 1:
        raise StorageUrlError(f"the storage URL ({scheme}://...) cannot be read unambiguously: its password "
                              f"holds '@', ':' or '?'; {URL_FIX}")
    userinfo, hostpart = rest[:splits[0]], rest[splits[0] + 1:]
    user, _, password = userinfo.partition(":")
    base = _sqlalchemy_parse(make_url, f"{scheme}://{hostpart}")
    if base is None:
        raise StorageUrlError(f"the storage URL ({scheme}://...) cannot be read (its host, port or database); "
                              f"expected {scheme}://USER[:PASSWORD]@HOST[:PORT]/DB; {URL_FIX}")
    return base.set(username=unquote(user), password=unquote(password) or None)


def _sqlalchemy_parse(make_url, url: str, sqlite: bool = False):
    """make_url(url) when it parses and accounts for every '@' of the URL (a SQLite path may hold
    any); None otherwise (its exception text would repeat the URL, password included, so it is
    never shown)."""
    try:
        parsed = make_url(url)
        int(parsed.port or 0)
    except Exception:
        return None
    accounted = (parsed.username is not None) + sum(str(k).count("@") + str(v).count("@")
                                                    for k, v in parsed.query.items())
    return parsed if sqlite or url.count("@") <= accounted else None  # else an '@' of the password taken for the host's


def _scheme_of(url: str) -> str:
    m = re.match(r"^([A-Za-z][\w+.-]*)://", url)
    return f" ({m.group(1)}://...)" if m else ""


def mask_url(url: str | None) -> str | None:
    """The URL with its password (user info or password= parameter) replaced by ***: the one
    masking function of paxsearch (search and analysis)."""
    if url is None:
        return None
    url = str(url)
    if url.startswith(ENV_PREFIX):  # the name of a variable, never its value
        return url
    try:
        parsed = parse_url(url)
    except Exception:  # not a URL SQLAlchemy reads: hide everything between :// and the last @
        return re.sub(r"(://[^:/]*):.*@", r"\1:***@", url) if "@" in url else url
    # without a password in the user info, keep the user's spelling (and order of parameters)
    text = url if parsed.password is None else parsed.render_as_string(hide_password=True)
    return re.sub(r"(?i)([?&](?:password|passwd|pass)=)[^&]*", r"\1***", text)


def _password(url: str) -> str | None:
    try:
        parsed = parse_url(url)
    except Exception:
        return None
    return parsed.password or next((v for k, v in parsed.query.items()
                                    if k.lower() in ("password", "passwd", "pass") and isinstance(v, str)), None)


def _secrets(url: str) -> list[str]:
    """The password of `url`, whole and cut at URL delimiters (a message may hold a piece of it).
    Of a URL that cannot be parsed: everything that may be its password, between the first ':'
    of the user info and the last '@'."""
    password = _password(url)
    if password is None:
        m = re.match(r"^[A-Za-z][\w+.-]*://[^:/@]*:(.*)@", url, re.S)
        password = m.group(1) if m else None
    if not password:
        return []
    return [password, *(p for p in re.split(r"[@:/?#]", password) if len(p) >= 4 and p != password)]


def scrub(text: str, url: str | None) -> str:
    """`text` with the URL's password (and the URL itself) masked."""
    if not url:
        return text
    text = text.replace(url, str(mask_url(url)))
    try:
        url = resolve_url(url)
    except StorageUrlError:
        return text
    text = text.replace(url, str(mask_url(url)))
    for secret in _secrets(url):
        for form in sorted({secret, quote(secret, safe=""), quote(secret)}, key=len, reverse=True):
            text = text.replace(form, "***")
    return text


def sqlite_path(url: str) -> str | None:
    return url[len("sqlite:///"):] if url.startswith("sqlite:///") else None


def driver_url(url: str) -> str:
    """The URL SQLAlchemy should connect with (`env:NAME` resolved): a bare postgresql:// URL
    names the psycopg (v3) driver in SQLAlchemy 2.1; use psycopg2 (the postgres extra) when only
    it is installed. Search and analysis both connect through this function."""
    url = resolve_url(url)
    m = re.match(r"^(postgresql|postgres)(\+\w+)?://", url)
    if not m:
        return url
    parsed = parse_url(url)
    if not m.group(2):
        import importlib.util

        driver = ("postgresql+psycopg2" if importlib.util.find_spec("psycopg") is None
                  and importlib.util.find_spec("psycopg2") is not None else "postgresql")
        parsed = parsed.set(drivername=driver)
    return parsed.render_as_string(hide_password=False)
