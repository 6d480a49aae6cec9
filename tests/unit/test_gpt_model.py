"""The built-in GPT: GPT-2 small's parameter count, causality, tied head, seeded init."""

import torch

from gputui.train.gpt import GPTShape, gpt, lm_loss


def test_gpt2_small_has_124m_parameters():
    with torch.device("meta"):
        model = gpt(GPTShape(50257, 1024, 12, 12, 768))
    assert sum(p.numel() for p in model.parameters()) == 124_439_808


def test_causal_a_later_token_does_not_change_earlier_logits():
    torch.manual_seed(0)
    model = gpt(GPTShape(context=16, n_layer=2, n_head=2, n_embd=32)).eval()
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[0, 10] = (x[0, 10] + 1) % 256
    a, b = model(x), model(y)
    assert torch.equal(a[0, :10], b[0, :10])
    assert not torch.allclose(a[0, 10:], b[0, 10:])


def test_tied_head_shares_the_embedding_and_untied_does_not():
    tied = gpt(GPTShape(n_layer=1))
    assert tied[-1].lm_head.weight is tied[0].wte.weight
    untied = gpt(GPTShape(n_layer=1, tie=False))
    assert untied[-1].lm_head.weight is not untied[0].wte.weight


def test_initial_loss_is_near_uniform_over_bytes():
    torch.manual_seed(1)
    model = gpt(GPTShape(n_layer=2))
    x = torch.randint(0, 256, (4, 128))
    targets = torch.randint(0, 256, (4, 128))
    loss = lm_loss(model(x), targets).item()
    assert abs(loss - torch.log(torch.tensor(256.0)).item()) < 0.3
