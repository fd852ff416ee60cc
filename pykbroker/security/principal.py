"""Who a connection is: Kafka's principal ("User:alice"), the principal of a mutual-TLS client through
``ssl.principal.mapping.rules``, and the RFC 2253 rendering of a certificate subject those rules apply to.

* :class:`KafkaPrincipal` is a type and a name; ``str()`` gives "Type:name", :meth:`KafkaPrincipal.parse`
  is Kafka's ``SecurityUtils.parseKafkaPrincipal`` (split at the first colon; "User:" and ":x" are valid,
  "alice" and "" are not, with Kafka's message). :data:`ANONYMOUS` is "User:ANONYMOUS", the principal of
  a PLAINTEXT connection and of a TLS client without a certificate.
* :class:`SslPrincipalMapper` is Kafka's ``SslPrincipalMapper``: rules separated by commas, with any
  whitespace (newlines too) around them - one rule a line works with a comma at the end of each line;
  without the commas Kafka's splitter silently keeps only some of the rules, and so does this one. Each
  rule is ``DEFAULT`` (the distinguished name unchanged) or
  ``RULE:pattern/replacement/`` with an optional ``L`` or ``U`` (lower / upper case the result); "/" and
  "\\" inside the pattern or the replacement are escaped with "\\". The first rule whose pattern matches the
  whole name gives the principal name (``$1`` and ``${name}`` as Java's ``replaceAll`` expands them, a
  back reference to a group the pattern does not have kept as literal text, as Kafka does); when none
  applies, :class:`NoMatchingRule` ("No rules apply to <dn>, rules [...]"). Parse errors are Kafka's
  ("Invalid rule: `x`, unmatched substring: `x`"). Patterns are Java regular expressions; the common
  subset is the same in Python's ``re`` (``(?<name>...)`` and ``\\Q...\\E`` are translated), and a pattern
  Python cannot compile is refused when the rules are parsed, naming the rule. One known difference: Java's
  "." does not match "\\r" (nor U+0085, U+2028, U+2029), Python's does - it matters only for a subject
  holding such a character.
* :func:`rfc2253_subject` renders a certificate's subject (DER, as ``getpeercert(binary_form=True)`` gives
  it) exactly as Java's ``X500Principal.getName()`` does - the string Kafka hands to the mapping rules:
  the RDNs in reverse order of the certificate's sequence, joined by ","; the keywords CN, C, L, ST, O, OU,
  STREET, DC, UID and dotted OIDs for every other attribute (emailAddress is "1.2.840.113549.1.9.1"), whose
  values are written "#" + the hex of their DER encoding; string values decoded as UTF-8 with
  ``, = + < > # ; " \\`` escaped by a backslash, NUL as "\\00", and leading / trailing spaces (and CRs)
  escaped; values of a non-string type in hex.
* :func:`ssl_principal` combines them as Kafka's DefaultKafkaPrincipalBuilder does for an SSL connection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = (
    "KafkaPrincipal", "ANONYMOUS", "USER_TYPE", "WILDCARD", "SslPrincipalMapper", "NoMatchingRule",
    "rfc2253_subject", "rfc2253_name", "ssl_principal", "DEFAULT_SSL_PRINCIPAL_MAPPING_RULES",
)

USER_TYPE = "User"
DEFAULT_SSL_PRINCIPAL_MAPPING_RULES = "DEFAULT"


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.principal_type, str):
            raise ValueError("Principal type cannot be null")
        if not isinstance(self.name, str):
            raise ValueError("Principal name cannot be null")

    @classmethod
    def parse(cls, text: str) -> "KafkaPrincipal":
        """SecurityUtils.parseKafkaPrincipal: "Type:name", split at the first colon."""
        if not isinstance(text, str) or not text or ":" not in text:
            raise ValueError(f"expected a string in format principalType:principalName but got {text}")
        principal_type, _, name = text.partition(":")
        return cls(principal_type, name)

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"


ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")
WILDCARD = KafkaPrincipal(USER_TYPE, "*")


# ---------------------------------------------------------------------------------------------------
# ssl.principal.mapping.rules

_RULE_PATTERN = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE_PATTERN + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE_PATTERN)
_BACK_REFERENCE = re.compile(r"\$(\d+)")
# Rules are configuration, but a megabyte of them is a mistake: refuse before regex work on it.
MAX_RULES_LENGTH = 64 * 1024


class NoMatchingRule(ValueError):
    """No mapping rule applies to a distinguished name (Kafka: SslPrincipalMapper.NoMatchingRule)."""


def _java_regex_to_python(pattern: str) -> str:
    """The few Java-only spellings of the common regex subset: named groups and \\Q...\\E quoting."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("\\Q", i):
            end = pattern.find("\\E", i + 2)
            end = len(pattern) if end < 0 else end
            out.append(re.escape(pattern[i + 2:end]))
            i = end + 2
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(pattern[i:i + 2])
            i += 2
        elif pattern.startswith("(?<", i) and i + 3 < len(pattern) and pattern[i + 3] not in "=!":
            out.append("(?P<")
            i += 3
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _escape_literal_back_references(replacement: str, group_count: int) -> str:
    """Kafka's escapeLiteralBackReferences: with three groups "$4" becomes the literal text "$4" (a
    backslash before the "$"). As in Kafka, positions come from the original replacement while the
    insertions go into the changing one."""
    if group_count == 0:
        return replacement
    value = replacement
    for match in _BACK_REFERENCE.finditer(replacement):
        digits = match.group(1)
        if digits.startswith("0"):
            continue
        index = int(digits)
        while index > group_count and index >= 10:
            index //= 10
        if index > group_count:
            start = match.start(1)
            value = value[:start - 1] + "\\" + value[start - 1:]
    return value


def _expand_java_replacement(replacement: str, match: re.Match) -> str:
    """Matcher.appendReplacement's expansion: "\\x" is x, "$n" takes the most digits naming a group,
    "${name}" a named group; an unmatched group adds nothing."""
    out = []
    i = 0
    n = len(replacement)
    group_count = match.re.groups
    while i < n:
        c = replacement[i]
        if c == "\\":
            i += 1
            if i == n:
                raise ValueError("character to be escaped is missing")
            out.append(replacement[i])
            i += 1
        elif c == "$":
            i += 1
            if i == n:
                raise ValueError("Illegal group reference: group index is missing")
            if replacement[i] == "{":
                i += 1
                start = i
                while i < n and replacement[i].isascii() and replacement[i].isalnum():
                    i += 1
                name = replacement[start:i]
                if not name:
                    raise ValueError("named capturing group has 0 length name")
                if i == n or replacement[i] != "}":
                    raise ValueError("named capturing group is missing trailing '}'")
                if name[0].isdigit():
                    raise ValueError(f"capturing group name {{{name}}} starts with digit character")
                if name not in match.re.groupindex:
                    raise ValueError(f"No group with name {{{name}}}")
                ref = match.re.groupindex[name]
                i += 1
            else:
                if not ("0" <= replacement[i] <= "9"):
                    raise ValueError("Illegal group reference")
                ref = ord(replacement[i]) - 48
                i += 1
                while i < n and "0" <= replacement[i] <= "9":
                    candidate = ref * 10 + ord(replacement[i]) - 48
                    if candidate > group_count:
                        break
                    ref = candidate
                    i += 1
            if ref > group_count:
                raise ValueError(f"No group {ref}")
            group = match.group(ref)
            if group is not None:
                out.append(group)
        else:
            out.append(c)
            i += 1
    return "".join(out)


@dataclass(frozen=True, slots=True)
class _Rule:
    is_default: bool
    pattern_text: str | None = None
    replacement: str | None = None
    to_lower: bool = False
    to_upper: bool = False
    pattern: re.Pattern | None = None

    def apply(self, dn: str) -> str | None:
        if self.is_default:
            return dn
        assert self.pattern is not None and self.replacement is not None
        if self.pattern.fullmatch(dn) is None:
            return None
        replacement = _escape_literal_back_references(self.replacement, self.pattern.groups)
        result = self.pattern.sub(lambda m: _expand_java_replacement(replacement, m), dn)
        if self.to_lower:
            result = result.lower()
        elif self.to_upper:
            result = result.upper()
        return result

    def __str__(self) -> str:
        if self.is_default:
            return "DEFAULT"
        text = f"RULE:{self.pattern_text}/{self.replacement}"
        if self.to_lower:
            text += "/L"
        elif self.to_upper:
            text += "/U"
        return text


def _split_rules(rules: str) -> list[str]:
    """RULE_SPLITTER's find loop, with Java's rule of moving one character on after an empty match."""
    text = rules.strip()
    found: list[str] = []
    position = 0
    while position <= len(text):
        match = _RULE_SPLITTER.search(text, position)
        if match is None:
            break
        found.append(match.group(1))
        position = match.end() + 1 if match.end() == match.start() else match.end()
    return found


def _parse_rules(rules: list[str]) -> list[_Rule]:
    parsed: list[_Rule] = []
    for rule in rules:
        match = _RULE_PARSER.match(rule)
        if match is None:
            raise ValueError(f"Invalid rule: {rule}")
        if match.end() != len(rule):
            raise ValueError(f"Invalid rule: `{rule}`, unmatched substring: `{rule[match.end():]}`")
        if match.group(1) is not None:
            parsed.append(_Rule(True))
        elif match.group(2) is not None:
            pattern_text = match.group(2)
            try:
                compiled = re.compile(_java_regex_to_python(pattern_text))
            except (re.error, RecursionError, OverflowError) as exc:
                raise ValueError(f"Invalid rule: `{rule}`: bad pattern: {exc}") from None
            parsed.append(_Rule(False, pattern_text, match.group(4), match.group(6) == "L",
                                match.group(6) == "U", compiled))
        # an empty rule is ignored
    return parsed


class SslPrincipalMapper:
    """Kafka's ssl.principal.mapping.rules (None means the default, "DEFAULT")."""

    def __init__(self, rules: str | None = None) -> None:
        if rules is None:
            rules = DEFAULT_SSL_PRINCIPAL_MAPPING_RULES
        if not isinstance(rules, str):
            raise ValueError(f"ssl.principal.mapping.rules must be a string, not {type(rules).__name__}")
        if len(rules) > MAX_RULES_LENGTH:
            raise ValueError(f"ssl.principal.mapping.rules is {len(rules)} characters long, "
                             f"more than {MAX_RULES_LENGTH}")
        self.rules = tuple(_parse_rules(_split_rules(rules)))

    @classmethod
    def from_rules(cls, rules: str | None) -> "SslPrincipalMapper":
        return cls(rules)

    def get_name(self, distinguished_name: str) -> str:
        for rule in self.rules:
            name = rule.apply(distinguished_name)
            if name is not None:
                return name
        raise NoMatchingRule(f"No rules apply to {distinguished_name}, rules [{', '.join(map(str, self.rules))}]")

    def __str__(self) -> str:
        return f"SslPrincipalMapper(rules = [{', '.join(map(str, self.rules))}])"

    __repr__ = __str__


# ---------------------------------------------------------------------------------------------------
# X500Principal.getName() (RFC 2253) from a certificate

_RFC2253_KEYWORDS = {
    "2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O", "2.5.4.11": "OU",
    "2.5.4.9": "STREET", "0.9.2342.19200300.100.1.25": "DC", "0.9.2342.19200300.100.1.1": "UID",
}
# PrintableString, T61String, IA5String, GeneralString, BMPString, UTF8String: rendered as text.
_TEXT_TAGS = frozenset({0x13, 0x14, 0x16, 0x1B, 0x1E, 0x0C})
_ESCAPED = frozenset(',=+<>#;"\\')
_MAX_DEPTH_ITEMS = 10_000


class _Der:
    """A bounded DER reader: every length is checked against the bytes that remain."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(bytes(data))

    def tlv(self, position: int, end: int) -> tuple[int, int, int, int]:
        """(tag, content start, content end, header start) of the element at position."""
        data = self.data
        if position + 2 > end:
            raise ValueError("malformed certificate: truncated DER element")
        tag = data[position]
        if tag & 0x1F == 0x1F:
            raise ValueError("malformed certificate: multi-byte DER tags are not supported")
        length = data[position + 1]
        cursor = position + 2
        if length & 0x80:
            count = length & 0x7F
            if count == 0 or count > 4:
                raise ValueError("malformed certificate: indefinite or oversized DER length")
            if cursor + count > end:
                raise ValueError("malformed certificate: truncated DER length")
            length = int.from_bytes(data[cursor:cursor + count], "big")
            cursor += count
        if cursor + length > end:
            raise ValueError("malformed certificate: DER length beyond the data")
        return tag, cursor, cursor + length, position

    def children(self, start: int, end: int):
        position = start
        count = 0
        while position < end:
            count += 1
            if count > _MAX_DEPTH_ITEMS:
                raise ValueError("malformed certificate: too many DER elements")
            tag, content_start, content_end, _ = self.tlv(position, end)
            yield tag, content_start, content_end, position
            position = content_end


def _oid_text(content: bytes) -> str:
    if not content:
        raise ValueError("malformed certificate: empty OID")
    arcs = []
    value = 0
    for byte in content:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if content[-1] & 0x80:
        raise ValueError("malformed certificate: truncated OID")
    first = arcs[0]
    head = [0, first] if first < 40 else [1, first - 40] if first < 80 else [2, first - 80]
    return ".".join(str(arc) for arc in head + arcs[1:])


def _der_length(length: int) -> bytes:
    if length < 0x80:
        return bytes([length])
    raw = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def _escape_value(text: str) -> str:
    chars: list[str] = []
    for c in text:
        if c in _ESCAPED:
            chars.append("\\" + c)
        elif c == "\x00":
            chars.append("\\00")
        else:
            chars.append(c)
    flat = "".join(chars)
    lead = 0
    while lead < len(flat) and flat[lead] in " \r":
        lead += 1
    trail = len(flat) - 1
    while trail >= 0 and flat[trail] in " \r":
        trail -= 1
    return "".join("\\" + c if (i < lead or i > trail) else c for i, c in enumerate(flat))


def _ava(der: _Der, start: int, end: int) -> str:
    items = list(der.children(start, end))
    if len(items) != 2 or items[0][0] != 0x06:
        raise ValueError("malformed certificate: an attribute is not (OID, value)")
    _, oid_start, oid_end, _ = items[0]
    oid = _oid_text(bytes(der.data[oid_start:oid_end]))
    tag, value_start, value_end, _ = items[1]
    content = bytes(der.data[value_start:value_end])
    keyword = _RFC2253_KEYWORDS.get(oid, oid)
    if keyword[0].isdigit() or tag not in _TEXT_TAGS:
        return f"{keyword}=#{(bytes([tag]) + _der_length(len(content)) + content).hex()}"
    return f"{keyword}={_escape_value(content.decode('utf-8', 'replace'))}"


def rfc2253_name(name_der: bytes) -> str:
    """An X.501 Name (DER SEQUENCE OF RDN) as Java's X500Principal.getName() renders it."""
    der = _Der(name_der)
    tag, start, end, _ = der.tlv(0, len(der.data))
    if tag != 0x30 or end != len(der.data):
        raise ValueError("malformed certificate: a Name is not one SEQUENCE")
    return _render_name(der, start, end)


def _render_name(der: _Der, start: int, end: int) -> str:
    rdns = []
    for tag, rdn_start, rdn_end, _ in der.children(start, end):
        if tag != 0x31:
            raise ValueError("malformed certificate: an RDN is not a SET")
        avas = [_ava(der, s, e) for t, s, e, _ in der.children(rdn_start, rdn_end) if t == 0x30]
        if not avas:
            raise ValueError("malformed certificate: empty RDN")
        rdns.append("+".join(avas))
    return ",".join(reversed(rdns))


def rfc2253_subject(certificate_der: bytes) -> str:
    """The subject of a DER certificate as Java's X500Principal.getName() (RFC 2253) renders it.

    Raises ValueError("malformed certificate: ...") for bytes that are not a certificate.
    """
    if not isinstance(certificate_der, (bytes, bytearray, memoryview)):
        raise ValueError("a certificate must be DER bytes")
    der = _Der(certificate_der)
    tag, start, end, _ = der.tlv(0, len(der.data))
    if tag != 0x30:
        raise ValueError("malformed certificate: not a SEQUENCE")
    tbs_tag, tbs_start, tbs_end, _ = der.tlv(start, end)
    if tbs_tag != 0x30:
        raise ValueError("malformed certificate: no TBSCertificate")
    fields = der.children(tbs_start, tbs_end)
    # [0] version (optional), serial, signature algorithm, issuer, validity, subject
    wanted = []
    for tag, s, e, _ in fields:
        if not wanted and tag == 0xA0:
            continue
        wanted.append((tag, s, e))
        if len(wanted) == 5:
            break
    if len(wanted) < 5 or wanted[4][0] != 0x30:
        raise ValueError("malformed certificate: no subject")
    _, subject_start, subject_end = wanted[4]
    return _render_name(der, subject_start, subject_end)


def ssl_principal(peer_certificate_der: bytes | None, mapper: SslPrincipalMapper) -> KafkaPrincipal:
    """Kafka's principal of an SSL connection: ANONYMOUS without a client certificate, else "User:" + the
    mapped subject. Raises NoMatchingRule (authentication fails) when no rule applies."""
    if peer_certificate_der is None:
        return ANONYMOUS
    return KafkaPrincipal(USER_TYPE, mapper.get_name(rfc2253_subject(peer_certificate_der)))
