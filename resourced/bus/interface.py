"""The base of our exported interfaces: it annotates how each property signals changes."""

from dbus_fast.service import ServiceInterface

EMITS_CHANGED = "org.freedesktop.DBus.Property.EmitsChangedSignal"


class Interface(ServiceInterface):
    CONST_PROPERTIES: frozenset[str] = frozenset()
    """Properties that never change while the object exists (annotated ``const``)."""

    def introspect(self):
        intro = super().introspect()
        for prop in intro.properties:
            if prop.name in self.CONST_PROPERTIES:
                prop.annotations[EMITS_CHANGED] = "const"
        return intro
