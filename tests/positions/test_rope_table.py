"""RoPE's default-position table (positions=None) gives exactly the angles of explicit arange positions, in
every grad mode, and follows the module across .to()."""

import torch

from attnkit.positions import RoPE, YaRNScaling


def test_default_table_equals_explicit_arange_and_survives_inference_mode():
    rope = RoPE(8, scaling=YaRNScaling(4.0, 16))  # attention_factor != 1: the table carries it too
    x = torch.randn(2, 3, 300, 8, requires_grad=True)  # longer than the first table (256): it grows
    with torch.inference_mode():
        torch.testing.assert_close(rope(x.detach()), rope(x.detach(), torch.arange(300)), rtol=0, atol=0)
    out = rope(x)  # a table built under inference mode must not reach autograd
    out.sum().backward()
    torch.testing.assert_close(out, rope(x, torch.arange(300)), rtol=0, atol=0)
    short = rope(x[:, :, :5])
    torch.testing.assert_close(short, rope(x[:, :, :5], torch.arange(5)), rtol=0, atol=0)
    rope64 = rope.double()
    xd = torch.randn(1, 1, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(rope64(xd), rope64(xd, torch.arange(7)), rtol=0, atol=0)
