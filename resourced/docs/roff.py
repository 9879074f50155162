"""The man pages, in roff with the man macros: gpuctl(1), resourced-mcp(1),
resourced.conf(5) and resourced(8).

Plain man(7) requests only (TH, SH, SS, TP, PP, RS/RE, nf/fi, B, I), every character
outside ASCII written as a groff escape, so the pages render alike under groff, mandoc
and man-db's preconv; no date in the title line, so the pages change only with the code.
"""

import ast

from resourced import config

from .facts import PACKAGE, Facts, Option, Program, Variable, signature
from .markdown import help_blocks

SEE_ALSO = {
    "gpuctl": ("1", "Share the GPUs of one machine: claim, run, release, and see who holds "
               "what"),
    "resourced-mcp": ("1", ""),
    "resourced.conf": ("5", "configuration file of the resourced daemon"),
    "resourced": ("8", "cooperative GPU allocator daemon on D-Bus"),
}


def pages(facts: Facts) -> dict[tuple[str, str], str]:
    return {
        ("gpuctl", "1"): gpuctl(facts),
        ("resourced-mcp", "1"): mcp(facts),
        ("resourced.conf", "5"): conf(facts),
        ("resourced", "8"): daemon(facts),
    }


def text(value: str) -> str:
    """Running text for roff: backslashes, hyphens and anything outside ASCII escaped."""
    out = []
    for char in value:
        if char == "\\":
            out.append("\\e")
        elif char == "-":
            out.append("\\-")
        elif ord(char) > 126 or (ord(char) < 32 and char != "\n"):
            out.append(f"\\[u{ord(char):04X}]")
        else:
            out.append(char)
    return "".join(out)


def line(value: str) -> str:
    """One input line of text: one that would start with a request character (. or ')
    or a space is guarded."""
    escaped = text(" ".join(value.split()))
    return "\\&" + escaped if escaped[:1] in (".", "'", " ") else escaped


def bold(value: str) -> str:
    return f"\\fB{text(value)}\\fR"


def italic(value: str) -> str:
    return f"\\fI{text(value)}\\fR"


class Page:
    def __init__(self, name: str, section: str, version: str, manual: str):
        self.lines = [f'.TH "{text(name.upper())}" "{section}" "" "resourced {text(version)}" '
                      f'"{manual}"',
                      ".nh", ".ad l"]  # no hyphenation or justification: options stay whole

    def request(self, *lines: str) -> "Page":
        self.lines += lines
        return self

    def section(self, title: str) -> "Page":
        return self.request(f".SH {title}")

    def paragraph(self, value: str) -> "Page":
        if value.strip():
            self.request(".PP", line(value))
        return self

    def verbatim(self, value: str) -> "Page":
        self.request(".PP", ".RS 4", ".nf")
        self.lines += ["\\&" + text(v) for v in value.splitlines()]
        return self.request(".fi", ".RE")

    def help(self, value: str) -> "Page":
        for verbatim, block in help_blocks(value):
            self.verbatim(block) if verbatim else self.paragraph(block)
        return self

    def item(self, tag: str, value: str) -> "Page":
        self.request(".TP", tag)
        if value.strip():
            self.request(line(value))
        return self

    def options(self, options: tuple[Option, ...]) -> "Page":
        for o in options:
            tag = ", ".join(bold(n) for n in o.names)
            if o.metavar:
                tag += " " + italic(o.metavar)
            extra = []
            if o.required:
                extra.append("Required.")
            elif o.default:
                extra.append(f"Default: {o.default}.")
            if o.multiple:
                extra.append("May be given more than once.")
            self.item(tag, " ".join([o.help, *extra]))
        return self

    def variables(self, rows: tuple[Variable, ...]) -> "Page":
        for v in rows:
            self.item(", ".join(bold(n.strip()) for n in v.name.split(",")), v.meaning)
        return self

    def see_also(self, *names: str) -> "Page":
        self.section("SEE ALSO")
        refs = [f"\\fB{text(n)}\\fR({SEE_ALSO[n][0]})" for n in names]
        return self.request(",\n".join(refs))

    def render(self) -> str:
        return "\n".join(self.lines) + "\n"


def _synopsis(page: Page, usage: str) -> None:
    program, _, rest = usage.partition(" ")
    page.section("SYNOPSIS").request(f".B {text(program)}")
    if rest:
        page.request(line(rest))


def gpuctl(facts: Facts) -> str:
    top, *commands = facts.commands
    page = Page("gpuctl", "1", facts.version, "User Commands")
    page.section("NAME").request(f"gpuctl \\- {text(top.summary.rstrip('.'))}")
    _synopsis(page, top.usage)
    page.section("DESCRIPTION").help(top.help)
    page.section("OPTIONS").options(top.options)
    page.section("COMMANDS")
    for c in commands:
        page.request(f'.SS "{text(" ".join(c.path[1:]))}"')
        page.request(".PP", f".B {text(c.path[0])}", line(" ".join(c.usage.split()[1:])))
        page.help(c.help)
        if c.subcommands:
            page.paragraph("Commands: " + ", ".join(c.subcommands) + ".")
        if c.options:
            page.request(".PP", "Options:")
            page.options(c.options)
    page.section("EXIT STATUS")
    for e in facts.exit_codes:
        page.item(bold(str(e.code)), e.meaning + (f" ({e.name})" if e.name else ""))
    page.section("ENVIRONMENT")
    page.paragraph("A command run on a claim (gpuctl run, gpuctl env, gpuctl shell, a booked "
                   "command) gets:")
    page.variables(facts.environment.claimed)
    page.paragraph("gpuctl and the clients read:")
    page.variables(facts.environment.clients)
    page.section("FILES")
    page.item(bold("$XDG_CONFIG_HOME/resourced/config.toml"),
              "The per-user configuration (default ~/.config/resourced/config.toml); see "
              "resourced.conf(5).")
    page.item(bold(str(config.SYSTEM_CONFIG)), "The machine's configuration.")
    page.see_also("resourced", "resourced.conf", "resourced-mcp")
    return page.render()


def mcp(facts: Facts) -> str:
    p = facts.mcp
    page = Page(p.name, "1", facts.version, "User Commands")
    page.section("NAME").request(f"{text(p.name)} \\- {text(p.description.rstrip('.'))}")
    _synopsis(page, p.usage)
    page.section("DESCRIPTION")
    for paragraph in p.epilog.split("\n\n"):
        page.paragraph(paragraph.replace("``", ""))
    page.section("OPTIONS").options(p.options)
    page.section("ENVIRONMENT")
    page.variables(tuple(v for v in facts.environment.clients
                         if v.name in ("RESOURCED_BUS", "RESOURCED_BUS_ADDRESS",
                                       "RESOURCED_SESSION")))
    page.see_also("gpuctl", "resourced")
    return page.render()


def conf(facts: Facts) -> str:
    page = Page("resourced.conf", "5", facts.version, "File Formats")
    page.section("NAME").request(f"resourced.conf \\- {SEE_ALSO['resourced.conf'][1]}")
    page.section("SYNOPSIS").request(f".B {text(str(config.SYSTEM_CONFIG))}", ".br",
                                     ".B $XDG_CONFIG_HOME/resourced/config.toml")
    page.section("DESCRIPTION")
    for paragraph in (config.__doc__ or "").split("\n\n"):
        if paragraph.strip().endswith("::") or paragraph.startswith("    "):
            continue  # the docstring's examples of error lines
        page.paragraph(paragraph.replace("``", ""))
    for s in facts.configuration:
        page.section(f'"{("[[" + s.name + "]]") if s.array else ("[" + s.name + "]")}"')
        page.paragraph(s.about.replace("``", ""))
        for k in s.keys:
            kind = k.type + (f", {k.unit}" if k.unit else "")
            default = "required" if k.required else f"default {k.default}"
            tag = f"{bold(k.name)} ({text(kind)}; {text(default)})"
            meaning = k.meaning.rstrip(".")
            page.item(tag, (meaning + ". " if meaning else "") + f"Allowed: {k.allowed}.")
    if facts.old_keys:
        page.section("EARLIER NAMES")
        for old, new in facts.old_keys.items():
            page.item(bold(f"daemon.{old}"), f"Read as daemon.{new}." if new
                      else "Read and not used.")
    page.see_also("resourced", "gpuctl")
    return page.render()


def _daemon_exit_codes() -> list[tuple[int, str]]:
    tree = ast.parse((PACKAGE / "daemon" / "main.py").read_text(encoding="utf-8"))
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and node.targets[0].id.startswith("EXIT_"):
            words = node.targets[0].id.removeprefix("EXIT_").lower().replace("_", " ")
            found.append((ast.literal_eval(node.value), words))
    return found


def daemon(facts: Facts) -> str:
    p: Program = facts.daemon
    page = Page("resourced", "8", facts.version, "System Administration")
    page.section("NAME").request(f"resourced \\- {SEE_ALSO['resourced'][1]}")
    _synopsis(page, p.usage)
    page.section("DESCRIPTION")
    page.paragraph(p.description)
    page.paragraph("It owns the bus name org.resourced, on the session bus for one user or "
                   "the system bus for a shared machine, hands out GPUs, and tells everyone "
                   "who holds what; gpuctl(1) and the Python client use it. The system "
                   "service is installed with gpuctl service enable --system.")
    page.section("OPTIONS").options(p.options)
    page.section("EXIT STATUS")
    for code, words in _daemon_exit_codes():
        page.item(bold(str(code)), words[:1].upper() + words[1:] + ".")
    page.section("ENVIRONMENT").variables(facts.environment.daemon)
    page.section("FILES")
    page.item(bold(str(config.SYSTEM_CONFIG)), "The system service's configuration; see "
              "resourced.conf(5).")
    page.section("D-BUS INTERFACES")
    page.paragraph(facts.bus.doc.split("\n\n")[0])
    for interface in facts.bus.interfaces:
        members = []
        for m in interface.members:
            if m.kind == "property":
                members.append(f"{m.name} ({m.type})")
            else:
                members.append(f"{m.name}({signature(m, 'in')})")
        page.item(bold(interface.name), "; ".join(members) + ".")
    page.see_also("gpuctl", "resourced.conf", "resourced-mcp")
    return page.render()
