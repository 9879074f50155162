"""The error vocabulary: names on the bus, back to classes, and gpuctl's exit codes."""

import re

import pytest

from resourced import errors
from resourced.errors import (
    ALL_ERRORS,
    ERROR_PREFIX,
    UNREACHABLE_NAMES,
    AccessDenied,
    DaemonUnreachable,
    GPUsBusy,
    InteractiveAuthorizationRequired,
    Internal,
    InvalidArgs,
    NoSuchClaim,
    NoSuchPool,
    NotClaimOwner,
    NotEnoughCapacity,
    NotEnoughGPUs,
    NotProcessOwner,
    QueueTimeout,
    ResourcedError,
    StillInUse,
    error_from_bus,
)
from resourced.exits import EXIT_CODES, exit_code_for

from ..conftest import documentation

DOCUMENTED_EXIT_CODES = {
    Internal: 1,
    InvalidArgs: 2,
    NotEnoughGPUs: 3,
    GPUsBusy: 4,
    DaemonUnreachable: 5,
    NoSuchClaim: 6,
    NotProcessOwner: 7,
    NotClaimOwner: 7,
    AccessDenied: 8,
    InteractiveAuthorizationRequired: 8,
    StillInUse: 9,
    NotEnoughCapacity: 3,
    NoSuchPool: 2,
    QueueTimeout: 11,
    errors.LimitExceeded: 12,
}


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_every_error_round_trips_through_its_bus_name(cls):
    err = error_from_bus(cls.bus_name(), "the message")
    assert type(err) is cls
    assert (err.message, str(err)) == ("the message", "the message")


def test_bus_names_and_codes_are_unique():
    assert len({c.bus_name() for c in ALL_ERRORS}) == len(ALL_ERRORS)
    assert len({c.code for c in ALL_ERRORS}) == len(ALL_ERRORS)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_bus_name_is_ours_unless_a_standard_one_fits(cls):
    if cls in (InvalidArgs, AccessDenied, InteractiveAuthorizationRequired):
        assert cls.bus_name() == f"org.freedesktop.DBus.Error.{cls.code}"
    else:
        assert cls.bus_name() == ERROR_PREFIX + cls.code == f"org.resourced.Error.{cls.code}"


def test_every_error_class_is_listed():
    defined = {v for v in vars(errors).values()
               if isinstance(v, type) and issubclass(v, ResourcedError) and v is not ResourcedError}
    assert defined == set(ALL_ERRORS)


@pytest.mark.parametrize("name", sorted(UNREACHABLE_NAMES))
def test_unreachable_names_mean_daemon_unreachable(name):
    err = error_from_bus(name, "nobody home")
    assert type(err) is DaemonUnreachable
    assert err.message == "nobody home"
    assert error_from_bus(name, "").message  # a message even when the bus gave none


def test_unknown_method_is_invalid_request():
    assert type(error_from_bus("org.freedesktop.DBus.Error.UnknownMethod", "m")) is InvalidArgs


@pytest.mark.parametrize("name", ["org.freedesktop.DBus.Error.Failed",
                                  "org.resourced.Error.Failed", "com.example.Oops", ""])
def test_any_other_name_is_internal_and_keeps_the_name(name):
    err = error_from_bus(name, "details")
    assert type(err) is Internal
    assert name in err.message and "details" in err.message
    assert error_from_bus(name, "").message == name


def test_the_base_class_cannot_be_raised_itself():
    with pytest.raises(TypeError):
        ResourcedError("anything")


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_every_error_is_a_resourced_error_and_an_exception(cls):
    assert issubclass(cls, ResourcedError) and issubclass(cls, Exception)
    assert cls.__doc__


def test_every_error_has_an_exit_code():
    assert set(EXIT_CODES) == set(ALL_ERRORS)


def test_exit_codes_are_the_documented_ones():
    assert EXIT_CODES == DOCUMENTED_EXIT_CODES


def test_every_exit_code_is_in_the_documented_table():
    table = re.findall(r"^\| (\d+) \| ", documentation(), flags=re.M)
    assert {int(code) for code in table} >= set(EXIT_CODES.values())


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_exit_code_for_an_error(cls):
    assert exit_code_for(cls("m")) == DOCUMENTED_EXIT_CODES[cls]


def test_exit_code_for_anything_else_is_none():
    assert exit_code_for(ValueError("x")) is None
    assert exit_code_for(KeyboardInterrupt()) is None
