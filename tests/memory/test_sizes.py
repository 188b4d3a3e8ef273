"""A device's memory as users write it (``--device-memory``, ``MemorySettings(device_memory=...)``): sizes in
binary and decimal units, and devices of the peak table by their datasheet memory."""

from __future__ import annotations

import pytest

from flopcount import MemorySettings
from flopcount.errors import UsageError
from flopcount.measure.machine.devices import memory_of
from flopcount.memory.sizes import parse_size


@pytest.mark.parametrize("text, expected", [
    ("80GiB", 80 * 1024**3), ("80 GiB", 80 * 1024**3), ("94GB", 94 * 1000**3), ("1.5TiB", 3 * 1024**4 // 2),
    ("512MiB", 512 * 1024**2), ("2kB", 2000), ("4096", 4096), ("7B", 7), (12345, 12345),
])
def test_a_size_in_bytes(text, expected):
    assert parse_size(text) == expected
    assert MemorySettings(device_memory=text).device_memory == expected


@pytest.mark.parametrize("bad", ["", "GiB", "80 GiBs", "-1GB", "0", "0.1B", "1e3GB", "８0GB", "2EiB", True, 2.5,
                                 2**61, "9" * 400 + "TB"])
def test_what_is_no_size_is_refused_naming_it(bad):
    with pytest.raises(UsageError, match="device_memory"):
        MemorySettings(device_memory=bad)


@pytest.mark.parametrize("name, gib", [
    ("NVIDIA H100 80GB HBM3", 80), ("H100", 80), ("NVIDIA H100 NVL", 94), ("NVIDIA H200", 141),
    ("NVIDIA A100-SXM4-80GB", 80), ("NVIDIA A100-PCIE-40GB", 40), ("Tesla V100-SXM2-32GB", 32), ("MI300X", 192),
])
def test_a_device_by_its_datasheet_memory(name, gib):
    assert memory_of(name) == gib * 2**30


def test_a_device_of_two_sizes_or_unknown_has_none():
    assert memory_of("A100") is None and memory_of("Tesla V100-SXM2") is None and memory_of("Banana 9000") is None
