"""What the reference says, read from the code: nothing here is written twice.

* gpuctl's commands and options: the click tree of ``resourced.cli`` (hidden ones left out);
* the configuration's keys: the checker's tables in ``resourced.config`` (type, bounds,
  unit), the defaults and comments of its dataclasses;
* the exit codes: ``resourced.exits``, their meanings from gpuctl's own help;
* the D-Bus API: its golden copy ``dbus/org.resourced.xml``, doc comments included;
* the environment: what ``claim_env`` sets, the daemon's own table (``ENVIRONMENT`` in
  ``resourced/daemon/main.py``), and the variables of gpuctl and the clients below.

The daemon's and resourced-mcp's command lines are read from their source (``ast``), not
imported: nothing outside the daemon imports it (tests/unit/test_layout.py).

Whatever the output shows comes out the same with every click version pyproject.toml
allows (the lowest is tested too), so usage lines and metavars are made here, not by
click's help formatter.
"""

import ast
import dataclasses
import inspect
import io
import re
import tokenize
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import click

from resourced import __version__, config, exits
from resourced.client.environment import claim_env

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "resourced"


# --- gpuctl's commands ----------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]       # "--gpus", "-G"; a flag pair's off name after a "/"
    metavar: str                 # "" for a flag
    help: str
    default: str | None          # as a person would type it; None: none worth saying
    required: bool = False
    multiple: bool = False


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]        # ("gpuctl", "service", "enable")
    usage: str                   # "gpuctl service enable [OPTIONS]"
    summary: str                 # one line
    help: str                    # the docstring, click's markers kept (\b)
    options: tuple[Option, ...]
    arguments: tuple[str, ...]   # their metavars
    subcommands: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return " ".join(self.path)


@dataclass(frozen=True)
class Program:
    """A command line of argparse (resourced, resourced-mcp), read from its source."""

    name: str
    usage: str
    description: str
    options: tuple[Option, ...]
    epilog: str = ""


def commands() -> list[Command]:
    """gpuctl and each of its subcommands, depth first, in the order ``--help`` lists them."""
    from resourced.cli import COMMANDS, cli

    found: list[Command] = []

    def walk(command: click.Command, ctx: click.Context, path: tuple[str, ...], summary: str):
        # Not get_params: click keeps the help option of the first context it was made for
        # (a test's, without -h), so the page would depend on what ran before.
        params = [p for p in (*command.params, _help_option(ctx))
                  if not getattr(p, "hidden", False)]
        options = tuple(_option(p) for p in params if isinstance(p, click.Option))
        arguments = tuple(_argument(p) for p in params if isinstance(p, click.Argument))
        names: tuple[str, ...] = ()
        if isinstance(command, click.Group):
            names = tuple(n for n in command.list_commands(ctx)
                          if not getattr(command.get_command(ctx, n), "hidden", False))
        usage = " ".join([*path, *(["[OPTIONS]"] if options else []),
                          *(["COMMAND [ARGS]..."] if names else []), *arguments])
        help_text = _help(command.help or "")
        found.append(Command(path, usage, summary or _first_line(help_text), help_text,
                             options, arguments, names))
        for name in names:
            sub = command.get_command(ctx, name)
            short = COMMANDS[name][2] if command is cli else (sub.short_help or "")
            walk(sub, click.Context(sub, info_name=name, parent=ctx, **sub.context_settings),
                 (*path, name), short)

    # As gpuctl makes its contexts (make_context): with each command's settings (-h).
    walk(cli, click.Context(cli, info_name="gpuctl", **cli.context_settings), ("gpuctl",), "")
    return found


def _help_option(ctx: click.Context) -> click.Option:
    """The help option as gpuctl's contexts give every command (``help_option_names``)."""
    return click.Option(ctx.help_option_names, is_flag=True, expose_value=False,
                        help="Show this message and exit.")


def _help(text: str) -> str:
    """A docstring as click reads it: dedented, cut at ``\\f``."""
    return inspect.cleandoc(text.split("\f", 1)[0]).strip()


def _first_line(text: str) -> str:
    paragraph = text.split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def _unset(value) -> bool:
    """No default worth saying: none (click 8.3 and later have a sentinel for it), an empty
    one, or a flag's off."""
    return (value is None or value is False or value == "" or value == () or value == []
            or "UNSET" in repr(value) or callable(value))


def _shown(value) -> str:
    if value is True:
        return "on"
    if isinstance(value, (list, tuple)):
        return ", ".join(_shown(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _metavar(param: click.Parameter) -> str:
    if param.metavar:
        return param.metavar
    kind = param.type
    if isinstance(kind, click.Choice):
        return "[" + "|".join(str(c) for c in kind.choices) + "]"
    if isinstance(kind, click.types._NumberRangeBase):
        return {click.IntRange: "INTEGER", click.FloatRange: "FLOAT"}.get(type(kind), "NUMBER")
    if isinstance(kind, click.Path):
        return "PATH" if not kind.dir_okay or not kind.file_okay else "PATH"
    return kind.name.upper()


def _range(param: click.Parameter) -> str:
    kind = param.type
    if not isinstance(kind, click.types._NumberRangeBase):
        return ""
    low = None if kind.min is None else f"{'more than' if kind.min_open else 'at least'} " \
        f"{_shown(kind.min)}"
    high = None if kind.max is None else f"{'less than' if kind.max_open else 'at most'} " \
        f"{_shown(kind.max)}"
    return " and ".join(p for p in (low, high) if p)


def _option(param: click.Option) -> Option:
    names = tuple(param.opts)
    if param.secondary_opts:
        names = (*names, *param.secondary_opts)
    flag = param.is_flag or param.count
    help_text = " ".join((param.help or "").split())
    bounds = _range(param)
    if bounds:
        help_text = f"{help_text} ({bounds})" if help_text else bounds
    default = None if _unset(param.default) else _shown(param.default)
    if flag and not param.secondary_opts:
        default = None  # a flag is off unless given
    elif param.secondary_opts and param.default is None:
        default = None
    elif param.secondary_opts and default is not None:
        default = param.opts[0] if param.default else param.secondary_opts[0]
    return Option(names, "" if flag else _metavar(param), help_text, default,
                  bool(param.required), bool(param.multiple))


def _argument(param: click.Argument) -> str:
    name = _metavar(param) if param.metavar else param.name.upper()
    if param.nargs == -1 and not name.endswith("..."):
        name += "..."
    return name if param.required or param.metavar else f"[{name}]"


# --- the other programs ---------------------------------------------------------------------


def daemon_program() -> Program:
    source = PACKAGE / "daemon" / "main.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    epilog = _constant(tree, "ENVIRONMENT")
    options, description = _argparse(_function(tree, "parse_args"))
    usage = _docstring_usage(ast.get_docstring(tree) or "", "resourced")
    return Program("resourced", usage, description, options, epilog)


def mcp_program() -> Program:
    source = PACKAGE / "agents" / "mcp.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    options, description = _argparse(_function(tree, "main"))
    usage = _docstring_usage(ast.get_docstring(tree) or "", "resourced-mcp")
    return Program("resourced-mcp", usage, description, options,
                   _clean_docstring(ast.get_docstring(tree) or ""))


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"no function {name}: the docs generator reads its argparse options")


def _constant(tree: ast.Module, name: str) -> str:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"no constant {name}")


def _docstring_usage(doc: str, program: str) -> str:
    """The indented synopsis line of a module docstring (``    resourced [--session ...``)."""
    for line in doc.splitlines():
        if line.startswith("    ") and line.strip().startswith(program + " "):
            return " ".join(line.split())
    raise LookupError(f"the docstring has no synopsis line for {program}")


def _clean_docstring(doc: str) -> str:
    """A module docstring without its synopsis lines."""
    return "\n".join(line for line in doc.splitlines() if not line.startswith("    ")).strip()


def _argparse(function: ast.FunctionDef) -> tuple[tuple[Option, ...], str]:
    """The options of the ``add_argument`` calls in ``function``, and the parser's
    description, each value as the source writes it (a value that is not a literal, such
    as --version's f-string, is left out)."""
    options, description = [], ""
    for node in ast.walk(function):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        keywords = {k.arg: _literal(k.value) for k in node.keywords}
        if node.func.attr == "ArgumentParser":
            description = keywords.get("description") or ""
        if node.func.attr != "add_argument":
            continue
        names = tuple(_literal(a) for a in node.args)
        action = keywords.get("action")
        if action == "version":
            help_text = "Print the version and exit."
        else:
            help_text = keywords.get("help") or ""
        help_text = help_text[:1].upper() + help_text[1:]
        if help_text and not help_text.endswith("."):
            help_text += "."
        flag = action in ("store_true", "store_false", "store_const", "version")
        metavar = "" if flag else keywords.get("metavar") or (
            "[" + "|".join(keywords["choices"]) + "]" if keywords.get("choices")
            else names[-1].lstrip("-").upper())
        default = keywords.get("default")
        options.append(Option(names, metavar, help_text,
                              None if _unset(default) else _shown(default)))
    options.append(Option(("-h", "--help"), "", "Print the help and exit.", None))
    return tuple(sorted(options, key=lambda o: o.names[-1] in ("--help", "--version"))), \
        description


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


# --- the configuration ----------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    name: str
    type: str
    default: str       # as TOML writes it; "" when required
    unit: str
    allowed: str       # the bounds or the values, as the checker words them
    meaning: str
    required: bool = False


@dataclass(frozen=True)
class Section:
    name: str          # daemon, gpu
    array: bool        # [[gpu]] rather than [daemon]
    about: str
    keys: tuple[Key, ...]


def configuration() -> list[Section]:
    """Each section of the file, in the order the checker knows them."""
    entries = {"daemon": config.DaemonConfig, "runner": config.RunnerConfig,
               "mcp": config.McpConfig,
               "slurm": config.SlurmConfig, "metrics": config.MetricsConfig,
               "gpu": config.GpuEntry, "check": config.CheckEntry, "pool": config.PoolEntry}
    schemas = {name: getattr(config, f"_{name.upper()}") for name in config._TABLES} | \
        config._ARRAYS
    sections = []
    for name, schema in schemas.items():
        if name not in entries:
            raise LookupError(f"the config section {name} has no dataclass in "
                              "resourced/docs/facts.py")
        cls = entries[name]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        comments = _field_comments(cls)
        keys = []
        for key, (check, required) in schema.items():
            if key not in fields:
                raise LookupError(f"{name}.{key} is no field of {cls.__name__}")
            kind, unit, allowed = _kind(f"{name}.{key}", check)
            default = "" if required else _toml(_default(fields[key]))
            keys.append(Key(key, kind, default, unit, allowed, comments.get(key, ""), required))
        about = " ".join(_help(cls.__doc__ or "").split())
        sections.append(Section(name, name in config._ARRAYS, about, tuple(keys)))
    return sections


OLD_KEYS = config._OLD_DAEMON
"""The predecessor's [daemon] keys, still read: old name -> its name now (None: unused)."""


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _toml(value) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_UNITS = {id(config._PCT): "percent", id(config._GIB): "GiB", id(config._GPU_HOURS): "GPU-hours"}


def _kind(key: str, check) -> tuple[str, str, str]:
    """(type, unit, allowed values) of a key, from the checker's function for it."""
    if check is config._directory:
        return "string", "path", 'an absolute path, or "" for the default'
    if check is config._boolean:
        return "boolean", "", "true or false"
    if check is config._index:
        return "integer", "", f"a whole number from 0 to {2**31 - 1}"
    if check is config._user_names:
        return "array of strings", "", "user names"
    if check is config._commands:
        return "array of strings", "", "commands: each a program (a name on PATH or a path) " \
            "and any first arguments"
    if check is config._folders:
        return "array of strings", "path", 'absolute folders, or "~/..." (the home folder)'
    if check is config._textfile:
        return "string", "path", 'an absolute path ending in .prom, or "" for none'
    if check is config._capacity:
        return "integer or string", "bytes or count", \
            f'a positive whole number, or an amount like "64G" (at most {config.MAX_AMOUNT})'
    if check is config._slurm_gpus:
        return 'string or array', "", '"all", or a list of GPUs (UUID, alias or index)'
    if check is None and key.endswith(".type"):
        return "string", "", " or ".join(f'"{t}"' for t in config.CHECK_TYPES)
    if check is None and key.endswith(".path"):
        return "string", "path", "an absolute path (disk only)"
    made_by = getattr(check, "__qualname__", "").split(".")[0]
    closure = inspect.getclosurevars(check).nonlocals if made_by else {}
    if made_by == "_string":
        return "string", "", closure["wanted"]
    if made_by == "_number":
        return "number", _UNITS.get(id(check), ""), closure["wanted"]
    if made_by == "_seconds":
        wanted = inspect.getclosurevars(closure["number"]).nonlocals["wanted"]
        return "number or duration", "seconds", \
            f'{wanted} (seconds, or a duration such as "30m" or "2d")'
    raise LookupError(f"{key}: the docs generator does not know its checker {check!r}; "
                      "describe it in resourced/docs/facts.py (_kind)")


def _field_comments(cls) -> dict[str, str]:
    """Each field's comment in the class's source: the lines of comment right above it
    and the one at the end of its line."""
    source = inspect.getsource(cls)
    found, above = {}, []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, token in enumerate(tokens):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            if token.line.strip().startswith("#"):
                above.append(text)
            else:  # at the end of a field's line
                line = token.line.strip()
                name = re.match(r"(\w+)\s*:", line)
                if name:
                    found[name.group(1)] = " ".join([*found.get(name.group(1), "").split(
                        "\0"), text]).strip()
        elif token.type == tokenize.NAME and tokens[i + 1].string == ":" and \
                token.start[1] == 4 and token.line[:4].isspace():
            if above:
                found[token.string] = " ".join(above)
            above = []
        elif token.type == tokenize.NL and not token.line.strip():
            above = []
    return {k: _sentence(v) for k, v in found.items()}


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text[:1].upper() + text[1:] if text else ""


# --- the exit codes -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExitCode:
    code: int
    constant: str      # EXIT_USAGE
    name: str          # the JSON error's code (exits.EXIT_NAMES)
    meaning: str       # from gpuctl --help
    errors: tuple[str, ...]   # the error classes that end in it


def exit_codes() -> list[ExitCode]:
    from resourced.cli import cli

    meanings = help_exit_codes(cli.help or "")
    found = []
    for constant, code in vars(exits).items():
        if not constant.startswith("EXIT_") or not isinstance(code, int):
            continue
        errors = tuple(cls.code for cls, c in exits.EXIT_CODES.items() if c == code)
        found.append(ExitCode(code, constant, exits.EXIT_NAMES.get(code, "") if code else "",
                              meanings.get(code, ""), errors))
    return sorted(found, key=lambda e: e.code)


def help_exit_codes(text: str) -> dict[int, str]:
    """The codes ``gpuctl --help`` lists (``Exit codes: 0 ok, 1 other error, ...``)."""
    match = re.search(r"Exit codes:(.*?)\.(?:\s|$)", " ".join(text.split()))
    if not match:
        return {}
    pairs = re.split(r",\s*(?=\d+ )", match.group(1).strip())
    return {int(code): meaning.strip() for code, meaning in
            (pair.split(" ", 1) for pair in pairs)}


# --- the D-Bus API --------------------------------------------------------------------------


@dataclass(frozen=True)
class Arg:
    name: str
    type: str
    direction: str = "in"


@dataclass(frozen=True)
class Member:
    kind: str          # method, signal, property
    name: str
    doc: str
    args: tuple[Arg, ...] = ()
    type: str = ""     # a property's
    access: str = ""
    emits_changed: str = ""   # a property's EmitsChangedSignal ("" for true: the default)


@dataclass(frozen=True)
class Interface:
    name: str
    doc: str
    members: tuple[Member, ...]


@dataclass(frozen=True)
class BusApi:
    doc: str
    interfaces: tuple[Interface, ...]


BUS_XML = Path("dbus", "org.resourced.xml")


def bus_api() -> BusApi:
    from resourced.linux.install import source_dir

    parser = ET.XMLParser(target=ET.TreeBuilder(insert_comments=True))
    text = (source_dir() / BUS_XML).read_text(encoding="utf-8")
    # The header comment lies before <node>, outside what the tree keeps.
    head = re.search(r"<!--(.*?)-->\s*<node", text, re.S)
    root = ET.fromstring(text, parser=parser)
    interfaces = []
    for element, doc in _documented(root):
        if element.tag != "interface":
            continue
        members = []
        for child, child_doc in _documented(element):
            if child.tag not in ("method", "signal", "property"):
                continue
            args = tuple(Arg(a.get("name", ""), a.get("type", ""),
                             a.get("direction", "out" if child.tag == "method" else ""))
                         for a in child if a.tag == "arg")
            emits = next((a.get("value", "") for a in child if a.tag == "annotation" and
                          a.get("name") == "org.freedesktop.DBus.Property.EmitsChangedSignal"),
                         "")
            members.append(Member(child.tag, child.get("name", ""), child_doc, args,
                                  child.get("type", ""), child.get("access", ""), emits))
        interfaces.append(Interface(element.get("name", ""), doc, tuple(members)))
    return BusApi(_comment(head.group(1)) if head else "", tuple(interfaces))


def _documented(parent: ET.Element):
    """Each element under ``parent`` with the comment right before it ("" for none)."""
    doc = ""
    for child in parent:
        if child.tag is ET.Comment:
            doc = _comment(child.text or "")
            continue
        yield child, doc
        doc = ""


def _comment(text: str) -> str:
    """A comment's text in paragraphs (a blank line between), each on one line."""
    lines = inspect.cleandoc(text).splitlines()
    paragraphs, current = [], []
    for line in lines:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def signature(member: Member, direction: str) -> str:
    return ", ".join(f"{a.type} {a.name}" for a in member.args
                     if member.kind != "method" or a.direction == direction)


# --- the environment ------------------------------------------------------------------------


@dataclass(frozen=True)
class Variable:
    name: str
    meaning: str


@dataclass(frozen=True)
class Environment:
    claimed: tuple[Variable, ...]        # what a command run on a claim gets
    clients: tuple[Variable, ...]        # what gpuctl, the clients and the services read
    daemon: tuple[Variable, ...]         # what the daemon reads (its own table)


# What each variable that claim_env sets means; the names it sets come from claim_env itself.
CLAIMED = {
    "CUDA_VISIBLE_DEVICES": "The claim's GPUs, by UUID (gpuctl run --index, gpuctl env "
                            "--index: their indices in PCI bus order); empty for a claim "
                            "without GPUs, so that a CPU job cannot wander onto a GPU.",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID, so that indices mean the same to CUDA as to nvidia-smi.",
    "RESOURCED_ALLOCATION": "The claim's reference (for a booked command: the booking's).",
    "RESOURCED_GPU_UUIDS": "The GPUs' UUIDs, comma-separated, whatever the form of "
                           "CUDA_VISIBLE_DEVICES.",
    "RESOURCED_VRAM_BYTES": "A VRAM share: the share, in bytes.",
    "XLA_PYTHON_CLIENT_MEM_FRACTION": "A VRAM share: the fraction of the GPU's memory JAX "
                                      "may preallocate.",
    "TF_FORCE_GPU_ALLOW_GROWTH": "A VRAM share: true, so that TensorFlow allocates as it "
                                 "goes instead of taking the whole GPU.",
    "RESOURCED_POOLS": "The pool amounts, such as cpu=8,ram=34359738368.",
    "OMP_NUM_THREADS": "With a cpu amount: that many threads.",
    "MKL_NUM_THREADS": "With a cpu amount: that many threads.",
}
ALSO_CLAIMED = {
    "RESOURCED_SESSION": "The agent session of the claim or booking, when it has one "
                         "(gpuctl run on a claim, a booked command), so that what the "
                         "command asks for belongs to the same session.",
}
CLIENTS = {
    "RESOURCED_BUS": "Which bus gpuctl, the Python client, resourced-mcp and the services "
                     "use when no --bus is given: session, system or shared.",
    "RESOURCED_BUS_ADDRESS": "The address of a shared bus (else the directory gpuctl connect "
                             "wrote into $XDG_CONFIG_HOME/resourced/client.toml).",
    "RESOURCED_SESSION": "The agent session a claim or booking belongs to when --session is "
                         "not given (else the Unix session of the owner process); "
                         "sub-agents inherit it.",
    "RESOURCED_ALLOCATION": "Set inside gpuctl run: the claim a nested gpuctl shell, or the "
                            "pytest plugin, uses instead of claiming again.",
    "RESOURCED_CONFIG": "The configuration file, when no --config is given (gpuctl config "
                        "check, gpuctl runner, gpuctl service enable, the daemon).",
    "RESOURCED_RELEASE_WAIT": "gpuctl run: how many seconds to wait for the driver to clear "
                              "the GPUs before releasing anyway, with a warning (default 10).",
    "RESOURCED_SHELL_RECHECK": "The shell hook (gpuctl shell init): the most seconds between "
                               "two looks at the daemon (default 60).",
    "NO_COLOR": "Set to anything: no colour (gpuctl --color auto).",
    "TERM": "dumb: no colour (gpuctl --color auto).",
    "XDG_CONFIG_HOME": "Where the per-user configuration and client.toml are "
                       "(default ~/.config).",
    "XDG_RUNTIME_DIR": "Where the session bus and the shell hook's stamp are.",
    "DBUS_SESSION_BUS_ADDRESS": "The session bus.",
    "SLURM_JOB_ID": "gpuctl slurm prolog and epilog: the job (set by slurmd).",
    "SLURM_JOB_UID": "gpuctl slurm prolog: the job's user (set by slurmd).",
    "SLURM_JOB_NAME": "gpuctl slurm prolog: the job's name (set by slurmd).",
}


def environment() -> Environment:
    sample = {"gpu_uuids": ["GPU-0"], "pci_indices": [0], "gpu_indices": [0], "ref": "r",
              "vram_bytes": 1, "gpu_memory_bytes": [2], "pools": {"cpu": 1, "ram": 1}}
    claimed = []
    for name in claim_env(sample):
        if name not in CLAIMED:
            raise LookupError(f"claim_env sets {name}: say what it means in CLAIMED "
                              "(resourced/docs/facts.py)")
        claimed.append(Variable(name, CLAIMED[name]))
    claimed += [Variable(n, m) for n, m in ALSO_CLAIMED.items()]
    daemon_table = _constant(ast.parse((PACKAGE / "daemon" / "main.py").read_text(
        encoding="utf-8")), "ENVIRONMENT")
    return Environment(tuple(claimed), tuple(Variable(n, m) for n, m in CLIENTS.items()),
                       tuple(_table(daemon_table)))


def _table(text: str) -> list[Variable]:
    """The rows of a help table (``  NAME[, NAME]  meaning``) under its heading."""
    rows = []
    for line in text.splitlines()[1:]:
        match = re.match(r"\s+([A-Z_][A-Z0-9_, ]*[A-Z0-9_])\s{2,}(.*)", line) or \
            re.match(r"\s+([A-Z_][A-Z0-9_]*)\s+(.*)", line)
        if match:
            rows.append(Variable(match.group(1), _sentence(match.group(2)).rstrip(".") + "."))
    return rows


# --- all of it ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    version: str
    commands: tuple[Command, ...]
    daemon: Program
    mcp: Program
    configuration: tuple[Section, ...]
    exit_codes: tuple[ExitCode, ...]
    bus: BusApi
    environment: Environment
    old_keys: dict = field(default_factory=dict)


def gather() -> Facts:
    return Facts(__version__, tuple(commands()), daemon_program(), mcp_program(),
                 tuple(configuration()), tuple(exit_codes()), bus_api(), environment(),
                 dict(OLD_KEYS))
