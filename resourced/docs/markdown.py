"""docs/reference/*.md from the facts: one page per area, and an index."""

import re

from .facts import Command, Facts, Option, Program, signature
from .names import REGENERATE

NOTICE = ("<!-- Generated from the code by resourced/docs; do not edit: "
          f"regenerate with {REGENERATE}. -->\n\n")

PAGES = {
    "gpuctl.md": "gpuctl: every command and option",
    "programs.md": "resourced and resourced-mcp: their command lines",
    "configuration.md": "The configuration file: every key",
    "exit-codes.md": "gpuctl's exit codes",
    "dbus.md": "The D-Bus API",
    "environment.md": "Environment variables",
}


def pages(facts: Facts) -> dict[str, str]:
    made = {
        "gpuctl.md": gpuctl(facts.commands),
        "programs.md": programs((facts.daemon, facts.mcp)),
        "configuration.md": configuration(facts),
        "exit-codes.md": exit_codes(facts),
        "dbus.md": dbus(facts),
        "environment.md": environment(facts),
    }
    index = ["# Reference", "",
             f"Generated from resourced {facts.version}'s code, so it says what the code does.",
             ""] + [f"* [{title}]({name})" for name, title in PAGES.items()]
    made["README.md"] = "\n".join(index) + "\n"
    return {name: NOTICE + text for name, text in made.items()}


def prose(text: str) -> str:
    """Text for Markdown: an angle bracket is not an HTML tag."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cell(text: str) -> str:
    return prose(" ".join(text.split())).replace("|", "\\|")


def code(text: str) -> str:
    ticks = "``" if "`" in text else "`"
    pad = " " if ticks == "``" else ""
    return f"{ticks}{pad}{text}{pad}{ticks}" if text else ""


def help_blocks(text: str) -> list[tuple[bool, str]]:
    """A click help text's paragraphs: (verbatim, text). A ``\\b`` paragraph keeps its
    lines; the others are one line each."""
    blocks = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.splitlines()
        if lines and lines[0].strip() == "\b":
            blocks.append((True, "\n".join(line.rstrip() for line in lines[1:])))
        elif paragraph.strip():
            blocks.append((False, " ".join(paragraph.split())))
    return blocks


def _help(text: str) -> list[str]:
    out = []
    for verbatim, block in help_blocks(text):
        out += ["```text", block, "```", ""] if verbatim else [prose(block), ""]
    return out


def _options(options: tuple[Option, ...]) -> list[str]:
    if not options:
        return []
    rows = ["| Option | Value | Default | Description |", "|---|---|---|---|"]
    for o in options:
        value = o.metavar + (" (repeatable)" if o.multiple else "")
        default = "required" if o.required else (o.default or "")
        rows.append(f"| {' / '.join(code(n) for n in o.names)} | {cell(value)} | "
                    f"{cell(default)} | {cell(o.help)} |")
    return rows + [""]


def _anchor(command: Command) -> str:
    return "-".join(command.path)


def gpuctl(commands: tuple[Command, ...]) -> str:
    out = ["# gpuctl", "", "Every command, as `gpuctl COMMAND --help` says it.", ""]
    for c in commands[1:]:
        # 4 spaces a level: Python-Markdown (the site, mkdocs.yml) nests no less; forges too.
        depth = "    " * (len(c.path) - 2)
        out.append(f"{depth}* [{c.name}](#{_anchor(c)}): {prose(c.summary)}")
    out.append("")
    for c in commands:
        out += [f"<a id=\"{_anchor(c)}\"></a>", "", f"## {c.name}", "",
                "```text", c.usage, "```", ""]
        out += _help(c.help)
        if c.subcommands:
            out += ["Commands: " + ", ".join(f"[{n}](#{_anchor(c)}-{n})" for n in c.subcommands)
                    + ".", ""]
        out += _options(c.options)
    return "\n".join(out).rstrip("\n") + "\n"


def programs(progs: tuple[Program, ...]) -> str:
    out = ["# resourced and resourced-mcp", ""]
    for p in progs:
        out += [f"## {p.name}", "", "```text", p.usage, "```", "", prose(p.description), ""]
        out += _options(p.options)
    return "\n".join(out).rstrip("\n") + "\n"


def configuration(facts: Facts) -> str:
    out = ["# The configuration file",
           "",
           "Every key the configuration's checker (`resourced/config.py`) knows, with its "
           "type, default, unit and the values it allows. `examples/config.toml` says more "
           "about each; `gpuctl config check FILE` checks a file.", ""]
    for s in facts.configuration:
        title = f"[[{s.name}]]" if s.array else f"[{s.name}]"
        out += [f"## {title}", "", prose(s.about.replace("``", "`")), "",
                "| Key | Type | Default | Unit | Allowed | Meaning |",
                "|---|---|---|---|---|---|"]
        for k in s.keys:
            default = "required" if k.required else code(k.default)
            out.append(f"| {code(k.name)} | {cell(k.type)} | {default} | "
                       f"{cell(k.unit)} | {cell(k.allowed)} | {cell(k.meaning)} |")
        out.append("")
    if facts.old_keys:
        out += ["## Earlier names", "",
                "The predecessor's `[daemon]` keys are still read, each with a note:", ""]
        out += [f"* {code('daemon.' + old)}: " + (f"read as {code('daemon.' + new)}" if new
                                                 else "read and not used")
                for old, new in facts.old_keys.items()]
    return "\n".join(out).rstrip("\n") + "\n"


def exit_codes(facts: Facts) -> str:
    out = ["# gpuctl's exit codes", "",
           "From `resourced/exits.py`; the meanings are those `gpuctl --help` gives. "
           "`gpuctl run` returns its command's own code (128+n for signal n). With "
           "`--json`, a failure's `error.code` is the JSON code.", "",
           "| Code | Meaning | Constant | JSON code | Errors that end in it |",
           "|---|---|---|---|---|"]
    for e in facts.exit_codes:
        out.append(f"| {e.code} | {cell(e.meaning)} | {code(e.constant)} | {code(e.name)} | "
                   f"{', '.join(code(n) for n in e.errors)} |")
    return "\n".join(out) + "\n"


def _paragraphs(doc: str) -> list[str]:
    return [prose(p) for p in doc.split("\n\n")] if doc else []


def dbus(facts: Facts) -> str:
    api = facts.bus
    out = ["# The D-Bus API", "",
           "From its golden copy `dbus/org.resourced.xml`, which the tests compare with "
           "what the daemon introspects as. Types are D-Bus signatures.", ""]
    out += [p + "\n" for p in _paragraphs(api.doc)]
    for interface in api.interfaces:
        short = interface.name.rsplit(".", 1)[-1]
        out += [f"## {interface.name}", ""] + [p + "\n" for p in _paragraphs(interface.doc)]
        for kind, title in (("method", "Methods"), ("signal", "Signals")):
            members = [m for m in interface.members if m.kind == kind]
            if not members:
                continue
            out += [f"### {title}", ""]
            for m in members:
                line = f"{m.name}({signature(m, 'in')})"
                if kind == "method":
                    line += f" → ({signature(m, 'out')})"
                out += [f"#### {short}.{m.name}", "", "```text", line, "```", ""]
                out += [p + "\n" for p in _paragraphs(m.doc)]
        properties = [m for m in interface.members if m.kind == "property"]
        if properties:
            out += ["### Properties", "",
                    "| Property | Type | Access | Changes | Description |", "|---|---|---|---|---|"]
            for m in properties:
                changes = {"const": "never", "invalidates": "invalidated", "false": "not "
                           "announced"}.get(m.emits_changed, "announced")
                out.append(f"| {code(m.name)} | {code(m.type)} | {m.access} | {changes} | "
                           f"{cell(m.doc)} |")
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def environment(facts: Facts) -> str:
    env = facts.environment
    out = ["# Environment variables", "",
           "The code has no single table of them: this page gathers them from where they "
           "are defined. The variables a command run on a claim gets are those "
           "`resourced.client.environment.claim_env` sets; the daemon's are its own "
           "`--help` table (`resourced/daemon/main.py`); the others are read where "
           "`resourced/docs/facts.py` says (`tests/unit/test_reference_docs.py` checks that "
           "every `RESOURCED_*` name in the code is on this page).", ""]
    for title, rows in (("Set for a command run on a claim", env.claimed),
                        ("Read by gpuctl, the clients and the services", env.clients),
                        ("Read by the daemon (resourced)", env.daemon)):
        out += [f"## {title}", "", "| Variable | Meaning |", "|---|---|"]
        out += [f"| {', '.join(code(n.strip()) for n in v.name.split(','))} | {cell(v.meaning)} |"
                for v in rows]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"
