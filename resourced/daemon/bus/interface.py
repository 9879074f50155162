"""The base of our exported interfaces: it annotates how each property signals changes."""

from dbus_fast.service import ServiceInterface

EMITS_CHANGED = "org.freedesktop.DBus.Property.EmitsChangedSignal"


class Interface(ServiceInterface):
    CONST_PROPERTIES: frozenset[str] = frozenset()
    """Properties that never change while the object exists (annotated ``const``)."""

    OUT_NAMES: dict[str, tuple[str, ...]] = {}
    """Names for the out arguments of methods and the arguments of signals, by member."""

    async def settled(self) -> None:
        """Return once what the daemon has changed is on disk: awaited before every
        reply of an ``async`` method (``bus_errors``), so no answer tells of a change a
        power cut could still take back."""

    def introspect(self):
        intro = super().introspect()
        for member in (*intro.methods, *intro.signals):
            names = self.OUT_NAMES.get(member.name, ())
            outs = member.out_args if hasattr(member, "out_args") else member.args
            for arg, name in zip(outs, names):
                arg.name = name
        for prop in intro.properties:
            if prop.name in self.CONST_PROPERTIES:
                prop.annotations[EMITS_CHANGED] = "const"
        return intro
