"""A typical bug per lab, what carol hands in in `make demo` (`grader.demo`): the solution cell
it replaces, and what a student might write there. Each lab's tests (tests/test_labNN.py)
check that the bug costs the points of what it gets wrong and no others."""

# lab -> (solution cell, what a student might write there)
TYPICAL_BUGS = {
    "lab00_ranks": ("q3-solution", '''def shift_right(comm, t):
    """Send `t` to rank + 1 and return the tensor received from rank - 1 (around a ring)."""
    if comm.world_size == 1:
        return t.clone()
    right = (comm.rank + 1) % comm.world_size
    left = (comm.rank - 1) % comm.world_size
    received = torch.empty_like(t)
    handles = [comm.isend(t, left), comm.irecv(received, right)]  # the ring turned backwards
    for handle in handles:
        handle.wait()
    return received
'''),
    "lab01_cross_entropy": ("q1-solution", '''def log_softmax(logits, dim=-1):
    """log(softmax(logits)) along `dim`, finite for any finite logits."""
    return logits - logits.exp().sum(dim=dim, keepdim=True).log()  # no max subtracted: overflows
'''),
    "lab02_training": ("q3-solution", '''def accumulated_step(model, optimizer, x, y, loss_fn, micro_batches=1):
    """One optimizer step on the batch (x, y), computed in `micro_batches` parts; returns the
    batch's mean loss."""
    optimizer.zero_grad()
    total = 0.0
    for x_part, y_part in zip(torch.tensor_split(x, micro_batches),
                              torch.tensor_split(y, micro_batches)):
        loss = loss_fn(model(x_part), y_part)  # not scaled by the part's share of the batch
        loss.backward()
        total += loss.item()
    optimizer.step()
    return total / micro_batches
'''),
    "lab03_collectives": ("q4-solution", '''def ring_all_reduce(comm, tensor, op="sum"):
    """Sum (op="sum") or average (op="avg") `tensor` over all ranks, in place; return it."""
    n, r = comm.world_size, comm.rank
    flat = tensor.view(-1)
    chunks = [flat[lo:hi] for lo, hi in chunk_bounds(flat.numel(), n)]
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send, recv = chunks[(r - step - 1) % n], chunks[(r - step - 2) % n]
        incoming = torch.empty_like(recv)
        comm.send(send, right)  # blocking: every rank sends, none receives, all wait forever
        comm.recv(incoming, left)
        recv += incoming
    for step in range(n - 1):
        comm.send(chunks[(r - step) % n], right)
        comm.recv(chunks[(r - step - 1) % n], left)
    if op == "avg":
        tensor /= n
    return tensor
'''),
    "lab04_data_parallel": ("q2-solution", '''def average_gradients(comm, model):
    """Replace every parameter's gradient by its average over the ranks, in place: one
    all-reduce per parameter that has a gradient."""
    for p in model.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad)  # the sum: N times the average, as if lr were N times larger
'''),
    "lab05_pipeline": ("q3-solution", '''def forward_step(comm, stage, j, xs, ys, sends, losses):
    x = xs[j] if stage.is_first else recv_forward(comm, stage, len(ys[j]))
    out = stage.forward(j, x, ys[j] if stage.is_last else None)
    if stage.is_last:
        losses.append(out.item())
    else:
        sends.append(send_forward(comm, stage, out))


def backward_step(comm, stage, j, m, size, sends):
    grad = 1.0 if stage.is_last else recv_backward(comm, stage, size)  # the sum, not the mean
    sends.append(send_backward(comm, stage, stage.backward(j, grad)))


def cut(batch, m):
    return batch.split(len(batch) // m)


def finish(sends, losses, stage, m):
    for handle in sends:
        if handle is not None:
            handle.wait()
    return sum(losses) / m if stage.is_last else None


def gpipe_step(comm, stage, inputs, targets, m):
    xs, ys = cut(inputs, m), cut(targets, m)
    sends, losses = [], []
    for j in range(m):
        forward_step(comm, stage, j, xs, ys, sends, losses)
    for j in range(m):
        backward_step(comm, stage, j, m, len(ys[j]), sends)
    return finish(sends, losses, stage, m)
'''),
    "lab06_tensor_parallel": ("q2-row-solution", '''class RowParallelLinear(nn.Module):
    def __init__(self, linear, comm):
        super().__init__()
        self.comm = comm
        self.weight = nn.Parameter(split_evenly(linear.weight, comm, 1, "input features"))
        self.bias = (nn.Parameter(linear.bias.detach().clone())
                     if linear.bias is not None else None)

    def forward(self, x):
        # the bias added before the sum: every rank adds it, so the sum holds it tp times
        return ReduceFromRanks.apply(F.linear(x, self.weight, self.bias), self.comm)
'''),
    "lab07_mixed_precision": ("q1-solution", '''class LossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
        self._scale = torch.tensor(float(init_scale))
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.clean_steps = 0
        self.found, self.stepped = {}, set()

    def scale(self, loss):
        return loss * self._scale

    def unscale_(self, optimizer):
        if id(optimizer) in self.found:
            raise RuntimeError("unscale_() called twice")
        inv_scale = self._scale.double().reciprocal().float()
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found = found or not torch.isfinite(p.grad).all().item()
                    p.grad.mul_(inv_scale)
        self.found[id(optimizer)] = self._any_rank(found)

    def _any_rank(self, found):
        return found

    def step(self, optimizer):
        if id(optimizer) not in self.found:
            self.unscale_(optimizer)
        self.stepped.add(id(optimizer))
        return None if self.found[id(optimizer)] else optimizer.step()

    def update(self):
        if any(self.found.values()):
            self._scale *= self.backoff_factor  # the count of clean steps is not restarted
        else:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                self._scale *= self.growth_factor
                self.clean_steps = 0
        self.found.clear()
        self.stepped.clear()

    def get_scale(self):
        return self._scale.item()

    def state_dict(self):
        return {"scale": self.get_scale(), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self.clean_steps}
'''),
    "lab08_parameter_server": ("q5-solution", '''class TopK:
    def __init__(self, ratio, error_feedback=True):
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {ratio}")
        self.ratio, self.error_feedback = ratio, error_feedback
        self.residual = None

    def k(self, numel):
        return max(1, round(self.ratio * numel))

    def compress(self, grad):
        acc = grad.detach().reshape(-1).clone()
        if self.error_feedback and self.residual is not None:
            acc += self.residual
        indices = acc.topk(self.k(acc.numel())).indices  # the largest values, not magnitudes
        values = acc[indices]
        if self.error_feedback:
            acc[indices] = 0
            self.residual = acc
        return values, indices

    @staticmethod
    def decompress(values, indices, like):
        dense = torch.zeros(like.numel(), dtype=values.dtype)
        dense[indices] = values
        return dense.view_as(like)
'''),
    "lab09_fitting_the_model": ("q1-solution", '''class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, *inputs):
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    def backward(ctx, grad_output):  # recomputed with fresh random draws: another dropout mask
        inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        with torch.enable_grad():
            output = ctx.fn(*inputs)
        torch.autograd.backward(output, grad_output)
        return (None, *(x.grad if x.requires_grad else None for x in inputs))


def checkpoint(fn, *inputs):
    return Recompute.apply(fn, *inputs)


class Checkpointed(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        if not torch.is_grad_enabled():
            return self.block(x)
        return checkpoint(self.block, x)
'''),
    "lab10_long_sequences": ("q1-solution-ring", '''\
def fold(q, k, v, allowed, scale, m, total, acc):
    scores = q @ k.transpose(-2, -1) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    new_m = torch.maximum(m, scores.amax(-1, keepdim=True))
    safe = new_m.masked_fill(torch.isinf(new_m), 0.0)
    p = torch.exp(scores - safe)
    rescale = torch.exp(m - safe)
    return new_m, total * rescale + p.sum(-1, keepdim=True), acc * rescale + p @ v


def ring_forward(q, k, v, comm, seq_len):
    n, rank, d = comm.world_size, comm.rank, q.shape[-1]
    positions = [zigzag_positions(seq_len, n, r) for r in range(n)]
    scale = 1.0 / math.sqrt(d)
    m = q.new_full((*q.shape[:-1], 1), -math.inf)
    total = q.new_zeros((*q.shape[:-1], 1))
    acc = torch.zeros_like(q)
    block = torch.cat([k, v], dim=-1).contiguous()
    for step in range(n):
        src = (rank - step) % n
        with comm.compute("attention block"):
            k_s, v_s = block.split(d, dim=-1)
            for qs, ks, allowed in visible_pairs(positions[rank], positions[src]):
                m[qs], total[qs], acc[qs] = fold(q[qs], k_s[ks], v_s[ks], allowed, scale,
                                                 m[qs], total[qs], acc[qs])
        if step < n - 1:  # the next block only once this one is done: nothing overlaps
            incoming = block.new_empty(*block.shape[:2], len(positions[(src - 1) % n]), 2 * d)
            for handle in [comm.irecv(incoming, (rank - 1) % n),
                           comm.isend(block, (rank + 1) % n)]:
                handle.wait()
            block = incoming
    return acc / total, m + total.log()
'''),
    "lab11_capstone": ("q3-solution", '''\
def latest_complete(run):
    done = [d for d in Path(run).glob("step*") if (d / "layout.json").exists()]
    return max((str(d) for d in done), default=None)  # by name: step10 before step9


def train(comm, layout, run, steps, every, m=1, before_step=None):
    piece = Piece(comm, layout)
    optimizer = make_optimizer(piece.parameters())
    last = latest_complete(run)
    start = load(piece, optimizer, last) if last is not None else 0
    losses = {}
    for step in range(start, steps):
        if before_step is not None:
            before_step(comm, step)
        losses[step] = three_d_step(piece, optimizer, *batches(step), m)
        if (step + 1) % every == 0:
            save(piece, optimizer, step + 1, run)
    return losses
'''),
}
