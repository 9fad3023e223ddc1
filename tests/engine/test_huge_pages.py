"""The quantized weights gathered into one buffer: same values, views of it, each array once and
on a cache line; the madvise request never fails the caller."""

from pathlib import Path

import torch

from tokenyard.engine import huge_pages
from tokenyard.engine.quant import quantize


def test_gather_moves_every_array_into_one_buffer():
    torch.manual_seed(0)
    a, b = quantize(torch.randn(40, 96), "int4"), quantize(torch.randn(7, 64), "int8")
    before = [t.clone() for t in (a.qs, a.scales, a.mins, b.qs, b.scales)]
    dense = [a.dequantize(), b.dequantize()]
    buffer = huge_pages.gather([a, b, a])  # a tied weight comes twice: moved once
    arrays = [a.qs, a.scales, a.mins, b.qs, b.scales]
    for array, old in zip(arrays, before, strict=True):
        assert torch.equal(array, old)
        assert array.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        assert array.data_ptr() % huge_pages.ALIGN == 0
    starts = sorted(t.data_ptr() for t in arrays)
    assert len(set(starts)) == len(starts)  # no two arrays share memory
    assert torch.equal(a.dequantize(), dense[0]) and torch.equal(b.dequantize(), dense[1])
    assert huge_pages.gather([]) is None


def test_advice_is_taken_where_the_kernel_has_huge_pages():
    # the request is accepted wherever the kernel is built with them, whatever its setting
    offered = Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    big = torch.empty(8 * huge_pages.HUGE_PAGE, dtype=torch.uint8)
    assert huge_pages.advise(big) is offered
    assert huge_pages.advise(torch.empty(16, dtype=torch.uint8)) is False  # no whole 2 MB page
