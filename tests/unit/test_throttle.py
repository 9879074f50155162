"""The totals' announcements: at once after a quiet spell, else once per interval."""

import asyncio

from resourced.daemon.bus.throttle import Throttle


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(steps):
    """Run ``steps(throttle, clock, announced)`` on a loop; returns what was announced."""
    announced: list[tuple[float, list]] = []

    async def main():
        clock = Clock()
        throttle = Throttle(lambda keys: announced.append((clock.now, sorted(keys))),
                            interval=0.05, clock=clock)
        await steps(throttle, clock)

    asyncio.run(main())
    return announced


def test_the_first_change_after_a_quiet_spell_goes_out_at_once_the_rest_once_later():
    async def steps(throttle, clock):
        assert throttle.due_now("m")
        for _ in range(10):  # a burst: none now, one announcement at the interval's end
            clock.now += 0.001
            assert not throttle.due_now("m")
        clock.now = 100.0625
        await asyncio.sleep(0.07)
        clock.now = 200  # quiet since: at once again
        assert throttle.due_now("m")

    assert run(steps) == [(100.0625, ["m"])]


def test_each_key_keeps_its_own_interval():
    async def steps(throttle, clock):
        assert throttle.due_now("m")
        clock.now += 0.03
        assert throttle.due_now("slots")  # never announced: at once
        assert not throttle.due_now("m")
        assert not throttle.due_now("slots")
        clock.now = 100.0625
        await asyncio.sleep(0.06)
        clock.now = 100.09375
        await asyncio.sleep(0.05)

    assert run(steps) == [(100.0625, ["m"]), (100.09375, ["slots"])]
