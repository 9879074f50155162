"""A pytest plugin: tests marked ``gpu`` run on GPUs claimed through resourced.

    @pytest.mark.gpu(2)              # two whole GPUs
    @pytest.mark.gpu(vram="8G")      # a share of one GPU's memory

Loaded automatically where resourced is installed (the ``pytest11`` entry point; with
plugin autoloading off: ``-p resourced.pytest_plugin``); inert without marked tests.  The
first marked test claims, for the whole test session, the most any marked test asks for
(a run claim owned by the pytest process: released when the session ends, or when the
process dies); each marked test sees its part of it in ``CUDA_VISIBLE_DEVICES`` (and the
other variables of ``gpuctl run``).  With no daemon, or when it does not fit now, the
marked tests are skipped with the reason; ``--resourced-wait`` queues for it instead.

Inside ``gpuctl run`` (``RESOURCED_ALLOCATION`` set), the run's own claim serves the
marked tests and nothing more is claimed: ``gpuctl run --gpus 2 -- python -m pytest -m
gpu`` runs the tests on those two GPUs.
"""

import contextlib
import os

import pytest

MARKER = "gpu(n=1, vram=None): run on n whole GPUs (or a VRAM share) claimed through resourced"


def pytest_addoption(parser):
    parser.addoption("--resourced-wait", action="store_true",
                     help="resourced: wait in the queue for the GPUs marked tests need, "
                          "instead of skipping them when they are taken")


def pytest_configure(config):
    config.addinivalue_line("markers", MARKER)
    config.pluginmanager.register(_Session(config), "resourced-session")


class _Session:
    """The one claim of a test session, made when the first marked test needs it."""

    def __init__(self, config):
        self.config = config
        self.wanted = {"gpus": 0, "vram": 0}
        self.claim: dict | None = None
        self.refusal = ""
        self.client = None
        self.borrowed = False  # the claim is the surrounding run's: not ours to release

    def pytest_collection_modifyitems(self, items):
        from resourced.protocol.amounts import parse_amount

        for item in items:
            marker = item.get_closest_marker("gpu")
            if marker is None:
                continue
            gpus, vram = _asked(marker)
            if vram:
                self.wanted["vram"] = max(self.wanted["vram"], parse_amount(vram))
            else:
                self.wanted["gpus"] = max(self.wanted["gpus"], gpus)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        marker = item.get_closest_marker("gpu")
        if marker is None:
            return
        held = self._held()
        if held is None:
            pytest.skip(f"resourced: {self.refusal}")
        gpus, vram = _asked(marker)
        env = dict(held["env"])
        if not vram and self.wanted["gpus"]:
            uuids = held["allocation"]["gpu_uuids"][:gpus]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        item._resourced_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)

    def pytest_runtest_teardown(self, item):
        for name, value in getattr(item, "_resourced_env", {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def pytest_sessionfinish(self):
        if self.client is not None:
            if self.claim is not None and not self.borrowed:
                with contextlib.suppress(Exception):  # it ends with this process anyway
                    self.client.release(self.claim["allocation"]["ref"], force=True)
            self.client.close()

    def _held(self) -> dict | None:
        """The session's claim, claimed at the first call (None: refused, see ``refusal``)."""
        if self.claim is not None or self.refusal:
            return self.claim
        from resourced.client.sync import Client
        from resourced.errors import ResourcedError

        wait = self.config.getoption("--resourced-wait")
        # GPUs and a share cannot be one claim: the whole GPUs serve the share tests too.
        gpus = self.wanted["gpus"] or (0 if self.wanted["vram"] else 1)
        vram = None if gpus else self.wanted["vram"]
        surrounding = os.environ.get("RESOURCED_ALLOCATION")
        try:
            self.client = Client()
            if surrounding:
                return self._borrow(surrounding)
            self.claim = self.client.claim(mode="run", gpus=gpus, vram=vram,
                                           owner_pid=os.getpid(), wait=wait,
                                           task_name="pytest session")
        except ResourcedError as exc:
            self.refusal = f"{type(exc).__name__}: {exc.message}"
        return self.claim

    def _borrow(self, ref: str) -> dict | None:
        """The claim of the ``gpuctl run`` this session runs in, if it has what the marked
        tests need (None, with the reason, if not)."""
        held = self.client.allocation(ref)
        has = len(held["allocation"]["gpu_uuids"])
        if has < self.wanted["gpus"]:
            self.refusal = (f"the claim {ref} this session runs in has {has} GPU(s); the "
                            f"marked tests need {self.wanted['gpus']}")
            return None
        self.claim, self.borrowed = held, True
        return held


def _asked(marker) -> tuple[int, str | None]:
    gpus = marker.args[0] if marker.args else marker.kwargs.get("n", 1)
    return int(gpus), marker.kwargs.get("vram")
