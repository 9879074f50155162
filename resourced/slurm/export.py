"""The lines that describe this machine to Slurm: ``gres.conf`` and a slurm.conf ``NodeName=``.

Pure: it takes the GPUs and pools of the daemon's ``Describe`` (plain dicts) and a host
name, and returns data and text; ``gpuctl slurm config`` fetches and prints them.

Formats (Slurm's own documentation): gres.conf takes one ``Name=gpu Type=<type>
File=/dev/nvidia<N>`` line per GPU, ``#`` starts a comment; slurm.conf describes a node as
``NodeName=<name> CPUs=<n> RealMemory=<MiB> Gres=gpu:<type>:<count>[,...] State=UNKNOWN``
(the shape ``slurmd -C`` prints, RealMemory in megabytes) and needs ``GresTypes=gpu``
once for the cluster.  The ``Type`` in gres.conf and in ``Gres=`` must be the same word.

The GPU type, from the NVML name (deterministic, same name -> same type):

1. lowercase; ``-``, ``_`` and ``/`` become spaces; split on spaces;
2. drop the brand words ``nvidia``, ``tesla``, ``geforce``, ``quadro``;
3. the type is the first word left, with a family word (``rtx``, ``gtx``, ``titan``) joined
   to the word after it (``RTX 4090`` -> ``rtx4090``);
4. keep only ``a-z``, ``0-9`` and ``.``; an empty result is ``gpu``.

So "NVIDIA H100 80GB HBM3" -> ``h100``, "NVIDIA A100-SXM4-40GB" -> ``a100``, "Tesla
V100-SXM2-16GB" -> ``v100``, "NVIDIA GeForce RTX 4090" -> ``rtx4090``, "Simulated GPU"
-> ``simulated``.
"""

import re

SCHEMA = 1
MIB = 1024 * 1024
BRANDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})
FAMILIES = frozenset({"rtx", "gtx", "titan"})
FILE_NOTE = ("# File= names /dev/nvidia<NVML index>: check that these are this machine's "
             "real device nodes")


def gpu_type(name: str) -> str:
    """The Slurm GRES type for an NVML GPU name (rule in the module's docstring)."""
    words = [w for w in re.split(r"[\s\-_/]+", name.lower()) if w and w not in BRANDS]
    if not words:
        return "gpu"
    word = words[0]
    if word in FAMILIES and len(words) > 1:
        word += words[1]
    return re.sub(r"[^a-z0-9.]", "", word) or "gpu"


def _pools_by_name(pools) -> dict:
    """``Describe``'s list of pools, or a mapping already keyed by name."""
    if isinstance(pools, dict):
        return pools
    return {p["name"]: p for p in pools or ()}


def node_facts(pools) -> tuple[int | None, int | None]:
    """(CPUs, RealMemory in MiB rounded down) from the ``cpu`` and ``ram`` pools; None for
    either the daemon does not have (or has in a unit that does not fit)."""
    by_name = _pools_by_name(pools)
    cpu, ram = by_name.get("cpu"), by_name.get("ram")
    cpus = int(cpu["capacity"]) if cpu and cpu.get("unit", "count") == "count" else None
    mib = int(ram["capacity"]) // MIB if ram and ram.get("unit", "bytes") == "bytes" else None
    return cpus, mib


def export(gpus, pools, hostname: str) -> dict:
    """The ``--json`` object: gres.conf lines, the NodeName= line, and what they came from.
    The GPUs are those ``[slurm] gpus`` gives Slurm, else all of them (a machine moving
    into a cluster whole)."""
    gpus = list(gpus or ())
    ordered = sorted([g for g in gpus if g.get("slurm")] or gpus, key=lambda g: g["index"])
    rows = [{"index": g["index"], "uuid": g["uuid"], "type": gpu_type(g.get("name", "")),
             "file": f"/dev/nvidia{g['index']}"} for g in ordered]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["type"]] = counts.get(r["type"], 0) + 1
    cpus, mib = node_facts(pools)
    node = [f"NodeName={hostname}"]
    if cpus is not None:
        node.append(f"CPUs={cpus}")
    if mib is not None:
        node.append(f"RealMemory={mib}")
    if counts:
        node.append("Gres=" + ",".join(f"gpu:{t}:{n}" for t, n in counts.items()))
    node.append("State=UNKNOWN")
    return {
        "schema": SCHEMA,
        "gres": [f"Name=gpu Type={r['type']} File={r['file']}" for r in rows],
        "node": " ".join(node),
        "gpus": rows,
        "cpus": cpus,
        "real_memory_mib": mib,
    }


def render(data: dict) -> str:
    """The text ``gpuctl slurm config`` prints: commented sections, ready to copy."""
    lines = ["# gres.conf (on this node)"]
    if data["gres"]:
        lines.append(FILE_NOTE)
        lines.extend(data["gres"])
    else:
        lines.append("# no GPUs managed by resourced: nothing for gres.conf")
    lines += ["", "# slurm.conf"]
    if data["gres"]:
        lines.append("# with GresTypes=gpu set once for the cluster")
    missing = [k for k, v in (("CPUs", data["cpus"]), ("RealMemory", data["real_memory_mib"]))
               if v is None]
    if missing:
        lines.append(f"# {' and '.join(missing)} left out: the daemon has no "
                     f"{' or '.join('cpu' if k == 'CPUs' else 'ram' for k in missing)} pool "
                     "(`slurmd -C` prints them)")
    lines.append(data["node"])
    return "\n".join(lines)
