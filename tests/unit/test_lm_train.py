"""Language modelling through the strategies and the record: the GPT on text trains under
single and equals it under model_parallel; a user's model may end in log_softmax (nll) or
return an object with logits (HuggingFace style); FLOPs; the summary and tables say which
score they show."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from gputui.core import scores
from gputui.core.config import RunConfig
from gputui.core.events import EpochEnd, InitDone, RunFinished, RunStarted
from gputui.core.runstore import summarize
from gputui.train import flops
from gputui.train.loop import evaluate
from gputui.train.task import batch_score, logits_of, mean_loss
from strategy_harness import (GPT_SMALL, assert_params_close, data_for, make_config, params,
                              run_steps)

sys.path.insert(0, str(Path(__file__).parent))
import user_lm  # noqa: E402


def test_gpt_trains_on_text_and_model_parallel_equals_single():
    cfg = make_config("single", "cpu", "gpt", 16)
    single, losses = run_steps(cfg, 6)
    assert losses[0] == pytest.approx(math.log(256), abs=0.3)  # near-uniform over bytes
    assert losses[-1] < losses[0] - 0.3
    val = evaluate(single, data_for(cfg))
    assert val == pytest.approx(losses[-1], abs=0.5)  # a loss per token, not an accuracy
    mp, mp_losses = run_steps(make_config("model_parallel", "cpu*2", "gpt", 16), 6)
    assert mp_losses == pytest.approx(losses, rel=1e-5)
    assert_params_close(params(mp.model), params(single.model))  # the tied weight included


def test_nll_for_a_log_softmax_model_equals_cross_entropy_on_its_logits():
    logits = torch.randn(3, 5, 7)
    y = torch.randint(0, 7, (3, 5))
    ce = mean_loss(logits, y)
    assert mean_loss(F.log_softmax(logits, -1), y, "nll") == pytest.approx(ce.item())
    assert ce == pytest.approx(F.cross_entropy(logits.reshape(-1, 7), y.reshape(-1)).item())
    # the summed score is each example's mean loss, summed
    assert batch_score(logits, y, "lm")[0].item() == pytest.approx(3 * ce.item(), rel=1e-6)
    assert logits_of(user_lm.Output(logits=logits)) is logits
    assert logits_of((logits, None)) is logits
    with pytest.raises(TypeError, match="return a tensor of logits"):
        logits_of({"logits": logits})


@pytest.mark.parametrize("factory, loss", [(user_lm.LOG_SOFTMAX, "nll"),
                                           (user_lm.OUTPUT_OBJECT, "cross_entropy")])
def test_a_users_language_model_trains_with_its_loss(factory, loss):
    cfg = make_config("single", "cpu", "lenet", 16, **GPT_SMALL, **{
        "model.factory": factory, "model.loss": loss, "optim.lr": 1.0})
    strategy, losses = run_steps(cfg, 6)
    assert losses[-1] < losses[0] - 0.2
    assert evaluate(strategy, data_for(cfg)) < losses[0]


@pytest.mark.parametrize("factory, got", [
    ("build_wrong_vocab", "[16, 32, 300]"),  # trained silently on 300 logits for 256 bytes
    ("build_last_only", "[16, 256]"),  # torch: "0D or 1D target tensor expected"
])
def test_a_users_language_model_of_the_wrong_output_shape_is_stopped_before_its_first_step(
        factory, got):
    from gputui.core.errors import UserError

    cfg = make_config("single", "cpu", "lenet", 16, **GPT_SMALL, **{
        "model.factory": f"{user_lm.HERE}:{factory}"})
    with pytest.raises(UserError) as err:
        run_steps(cfg, 1)
    assert str(err.value) == (
        f"the model's output has shape {got}, and the text needs [batch, context, vocab] = "
        f"[16, 32, 256] (logits for each of the 256 token values at every position); make "
        f"the model's last layer give that shape")
    assert "\n" not in str(err.value)
    narrow = cfg.replace(model={"factory": f"{user_lm.HERE}:build_wrong_vocab",
                                "kwargs": {"out": 100}})  # torch: "Target 116 is out of bounds"
    with pytest.raises(UserError, match=r"has shape \[16, 32, 100\]"):
        run_steps(narrow, 1)
    run_steps(cfg.replace(model={"factory": user_lm.TRANSFORMER}), 1)  # the right shape trains


def test_a_randomly_initialised_huggingface_gpt2_trains_as_the_users_model():
    pytest.importorskip("transformers", reason="the optional extra 'hf' (transformers) is not "
                                               "installed: pip install -e '.[hf]'")
    cfg = make_config("single", "cpu", "lenet", 16, **GPT_SMALL, **{
        "model.factory": user_lm.HF_GPT2, "optim.lr": 0.5})
    strategy, losses = run_steps(cfg, 6)
    assert type(strategy.model).__name__ == "GPT2LMHeadModel"
    assert losses[0] == pytest.approx(math.log(256), abs=0.5)
    assert losses[-1] < losses[0] - 0.2
    assert evaluate(strategy, data_for(cfg)) < losses[0]


def test_counted_lm_flops_match_the_closed_form():
    from gputui.train.gpt import GPTShape, gpt
    from gputui.train.models import count_params

    shape = GPTShape(context=64, n_layer=2, n_head=2, n_embd=64)
    counted = flops.count_step_flops(lambda: gpt(shape), (4, 64), 256, task="lm")
    # the embeddings' lookups do no arithmetic: the closed form's parameters are the rest
    # (the tied head counts the token embedding once)
    n = count_params(gpt(shape)) - shape.context * shape.n_embd
    closed = flops.lm_step_flops(n, 2, 64, 64, 4 * 64)
    assert counted == pytest.approx(closed, rel=0.15)


def test_the_summary_of_a_language_model_says_loss_and_perplexity_not_accuracy():
    events = [RunStarted(run_id="r", config=RunConfig(), devices=(), strategy="single"),
              InitDone(seconds=1.0, task="lm", tokens_per_sample=128, baseline_loss=3.2),
              EpochEnd(epoch=1, epochs=2, seconds=2.0, train_loss=3.0, test_acc=float("nan"),
                       samples_per_s=10.0, task="lm", val_loss=2.5, tokens_per_s=1280.0),
              EpochEnd(epoch=2, epochs=2, seconds=2.0, train_loss=2.4, test_acc=float("nan"),
                       samples_per_s=10.0, task="lm", val_loss=2.0, tokens_per_s=1280.0),
              RunFinished(seconds=4.0)]
    s = summarize(events)
    assert (s.task, s.test_acc, s.val_loss, s.best_val_loss) == ("lm", None, 2.0, 2.0)
    assert s.val_ppl == pytest.approx(math.exp(2.0))
    assert (s.tokens_per_s, s.baseline_loss) == (1280.0, 3.2)
    assert scores.score_text("lm", None, 2.0) == "val loss 2.0000 / ppl 7.39"
    assert scores.score_text("classify", 0.5, None) == "test acc 50.00%"


def test_tables_show_the_columns_of_the_tasks_they_hold():
    cols = ("id", "samples_per_s", "test_acc", "status")
    assert scores.columns_for(cols, [{"task": "classify"}]) == cols
    assert scores.columns_for(cols, [{"task": "lm"}]) == (
        "id", "samples_per_s", "tokens_per_s", "val_loss", "val_ppl", "status")
    assert scores.columns_for(cols, [{"task": "lm"}, {}]) == (
        "id", "samples_per_s", "tokens_per_s", "test_acc", "val_loss", "val_ppl", "status")
