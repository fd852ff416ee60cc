"""The console's pages: server-rendered HTML, a little CSS, no JavaScript, nothing fetched from elsewhere.

Each function takes what the data layer returned and gives a complete page (Markup). Every value from the
cluster goes through :func:`pykbroker.console.html.h`, which escapes it.
"""

from __future__ import annotations

from pykbroker.console import data
from pykbroker.console.html import FORMATS, Markup, h, join, number, render_bytes, size, timestamp, url

CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;align-items:baseline;flex-wrap:wrap}
header a{color:#cfd8ea;text-decoration:none}header a:hover{color:#fff}
header .brand{font-weight:600;color:#fff;font-size:1.1em}
header .cluster{margin-left:auto;color:#9aa6bd;font-size:.9em}
.badge{display:inline-block;padding:0 .5em;border-radius:3px;font-size:.8em;background:#e4e8f0;color:#1d2330}
.badge.warn{background:#ffe1a8}.badge.ok{background:#cdebd3}.badge.bad{background:#f6c4c4}
main{padding:1em 1.2em;max-width:1400px}
h1{font-size:1.4em;margin:.2em 0 .6em}h2{font-size:1.1em;margin:1.4em 0 .5em}
table{border-collapse:collapse;background:#fff;margin:.3em 0 1em;box-shadow:0 1px 2px rgba(0,0,0,.08)}
th,td{padding:.35em .7em;border-bottom:1px solid #e3e6ec;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
tr.nondefault td{background:#fff7e0}tr.alert td{background:#fdecec}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:.2em 1.2em;background:#fff;padding:.8em 1em;
 box-shadow:0 1px 2px rgba(0,0,0,.08);width:max-content}
dl.facts dt{font-weight:600}dl.facts dd{margin:0}
pre{margin:0;white-space:pre-wrap;word-break:break-all;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;max-height:24em;overflow:auto}
.msg{background:#fff;margin:0 0 .8em;padding:.6em .8em;box-shadow:0 1px 2px rgba(0,0,0,.08)}
.msg .meta{color:#5b6577;font-size:.9em;margin-bottom:.3em}.msg .part{font-weight:600;color:#1d2330;margin-top:.4em}
.msg .fmt{color:#8a93a3;font-weight:normal;font-size:.85em}
form.inline{display:flex;gap:.6em;flex-wrap:wrap;align-items:end;background:#fff;padding:.7em 1em;
 box-shadow:0 1px 2px rgba(0,0,0,.08);margin:.3em 0 1em}
form label{display:flex;flex-direction:column;font-size:.85em;color:#5b6577}
input,select,textarea,button{font:inherit;padding:.25em .4em}button{cursor:pointer}
.notice{background:#cdebd3;padding:.6em 1em;margin-bottom:1em}.error{background:#f6c4c4;padding:.8em 1em}
.muted{color:#8a93a3}
"""


def layout(title: str, body: Markup, *, bootstrap: str, allow_writes: bool, notice: str | None = None) -> Markup:
    mode = (h('<span class="badge warn">writes enabled</span>') if allow_writes
            else h('<span class="badge">read-only</span>'))
    note = h('<div class="notice" role="status">{}</div>', notice) if notice else ""
    return h(
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<title>{title} · pykbroker console</title><style>{css}</style></head><body>'
        '<header><a class="brand" href="/">pykbroker console</a><a href="/">Overview</a><a href="/topics">Topics</a>'
        '<a href="/groups">Consumer groups</a><a href="/messages">Messages</a>'
        '<span class="cluster">{bootstrap} {mode}</span></header><main>{note}{body}</main></body></html>',
        title=title, css=Markup(CSS), bootstrap=bootstrap, mode=mode, note=note, body=body)


def _table(headers: list[str], rows: list[Markup], numeric: set[int] = frozenset()) -> Markup:
    head = join(h('<th class="num">{}</th>', t) if i in numeric else h("<th>{}</th>", t)
                for i, t in enumerate(headers))
    if not rows:
        rows = [h('<tr><td colspan="{}" class="muted">none</td></tr>', len(headers))]
    return h("<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", head, join(rows))


def _ids(values: list[int]) -> str:
    return ", ".join(str(v) for v in values) or "—"


def error_page(message: str, status: int, **chrome) -> Markup:
    body = h('<h1>Error {}</h1><div class="error" role="alert">{}</div>', status, message)
    return layout(f"Error {status}", body, **chrome)


# -- overview -------------------------------------------------------------------------------------------

def overview(info: data.ClusterInfo, **chrome) -> Markup:
    facts = h('<dl class="facts"><dt>Cluster id</dt><dd id="cluster-id">{}</dd><dt>Controller</dt>'
              '<dd id="controller">{}</dd><dt>Brokers</dt><dd>{}</dd><dt>Topics</dt><dd>{}</dd>'
              '<dt>Partitions</dt><dd>{}</dd></dl>',
              info.cluster_id or "—", "—" if info.controller_id is None else info.controller_id,
              len(info.brokers), info.topic_count, info.partition_count)
    rows = [h('<tr><td class="num">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>', b.id, b.address, b.rack or "—",
              Markup('<span class="badge ok">controller</span>') if b.is_controller else "")
            for b in info.brokers]
    body = h("<h1>Cluster</h1>{}<h2>Brokers</h2>{}", facts,
             _table(["Id", "Host:port", "Rack", ""], rows, {0}))
    return layout("Overview", body, **chrome)


# -- topics ---------------------------------------------------------------------------------------------

def topics(items: list[data.Topic], *, create_form: bool, **chrome) -> Markup:
    rows = []
    for t in items:
        rows.append(h('<tr class="{cls}"><td><a href="{href}">{name}</a>{internal}</td><td class="num">{parts}</td>'
                      '<td class="num">{rf}</td><td class="num">{urp}</td><td class="num">{size}</td>'
                      '<td class="num">{msgs}</td><td><a href="{browse}">browse</a></td></tr>',
                      cls="alert" if t.under_replicated else "", href=url("/topics", t.name), name=t.name,
                      internal=Markup(' <span class="badge">internal</span>') if t.internal else "",
                      parts=len(t.partitions), rf=t.replication_factor, urp=t.under_replicated,
                      size=size(t.size), msgs=number(t.messages), browse=url("/messages", topic=t.name)))
    table = _table(["Topic", "Partitions", "Replication", "Under-replicated", "Size", "Messages", ""], rows,
                   {1, 2, 3, 4, 5})
    form = ""
    if create_form:
        form = Markup(
            '<h2>Create a topic</h2><form class="inline" method="post" action="/topics">'
            '<label>Name<input name="name" required maxlength="249" pattern="[a-zA-Z0-9._-]+"></label>'
            '<label>Partitions<input name="partitions" type="number" min="1" value="1" required></label>'
            '<label>Replication factor<input name="replication_factor" type="number" min="-1" value="-1" '
            'title="-1: the broker default"></label>'
            '<label>Configs (key=value, one a line)<textarea name="configs" rows="2" cols="30"></textarea></label>'
            '<button type="submit">Create topic</button></form>')
    body = h("<h1>Topics</h1>{}{}", table, form)
    return layout("Topics", body, **chrome)


def topic(t: data.Topic, **chrome) -> Markup:
    rows = [h('<tr class="{}"><td class="num"><a href="{}" title="browse">{}</a></td><td class="num">{}</td><td>{}</td>'
              '<td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td>'
              '<td>{}</td></tr>',
              "alert" if p.under_replicated or p.error else "", url("/messages", topic=t.name, partition=p.partition),
              p.partition, p.leader, _ids(p.replicas), _ids(p.isr),
              number(p.start), number(p.end), number(p.messages), size(p.size), p.error or "")
            for p in t.partitions]
    partitions = _table(["Partition", "Leader", "Replicas", "ISR", "Start offset", "End offset", "Messages", "Size",
                         "Error"], rows, {0, 1, 4, 5, 6, 7})
    config_rows = [h('<tr class="{}"><td>{}</td><td>{}</td><td>{}</td></tr>', "" if c.is_default else "nondefault",
                     c.name, "(sensitive)" if c.sensitive else ("—" if c.value is None else c.value),
                     "default" if c.is_default else h('<span class="badge warn">{}</span>', c.source))
                   for c in t.configs]
    facts = h('<dl class="facts"><dt>Partitions</dt><dd>{}</dd><dt>Replication factor</dt><dd>{}</dd>'
              '<dt>Under-replicated</dt><dd>{}</dd><dt>Size</dt><dd>{}</dd><dt>Messages</dt><dd>{}</dd></dl>',
              len(t.partitions), t.replication_factor, t.under_replicated, size(t.size), number(t.messages))
    body = h('<h1>Topic <span id="topic-name">{}</span></h1>{}<p><a href="{}">Browse messages</a></p>'
             '<h2>Partitions</h2>{}<h2>Configs</h2><p class="muted">Values that are not the default are '
             'highlighted, with where they come from.</p>{}',
             t.name, facts, url("/messages", topic=t.name), partitions,
             _table(["Name", "Value", "Source"], config_rows))
    return layout(f"Topic {t.name}", body, **chrome)


# -- groups ---------------------------------------------------------------------------------------------

def groups(items: list[data.Group], *, problem: str | None = None, **chrome) -> Markup:
    """The groups' table; ``problem``: why consumer groups cannot start (ClusterReader.coordination_problem)."""
    rows = [h('<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td>'
              '<td>{}</td></tr>',
              url("/groups", g.group_id), g.group_id, g.type, g.state, len(g.members), number(g.lag), g.error or "")
            for g in items]
    warning = h('<div class="error" role="alert" id="groups-problem">{}</div>', problem) if problem else ""
    body = h("<h1>Consumer groups</h1>{}{}", warning,
             _table(["Group", "Type", "State", "Members", "Total lag", "Error"], rows, {3, 4}))
    return layout("Consumer groups", body, **chrome)


def group(g: data.Group, *, reset_form: bool, **chrome) -> Markup:
    consumer = g.type == "consumer"
    epochs = (h('<dt>Group epoch</dt><dd id="group-epoch">{}</dd><dt>Assignment epoch</dt><dd id="assignment-epoch">{}'
                '</dd>', number(g.group_epoch), number(g.assignment_epoch)) if consumer else "")
    facts = h('<dl class="facts"><dt>Type</dt><dd id="group-type">{}</dd><dt>State</dt><dd id="group-state">{}</dd>{}'
              '<dt>Assignor</dt><dd>{}</dd><dt>Coordinator</dt><dd>{}</dd><dt>Members</dt><dd>{}</dd>'
              '<dt>Total lag</dt><dd id="total-lag">{}</dd></dl>',
              g.type, g.state, epochs, g.assignor or "—", "—" if g.coordinator is None else g.coordinator,
              len(g.members), number(g.lag))
    member_rows = [h("<tr><td>{}</td><td>{}</td><td>{}</td>{}<td>{}</td></tr>", m.client_id, m.host, m.member_id,
                     h('<td class="num">{}</td>', number(m.epoch)) if consumer else "",
                     ", ".join(f"{t}/{p}" for t, p in m.assignment) or "—")
                   for m in g.members]
    offset_rows = [h('<tr><td><a href="{}">{}</a></td><td class="num">{}</td><td class="num">{}</td>'
                     '<td class="num">{}</td><td class="num">{}</td><td>{}</td></tr>',
                     url("/topics", o.topic), o.topic, o.partition, number(o.committed), number(o.end),
                     number(o.lag), o.member or "—")
                   for o in g.offsets]
    form = ""
    if reset_form:
        topics = sorted({o.topic for o in g.offsets})
        options = join([Markup('<option value="">every partition with an offset</option>')]
                       + [h('<option value="{0}">{0}</option>', t) for t in topics])
        form = h('<h2>Reset offsets</h2><p class="muted">Kafka allows it only while the group has no active '
                 'members.</p><form class="inline" method="post" action="{}">'
                 '<label>Topic<select name="topic">{}</select></label>'
                 '<label>To<select name="mode"><option>earliest</option><option>latest</option>'
                 '<option>offset</option><option>timestamp</option></select></label>'
                 '<label>Offset or timestamp (ms or ISO, UTC)<input name="position"></label>'
                 '<button type="submit">Reset offsets</button></form>',
                 url("/groups", g.group_id, "reset"), options)
    body = h('<h1>Consumer group <span id="group-id">{}</span></h1>{}<h2>Members</h2>{}<h2>Offsets</h2>{}{}',
             g.group_id, facts,
             _table(["Client id", "Host", "Member id", *(["Member epoch"] if consumer else []), "Assignment"],
                    member_rows, {3} if consumer else set()),
             _table(["Topic", "Partition", "Committed offset", "End offset", "Lag", "Member"], offset_rows,
                    {1, 2, 3, 4}), form)
    return layout(f"Group {g.group_id}", body, **chrome)


# -- messages -------------------------------------------------------------------------------------------

def _select(name: str, options: list[tuple[str, str]], selected: str) -> Markup:
    return h('<select name="{}">{}</select>', name,
             join(h('<option value="{}"{}>{}</option>', value, Markup(" selected") if value == selected else "", label)
                  for value, label in options))


def message_form(topic_names: list[str], params: dict[str, str]) -> Markup:
    topic_options = [("", "— choose —")] + [(t, t) for t in topic_names]
    start_labels = {"newest": "newest", "oldest": "oldest", "offset": "at offset", "timestamp": "at timestamp"}
    return h(
        '<form class="inline" method="get" action="/messages">'
        '<label>Topic{}</label><label>Partition<input name="partition" size="6" placeholder="all" value="{}"></label>'
        '<label>Start{}</label><label>Offset / timestamp<input name="position" size="22" value="{}" '
        'placeholder="123 or 2024-01-31T12:00"></label>'
        '<label>Messages (max {})<input name="limit" type="number" min="1" max="{}" value="{}"></label>'
        '<label>Order{}</label><label>Show as{}</label>'
        '<label>Bytes per value (max {})<input name="max_bytes" type="number" min="16" max="{}" value="{}"></label>'
        '<button type="submit">Show</button></form>',
        _select("topic", topic_options, params.get("topic", "")), params.get("partition", ""),
        _select("start", [(m, start_labels[m]) for m in data.START_MODES], params.get("start", "newest")),
        params.get("position", ""), data.MAX_MESSAGES, data.MAX_MESSAGES, params.get("limit", data.DEFAULT_MESSAGES),
        _select("order", [("newest", "newest first"), ("oldest", "oldest first")], params.get("order", "newest")),
        _select("format", [(f, f) for f in FORMATS], params.get("format", "auto")),
        data.MAX_VALUE_BYTES, data.MAX_VALUE_BYTES, params.get("max_bytes", data.DEFAULT_VALUE_BYTES))


def _shown(label: str, payload: bytes | None, full_size: int, fmt: str, cls: str) -> Markup:
    truncated = payload is not None and full_size > len(payload)
    text, used = render_bytes(payload, fmt, truncated)
    note = f"{used}, {full_size} bytes" + (f", first {len(payload)} shown" if truncated else "")
    return h('<div class="part">{} <span class="fmt">({})</span></div><pre class="{}">{}</pre>',
             label, note, cls, text)


def messages(topic_names: list[str], params: dict[str, str], result: data.Browse | None, **chrome) -> Markup:
    fmt = params.get("format", "auto")
    parts = [h("<h1>Messages</h1>"), message_form(topic_names, params)]
    if result is not None:
        summary = h('<p class="muted" id="summary">{} message(s) from {}, partition(s) {}{}</p>',
                    len(result.messages), result.topic, _ids(result.partitions),
                    " — stopped at the time limit, the list may be incomplete" if result.timed_out else "")
        parts.append(summary)
        for m in result.messages:
            headers = (_table(["Header", "Value"], [
                h("<tr><td>{}</td><td><pre>{}</pre></td></tr>", name, render_bytes(value, fmt)[0])
                for name, value in m.headers]) if m.headers else Markup('<span class="muted">none</span>'))
            parts.append(h(
                '<div class="msg" data-partition="{p}" data-offset="{o}"><div class="meta">partition {p} · offset {o}'
                ' · <span class="ts">{ts}</span> {tst}</div>{key}{value}<div class="part">Headers</div>{headers}</div>',
                p=m.partition, o=m.offset, ts=timestamp(m.timestamp), tst=m.timestamp_type,
                key=_shown("Key", m.key, m.key_size, fmt, "key"),
                value=_shown("Value", m.value, m.value_size, fmt, "value"), headers=headers))
    return layout("Messages", join(parts), **chrome)
