"""Phase 15's checks reject plausible wrong answers: each fails with the default seeds and a message that locates
the bug (the row, group, column, packed word or nibble) and names the likely mistake."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

WRONG = [
    # ---- quantize_int8_per_channel
    Wrong("quantize_int8_per_channel", "scale from max instead of absmax", expect="largest MAGNITUDE",
          edit=("w.abs().amax(dim=1)", "w.amax(dim=1)")),
    Wrong("quantize_int8_per_channel", "rounds toward zero", expect="round to NEAREST",
          edit=("torch.round(w / scales[:, None])", "(w / scales[:, None]).trunc()")),
    Wrong("quantize_int8_per_channel", "divides by 128", expect="not 128",
          edit=("/ 127.0", "/ 128.0")),
    Wrong("quantize_int8_per_channel", "one scale per input column", expect="one scale per OUTPUT row",
          edit=("w.abs().amax(dim=1)", "w.abs().amax(dim=0)")),
    Wrong("quantize_int8_per_channel", "int32 codes", expect="dtype torch.int32",
          edit=(".clamp(-127, 127).to(torch.int8)", ".clamp(-127, 127).to(torch.int32)")),
    Wrong("quantize_int8_per_channel", "floor instead of round", expect="round to NEAREST",
          edit=("torch.round(w / scales[:, None])", "torch.floor(w / scales[:, None])")),
    # ---- quantize_int4_groups
    Wrong("quantize_int4_groups", "no clamp of the codes", expect="clamp after rounding",
          edit=("q = torch.round(w / scales[..., None] + zeros[..., None]).clamp(0, 15)",
                "q = torch.round(w / scales[..., None] + zeros[..., None])")),
    Wrong("quantize_int4_groups", "rounds toward zero", expect="round to NEAREST",
          edit=("q = torch.round(w / scales[..., None] + zeros[..., None]).clamp(0, 15)",
                "q = (w / scales[..., None] + zeros[..., None]).trunc().clamp(0, 15)")),
    Wrong("quantize_int4_groups", "zero point off by one", expect="off by one",
          edit=("zeros = torch.round(-low / scales).clamp(0, 15)",
                "zeros = (torch.round(-low / scales) + 1).clamp(0, 15)")),
    Wrong("quantize_int4_groups", "range does not include zero", expect="must include 0.0",
          edit=("    low = w.amin(dim=-1).clamp(max=0.0)\n    high = w.amax(dim=-1).clamp(min=0.0)\n",
                "    low = w.amin(dim=-1)\n    high = w.amax(dim=-1)\n")),
    Wrong("quantize_int4_groups", "sixteen steps", expect="not 16", edit=("/ 15.0", "/ 16.0")),
    Wrong("quantize_int4_groups", "groups along the output axis", expect="groups run along dim 1",
          source='''
def quantize_int4_groups(weight, group_size):
    n, k = weight.shape
    w = weight.float().t().reshape(k, n // group_size, group_size)
    low = w.amin(dim=-1).clamp(max=0.0)
    high = w.amax(dim=-1).clamp(min=0.0)
    scales = ((high - low) / 15.0).clamp(min=1e-8)
    zeros = torch.round(-low / scales).clamp(0, 15)
    q = torch.round(w / scales[..., None] + zeros[..., None]).clamp(0, 15)
    return q.reshape(k, n).t().contiguous().to(torch.int32), scales, zeros.to(torch.int32)
'''),
    # ---- pack_int4_rows
    Wrong("pack_int4_rows", "nibbles in reverse order", expect="reverse order",
          edit=("shifts = torch.arange(0, 32, 4, dtype=torch.int64)",
                "shifts = torch.arange(28, -4, -4, dtype=torch.int64)")),
    Wrong("pack_int4_rows", "strided rows instead of consecutive ones", expect="CONSECUTIVE rows",
          edit=("grouped = values.to(torch.int64).reshape(rows // PACK_FACTOR, PACK_FACTOR, cols)",
                "grouped = values.to(torch.int64).reshape(PACK_FACTOR, rows // PACK_FACTOR, cols).transpose(0, 1)")),
    Wrong("pack_int4_rows", "returns int64", expect="dtype torch.int64",
          edit=("return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)", "return packed")),
    Wrong("pack_int4_rows", "shifts by 8 bits", expect="first wrong nibble",
          edit=("shifts = torch.arange(0, 32, 4, dtype=torch.int64)",
                "shifts = torch.arange(0, 64, 8, dtype=torch.int64)")),
    Wrong("pack_int4_rows", "packs along the columns", expect="[rows / 8, columns]",
          source='''
def pack_int4_rows(values):
    rows, cols = values.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    grouped = values.to(torch.int64).reshape(rows, cols // PACK_FACTOR, PACK_FACTOR)
    packed = (grouped << shifts[None, None, :]).sum(dim=2)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
'''),
    # ---- unpack_int4_rows
    Wrong("unpack_int4_rows", "no mask after the shift", expect="keep only the four bits",
          edit=("values = (packed[:, None, :] >> shifts[None, :, None]) & 0xF",
                "values = packed[:, None, :] >> shifts[None, :, None]")),
    Wrong("unpack_int4_rows", "nibbles in reverse order", expect="LOWEST nibble is the first",
          edit=("shifts = torch.arange(0, 32, 4, dtype=torch.int32)",
                "shifts = torch.arange(28, -4, -4, dtype=torch.int32)")),
    Wrong("unpack_int4_rows", "flattens nibble-major", expect="mind the order of the axes",
          edit=("return values.reshape(rows * PACK_FACTOR, cols)",
                "return values.transpose(0, 1).reshape(rows * PACK_FACTOR, cols)")),
    Wrong("unpack_int4_rows", "returns int64", expect="dtype torch.int64",
          edit=("return values.reshape(rows * PACK_FACTOR, cols)",
                "return values.reshape(rows * PACK_FACTOR, cols).to(torch.int64)")),
    Wrong("unpack_int4_rows", "masks with 0x7", expect="inverse of pack_int4_rows",
          edit=("values = (packed[:, None, :] >> shifts[None, :, None]) & 0xF",
                "values = (packed[:, None, :] >> shifts[None, :, None]) & 0x7")),
    # ---- dequantize_int4_groups
    Wrong("dequantize_int4_groups", "forgets the zero point", expect="subtract the zero point before scaling",
          edit=("return (q.float() - z) * s", "return q.float() * s")),
    Wrong("dequantize_int4_groups", "adds the zero point", expect="not added",
          edit=("return (q.float() - z) * s", "return (q.float() + z) * s")),
    Wrong("dequantize_int4_groups", "subtracts the zero point after scaling", expect="then scale",
          edit=("return (q.float() - z) * s", "return q.float() * s - z")),
    Wrong("dequantize_int4_groups", "scales tiled instead of repeated", expect="CONSECUTIVE inputs",
          edit=("s = scales.float().repeat_interleave(group_size, dim=1)", "s = scales.float().repeat(1, group_size)")),
    Wrong("dequantize_int4_groups", "returns float64", expect="dtype torch.float64",
          edit=("return (q.float() - z) * s", "return ((q.float() - z) * s).double()")),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("15_quantization", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
