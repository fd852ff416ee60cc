"""JAAS configuration strings as Kafka 3.7 reads them (``JaasConfig``, ``JaasContext.loadServerContext``).

A broker's SASL settings live in ``server.properties`` as one JAAS string per listener and mechanism::

    listener.name.sasl_plaintext.plain.sasl.jaas.config=\\
        org.apache.kafka.common.security.plain.PlainLoginModule required \\
        username="admin" password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";

``parse_jaas_config`` tokenizes such a string exactly as Kafka does: Kafka feeds it to
``java.io.StreamTokenizer`` with ``//`` and ``/* */`` comments on and ``-``, ``_`` and ``$`` added to the
word characters, so

- a value is a word (letters, digits, ``.``, ``-``, ``_``, ``$`` and any character from U+00A0 up, not
  starting with a digit, ``.`` or ``-``) or a quoted string (``"..."`` or ``'...'``, backslash escapes
  ``\\n \\t \\r \\b \\f \\a \\v``, octal ``\\0``-``\\377``, any other escaped character stands for itself; a quote
  left open ends at the end of the line, as StreamTokenizer ends it);
- an unquoted number (``iterations=4096``) is a number token, which has no string value: Kafka refuses it
  ("Value not specified for key 'iterations' in JAAS config"), so numbers must be quoted;
- an unquoted ``/`` starts a comment up to the end of the line (a URL must be quoted);
- each login module is ``<class> <flag> [key=value ...];`` with the flag one of required, requisite,
  sufficient, optional (any case); a later duplicate key wins.

Malformed input raises ``JaasConfigError`` (a ``ValueError``) with Kafka's message.

``server_jaas_entry`` is ``JaasContext.loadServerContext``: the broker looks only at
``listener.name.<listener, lower case>.<mechanism, lower case>.sasl.jaas.config`` (an unprefixed
``sasl.jaas.config`` is ignored with Kafka's warning), and that string must hold exactly one login module.
When it is absent Kafka falls back to the static JAAS file named by the JVM system property
``java.security.auth.login.config`` (context ``<listener>.KafkaServer`` or ``KafkaServer``); pykbroker has no
JVM and reads no static JAAS file, so it answers with Kafka's own error for a missing context instead.

``listener_mechanism_config`` is the lookup order Kafka's OAuth callback handlers use for their settings
(``sasl.oauthbearer.*``): ``listener.name.<l>.<mech>.<key>``, then ``listener.name.<l>.<key>``, then
``<key>``. (``sasl.server.callback.handler.class`` is read only as ``listener.name.<l>.<mech>.<key>``.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from pykbroker.config import listener_prefix

log = logging.getLogger(__name__)

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"

CONTROL_FLAGS = ("required", "requisite", "sufficient", "optional")

SASL_JAAS_CONFIG = "sasl.jaas.config"
JAVA_LOGIN_CONFIG_PARAM = "java.security.auth.login.config"
# JaasUtils.DISALLOWED_LOGIN_MODULES_DEFAULT (the system property org.apache.kafka.disallowed.login.modules)
DISALLOWED_LOGIN_MODULES = frozenset({"com.sun.security.auth.module.JndiLoginModule"})


class JaasConfigError(ValueError):
    """A JAAS string Kafka would refuse (Kafka: IllegalArgumentException), with Kafka's message."""


@dataclass(frozen=True)
class LoginModuleEntry:
    """One ``<class> <flag> options;`` of a JAAS string (javax.security.auth.login.AppConfigurationEntry).
    Options often hold passwords: ``repr`` shows their names only."""

    login_module: str
    control_flag: str  # lower case: one of CONTROL_FLAGS
    options: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"LoginModuleEntry({self.login_module!r}, {self.control_flag!r}, "
                f"options={sorted(self.options)!r})")


# --- java.io.StreamTokenizer, configured as JaasConfig configures it ------------------------------------

_EOF = "EOF"
_WORD = "WORD"
_NUMBER = "NUMBER"

_WHITESPACE, _DIGIT, _ALPHA, _QUOTE, _COMMENT = 1, 2, 4, 8, 16


def _char_types() -> list[int]:
    ct = [0] * 256
    for c in range(0, ord(" ") + 1):
        ct[c] |= _WHITESPACE
    for lo, hi in (("a", "z"), ("A", "Z")):
        for c in range(ord(lo), ord(hi) + 1):
            ct[c] |= _ALPHA
    for c in range(128 + 32, 256):
        ct[c] |= _ALPHA
    for c in "0123456789.-":  # parseNumbers()
        ct[ord(c)] |= _DIGIT
    for c in "-_$":  # JaasConfig: wordChars('-', '-'), ('_', '_'), ('$', '$')
        ct[ord(c)] |= _ALPHA
    ct[ord('"')] = _QUOTE
    ct[ord("'")] = _QUOTE
    ct[ord("/")] = _COMMENT
    return ct


_CT = _char_types()
_ESCAPES = {"a": "\x07", "b": "\b", "f": "\x0c", "n": "\n", "r": "\r", "t": "\t", "v": "\x0b"}


def _ctype(ch: str | None) -> int:
    if ch is None:
        return _WHITESPACE
    o = ord(ch)
    return _CT[o] if o < 256 else _ALPHA


class _Tokenizer:
    """The subset of StreamTokenizer.nextToken that JaasConfig exercises: ``ttype`` is _EOF, _WORD, _NUMBER,
    a quote character (a quoted string, its text in ``sval``) or the ordinary character itself; ``sval`` is
    None for numbers and ordinary characters, as in Java."""

    def __init__(self, text: str):
        self._s = text
        self._i = 0
        self.ttype: str = ""
        self.sval: str | None = None

    def _read(self) -> str | None:
        if self._i >= len(self._s):
            self._i = len(self._s) + 1
            return None
        ch = self._s[self._i]
        self._i += 1
        return ch

    def _unread(self, ch: str | None) -> None:
        if ch is not None:
            self._i -= 1

    def next_token(self) -> str:
        self.sval = None
        while True:
            c = self._read()
            if c is None:
                self.ttype = _EOF
                return _EOF
            ct = _ctype(c)
            if ct & _WHITESPACE:
                continue
            break
        if ct & _DIGIT:
            if c == "-":
                d = self._read()
                if d is None or (d != "." and not ("0" <= d <= "9")):
                    self._unread(d)
                    self.ttype = "-"
                    return "-"
                c = d
            seen_dot = False
            while c is not None and (("0" <= c <= "9") or (c == "." and not seen_dot)):
                seen_dot = seen_dot or c == "."
                c = self._read()
            self._unread(c)
            self.ttype = _NUMBER
            return _NUMBER
        if ct & _ALPHA:
            start = self._i - 1
            while True:
                c = self._read()
                if not (c is not None and _ctype(c) & (_ALPHA | _DIGIT)):
                    break
            self._unread(c)
            self.sval = self._s[start:self._i]
            self.ttype = _WORD
            return _WORD
        if ct & _QUOTE:
            quote = c
            buf: list[str] = []
            d = self._read()
            while d is not None and d != quote and d not in "\n\r":
                if d == "\\":
                    e = self._read()
                    if e is not None and "0" <= e <= "7":
                        first = e
                        value = ord(e) - 48
                        e2 = self._read()
                        if e2 is not None and "0" <= e2 <= "7":
                            value = (value << 3) + ord(e2) - 48
                            e3 = self._read()
                            if e3 is not None and "0" <= e3 <= "7" and first <= "3":
                                value = (value << 3) + ord(e3) - 48
                                d = self._read()
                            else:
                                d = e3
                        else:
                            d = e2
                        buf.append(chr(value))
                    else:
                        if e is None:  # a backslash at the very end: Java appends (char) -1
                            buf.append("\uffff")
                            d = None
                            break
                        buf.append(_ESCAPES.get(e, e))
                        d = self._read()
                else:
                    buf.append(d)
                    d = self._read()
            if d is not None and d != quote:  # ended by a line break: that character is read again
                self._unread(d)
            self.sval = "".join(buf)
            self.ttype = quote
            return quote
        if c == "/":  # slashSlashComments / slashStarComments, '/' also a comment character
            d = self._read()
            if d == "*":
                prev = None
                while True:
                    d = self._read()
                    if d is None:
                        self.ttype = _EOF
                        return _EOF
                    if d == "/" and prev == "*":
                        return self.next_token()
                    prev = d
            self._skip_line()
            return self.next_token()
        if ct & _COMMENT:
            self._skip_line()
            return self.next_token()
        self.ttype = c
        return c

    def _skip_line(self) -> None:
        while True:
            c = self._read()
            if c is None:
                return
            if c in "\n\r":
                self._unread(c)
                return


def parse_jaas_config(text: str) -> list[LoginModuleEntry]:
    """All login modules of a JAAS string, in order (Kafka's JaasConfig). Raises JaasConfigError."""
    if not isinstance(text, str):
        raise JaasConfigError("JAAS config must be a string")
    tok = _Tokenizer(text)
    entries: list[LoginModuleEntry] = []
    while tok.next_token() != _EOF:
        entries.append(_parse_entry(tok))
    if not entries:
        raise JaasConfigError("Login module not specified in JAAS config")
    return entries


def _parse_entry(tok: _Tokenizer) -> LoginModuleEntry:
    login_module = tok.sval
    if tok.next_token() == _EOF:
        raise JaasConfigError("Login module control flag not specified in JAAS config")
    flag = tok.sval
    if flag is None:
        raise JaasConfigError("Login module control flag is not available in the JAAS config")
    if flag.lower() not in CONTROL_FLAGS:
        raise JaasConfigError(f"Invalid login module control flag '{flag}' in JAAS config")
    options: dict[str, str] = {}
    while tok.next_token() != _EOF and tok.ttype != ";":
        key = tok.sval
        if tok.next_token() != "=" or tok.next_token() == _EOF or tok.sval is None:
            raise JaasConfigError(f"Value not specified for key '{'null' if key is None else key}' in JAAS config")
        if key is not None:  # a number or a symbol as key: Kafka keeps it under a null key no lookup finds
            options[key] = tok.sval
    if tok.ttype != ";":
        raise JaasConfigError("JAAS config entry not terminated by semi-colon")
    if not login_module:
        # javax.security.auth.login.AppConfigurationEntry refuses it (an IllegalArgumentException without text)
        raise JaasConfigError("Login module name not specified in JAAS config")
    return LoginModuleEntry(login_module, flag.lower(), options)


def server_jaas_entry(listener: str, mechanism: str, configs: Mapping[str, Any]) -> LoginModuleEntry:
    """The login module a broker uses for SASL ``mechanism`` on ``listener`` (JaasContext.loadServerContext):
    only ``listener.name.<listener>.<mechanism>.sasl.jaas.config``, exactly one login module, not a
    disallowed one. Raises JaasConfigError with Kafka's messages."""
    if not listener:
        raise JaasConfigError("listenerName should not be null for SERVER")
    if not mechanism:
        raise JaasConfigError("mechanism should not be null for SERVER")
    key = f"{listener_prefix(listener)}{mechanism.lower()}.{SASL_JAAS_CONFIG}"
    value = configs.get(key)
    if value is None:
        if configs.get(SASL_JAAS_CONFIG) is not None or configs.get(f"{listener_prefix(listener)}{SASL_JAAS_CONFIG}"):
            log.warning("Server config %s should be prefixed with SASL mechanism name, ignoring config",
                        SASL_JAAS_CONFIG)
        context = f"{listener.lower()}.KafkaServer"
        raise JaasConfigError(
            f"Could not find a 'KafkaServer' or '{context}' entry in the JAAS configuration. System property "
            f"'{JAVA_LOGIN_CONFIG_PARAM}' is not set (pykbroker reads no static JAAS file: set {key})")
    entries = parse_jaas_config(str(value))
    if len(entries) != 1:
        raise JaasConfigError(f"JAAS config property contains {len(entries)} login modules, should be 1 module")
    name = entries[0].login_module.strip()
    if name in DISALLOWED_LOGIN_MODULES:
        raise JaasConfigError(f"{name} is not allowed. Update System property "
                              f"'org.apache.kafka.disallowed.login.modules' to allow {name}")
    return entries[0]


def config_entry_option(entries: Iterable[LoginModuleEntry], key: str, login_module: str | None = None) -> str | None:
    """JaasContext.configEntryOption: the first value of option ``key`` among the entries of
    ``login_module`` (any entry when None)."""
    for entry in entries:
        if login_module is not None and entry.login_module != login_module:
            continue
        value = entry.options.get(key)
        if value is not None:
            return value
    return None


def listener_mechanism_config(configs: Mapping[str, Any], listener: str, mechanism: str, key: str,
                              default: Any = None) -> Any:
    """A SASL setting as Kafka's OAuth callback handlers see it: ``listener.name.<l>.<mech>.<key>``, then
    ``listener.name.<l>.<key>``, then ``<key>``, then ``default``."""
    prefix = listener_prefix(listener)
    for name in (f"{prefix}{mechanism.lower()}.{key}", f"{prefix}{key}", key):
        value = configs.get(name)
        if value is not None:
            return value
    return default
