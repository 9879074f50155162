"""Each method's options and each record have one table (``protocol.records``): the bus
interface documents every key of them, and no module spells a key outside its table."""

import ast
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from resourced.daemon.bus.options import parse_options
from resourced.errors import InvalidArgs
from resourced.protocol import records

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "dbus" / "org.resourced.xml"
TABLES = {name: kind for name, kind in vars(records).items()
          if isinstance(kind, tuple) and kind and isinstance(kind[0], records.Field)}


def _methods_with_options() -> dict[str, str]:
    """Manager method -> its documentation, for each that takes ``a{sv}`` options."""
    text = API.read_text()
    docs = {m.group(2): " ".join(m.group(1).split())
            for m in re.finditer(r'<!--(.*?)-->\s*<method name="(\w+)">', text, re.S)}
    manager = next(i for i in ET.fromstring(text).iter("interface")
                   if i.get("name") == "org.resourced.Manager")
    return {m.get("name"): docs.get(m.get("name"), "") for m in manager.iter("method")
            if any(a.get("direction") == "in" and a.get("type") == "a{sv}"
                   for a in m.iter("arg"))}


def test_every_method_with_options_has_its_table_and_documents_each_key():
    methods = _methods_with_options()
    assert set(records.OPTIONS) == set(methods)
    for name, kind in records.OPTIONS.items():
        told = " ".join(doc for other, doc in methods.items()  # with Book's: "the options of Book"
                        if set(records.OPTIONS[other]) <= set(kind)
                        or set(kind) <= set(records.OPTIONS[other]))
        for f in kind:
            assert re.search(rf"\b{f.wire} {re.escape(f.signature)}(?![\w{{])", told), (
                f"{name}'s option {f.wire} ({f.signature}) is not in dbus/org.resourced.xml")


@pytest.mark.parametrize("name", sorted(TABLES))
def test_each_table_names_each_field_once_in_both_spellings(name):
    kind = TABLES[name]
    assert len({f.wire for f in kind}) == len({f.key for f in kind}) == len(kind)
    for f in kind:
        assert re.fullmatch(r"[A-Z][A-Za-z]*", f.wire), f.wire
        assert re.fullmatch(r"[a-z][a-z_]*", f.key), f.key


def test_the_daemon_reads_options_by_the_table_and_names_the_known_ones():
    class Variant:
        def __init__(self, signature, value):
            self.signature, self.value = signature, value

    wire = records.options(records.STOP_OPTIONS, uid=1000, dry_run=True)
    assert parse_options({k: Variant(*v) for k, v in wire.items()},
                         records.STOP_OPTIONS) == {"uid": 1000, "dry_run": True}
    with pytest.raises(InvalidArgs, match="known: DryRun, Reason, Session, UID$"):
        parse_options({"Uid": Variant("u", 1)}, records.STOP_OPTIONS)
    with pytest.raises(TypeError, match="uid_"):
        records.options(records.STOP_OPTIONS, uid_=1)


def _member_names() -> set[str]:
    """Every method, property, signal and argument name of the bus interface."""
    tree = ET.fromstring(API.read_text())
    return {e.get("name") for tag in ("method", "property", "signal", "arg")
            for e in tree.iter(tag)}


def _keys_spelled(tree: ast.AST, wires: set[str]):
    """String constants in ``tree`` used as a key (subscript, dict key, comparison,
    ``.get``/``.pop``'s argument) that are a table's bus key."""
    for node in ast.walk(tree):
        found = []
        if isinstance(node, ast.Subscript):
            found = [node.slice]
        elif isinstance(node, ast.Dict):
            found = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Compare):
            found = [node.left, *node.comparators]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop") and node.args):
            found = [node.args[0]]
        for key in found:
            if isinstance(key, ast.Constant) and key.value in wires:
                yield key.lineno, key.value


def test_no_module_spells_an_option_or_grant_key_outside_its_table():
    """A property of the same name (``Mode``, ``UID``) is the interface's, not a record's:
    those may be spelled where the interface is."""
    wires = {f.wire for name, kind in TABLES.items() for f in kind
             if name.endswith(("_OPTIONS", "_OPTION")) or name == "GRANT"} - _member_names()
    assert {"QueueTimeoutUSec", "ReplyWhenGranted", "DryRun", "SinceUSec"} <= wires
    spelled = [f"{path.relative_to(ROOT)}:{line}: {key}"
               for path in sorted((ROOT / "resourced").rglob("*.py"))
               if path.name != "records.py"
               for line, key in _keys_spelled(ast.parse(path.read_text()), wires)]
    assert not spelled, "keys spelled outside protocol/records.py:\n" + "\n".join(spelled)


def test_the_claim_table_is_the_claim_objects_properties_and_status_claims_keys():
    """The Claim interface's properties are the table's fields but the JSON's own, with
    the same types; status --json's claims have the table's keys but the object's own."""
    import json

    claim = next(i for i in ET.fromstring(API.read_text()).iter("interface")
                 if i.get("name") == "org.resourced.Claim")
    properties = {p.get("name"): p.get("type") for p in claim.iter("property")}
    assert properties == {f.wire: f.signature for f in records.CLAIM
                          if f.key not in records.CLAIM_JSON_ONLY}
    schema = json.loads((ROOT / "schemas" / "gpuctl" / "status.json").read_text())
    keys = set(schema["properties"]["claims"]["items"]["properties"])
    assert keys == {f.key for f in records.CLAIM} - records.CLAIM_OBJECT_ONLY
