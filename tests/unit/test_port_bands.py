"""Each pytest-xdist worker picks its servers' ports from a band of its own, whatever the count."""

from __future__ import annotations

from tests.support import PORT_BASE, PORT_END, port_band


def test_the_bands_of_every_worker_are_apart_and_below_the_ephemeral_ports() -> None:
    for workers in (1, 2, 6, 7, 8, 16, 32):
        bands = [port_band(f"gw{n}", workers) for n in range(workers)]
        taken: set[int] = set()
        for band in bands:
            assert len(band) >= 300 and band.start >= PORT_BASE and band.stop <= PORT_END
            assert taken.isdisjoint(band), (workers, band)  # gw6 and on included
            taken.update(band)


def test_a_process_outside_xdist_takes_the_whole_range() -> None:
    assert port_band("master", 1) == range(PORT_BASE, PORT_END)
