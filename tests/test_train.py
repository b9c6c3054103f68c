"""lib_dist.train: the loop, evaluation, checkpoints (resuming is exact), the device choice,
and the memory budget (the estimate equals what autograd really saves)."""

from __future__ import annotations

import functools
import os

import pytest
import torch
import torch.nn.functional as F

from lab_solutions import solution
from tolerances import tolerance

from lib_dist.data import ExampleBatches, load_digits
from lib_dist.losses import next_token_loss
from lib_dist.models import GPT, MLP, GPTConfig
from lib_dist.train import (
    accuracy, evaluate, format_budgets, gpt_memory_estimate, load_checkpoint,
    measure_peak_memory, measure_training_memory, pick_device, save_checkpoint, train, train_step)

DIGITS = load_digits(seed=0)


def digits_run(seed=0):
    torch.manual_seed(seed)
    model = MLP(64, [64], 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = ExampleBatches(DIGITS.x_train, DIGITS.y_train, batch_size=64, seed=seed)
    return model, optimizer, batches


def test_training_an_mlp_on_digits_works_and_is_measured():
    model, optimizer, batches = digits_run()
    test_set = [(DIGITS.x_test, DIGITS.y_test)]
    before = evaluate(model, test_set, F.cross_entropy)
    history = train(model, optimizer, batches, F.cross_entropy, steps=150, progress=False,
                    eval_fn=lambda m: {"test": evaluate(m, test_set, F.cross_entropy)},
                    eval_every=50)
    assert history.steps == list(range(1, 151)) and len(history.losses) == 150
    assert [s for s, _ in history.evals] == [50, 100, 150]
    steps, values = history.eval_curve("test")
    assert values[-1] < 0.3 < before and values[-1] < values[0]
    assert accuracy(model, DIGITS.x_test, DIGITS.y_test) > 0.9
    assert history.tokens == 150 * 64 and history.seconds > 0
    assert history.tokens_per_second == pytest.approx(history.tokens / history.seconds)
    assert model.training  # evaluation restored training mode


def test_evaluate_weights_batches_by_size():
    model, _, _ = digits_run()
    x, y = DIGITS.x_test, DIGITS.y_test
    parts = [(x[:10], y[:10]), (x[10:], y[10:])]
    whole = F.cross_entropy(model(x), y).item()
    assert evaluate(model, parts, F.cross_entropy) == pytest.approx(
        whole, abs=tolerance(torch.float32, whole + 1, x.numel()))
    with pytest.raises(ValueError):
        evaluate(model, [], F.cross_entropy)


def test_a_custom_step_is_what_the_loop_runs():
    calls = []

    def step(model, optimizer, x, y, loss_fn, scale=1.0):
        calls.append((len(x), scale))
        return train_step(model, optimizer, x, y, loss_fn)

    model, optimizer, batches = digits_run()
    train(model, optimizer, batches, F.cross_entropy, 3, step=functools.partial(step, scale=2.0),
          progress=False)
    assert calls == [(64, 2.0)] * 3


def test_resuming_from_a_checkpoint_is_exact(tmp_path):
    straight, opt, batches = digits_run()
    train(straight, opt, batches, F.cross_entropy, 40, progress=False)

    model, opt, batches = digits_run()
    path = tmp_path / "ckpt" / "run.pt"
    train(model, opt, batches, F.cross_entropy, 25, checkpoint=path, checkpoint_every=10,
          progress=False)
    resumed, opt2, batches2 = digits_run(seed=1)  # different weights and data order
    state = load_checkpoint(path, resumed, opt2, batches2)
    assert state["step"] == 25 and state["config"] is None
    history = train(resumed, opt2, batches2, F.cross_entropy, 15, start_step=state["step"],
                    progress=False)
    assert history.steps[0] == 26
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    assert [p.name for p in path.parent.iterdir()] == ["run.pt"]  # written atomically


def test_checkpoint_keeps_config_and_extras_and_refuses_what_it_lacks(tmp_path):
    model = GPT(GPTConfig(vocab_size=7, block_size=8, n_layer=1, n_head=1, n_embd=8))
    path = save_checkpoint(tmp_path / "gpt.pt", model, step=3, note="hello")
    state = load_checkpoint(path, GPT(GPTConfig(vocab_size=7, block_size=8, n_layer=1,
                                                n_head=1, n_embd=8)))
    assert state["config"]["vocab_size"] == 7 and state["extra"] == {"note": "hello"}
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(path, model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_pick_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device() == torch.device("cpu")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        pick_device("cuda")
    assert pick_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device() == torch.device("cuda")


@pytest.mark.parametrize("config, batch", [
    (GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=16), 3),
    (GPTConfig(vocab_size=96, block_size=32, n_layer=1, n_head=4, n_embd=32), 5),
])
@pytest.mark.parametrize("optimizer, slots", [
    (lambda ps: torch.optim.AdamW(ps), 2),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), 1),
    (lambda ps: torch.optim.SGD(ps, lr=0.1), 0),
])
def test_memory_estimate_matches_measurement(config, batch, optimizer, slots):
    torch.manual_seed(0)
    model = GPT(config)
    x = torch.randint(config.vocab_size, (batch, config.block_size))
    y = torch.randint(config.vocab_size, (batch, config.block_size))
    measured = measure_training_memory(model, optimizer(model.parameters()), x, y,
                                       functools.partial(next_token_loss, loss_fn=F.cross_entropy))
    estimate = gpt_memory_estimate(config, batch, optimizer_slots=slots)
    assert measured.parameters == estimate.parameters == 4 * model.num_params()
    assert measured.gradients == estimate.gradients
    assert measured.optimizer_state == estimate.optimizer_state
    assert measured.activations == pytest.approx(estimate.activations, rel=0.02)
    assert "activations" in format_budgets(estimate=estimate, measured=measured)


def test_the_peak_of_a_step_is_early_in_backward_with_every_activation_still_held():
    config = GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=32)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(config.vocab_size, (8, config.block_size), generator=gen)
    y = torch.randint(config.vocab_size, (8, config.block_size), generator=gen)
    loss = functools.partial(next_token_loss, loss_fn=F.cross_entropy)
    budgets, peaks = [], []
    for measure in (measure_training_memory, measure_peak_memory):
        torch.manual_seed(0)
        model = GPT(config)
        optimizer = torch.optim.AdamW(model.parameters())
        (budgets if measure is measure_training_memory else peaks).append(
            measure(model, optimizer, x, y, loss))
    (budget,), (peak,) = budgets, peaks
    # held before the step: the parameters, AdamW's two moments (made by the warm-up step),
    # the batch, the causal mask, and AdamW's step counters (one float each)
    mask = config.block_size ** 2 * config.n_layer
    assert peak.before == (budget.parameters + budget.optimizer_state + x.nbytes + y.nbytes
                           + mask + 4 * len(list(model.parameters())))
    assert peak.phase == "backward" and peak.into_phase < 0.5
    assert peak.peak >= peak.before + budget.activations
    assert peak.timeline[0] == (0.0, peak.before)
    assert peak.timeline[-1][1] >= peak.before + budget.gradients     # gradients are kept
    assert list(peak.phases) == ["forward", "backward", "optimizer step"]
    with pytest.raises(ValueError, match="CPU"):
        measure_peak_memory(model, optimizer, x.to("meta"), y, loss)


def test_memory_activations_grow_with_the_batch_and_dropout_is_refused():
    config = GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=16)
    one, four = gpt_memory_estimate(config, 1), gpt_memory_estimate(config, 4)
    assert four.parameters == one.parameters and four.activations > 3.5 * one.activations
    with pytest.raises(ValueError, match="dropout"):
        gpt_memory_estimate(GPTConfig(vocab_size=5, dropout=0.1), 1)


def test_instructor_accumulated_step_equals_one_step_on_the_whole_batch():
    """Lab 2's solution, loaded from solutions/: 3 micro-batches of a batch of 10 (4, 3, 3)."""
    accumulated_step = solution("lab02_training", "accumulated_step").accumulated_step
    x, y = DIGITS.x_train[:10].double(), DIGITS.y_train[:10]
    results = []
    for step in (functools.partial(accumulated_step, micro_batches=3), train_step):
        torch.manual_seed(0)
        model = MLP(64, [32], 10).double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        losses = [step(model, optimizer, x, y, F.cross_entropy) for _ in range(3)]
        results.append((torch.cat([p.detach().flatten() for p in model.parameters()]), losses))
    (mine, my_losses), (whole, whole_losses) = results
    # the batch's gradient summed in other groups: rounding relative to the parameters and to
    # the step (lr x a gradient of softmax - one-hot times inputs in [0, 1]), 3 steps
    assert (mine - whole).abs().max() <= 3 * tolerance(torch.float64, whole.abs().max() + 1,
                                                       x.numel())
    assert my_losses == pytest.approx(whole_losses,
                                      abs=tolerance(torch.float64, max(whole_losses) + 1, 10))


def test_describe_machine_names_the_processor_and_torchs_kernel_path():
    from lib_dist.train import describe_machine
    line = describe_machine()
    assert str(torch.backends.cpu.get_cpu_capability()) in line and torch.__version__ in line
    assert f"{os.cpu_count()} cores" in line and "\n" not in line
