import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from resourced import config as config_module
from resourced.config import (
    CheckEntry,
    Config,
    ConfigError,
    DaemonConfig,
    GpuEntry,
    McpConfig,
    PoolEntry,
    RunnerConfig,
    find_config,
    load_config,
    parse_config,
    reload_changes,
)
from resourced.errors import ResourcedError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "config.toml"
SOURCE = "/etc/resourced/config.toml"


def parse(text: str) -> Config:
    return parse_config(text, SOURCE)


def error(text: str, key: str | None) -> str:
    """The one-line message ``text`` is refused with; checks it names the file and key."""
    with pytest.raises(ConfigError) as info:
        parse(text)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{SOURCE}: ")
    assert info.value.source == SOURCE
    assert info.value.key == key
    if key is not None:
        assert message.startswith(f"{SOURCE}: {key}: ")
    return message


# --- defaults and a full file ------------------------------------------------------------


def test_no_file_means_the_defaults():
    assert load_config(None) == Config()
    assert Config().source == ""
    assert Config().daemon == DaemonConfig(
        runtime_dir="", probe_timeout=10, sample_interval=30, dead_owner_grace=600,
        access_group="resourced", persist=True,
    )
    assert (Config().gpus, Config().checks, Config().pools) == ((), (), ())


@pytest.mark.parametrize("text", ["", "# nothing\n", "[daemon]\n"])
def test_an_empty_file_means_the_defaults(text):
    assert parse(text) == Config(source=SOURCE)


def test_a_full_file():
    cfg = parse(
        """
        [daemon]
        runtime_dir = "/run/resourced-test"
        probe_timeout = 2.5
        sample_interval = 5
        dead_owner_grace = 0
        access_group = "gpuusers"
        persist = false

        [[gpu]]
        uuid = "GPU-aaaa"
        alias = "big_one-1"
        index = 0

        [[gpu]]
        uuid = "GPU-bbbb"

        [[check]]
        name = "ram"
        type = "ram"
        warn_free_pct = 15
        stop_free_pct = 10
        warn_used_pct = 80
        stop_used_pct = 80

        [[check]]
        name = "scratch"
        type = "disk"
        path = "/scratch"
        warn_free_gib = 100
        stop_free_gib = 20.5

        [[pool]]
        name = "licences"
        capacity = 4

        [[pool]]
        name = "scratch.space"
        capacity = "1.5T"
        """
    )
    assert cfg == Config(
        daemon=DaemonConfig("/run/resourced-test", 2.5, 5.0, 0.0, "gpuusers", False),
        gpus=(GpuEntry("GPU-aaaa", "big_one-1", 0), GpuEntry("GPU-bbbb")),
        checks=(
            CheckEntry("ram", "ram", warn_free_pct=15, stop_free_pct=10, warn_used_pct=80,
                       stop_used_pct=80),
            CheckEntry("scratch", "disk", "/scratch", warn_free_gib=100, stop_free_gib=20.5),
        ),
        pools=(PoolEntry("licences", 4), PoolEntry("scratch.space", 3 * 1024**4 // 2, "bytes")),
        source=SOURCE,
    )
    assert isinstance(cfg.daemon.probe_timeout, float)
    assert isinstance(cfg.daemon.sample_interval, float)


def test_the_runners_grace_is_30_s_unless_the_file_says():
    assert Config().runner == RunnerConfig(grace=30.0)
    assert parse("[runner]\ngrace = 0\n").runner.grace == 0.0
    assert parse("[runner]\ngrace = 90.5\n").runner.grace == 90.5
    assert parse("[runner]\n").runner == RunnerConfig()
    assert error("[runner]\ngrase = 60\n", None) == (
        f"{SOURCE}: unknown key runner.grase (did you mean grace?)")


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().daemon.probe_timeout = 1


def test_as_dict_is_plain_data():
    cfg = parse('[[gpu]]\nuuid = "GPU-a"\n[[pool]]\nname = "p"\ncapacity = "1K"\n')
    data = cfg.as_dict()
    assert data["gpus"] == [{"uuid": "GPU-a", "alias": None, "index": None}]
    assert data["pools"] == [{"name": "p", "capacity": 1024, "unit": "bytes"}]
    assert data["checks"] == []
    assert data["daemon"]["probe_timeout"] == 10
    assert data["source"] == SOURCE


# --- every kind of error -----------------------------------------------------------------


def test_config_error_is_its_own_exception():
    assert issubclass(ConfigError, Exception)
    assert not issubclass(ConfigError, ResourcedError)


@pytest.mark.parametrize(
    "text, where",
    [
        ("[daemon]\nprobe_timeout = \n", "at line 2, column 17"),
        ("[daemon\n", "at line 1, column 8"),
        ("[daemon]\npersist = yes\n", "at line 2, column 11"),
        ('[daemon]\nprobe_timeout = 1\nprobe_timeout = 2\n', None),
    ],
)
def test_bad_toml(text, where):
    message = error(text, None)
    assert message.startswith(f"{SOURCE}: invalid TOML ")
    if where:
        assert f"invalid TOML {where}: " in message
    assert re.search(r"invalid TOML (at line \d+, column \d+|at end of document): \S", message)


@pytest.mark.parametrize(
    "text, key",
    [
        ("[daemon]\nsample_intervall = 30\n", "daemon.sample_intervall"),
        ('[[gpu]]\nuuid = "GPU-a"\nname = "x"\n', "gpu[0].name"),
        ('[[check]]\nname = "r"\ntype = "ram"\nwarn_free_gb = 1\n', "check[0].warn_free_gb"),
        ('[[pool]]\nname = "p"\ncapacity = 1\nunits = "B"\n', "pool[0].units"),
        ("probe_timeout = 10\n", "probe_timeout"),
        ("[daemon.extra]\nx = 1\n", "daemon.extra"),
    ],
)
def test_unknown_key(text, key):
    assert error(text, None).startswith(f"{SOURCE}: unknown key {key}")


def test_unknown_key_suggests_the_near_miss():
    message = error("[daemon]\nsample_intervall = 30\n", None)
    assert message == (
        f"{SOURCE}: unknown key daemon.sample_intervall (did you mean sample_interval?)"
    )


@pytest.mark.parametrize(
    "text, shown",
    [
        ("[limits]\nram = 1\n", "[limits]"),
        ("[[gpus]]\nuuid = \"GPU-a\"\n", "[[gpus]] (did you mean [[gpu]]?)"),
        ("[deamon]\npersist = true\n", "[deamon] (did you mean [daemon]?)"),
        ("[runners]\ngrace = 1\n", "[runners] (did you mean [runner]?)"),
    ],
)
def test_unknown_section(text, shown):
    assert error(text, None) == f"{SOURCE}: unknown section {shown}"


@pytest.mark.parametrize(
    "text, key, problem",
    [
        ('[daemon]\nprobe_timeout = "abc"\n', "daemon.probe_timeout",
         "must be seconds or a duration like 30m, 2h, 1d2h, 1w, 2:00:00 or 1-12:00:00, "
         "not 'abc'"),
        ('[daemon]\nprobe_timeout = "2h"\n', "daemon.probe_timeout",
         "must be a number greater than 0 and at most 3600, not '2h'"),
        ("[daemon]\nprobe_timeout = true\n", "daemon.probe_timeout",
         "must be a number greater than 0 and at most 3600, not true"),
        ("[daemon]\nsample_interval = [1]\n", "daemon.sample_interval",
         "must be a number greater than 0 and at most 86400, not an array"),
        ("[daemon]\ndead_owner_grace = false\n", "daemon.dead_owner_grace",
         "must be a number from 0 to 315360000, not false"),
        ("[daemon]\nruntime_dir = 1\n", "daemon.runtime_dir", "must be an absolute path"),
        ("[daemon]\naccess_group = 100\n", "daemon.access_group",
         "must be a valid group name, not 100"),
        ('[daemon]\npersist = "yes"\n', "daemon.persist", "must be true or false, not 'yes'"),
        ("[daemon]\npersist = 1\n", "daemon.persist", "must be true or false, not 1"),
        ("[[gpu]]\nuuid = 5\n", "gpu[0].uuid", "must be a non-empty string"),
        ('[[gpu]]\nuuid = "GPU-a"\nalias = 0\n', "gpu[0].alias", "letters, digits"),
        ('[[gpu]]\nuuid = "GPU-a"\nindex = "0"\n', "gpu[0].index",
         "must be a whole number from 0 to 2147483647, not '0'"),
        ('[[gpu]]\nuuid = "GPU-a"\nindex = 1.0\n', "gpu[0].index", "whole number"),
        ('[[gpu]]\nuuid = "GPU-a"\nindex = true\n', "gpu[0].index", "not true"),
        ("[[check]]\nname = 1\ntype = \"ram\"\n", "check[0].name", "must be a non-empty string"),
        ('[[check]]\nname = "r"\ntype = 1\n', "check[0].type", 'must be "ram" or "disk", not 1'),
        ('[[check]]\nname = "d"\ntype = "disk"\npath = 1\n', "check[0].path",
         "must be an absolute path, not 1"),
        ('[[check]]\nname = "r"\ntype = "ram"\nwarn_free_pct = "15%"\n',
         "check[0].warn_free_pct", "must be a number from 0 to 100, not '15%'"),
        ('[[check]]\nname = "r"\ntype = "ram"\nstop_free_gib = true\n',
         "check[0].stop_free_gib", "must be a number from 0 to 1073741824, not true"),
        ('[[pool]]\nname = 1\ncapacity = 1\n', "pool[0].name", "lower-case letters"),
        ('[[pool]]\nname = "p"\ncapacity = true\n', "pool[0].capacity",
         'must be a positive whole number or an amount like "64G", not true'),
        ('[[pool]]\nname = "p"\ncapacity = 1.5\n', "pool[0].capacity", "not 1.5"),
        ('[[pool]]\nname = "p"\ncapacity = "lots"\n', "pool[0].capacity", "not 'lots'"),
        ("[daemon]\nprobe_timeout = 1979-05-27\n", "daemon.probe_timeout", "not 1979-05-27"),
        ('[runner]\ngrace = "2d"\n', "runner.grace",
         "must be a number from 0 to 86400, not '2d'"),
        ("[runner]\ngrace = true\n", "runner.grace", "not true"),
    ],
)
def test_wrong_type(text, key, problem):
    assert problem in error(text, key)


@pytest.mark.parametrize(
    "text, key, problem",
    [
        ("[daemon]\nprobe_timeout = 0\n", "daemon.probe_timeout",
         "must be a number greater than 0 and at most 3600, not 0"),
        ("[daemon]\nprobe_timeout = -1.5\n", "daemon.probe_timeout", "not -1.5"),
        ("[daemon]\nprobe_timeout = inf\n", "daemon.probe_timeout", "not inf"),
        ("[daemon]\nsample_interval = nan\n", "daemon.sample_interval", "not nan"),
        ("[daemon]\nsample_interval = 0\n", "daemon.sample_interval", "greater than 0"),
        ("[daemon]\nsample_interval = 1e308\n", "daemon.sample_interval",
         "must be a number greater than 0 and at most 86400, not 1e+308"),
        ("[daemon]\nlongest_booking = 1e12\n", "daemon.longest_booking",
         "must be a number from 0 to 315360000, not 1000000000000.0"),
        ("[daemon]\ndead_owner_grace = -1\n", "daemon.dead_owner_grace",
         "must be a number from 0 to 315360000, not -1"),
        ('[daemon]\nruntime_dir = "run/resourced"\n', "daemon.runtime_dir",
         'must be an absolute path, or "" for the default, not \'run/resourced\''),
        ('[daemon]\naccess_group = ""\n', "daemon.access_group", "valid group name"),
        ('[daemon]\naccess_group = "gpu users"\n', "daemon.access_group", "valid group name"),
        ('[daemon]\naccess_group = "1gpu"\n', "daemon.access_group", "valid group name"),
        (f'[daemon]\naccess_group = "{"g" * 33}"\n', "daemon.access_group", "valid group name"),
        ('[[gpu]]\nuuid = ""\n', "gpu[0].uuid", "must be a non-empty string"),
        ('[[gpu]]\nuuid = "GPU a"\n', "gpu[0].uuid", "without spaces"),
        ('[[gpu]]\nuuid = "GPU-a"\nalias = "gpu 0"\n', "gpu[0].alias",
         "letters, digits, '_' and '-' only, not 'gpu 0'"),
        ('[[gpu]]\nuuid = "GPU-a"\nalias = ""\n', "gpu[0].alias", "not ''"),
        ('[[gpu]]\nuuid = "GPU-a"\nindex = -1\n', "gpu[0].index", "not -1"),
        ('[[check]]\nname = ""\ntype = "ram"\n', "check[0].name", "non-empty"),
        ('[[check]]\nname = "c"\ntype = "cpu"\n', "check[0].type",
         "must be \"ram\" or \"disk\", not 'cpu'"),
        ('[[check]]\nname = "d"\ntype = "disk"\npath = "data"\n', "check[0].path",
         "must be an absolute path, not 'data'"),
        ('[[check]]\nname = "r"\ntype = "ram"\nwarn_free_pct = 101\n',
         "check[0].warn_free_pct", "must be a number from 0 to 100, not 101"),
        ('[[check]]\nname = "r"\ntype = "ram"\nstop_used_pct = -0.5\n',
         "check[0].stop_used_pct", "not -0.5"),
        ('[[check]]\nname = "r"\ntype = "ram"\nwarn_free_gib = -1\n',
         "check[0].warn_free_gib", "must be a number from 0 to 1073741824, not -1"),
        ('[[pool]]\nname = "Big"\ncapacity = 1\n', "pool[0].name", "not 'Big'"),
        ('[[pool]]\nname = "-p"\ncapacity = 1\n', "pool[0].name", "starting with"),
        ('[[pool]]\nname = "p"\ncapacity = 0\n', "pool[0].capacity", "not 0"),
        ('[[pool]]\nname = "p"\ncapacity = -4\n', "pool[0].capacity", "not -4"),
        ('[[pool]]\nname = "p"\ncapacity = "-4G"\n', "pool[0].capacity", "not '-4G'"),
        ('[[pool]]\nname = "p"\ncapacity = "0G"\n', "pool[0].capacity", "not '0G'"),
        ("[runner]\ngrace = -1\n", "runner.grace", "must be a number from 0 to 86400, not -1"),
        ("[runner]\ngrace = 86401\n", "runner.grace", "not 86401"),
    ],
)
def test_impossible_value(text, key, problem):
    assert problem in error(text, key)


@pytest.mark.parametrize(
    "text, key",
    [
        ('[[gpu]]\nalias = "a"\n', "gpu[0].uuid"),
        ('[[gpu]]\nuuid = "GPU-a"\n[[gpu]]\nindex = 1\n', "gpu[1].uuid"),
        ('[[check]]\ntype = "ram"\n', "check[0].name"),
        ('[[check]]\nname = "r"\n', "check[0].type"),
        ('[[pool]]\ncapacity = 1\n', "pool[0].name"),
        ('[[pool]]\nname = "p"\n', "pool[0].capacity"),
    ],
)
def test_missing_required(text, key):
    assert error(text, key) == f"{SOURCE}: {key}: required"


@pytest.mark.parametrize(
    "text, key, shown",
    [
        ('[[gpu]]\nuuid = "GPU-a"\n[[gpu]]\nuuid = "GPU-b"\n[[gpu]]\nuuid = "GPU-a"\n',
         "gpu[2].uuid", "duplicate 'GPU-a' (also gpu[0])"),
        ('[[gpu]]\nuuid = "GPU-ab"\n[[gpu]]\nuuid = "gpu-AB"\n', "gpu[1].uuid",
         "duplicate 'gpu-AB' (also gpu[0])"),
        ('[[gpu]]\nuuid = "GPU-a"\nalias = "x"\n[[gpu]]\nuuid = "GPU-b"\nalias = "x"\n',
         "gpu[1].alias", "duplicate 'x' (also gpu[0])"),
        ('[[gpu]]\nuuid = "GPU-a"\nindex = 3\n[[gpu]]\nuuid = "GPU-b"\nindex = 3\n',
         "gpu[1].index", "duplicate 3 (also gpu[0])"),
        ('[[check]]\nname = "m"\ntype = "ram"\n[[check]]\nname = "m"\ntype = "disk"\n'
         'path = "/"\n', "check[1].name", "duplicate 'm' (also check[0])"),
        ('[[pool]]\nname = "p"\ncapacity = 1\n[[pool]]\nname = "p"\ncapacity = 2\n',
         "pool[1].name", "duplicate 'p' (also pool[0])"),
    ],
)
def test_duplicates(text, key, shown):
    assert error(text, key) == f"{SOURCE}: {key}: {shown}"


def test_aliases_and_indices_may_be_left_out_on_several_gpus():
    cfg = parse('[[gpu]]\nuuid = "GPU-a"\n[[gpu]]\nuuid = "GPU-b"\n')
    assert [g.alias for g in cfg.gpus] == [None, None]


def test_disk_without_path():
    text = '[[check]]\nname = "r"\ntype = "ram"\n[[check]]\nname = "d"\ntype = "disk"\n'
    assert error(text, "check[1].path") == f'{SOURCE}: check[1].path: required for type "disk"'


def test_ram_with_path():
    text = '[[check]]\nname = "r"\ntype = "ram"\npath = "/"\n'
    assert error(text, "check[0].path") == f'{SOURCE}: check[0].path: not allowed for type "ram"'


@pytest.mark.parametrize(
    "limits, key, problem",
    [
        ("warn_free_gib = 10\nstop_free_gib = 20", "check[0].stop_free_gib",
         "must be at most warn_free_gib (10), not 20"),
        ("warn_free_pct = 10\nstop_free_pct = 10.5", "check[0].stop_free_pct",
         "must be at most warn_free_pct (10), not 10.5"),
        ("warn_used_pct = 90\nstop_used_pct = 80", "check[0].stop_used_pct",
         "must be at least warn_used_pct (90), not 80"),
    ],
)
def test_inconsistent_thresholds(limits, key, problem):
    text = f'[[check]]\nname = "d"\ntype = "disk"\npath = "/"\n{limits}\n'
    assert error(text, key) == f"{SOURCE}: {key}: {problem}"


def test_equal_and_one_sided_thresholds_are_fine():
    text = (
        '[[check]]\nname = "d"\ntype = "disk"\npath = "/"\nwarn_free_gib = 5\n'
        "stop_free_gib = 5\nwarn_used_pct = 90\nstop_used_pct = 90\nstop_free_pct = 50\n"
    )
    check = parse(text).checks[0]
    assert (check.warn_free_gib, check.stop_free_gib, check.stop_free_pct) == (5, 5, 50)
    assert check.warn_free_pct is None


@pytest.mark.parametrize(
    "text, key, problem",
    [
        ('[gpu]\nuuid = "GPU-a"\n', "gpu", "must be an array of tables ([[gpu]]), not a table"),
        ("check = 1\n", "check", "must be an array of tables ([[check]]), not 1"),
        ("pool = [1, 2]\n", "pool[0]", "must be a table, not 1"),
        ("daemon = 1\n", "daemon", "must be a table ([daemon]), not 1"),
        ("runner = 30\n", "runner", "must be a table ([runner]), not 30"),
    ],
)
def test_wrong_shape(text, key, problem):
    assert problem in error(text, key)


def test_long_values_are_shortened_to_stay_on_one_line():
    message = error(f'[daemon]\nprobe_timeout = "{"x" * 500}\\n"\n', "daemon.probe_timeout")
    assert len(message) < 200


# --- reading files -----------------------------------------------------------------------


def test_load_config_names_the_file(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[daemon]\nprobe_timeout = 3\n")
    cfg = load_config(path)
    assert cfg.source == str(path)
    assert cfg.daemon.probe_timeout == 3
    path.write_text("[daemon]\nprobe_timeout = 0\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: daemon.probe_timeout: "):
        load_config(path)


def test_load_config_missing(tmp_path):
    with pytest.raises(ConfigError, match="no such file$") as info:
        load_config(tmp_path / "missing.toml")
    assert str(info.value).startswith(str(tmp_path / "missing.toml") + ": ")


def test_load_config_not_utf8(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes(b'[daemon]\naccess_group = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)


def test_load_config_accepts_a_byte_order_mark(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes("\ufeff[daemon]\npersist = false\n".encode())
    assert load_config(path).daemon.persist is False


# --- lookup ------------------------------------------------------------------------------


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Every place a config file can be, all empty; /etc is a temporary stand-in."""
    etc = tmp_path / "etc" / "resourced" / "config.toml"
    monkeypatch.setattr(config_module, "SYSTEM_CONFIG", etc)
    home = tmp_path / "home"
    xdg = tmp_path / "xdg"
    paths = {
        "cli": tmp_path / "cli.toml",
        "env": tmp_path / "env.toml",
        "xdg": xdg / "resourced" / "config.toml",
        "home": home / ".config" / "resourced" / "config.toml",
        "etc": etc,
    }
    environ = {"HOME": str(home), "XDG_CONFIG_HOME": str(xdg),
               "RESOURCED_CONFIG": str(paths["env"])}

    def create(*names):
        for name in names:
            paths[name].parent.mkdir(parents=True, exist_ok=True)
            paths[name].write_text("")

    return paths, environ, create


def test_lookup_order(places):
    paths, environ, create = places
    create("cli", "env", "xdg", "home", "etc")
    assert find_config(str(paths["cli"]), environ) == paths["cli"]
    assert find_config(None, environ) == paths["env"]
    del environ["RESOURCED_CONFIG"]
    assert find_config(None, environ) == paths["xdg"]
    del environ["XDG_CONFIG_HOME"]
    assert find_config(None, environ) == paths["home"]
    paths["home"].unlink()
    assert find_config(None, environ) == paths["etc"]
    paths["etc"].unlink()
    assert find_config(None, environ) is None


def test_implicit_files_are_skipped_when_absent(places):
    paths, environ, create = places
    del environ["RESOURCED_CONFIG"]
    create("home", "etc")  # but not $XDG_CONFIG_HOME's
    assert find_config(None, environ) == paths["etc"]


@pytest.mark.parametrize("xdg", ["", "relative/dir"])
def test_empty_or_relative_xdg_config_home_is_ignored(places, xdg):
    paths, environ, create = places
    del environ["RESOURCED_CONFIG"]
    environ["XDG_CONFIG_HOME"] = xdg
    create("home")
    assert find_config(None, environ) == paths["home"]


def test_empty_resourced_config_counts_as_unset(places):
    paths, environ, create = places
    environ["RESOURCED_CONFIG"] = ""
    create("xdg")
    assert find_config(None, environ) == paths["xdg"]


def test_system_service_skips_the_user_file(places):
    paths, environ, create = places
    create("cli", "env", "xdg", "home", "etc")
    assert find_config(str(paths["cli"]), environ, system=True) == paths["cli"]
    assert find_config(None, environ, system=True) == paths["env"]
    del environ["RESOURCED_CONFIG"]
    assert find_config(None, environ, system=True) == paths["etc"]
    paths["etc"].unlink()
    assert find_config(None, environ, system=True) is None


def test_a_named_file_must_exist(places):
    paths, environ, create = places
    create("xdg", "etc")
    with pytest.raises(ConfigError) as info:
        find_config(str(paths["cli"]), environ)
    assert str(info.value) == f"{paths['cli']}: no such file"
    with pytest.raises(ConfigError) as info:
        find_config(None, environ, system=True)
    assert str(info.value) == f"{paths['env']}: no such file (named by $RESOURCED_CONFIG)"


def test_a_named_directory_is_refused(places, tmp_path):
    _, environ, _ = places
    with pytest.raises(ConfigError, match="is a directory"):
        find_config(str(tmp_path), environ)
    with pytest.raises(ConfigError, match="empty"):
        find_config("", environ)


def test_find_then_load(places):
    paths, environ, create = places
    create("env")
    paths["env"].write_text("[daemon]\nsample_interval = 7\n")
    cfg = load_config(find_config(None, environ))
    assert (cfg.source, cfg.daemon.sample_interval) == (str(paths["env"]), 7)


# --- the example -------------------------------------------------------------------------

SCHEMA = {
    "daemon": DaemonConfig, "runner": RunnerConfig, "mcp": McpConfig, "gpu": GpuEntry,
    "check": CheckEntry, "pool": PoolEntry,
}


def test_the_schema_knows_exactly_the_dataclass_fields():
    tables = {"daemon": config_module._DAEMON, "runner": config_module._RUNNER,
              "mcp": config_module._MCP, **config_module._ARRAYS}
    for section, cls in SCHEMA.items():
        assert list(tables[section]) == [f.name for f in dataclasses.fields(cls)]


def test_the_example_loads():
    cfg = load_config(EXAMPLE)
    assert cfg.daemon == DaemonConfig()  # it shows the defaults
    assert cfg.runner == RunnerConfig()
    assert cfg.mcp == McpConfig()
    assert [(c.name, c.type, c.path) for c in cfg.checks] == [
        ("ram", "ram", None), ("root disk", "disk", "/"),
    ]


def test_the_example_mentions_every_key():
    text = EXAMPLE.read_text()
    for section, cls in SCHEMA.items():
        table = f"[{section}]" if section in ("daemon", "runner", "mcp") else f"[[{section}]]"
        assert table in text
        for f in dataclasses.fields(cls):
            assert re.search(rf"^#? ?{f.name} = ", text, re.MULTILINE), f"{section}.{f.name}"


def test_the_examples_commented_entries_are_valid_too():
    keys = {f.name for cls in SCHEMA.values() for f in dataclasses.fields(cls)}
    pattern = re.compile(r"^# (\[\[(gpu|pool)\]\]|(\w+) = .*)$")
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        m = pattern.match(line)
        lines.append(line[2:] if m and (m[2] or m[3] in keys) else line)
    cfg = parse_config("\n".join(lines), "uncommented")
    assert len(cfg.gpus) == 2
    assert [p.name for p in cfg.pools] == ["scratch", "matlab-licences"]
    assert cfg.checks[0].warn_used_pct is not None


def test_the_module_needs_only_the_standard_library():
    code = "import sys, resourced.config; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    for heavy in ("click", "dbus_fast", "jeepney", "psutil", "pynvml", "asyncio"):
        assert heavy not in out


# --- reload ------------------------------------------------------------------------------


def test_reload_with_no_change():
    assert reload_changes(Config(), Config(source="elsewhere")) == ([], [])


@pytest.mark.parametrize(
    "change, live, restart",
    [
        ({"probe_timeout": 1.0}, ["daemon.probe_timeout"], []),
        ({"sample_interval": 1.0}, ["daemon.sample_interval"], []),
        ({"dead_owner_grace": 0.0}, ["daemon.dead_owner_grace"], []),
        ({"access_group": "gpu"}, ["daemon.access_group"], []),
        ({"runtime_dir": "/run/x"}, [], ["daemon.runtime_dir"]),
        ({"persist": False}, [], ["daemon.persist"]),
    ],
)
def test_reload_daemon_keys(change, live, restart):
    new = Config(daemon=dataclasses.replace(DaemonConfig(), **change))
    assert reload_changes(Config(), new) == (live, restart)


def test_reload_lists():
    old = Config()
    new = Config(
        gpus=(GpuEntry("GPU-a"),),
        checks=(CheckEntry("r", "ram", warn_free_pct=10),),
        pools=(PoolEntry("p", 1),),
        daemon=DaemonConfig(probe_timeout=5, persist=False),
    )
    assert reload_changes(old, new) == (
        ["daemon.probe_timeout", "check"], ["daemon.persist", "gpu", "pool"],
    )
    assert reload_changes(new, old) == reload_changes(old, new)


def test_reload_sees_changes_inside_entries():
    a = parse('[[gpu]]\nuuid = "GPU-a"\nalias = "x"\n[[pool]]\nname = "p"\ncapacity = 4\n')
    b = parse('[[gpu]]\nuuid = "GPU-a"\nalias = "y"\n[[pool]]\nname = "p"\ncapacity = 5\n')
    assert reload_changes(a, b) == ([], ["gpu", "pool"])


def test_reload_ignores_how_a_number_was_written():
    a = parse("[daemon]\nprobe_timeout = 10\n")
    b = parse("[daemon]\nprobe_timeout = 10.0\n")
    assert reload_changes(a, b) == ([], [])


def test_socket_group_is_the_access_group_and_says_so():
    cfg = parse_config('[daemon]\nsocket_group = "gpuusers"\n', "c.toml")
    assert cfg.daemon.access_group == "gpuusers"
    assert cfg.notes == ("daemon.socket_group is read as daemon.access_group, the name it "
                         "has now",)


def test_socket_group_beside_the_same_access_group_is_read_once():
    cfg = parse_config('[daemon]\nsocket_group = "lab"\naccess_group = "lab"\n', "c.toml")
    assert cfg.daemon.access_group == "lab" and len(cfg.notes) == 1


def test_socket_group_that_disagrees_with_access_group_is_refused():
    with pytest.raises(ConfigError) as err:
        parse_config('[daemon]\nsocket_group = "lab"\naccess_group = "gpu"\n', "c.toml")
    assert str(err.value) == ("c.toml: daemon.socket_group: is the old name of access_group, "
                              "which says 'gpu': keep access_group alone")


def test_socket_group_is_checked_as_a_group_name():
    with pytest.raises(ConfigError) as err:
        parse_config('[daemon]\nsocket_group = "no spaces"\n', "c.toml")
    assert "c.toml: daemon.socket_group: must be a valid group name" in str(err.value)


def test_nvidia_smi_is_accepted_unused_and_noted():
    cfg = parse_config('[daemon]\nnvidia_smi = "/usr/bin/nvidia-smi"\n', "c.toml")
    assert cfg.daemon == DaemonConfig()
    assert len(cfg.notes) == 1 and cfg.notes[0].startswith("daemon.nvidia_smi is not used")
    with pytest.raises(ConfigError):
        parse_config("[daemon]\nnvidia_smi = 3\n", "c.toml")


def test_the_metrics_textfile_is_an_absolute_prom_file_applied_on_reload():
    assert parse("").metrics.textfile == ""
    found = parse('[metrics]\ntextfile = "/var/lib/ne/resourced.prom"\n')
    assert found.metrics.textfile == "/var/lib/ne/resourced.prom"
    assert "absolute path" in error('[metrics]\ntextfile = "ne/resourced.prom"\n',
                                    "metrics.textfile")
    assert "must end in .prom" in error('[metrics]\ntextfile = "/var/lib/ne/resourced.txt"\n',
                                        "metrics.textfile")
    assert reload_changes(Config(), found) == (["metrics"], [])


def test_a_shared_bus_caps_a_members_booked_gpu_hours_at_a_quarter_of_the_horizon():
    from resourced.config import DaemonConfig, for_the_bus

    assert for_the_bus(DaemonConfig(), True, 4).max_booked_gpu_hours_per_user == 720
    assert for_the_bus(DaemonConfig(booking_horizon=7 * 86400), True, 8
                       ).max_booked_gpu_hours_per_user == 8 * 7 * 24 / 4
    assert for_the_bus(DaemonConfig(), False, 4).max_booked_gpu_hours_per_user == 0
    lifted = DaemonConfig(max_booked_gpu_hours_per_user=0)
    assert for_the_bus(lifted, True, 4).max_booked_gpu_hours_per_user == 0
    assert for_the_bus(DaemonConfig(booking_horizon=0), True, 4
                       ).max_booked_gpu_hours_per_user == 0  # no horizon: nothing to share
